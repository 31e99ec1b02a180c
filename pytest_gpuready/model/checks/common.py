"""What the model checks share: sizes, rule-set names, the vLLM version argument, layer ranges."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_gpuready.model.backends import parse_gpu_arch
from pytest_gpuready.model.vllm_version import (
    RuleBoundary,
    VllmVersion,
    coerce_version,
)

GIB = 1024**3
MIB = 1024**2
DEFAULT_RESERVE_GIB = 3.0
"""The 0.1 fixed reserve per GPU; now only used when ``reserve_gib`` is passed explicitly."""
VOCAB_PADDING = 64
"""``DEFAULT_VOCAB_PADDING_SIZE`` (``vllm/model_executor/layers/vocab_parallel_embedding.py``)."""
REFINE_MIN_BLOCK = 32
KV_BLOCK_SIZE = 16
MERGED_MISMATCH_ALLOWED = RuleBoundary(0, 15, "merged QKV/gate_up layers may mismatch the FP8 block")
TP_RULES = "vLLM TP rules (unchanged 0.15-0.33)"
MEMORY_RULES = "vLLM memory budget rules (unchanged 0.11-0.33)"


def _version(vllm_version: VllmVersion | str | None) -> VllmVersion | None:
    return coerce_version(vllm_version)


def _layers_text(layers: Sequence[int]) -> str:
    if not layers:
        return "no layers"
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return f"{len(layers)} layers"


def _capability(value: tuple[int, int] | str) -> tuple[int, int]:
    if isinstance(value, str):
        return parse_gpu_arch(value)
    return (int(value[0]), int(value[1]))
