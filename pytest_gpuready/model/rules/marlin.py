"""FP8 on GPUs without native FP8 (SM < 8.9) runs as Marlin weight-only: Marlin's tile rule.

Below SM89 vLLM converts every FP8 linear layer to Marlin's format after loading
(``prepare_fp8_layer_for_marlin``, and ``prepare_fp8_moe_layer_for_marlin`` for the experts, in
``vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py``). Marlin's repack kernel
(``gptq_marlin_repack``, ``csrc/quantization/gptq_marlin/``) takes the per-GPU shard as
``size_k`` x ``size_n`` and checks ``size_k % 16`` and ``size_n % 64``, in vLLM's words
``size_n = 2736 is not divisible by tile_n_size = 64`` (GLM-4.5-Air-FP8 at TP=8 on RTX 3090:
its dense ``gate_up_proj`` shard is 2 x 10944 / 8 = 2736, zai-org/GLM-4.5#94). That is a
different rule from the FP8 block rule: merged layers are exempt from the block rule but not
from Marlin's tiles, and per-channel FP8 checkpoints have no block rule at all.

vLLM 0.24 pads dense layers to Marlin's tiles (``marlin_padded_nk``: "Marlin GEMM and repack
require (n % 64, k % 128) or (n % 128, k % 64); shapes satisfying neither are zero-padded"),
0.25 pads the experts too (``marlin_moe_padded_intermediate``); from then on the rule only costs
speed ("Marlin requires thread-tile padding for some weight shapes ..."). Read in the wheels of
0.17, 0.22, 0.23 (no padding), 0.24 (dense only), 0.25-0.33 (both).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpuready.model.backends import MIN_FP8_CAPABILITY
from pytest_gpuready.model.checks import quantized_layers
from pytest_gpuready.model.linear_attention import attention_layers, gated_deltanet
from pytest_gpuready.model.rules.common import (
    LOAD,
    NEEDS_CAPABILITY,
    Capability,
    arch_text,
    at,
    coerce_capability,
    staged,
    version_of,
)
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

TILE_K, TILE_N = 16, 64
DENSE_PADDED_SINCE = (0, 24)
MOE_PADDED_SINCE = (0, 25)
MARLIN_MIN_CAPABILITY = (7, 5)
RULE_SET = "vLLM FP8 Marlin rules (tiles checked <= 0.23, dense padded from 0.24, experts from 0.25)"


@dataclass(frozen=True)
class MarlinWeight:
    """One FP8 weight as Marlin repacks it on one GPU: ``size_k`` inputs x ``size_n`` outputs."""

    module: str
    first_layer: int
    size_n: int
    size_k: int
    experts: bool = False

    def error(self) -> str | None:
        if self.size_k % TILE_K:
            return f"size_k = {self.size_k} is not divisible by tile_k_size = {TILE_K}"
        if self.size_n % TILE_N:
            return f"size_n = {self.size_n} is not divisible by tile_n_size = {TILE_N}"
        return None


def is_fp8_weights(model: ModelSpec) -> bool:
    """FP8 weights in any format vLLM reads: native fp8, compressed-tensors float8, ModelOpt FP8."""
    quant = model.quantization
    if quant is None:
        return False
    algo = (quant.algo or "").lower()
    return (quant.method == "fp8" or (quant.method == "compressed-tensors" and algo.startswith("float8"))
            or (quant.method.startswith("modelopt") and algo == "fp8"))


def marlin_weights(model: ModelSpec, layout: Layout) -> list[MarlinWeight]:
    """Every FP8-quantized weight of the model at this layout, as Marlin sees its shard."""
    tp = layout.tp
    hidden = model.hidden_size
    weights: list[MarlinWeight] = []

    def add(module: str, layers: range | tuple[int, ...] | list[int], n: int, k: int, experts: bool = False) -> None:
        quantized = quantized_layers(model, module, list(layers))
        if quantized:
            weights.append(MarlinWeight(module, quantized[0], n, k, experts))

    attention = attention_layers(model)
    heads = model.num_attention_heads // tp if model.num_attention_heads % tp == 0 else 0
    if model.is_mla:
        nope, rope, v = model.qk_nope_head_dim or 0, model.qk_rope_head_dim or 0, model.v_head_dim or 0
        q_in = model.q_lora_rank or hidden
        q_module = "self_attn.q_b_proj" if model.q_lora_rank else "self_attn.q_proj"
        add(q_module, attention, heads * (nope + rope), q_in)
        add("self_attn.kv_b_proj", attention, heads * (nope + v), model.kv_lora_rank or 0)
        add("self_attn.o_proj", attention, hidden, heads * v)
    else:
        kv = max(1, model.num_kv_heads // tp)
        add("self_attn.qkv_proj", attention, (heads + 2 * kv) * model.head_dim, hidden)
        add("self_attn.o_proj", attention, hidden, heads * model.head_dim)
    gdn = gated_deltanet(model)
    if gdn is not None:
        add("linear_attn.in_proj_qkvz", gdn.linear_layers, (2 * gdn.key_dim + 2 * gdn.value_dim) // tp, hidden)
        add("linear_attn.in_proj_ba", gdn.linear_layers, 2 * gdn.num_v_heads // tp, hidden)
        add("linear_attn.out_proj", gdn.linear_layers, hidden, gdn.value_dim // tp)
    dense = range(model.dense_layer_count)
    moe = range(model.dense_layer_count, model.num_layers) if model.is_moe else range(0)
    if model.intermediate_size and len(dense):
        add("mlp.gate_up_proj", dense, 2 * model.intermediate_size // tp, hidden)
        add("mlp.down_proj", dense, hidden, model.intermediate_size // tp)
    if model.shared_expert_intermediate_size and len(moe):
        width = model.shared_expert_intermediate_size
        add("mlp.shared_experts.gate_up_proj", moe, 2 * width // tp, hidden)
        add("mlp.shared_experts.down_proj", moe, hidden, width // tp)
    if model.is_moe and model.moe_intermediate_size:
        ispp = model.moe_intermediate_size // layout.moe_tp_size
        add("mlp.experts.w13 (gate_up)", moe, 2 * ispp, hidden, experts=True)
        add("mlp.experts.w2 (down)", moe, hidden, ispp, experts=True)
    return weights


def check_marlin_fp8(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                     vllm_version: VllmVersion | str | None = None) -> Verdict:
    """Does every FP8 weight shard fit Marlin's tiles, where vLLM runs FP8 on Marlin?"""
    if not is_fp8_weights(model):
        return Verdict.passed(f"Marlin FP8 rule does not apply: {model.name} has no FP8 weights",
                              rule_set=RULE_SET)
    version = version_of(vllm_version)
    release = at(version)
    if release >= MOE_PADDED_SINCE:
        return Verdict.passed(f"{model.name}: vLLM {version or '>= 0.25'} pads FP8 weights to Marlin's tiles "
                              "where it runs them on Marlin (SM < 8.9)", rule_set=RULE_SET)
    cap = coerce_capability(capability)
    if cap is None:
        return Verdict.undecided(
            f"{model.name}: FP8 runs as Marlin weight-only below SM89, whose tiles vLLM {version} does not pad; "
            "whether that applies depends on the GPU", needs=NEEDS_CAPABILITY, rule_set=RULE_SET)
    if cap >= MIN_FP8_CAPABILITY:
        return Verdict.passed(f"Marlin FP8 rule does not apply: {arch_text(cap)} has native FP8",
                              rule_set=RULE_SET)
    if cap < MARLIN_MIN_CAPABILITY:
        return Verdict.passed("Marlin FP8 rule does not apply below SM75 (FP8 itself does not load there)",
                              rule_set=RULE_SET)
    checked = [w for w in marlin_weights(model, layout)
               if not (release >= DENSE_PADDED_SINCE and not w.experts)]
    failing = sorted((w for w in checked if w.error()), key=lambda w: w.first_layer)
    lines = tuple(f"{w.module}, from layer {w.first_layer}: size_k {w.size_k} x size_n {w.size_n} per GPU: "
                  f"{w.error() or 'fits'}" for w in checked)
    evidence = {"gpu_arch": arch_text(cap), "weights": [
        {"module": w.module, "first_layer": w.first_layer, "size_n": w.size_n, "size_k": w.size_k,
         "error": w.error()} for w in checked]}
    if failing:
        first = failing[0]
        step = 2 if first.module.startswith("mlp") else 0
        return staged(Verdict.failed(
            f"{model.name} on {arch_text(cap)} at {layout.describe()}: {first.error()}",
            details=(f"FP8 runs as Marlin weight-only below SM89; {first.module} (from layer "
                     f"{first.first_layer}) is {first.size_k} x {first.size_n} per GPU",
                     *lines, "what would work: vLLM >= 0.25 (pads to Marlin's tiles), or a TP size whose "
                     "shards are multiples of 64 outputs and 16 inputs, or an SM89+ GPU"),
            evidence=evidence, rule_set=RULE_SET), LOAD, first.first_layer, step)
    return Verdict.passed(f"{model.name} on {arch_text(cap)} at {layout.describe()}: every FP8 shard fits "
                          "Marlin's tiles", details=lines, evidence=evidence, rule_set=RULE_SET)
