"""The exact /dev/shm holder reader and the removal re-check, on this machine's real /proc and /dev/shm.

Real processes open and map files whose names hold spaces, newlines, quotes, tabs, glob characters,
a trailing space, a name ending in " (deleted)" and bytes that are not UTF-8; the reader must name
each of them exactly, and removal must keep every one that a live process holds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost, snapshot
from pytest_gpuready.host.shm import (
    parse_shm_holders,
    parse_shm_listing,
    read_shm_holders,
    removal_script,
    remove_leftovers,
    shm_display_name,
    shm_holders_script,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.path.isdir("/proc/self/fd"),
                                reason="needs Linux /dev/shm and /proc")

HOSTILE = (
    "vllm cache X",
    "psm_new\nline",
    "psm_quo'te\"s",
    "psm_glob*[x]?\\",
    "psm_tab\there",
    "psm_x (deleted)",
    "psm_trailing ",
    "psm_esc\\012aped",
    "psm_\x1cfs\rcr",
)
NOT_UTF8 = b"psm_latin1_\xe9\xff"


def _name(tag: str, base: str) -> str:
    return f"{base}-{tag}"


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def made(tag: str) -> Iterator[list[bytes]]:
    """Raw paths this test creates in /dev/shm, removed afterwards whatever happens."""
    created: list[bytes] = []
    yield created
    for path in created:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _create(made: list[bytes], raw_name: bytes, size: int = 4096) -> bytes:
    path = b"/dev/shm/" + raw_name
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)
    made.append(path)
    return path


MAP_ONLY = r"""
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for raw in sys.argv[1:]:
    fd = os.open(os.fsencode(raw), os.O_RDWR)
    address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    os.close(fd)  # only the mapping holds the file now: /proc/PID/fd no longer shows it
