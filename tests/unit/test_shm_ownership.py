"""A server's /dev/shm files are the ones its processes hold, plus those named for its pids.

Real processes and the real /dev/shm: a "server" process tree that holds a ``psm_*`` segment
(``multiprocessing.shared_memory``) and a file with spaces in its name, and creates a
``sem.loky-<its pid>-*`` file as a GPU EngineCore does; a foreign process creates ``psm_*``
files meanwhile. Only the server's files may be attributed to it, before and after it is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost
from pytest_gpuready.serve.processes import session_members
from pytest_gpuready.serve.shm_ownership import ShmOwnership
from pytest_gpuready.serve.teardown import wait_shm_gone

HOLDER = r"""
import os, sys
from multiprocessing import resource_tracker, shared_memory
tag = sys.argv[1]
segment = shared_memory.SharedMemory(name=f"psm_{tag}_{sys.argv[2]}", create=True, size=4096)
resource_tracker.unregister(segment._name, "shared_memory")  # the test removes it, not the tracker
held = open(f"/dev/shm/{sys.argv[2]} vllm cache {tag}", "w")
if sys.argv[3] == "loky":
    open(f"/dev/shm/sem.loky-{os.getpid()}-{tag}", "w").close()  # created, then held by nobody
print("ready", flush=True)
sys.stdin.read()
"""


def spawn(tag: str, role: str, loky: bool) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, tag, role, "loky" if loky else "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def mine(tag: str) -> set[str]:
    return {name for name in os.listdir("/dev/shm") if tag in name}


@pytest.fixture
def tag() -> Iterator[str]:
    value = uuid.uuid4().hex[:10]
    yield value
    for name in mine(value):  # only this test's files
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def test_only_files_held_by_the_servers_processes_or_named_for_them_are_its(tag: str) -> None:
    host = LocalHost()
    server = spawn(tag, "server", loky=True)
    foreign = spawn(tag, "foreign", loky=True)
    try:
        ownership = ShmOwnership()
        ownership.sample(host, server.pid, [p.pid for p in session_members(host, server.pid, 0) if p.alive])
        assert ownership.held == {f"psm_{tag}_server", f"server vllm cache {tag}"}
        assert server.pid in ownership.pids  # with its resource tracker, a member of its session too
        assert ownership.owns(f"sem.loky-{server.pid}-{tag}")
        # A pid that is not (or no longer) a member of the session is never credited, even if passed:
        # what a member's recycled pid would look like, read between the listing and the holders.
        other = ShmOwnership()
        other.sample(host, server.pid, [foreign.pid])
        assert other.held == set()
        assert not ownership.owns(f"sem.loky-{foreign.pid}-{tag}")
        assert ownership.present(host) == {f"psm_{tag}_server", f"server vllm cache {tag}",
                                           f"sem.loky-{server.pid}-{tag}"}
        # The crash: killed, its files stay. Teardown names exactly those, never the foreign ones.
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        left = wait_shm_gone(host, ownership, 0)
        assert set(left) == {f"psm_{tag}_server", f"server vllm cache {tag}", f"sem.loky-{server.pid}-{tag}"}
        assert not [name for name in left if "foreign" in name or str(foreign.pid) in name]
        # Once its files are gone, the teardown is clean although the foreign files remain.
        for name in left:
            os.unlink(f"/dev/shm/{name}")
        assert wait_shm_gone(host, ownership, 5) == ()
        assert {f"psm_{tag}_foreign", f"sem.loky-{foreign.pid}-{tag}"} <= mine(tag)
    finally:
        stop(server)
        stop(foreign)


def test_a_server_that_held_nothing_owns_nothing(tag: str, tmp_path: Path) -> None:
    host = LocalHost()
    foreign = spawn(tag, "foreign", loky=False)
    try:
        ownership = ShmOwnership()
        ownership.sample(host, 1, [])
        assert wait_shm_gone(host, ownership, 5) == ()
        assert f"psm_{tag}_foreign" in mine(tag)
    finally:
        stop(foreign)
