"""A server that dies is reported as dead: the benchmark stops sending, the cause names the signal.

Real sockets and real processes, no vLLM: a port nobody listens on stands for a dead server's,
and a plain ``sh`` process killed with SIGKILL stands for its process (the path with a real
vLLM killed mid-benchmark is in tests/vllm/test_failures.py).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from pytest_gpuready import ServeSpec, VLLMServer
from pytest_gpuready.serve.bench import ServerGoneError, run_benchmark
from pytest_gpuready.serve.launch import describe_exit


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: connections are refused, as at a killed server's port


def test_the_benchmark_stops_sending_once_the_server_is_gone() -> None:
    checks: list[int] = []

    def alive() -> bool:
        checks.append(1)
        return len(checks) < 2  # the server "dies" after the first check

    with pytest.raises(ServerGoneError) as excinfo:
        run_benchmark(f"http://127.0.0.1:{dead_port()}", "m", concurrency=[4], requests=1000, warmup=0, alive=alive)
    # At most one request per worker after the death was seen, not a thousand failures.
    assert excinfo.value.sent <= 8
    assert excinfo.value.failed == excinfo.value.sent
    assert "the server's process is gone" in str(excinfo.value)
    assert "no more were sent" in str(excinfo.value)


def test_without_alive_every_request_is_counted_as_before() -> None:
    with pytest.raises(Exception, match="all 12 requests at concurrency 2 failed"):
        run_benchmark(f"http://127.0.0.1:{dead_port()}", "m", concurrency=[2], requests=12, warmup=0)


@pytest.mark.parametrize(("code", "text"), [
    (-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (-1, "killed by a signal (no exit code)"),
    (137, "exited with code 137 (killed by SIGKILL)"), (1, "exited with code 1"), (0, "exited with code 0"),
])
def test_exit_codes_read_as_engineers_say_them(code: int, text: str) -> None:
    assert describe_exit(code) == text


ROUTES = f"{sys.executable} {Path(__file__).resolve().parents[1] / 'standin' / 'vllm_routes.py'}"


def test_a_killed_server_says_how_it_died_and_its_teardown_says_so(tmp_path: Path) -> None:
    server = VLLMServer(ServeSpec(model="/m", served_model_name="m", command=ROUTES), snapshot=None,
                        log_dir=tmp_path, ready_timeout_s=600)
    server.start()
    try:
        assert server.is_alive()
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGKILL)  # the test plays the crash of a ready server
        deadline = time.monotonic() + 60
        while server.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.death() == "killed by SIGKILL"
        error = server.died_error("during the benchmark", "3 requests sent (3 failed), then no more")
        assert error.summary == ("vLLM m: the server died during the benchmark (killed by SIGKILL): "
                                 "3 requests sent (3 failed), then no more")
    finally:
        report = server.stop()
    assert report.died == "killed by SIGKILL"
    assert "the server had died before the stop (killed by SIGKILL); 0 processes stopped" in report.summary
    assert report.to_dict()["died"] == "killed by SIGKILL"
    assert server.death() is None  # stopped now: no longer "dead while serving"
