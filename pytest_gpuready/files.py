"""Reading files the plugin does not control: only regular files, at most N bytes, never blocking.

Every file the plugin reads on this machine (the deploy YAML, config.json, the safetensors index,
shard headers) comes through here, because a path in a deploy file can point anywhere: at a FIFO
nobody writes (``open`` would block forever), at ``/dev/zero`` (``read`` would fill memory), at a
symlink loop, at a directory. Each of those is a one-line :class:`ConfigError` naming the path and
what was expected, raised before a byte is read.

How: ``stat`` first, so a device or FIFO is never even opened; then ``open`` with ``O_NONBLOCK``
(a FIFO swapped in between cannot block the open) and ``fstat`` on the descriptor, so the file
read is the regular file that was checked; then at most ``max_bytes + 1`` bytes are read, so a
file that grows while being read is still caught by the cap.

The remote readers (the model-directory script sent over ssh) apply the same rules in their own
code, since this module does not run there.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import stat
from collections.abc import Iterator
from typing import Any

from pytest_gpuready.errors import ConfigError

MIB = 1024 * 1024

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def describe_kind(mode: int) -> str:
    """``a directory``, ``a FIFO (named pipe)``, ``a regular file``, ... for an ``st_mode``."""
    for test, text in _KINDS:
        if test(mode):
            return text
    return "neither a file nor a directory"


class FileRefused(ConfigError):
    """A file that was not read, and why: ``str()`` is ``WHERE: REASON``; :attr:`reason` alone
    serves callers that file the cause under the file's name (a checkpoint's problem list)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def os_error_reason(exc: OSError, what: str = "file") -> str:
    """A short cause for an OSError met opening or reading a file (``what``: its role)."""
    if exc.errno == errno.ENOENT:
        return f"{what} not found"
    if exc.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENAMETOOLONG:
        return "the path is too long for this system"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is not a directory"
    return f"cannot be read: {exc.strerror or exc}"


def _size_text(size: int) -> str:
    return f"{size / MIB:.1f} MiB" if size >= MIB else f"{size} bytes"


@contextlib.contextmanager
def open_regular_file(path: str | os.PathLike[str], where: str | None = None,
                      max_bytes: int | None = None, what: str = "file") -> Iterator[tuple[int, int]]:
    """Open ``path`` for reading only if it is a regular file (of at most ``max_bytes``, when
    given); yield ``(fd, size)``. Never blocks: a FIFO or device is refused before it is opened,
    and the open itself is non-blocking in case one is swapped in. Raises :class:`FileRefused`."""
    shown = where if where is not None else os.fspath(path)
    if "\0" in os.fspath(path):
        raise FileRefused(repr(shown), "the path contains a NUL byte")
    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode):
            raise FileRefused(shown, f"{describe_kind(status.st_mode)}; expected a regular file")
        if max_bytes is not None and status.st_size > max_bytes:
            raise FileRefused(shown, f"{_size_text(status.st_size)}, over the limit of {_size_text(max_bytes)} "
                                     f"for a {what}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FileRefused(shown, os_error_reason(exc, what)) from None
    try:
        try:
            opened = os.fstat(fd)
        except OSError as exc:
            raise FileRefused(shown, os_error_reason(exc)) from None
        if not stat.S_ISREG(opened.st_mode):  # swapped since the stat
            raise FileRefused(shown, f"{describe_kind(opened.st_mode)}; expected a regular file")
        yield fd, opened.st_size
    finally:
        os.close(fd)


def read_fd(fd: int, count: int) -> bytes:
    """Up to ``count`` bytes from ``fd`` (fewer only at the end of the file)."""
    chunks: list[bytes] = []
    remaining = count
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 4 * MIB))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_bytes_bounded(path: str | os.PathLike[str], max_bytes: int, what: str = "file",
                       where: str | None = None) -> bytes:
    """The contents of ``path``, if it is a regular file of at most ``max_bytes`` bytes.

    ``what`` names the file's role in the size message ("deploy file", "config.json");
    ``where`` is how the path is named in messages (default: as given). Raises
    :class:`FileRefused` (a :class:`ConfigError`) for anything else, in one line.
    """
    shown = where if where is not None else os.fspath(path)
    with open_regular_file(path, shown, max_bytes, what) as (fd, _):
        try:
            data = read_fd(fd, max_bytes + 1)
        except OSError as exc:
            raise FileRefused(shown, os_error_reason(exc)) from None
    if len(data) > max_bytes:
        raise FileRefused(shown, f"over the limit of {_size_text(max_bytes)} for a {what} (it grew while read)")
    return data


def decode_text(data: bytes, where: str, *, allow_nul: bool = False) -> str:
    """``data`` as UTF-8 text; a bad byte or a NUL is a one-line ConfigError naming its line."""
    if not allow_nul:
        at = data.find(b"\0")
        if at >= 0:
            line = data.count(b"\n", 0, at) + 1
            raise FileRefused(where, f"contains a NUL byte (line {line}, byte offset {at}); expected text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FileRefused(where, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, "
                                 f"byte offset {exc.start})") from None


def read_text_bounded(path: str | os.PathLike[str], max_bytes: int, what: str = "file",
                      where: str | None = None) -> str:
    """:func:`read_bytes_bounded`, decoded as UTF-8 text without NUL bytes."""
    shown = where if where is not None else os.fspath(path)
    return decode_text(read_bytes_bounded(path, max_bytes, what, shown), shown)


def loads_json(text: str | bytes, where: str) -> Any:
    """``json.loads`` whose every failure is a one-line :class:`ConfigError` naming ``where``.

    Deep nesting is Python's RecursionError inside the decoder, caught and named here; an
    integer of more than 4300 digits is CPython's ValueError, also named.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deeply (arrays or objects inside one another "
                          "more levels than the decoder allows, about 1000)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte offset {exc.start})") from None
    except ValueError as exc:  # int_max_str_digits, and any other decoder complaint
        raise ConfigError(f"{where}: not valid JSON ({str(exc)[:120]})") from None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a parser builds many small containers (JSON
    headers, YAML documents): the collections it would trigger double or triple the parse time
    and free nothing, since parsed data has no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
