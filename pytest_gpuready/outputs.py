"""Writing the files the plugin writes (reports, plots, deploy files): never replacing what is not ours.

A path a user names for output can be anything: a new file, a report from the last run, ``-`` or
``/dev/stdout`` before ``| jq``, a FIFO a collector reads, ``/dev/full``, a directory, a folder
mounted read-only, a symlink to the real file. Replacing each of those with a fresh regular file
(the old way: a fixed temporary name, renamed over the target) turned devices into files, replaced
the ``/dev/stdout`` symlink machine-wide, and raced when two runs wrote one path. So:

- a new path, or a regular file (also through a symlink, which stays a symlink): written whole
  to a unique temporary file in the same folder (:func:`tempfile.mkstemp`), then renamed over the
  target, so a reader sees the old file or the new one, never a part, and two writers each rename
  a whole file of their own (the last one wins);
- ``-``, ``/dev/stdout`` (and ``/dev/fd/1``, ``/proc/self/fd/1``): this process's standard output;
  ``/dev/stderr`` likewise; a character device or a FIFO: opened as it is and written to, never
  created, truncated or replaced (a FIFO no process reads is refused, not waited on);
- a directory, a block device, a socket, a folder that cannot be written: refused by
  :func:`check_output`, which callers run before any work (pytest: at configure time, a usage
  error), in one line naming the path.

A temporary file is removed whatever happens to the write, so nothing partial is ever left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.files import describe_kind

STDOUT_NAMES = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})
"""Names that mean this process's standard output (written to, never opened by path: opening
``/dev/stdout`` would truncate a file stdout is redirected to)."""
STDERR_NAMES = frozenset({"/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"})


class OutputRefused(GpuReadyError, ValueError):
    """An output path the plugin will not write: ``str()`` is one line naming the path and why."""


@dataclass(frozen=True)
class Output:
    """Where one output goes, as :func:`check_output` judged it."""

    shown: str
    """The path as the user gave it, for messages."""
    path: Path
    """The path to write; for a regular file reached through symlinks, the file itself."""
    kind: str
    """``atomic`` (a new or regular file), ``stdout``, ``stderr`` or ``stream`` (a character device or FIFO)."""


def _nearest_existing_folder(path: Path) -> Path:
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _check_folder(shown: str, folder: Path) -> None:
    """The folder a new file would go in must be a directory this process can create files in.

    Probed by creating (and at once removing) a unique file in it when it exists: permissions,
    a read-only mount and a full inode table all show up, whoever runs it (root included).
    """
    existing = _nearest_existing_folder(folder / "x")
    if not existing.is_dir():
        raise OutputRefused(f"{shown}: {existing} is {describe_kind(existing.stat().st_mode)}, not a folder")
    if existing != folder:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OutputRefused(f"{shown}: cannot create the folder {folder}: {existing} is not writable")
        return
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".gpuready-probe-")
    except OSError as exc:
        raise OutputRefused(f"{shown}: cannot create a file in {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_output(raw: str, base: Path | None = None, what: str = "file") -> Output:
    """Judge the output path ``raw`` (relative to ``base``): an :class:`Output`, or :class:`OutputRefused`.

    ``what`` names the output in messages (``report``, ``deploy file``). Run it before the work
    whose result goes there, so a bad path costs nothing.
    """
    shown = raw
    if raw in STDOUT_NAMES:
        return Output(shown, Path(raw), "stdout")
    if raw in STDERR_NAMES:
        return Output(shown, Path(raw), "stderr")
    if not raw.strip():
        raise OutputRefused(f"{what} path {raw!r} is empty; expected a file path, or - for standard output")
    if "\0" in raw:
        raise OutputRefused(f"{what} path {raw!r} contains a NUL byte")
    path = Path(base or ".", os.path.expanduser(raw))
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if path.is_symlink():  # a dangling symlink: write where it points, keeping the link
            path = Path(os.path.realpath(path))
        _check_folder(shown, path.parent)
        return Output(shown, path, "atomic")
    except OSError as exc:
        raise OutputRefused(f"{shown}: cannot be written: {exc.strerror or exc}") from None
    if stat.S_ISREG(status.st_mode):
        real = Path(os.path.realpath(path))
        _check_folder(shown, real.parent)
        return Output(shown, real, "atomic")
    if stat.S_ISCHR(status.st_mode) or stat.S_ISFIFO(status.st_mode):
        return Output(shown, path, "stream")
    expected = "expected a file path (a new or regular file), - for standard output, a character device or a FIFO"
    raise OutputRefused(f"{shown}: is {describe_kind(status.st_mode)}; {expected}")


def check_output_folder(raw: str, base: Path | None = None, what: str = "folder") -> Path:
    """Judge ``raw`` as a folder to write files into (``--gpuready-plot DIR``): an existing directory
    this process can create files in, or a new one whose nearest existing parent is writable."""
    if not raw.strip() or "\0" in raw:
        raise OutputRefused(f"{what} {raw!r}: expected a folder path")
    path = Path(base or ".", os.path.expanduser(raw))
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        _check_folder(raw, path)
        return path
    except OSError as exc:
        raise OutputRefused(f"{raw}: cannot be used as a {what}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(status.st_mode):
        raise OutputRefused(f"{raw}: is {describe_kind(status.st_mode)}; expected a folder (new or existing) "
                            f"for the {what}")
    _check_folder(raw, path)
    return path


def _umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``), else the common 022."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _write_stream(path: Path, data: bytes) -> None:
    try:
        # O_NONBLOCK: a FIFO with no reader fails at once (ENXIO) instead of blocking the run.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO that no process is reading") from None
        raise
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def write_output(output: Output, data: bytes | str) -> None:
    """Write ``data`` to ``output`` by its kind (see the module docstring). Raises :class:`OutputRefused`
    with one line when the write fails (a full device, a folder gone), having left no partial file."""
    payload = data.encode() if isinstance(data, str) else data
    try:
        if output.kind in ("stdout", "stderr"):
            stream = sys.stdout if output.kind == "stdout" else sys.stderr
            stream.flush()
            buffer = getattr(stream, "buffer", None)
            if buffer is not None:
                buffer.write(payload)
            else:
                stream.write(payload.decode(errors="replace"))
            stream.flush()
        elif output.kind == "stream":
            _write_stream(output.path, payload)
        else:
            _write_atomic(output.path, payload)
    except OSError as exc:
        raise OutputRefused(f"{output.shown}: could not be written: {exc.strerror or exc}") from None


def written_to(output: Output) -> str:
    """How a message names where an output went: the path, or ``standard output``."""
    return {"stdout": "standard output", "stderr": "standard error"}.get(output.kind, output.shown)


__all__ = [
    "STDERR_NAMES",
    "STDOUT_NAMES",
    "Output",
    "OutputRefused",
    "check_output",
    "check_output_folder",
    "write_output",
    "written_to",
]
