"""A hung nvidia-smi: the probe names what hung, kills it with everything it started, and keeps the rest.

The stand-in nvidia-smi (labelled; CI has no GPU) of the ``hang-*`` scenarios never answers one
kind of call and leaves a child ``sleep`` behind, as a wedged driver call does; both write their
pids to a directory, so the tests can check that nothing of the hung probe is left running.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost, snapshot

Standin = Callable[[str], Path]
HUNG_S = 10
"""The probe timeout of the hung-section tests. The hung call never answers, so this only sets how
long those tests take; every other section must answer within it, also on a loaded 2-core machine
(at load 20, python3's start alone took over 2 s: a 2 s timeout cut sections that were not hung)."""
DEADLINE_S = 120
"""Generous: the probes here finish a few seconds after their 2 s timeout; this only tells "finished"
from "hung" (the issue's hung nvidia-smi was cut only after 120 s)."""


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a killed child waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def assert_all_gone(piddir: Path, at_least: int = 2) -> None:
    """Every pid the hung stand-in recorded is gone (polled: SIGKILL is delivered asynchronously)."""
    pids = [int(p.name) for p in piddir.iterdir()]
    assert len(pids) >= at_least, f"the stand-in did not hang as planned: {pids}"  # else the test proves nothing
    deadline = time.monotonic() + 60
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in pids if running(pid)]
    assert not survivors, f"still running after the probe timeout: {survivors}"


@pytest.fixture
def piddir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pids"
    path.mkdir()
    monkeypatch.setenv("GPUREADY_STANDIN_PIDDIR", str(path))
    return path


SNAPSHOT_TEST = """
def test_snapshot(gpu_snapshot):
    print("ERRORS", gpu_snapshot.errors)
    assert gpu_snapshot.shm is not None  # the sections that answered are still used
"""


def test_hung_query_gpu_is_named_killed_and_the_rest_kept(pytester: pytest.Pytester, standin: Standin,
                                                          piddir: Path) -> None:
    standin("hang-query-gpu")
    started = time.monotonic()
    result = pytester.runpytest_subprocess("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm",
                                           "-p", "no:cacheprovider", "--gpu-probe-timeout", str(HUNG_S),
                                           timeout=DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S
    result.assert_outcomes(errors=2)  # "could not measure" in the test body is an error, not a failure
    result.stdout.fnmatch_lines([
        f"*local: GPUs could not be read: nvidia-smi --query-gpu did not answer within {HUNG_S} s",
    ])
    assert "Traceback" not in result.stdout.str()
    assert_all_gone(piddir)


def test_sections_that_answered_are_kept(pytester: pytest.Pytester, standin: Standin, piddir: Path) -> None:
    standin("hang-query-gpu")
    pytester.makepyfile(SNAPSHOT_TEST)
    pytester.makeini(f"[pytest]\ngpu_probe_timeout = {HUNG_S}\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", timeout=DEADLINE_S)
    result.assert_outcomes(passed=1)
    # The health fields are a second --query-gpu in the same round trip: it hangs the same way.
    hung = f"nvidia-smi --query-gpu did not answer within {HUNG_S} s"
    result.stdout.fnmatch_lines([f"*ERRORS {{'gpus': '{hung}', 'health': '{hung}'}}"])
    assert_all_gone(piddir)


def test_hung_topology_errors_only_the_topology_test(pytester: pytest.Pytester, standin: Standin,
                                                    piddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    standin("hang-topo")
    monkeypatch.setenv("GPUREADY_GPU_PROBE_TIMEOUT", str(HUNG_S))
    result = pytester.runpytest_subprocess("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm",
                                           "-p", "no:cacheprovider", timeout=DEADLINE_S)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*local: GPU topology could not be read: nvidia-smi topo -m did not answer "
                                 f"within {HUNG_S} s"])
    assert_all_gone(piddir)


@pytest.mark.parametrize(("args", "env", "message"), [
    (("--gpu-probe-timeout", "0"), {}, "ERROR: --gpu-probe-timeout '0': expected a number > 0"),
    (("--gpu-probe-timeout", "soon"), {}, "ERROR: --gpu-probe-timeout 'soon': expected a number > 0"),
    ((), {"GPUREADY_GPU_PROBE_TIMEOUT": "-1"}, "ERROR: $GPUREADY_GPU_PROBE_TIMEOUT '-1': expected a number > 0"),
])
def test_bad_probe_timeout_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                            args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_help_lists_the_probe_timeout(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--gpu-probe-timeout=SECONDS*"])


# ---------------------------------------------------------------- library level


def test_a_probe_that_answers_leaves_no_watchdog_behind(standin: Standin) -> None:
    """The watchdog's timer is stopped with the probe: no ``sleep`` of it outlives the snapshot."""
    standin("h200-idle")
    odd = 97.25  # a timeout no other process here sleeps for, and far past any loaded machine's probe time
    snap = snapshot(LocalHost(), timeout=odd)
    assert snap.errors == {}

    def watchdog_sleeps() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "cmdline").read_bytes() == b"sleep\x0097.25\x00" and running(int(entry.name)):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    deadline = time.monotonic() + 30
    while watchdog_sleeps() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watchdog_sleeps() == []


