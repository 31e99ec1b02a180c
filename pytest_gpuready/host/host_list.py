"""A fleet of hosts: the hosts file (one host spec a line) and the name each host goes by.

Pure text in, :class:`HostSpec` out, so ``--gpu-host`` given several times, a ``--gpu-hosts-file``
and a library caller all get the same parsing and the same errors. The display name of a host
is what a test id and a report show: ``gpu-box-7`` for ``root@gpu-box-7``, ``10.0.0.7:2222`` for
``ssh://root@10.0.0.7:2222``; the user is added only when two hosts differ by user alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_gpuready.errors import HostSpecError
from pytest_gpuready.files import FileRefused, read_text_bounded
from pytest_gpuready.host.hosts import HostSpec, parse_host_spec

MAX_HOSTS_FILE_BYTES = 1 << 20
"""A hosts file is a list of names: 1 MiB is thousands of hosts, and bounds what is read."""


def parse_hosts_text(text: str, source: str) -> tuple[HostSpec, ...]:
    """The host specs of a hosts file's text: one a line; ``#`` starts a comment; blank lines are skipped.

    A bad line raises :class:`HostSpecError` naming ``source``, the line number and what was expected;
    so does a host listed twice (it would be checked twice, on two connections).
    """
    specs: list[HostSpec] = []
    first_line: dict[HostSpec, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            spec = parse_host_spec(line)
        except HostSpecError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise HostSpecError(f"{source} line {number}: {line!r}: {reason}") from None
        if spec in first_line:
            raise HostSpecError(f"{source} line {number}: {line!r} is already listed on line {first_line[spec]}")
        first_line[spec] = number
        specs.append(spec)
    return tuple(specs)


def read_hosts_file(path: str) -> tuple[HostSpec, ...]:
    """Read and parse a hosts file; a missing, non-regular, oversized or non-UTF-8 file is one clear error
    (read through :mod:`pytest_gpuready.files`: a FIFO is never opened, at most 1 MiB is read)."""
    try:
        text = read_text_bounded(path, MAX_HOSTS_FILE_BYTES, "hosts file")
    except FileRefused as exc:
        raise HostSpecError(str(exc)) from None
    specs = parse_hosts_text(text, path)
    if not specs:
        raise HostSpecError(f"{path}: lists no host; expected host specs, one a line")
    return specs


def _short_name(spec: HostSpec) -> str:
    if spec.kind == "local":
        return "local"
    host = f"[{spec.hostname}]" if ":" in spec.hostname else spec.hostname
    return f"{host}:{spec.port}" if spec.port else host


def display_names(specs: Sequence[HostSpec]) -> tuple[str, ...]:
    """One name per spec, unique, as test ids and reports show it (see the module docstring)."""
    short = [_short_name(spec) for spec in specs]
    names = [str(spec) if short.count(name) > 1 else name for spec, name in zip(specs, short, strict=True)]
    for index, name in enumerate(names):
        if names.index(name) != index:
            raise HostSpecError(f"host {specs[index]} is given twice")
    return tuple(names)


def merge_hosts(*groups: Sequence[HostSpec]) -> tuple[HostSpec, ...]:
    """The hosts of several sources in order (command line, then the file); a host given twice is an error."""
    merged: list[HostSpec] = []
    for group in groups:
        for spec in group:
            if spec in merged:
                raise HostSpecError(f"host {spec} is given twice (by --gpu-host and --gpu-hosts-file, or twice)")
            merged.append(spec)
    return tuple(merged)
