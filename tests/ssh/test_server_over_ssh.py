"""VLLMServer's remote path over the real loopback sshd: setsid nohup launch, log read back, exit code,
session kill. A plain ``sh`` script stands where ``vllm serve`` would (the launch command is
configurable); the same path with a real vLLM over ssh is in tests/vllm/test_failures.py.
"""

from __future__ import annotations

import re

import pytest

from pytest_gpuready import ServerExitedError, ServerStartTimeout, ServeSpec, SSHHost, VLLMServer
from pytest_gpuready.serve.processes import session_members


def test_remote_exit_is_read_from_the_wrapper_with_the_remote_log_tail(loopback_host: SSHHost) -> None:
    script = 'echo "loading on $(hostname)"; echo "RuntimeError: NCCL error: unhandled system error" >&2; exit 7'
    server = VLLMServer(ServeSpec(model="/m", served_model_name="m", command=f"sh -c '{script}' x"),
                        loopback_host, snapshot=None, ready_timeout_s=600)
    with pytest.raises(ServerExitedError) as excinfo:
        server.start()
    first = str(excinfo.value).splitlines()[0]
    assert first.startswith("vLLM m exited with code 7 before it was ready: RuntimeError: NCCL error: "
                            "unhandled system error (command: sh -c ")
    assert excinfo.value.log_tail.splitlines()[-1] == "RuntimeError: NCCL error: unhandled system error"
    assert server.log_path is not None
    assert re.fullmatch(r".*/gpuready-vllm\.[A-Za-z0-9]{6}/vllm\.log", server.log_path)
    # the remote server binds all interfaces; the client connects to the host's address
    assert server.url.startswith("http://127.0.0.1:")


def test_remote_timeout_kills_the_remote_session(loopback_host: SSHHost) -> None:
    server = VLLMServer(ServeSpec(model="/m", served_model_name="m", command="sh -c 'sleep 60 & wait' x"),
                        loopback_host, snapshot=None, ready_timeout_s=2, poll_interval_s=0.2)
    with pytest.raises(ServerStartTimeout):
        server.start()
    assert server.pid is not None
    report = server.teardown
    assert report is not None
    assert len(report.stopped) == 3  # the wrapper sh, the command's sh, and its sleep
    assert any("--host 0.0.0.0" in p for p in report.stopped)
    # Only zombies may remain (their parent, the ssh session, is gone; whoever adopted them reaps them).
    assert [p for p in session_members(loopback_host, server.pid, 0) if p.alive] == []
