"""/dev/shm: what crashed vLLM, NCCL and Python multiprocessing runs leave there, and its capacity.

vLLM's shared-memory broadcast and multiprocessing create ``psm_*`` segments and ``sem.mp-*``
semaphores, NCCL creates ``nccl-*``; a clean shutdown unlinks them, a crash or ``kill -9`` does
not. A file is a *leftover* only when no live process has it open or mapped; that can be told
only when the probe may read every process's ``/proc/PID/fd`` and ``maps`` (as root).

File names are arbitrary bytes (spaces, newlines, quotes, tabs, invalid UTF-8); only ``/`` and NUL
cannot occur. So every listing here travels from ``sh`` to Python NUL-separated and hex-encoded
(``od``): one printable line per listing, whatever the names hold. Names are decoded with
``surrogateescape``, so a name read here is passed back to the host byte for byte.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.snapshot import ShmEntry, ShmStatus

SHM_DIR = "/dev/shm"

LEAK_PATTERNS: tuple[str, ...] = ("psm_*", "sem.mp-*", "sem.loky-*", "nccl-*", "*vllm*")
"""Names vLLM, NCCL and Python multiprocessing leave behind (matched case-insensitively).

``sem.loky-<pid>-<random>`` is a semaphore of loky (joblib's process pool) that a GPU
``VLLM::EngineCore`` created; SIGKILL of the engine left it behind on the H200 (vLLM 0.25.0)."""

_PID_NAMED = re.compile(r"^sem\.loky-(\d+)-")


def creator_pid(name: str) -> int | None:
    """The pid a /dev/shm name carries (``sem.loky-3504-0y75b2cm`` -> 3504), or None."""
    match = _PID_NAMED.match(name)
    return int(match.group(1)) if match else None

_HEX = "od -An -v -tx1 | tr -d ' \\n'"
"""Hex-encode stdin onto one line (od and tr are in coreutils and busybox)."""

SHM_LIST_SCRIPT = (
    "[ -d /dev/shm ] || { echo 'gpuready: /dev/shm is not a directory' >&2; exit 1; }; "
    "printf 'list '; find /dev/shm -mindepth 1 -maxdepth 1 -printf '%y\\t%i\\t%s\\t%u\\t%T@\\t%f\\0' | "
    + _HEX + "; echo"
)
"""Every entry of /dev/shm as ``type, inode, size, owner, mtime, name`` records, NUL-terminated and
hex-encoded on one ``list HEX`` line (find's complaints about entries that vanished mid-listing go
to other lines); :func:`parse_shm_listing` reads it."""

SHM_DF_SCRIPT = "df -Pk /dev/shm"

_DELETED = " (deleted)"
"""What the kernel appends to an fd link or maps path whose file was unlinked."""


def shm_holders_script(pids: Iterable[int] | None = None) -> str:
    """The sh section that lists which process holds which /dev/shm path, open or mapped.

    Two lines: ``fd HEX`` (``/proc/PID/fd`` link targets under /dev/shm, read with ``find
    -printf %l``: the exact bytes, NUL-separated) and ``maps HEX`` (``/proc/PID/maps`` lines
    naming /dev/shm, each prefixed with its file by ``grep -H``). One ``find`` and one ``grep``
    for all processes, not one per pid. ``pids`` limits it to those processes (say, one server's);
    None means every process. :func:`parse_shm_holders` reads the output.
    """
    if pids is None:
        fd_dirs, maps_files = "/proc/[0-9]*/fd", "/proc/[0-9]*/maps"
    else:
        chosen = sorted({int(p) for p in pids})
        if not chosen:
            return "echo 'fd '; echo 'maps '"
        fd_dirs = " ".join(f"/proc/{p}/fd" for p in chosen)
        maps_files = " ".join(f"/proc/{p}/maps" for p in chosen)
    return (
        f"printf 'fd '; find {fd_dirs} -mindepth 1 -maxdepth 1 -lname '/dev/shm/*' "
        f"-printf '%h\\t%l\\0' 2>/dev/null | {_HEX}; echo; "
        f"printf 'maps '; grep -a -H -F ' /dev/shm/' {maps_files} 2>/dev/null | {_HEX}; echo"
    )


SHM_HOLDERS_SCRIPT = shm_holders_script()
"""The probe's section: every process's /dev/shm fds and mappings (see :func:`shm_holders_script`)."""

_FD_DIR = re.compile(rb"^/proc/(\d+)/fd$")
_MAPS_LINE = re.compile(rb"^/proc/(\d+)/maps:(.*)$", re.DOTALL)


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _maps_form(path: str) -> str:
    """How ``/proc/PID/maps`` prints ``path``: the kernel escapes a newline as ``\\012`` (and
    nothing else, so a literal ``\\012`` in a name reads the same; both then count as held)."""
    return path.replace("\n", "\\012")


@dataclass(frozen=True)
class ShmHolders:
    """Which live processes hold which /dev/shm paths, as one read of ``/proc`` saw them.

    ``open_paths``: ``/proc/PID/fd`` link targets, exact. ``mapped_paths``: ``/proc/PID/maps``
    paths in the kernel's escaped form. Both may end in ``" (deleted)"``. Ambiguous forms are
    resolved towards *held*: a wrong "held" keeps a leftover, a wrong "free" deletes a live file.
    """

    open_paths: Mapping[str, frozenset[int]] = field(default_factory=dict)
    mapped_paths: Mapping[str, frozenset[int]] = field(default_factory=dict)
    mapped_inodes: Mapping[int, frozenset[int]] = field(default_factory=dict)
    """Inode -> pids of every /dev/shm mapping. A POSIX semaphore (``sem_open``: multiprocessing's
    ``sem.mp-*``, loky's ``sem.loky-*``) is mapped under the temporary name glibc created it with
    (``/dev/shm/sem.lp8PWH (deleted)``), never under its own: only its inode tells it is held."""

    def pids_holding(self, name: str, inode: int | None = None) -> frozenset[int]:
        """The pids that have ``/dev/shm/NAME`` open or mapped (or a path below it, for a directory);
        with ``inode`` (the listing's), also the pids that map that inode under any name."""
        path = f"{SHM_DIR}/{name}"
        found: set[int] = set(self.mapped_inodes.get(inode, frozenset()) if inode is not None else ())
        for paths, form in ((self.open_paths, path), (self.mapped_paths, _maps_form(path))):
            for candidate in (form, form + _DELETED):
                found |= paths.get(candidate, frozenset())
            below = form + "/"
            for held, pids in paths.items():
                if held.startswith(below):
                    found |= pids
        return frozenset(found)

    def holders_by_name(self, names: Iterable[str]) -> dict[str, frozenset[int]]:
        """``name -> pids`` for each of ``names`` that some process holds."""
        result = {}
        for name in names:
            pids = self.pids_holding(name)
            if pids:
                result[name] = pids
        return result

    @property
    def pids(self) -> frozenset[int]:
        """Every pid holding anything in /dev/shm."""
        found: set[int] = set()
        for paths in (self.open_paths, self.mapped_paths, self.mapped_inodes):
            for pids in paths.values():
                found |= pids
        return frozenset(found)


def _hex_payload(text: str, label: str, host: str, what: str = "/dev/shm holder listing") -> bytes:
    """The bytes of the ``LABEL HEX`` line in ``text`` (other lines are stray stderr)."""
    line = next((ln for ln in text.splitlines() if ln.split(" ", 1)[0] == label), None)
    if line is None:
        shown = " ".join(text.split())[:120] or "nothing"
        raise ProbeError(f"{host}: the {what} lacks its {label!r} line (got {shown!r})")
    try:
        return bytes.fromhex(line[len(label):].strip())
    except ValueError:
        raise ProbeError(f"{host}: the {what}'s {label!r} line is not hex: {line[:80]!r}") from None


def parse_shm_holders(text: str, host: str = "host") -> ShmHolders:
    """Parse the output of :func:`shm_holders_script` (pure; the tests feed it captured output)."""
    opened: dict[str, set[int]] = {}
    for record in _hex_payload(text, "fd", host).split(b"\0"):
        if not record:
            continue
        fd_dir, sep, target = record.partition(b"\t")
        match = _FD_DIR.match(fd_dir)
        if not sep or match is None or not target.startswith(SHM_DIR.encode() + b"/"):
            raise ProbeError(f"{host}: unexpected /dev/shm fd record {record[:120]!r}")
        opened.setdefault(_decode_name(target), set()).add(int(match.group(1)))
    mapped: dict[str, set[int]] = {}
    inodes: dict[int, set[int]] = {}
    for line in _hex_payload(text, "maps", host).split(b"\n"):
        if not line:
            continue
        match = _MAPS_LINE.match(line)
        if match is None:
            raise ProbeError(f"{host}: unexpected /proc/PID/maps line {line[:120]!r}")
        # address perms offset dev inode pathname: the path is the 6th field to the end of the
        # line; split() drops the padding before it and keeps any spaces inside or after it.
        fields = match.group(2).split(None, 5)
        if len(fields) == 6 and fields[5].startswith(SHM_DIR.encode() + b"/"):
            mapped.setdefault(_decode_name(fields[5]), set()).add(int(match.group(1)))
            if fields[4].isdigit():
                inodes.setdefault(int(fields[4]), set()).add(int(match.group(1)))
    return ShmHolders({k: frozenset(v) for k, v in opened.items()},
                      {k: frozenset(v) for k, v in mapped.items()},
                      {k: frozenset(v) for k, v in inodes.items()})


def read_shm_holders(host: Host, pids: Iterable[int] | None = None, timeout: float = 30) -> ShmHolders:
    """Read on ``host`` which processes (all, or only ``pids``) hold which /dev/shm files."""
    result = host.run(shm_holders_script(pids), timeout=timeout)
    return parse_shm_holders(result.stdout, host.name)


def shm_display_name(name: str) -> str:
    """``/dev/shm/NAME`` for messages, on one line: a name with control characters, quotes or
    bytes that are not UTF-8 is shown as a Python string literal."""
    path = f"{SHM_DIR}/{name}"
    if path.isprintable() and "'" not in path and '"' not in path and not name.endswith(" "):
        return path
    return ascii(path)


def matches_leak_pattern(name: str, patterns: Sequence[str] = LEAK_PATTERNS) -> str | None:
    """The first pattern ``name`` matches, or None."""
    lowered = name.lower()
    for pattern in patterns:
        if fnmatch.fnmatchcase(lowered, pattern.lower()):
            return pattern
    return None


@dataclass(frozen=True)
class ShmListingEntry:
    """One record of :data:`SHM_LIST_SCRIPT`."""

    name: str
    size_bytes: int
    owner: str
    mtime: float
    kind: str
    """``find -printf %y``: ``f`` regular file, ``d`` directory, ``l`` symlink, ``p`` FIFO, ..."""
    inode: int


def parse_shm_listing_entries(text: str, host: str = "host") -> list[ShmListingEntry]:
    """Parse :data:`SHM_LIST_SCRIPT`'s output (one hex line of NUL-terminated records)."""
    data = _hex_payload(text, "list", host, "/dev/shm listing")
    entries: list[ShmListingEntry] = []
    for record in data.split(b"\0"):
        if not record:
            continue
        parts = record.split(b"\t", 5)  # the name is last: it may hold tabs
        try:
            kind, inode, size, owner, mtime, name = parts
            entries.append(ShmListingEntry(_decode_name(name), int(size), _decode_name(owner),
                                           float(mtime), kind.decode("ascii"), int(inode)))
        except (ValueError, UnicodeDecodeError):
            raise ProbeError(f"{host}: unexpected /dev/shm listing record {record[:120]!r}") from None
    return entries


def parse_shm_listing(text: str, host: str = "host") -> list[tuple[str, int, str, float]]:
    """``(name, size, owner, mtime)`` of each /dev/shm entry in :data:`SHM_LIST_SCRIPT`'s output."""
    return [(e.name, e.size_bytes, e.owner, e.mtime) for e in parse_shm_listing_entries(text, host)]


def parse_df(text: str, host: str = "host") -> tuple[int, int]:
    """(total bytes, free bytes) from ``df -Pk /dev/shm``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise ProbeError(f"{host}: df /dev/shm printed {text.strip()[:200]!r}")
    fields = lines[-1].split()
    try:
        return int(fields[1]) * 1024, int(fields[3]) * 1024
    except (IndexError, ValueError):
        raise ProbeError(f"{host}: cannot read df /dev/shm line {lines[-1][:200]!r}") from None


def build_shm_status(
    listing: str, df: str, holders_output: str, can_see_all_processes: bool, host: str = "host"
) -> ShmStatus:
    """Assemble a :class:`ShmStatus` from the three outputs the probe gathers."""
    total, free = parse_df(df, host)
    holders = parse_shm_holders(holders_output, host)
    entries = []
    for item in parse_shm_listing_entries(listing, host):
        pids = holders.pids_holding(item.name, item.inode)
        entries.append(ShmEntry(
            name=item.name,
            size_bytes=item.size_bytes,
            owner=item.owner,
            mtime=item.mtime,
            in_use=True if pids else (False if can_see_all_processes else None),
            holders=tuple(sorted(pids)),
            kind=item.kind,
            inode=item.inode,
        ))
    return ShmStatus(tuple(entries), total, free, can_see_all_processes)


def leftovers(status: ShmStatus, patterns: Sequence[str] = LEAK_PATTERNS) -> list[ShmEntry]:
    """Entries matching a leak pattern that no live process is known to use."""
    return [e for e in status.entries if matches_leak_pattern(e.name, patterns) and e.in_use is not True]


def _fnmatch_literal(text: str) -> str:
    """``text`` as a find -lname pattern that matches only itself (fnmatch's backslash escapes)."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


_HELD_FUNCTION = (
    # held FD_PATTERN MAPS_FORM [INODE]: true when some process has the file open (its fd link
    # target is the path, or the path + " (deleted)") or mapped (a maps line ends in it, or maps
    # its inode under another name: a POSIX semaphore is mapped under glibc's temporary name).
    # Read afresh on every call: this runs right before each rm.
    "held() {\n"
    "  if [ -n \"${3:-}\" ] && grep -a -h -F ' /dev/shm/' /proc/[0-9]*/maps 2>/dev/null | "
    "{ while read -r _a _p _o _d ino _rest; do [ \"$ino\" = \"$3\" ] && exit 0; done; exit 1; }; then return 0; fi\n"
    "  [ -n \"$(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 \\( -lname \"$1\" -o -lname \"$1 (deleted)\" "
    "-o -lname \"$1/*\" \\) -print -quit 2>/dev/null)\" ] && return 0\n"
    "  grep -a -h -F -e \" $2\" /proc/[0-9]*/maps 2>/dev/null | {\n"
    "    while IFS= read -r line; do\n"
    "      case $line in *\" $2\"|*\" $2 (deleted)\"|*\" $2/\"*) exit 0;; esac\n"
    "    done\n"
    "    exit 1\n"
    "  }\n"
    "}"
)


def removal_script(entries: Iterable[ShmEntry | str]) -> str:
    """A script that removes each named /dev/shm file only if still no process holds it.

    For each file, right before its ``rm``: it must still be the regular file the snapshot saw
    (same inode, when the snapshot knew it), and no process may have it open or mapped (a fresh
    read of every ``/proc/PID/fd`` and ``maps``). Prints ``removed HEX`` or ``kept HEX`` per file,
    the name hex-encoded so any name comes back intact.
    """
    lines = [_HELD_FUNCTION]
    for entry in entries:
        name = entry if isinstance(entry, str) else entry.name
        inode = None if isinstance(entry, str) else entry.inode
        if not name or "/" in name or "\0" in name or name in (".", ".."):
            raise ValueError(f"refusing to remove /dev/shm entry {name!r}: not a plain file name")
        path = f"{SHM_DIR}/{name}"
        tag = name.encode("utf-8", "surrogateescape").hex()
        same_file = f"-inum {int(inode)} " if inode is not None else ""
        lines.append(
            f"p={shlex.quote(path)}; "
            f"if [ -z \"$(find \"$p\" -maxdepth 0 -type f {same_file}-print 2>/dev/null)\" ]; then echo kept {tag}; "
            f"elif held {shlex.quote(_fnmatch_literal(path))} {shlex.quote(_maps_form(path))} "
            f"{int(inode) if inode is not None else ''}; then echo kept {tag}; "
            f"elif rm -f -- \"$p\"; then echo removed {tag}; else echo kept {tag}; fi"
        )
    return "\n".join(lines)


def parse_removal_output(stdout: str) -> list[str]:
    """The names :func:`removal_script` reports as removed."""
    removed = []
    for line in stdout.splitlines():
        verb, _, tag = line.partition(" ")
        if verb == "removed":
            try:
                removed.append(_decode_name(bytes.fromhex(tag.strip())))
            except ValueError:
                continue
    return removed


def remove_leftovers(host: Host, status: ShmStatus, patterns: Sequence[str] = LEAK_PATTERNS) -> list[str]:
    """Remove leftovers whose owning processes are gone; return the names removed.

    Only when the probe could see every process (``can_see_all_processes``); otherwise nothing
    is removed, because a file in use by a process we cannot see would be deleted under it.
    Only regular files are removed, and each is re-checked on the host right before its ``rm``.
    """
    if not status.can_see_all_processes:
        raise ProbeError(
            f"{host.name}: not removing /dev/shm leftovers: the probe cannot see every process's open "
            "files (run as root), so it cannot tell which files are still in use"
        )
    candidates = [e for e in leftovers(status, patterns) if e.in_use is False and e.kind in (None, "f")]
    if not candidates:
        return []
    result = host.run(removal_script(candidates), timeout=30)
    return parse_removal_output(result.stdout)
