"""Example: MiniMax-M2.5 (FP8, block [128, 128]) on 8 GPUs needs expert parallelism on vLLM <= 0.28.

MiniMax's recipe for 8 GPUs is ``--tensor-parallel-size 8 --enable-expert-parallel``. Without EP,
vLLM 0.17 splits each expert's FFN (1536) eight ways, 192 per GPU, which is not a multiple of the
128-wide FP8 block, and stops after minutes of loading with "The output_size of gate's and up's
weight = 192 is not divisible by weight quantization block_n = 128." These gates answer that from
config.json in milliseconds, anywhere (no GPU needed); the launch test below needs the GPU host::

    pytest examples/test_minimax_m25_tp8_ep.py [--gpu-host root@gpu-box-7]
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuready import (
    BenchmarkServing,
    HostSnapshot,
    ModelSpec,
    ServerFactory,
    VLLMServer,
    check_fp8_block_alignment,
    check_tp_divisibility,
    checked,
    load_deploy_config,
    model_spec_from_config,
)

HERE = Path(__file__).parent
DEPLOYMENT = load_deploy_config(HERE / "deploy.yaml").get("MiniMax-M2.5-tp8-ep")


@pytest.mark.model("models/MiniMax-M2.5")
@pytest.mark.fp8_block_alignment(tp=8, ep=True, vllm_version="0.17.0")
def test_tp8_with_expert_parallelism_loads(model_spec: ModelSpec) -> None:
    """The marker is the gate; the body documents why EP is enough: each GPU holds whole experts."""
    assert model_spec.num_experts == 256
    assert model_spec.num_experts % 8 == 0  # 32 whole experts per GPU


@pytest.mark.model("models/MiniMax-M2.5")
@pytest.mark.fp8_block_alignment(tp=4, vllm_version="0.17.0")
def test_tp4_without_expert_parallelism_loads(model_spec: ModelSpec) -> None:
    assert model_spec.moe_intermediate_size == 1536  # 1536 / 4 = 384 = three 128-wide blocks


def test_tp8_without_expert_parallelism_is_refused_on_vllm_017() -> None:
    """The known failure, asserted: the check says what vLLM would say, and what would work."""
    spec = model_spec_from_config(json.loads((HERE / "models/MiniMax-M2.5/config.json").read_text()))
    verdict = check_fp8_block_alignment(spec, tp=8, ep=False, vllm_version="0.17.0")
    assert not verdict.ok
    assert "192 is not divisible by weight quantization block_n = 128" in verdict.message
    assert "--enable-expert-parallel" in verdict.message
    assert check_tp_divisibility(spec, tp=8).ok  # heads 48/8 and KV heads 8/8 split fine: only FP8 stops it


@pytest.fixture
def minimax_tp8_ep(gpu_snapshot: HostSnapshot, vllm_server: ServerFactory) -> VLLMServer:
    gpus = checked(gpu_snapshot.require_gpus)  # skips with the reason when there is no GPU
    if len(gpus) < 8:
        pytest.skip(f"{gpu_snapshot.host} has {len(gpus)} GPUs; this deployment needs 8")
    return vllm_server(DEPLOYMENT)


@pytest.mark.gpus_clean(gpus=[0, 1, 2, 3, 4, 5, 6, 7])
@pytest.mark.shm_clean
def test_serves_with_expert_parallelism(minimax_tp8_ep: VLLMServer, benchmark_serving: BenchmarkServing) -> None:
    bench = benchmark_serving(minimax_tp8_ep, concurrency=[1, 64], prompt_tokens=1024, output_tokens=256,
                              requests=64)
    bench.expect_output_throughput(1, min_tok_s=60)
