"""The watchdog, with real processes and real signals: nothing the plugin started outlives pytest.

A real pytest run (a subprocess, as a CI job runs it) starts a server through ``vllm_server``
and is killed with SIGKILL while the server still loads; the server's session must then go,
stopped by the watchdog (its log says so). A plain ``sh`` process tree stands where ``vllm
serve`` would: what is under test is the process handling; the same with a real, ready vLLM is
in tests/vllm/test_watchdog_vllm.py and over ssh in tests/ssh/test_watchdog_over_ssh.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost
from pytest_gpuready.serve.processes import process_start_time, session_members
from pytest_gpuready.serve.watchdog import start_watchdog, watchdog_argv
from tests.process_watch import wait_for_output

# The server's leader and a child both ignore SIGTERM, as vLLM's EngineCore does while it loads.
STUBBORN = "sh -c 'trap \"\" TERM; sleep 600 & sleep 600 & wait' fake-vllm"


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def alive(sid: int) -> list[int]:
    return [p.pid for p in session_members(LocalHost(), sid, 0) if p.alive]


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own that no watchdog may ever signal."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


SERVER_TEST = """
from pytest_gpuready import ServeSpec

def test_start(vllm_server):
    vllm_server(ServeSpec(model="/m", served_model_name="m", command={command!r}))
"""

STARTED = re.compile(r"started pid (\d+) \(session \d+\) on local")
WATCHING = re.compile(r"watchdog pid (\d+) on local stops session (\d+) if this process dies first \(log (\S+)\)")


def test_sigkill_of_pytest_while_its_server_loads_stops_the_server(
    pytester: pytest.Pytester, tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    pytester.makepyfile(test_server=SERVER_TEST.format(command=STUBBORN))
    out = tmp_path / "stdout.txt"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "pytest_gpuready.plugin.server_fixtures", "-p", "no:cacheprovider",
             "-s", "--vllm-ready-timeout", "600", str(pytester.path / "test_server.py")],
            cwd=pytester.path, stdout=stdout, stderr=subprocess.STDOUT,
        )
    try:
        match = wait_for_output(proc, out, WATCHING, 300)
        watchdog_pid, sid, log = int(match.group(1)), int(match.group(2)), Path(match.group(3))
        assert STARTED.search(out.read_text())
        wait_until(lambda: len(alive(sid)) >= 3, 60, "the server's three processes")
        assert os.getsid(watchdog_pid) == watchdog_pid  # a session of its own: the TERM/KILL cannot reach it
        proc.send_signal(signal.SIGKILL)  # a cancelled CI job
        proc.wait(timeout=60)
        wait_until(lambda: not alive(sid), 60, f"session {sid} to be stopped after pytest died")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until(lambda: "processes gone " in Path(log).read_text(), 60, "the watchdog's last line")
    text = log.read_text()
    assert f"session {sid}: pytest is gone (eof); stopping the server" in text
    assert re.search(rf"session {sid}: SIGTERM to {sid} \d+ \d+\n", text), text
    assert re.search(rf"session {sid}: SIGKILL to {sid} \d+ \d+ after 5.0 s\n", text), text
    assert f"session {sid}: all 3 processes gone " in text
    assert bystander.poll() is None, "a process outside the session was signalled"


def _watchdog_on(sid: int, start: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(watchdog_argv(LocalHost(), sid, start, 0.5, str(log)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().split()[:2] == [b"watching", str(sid).encode()]
    return proc


def _close(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()


def test_a_recycled_leader_pid_is_never_signalled(tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    start = process_start_time(LocalHost(), bystander.pid)
    assert start is not None
    # The session id is right but the start time is not: the pid now names another process.
    proc = _watchdog_on(bystander.pid, start - 1, tmp_path / "w.log")
    _close(proc)
    assert bystander.poll() is None
    assert f"session {bystander.pid}: nothing left to stop" in (tmp_path / "w.log").read_text()


def test_release_signals_nothing(tmp_path: Path) -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        wait_until(lambda: len(alive(leader.pid)) == 2, 60, "the leader's child")
        start = process_start_time(LocalHost(), leader.pid)
        assert start is not None
        log = tmp_path / "w.log"
        watchdog = start_watchdog(LocalHost(), leader.pid, start, log_path=str(log), grace_s=0.5)
        watchdog.release()
        assert not watchdog.alive
        assert f"session {leader.pid}: released (pytest stopped the server itself)" in log.read_text()
        assert len(alive(leader.pid)) == 2, "release must signal nothing"
    finally:
        for pid in alive(leader.pid):
            os.kill(pid, signal.SIGKILL)
        leader.wait()


def test_members_seen_while_the_leader_lived_are_stopped_after_it_died(tmp_path: Path) -> None:
    # The EngineCore case: the API server (session leader) dies first, its child lives on.
    leader = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 600 & wait"], start_new_session=True)
    try:
        wait_until(lambda: len(alive(leader.pid)) == 2, 60, "the leader's child")
        start = process_start_time(LocalHost(), leader.pid)
        assert start is not None
        log = tmp_path / "w.log"
        watchdog = start_watchdog(LocalHost(), leader.pid, start, log_path=str(log), grace_s=0.5)
        (child,) = [pid for pid in alive(leader.pid) if pid != leader.pid]
        wait_until(lambda: re.search(rf"members seen: .*\b{child}\b", log.read_text()), 30,
                   "the watchdog to see the child")
        leader.kill()
        leader.wait()
        assert alive(leader.pid) == [child]  # the orphan, still in the leader's session
        assert watchdog.proc.stdin is not None
        watchdog.proc.stdin.close()  # pytest "dies"
        watchdog.proc.wait(timeout=60)
        for stream in (watchdog.proc.stdout, watchdog.proc.stderr):
            assert stream is not None
            stream.close()
        wait_until(lambda: not alive(leader.pid), 30, "the orphaned child to be stopped")
        assert f"SIGKILL to {child} after 0.5 s" in log.read_text()
    finally:
        leader.kill()
        leader.wait()
        for pid in alive(leader.pid):
            os.kill(pid, signal.SIGKILL)
