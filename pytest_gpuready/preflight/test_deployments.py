"""Deployment preflight: will each deployment of ``--gpuready-config`` load, and fit?

One test per check per deployment, with ids like ``test_fp8_block_alignment[MiniMax-M2.5-tp8]``.
Each static test reads one verdict of the same :func:`~pytest_gpuready.model.rules.check_deployment`
call the ``deployment`` marker and the planner make (TP divisibility, FP8 block alignment,
max_model_len, MLA backend need only the model's config); memory fit is the memory rule, which
needs a GPU snapshot; file completeness needs the weights.
Without a deploy file every test skips, saying what to pass.
"""

from __future__ import annotations

import pytest

from pytest_gpuready.model.checks import GIB
from pytest_gpuready.model.deploy_config import Deployment
from pytest_gpuready.model.spec import ModelSpec, derived_weights_for
from pytest_gpuready.plugin.model_fixtures import (
    NO_DEPLOY_FILE,
    deploy_config_of,
    deployment_check,
    deployment_memory_verdict,
)
from pytest_gpuready.plugin.outcomes import could_not_measure, expect
from pytest_gpuready.verdict import Verdict

pytestmark = pytest.mark.gpuready


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per deployment in the deploy file (one skipping test when there is none)."""
    if "deployment" in metafunc.fixturenames:
        config = deploy_config_of(metafunc.config)
        names = list(config.names) if config is not None else [NO_DEPLOY_FILE]
        metafunc.parametrize("deployment", names, indirect=True, ids=names)


def test_tp_divisibility(deployment: Deployment, model_spec: ModelSpec, request: pytest.FixtureRequest) -> None:
    """Attention heads, KV heads, vocab and MLP widths divide by the TP size (expert widths by
    TP x DP without EP)."""
    expect(deployment_check(request, model_spec, deployment).verdicts["tensor_parallel"], request.node,
           "tp_divisibility")


def test_fp8_block_alignment(deployment: Deployment, model_spec: ModelSpec,
                             request: pytest.FixtureRequest) -> None:
    """Every TP shard of an FP8 block-quantized checkpoint holds whole weight blocks."""
    expect(deployment_check(request, model_spec, deployment).verdicts["fp8_block_alignment"], request.node,
           "fp8_block_alignment")


def test_max_model_len(deployment: Deployment, model_spec: ModelSpec, request: pytest.FixtureRequest) -> None:
    """``serve.max_model_len`` is within the config's max_position_embeddings (no hardware needed)."""
    expect(deployment_check(request, model_spec, deployment).verdicts["max_model_len"], request.node,
           "max_model_len")


def test_vllm_load_rules(deployment: Deployment, model_spec: ModelSpec, request: pytest.FixtureRequest) -> None:
    """Every vLLM load-time rule for the deployment's serve arguments, reported as vLLM would fail
    first (world size, max_model_len, TP order, EP, quantization minimum, FP8 blocks, attention
    backend, Marlin tiles): what the ``deployment`` marker enforces."""
    expect(deployment_check(request, model_spec, deployment).verdict(), request.node, "vllm_load_rules")


def test_mla_kv_backend(deployment: Deployment, model_spec: ModelSpec, request: pytest.FixtureRequest) -> None:
    """vLLM has an MLA attention backend for this GPU architecture and KV-cache dtype."""
    expect(deployment_check(request, model_spec, deployment).verdicts["attention_backend"], request.node,
           "mla_kv_backend")


def test_memory_fit(deployment: Deployment, model_spec: ModelSpec, request: pytest.FixtureRequest) -> None:
    """Weights plus one max_model_len request's KV cache fit in gpu_memory_utilization of each GPU."""
    expect(deployment_memory_verdict(request, model_spec, deployment), request.node, "memory_fit")


def test_model_files_complete(deployment: Deployment, model_spec: ModelSpec,
                              request: pytest.FixtureRequest) -> None:
    """Every shard the index names exists, its header parses, and its size matches the header."""
    weights = model_spec.weights
    if weights is None or not weights.from_headers:
        pytest.skip(f"{deployment.model}: config only, no safetensors weights to check")
    summary = (f"{model_spec.name}: {weights.shard_count} shards, {weights.total_bytes / GIB:.1f} GiB, "
               f"{weights.tensor_count:,} tensors")
    if weights.problems:
        verdict = Verdict.failed(f"{summary}: {len(weights.problems)} problem(s) with the files, "
                                 f"first: {weights.problems[0]}",
                                 details=weights.problems[:20] + (
                                     (f"... and {len(weights.problems) - 20} more",)
                                     if len(weights.problems) > 20 else ()),
                                 evidence={"problems": list(weights.problems)})
    else:
        verdict = Verdict.passed(f"{summary}: complete", evidence={"bytes_by_dtype": dict(weights.bytes_by_dtype)})
    expect(verdict, request.node, "model_files")


def test_weights_footprint_expectation(deployment: Deployment, model_spec: ModelSpec,
                                       request: pytest.FixtureRequest) -> None:
    """The checkpoint's share per GPU lies within the deployment's expected footprint bounds."""
    low, high = deployment.expect.weights_per_gpu_gib_min, deployment.expect.weights_per_gpu_gib_max
    if low is None and high is None:
        pytest.skip(f"{deployment.name}: no expect.weights_per_gpu_gib bounds in the deploy file")
    weights = model_spec.weights or derived_weights_for(model_spec)
    if not weights.sized:
        could_not_measure(f"{model_spec.name}: cannot size the weights, {weights.unreadable_shards} of "
                          f"{weights.shard_count} shard(s) unreadable (test_model_files_complete names them)")
    per_gpu = weights.per_gpu_bytes(deployment.tp) / GIB
    bounds = f"[{low if low is not None else '-'}, {high if high is not None else '-'}] GiB"
    inside = (low is None or per_gpu >= low) and (high is None or per_gpu <= high)
    verdict = Verdict(inside, f"{model_spec.name} at TP={deployment.tp}: {per_gpu:.1f} GiB of weights "
                              f"per GPU ({weights.provenance()}), expected {bounds}",
                      evidence={"weights_per_gpu_gib": per_gpu, "weights_read_from": weights.read_from})
    expect(verdict, request.node, "weights_footprint")
