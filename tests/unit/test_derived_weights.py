"""Checkpoint bytes derived from config.json alone, against the real checkpoints' sizes.

Known sizes and their sources are in tests/data/configs/SOURCES.md ("Checkpoint sizes"). The
target is 2%; the assertions hold each model to what it reaches, so a regression shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuready.model.derived_weights import architecture_tensors, derive_weights
from pytest_gpuready.model.spec import ModelSpec, model_spec_from_config
from tests.checkpoints import minimax_m2_tensors

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def spec(name: str) -> ModelSpec:
    return model_spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)


# (config, what is known, known value, source key in SOURCES.md)
KNOWN = [
    ("meta-llama__Llama-3.1-8B", "bytes", 16_060_522_496, "index metadata.total_size"),
    ("deepseek-ai__DeepSeek-V3", "parameters", 685e9, "README: 685B on Hugging Face incl. 14B MTP"),
    ("MiniMaxAI__MiniMax-M2.5", "parameters", 228.7e9, "model page: 228.7B parameters"),
]


@pytest.mark.parametrize(("name", "kind", "known", "source"), KNOWN, ids=[k[0] for k in KNOWN])
def test_derived_size_within_two_percent_of_the_real_checkpoint(name: str, kind: str, known: float,
                                                                 source: str) -> None:
    derived = derive_weights(spec(name))
    value = derived.total_bytes if kind == "bytes" else derived.parameter_count
    error = abs(value - known) / known
    assert error < 0.02, f"{name}: derived {value:,} {kind} vs {known:,.0f} ({source}): {error:.2%}"


def test_llama_bytes_are_exact() -> None:
    assert derive_weights(spec("meta-llama__Llama-3.1-8B")).total_bytes == 16_060_522_496


def test_deepseek_mtp_layer_is_unused_and_main_model_is_671b() -> None:
    model = spec("deepseek-ai__DeepSeek-V3")
    main = sum(t.numel for t in architecture_tensors(model) if not t.unused)
    mtp = sum(t.numel for t in architecture_tensors(model) if t.unused)
    assert abs(main - 671e9) / 671e9 < 0.01
    assert abs(mtp - 14e9) / 14e9 < 0.05
    assert derive_weights(model).unused_bytes > 13e9


def test_minimax_derived_equals_the_header_sizes_of_its_tensor_list() -> None:
    """The same architecture written out as FP8 tensors with per-block F32 scales (as the real
    checkpoint stores them) sums to what the derivation says, byte for byte."""
    headers = sum(t.nbytes for t in minimax_m2_tensors())
    assert derive_weights(spec("MiniMaxAI__MiniMax-M2.5")).total_bytes == headers


def test_nvfp4_weights_are_half_a_byte_plus_group_scales() -> None:
    derived = derive_weights(spec("nvidia__Kimi-K2.5-NVFP4"))
    assert derived.bytes_per_weight.startswith("nvfp4")
    # ~1.03T parameters at 0.5625 bytes for the experts, bf16 attention (excluded) and embeddings
    assert 0.5 < derived.total_bytes / derived.parameter_count < 0.65


def test_mxfp4_experts_are_half_a_byte_and_the_unconverted_modules_stay_16_bit() -> None:
    """gpt-oss-20b: MXFP4 experts (4 bits + an e8m0 scale per 32), and ``modules_to_not_convert``
    globs such as ``model.layers.*.self_attn`` keep attention in bf16."""
    model = spec("openai__gpt-oss-20b")
    assert "model.layers.*.self_attn" in (model.quantization.excluded_modules if model.quantization else ())
    derived = derive_weights(model)
    assert derived.bytes_per_weight == "mxfp4: 1/2 byte + an e8m0 scale per 32 weights"
    experts = 24 * 32 * (2 * 2880 * 2880 + 2880 * 2880)
    assert derived.routed_expert_bytes == experts // 2 + experts // 32
    attention = 24 * 2 * (2880 * 4096 + 2 * 2880 * 512 + 4096 * 2880)  # q, k, v, o in bf16
    embeddings = 2 * 2 * 201088 * 2880
    expected = derived.routed_expert_bytes + attention + embeddings
    assert abs(derived.total_bytes - expected) < 0.01 * derived.total_bytes
