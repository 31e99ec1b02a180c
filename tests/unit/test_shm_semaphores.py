"""A live POSIX semaphore is held, although no process maps it under its own name.

``sem_open`` (multiprocessing's ``sem.mp-*``, loky's ``sem.loky-*``) creates the file under a
temporary name, maps it, and links it to its real name: ``/proc/PID/maps`` shows the temporary
name, ``(deleted)``. Only the inode ties the mapping to ``/dev/shm/sem.mp-*``. Before the inode
was read, ``shm_clean`` called every running vLLM's semaphores leftovers and
``--shm-remove-leftovers`` deleted them under it (vLLM then failed to start: ``SemLock._rebuild``
``FileNotFoundError``). Real processes, the real /dev/shm.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost
from pytest_gpuready.host.shm import parse_removal_output, read_shm_holders, removal_script
from pytest_gpuready.host.snapshot import ShmEntry
from pytest_gpuready.serve.shm_ownership import ShmOwnership, read_listing_and_holders

HOLDER = r"""
import multiprocessing, sys
lock = multiprocessing.get_context("spawn").Lock()
print("sem" + lock._semlock.name.replace("/", "."), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def semaphore() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    assert name.startswith("sem.mp-")
    assert Path(f"/dev/shm/{name}").exists()
    yield proc, name
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)
    proc.stdout.close()


def test_the_semaphore_is_mapped_only_under_another_name(semaphore: tuple[subprocess.Popen[str], str]) -> None:
    proc, name = semaphore
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert f"/dev/shm/{name}" not in maps  # the fact the name-based check missed
    holders = read_shm_holders(LocalHost(), [proc.pid])
    assert holders.pids_holding(name) == frozenset()
    inode = Path(f"/dev/shm/{name}").stat().st_ino
    assert holders.pids_holding(name, inode) == {proc.pid}


def test_it_is_in_use_kept_by_the_removal_and_owned_by_its_server(semaphore: tuple[subprocess.Popen[str], str]) -> None:
    proc, name = semaphore
    host = LocalHost()
    entries, holders = read_listing_and_holders(host, [proc.pid])
    (entry,) = [e for e in entries if e.name == name]
    assert holders.pids_holding(entry.name, entry.inode) == {proc.pid}
    shm_entry = ShmEntry(entry.name, entry.size_bytes, entry.owner, entry.mtime, in_use=False, kind="f",
                         inode=entry.inode)
    result = host.run(removal_script([shm_entry]), timeout=30)
    assert parse_removal_output(result.stdout) == []
    assert Path(f"/dev/shm/{name}").exists(), "a live semaphore was removed"
    ownership = ShmOwnership()
    ownership.sample(host, proc.pid, [proc.pid])
    assert name in ownership.held
