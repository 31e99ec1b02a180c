"""/dev/shm: what crashed vLLM, NCCL and Python multiprocessing runs leave there, and its capacity.

vLLM's shared-memory broadcast and multiprocessing create ``psm_*`` segments and ``sem.mp-*``
semaphores, NCCL creates ``nccl-*``; a clean shutdown unlinks them, a crash or ``kill -9`` does
not. A file is a *leftover* only when no live process has it open or mapped; that can be told
only when the probe may read every process's ``/proc/PID/fd`` and ``maps`` (as root).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable, Sequence

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.snapshot import ShmEntry, ShmStatus

SHM_DIR = "/dev/shm"

LEAK_PATTERNS: tuple[str, ...] = ("psm_*", "sem.mp-*", "nccl-*", "*vllm*")
"""Names vLLM, NCCL and Python multiprocessing leave behind (matched case-insensitively)."""

SHM_LIST_SCRIPT = (
    "find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\\t%s\\t%u\\t%T@\\n'"
)
SHM_DF_SCRIPT = "df -Pk /dev/shm"
SHM_OPEN_SCRIPT = (
    "{ ls -l /proc/[0-9]*/fd 2>/dev/null; cat /proc/[0-9]*/maps 2>/dev/null; }"
    " | grep -o '/dev/shm/[^ ]*' | sort -u"
)
"""Every /dev/shm path some live process has open or mapped (one ``ls`` and one ``cat``, not one per pid)."""

_SAFE_NAME = re.compile(r"^[^/\x00]+$")


def matches_leak_pattern(name: str, patterns: Sequence[str] = LEAK_PATTERNS) -> str | None:
    """The first pattern ``name`` matches, or None."""
    lowered = name.lower()
    for pattern in patterns:
        if fnmatch.fnmatchcase(lowered, pattern.lower()):
            return pattern
    return None


def parse_shm_listing(text: str, host: str = "host") -> list[tuple[str, int, str, float]]:
    """Parse ``find -printf '%f\\t%s\\t%u\\t%T@\\n'`` lines: name, size, owner, mtime."""
    rows: list[tuple[str, int, str, float]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 4:
            raise ProbeError(f"{host}: unexpected /dev/shm listing line {line!r}")
        name, size, owner, mtime = parts
        try:
            rows.append((name, int(size), owner, float(mtime)))
        except ValueError:
            raise ProbeError(f"{host}: unexpected /dev/shm listing line {line!r}") from None
    return rows


def parse_df(text: str, host: str = "host") -> tuple[int, int]:
    """(total bytes, free bytes) from ``df -Pk /dev/shm``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise ProbeError(f"{host}: df /dev/shm printed {text.strip()!r}")
    fields = lines[-1].split()
    try:
        return int(fields[1]) * 1024, int(fields[3]) * 1024
    except (IndexError, ValueError):
        raise ProbeError(f"{host}: cannot read df /dev/shm line {lines[-1]!r}") from None


def parse_open_paths(text: str) -> set[str]:
    """Names (relative to /dev/shm) that a live process has open or mapped."""
    names: set[str] = set()
    for line in text.splitlines():
        path = line.strip()
        if path.startswith(SHM_DIR + "/"):
            names.add(path[len(SHM_DIR) + 1:])
    return names


def build_shm_status(
    listing: str, df: str, open_paths: str, can_see_all_processes: bool, host: str = "host"
) -> ShmStatus:
    """Assemble a :class:`ShmStatus` from the three outputs the probe gathers."""
    total, free = parse_df(df, host)
    in_use = parse_open_paths(open_paths)
    entries = tuple(
        ShmEntry(
            name=name,
            size_bytes=size,
            owner=owner,
            mtime=mtime,
            in_use=True if name in in_use else (False if can_see_all_processes else None),
        )
        for name, size, owner, mtime in parse_shm_listing(listing, host)
    )
    return ShmStatus(entries, total, free, can_see_all_processes)


def leftovers(status: ShmStatus, patterns: Sequence[str] = LEAK_PATTERNS) -> list[ShmEntry]:
    """Entries matching a leak pattern that no live process is known to use."""
    return [e for e in status.entries if matches_leak_pattern(e.name, patterns) and e.in_use is not True]


def removal_script(names: Iterable[str]) -> str:
    """A script that removes each named /dev/shm file only if still no process holds it.

    The check is repeated on the host right before ``rm`` so a file that a process opened
    since the snapshot is kept. Prints ``removed NAME`` or ``kept NAME``.
    """
    lines = [f"open=$({SHM_OPEN_SCRIPT})"]
    for name in names:
        if not _SAFE_NAME.match(name) or name in (".", ".."):
            raise ValueError(f"refusing to remove /dev/shm entry {name!r}: not a plain file name")
        path = shlex.quote(f"{SHM_DIR}/{name}")
        quoted = shlex.quote(name)
        lines.append(
            f"if printf '%s\\n' \"$open\" | grep -qxF -- {path}; then echo kept {quoted}; "
            f"elif rm -f -- {path}; then echo removed {quoted}; else echo kept {quoted}; fi"
        )
    return "\n".join(lines)


def remove_leftovers(host: Host, status: ShmStatus, patterns: Sequence[str] = LEAK_PATTERNS) -> list[str]:
    """Remove leftovers whose owning processes are gone; return the names removed.

    Only when the probe could see every process (``can_see_all_processes``); otherwise nothing
    is removed, because a file in use by a process we cannot see would be deleted under it.
    """
    if not status.can_see_all_processes:
        raise ProbeError(
            f"{host.name}: not removing /dev/shm leftovers: the probe cannot see every process's open "
            "files (run as root), so it cannot tell which files are still in use"
        )
    names = [e.name for e in leftovers(status, patterns) if e.in_use is False]
    if not names:
        return []
    result = host.run(removal_script(names), timeout=30)
    return [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("removed ")]
