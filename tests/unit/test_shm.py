"""/dev/shm listing, leak patterns, and removal of leftovers, on this machine's real /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost, ProbeError, snapshot
from pytest_gpuready.host.shm import (
    leftovers,
    matches_leak_pattern,
    parse_df,
    parse_shm_listing,
    removal_script,
    remove_leftovers,
)

DF_64MB = """Filesystem     1024-blocks  Used Available Capacity Mounted on
shm                  65536   512     65024       1% /dev/shm
"""


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("psm_3f2a1b7c", "psm_*"),
        ("sem.mp-x1y2z3", "sem.mp-*"),
        ("nccl-fd2c4e", "nccl-*"),
        ("vllm_shm_broadcast_0", "*vllm*"),
        ("VLLM-Engine", "*vllm*"),
        ("pulse-shm-1234", None),
        ("sem.other", None),
    ],
)
def test_leak_patterns(name: str, pattern: str | None) -> None:
    assert matches_leak_pattern(name) == pattern


def test_df_of_a_docker_default_shm() -> None:
    assert parse_df(DF_64MB) == (65536 * 1024, 65024 * 1024)


def test_df_garbage_is_an_error() -> None:
    with pytest.raises(ProbeError, match="df /dev/shm printed"):
        parse_df("df: /dev/shm: No such file or directory", "box")


def test_listing_garbage_is_an_error() -> None:
    with pytest.raises(ProbeError, match="lacks its 'list' line"):
        parse_shm_listing("psm_1 12 root", "box")
    with pytest.raises(ProbeError, match="unexpected /dev/shm listing record"):
        parse_shm_listing("list " + b"f\t1\tx\0".hex(), "box")


def test_removal_script_refuses_paths() -> None:
    with pytest.raises(ValueError, match="not a plain file name"):
        removal_script(["../etc/passwd"])
    with pytest.raises(ValueError, match="not a plain file name"):
        removal_script([".."])


@pytest.fixture
def shm_files() -> Iterator[list[Path]]:
    """Files this test creates in the real /dev/shm, removed afterwards whatever happens."""
    created: list[Path] = []
    yield created
    for path in created:
        path.unlink(missing_ok=True)


def _make(created: list[Path], name: str, size: int = 4096) -> Path:
    path = Path("/dev/shm") / name
    path.write_bytes(b"\0" * size)
    created.append(path)
    return path


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_real_shm_leftover_and_in_use_file(shm_files: list[Path]) -> None:
    tag = uuid.uuid4().hex[:8]
    stale = _make(shm_files, f"psm_gpureadytest_{tag}", 8192)
    held = _make(shm_files, f"sem.mp-gpureadytest-{tag}")
    holder = subprocess.Popen(  # a live process that keeps `held` open, like a running vLLM
        [sys.executable, "-c",
         f"import sys; f = open({str(held)!r}, 'rb'); print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"  # the holder has the file open now
        host = LocalHost()
        status = snapshot(host, gpus_expected=False).require_shm()
        ours = {e.name: e for e in status.entries if tag in e.name}
        assert ours[stale.name].size_bytes == 8192
        assert ours[stale.name].owner
        if os.geteuid() == 0:
            assert status.can_see_all_processes
            assert ours[stale.name].in_use is False
            assert ours[held.name].in_use is True
            assert stale.name in {e.name for e in leftovers(status)}
            assert held.name not in {e.name for e in leftovers(status)}
            removed = remove_leftovers(host, status, patterns=(f"*gpureadytest_{tag}*", f"*gpureadytest-{tag}*"))
            assert removed == [stale.name]
            assert not stale.exists()
            assert held.exists()
        else:
            assert ours[stale.name].in_use is None
            with pytest.raises(ProbeError, match="cannot tell which files are still in use"):
                remove_leftovers(host, status)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder reads stdin to its end, then exits
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()
