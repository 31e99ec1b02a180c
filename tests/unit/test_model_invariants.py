"""The model checks on public configs and a sparse MiniMax-M2.5 checkpoint; every message checked."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready import (
    GpuInfo,
    GpuProcess,
    HostSnapshot,
    ModelSpec,
    NoGpuError,
    check_fp8_block_alignment,
    check_memory_fit,
    check_mla_kv_backend,
    check_tp_divisibility,
    inspect_model,
    kv_cache_bytes_per_token,
    model_spec_from_config,
)
from pytest_gpuready.host.gpus import parse_query_gpu
from pytest_gpuready.model.checks import effective_kv_cache_dtype, quantized_layers
from pytest_gpuready.model.spec import Quantization
from tests.checkpoints import minimax_m2_tensors, write_checkpoint
from tests.conftest import captured

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
OLD = "vLLM <= 0.28 rules (vLLM 0.17.0)"
UNKNOWN_FP8 = ("vLLM >= 0.29 rules: vLLM version unknown, newest rules assumed (pass --vllm-version or set "
               "vllm_version in the deploy file)")


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def model(name: str, short: str) -> ModelSpec:
    return model_spec_from_config(config(name), name=short)


MINIMAX = model("MiniMaxAI__MiniMax-M2.5", "MiniMax-M2.5")
DEEPSEEK = model("deepseek-ai__DeepSeek-V3", "DeepSeek-V3")
KIMI = model("nvidia__Kimi-K2.5-NVFP4", "Kimi-K2.5-NVFP4")
LLAMA = model("meta-llama__Llama-3.1-8B", "Llama-3.1-8B")


# ---------------------------------------------------------------- FP8 block alignment

def test_minimax_tp4_aligns() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 4, vllm_version="0.17.0")
    assert verdict.ok
    assert verdict.summary == "MiniMax-M2.5 FP8 blocks [128, 128] align at TP=4"
    assert verdict.rule_set == OLD
    assert ("mlp.experts (routed experts, intermediate_size=1536), layers 0-61: 1536 / 4 = 384 per GPU, "
            "block [128, 128]: aligned") in verdict.details


def test_minimax_tp8_fails_on_vllm_017_like_vllm() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 8, vllm_version="0.17.0")
    assert not verdict.ok
    assert verdict.summary == (
        "MiniMax-M2.5 does not load at TP=8: The output_size of gate's and up's weight = 192 is not "
        "divisible by weight quantization block_n = 128.")
    assert verdict.details == (
        "layer: mlp.experts (routed experts, intermediate_size=1536), layers 0-61: 1536 / 8 = 192 per GPU, "
        "block [128, 128]: The output_size of gate's and up's weight = 192 is not divisible by weight "
        "quantization block_n = 128.",
        "what would work: loads at TP=4, or TP=8 with --enable-expert-parallel, or TP=8 on vLLM >= 0.29 "
        "(re-grids the MoE block scales)",
    )
    assert verdict.rule_set == OLD
    assert verdict.evidence["alternatives"] == [
        "TP=4", "TP=8 with --enable-expert-parallel", "TP=8 on vLLM >= 0.29 (re-grids the MoE block scales)"]
    assert verdict.message.endswith(f"\n  (rules: {OLD})")


def test_minimax_tp8_with_expert_parallelism_aligns() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 8, ep=True, vllm_version="0.17.0")
    assert verdict.ok
    assert verdict.summary == "MiniMax-M2.5 FP8 blocks [128, 128] align at TP=8 with --enable-expert-parallel"
    assert ("mlp.experts (routed experts, intermediate_size=1536, whole on each of 8 EP ranks), layers 0-61: "
            "1536 / 1 = 1536 per GPU, block [128, 128]: aligned") in verdict.details


REGRID = ("FP8 MoE block scales refined from [128, 128] to [64, 64] to fit the TP-sharded intermediate "
          "size 192.")


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0", "0.29.0rc1", None])
def test_minimax_tp8_refined_on_vllm_029_and_later_loads_on_native_fp8(version: str | None) -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 8, vllm_version=version, compute_capability="sm120")
    assert verdict.ok
    assert verdict.summary == "MiniMax-M2.5 FP8 blocks [128, 128] align at TP=8 on SM120"
    assert verdict.warnings == (
        f"MiniMax-M2.5 at TP=8: {REGRID} (vLLM >= 0.29 re-grids the scales at load; SM120 runs them on "
        "the Triton MoE kernel)",)
    assert verdict.rule_set == (UNKNOWN_FP8 if version is None else f"vLLM >= 0.29 rules (vLLM {version})")


def test_refined_blocks_do_not_load_below_sm89() -> None:
    # vLLM 0.32 on an emulated SM80 raises exactly this (tests/vllm/test_rules_match_vllm.py)
    verdict = check_fp8_block_alignment(MINIMAX, 8, vllm_version="0.32.0", compute_capability=(8, 6))
    assert not verdict.ok
    assert verdict.needs is None
    assert verdict.summary == (
        f"MiniMax-M2.5 does not load at TP=8: No FP8 MoE backend supports the deployment configuration. "
        f"({REGRID} Only the Triton MoE kernel takes a re-gridded block, and it needs native FP8 (SM89+); "
        "below SM89 vLLM runs FP8 MoE on Marlin, which takes only 128x128 blocks; this GPU is SM86)")
    assert verdict.details[-1] == (
        "what would work: loads at TP=4, or TP=8 with --enable-expert-parallel, or TP=8 on an SM89+ GPU "
        "(Triton MoE takes the re-gridded blocks)")


def test_refined_blocks_without_a_capability_promise_nothing() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 8, vllm_version="0.32.0")
    assert not verdict.ok
    assert verdict.needs == "the GPU's compute capability (pass --gpu-arch SM, or --gpu-host HOST)"
    assert verdict.summary == (
        f"MiniMax-M2.5 at TP=8: loads only on SM89+ GPUs: {REGRID} Only the Triton MoE kernel takes a "
        "re-gridded block, and it needs native FP8 (SM89+); below SM89 vLLM runs FP8 MoE on Marlin, which "
        "takes only 128x128 blocks.")


def test_aligned_blocks_load_on_marlin_below_sm89() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 4, vllm_version="0.32.0", compute_capability=(8, 0))
    assert verdict.ok
    assert verdict.summary == "MiniMax-M2.5 FP8 blocks [128, 128] align at TP=4 on SM80"


def test_old_vllm_below_sm89_suggests_both_the_version_and_the_gpu() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 8, vllm_version="0.17.0", compute_capability=(8, 0))
    assert not verdict.ok
    assert verdict.details[-1] == (
        "what would work: loads at TP=4, or TP=8 with --enable-expert-parallel, or TP=8 on vLLM >= 0.29 on "
        "an SM89+ GPU (re-grids the MoE block scales)")


def test_refinement_needs_a_block_of_at_least_32() -> None:
    # expert width 1040: 1040 / 8 = 130, gcd(128, 128, 130, 3072) = 2
    narrow = replace(MINIMAX, moe_intermediate_size=1040)
    verdict = check_fp8_block_alignment(narrow, 8, vllm_version="0.33.0")
    assert not verdict.ok
    assert verdict.summary == (
        "MiniMax-M2.5 does not load at TP=8: The output_size of gate's and up's weight = 130 is not divisible "
        "by weight quantization block_n = 128. (the vLLM >= 0.29 re-gridding needs gcd(128, 128, 130, 3072) "
        "= 2 >= 32)")


def test_compressed_tensors_moe_is_not_refined() -> None:
    quant = Quantization("compressed-tensors", "config.json quantization_config", algo="float8",
                         weight_block_size=(128, 128))
    verdict = check_fp8_block_alignment(replace(MINIMAX, quantization=quant), 8, vllm_version="0.33.0")
    assert not verdict.ok
    assert "The output_size of gate's and up's weight = 192" in verdict.summary


def test_deepseek_v3_tp32_dense_layers_fail_576() -> None:
    verdict = check_fp8_block_alignment(DEEPSEEK, 32, vllm_version="0.17.0")
    assert not verdict.ok
    assert verdict.summary == ("DeepSeek-V3 does not load at TP=32: Weight input_size_per_partition = 576 is "
                               "not divisible by weight quantization block_k = 128.")
    assert verdict.details[0] == (
        "layer: mlp.down_proj, layers 0-2: 18432 / 32 = 576 per GPU, block [128, 128]: Weight "
        "input_size_per_partition = 576 is not divisible by weight quantization block_k = 128.")
    assert verdict.details[1].startswith("layer: mlp.shared_experts.down_proj, layers 3-60: 2048 / 32 = 64")
    assert verdict.details[-1] == "what would work: loads at TP=16"


def test_deepseek_v3_tp32_with_ep_still_fails_on_dense_and_shared_experts() -> None:
    verdict = check_fp8_block_alignment(DEEPSEEK, 32, ep=True, vllm_version="0.17.0")
    assert not verdict.ok
    assert verdict.summary.startswith("DeepSeek-V3 does not load at TP=32 with --enable-expert-parallel: "
                                      "Weight input_size_per_partition = 576")
    assert verdict.details[-1] == "what would work: loads at TP=16 with --enable-expert-parallel"


def test_deepseek_v3_tp8_checks_mla_projections() -> None:
    verdict = check_fp8_block_alignment(DEEPSEEK, 8, vllm_version="0.17.0")
    assert verdict.ok
    assert verdict.details[:3] == (
        "self_attn.q_b_proj, layers 0-60: 24576 / 8 = 3072 per GPU, block [128, 128]: aligned",
        "self_attn.kv_b_proj, layers 0-60: 32768 / 8 = 4096 per GPU, block [128, 128]: aligned",
        "self_attn.o_proj, layers 0-60: 16384 / 8 = 2048 per GPU, block [128, 128]: aligned",
    )


def test_merged_layers_may_mismatch_from_vllm_015() -> None:
    # Llama-3.1-8B made FP8-block: gate_up 14336 / 8 = 1792 = 14 blocks, fine; at TP=64 it would not
    # divide heads anyway. Use an odd dense width: 3 * 1000 / 2 = 1500 per GPU.
    odd = replace(LLAMA, intermediate_size=3000,
                  quantization=Quantization("fp8", "test", weight_block_size=(128, 128), activation_scheme="dynamic"))
    new = check_fp8_block_alignment(odd, 2, vllm_version="0.17.0")
    gate_up = next(p for p in new.evidence["partitions"] if p["module"] == "mlp.gate_up_proj")
    assert gate_up["note"] == "merged layer, allowed to mismatch the block (vLLM >= 0.15)"
    assert gate_up["error"] is None
    assert not new.ok
    assert "Weight input_size_per_partition = 1500" in new.summary
    assert new.details[-1] == "what would work: loads at TP=1"
    old = check_fp8_block_alignment(odd, 2, vllm_version="0.13.0")
    assert old.rule_set == ("vLLM <= 0.28 rules (vLLM 0.13.0); merged layers checked too (no block-mismatch "
                            "allowance before vLLM 0.15)")
    assert any("Weight output_partition_size = 1500 is not divisible by weight quantization block_n = 128."
               in line for line in old.details)


def test_excluded_modules_are_not_checked() -> None:
    quant = Quantization("fp8", "test", weight_block_size=(128, 128), activation_scheme="dynamic",
                         excluded_modules=("re:.*mlp\\.down_proj$",))
    dense = replace(DEEPSEEK, quantization=quant)
    verdict = check_fp8_block_alignment(dense, 32, ep=True, vllm_version="0.17.0")
    assert not any(line.startswith("layer: mlp.down_proj") for line in verdict.details)
    assert quantized_layers(dense, "mlp.down_proj", range(3)) == []
    glob = replace(quant, excluded_modules=("language_model.model.layers.0.self_attn*", "lm_head"))
    kimi_like = replace(DEEPSEEK, quantization=glob)
    assert quantized_layers(kimi_like, "self_attn.o_proj", range(3)) == [1, 2]


def test_static_activation_scheme_fails_like_vllm() -> None:
    assert MINIMAX.quantization is not None
    static = replace(MINIMAX, quantization=replace(MINIMAX.quantization, activation_scheme="static"))
    verdict = check_fp8_block_alignment(static, 4)
    assert verdict.summary == ("MiniMax-M2.5 does not load: The block-wise quantization only supports dynamic "
                               "activation scheme for now, but got static activation scheme.")


def test_ep_on_a_dense_model_fails_like_vllm() -> None:
    fp8_llama = replace(LLAMA, quantization=Quantization("fp8", "t", weight_block_size=(128, 128)))
    verdict = check_fp8_block_alignment(fp8_llama, 8, ep=True)
    assert verdict.summary == ("Llama-3.1-8B does not load with --enable-expert-parallel: Number of experts in "
                               "the model must be greater than 0 when expert parallelism is enabled.")


@pytest.mark.parametrize(("spec", "summary"), [
    (LLAMA, "FP8 block alignment does not apply: Llama-3.1-8B is not quantized, not FP8 block-quantized"),
    (KIMI, "FP8 block alignment does not apply: Kimi-K2.5-NVFP4 is modelopt NVFP4, not FP8 block-quantized"),
])
def test_fp8_check_does_not_apply(spec: ModelSpec, summary: str) -> None:
    verdict = check_fp8_block_alignment(spec, 8)
    assert verdict.ok
    assert verdict.summary == summary
    assert verdict.evidence["applies"] is False


def test_no_alternative_found() -> None:
    # expert width 96: even TP=1 needs 96 % 128 == 0 for gate/up
    tiny = replace(MINIMAX, moe_intermediate_size=96)
    verdict = check_fp8_block_alignment(tiny, 2, vllm_version="0.17.0")
    assert verdict.details[-1] == "what would work: no TP size up to this one loads this checkpoint on these rules"


# ---------------------------------------------------------------- TP divisibility

def test_heads_not_divisible_like_vllm() -> None:
    verdict = check_tp_divisibility(MINIMAX, 5)
    assert verdict.summary == ("MiniMax-M2.5 cannot be split at TP=5: Total number of attention heads (48) must "
                               "be divisible by tensor parallel size (5).")
    assert "8 is not divisible by 5: the 8 KV heads cannot be split over TP=5 (QKVParallelLinear)" in verdict.details
    assert ("200064 is not divisible by 5: vocab_size 200064 (padded to a multiple of 64) cannot be split over "
            "TP=5") in verdict.details
    assert "1536 is not divisible by 5: expert FFN intermediate_size 1536 cannot be split over TP=5" in verdict.details


def test_tp_larger_than_kv_heads_replicates_with_a_warning() -> None:
    verdict = check_tp_divisibility(MINIMAX, 16)
    assert verdict.ok
    assert "KV heads: 8 over TP 16: one KV head per GPU, each replicated on 2 GPUs" in verdict.details
    assert verdict.warnings == ("TP=16 is larger than the 8 KV heads: each KV head is replicated on 2 GPUs, so "
                                "the KV cache per GPU stops shrinking past TP=8",)


def test_tp_larger_than_kv_heads_must_be_a_multiple() -> None:
    verdict = check_tp_divisibility(replace(LLAMA, num_attention_heads=48, num_kv_heads=8), 12)
    assert not verdict.ok
    assert verdict.summary == ("Llama-3.1-8B cannot be split at TP=12: 12 is not divisible by 8: TP=12 is larger "
                               "than the 8 KV heads, so it must be a multiple of them to replicate each one "
                               "(QKVParallelLinear)")


def test_odd_tp_hits_the_padded_vocab() -> None:
    odd = replace(LLAMA, num_attention_heads=6, num_kv_heads=6, head_dim=128, intermediate_size=3 * 4096,
                  vocab_size=128000)
    verdict = check_tp_divisibility(odd, 3)
    assert not verdict.ok
    assert verdict.summary == ("Llama-3.1-8B cannot be split at TP=3: 128000 is not divisible by 3: vocab_size "
                               "128000 (padded to a multiple of 64) cannot be split over TP=3")


def test_more_tp_than_experts() -> None:
    few = replace(MINIMAX, num_experts=4, num_attention_heads=8)
    verdict = check_tp_divisibility(few, 8)
    assert verdict.summary == ("MiniMax-M2.5 cannot be split at TP=8: Tensor parallel size 8 is greater than the "
                               "number of experts 4.")
    assert "KV heads: 8 / TP 8 = 1 per GPU" in verdict.details


def test_ep_without_experts() -> None:
    verdict = check_tp_divisibility(LLAMA, 8, ep=True)
    assert verdict.summary == ("Llama-3.1-8B cannot be split at TP=8: Number of experts in the model must be "
                               "greater than 0 when expert parallelism is enabled.")


def test_mla_kv_heads_are_not_split() -> None:
    verdict = check_tp_divisibility(DEEPSEEK, 32)
    assert verdict.ok
    assert "KV heads: MLA stores one latent KV head, replicated on every GPU" in verdict.details


def test_tp_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tp must be >= 1, got 0"):
        check_tp_divisibility(LLAMA, 0)


# ---------------------------------------------------------------- MLA backend

def test_kimi_nvfp4_on_sm120_fails_before_vllm_018() -> None:
    verdict = check_mla_kv_backend(KIMI, "sm120", "auto", "0.17.0")
    assert not verdict.ok
    assert verdict.summary == (
        "Kimi-K2.5-NVFP4 on SM120 with KV cache fp8_e4m3: No valid attention backend found for cuda with "
        "AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype=fp8_e4m3, block_size=None, "
        "use_mla=True, has_sink=False, use_sparse=False, ...). Reasons: {FLASH_ATTN_MLA: [kv_cache_dtype not "
        "supported, compute capability not supported, FlashAttention MLA not supported on this device], "
        "FLASHMLA: [compute capability not supported, FlashMLA "
        "Dense is only supported on Hopper devices.], FLASHINFER_MLA: [compute capability not supported], "
        "TRITON_MLA: [kv_cache_dtype not supported], FLASHMLA_SPARSE: [kv_cache_dtype not supported, "
        "non-sparse not supported, compute capability not supported]}.")
    assert verdict.details == (
        "KV-cache dtype: --kv-cache-dtype auto resolves to fp8_e4m3 from config.json "
        "quantization_config.kv_cache_scheme (ModelOpt)",
        "what would work: --kv-cache-dtype bfloat16 (TRITON_MLA; twice the KV memory of fp8), or vLLM >= 0.18 "
        "(TRITON_MLA supports fp8_e4m3 there)",
    )
    assert verdict.rule_set == "vLLM <= 0.17 rules (vLLM 0.17.0)"


def test_kimi_nvfp4_on_sm120_with_bf16_kv_passes() -> None:
    verdict = check_mla_kv_backend(KIMI, (12, 0), "bfloat16", "0.17.0")
    assert verdict.ok
    assert verdict.summary == "Kimi-K2.5-NVFP4 on SM120 with KV cache bfloat16: vLLM would use TRITON_MLA"


def test_kimi_nvfp4_on_sm120_passes_from_vllm_018() -> None:
    verdict = check_mla_kv_backend(KIMI, "12.0", "auto", "0.18.0")
    assert verdict.ok
    assert verdict.evidence["backend"] == "TRITON_MLA"
    assert verdict.rule_set == "vLLM >= 0.18 rules (vLLM 0.18.0)"


def test_kimi_nvfp4_on_sm90_uses_flashmla() -> None:
    verdict = check_mla_kv_backend(KIMI, "sm90", "auto", "0.17.0")
    assert verdict.ok
    assert verdict.summary == "Kimi-K2.5-NVFP4 on SM90 with KV cache fp8_e4m3: vLLM would use FLASHMLA"
    assert "passed over: FLASH_ATTN_MLA: kv_cache_dtype not supported" in verdict.details


def test_deepseek_on_sm100_uses_flashinfer() -> None:
    verdict = check_mla_kv_backend(DEEPSEEK, "sm100", "fp8", "0.17.0")
    assert verdict.ok
    assert verdict.evidence["backend"] == "FLASHINFER_MLA"


def test_fp8_kv_on_ampere() -> None:
    # vLLM 0.32 on an emulated SM80 raises exactly this (tests/vllm/test_rules_match_vllm.py)
    verdict = check_mla_kv_backend(DEEPSEEK, (8, 0), "fp8")
    assert verdict.summary == ("DeepSeek-V3 on SM80: FP8 KV cache is not supported by the Triton MLA backend on "
                               "SM80 (compute capability 8.0); native FP8 (fp8e4nv) requires SM89+. Re-run with "
                               "--kv-cache-dtype bfloat16.")
    assert verdict.details[-1] == "what would work: --kv-cache-dtype bfloat16"
    older = check_mla_kv_backend(DEEPSEEK, (8, 0), "fp8", "0.22.0")
    assert older.summary.startswith("DeepSeek-V3 on SM80: an FP8 KV cache (fp8) needs compute capability >= 8.9")


def test_triton_mla_fp8_before_013_raises_at_init() -> None:
    verdict = check_mla_kv_backend(KIMI, "sm120", "auto", "0.11.0")
    assert not verdict.ok
    assert verdict.summary == ("Kimi-K2.5-NVFP4 on SM120 with KV cache fp8_e4m3: vLLM 0.11.0 picks TRITON_MLA, "
                               "whose init raises NotImplementedError: TritonMLA V1 with FP8 KV cache not yet "
                               "supported")


def test_unknown_version_uses_newest_rules_and_says_so() -> None:
    verdict = check_mla_kv_backend(KIMI, "sm120")
    assert verdict.ok
    assert verdict.rule_set == ("vLLM >= 0.18 rules: vLLM version unknown, newest rules assumed (pass "
                                "--vllm-version or set vllm_version in the deploy file)")


def test_mla_check_does_not_apply_to_llama() -> None:
    verdict = check_mla_kv_backend(LLAMA, None)
    assert verdict.ok
    assert verdict.summary == "MLA backend check does not apply: Llama-3.1-8B uses llama attention, not MLA"


def test_mla_check_needs_an_architecture_for_mla_models() -> None:
    with pytest.raises(ValueError, match=r"Kimi-K2\.5-NVFP4 uses MLA: the MLA backend check needs the GPU's"):
        check_mla_kv_backend(KIMI, None)


def test_effective_kv_dtype() -> None:
    assert effective_kv_cache_dtype(KIMI).name == "fp8_e4m3"
    assert effective_kv_cache_dtype(KIMI, "bfloat16").reason == "--kv-cache-dtype bfloat16"
    assert effective_kv_cache_dtype(LLAMA).reason == "--kv-cache-dtype auto: the model dtype (bfloat16)"
    compressed = replace(LLAMA, quantization=Quantization(
        "compressed-tensors", "config.json quantization_config", kv_cache_dtype="fp8",
        kv_cache_source="config.json quantization_config.kv_cache_scheme (compressed-tensors)"))
    forced = effective_kv_cache_dtype(compressed, "bfloat16", "0.17.0")
    assert forced.name == "fp8"
    assert forced.reason == ("forced by config.json quantization_config.kv_cache_scheme (compressed-tensors) on "
                             "vLLM 0.17.0 (--kv-cache-dtype bfloat16 is ignored before 0.33)")
    assert effective_kv_cache_dtype(compressed, "bfloat16", "0.33.0").name == "bfloat16"


# ---------------------------------------------------------------- KV bytes per token (reference §3.1)

@pytest.mark.parametrize(("spec", "tp", "dtype", "expected"), [
    (DEEPSEEK, 1, "auto", 70_272), (DEEPSEEK, 8, "auto", 70_272), (DEEPSEEK, 8, "fp8", 35_136),
    (KIMI, 8, "auto", 35_136), (KIMI, 8, "bfloat16", 70_272),
    (MINIMAX, 1, "auto", 253_952), (MINIMAX, 4, "auto", 63_488), (MINIMAX, 8, "auto", 31_744),
    (MINIMAX, 8, "fp8", 15_872), (MINIMAX, 16, "auto", 31_744),
    (LLAMA, 1, "auto", 131_072), (LLAMA, 8, "auto", 16_384), (LLAMA, 8, "fp8_e4m3", 8_192),
    (DEEPSEEK, 8, "fp8_ds_mla", 61 * 656),
])
def test_kv_cache_bytes_per_token(spec: ModelSpec, tp: int, dtype: str, expected: int) -> None:
    assert kv_cache_bytes_per_token(spec, tp, dtype) == expected


def test_kv_bytes_for_an_unmodelled_dtype() -> None:
    from pytest_gpuready.model.checks import kv_dtype_bytes

    with pytest.raises(ValueError, match=r"KV-cache dtype 'int4': its size per element is not modelled"):
        kv_dtype_bytes(LLAMA, "int4")
    # nvfp4 is sized on GQA attention (head_dim // 2 + head_dim // 16 per head), not on an MLA latent
    assert kv_cache_bytes_per_token(LLAMA, 1, "nvfp4") == 2 * 32 * 8 * (64 + 8)
    with pytest.raises(ValueError, match=r"the KV page of --kv-cache-dtype nvfp4 on an MLA model \(Kimi-K2.5-NVFP4\)"):
        kv_cache_bytes_per_token(KIMI, 1, "nvfp4")


# ---------------------------------------------------------------- memory fit

@pytest.fixture(scope="module")
def minimax_weights(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    """MiniMax-M2.5 with weights read from a sparse copy of its real tensor layout (230 GB of holes)."""
    directory = tmp_path_factory.mktemp("minimax") / "MiniMax-M2.5"
    write_checkpoint(directory, minimax_m2_tensors(), shards=119, config=config("MiniMaxAI__MiniMax-M2.5"))
    return inspect_model(directory)


def rtx(used: str = "rtxpro6000x8-clean.txt") -> HostSnapshot:
    rows = "".join(f"{line}, 97887 MiB\n" for line in captured(used).splitlines())
    gpus = parse_query_gpu(rows, ("index", "memory.used", "memory.total"))
    return HostSnapshot("gpu-box-7", 0.0, "nvidia-smi", tuple(gpus))


def rtx_loaded() -> HostSnapshot:
    gpus = parse_query_gpu(captured("rtxpro6000x8-minimax-tp4-loaded.txt"),
                           ("index", "memory.used", "memory.total", "power.draw"))
    process = GpuProcess(431, "VLLM::Worker_TP0", 96700, gpus[0].uuid, 0, alive=True)
    return HostSnapshot("gpu-box-7", 0.0, "nvidia-smi", tuple(gpus), processes=(process,))


def h200() -> HostSnapshot:
    return HostSnapshot("h200", 0.0, "nvidia-smi", tuple(parse_query_gpu(captured("h200x1-idle.txt"))))


def test_weights_from_the_sparse_checkpoint(minimax_weights: ModelSpec) -> None:
    weights = minimax_weights.weights
    assert weights is not None
    assert weights.complete
    assert weights.shard_count == 119
    assert weights.tensor_count == 96_103
    assert weights.total_bytes == 230_024_113_152
    assert weights.bytes_by_dtype["F8_E4M3"] > 0.95 * weights.total_bytes


def test_minimax_tp4_fits_on_rtx_pro_6000(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, rtx(), 4, gpus=[0, 1, 2, 3], max_model_len=196608,
                               vllm_version="0.19.0")
    assert verdict.ok, verdict.message
    assert verdict.summary == "MiniMax-M2.5 fits at TP=4: 458,208 KV tokens, 2.33 requests of 196,608 tokens"
    assert verdict.details[0] == ("budget: 86.03 GiB = ceil(95.59 GiB x gpu_memory_utilization) "
                                  "(vllm/v1/worker/utils.py:request_memory)")
    assert verdict.details[1] == "- weights: 53.63 GiB (read; read from the safetensors headers)"
    assert verdict.details[2].startswith("- activation peak: 3.43 GiB (derived; profile run, compiled: "
                                         "max(forward over max_num_batched_tokens=8,192 0.66 GiB, sampler "
                                         "over 1,024 dummy requests x vocab 200,064 3.43 GiB)")
    assert verdict.details[3].startswith("- non-torch: 1.88 GiB (measured; ")
    assert verdict.details[4] == ("KV cache: 27.09 GiB = budget - the terms above; / 63,488 bytes per token "
                                  "= 458,208 tokens")
    assert verdict.details[5].startswith("outside the budget: CUDA graphs: 1.70 GiB (measured; ")
    assert "Maximum concurrency for 196,608 tokens per request: 2.33x" in verdict.details
    assert verdict.evidence["kv_bytes_per_token"] == 63_488
    assert verdict.rule_set == "vLLM <= 0.24 memory accounting (vLLM 0.19.0)"
    assert verdict.warnings == ()


def test_config_only_memory_fit_uses_derived_weights_and_says_so() -> None:
    verdict = check_memory_fit(MINIMAX, rtx(), 4, vllm_version="0.19.0")
    assert verdict.ok
    assert verdict.summary == "MiniMax-M2.5 fits at TP=4: 458,224 KV tokens, 2.33 requests of 196,608 tokens"
    assert verdict.details[1].startswith("- weights: 53.63 GiB (derived; derived from config.json (fp8 block")
    assert verdict.warnings == ("MiniMax-M2.5: weights derived from config.json (fp8 block [128, 128]: 1 byte "
                                "+ a float32 scale per block), not read from weights",)


def test_cuda_graphs_are_counted_where_the_version_counts_them(minimax_weights: ModelSpec) -> None:
    old = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.19.0")
    new = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.25.0")
    eager = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.25.0", enforce_eager=True)
    graphs = 62 * int(0.44 * 1024**3 / 16)
    assert old.evidence["kv_cache_bytes"] - new.evidence["kv_cache_bytes"] == graphs  # MoE: V1 runner in 0.25
    assert eager.evidence["kv_cache_bytes"] == old.evidence["kv_cache_bytes"]


def test_serve_settings_move_the_terms(minimax_weights: ModelSpec) -> None:
    base = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.19.0").evidence
    fewer_seqs = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.19.0", max_num_seqs=256).evidence
    pp = check_memory_fit(minimax_weights, rtx(), 2, vllm_version="0.19.0", pipeline_parallel_size=2).evidence
    assert fewer_seqs["terms"]["activation peak"]["bytes"] == 256 * 200_064 * 18
    assert fewer_seqs["kv_cache_tokens"] > base["kv_cache_tokens"]
    assert pp["gpus"] == [0, 1, 2, 3]
    assert pp["kv_bytes_per_token"] == 2 * 31 * 4 * 128 * 2  # 31 of 62 layers, 8 KV heads / TP 2


def test_max_model_len_above_the_config_fails_as_vllm_does(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, rtx(), 4, max_model_len=250_000)
    assert not verdict.ok
    assert verdict.summary == (
        "MiniMax-M2.5: User-specified max_model_len (250000) is greater than the derived max_model_len "
        "(max_position_embeddings=196608 or model_max_length=None in model's config.json). To allow overriding "
        "this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.")
    allowed = check_memory_fit(minimax_weights, rtx(), 4, max_model_len=250_000, allow_long_max_model_len=True)
    assert allowed.ok
    assert allowed.warnings[0] == ("MiniMax-M2.5: max_model_len 250000 > 196608: positions past the trained "
                                   "length lead to nan with RoPE")


def test_fixed_reserve_replaces_the_profile_terms(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, rtx(), 4, max_model_len=196608, reserve_gib=3.0)
    assert verdict.summary == "MiniMax-M2.5 fits at TP=4: 497,344 KV tokens, 2.53 requests of 196,608 tokens"
    assert verdict.details[2] == "- reserve: 3.00 GiB (given; reserve_gib replaces vLLM's profile-run terms)"


def test_busy_gpus_fail_like_vllms_startup_check(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, rtx_loaded(), 4)
    assert not verdict.ok
    assert verdict.summary == (
        "MiniMax-M2.5 at TP=4: GPU 0: Free memory on device cuda:0 (1.14/95.59 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 86.03 GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes.; held by pid 431 (VLLM::Worker_TP0) 96700 MiB")
    assert verdict.details[0].startswith("GPU 1: Free memory on device cuda:1 (1.14/95.59 GiB)")
    assert check_memory_fit(minimax_weights, rtx_loaded(), 4, gpus=[4, 5, 6, 7]).ok


def test_nothing_left_for_the_kv_cache(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, h200(), 1, vllm_version="0.19.0")
    assert verdict.summary == (
        "MiniMax-M2.5 at TP=1: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine (217.94 GiB of weights and profile-run memory per GPU exceed the "
        "125.82 GiB budget; or use more GPUs).")


def test_one_request_of_max_model_len_must_fit(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, rtx(), 4, max_model_len=1_000_000, vllm_version="0.19.0",
                               allow_long_max_model_len=True)
    assert not verdict.ok
    assert verdict.summary == (
        "MiniMax-M2.5 at TP=4: To serve at least one request with the models's max seq len (1000000), (59.13 GiB "
        "KV cache is needed, which is larger than the available KV cache memory (27.09 GiB). Based on the "
        "available memory, the estimated maximum model length is 458208. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")


def test_thin_headroom_warns(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, rtx(), 4, max_model_len=250_000, vllm_version="0.19.0",
                               allow_long_max_model_len=True)
    assert verdict.ok
    assert verdict.warnings[-1] == "thin headroom: the KV cache holds 1.83 requests of 250,000 tokens"


def test_little_free_memory_above_the_budget_warns(minimax_weights: ModelSpec) -> None:
    busy = tuple(replace(g, memory_used_mib=9000) for g in rtx().require_gpus())
    verdict = check_memory_fit(minimax_weights, replace(rtx(), gpus=busy), 4, max_model_len=196608)
    assert verdict.ok
    assert verdict.warnings[0] == ("GPU 0: only 788 MiB free above the 0.9 budget; a process starting now "
                                   "would break it")


def test_more_tp_than_gpus(minimax_weights: ModelSpec) -> None:
    verdict = check_memory_fit(minimax_weights, h200(), 4)
    assert verdict.summary == "TP=4 needs 4 GPUs; h200 offers 1 (GPUs 0)"


def test_memory_fit_without_gpus_raises_no_gpu() -> None:
    snapshot = HostSnapshot("local", 0.0, "none", None, no_gpu_reason="no NVIDIA GPU on this machine")
    with pytest.raises(NoGpuError):
        check_memory_fit(MINIMAX, snapshot, 1)


def test_gpu_memory_utilization_out_of_range(minimax_weights: ModelSpec) -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_utilization \(--gpu-memory-utilization\): expected a number "
                       r"> 0 and <= 1, got 1.5"):
        check_memory_fit(minimax_weights, rtx(), 4, gpu_memory_utilization=1.5)


def test_h200_reserved_memory_is_not_cuda_total() -> None:
    gpu: GpuInfo = h200().require_gpus()[0]
    assert gpu.memory_reserved_mib == 616
    assert gpu.memory_free_mib == 143771 - 616


def test_fp8_partitions_that_do_not_divide_at_all() -> None:
    verdict = check_fp8_block_alignment(MINIMAX, 5, vllm_version="0.17.0")
    assert not verdict.ok
    assert verdict.summary == "MiniMax-M2.5 does not load at TP=5: 8192 is not divisible by 5"
    assert ("layer: mlp.experts (routed experts, intermediate_size=1536), layers 0-61: 1536 over 5, block "
            "[128, 128]: 1536 is not divisible by the MoE TP size 5") in verdict.details


def test_down_projection_of_experts_checked_against_block_k() -> None:
    assert MINIMAX.quantization is not None
    narrow_n = replace(MINIMAX, quantization=replace(MINIMAX.quantization, weight_block_size=(64, 128)))
    verdict = check_fp8_block_alignment(narrow_n, 8, vllm_version="0.17.0")
    assert verdict.summary == ("MiniMax-M2.5 does not load at TP=8: The input_size of down's weight = 192 is not "
                               "divisible by weight quantization block_k = 128.")


def test_no_mla_backend_anywhere() -> None:
    sparse = replace(DEEPSEEK, index_topk=2048)
    verdict = check_mla_kv_backend(sparse, "sm80", "bfloat16", "0.33.0")
    assert not verdict.ok
    assert verdict.details[-1] == ("what would work: no KV-cache dtype or vLLM version has an MLA backend for "
                                   "this GPU")


def test_a_newer_vllm_would_work() -> None:
    sparse = replace(DEEPSEEK, index_topk=2048)
    verdict = check_mla_kv_backend(sparse, "sm120", "fp8", "0.22.0")
    assert not verdict.ok
    assert verdict.details[-1] == "what would work: a newer vLLM (FLASHINFER_MLA_SPARSE_SM120)"


def test_memory_fit_needs_a_length(minimax_weights: ModelSpec) -> None:
    no_length = replace(minimax_weights, max_position_embeddings=None)
    verdict = check_memory_fit(no_length, rtx(), 4)
    assert verdict.summary == ("MiniMax-M2.5: max_model_len is not given and the config has no "
                               "max_position_embeddings; pass max_model_len")


def test_data_parallel_splits_the_experts_over_tp_x_dp(minimax_weights: ModelSpec) -> None:
    """DP=2 x TP=4: attention split 4 ways, the routed experts 8 ways (FusedMoEParallelConfig.make),
    against the expert bytes of the real tensor layout."""
    tensors = minimax_m2_tensors()
    experts = sum(t.nbytes for t in tensors if ".experts." in t.name)
    tp4 = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.19.0").evidence
    dp2 = check_memory_fit(minimax_weights, rtx(), 4, vllm_version="0.19.0", data_parallel_size=2, ep=True).evidence
    assert dp2["gpus"] == list(range(8))
    saved = tp4["weights_per_gpu_bytes"] - dp2["weights_per_gpu_bytes"]
    assert abs(saved - experts / 8) / (experts / 8) < 0.01
    assert dp2["terms"]["non-torch"]["bytes"] == tp4["terms"]["non-torch"]["bytes"]
    too_many = check_memory_fit(minimax_weights, rtx(), 4, data_parallel_size=4)
    assert not too_many.ok
    assert too_many.summary.startswith("DP=4 TP=4 needs 16 GPUs; gpu-box-7 offers 8")
