"""TP divisibility: heads, vocab, KV heads, linear attention, MLP and expert widths, in vLLM's order."""

from __future__ import annotations

import math
from typing import Any

from pytest_gpuready.model.checks.common import (
    TP_RULES,
    VOCAB_PADDING,
)
from pytest_gpuready.model.linear_attention import attention_layers, gated_deltanet
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.verdict import Verdict

# ---------------------------------------------------------------- TP divisibility

TP_GREATER_THAN_EXPERTS_MODEL_TYPES = frozenset({
    "cohere2_moe", "ernie4_5_moe", "ernie4_5_vl_moe", "exaone_moe", "minimax_m2", "mimo_v2_flash",
    "qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_vl_moe",
    "qwen3_vl_moe_text", "step3_text", "step3p5",
})
"""Model families whose MoE block raises ``Tensor parallel size {tp} is greater than the number of
experts {n}.`` (``if self.tp_size > config.num_experts`` in ``vllm/model_executor/models/qwen3_moe.py``,
``qwen2_moe.py``, ``qwen3_next.py``, ``minimax_m2.py``, ... 0.13-0.33); others (DeepSeek, GLM,
Mixtral) spread the experts without asserting it."""


def check_tp_divisibility(model: ModelSpec, tp: int, *, ep: bool = False) -> Verdict:
    """Attention heads, vocab, KV heads (replicated when TP > KV heads), linear-attention heads, MLP
    and expert widths, in the order vLLM meets them; the first failure is the one vLLM raises.

    vLLM checks the attention heads while it builds the config
    (``ModelConfig.verify_with_parallel_config``), then builds the model: the embedding first
    (``VocabParallelEmbedding``: vocab padded to 64, then ``divide(padded, tp)``, so
    ``151936 is not divisible by 5`` comes before any head check of the layers), then layer by
    layer: attention (``QKVParallelLinear``: KV heads), or Gated DeltaNet (``divide`` of its
    widths and value heads), then the MLP (``divide()`` in the column/row parallel layers) and the
    MoE block's ``Tensor parallel size ... is greater than the number of experts`` where the model
    asserts it (vllm-invariants.md §1.4). Shared experts stay TP-split with EP.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    found: list[tuple[tuple[int, int, int], str]] = []
    """(vLLM stage: phase, layer, step) and the message of every failed rule."""
    details: list[str] = []
    warnings: list[str] = []
    heads = model.num_attention_heads
    if heads % tp:
        found.append(((0, 0, 0), f"Total number of attention heads ({heads}) must be divisible by tensor "
                                 f"parallel size ({tp})."))
    else:
        details.append(f"attention heads: {heads} / TP {tp} = {heads // tp} per GPU")
    padded = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        found.append(((1, -1, 0), f"{padded} is not divisible by {tp}: vocab_size {model.vocab_size} "
                                  f"(padded to a multiple of {VOCAB_PADDING}) cannot be split over TP={tp}"))
    else:
        details.append(f"vocab: {model.vocab_size} padded to {padded} / TP {tp} = {padded // tp}")
    attention = attention_layers(model)
    first_attention = attention[0] if len(attention) else 0
    kv = model.num_kv_heads
    if model.is_mla:
        details.append("KV heads: MLA stores one latent KV head, replicated on every GPU")
    elif tp > kv:
        if tp % kv:
            found.append(((1, first_attention, 0), f"{tp} is not divisible by {kv}: TP={tp} is larger than "
                                                   f"the {kv} KV heads, so it must be a multiple of them to "
                                                   "replicate each one (QKVParallelLinear)"))
        else:
            details.append(f"KV heads: {kv} over TP {tp}: one KV head per GPU, each replicated "
                           f"on {tp // kv} GPUs")
            warnings.append(f"TP={tp} is larger than the {kv} KV heads: each KV head is "
                            f"replicated on {tp // kv} GPUs, so the KV cache per GPU stops "
                            f"shrinking past TP={kv}")
    elif kv % tp:
        found.append(((1, first_attention, 0), f"{kv} is not divisible by {tp}: the {kv} KV heads cannot be "
                                               f"split over TP={tp} (QKVParallelLinear)"))
    else:
        details.append(f"KV heads: {kv} / TP {tp} = {kv // tp} per GPU")
    out = model.attention_output_size
    if out % tp:
        found.append(((1, first_attention, 0), f"{out} is not divisible by {tp}: attention output (o_proj "
                                               f"input) {out} cannot be split over TP={tp}"))
    gdn = gated_deltanet(model)
    if gdn is not None and gdn.linear_layers:
        layer = gdn.linear_layers[0]
        for label, width in (("linear-attention conv1d width", gdn.conv_dim),
                             ("linear-attention key width", gdn.key_dim),
                             ("linear-attention value width", gdn.value_dim),
                             ("linear-attention value heads", gdn.num_v_heads)):
            if width % tp:
                found.append(((1, layer, 0), f"{width} is not divisible by {tp}: {label} {width} cannot "
                                             f"be split over TP={tp}"))
                break
        else:
            details.append(f"linear attention: {gdn.num_v_heads} value heads / TP {tp} = "
                           f"{gdn.num_v_heads // tp} per GPU")
    dense_first = 0
    moe_first = model.dense_layer_count if model.is_moe else 0
    widths: list[tuple[int, int, str, int | None]] = [
        (dense_first, 2, "dense MLP intermediate_size",
         model.intermediate_size if model.dense_layer_count else None),
        (moe_first, 2, "shared-expert width", model.shared_expert_intermediate_size or None),
    ]
    if model.is_moe and not ep:
        widths.append((moe_first, 3, f"expert FFN {model.expert_ffn_key}", model.moe_intermediate_size))
    for at_layer, step, label, size in widths:
        if size and size % tp:
            found.append(((1, at_layer, step), f"{size} is not divisible by {tp}: {label} {size} cannot be "
                                               f"split over TP={tp}"))
    if (model.is_moe and tp > model.num_experts
            and model.text_model_type in TP_GREATER_THAN_EXPERTS_MODEL_TYPES):
        found.append(((1, moe_first, 2), f"Tensor parallel size {tp} is greater than the number of experts "
                                         f"{model.num_experts}."))
    if ep and not model.is_moe:
        found.append(((0, 0, 1), "Number of experts in the model must be greater than 0 when expert "
                                 "parallelism is enabled."))
    found.sort(key=lambda item: item[0])
    evidence: dict[str, Any] = {"tp": tp, "ep": ep, "attention_heads": heads, "kv_heads": kv,
                                "vocab_padded": padded, "mla": model.is_mla}
    if found:
        evidence["vllm_stage"] = list(found[0][0])
        errors = [message for _, message in found]
        return Verdict.failed(f"{model.name} cannot be split at TP={tp}: {errors[0]}",
                              details=tuple(errors[1:] + details), evidence=evidence,
                              rule_set=TP_RULES)
    return Verdict.passed(f"{model.name} splits evenly at TP={tp}", details=tuple(details),
                          evidence=evidence, warnings=tuple(warnings), rule_set=TP_RULES)


