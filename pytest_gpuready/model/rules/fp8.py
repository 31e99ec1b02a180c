"""The FP8 block rule as a layout rule: :func:`pytest_gpuready.model.checks.check_fp8_block_alignment`
with the layout's TP, DP and EP and the GPU's capability (re-gridded MoE blocks need it)."""

from __future__ import annotations

from pytest_gpuready.model.checks import check_fp8_block_alignment
from pytest_gpuready.model.rules.common import BUILD, Capability, coerce_capability, staged
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict


def check_fp8_blocks(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                     vllm_version: VllmVersion | str | None = None) -> Verdict:
    """Every TP shard holds whole FP8 blocks (or, for experts on vLLM >= 0.29, a re-grid that loads here)."""
    verdict = check_fp8_block_alignment(model, layout.tp, layout.ep, vllm_version,
                                        compute_capability=coerce_capability(capability), dp=layout.dp)
    first = verdict.evidence.get("first_layer", 0)
    failing = [p for p in verdict.evidence.get("partitions", []) if p.get("error")]
    step = 0
    if failing:
        earliest = min(failing, key=lambda p: p["first_layer"])
        step = 3 if earliest["module"].startswith("mlp.experts") else (
            2 if earliest["module"].startswith("mlp") else 0)
    return staged(verdict, BUILD, int(first), step)