print("ready", flush=True)
sys.stdin.read()
"""


class Holder:
    """A live process holding files (open, or only mapped), until :meth:`stop`."""

    def __init__(self, script: str, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()  # the holder reads stdin to its end, then exits
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.stop()


def _raw(name: str) -> bytes:
    return os.fsencode(name)


def test_open_files_with_hostile_names_are_named_exactly(tag: str, made: list[bytes],
                                                         holders: list[Holder]) -> None:
    names = [_name(tag, base) for base in HOSTILE]
    raw_names = [_raw(n) for n in names] + [NOT_UTF8 + tag.encode()]
    for raw in raw_names:
        _create(made, raw)
    holder = Holder(MAP_ONLY, [])  # an unrelated live process
    holders.append(holder)
    opener = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys\nfds = [os.open(os.fsencode(a), os.O_RDONLY) for a in sys.argv[1:]]\n"
         "print('ready', flush=True)\nsys.stdin.read()",
         *[os.fsdecode(b"/dev/shm/" + r) for r in raw_names]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert opener.stdout is not None
        assert opener.stdout.readline().strip() == "ready"
        seen = read_shm_holders(LocalHost())
        for raw in raw_names:
            name = os.fsdecode(raw)
            assert opener.pid in seen.pids_holding(name), name
        # a prefix of a held name is not held: the match is exact, not "starts with"
        assert seen.pids_holding(_name(tag, "vllm cache")) == frozenset()
        assert seen.pids_holding(_name(tag, "psm_x")) == frozenset()
        # the pid filter reads only the processes asked for
        only_other = read_shm_holders(LocalHost(), pids=[holder.pid])
        assert opener.pid not in only_other.pids
        only_opener = read_shm_holders(LocalHost(), pids=[opener.pid])
        assert only_opener.pids == {opener.pid}
    finally:
        assert opener.stdin is not None
        assert opener.stdout is not None
        opener.stdin.close()
        opener.wait(timeout=60)
        opener.stdout.close()


def test_mapped_only_files_are_held_through_maps(tag: str, made: list[bytes], holders: list[Holder]) -> None:
    names = [_name(tag, base) for base in HOSTILE] + [os.fsdecode(NOT_UTF8 + tag.encode())]
    for name in names:
        _create(made, _raw(name))
    holder = Holder(MAP_ONLY, [f"/dev/shm/{n}" for n in names])
    holders.append(holder)
    fd_links = [os.readlink(f"/proc/{holder.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{holder.pid}/fd")]
    assert not any("/dev/shm/" in link for link in fd_links)  # held only through the mapping
    seen = read_shm_holders(LocalHost(), pids=[holder.pid])
    assert not seen.open_paths
    for name in names:
        assert seen.pids_holding(name) == {holder.pid}, name


def test_a_deleted_mapping_keeps_its_name_held_conservatively(tag: str, made: list[bytes],
                                                              holders: list[Holder]) -> None:
    name = _name(tag, "psm_gone")
    path = _create(made, _raw(name))
    holder = Holder(MAP_ONLY, [os.fsdecode(path)])
    holders.append(holder)
    os.unlink(path)  # maps now reads "/dev/shm/psm_gone-TAG (deleted)"
    _create(made, _raw(name))  # a new file of the same name: held is the safe answer
    seen = read_shm_holders(LocalHost(), pids=[holder.pid])
    assert seen.pids_holding(name) == {holder.pid}


def test_parser_reads_captured_output_exactly() -> None:
    fd = (b"/proc/42/fd\t/dev/shm/vllm cache X\0/proc/42/fd\t/dev/shm/a\nb\0"
          b"/proc/7/fd\t/dev/shm/psm_1 (deleted)\0")
    maps = (b"/proc/9/maps:7f9563dba000-7f9563dbb000 rw-s 00000000 00:1b 38"
            b"                         /dev/shm/tr ail \n"
            b"/proc/9/maps:7f9563dbb000-7f9563dbc000 rw-s 00000000 00:1b 37"
            b"                         /dev/shm/nl\\012x\n")
    text = f"fd {fd.hex()}\nmaps {maps.hex()}\n"
    holders = parse_shm_holders(text)
    assert holders.pids_holding("vllm cache X") == {42}
    assert holders.pids_holding("vllm") == frozenset()
    assert holders.pids_holding("a\nb") == {42}
    assert holders.pids_holding("psm_1") == {7}
    assert holders.pids_holding("tr ail ") == {9}
    assert holders.pids_holding("tr ail") == frozenset()
    assert holders.pids_holding("nl\nx") == {9}
    assert holders.pids_holding("nl\\012x") == {9}  # the same maps text: both count as held
    assert holders.pids == {42, 7, 9}


def test_parser_rejects_garbage_with_a_cause() -> None:
    from pytest_gpuready import ProbeError

    with pytest.raises(ProbeError, match="box: the /dev/shm holder listing lacks its 'fd' line"):
        parse_shm_holders("garbage", "box")
    with pytest.raises(ProbeError, match="not hex"):
        parse_shm_holders("fd zz\nmaps ", "box")
    with pytest.raises(ProbeError, match="unexpected /dev/shm fd record"):
        parse_shm_holders(f"fd {b'/etc/passwd'.hex()}\nmaps ", "box")


def test_empty_pid_filter_reads_nothing() -> None:
    assert read_shm_holders(LocalHost(), pids=[]).pids == frozenset()
    assert "find" not in shm_holders_script([])


def test_listing_names_any_file_exactly(tag: str, made: list[bytes]) -> None:
    raws = [_raw(_name(tag, base)) for base in HOSTILE] + [NOT_UTF8 + tag.encode()]
    for raw in raws:
        _create(made, raw, 8192)
    result = snapshot(LocalHost(), gpus_expected=False).require_shm()
    ours = {e.name: e for e in result.entries if tag in e.name}
    assert set(ours) == {os.fsdecode(r) for r in raws}
    assert all(e.size_bytes == 8192 and e.kind == "f" and e.inode for e in ours.values())
    from pytest_gpuready.host.shm import SHM_LIST_SCRIPT

    rows = parse_shm_listing(LocalHost().run(SHM_LIST_SCRIPT).stdout)
    assert {os.fsdecode(r) for r in raws} <= {row[0] for row in rows}


@pytest.mark.skipif(os.geteuid() != 0, reason="removal needs root: only root sees every process's files")
def test_removal_keeps_every_held_file_and_removes_the_rest(tag: str, made: list[bytes],
                                                            holders: list[Holder]) -> None:
    held_open = [_name(tag, base) for base in HOSTILE]
    held_mapped = [_name(tag, "m" + base) for base in HOSTILE]
    free = [_name(tag, "f" + base) for base in HOSTILE] + [os.fsdecode(NOT_UTF8 + tag.encode())]
    for name in held_open + held_mapped + free:
        _create(made, _raw(name))
    opener = Holder("import os, sys\nfds = [os.open(os.fsencode(a), os.O_RDONLY) for a in sys.argv[1:]]\n"
                    "print('ready', flush=True)\nsys.stdin.read()", [f"/dev/shm/{n}" for n in held_open])
    holders.append(opener)
    holders.append(Holder(MAP_ONLY, [f"/dev/shm/{n}" for n in held_mapped]))
    host = LocalHost()
    status = snapshot(host, gpus_expected=False).require_shm()
    ours = [e for e in status.entries if tag in e.name]
    assert {e.name for e in ours if e.in_use} == set(held_open + held_mapped)
    assert all(e.holders for e in ours if e.in_use)
    removed = remove_leftovers(host, status, patterns=(f"*{tag}*",))
    assert sorted(removed) == sorted(free)
    for name in held_open + held_mapped:
        assert os.path.lexists(os.fsencode(f"/dev/shm/{name}")), name
    for name in free:
        assert not os.path.lexists(os.fsencode(f"/dev/shm/{name}")), name


@pytest.mark.skipif(os.geteuid() != 0, reason="removal needs root: only root sees every process's files")
def test_removal_rechecks_right_before_rm(tag: str, made: list[bytes], holders: list[Holder]) -> None:
    """A file that was free at the snapshot but is opened before removal is kept; so is a file
    replaced by a new one of the same name (another inode)."""
    opened_late = _name(tag, "psm_late open")
    replaced = _name(tag, "psm_replaced")
    for name in (opened_late, replaced):
        _create(made, _raw(name))
    host = LocalHost()
    status = snapshot(host, gpus_expected=False).require_shm()
    assert all(e.in_use is False for e in status.entries if tag in e.name)
    holders.append(Holder("import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
                          "print('ready', flush=True)\nsys.stdin.read()", [f"/dev/shm/{opened_late}"]))
    os.unlink(f"/dev/shm/{replaced}")
    _create(made, _raw(replaced))
    assert remove_leftovers(host, status, patterns=(f"*{tag}*",)) == []
    assert Path(f"/dev/shm/{opened_late}").exists()
    assert Path(f"/dev/shm/{replaced}").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="removal needs root: only root sees every process's files")
def test_removal_never_touches_directories_or_fifos(tag: str) -> None:
    directory = Path(f"/dev/shm/psm_dir-{tag}")
    fifo = Path(f"/dev/shm/psm_fifo-{tag}")
    directory.mkdir()
    os.mkfifo(fifo)
    try:
        host = LocalHost()
        status = snapshot(host, gpus_expected=False).require_shm()
        assert remove_leftovers(host, status, patterns=(f"*{tag}*",)) == []
        assert directory.is_dir()
        assert fifo.exists()
        # even named directly, the script keeps what is not a regular file
        out = host.run(removal_script([directory.name, fifo.name])).stdout
        assert "removed" not in out
    finally:
        directory.rmdir()
        fifo.unlink()


def test_display_names_stay_on_one_line() -> None:
    assert shm_display_name("psm_1") == "/dev/shm/psm_1"
    assert shm_display_name("vllm cache X") == "/dev/shm/vllm cache X"
    shown = shm_display_name("a\nb'c")
    assert "\n" not in shown
    assert "\\n" in shown
    assert shm_display_name(os.fsdecode(b"x\xff")).isascii()