def test_command_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """LocalHost.run: past its timeout the command's grandchildren die too, not only its sh."""
    from pytest_gpuready.host.hosts import CommandTimeout

    pidfile = tmp_path / "pids"
    with pytest.raises(CommandTimeout, match=r"^local: command timed out after 1 s$") as info:
        LocalHost().run(f"sleep 600 & echo $! >> {pidfile}; (sleep 600 & echo $! >> {pidfile}; wait) & "
                        "echo partial; wait", timeout=1)
    assert info.value.stdout == "partial\n"  # what it printed before the cut comes back
    pids = [int(line) for line in pidfile.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(p) for p in pids)


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    """Live pids whose parent is ``pid`` (one pass over /proc)."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _parent(int(entry.name)) == pid and running(int(entry.name))]


def _ancestors(pid: int) -> set[int]:
    found: set[int] = set()
    parent = _parent(pid)
    while parent is not None and parent > 1 and parent not in found:
        found.add(parent)
        parent = _parent(parent)
    return found


def test_the_watchdog_never_acts_outside_a_session_of_its_own(standin: Standin, piddir: Path,
                                                              tmp_path: Path) -> None:
    """Run the probe script in a process group that does not lead its session (as a login shell
    may run it): the watchdog must not kill anything (it cannot tell its group is only the
    probe's), and says the sections hung.

    The group is made here (``setpgrp``), not inherited, so whether pytest itself leads a session
    (``setsid``, some CI runners) cannot change what is tested. Nothing is timed: the test waits
    until the watchdog has marked its deadline (``@@timeout`` in the probe's private directory)
    and exited (the probe's shell has no child left but those the hung stand-in descends from).
    """
    import subprocess

    from pytest_gpuready.host.probe import build_probe_script

    standin("hang-query-gpu")
    private = tmp_path / "tmp"
    private.mkdir()
    proc = subprocess.Popen(["sh", "-c", build_probe_script(timeout_s=1)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(private)},
                            preexec_fn=os.setpgrp)  # a group of its own, never its session's

    def watchdog_done() -> bool:
        hung = [int(p.name) for p in piddir.iterdir()]
        if len(hung) < 2 or not list(private.glob("gpuready.*/@@timeout")):
            return False
        kept = set().union(*(_ancestors(pid) for pid in hung))
        return all(child in kept for child in _children(proc.pid))

    try:
        deadline = time.monotonic() + 60  # a backstop for a broken script, not a guess of speed
        while not watchdog_done() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watchdog_done(), "the watchdog did not mark its deadline and exit"
        assert running(proc.pid)  # the probe's own shell is alive, waiting on the hung section
        assert all(running(int(p.name)) for p in piddir.iterdir())  # the hung stand-in was not killed
    finally:
        for entry in piddir.iterdir():  # ours to end: started by this test
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), 9)
        proc.wait(timeout=60)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
    assert "@@timeout 1" in out  # it did see the deadline pass, and stood back


class _ImpatientHost(LocalHost):
    """This machine, but a command is cut, by process group, as soon as the stand-in has hung
    (both its pids recorded) whatever timeout it asked for: the probe's own watchdog (at 30 s)
    never acts, so the cut comes from here. A condition, not a guessed second: under load the
    stand-in may take longer than that just to start."""

    def __init__(self, piddir: Path) -> None:
        super().__init__()
        self.piddir = piddir

    def run(self, script: str, *, timeout: float = 120, stdin: bytes | None = None):  # type: ignore[no-untyped-def]
        from pytest_gpuready.host.hosts import CommandTimeout, run_bounded

        def hung(_elapsed: float) -> str | None:
            return "the stand-in hung" if len(list(self.piddir.iterdir())) >= 2 else None

        done = run_bounded(["sh", "-c", script], stdin or b"", timeout, early_cut=hung)
        if done.cut is None:
            raise AssertionError("the stand-in did not hang as planned")
        raise CommandTimeout(f"local: command cut ({done.cut})")


def test_a_probe_cut_from_outside_is_named_and_its_group_killed(standin: Standin, piddir: Path) -> None:
    from pytest_gpuready import ProbeError

    standin("hang-query-gpu")
    with pytest.raises(ProbeError, match=r"^local: the probe did not answer within 40 s \(its watchdog did not act; "
                                         r"it was killed from here\)$"):
        snapshot(_ImpatientHost(piddir), reader="nvidia-smi", timeout=30)
    assert_all_gone(piddir)
