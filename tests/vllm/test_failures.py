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
from tests.sshd import LoopbackSshd
from tests.vllm.conftest import API_SERVER_COMMAND, SERVER_ENV, session_pids, shm_names

BAD_FLAG = "--definitely-not-a-flag"


def wait_until(predicate: object, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s (no fixed sleeps); fail with ``what`` at ``timeout_s``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def test_bad_argument_fails_at_once_with_exit_code_and_log_tail(tiny_spec: ServeSpec, tmp_path: Path) -> None:
    spec = dataclasses.replace(tiny_spec, extra_args=(BAD_FLAG,))
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
        spec = dataclasses.replace(tiny_spec, extra_args=(BAD_FLAG,))
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
    before = shm_names()
    # clean_timeout_s: the crash's files never go away; no need to poll for them for 30 s.
    server = VLLMServer(tiny_spec, LocalHost(), log_dir=tmp_path, clean_timeout_s=2)
    server.start()
    created: set[str] = set()
    try:
        sid = server.pid
        assert sid is not None
        assert len(server.processes()) >= 3
        os.killpg(sid, signal.SIGKILL)  # the test plays the crash; the plugin only signals in stop()
        wait_until(lambda: not session_pids(sid), 30, f"session {sid} to die")
        created = {n for n in shm_names() - before if n.startswith(("psm_", "sem.mp-"))}
        assert any(n.startswith("psm_") for n in created), created
        verdict = check_shm_clean(snapshot(LocalHost(), gpus_expected=False), min_free_mib=0)
        assert not verdict.ok
        for name in created:
            assert f"/dev/shm/{name}: " in verdict.message
        assert "no process holds it" in verdict.message
        # Teardown after the crash: nothing left to stop, but it says what the crash left behind.
        report = server.stop()
        assert report.stopped == ()
        assert not report.ok
        assert set(report.shm_leftovers) >= created
        assert "left in /dev/shm: psm_" in report.message
    finally:
        server.stop()
        for name in created:  # the files this test's crash left (nothing else is touched)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")


CTRL_C_TEST = """
from pytest_gpuready import ServeSpec


def test_start(vllm_server):
    vllm_server(ServeSpec(model={model!r}, served_model_name="tiny-llama", max_model_len=1024,
                          command={command!r}, env={env!r}))
"""


def test_ctrl_c_during_startup_leaves_no_process(
    tiny_spec: ServeSpec, pytester: pytest.Pytester, tmp_path: Path
) -> None:
    before = shm_names()
    pytester.makepyfile(test_interrupted=CTRL_C_TEST.format(
        model=tiny_spec.model, command=API_SERVER_COMMAND, env=SERVER_ENV))
    out = tmp_path / "stdout.txt"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "pytest_gpuready.plugin.server_fixtures", "-p", "no:cacheprovider",
             "-s", str(pytester.path / "test_interrupted.py")],
            cwd=pytester.path, stdout=stdout, stderr=subprocess.STDOUT,
        )
    try:
        started = re.compile(r"started pid (\d+) \(session \d+\) on local, port \d+, log (\S+)")
        match: list[re.Match[str]] = []

        def server_started() -> bool:
            found = started.search(out.read_text(errors="replace"))
            if found:
                match.append(found)
            return found is not None

        wait_until(server_started, 60, "the inner run to start the server")
        sid, log = int(match[0].group(1)), Path(match[0].group(2))
        # Interrupt once the engine has spawned its own processes (the EngineCore and a worker).
        wait_until(lambda: "(EngineCore pid=" in log.read_text(errors="replace"), 120, "the EngineCore to start")
        assert len(session_pids(sid)) >= 3
        interrupted_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == pytest.ExitCode.INTERRUPTED
        print(f"inner run exited {time.monotonic() - interrupted_at:.1f} s after SIGINT")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text(errors="replace")
    assert "KeyboardInterrupt" in text
    assert re.search(r"gpuready: vLLM tiny-llama: \d+ s, loading", text) or "started pid" in text
    assert "gpuready: tiny-llama: teardown clean in " in text, text[-3000:]
    assert session_pids(sid) == [], f"processes of the interrupted server survive:\n{text[-3000:]}"
    leftovers = {n for n in shm_names() - before if n.startswith(("psm_", "sem.mp-"))}
    assert leftovers == set()
