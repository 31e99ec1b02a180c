"""Example: model-specific gates for MiniMax-M2.5 served with TP=4 on 4 of 8 RTX PRO 6000s.

What a deploy gate for one model looks like: the deployment (GPUs, TP, serve arguments and the
thresholds) is read from ``examples/deploy.yaml`` (deployment ``MiniMax-M2.5-tp4``); the tests
launch it with vLLM once, check the weights' footprint per GPU, and measure single-stream and
256-stream output throughput the way ``vllm bench serve`` does::

    pytest examples/test_minimax_m25.py --gpu-host root@gpu-box-7 --junitxml=report.xml \\
        --gpuready-report=figures.json

or, against the server a systemd unit already runs (nothing is started or stopped)::

    pytest examples/test_minimax_m25.py --gpu-host root@gpu-box-7 --vllm-url http://gpu-box-7:8000

Skipped without a GPU host. The ``model`` in deploy.yaml must point at the real checkpoint on
that host (the copy in examples/models/ holds config.json only). A miss reads like::

    single-stream output 61.2 tok/s < 80 tok/s required (MiniMax-M2.5, TP=4, 4x RTX PRO 6000)
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pytest_gpuready import (
    BenchmarkServing,
    Host,
    HostSnapshot,
    ServerFactory,
    Throughput,
    VLLMServer,
    checked,
    load_deploy_config,
)

DEPLOYMENT = load_deploy_config(Path(__file__).parent / "deploy.yaml").get("MiniMax-M2.5-tp4")


def _threshold(concurrency: int) -> Throughput:
    threshold = DEPLOYMENT.expect.at_concurrency(concurrency)
    assert threshold is not None, f"deploy.yaml has no throughput threshold at concurrency {concurrency}"
    return threshold


@pytest.fixture
def minimax(gpu_host: Host, gpu_snapshot: HostSnapshot, vllm_server: ServerFactory) -> VLLMServer:
    """The MiniMax-M2.5 TP=4 server: launched on first use and shared by every test (or attached with --vllm-url)."""
    checked(gpu_snapshot.require_gpus)  # skips with the reason when there is no GPU
    if not vllm_server.attaching:
        found = gpu_host.run(f"ls {shlex.quote(DEPLOYMENT.model_path)}/*.safetensors 2>/dev/null | head -1")
        if not found.stdout.strip():
            pytest.skip(f"{DEPLOYMENT.model_path} on {gpu_host.name} holds no *.safetensors: point "
                        "deploy.yaml's model at the MiniMax-M2.5 checkpoint")
    return vllm_server(DEPLOYMENT)


def test_weights_per_gpu_within_bounds(minimax: VLLMServer, vllm_server: ServerFactory) -> None:
    if minimax.is_attached:
        pytest.skip("attached to a running server: its startup log is the service manager's")
    vllm_server.expect_weights_per_gpu(minimax, DEPLOYMENT.expect.weights_per_gpu_gib_min,
                                       DEPLOYMENT.expect.weights_per_gpu_gib_max)


def test_gpu_memory_stays_within_gpu_memory_utilization(minimax: VLLMServer) -> None:
    footprint = minimax.footprint
    assert footprint is not None
    assert footprint.gpu_memory_mib is not None
    assert footprint.gpu_total_mib is not None
    budget = DEPLOYMENT.serve.gpu_memory_utilization
    for index, used in footprint.gpu_memory_mib.items():
        total = footprint.gpu_total_mib[index]
        # vLLM caps its own allocations at budget x total; the CUDA context adds ~0.5 GiB on top.
        assert used <= total * budget + 1024, f"GPU {index}: {used} MiB used of {total} MiB (budget {budget})"


def test_single_stream_output_throughput(minimax: VLLMServer, benchmark_serving: BenchmarkServing) -> None:
    threshold = _threshold(1)
    bench = benchmark_serving(minimax, concurrency=[1], prompt_tokens=threshold.input_len or 1024,
                              output_tokens=threshold.output_len or 256, requests=threshold.num_prompts or 16)
    bench.expect_thresholds([threshold])


def test_256_streams_output_throughput(minimax: VLLMServer, benchmark_serving: BenchmarkServing) -> None:
    threshold = _threshold(256)
    bench = benchmark_serving(minimax, concurrency=[256], prompt_tokens=threshold.input_len or 1024,
                              output_tokens=threshold.output_len or 256, requests=threshold.num_prompts or 1024)
    bench.expect_thresholds([threshold])
