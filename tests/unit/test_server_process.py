"""VLLMServer's process handling, with real processes that are not vLLM (fast, no vLLM needed).

The launch command is configurable, so a plain ``sh`` script stands where ``vllm serve`` would:
one that exits with an error, one that never listens, one that ignores SIGTERM, one that prints
vLLM's fatal line and hangs. What is under test is how the plugin starts, watches, reports and
kills a process tree; the full path with a real vLLM is in tests/vllm/.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pytest_gpuready import (
    ConfigError,
    EngineDeadError,
    Footprint,
    LocalHost,
    ServerExitedError,
    ServerStartTimeout,
    ServeSpec,
    VLLMServer,
)
from pytest_gpuready.serve.processes import parse_members, session_members, session_script
from pytest_gpuready.serve.server import short_gpu_name
from pytest_gpuready.serve.vllm_log import StartupFigures


def sh(script: str) -> str:
    """A launch command running ``script``; the model/port arguments land in $1.. and are ignored."""
    return f"sh -c '{script}' fake-vllm"


def session_alive(sid: int) -> list[int]:
    return [p.pid for p in session_members(LocalHost(), sid, 0) if p.alive]


def test_a_command_that_does_not_exist_fails_at_once(tmp_path: Path) -> None:
    server = VLLMServer(ServeSpec(model="/m", command="/nonexistent/vllm serve"), log_dir=tmp_path)
    with pytest.raises(ServerExitedError, match=r"cannot run '/nonexistent/vllm': .*No such file"):
        server.start()


def test_exit_is_reported_at_once_with_code_cause_and_log_tail(tmp_path: Path) -> None:
    script = ('echo "INFO loading weights"; '
              'echo "ValueError: To serve at least one request with the models max seq len (262144)" >&2; exit 3')
    server = VLLMServer(ServeSpec(model="/m", label="MiniMax-M2.5", command=sh(script)), log_dir=tmp_path,
                        ready_timeout_s=1800)
    with pytest.raises(ServerExitedError) as excinfo:
        server.start()
    lines = str(excinfo.value).splitlines()
    assert lines[0].startswith("vLLM MiniMax-M2.5 exited with code 3 before it was ready: ValueError: To serve at "
                               "least one request with the models max seq len (262144) (command: sh -c ")
    assert lines[1] == f"--- last lines of the vLLM log ({server.log_path}) ---"
    assert lines[2:] == ["INFO loading weights",
                         "ValueError: To serve at least one request with the models max seq len (262144)"]
    assert server.teardown is not None
    assert server.teardown.exit_code == 3


def test_the_deadline_fails_with_the_last_state_and_stops_the_process(tmp_path: Path) -> None:
    server = VLLMServer(ServeSpec(model="/m", served_model_name="slow", command=sh("echo still loading; sleep 60")),
                        log_dir=tmp_path, ready_timeout_s=1.0, poll_interval_s=0.1)
    with pytest.raises(ServerStartTimeout) as excinfo:
        server.start()
    assert str(excinfo.value).splitlines()[0] == (
        "vLLM slow was not ready after 1 s (--vllm-ready-timeout); last state: loading (/health refuses connections)")
    assert excinfo.value.log_tail == "still loading"
    assert session_alive(server.pid or -1) == []


def test_a_fatal_log_line_fails_without_waiting_for_the_deadline(tmp_path: Path) -> None:
    script = 'echo "(EngineCore_DP0 pid=7) ERROR 01-15 [core.py:708] EngineCore failed to start."; sleep 60'
    server = VLLMServer(ServeSpec(model="/m", served_model_name="m", command=sh(script)), log_dir=tmp_path,
                        ready_timeout_s=1800, fatal_grace_s=0.3, poll_interval_s=0.1)
    with pytest.raises(EngineDeadError) as excinfo:
        server.start()
    assert str(excinfo.value).splitlines()[0] == (
        "vLLM m: the engine failed ((EngineCore_DP0 pid=7) ERROR 01-15 [core.py:708] EngineCore failed to start.) "
        "and the server did not exit within 0.3 s; stopping it")
    assert session_alive(server.pid or -1) == []


def test_sigterm_then_sigkill_for_the_whole_session_and_nobody_else(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # Both the shell and its child ignore SIGTERM (an ignored signal stays ignored across exec),
        # as vLLM's EngineCore and workers do while they initialise.
        # The engine's fatal line comes only once the child runs `sleep`: the start fails on that
        # condition, never on a deadline the shell must beat on a loaded machine.
        script = ('trap "" TERM; sleep 60 & while ! grep -q sleep /proc/$!/cmdline 2>/dev/null; do :; done; '
                  'echo "(EngineCore_DP0 pid=7) ERROR 01-15 [core.py:708] EngineCore failed to start."; wait')
        server = VLLMServer(ServeSpec(model="/m", served_model_name="m", command=sh(script)), log_dir=tmp_path,
                            ready_timeout_s=600, fatal_grace_s=0.3, term_timeout_s=0.5, poll_interval_s=0.1)
        with pytest.raises(EngineDeadError):
            server.start()
        report = server.teardown
        assert report is not None
        assert len(report.stopped) == 2
        assert len(report.needed_kill) == 2
        assert any("sleep 60" in p for p in report.needed_kill)
        assert report.survivors == ()
        assert report.notes == ("startup failed or was interrupted",)
        assert session_alive(server.pid or -1) == []
        assert bystander.poll() is None, "a process the plugin did not start was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_free_port_is_picked_and_passed(tmp_path: Path) -> None:
    server = VLLMServer(ServeSpec(model="/m", command=sh("sleep 60")), log_dir=tmp_path,
                        ready_timeout_s=0.5, poll_interval_s=0.1)
    with pytest.raises(ServerStartTimeout):
        server.start()
    assert server.port is not None
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert any(f"--port {server.port}" in p for p in server.teardown.stopped)  # type: ignore[union-attr]
    assert any("--host 127.0.0.1" in p for p in server.teardown.stopped)  # type: ignore[union-attr]


def test_stop_before_start_and_twice_is_harmless(tmp_path: Path) -> None:
    server = VLLMServer(ServeSpec(model="/m"), log_dir=tmp_path)
    first = server.stop()
    assert first.stopped == ()
    assert server.stop() is first


def test_bad_ready_timeout_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"ready_timeout_s: expected seconds > 0, got 0"):
        VLLMServer(ServeSpec(model="/m"), ready_timeout_s=0)


def test_attach_needs_an_http_url() -> None:
    with pytest.raises(ConfigError, match=r"--vllm-url 'gpu-box:8000': expected http://host:port"):
        VLLMServer.attach("gpu-box:8000")


def test_session_listing_reads_proc_and_signals_only_members() -> None:
    # the shell prints its children's pids once it has forked them; each is listed only once it
    # has exec'd sleep (read here from /proc directly, not by the code under test): waited on,
    # never assumed from the time since Popen
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; sleep 60 & echo $!; wait"], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        children = [int(proc.stdout.readline()), int(proc.stdout.readline())]
        deadline = time.monotonic() + 60  # a backstop, not a guess of speed
        while time.monotonic() < deadline and not all(
                Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x0060\x00" for pid in children):
            time.sleep(0.01)
        members = session_members(LocalHost(), proc.pid, 0)
        assert len(members) == 3
        assert {m.pid for m in members} >= {proc.pid}
        assert sorted(m.cmdline.strip() for m in members)[-1] == "sleep 60"
        session_members(LocalHost(), proc.pid, 0, "KILL")
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_session_script_rejects_other_signals_and_parses_its_output() -> None:
    with pytest.raises(ValueError, match="signal 'HUP'"):
        session_script(1, 0, "HUP")
    members = parse_members("12\tS\tpython3\tpython3 -m vllm serve /m\n13\tZ\tsleep\t\ngarbage\n")
    assert [(m.pid, m.alive, m.label) for m in members] == [
        (12, True, "pid 12 (python3 -m vllm serve /m)"), (13, False, "pid 13 (sleep)")]


def test_footprint_names_the_hardware_like_an_engineer() -> None:
    names = {i: "NVIDIA RTX PRO 6000 Blackwell Server Edition" for i in range(4)}
    footprint = Footprint(StartupFigures(), {i: 80000 for i in range(4)}, {i: 97887 for i in range(4)}, names,
                          baseline_mib={i: 3 for i in range(4)})
    assert footprint.hardware == "4x RTX PRO 6000"
    assert footprint.growth_mib() == {0: 79997, 1: 79997, 2: 79997, 3: 79997}
    assert Footprint(StartupFigures()).hardware == "no GPU"
    assert short_gpu_name("NVIDIA H200") == "H200"
    assert short_gpu_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
