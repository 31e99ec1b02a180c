"""Will this checkpoint load with this TP/EP, KV dtype and GPU, and fit? Pure checks on a ModelSpec.

Each check reproduces a rule vLLM enforces only after minutes of weight loading, and answers in
milliseconds with a :class:`Verdict` whose failure reads like vLLM's own error plus the layer,
the sizes and what would work instead. The rules, their vLLM source locations and the versions
they changed in are in ``shared/reference/vllm-invariants.md``; every verdict names the rule
set it applied (``vLLM <= 0.28 rules``), and says so when the vLLM version was unknown.

No I/O here: the model comes from :func:`pytest_gpuready.model.spec.inspect_model`, the GPUs from a
:class:`~pytest_gpuready.host.snapshot.HostSnapshot`.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pytest_gpuready.host.snapshot import GpuInfo, HostSnapshot
from pytest_gpuready.model import memory
from pytest_gpuready.model.backends import (
    FP8_KV_DTYPES,
    MIN_FP8_CAPABILITY,
    format_arch,
    kv_dtype_alias,
    parse_gpu_arch,
    select_mla_backend,
)
from pytest_gpuready.model.linear_attention import attention_layers, gated_deltanet
from pytest_gpuready.model.spec import ModelSpec, derived_weights_for
from pytest_gpuready.model.vllm_version import (
    FP8_MOE_REFINEMENT,
    TRITON_MLA_FP8_KV,
    RuleBoundary,
    VllmVersion,
    coerce_version,
)
from pytest_gpuready.verdict import Verdict

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


# ---------------------------------------------------------------- FP8 block alignment

@dataclass(frozen=True)
class Partition:
    """One weight the TP split cuts, and whether its shard is a whole number of FP8 blocks."""

    module: str
    layers: str
    size: int
    parts: int
    per_partition: int | None
    error: str | None = None
    warning: str | None = None
    note: str | None = None
    needs: str | None = None
    """Set when the shard's fate depends on an input the check was not given (the GPU's capability)."""
    first_layer: int = 0
    """The first layer it applies to: vLLM builds layer by layer, so the lowest one fails first."""

    def line(self, block: tuple[int, int]) -> str:
        split = (f"{self.size} / {self.parts} = {self.per_partition} per GPU"
                 if self.per_partition is not None else f"{self.size} over {self.parts}")
        text = f"{self.module}, {self.layers}: {split}, block {list(block)}"
        if self.error:
            return f"{text}: {self.error}"
        if self.needs:
            return f"{text}: {self.needs}"
        if self.warning:
            return f"{text}: {self.warning}"
        if self.note:
            return f"{text}: {self.note}"
        return f"{text}: aligned"


def _normalise(name: str) -> str:
    for prefix in ("language_model.", "model.language_model."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    pat = _normalise(pattern)
    if any(ch in pat for ch in "*?["):
        return fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(name, "*." + pat)
    if "." not in pat:
        return pat in name.split(".")
    return name == pat or name.startswith(pat + ".") or name.endswith("." + pat)


FUSED_SHARDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "self_attn.qkv_proj": (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),),
    "mlp.gate_up_proj": (("mlp.gate_proj", "mlp.up_proj"),),
    "mlp.shared_experts.gate_up_proj": (("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"),
                                        ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj")),
    "mlp.shared_experts.down_proj": (("mlp.shared_expert.down_proj",),),
    "linear_attn.in_proj_qkvz": (("linear_attn.in_proj_qkv", "linear_attn.in_proj_z"),),
    "linear_attn.in_proj_ba": (("linear_attn.in_proj_b", "linear_attn.in_proj_a"),),
}
"""vLLM's fused layers and the checkpoint tensors they are loaded from (the models'
``packed_modules_mapping``): a fused layer is left unquantized when all its shards are
(``is_layer_skipped`` in ``vllm/model_executor/layers/quantization/utils/quant_utils.py``)."""


def quantized_layers(model: ModelSpec, module: str, layers: Sequence[int]) -> list[int]:
    """Layers in which ``model.layers.N.<module>`` is FP8-quantized (not in the excluded modules)."""
    patterns = model.quantization.excluded_modules if model.quantization else ()
    if not patterns:
        return list(layers)

    def excluded(name: str) -> bool:
        return any(_matches(p, name) for p in patterns)

    def skipped(i: int) -> bool:
        if excluded(f"model.layers.{i}.{module}"):
            return True
        return any(all(excluded(f"model.layers.{i}.{shard}") for shard in shards)
                   for shards in FUSED_SHARDS.get(module, ()))

    return [i for i in layers if not skipped(i)]


def _row(module: str, layers: list[int], size: int, tp: int, block_k: int) -> Partition:
    label, first = _layers_text(layers), layers[0]
    if tp == 1:
        return Partition(module, label, size, tp, size, note="not split at TP=1", first_layer=first)
    if size % tp:
        return Partition(module, label, size, tp, None, error=f"{size} is not divisible by {tp}",
                         first_layer=first)
    per = size // tp
    if per % block_k:
        return Partition(module, label, size, tp, per,
                         error=f"Weight input_size_per_partition = {per} is not divisible by "
                               f"weight quantization block_k = {block_k}.", first_layer=first)
    return Partition(module, label, size, tp, per, first_layer=first)


def _column(module: str, layers: list[int], sizes: Sequence[int], tp: int, block_n: int,
            merged_allowed: bool) -> Partition:
    label, first = _layers_text(layers), layers[0]
    size = sum(sizes)
    if tp == 1:
        return Partition(module, label, size, tp, size, note="not split at TP=1", first_layer=first)
    if any(s % tp for s in sizes):
        return Partition(module, label, size, tp, None, error=f"{size} is not divisible by {tp}",
                         first_layer=first)
    per_sizes = [s // tp for s in sizes]
    bad = [p for p in per_sizes if p % block_n]
    if bad and len(sizes) > 1 and merged_allowed:
        return Partition(module, label, size, tp, sum(per_sizes),
                         note="merged layer, allowed to mismatch the block (vLLM >= 0.15)", first_layer=first)
    if bad:
        return Partition(module, label, size, tp, bad[0] if len(sizes) > 1 else per_sizes[0],
                         error=f"Weight output_partition_size = {bad[0]} is not divisible by "
                               f"weight quantization block_n = {block_n}.", first_layer=first)
    return Partition(module, label, size, tp, sum(per_sizes), first_layer=first)


REGRID_KERNEL_NOTE = ("Only the Triton MoE kernel takes a re-gridded block, and it needs native FP8 "
                      "(SM89+); below SM89 vLLM runs FP8 MoE on Marlin, which takes only 128x128 blocks")
"""Why a re-gridded block needs the GPU's capability (``refine_fp8_moe_block_shape`` docstring and
``TritonExperts._supports_quant_scheme`` / ``MarlinExperts._supports_quant_scheme``,
``vllm/model_executor/layers/fused_moe/``, 0.29-0.33)."""
NO_FP8_MOE_BACKEND = "No FP8 MoE backend supports the deployment configuration."
"""``select_fp8_moe_backend`` (``vllm/model_executor/layers/fused_moe/oracle/fp8.py``, 0.15-0.33)."""


def _experts(model: ModelSpec, layers: list[int], tp: int, ep: bool, block: tuple[int, int],
             version: VllmVersion | None, capability: tuple[int, int] | None = None,
             dp: int = 1) -> Partition:
    block_n, block_k = block
    size = model.moe_intermediate_size or 0
    moe_tp = 1 if ep else tp * dp
    label = _layers_text(layers)
    part = partial(Partition, first_layer=layers[0])
    module = f"mlp.experts (routed experts, {model.expert_ffn_key}={size}"
    module += f", whole on each of {tp * dp} EP ranks)" if ep else ")"
    if size % moe_tp:
        return part(module, label, size, moe_tp, None,
                         error=f"{size} is not divisible by the MoE TP size {moe_tp}")
    ispp = size // moe_tp
    error = None
    if ispp % block_n:
        error = (f"The output_size of gate's and up's weight = {ispp} is not divisible by weight "
                 f"quantization block_n = {block_n}.")
    elif tp > 1 and ispp % block_k:
        error = (f"The input_size of down's weight = {ispp} is not divisible by weight "
                 f"quantization block_k = {block_k}.")
    if error is None:
        return part(module, label, size, moe_tp, ispp)
    native_fp8 = model.quantization is not None and model.quantization.method == "fp8"
    if native_fp8 and FP8_MOE_REFINEMENT.is_new(version):
        refine = math.gcd(block_n, block_k, ispp, model.hidden_size)
        if refine >= REFINE_MIN_BLOCK:
            regrid = (f"FP8 MoE block scales refined from {list(block)} to [{refine}, {refine}] "
                      f"to fit the TP-sharded intermediate size {ispp}.")
            if capability is None:
                return part(module, label, size, moe_tp, ispp, needs=f"{regrid} {REGRID_KERNEL_NOTE}.")
            if capability < MIN_FP8_CAPABILITY:
                return part(module, label, size, moe_tp, ispp, error=(
                    f"{NO_FP8_MOE_BACKEND} ({regrid} {REGRID_KERNEL_NOTE}; this GPU is "
                    f"{format_arch(capability)})"))
            return part(module, label, size, moe_tp, ispp, warning=(
                f"{regrid} (vLLM >= 0.29 re-grids the scales at load; {format_arch(capability)} "
                "runs them on the Triton MoE kernel)"))
        error += (f" (the vLLM >= 0.29 re-gridding needs gcd({block_n}, {block_k}, {ispp}, "
                  f"{model.hidden_size}) = {refine} >= {REFINE_MIN_BLOCK})")
    return part(module, label, size, moe_tp, ispp, error=error)


def fp8_partitions(model: ModelSpec, tp: int, ep: bool = False,
                   vllm_version: VllmVersion | str | None = None, *,
                   compute_capability: tuple[int, int] | None = None, dp: int = 1) -> list[Partition]:
    """Every TP-split weight of an FP8 block-quantized model, with its alignment finding.

    In vLLM's construction order: attention (or Gated DeltaNet linear attention), then the MLP.
    """
    quant = model.quantization
    if quant is None or quant.weight_block_size is None:
        return []
    version = _version(vllm_version)
    block = quant.weight_block_size
    block_n, block_k = block
    merged_allowed = MERGED_MISMATCH_ALLOWED.is_new(version)
    all_layers = attention_layers(model)
    gdn = gated_deltanet(model)
    dense_layers = range(model.dense_layer_count)
    moe_layers = range(model.dense_layer_count, model.num_layers) if model.is_moe else range(0)
    parts: list[Partition] = []

    def add_row(module: str, layers: Sequence[int], size: int) -> None:
        quantized = quantized_layers(model, module, layers)
        if quantized:
            parts.append(_row(module, quantized, size, tp, block_k))

    def add_column(module: str, layers: Sequence[int], sizes: Sequence[int]) -> None:
        quantized = quantized_layers(model, module, layers)
        if quantized:
            parts.append(_column(module, quantized, sizes, tp, block_n, merged_allowed))

    heads = model.num_attention_heads
    if model.is_mla:
        nope, rope, v = model.qk_nope_head_dim or 0, model.qk_rope_head_dim or 0, model.v_head_dim or 0
        q_module = "self_attn.q_b_proj" if model.q_lora_rank else "self_attn.q_proj"
        add_column(q_module, all_layers, [heads * (nope + rope)])
        add_column("self_attn.kv_b_proj", all_layers, [heads * (nope + v)])
    else:
        kv_width = model.num_kv_heads * model.head_dim
        kv_split = max(model.num_kv_heads, tp) * model.head_dim if tp > model.num_kv_heads else kv_width
        add_column("self_attn.qkv_proj", all_layers, [heads * model.head_dim, kv_split, kv_split])
    add_row("self_attn.o_proj", all_layers, model.attention_output_size)
    if gdn is not None:
        minor = (version.major, version.minor) if version is not None else None
        add_column("linear_attn.in_proj_qkvz", gdn.linear_layers, gdn.qkvz_outputs())
        add_column("linear_attn.in_proj_ba", gdn.linear_layers, gdn.ba_outputs(minor))
        add_row("linear_attn.out_proj", gdn.linear_layers, gdn.value_dim)
    if model.intermediate_size and dense_layers:
        add_column("mlp.gate_up_proj", dense_layers, [model.intermediate_size] * 2)
        add_row("mlp.down_proj", dense_layers, model.intermediate_size)
    if model.shared_expert_intermediate_size and moe_layers:
        width = model.shared_expert_intermediate_size
        add_column("mlp.shared_experts.gate_up_proj", moe_layers, [width] * 2)
        add_row("mlp.shared_experts.down_proj", moe_layers, width)
    if model.is_moe:
        quantized = quantized_layers(model, "mlp.experts", moe_layers)
        if quantized:
            parts.append(_experts(model, quantized, tp, ep, block, version, compute_capability, dp))
    return parts


def _fp8_loads(model: ModelSpec, tp: int, ep: bool, version: VllmVersion | None,
               capability: tuple[int, int] | None, dp: int = 1) -> bool:
    if not check_tp_divisibility(model, tp, ep=ep).ok:
        return False
    parts = fp8_partitions(model, tp, ep, version, compute_capability=capability, dp=dp)
    return not any(p.error or p.needs for p in parts)


def _alternatives(model: ModelSpec, tp: int, ep: bool, version: VllmVersion | None,
                  capability: tuple[int, int] | None, dp: int = 1) -> list[str]:
    options = []
    smaller = [t for t in (tp // 2 ** i for i in range(1, 8)) if t >= 1]
    for candidate in smaller:
        if _fp8_loads(model, candidate, ep, version, capability, dp):
            options.append(f"TP={candidate}" + (" with --enable-expert-parallel" if ep else ""))
            break
    if not ep and model.is_moe and _fp8_loads(model, tp, True, version, capability, dp):
        options.append(f"TP={tp} with --enable-expert-parallel")
    if version is not None and not FP8_MOE_REFINEMENT.is_new(version):
        if _fp8_loads(model, tp, ep, None, max(capability or MIN_FP8_CAPABILITY, MIN_FP8_CAPABILITY), dp):
            gpu = "" if capability is None or capability >= MIN_FP8_CAPABILITY else " on an SM89+ GPU"
            options.append(f"TP={tp} on vLLM >= 0.29{gpu} (re-grids the MoE block scales)")
    elif capability is not None and capability < MIN_FP8_CAPABILITY \
            and _fp8_loads(model, tp, ep, version, MIN_FP8_CAPABILITY, dp):
        options.append(f"TP={tp} on an SM89+ GPU (Triton MoE takes the re-gridded blocks)")
    return options


def check_fp8_block_alignment(model: ModelSpec, tp: int, ep: bool = False,
                              vllm_version: VllmVersion | str | None = None, *,
                              compute_capability: tuple[int, int] | str | None = None,
                              dp: int = 1) -> Verdict:
    """Does every TP shard of an FP8 block-quantized checkpoint hold whole ``[block_n, block_k]`` blocks?

    Row-parallel inputs (``o_proj``, dense and shared-expert ``down_proj``, linear-attention
    ``out_proj``) need ``(size / tp) % block_k == 0``; single column-parallel outputs (MLA
    ``q_b_proj``, ``kv_b_proj``, Qwen3-Next's fused ``in_proj_qkvz`` / ``in_proj_ba``) ``% block_n``;
    merged QKV / gate_up may mismatch (vLLM >= 0.15). Shared experts stay TP-split with expert
    parallelism. Routed experts are split by the MoE TP size (TP x DP, or 1 with
    ``--enable-expert-parallel``) and must be multiples of both; vLLM >= 0.29 re-grids
    native-fp8 MoE scales when ``gcd(block_n, block_k, shard, hidden) >= 32``, and those load only
    with the Triton MoE kernel, on native FP8 (SM89+): without ``compute_capability`` such a
    layout is undecided (``needs`` says so), on SM < 8.9 it fails with vLLM's ``No FP8 MoE
    backend supports the deployment configuration.``. Sources: ``validate_fp8_block_shape``,
    ``Fp8MoEMethod``, ``refine_fp8_moe_block_shape``, ``select_fp8_moe_backend``
    (vllm-invariants.md §1, docs/checks/fp8_block_alignment.md).
    """
    version = _version(vllm_version)
    capability = None if compute_capability is None else _capability(compute_capability)
    rule_set = FP8_MOE_REFINEMENT.select(version)
    quant = model.quantization
    ep_text = " with --enable-expert-parallel" if ep else ""
    layout_text = f"TP={tp}{ep_text}" + (f" and DP={dp}" if dp > 1 else "")
    if quant is None or quant.weight_block_size is None:
        what = quant.describe() if quant else "not quantized"
        return Verdict.passed(
            f"FP8 block alignment does not apply: {model.name} is {what}, not FP8 block-quantized",
            evidence={"applies": False, "quantization": what}, rule_set=rule_set)
    block = quant.weight_block_size
    evidence: dict[str, Any] = {"applies": True, "tp": tp, "ep": ep, "dp": dp, "block": list(block),
                                "quantization": quant.describe(),
                                "gpu_arch": format_arch(capability) if capability else None}
    if ep and not model.is_moe:
        return Verdict.failed(
            f"{model.name} does not load with --enable-expert-parallel: Number of experts in the "
            "model must be greater than 0 when expert parallelism is enabled.",
            evidence=evidence, rule_set=rule_set)
    if quant.activation_scheme not in (None, "dynamic"):
        return Verdict.failed(
            f"{model.name} does not load: The block-wise quantization only supports dynamic "
            f"activation scheme for now, but got {quant.activation_scheme} activation scheme.",
            evidence=evidence, rule_set=rule_set)
    partitions = fp8_partitions(model, tp, ep, version, compute_capability=capability, dp=dp)
    if not MERGED_MISMATCH_ALLOWED.is_new(version):
        rule_set += "; merged layers checked too (no block-mismatch allowance before vLLM 0.15)"
    evidence["partitions"] = [
        {"module": p.module, "layers": p.layers, "size": p.size, "parts": p.parts,
         "per_partition": p.per_partition, "error": p.error, "warning": p.warning, "note": p.note,
         "needs": p.needs, "first_layer": p.first_layer}
        for p in partitions]
    failing = sorted((p for p in partitions if p.error), key=lambda p: p.first_layer)
    lines = tuple(p.line(block) for p in partitions)
    if failing:
        first = failing[0]
        details = [f"layer: {p.line(block)}" for p in failing]
        options = _alternatives(model, tp, ep, version, capability, dp)
        if options:
            details.append("what would work: loads at " + ", or ".join(options))
        else:
            details.append("what would work: no TP size up to this one loads this checkpoint "
                           "on these rules")
        evidence["alternatives"] = options
        evidence["first_layer"] = first.first_layer
        return Verdict.failed(
            f"{model.name} does not load at {layout_text}: {first.error}",
            details=tuple(details), evidence=evidence, rule_set=rule_set)
    pending = [p for p in partitions if p.needs]
    if pending:
        return Verdict.undecided(
            f"{model.name} at {layout_text}: loads only on SM89+ GPUs: {pending[0].needs}",
            needs="the GPU's compute capability (pass --gpu-arch SM, or --gpu-host HOST)",
            details=lines, evidence=evidence, rule_set=rule_set)
    warnings = tuple(f"{model.name} at {layout_text}: {p.warning}" for p in partitions if p.warning)
    on = f" on {format_arch(capability)}" if capability else ""
    return Verdict.passed(
        f"{model.name} FP8 blocks {list(block)} align at {layout_text}{on}",
        details=lines, evidence=evidence, warnings=warnings, rule_set=rule_set)


# ---------------------------------------------------------------- KV cache dtype and MLA backend

@dataclass(frozen=True)
class KvCacheDtype:
    """The KV-cache dtype vLLM will use, and why."""

    name: str
    reason: str

    @property
    def is_fp8(self) -> bool:
        return self.name in FP8_KV_DTYPES


def effective_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str = "auto",
                             vllm_version: VllmVersion | str | None = None) -> KvCacheDtype:
    """``--kv-cache-dtype`` after vLLM's resolution: ``auto`` takes the checkpoint's request
    (ModelOpt ``kv_cache_scheme`` / ``kv_cache_quant_algo``, compressed-tensors
    ``kv_cache_scheme``); an explicit value wins, except that compressed-tensors checkpoints force
    fp8 on GQA attention in vLLM 0.17 (0.33 honours the flag; releases between were not read
    and are treated like 0.17). Sources: vllm-invariants.md §2.4."""
    version = _version(vllm_version)
    quant = model.quantization
    asked = quant.kv_cache_dtype if quant else None
    alias = kv_dtype_alias(model.architectures, kv_cache_dtype, version)
    if alias is not None:
        return KvCacheDtype(alias, f"--kv-cache-dtype {kv_cache_dtype} is used as {alias} for "
                                   f"{model.architectures[0]} (models/config.py: verify_and_update_config)")
    if kv_cache_dtype != "auto":
        if (quant is not None and quant.method == "compressed-tensors" and asked
                and not model.is_mla and version is not None and not version.at_least(0, 33)):
            return KvCacheDtype("fp8", f"forced by {quant.kv_cache_source} on vLLM {version} "
                                       f"(--kv-cache-dtype {kv_cache_dtype} is ignored before 0.33)")
        return KvCacheDtype(kv_cache_dtype, f"--kv-cache-dtype {kv_cache_dtype}")
    if asked and quant is not None:
        return KvCacheDtype(asked, f"--kv-cache-dtype auto resolves to {asked} from {quant.kv_cache_source}")
    return KvCacheDtype("auto", f"--kv-cache-dtype auto: the model dtype ({model.torch_dtype})")


def _capability(value: tuple[int, int] | str) -> tuple[int, int]:
    if isinstance(value, str):
        return parse_gpu_arch(value)
    return (int(value[0]), int(value[1]))


def _selector_config(model: ModelSpec, kv: str) -> str:
    """The start of vLLM's ``AttentionSelectorConfig.__repr__`` (later versions append more fields)."""
    return (f"AttentionSelectorConfig(head_size={model.mla_head_size}, dtype=torch.{model.torch_dtype}, "
            f"kv_cache_dtype={kv}, block_size=None, use_mla=True, has_sink=False, "
            f"use_sparse={model.is_sparse_mla}, ...)")


def check_mla_kv_backend(model: ModelSpec, compute_capability: tuple[int, int] | str | None,
                         kv_cache_dtype: str = "auto",
                         vllm_version: VllmVersion | str | None = None, *, tp: int = 1) -> Verdict:
    """Is there an MLA attention backend for this GPU, KV-cache dtype and vLLM version?

    Walks vLLM's priority list for the architecture with the effective KV dtype and returns
    the backend it would pick, or fails with vLLM's ``No valid attention backend found ...
    Reasons: {...}`` and the settings that would work. Non-MLA models pass ("does not apply"),
    and need no ``compute_capability`` (None).
    """
    version = _version(vllm_version)
    rule_set = TRITON_MLA_FP8_KV.select(version)
    kv = effective_kv_cache_dtype(model, kv_cache_dtype, version)
    evidence: dict[str, Any] = {"mla": model.is_mla, "kv_cache_dtype": kv.name,
                                "kv_cache_dtype_reason": kv.reason,
                                "vllm_version": str(version) if version else None}
    if not model.is_mla:
        return Verdict.passed(
            f"MLA backend check does not apply: {model.name} uses {model.text_model_type} "
            "attention, not MLA", evidence=evidence, rule_set=rule_set)
    if compute_capability is None:
        raise ValueError(f"{model.name} uses MLA: the MLA backend check needs the GPU's compute "
                         "capability (e.g. 'sm120' or (12, 0))")
    capability = _capability(compute_capability)
    arch = format_arch(capability)
    evidence["gpu_arch"] = arch
    details = [f"KV-cache dtype: {kv.reason}"]
    if kv.is_fp8 and capability < MIN_FP8_CAPABILITY:
        fallback = "float16" if capability < (8, 0) else "bfloat16"
        if version is None or version.at_least(0, 26):
            # TritonMLAImpl.__init__ (vllm/v1/attention/backends/mla/triton_mla.py, 0.26-0.33)
            summary = (f"FP8 KV cache is not supported by the Triton MLA backend on {arch} (compute capability "
                       f"{capability[0]}.{capability[1]}); native FP8 (fp8e4nv) requires SM89+. Re-run with "
                       f"--kv-cache-dtype {fallback}.")
        else:
            summary = (f"an FP8 KV cache ({kv.name}) needs compute capability >= 8.9; this GPU is "
                       f"{capability[0]}.{capability[1]} (vLLM {version} fails in the profile run: fp8e4nv data "
                       "type is not supported on CUDA arch < 89)")
        return Verdict.failed(
            f"{model.name} on {arch}: {summary}",
            details=(*details, f"what would work: --kv-cache-dtype {fallback}"),
            evidence=evidence, rule_set=rule_set)
    choice = select_mla_backend(capability=capability, kv_cache_dtype=kv.name,
                                sparse=model.is_sparse_mla, qk_nope_head_dim=model.qk_nope_head_dim,
                                version=version, num_heads=max(1, model.num_attention_heads // max(1, tp)),
                                head_size=model.mla_head_size)
    evidence.update({"backends_tried": list(choice.tried), "reasons": choice.reasons,
                     "backend": choice.chosen})
    if choice.chosen is not None:
        rejected = [f"{name}: {', '.join(why)}" for name, why in choice.reasons.items()]
        if choice.chosen == "TRITON_MLA" and kv.is_fp8 and version is not None \
                and not version.at_least(0, 13):
            return Verdict.failed(
                f"{model.name} on {arch} with KV cache {kv.name}: vLLM {version} picks TRITON_MLA, "
                "whose init raises NotImplementedError: TritonMLA V1 with FP8 KV cache not yet supported",
                details=(*details, *_mla_fixes(model, capability, version)),
                evidence=evidence, rule_set=rule_set)
        if rejected:
            details.append("passed over: " + "; ".join(rejected))
        return Verdict.passed(
            f"{model.name} on {arch} with KV cache {kv.name}: vLLM would use {choice.chosen}",
            details=tuple(details), evidence=evidence, rule_set=rule_set)
    message = (f"No valid attention backend found for cuda with {_selector_config(model, kv.name)}. "
               f"Reasons: {choice.reasons_text()}.")
    return Verdict.failed(
        f"{model.name} on {arch} with KV cache {kv.name}: {message}",
        details=(*details, *_mla_fixes(model, capability, version)),
        evidence=evidence, rule_set=rule_set)


def _mla_fixes(model: ModelSpec, capability: tuple[int, int], version: VllmVersion | None) -> list[str]:
    options = []
    for dtype in ("bfloat16",):
        choice = select_mla_backend(capability=capability, kv_cache_dtype=dtype,
                                    sparse=model.is_sparse_mla, qk_nope_head_dim=model.qk_nope_head_dim,
                                    version=version)
        if choice.chosen:
            options.append(f"--kv-cache-dtype {dtype} ({choice.chosen}; twice the KV memory of fp8)")
    kv = effective_kv_cache_dtype(model, "auto", version)
    if version is not None:
        newest = select_mla_backend(capability=capability, kv_cache_dtype=kv.name,
                                    sparse=model.is_sparse_mla, qk_nope_head_dim=model.qk_nope_head_dim,
                                    version=None)
        if newest.chosen and not TRITON_MLA_FP8_KV.is_new(version):
            options.append(f"vLLM >= 0.18 ({newest.chosen} supports {kv.name} there)")
        elif newest.chosen:
            options.append(f"a newer vLLM ({newest.chosen})")
    if not options:
        return ["what would work: no KV-cache dtype or vLLM version has an MLA backend for this GPU"]
    return ["what would work: " + ", or ".join(options)]


# ---------------------------------------------------------------- KV cache size and memory fit

def kv_dtype_bytes(model: ModelSpec, kv_cache_dtype: str, dtype: str = "auto") -> int:
    """Bytes per KV element for a resolved dtype: "auto" is the dtype the model is *served* in
    (``CacheConfig.cache_dtype == "auto"`` takes ``ModelConfig.dtype``), i.e. ``--dtype`` when
    given (float32: 4 bytes, vLLM 0.19 on an H100 logs half the bf16 tokens), else the config's."""
    name = kv_cache_dtype
    if name == "auto":
        name = model.torch_dtype if dtype == "auto" else dtype
    if name in ("bfloat16", "float16", "half", "bf16", "fp16"):
        return 2
    if name in ("float32", "float"):
        return 4
    if name in FP8_KV_DTYPES:
        return 1
    raise ValueError(f"KV-cache dtype {kv_cache_dtype!r}: its size per element is not modelled; "
                     "expected auto, bfloat16, float16 or an fp8 variant")


def kv_cache_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str = "auto",
                             dtype: str = "auto") -> int:
    """KV-cache bytes one token takes on one GPU, as vLLM sizes pages (vllm-invariants.md §3.1).

    GQA: ``2 x layers x max(1, kv_heads // tp) x head_dim x bytes``. MLA: ``layers x
    (kv_lora_rank + qk_rope_head_dim) x bytes``, not divided by TP (every rank stores the
    latent); ``fp8_ds_mla`` pages are 656 bytes per token per layer. ``auto`` resolves through
    the checkpoint's KV request first (Kimi-K2.5-NVFP4 -> fp8), then the served ``dtype``.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    kv = effective_kv_cache_dtype(model, kv_cache_dtype).name
    layers = model.num_layers
    if model.is_mla:
        if kv == "fp8_ds_mla":
            return layers * 656
        return layers * (model.mla_head_size or 0) * kv_dtype_bytes(model, kv, dtype)
    heads_per_gpu = max(1, model.num_kv_heads // tp)
    return 2 * layers * heads_per_gpu * model.head_dim * kv_dtype_bytes(model, kv, dtype)


def default_max_num_seqs(gpu: GpuInfo) -> int:
    """vLLM's default ``--max-num-seqs`` for this GPU (see :func:`memory.default_max_num_seqs`)."""
    return memory.default_max_num_seqs(gpu.memory_total_mib * MIB, gpu.name)


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f}"


def _holders(snapshot: HostSnapshot, index: int) -> str:
    procs = snapshot.processes_on(index)
    if not procs:
        return ""
    held = ", ".join(f"pid {p.pid} ({p.name}) {p.used_memory_mib} MiB" if p.used_memory_mib is not None
                     else f"pid {p.pid} ({p.name})" for p in procs)
    return f"; held by {held}"


def derived_max_model_len(model: ModelSpec) -> tuple[int | None, str]:
    """The longest ``max_model_len`` vLLM accepts without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, and
    the key it came from (``_get_and_verify_max_len``, ``vllm/config/model.py``, 0.19-0.32):
    ``max_position_embeddings``, times the RoPE scaling factor except for llama3/longrope/su."""
    config = model.config.get("text_config") or model.config
    base = model.max_position_embeddings
    if base is None:
        return None, "max_position_embeddings"
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if kind not in (None, "default", "su", "longrope", "llama3") and isinstance(factor, (int, float)) \
                and "original_max_position_embeddings" not in scaling:
            return int(base * factor), f"max_position_embeddings x rope_scaling.factor {factor:g}"
    return base, "max_position_embeddings"


def check_max_model_len(model: ModelSpec, max_model_len: int | None, *,
                        allow_long: bool = False) -> Verdict:
    """A ``max_model_len`` above the config's limit fails as vLLM's startup does, unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (then a warning)."""
    limit, key = derived_max_model_len(model)
    evidence = {"max_model_len": max_model_len, "derived_max_model_len": limit}
    if max_model_len is None or limit is None or max_model_len <= limit:
        shown = max_model_len if max_model_len is not None else limit
        return Verdict.passed(f"{model.name}: max_model_len {shown} is within the config's {key} ({limit})",
                              evidence=evidence, rule_set=MEMORY_RULES)
    message = (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
               f"({key}={limit} or model_max_length=None in model's config.json).")
    if allow_long:
        return Verdict.passed(f"{model.name}: {message} Allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                              evidence=evidence, rule_set=MEMORY_RULES,
                              warnings=(f"{model.name}: max_model_len {max_model_len} > {limit}: positions "
                                        "past the trained length lead to nan with RoPE",))
    return Verdict.failed(f"{model.name}: {message} To allow overriding this maximum, set the env var "
                          "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", evidence=evidence, rule_set=MEMORY_RULES)


def check_memory_fit(
    model: ModelSpec,
    snapshot: HostSnapshot,
    tp: int,
    gpus: Sequence[int] | None = None,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_dtype: str = "auto",
    *,
    vllm_version: VllmVersion | str | None = None,
    reserve_gib: float | None = None,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    ep: bool = False,
    dtype: str = "auto",
    quantization: str | None = None,
    enforce_eager: bool = False,
    max_num_batched_tokens: int | None = None,
    allow_long_max_model_len: bool = False,
    speculative: memory.SpeculativeSettings | None = None,
) -> Verdict:
    """Will the weights, vLLM's profile-run reserve and one full-length request's KV cache fit?

    The accounting is vLLM's own, per version (:mod:`pytest_gpuready.model.memory`): budget
    ``ceil(total x utilization)``, minus weights, the profile run's activation peak
    (max_num_batched_tokens forward, max_num_seqs sampler), non-torch memory (NCCL at TP/PP > 1)
    and, where that version counts it, CUDA-graph memory. Each term is in the details in GiB,
    saying whether it was read, derived or measured. Fails like vLLM's startup: ``Free memory on
    device ...`` when a GPU lacks the budget, ``No available memory for the cache blocks``, ``To serve
    at least one request ...``, or a max_model_len above the config's. ``reserve_gib`` replaces the
    model's non-weight terms by one fixed figure (the 0.1 behaviour). Sources: vllm-invariants.md §3.
    ``data_parallel_size`` engines of TP x PP GPUs each take ``gpus`` in order; every GPU is judged
    (a MoE model's experts are split over TP x DP ranks). What vLLM allocates after the KV cache
    (the sampler warm-up, CUDA graphs where not counted) must fit outside the budget, else it fails
    as vLLM does: ``CUDA out of memory occurred when warming up sampler with N dummy requests``. A
    vLLM version the accounting does not cover is *undecided*, naming the range it covers.
    ``speculative`` adds a draft's memory (:class:`memory.SpeculativeSettings`).
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if pipeline_parallel_size < 1:
        raise ValueError(f"pipeline_parallel_size must be >= 1, got {pipeline_parallel_size}")
    if data_parallel_size < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
    version = _version(vllm_version)
    present = snapshot.require_gpus()
    host = snapshot.host
    dp = data_parallel_size
    world = tp * pipeline_parallel_size * dp
    if gpus is None:
        selected = sorted(present, key=lambda g: g.index)[:world]
    else:
        selected = [snapshot.gpu(i) for i in gpus][:world]
    evidence: dict[str, Any] = {"host": host, "tp": tp, "pp": pipeline_parallel_size, "dp": dp,
                                "gpus": [g.index for g in selected],
                                "gpu_memory_utilization": gpu_memory_utilization}
    layout = ((f"DP={dp} " if dp > 1 else "") + f"TP={tp}"
              + (f" PP={pipeline_parallel_size}" if pipeline_parallel_size > 1 else ""))
    if len(selected) < world:
        have = ", ".join(str(g.index) for g in (present if gpus is None else selected)) or "none"
        return Verdict.failed(f"{layout} needs {world} GPUs; {host} offers {len(selected)} (GPUs {have})",
                              evidence=evidence, rule_set=MEMORY_RULES)
    length_verdict = check_max_model_len(model, max_model_len, allow_long=allow_long_max_model_len)
    if not length_verdict.ok:
        return length_verdict
    unmodelled = memory.unmodelled_reason(version)
    if unmodelled is not None:
        return Verdict.undecided(
            f"{model.name} at {layout}: memory fit undecided: {unmodelled}", evidence=evidence,
            needs=(f"a vLLM version from {memory.MODELLED_SINCE[0]}.{memory.MODELLED_SINCE[1]} to "
                   f"{memory.NEWEST_READ[0]}.{memory.NEWEST_READ[1]} (--vllm-version), the range the "
                   "memory accounting models"), rule_set=f"no memory rule set covers vLLM {version}")
    kv = effective_kv_cache_dtype(model, kv_cache_dtype, version)
    errors: list[str] = []
    warnings: list[str] = list(length_verdict.warnings)
    per_gpu: list[dict[str, Any]] = []
    smallest: GpuInfo = selected[0]
    for position, gpu in enumerate(selected):
        total = (gpu.memory_total_mib - (gpu.memory_reserved_mib or 0)) * MIB
        free = gpu.memory_free_mib * MIB
        requested = math.ceil(total * gpu_memory_utilization)
        per_gpu.append({"index": gpu.index, "total_bytes": total, "free_bytes": free,
                        "requested_bytes": requested})
        if total < (smallest.memory_total_mib - (smallest.memory_reserved_mib or 0)) * MIB:
            smallest = gpu
        if free < requested:
            errors.append(
                f"GPU {gpu.index}: Free memory on device cuda:{position} ({_gib(free)}/{_gib(total)} GiB) "
                f"on startup is less than desired GPU memory utilization ({gpu_memory_utilization}, "
                f"{_gib(requested)} GiB). Decrease GPU memory utilization or reduce GPU memory used "
                f"by other processes.{_holders(snapshot, gpu.index)}")
        elif free - requested < GIB:
            warnings.append(f"GPU {gpu.index}: only {(free - requested) // MIB} MiB free above the "
                            f"{gpu_memory_utilization} budget; a process starting now would break it")
    evidence["per_gpu"] = per_gpu
    if errors:
        return Verdict.failed(f"{model.name} at {layout}: {errors[0]}", details=tuple(errors[1:]),
                              evidence=evidence, rule_set=MEMORY_RULES)
    total_bytes = (smallest.memory_total_mib - (smallest.memory_reserved_mib or 0)) * MIB
    settings = memory.ServeSettings(
        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_dtype=kv.name, dtype=dtype, quantization=quantization, enforce_eager=enforce_eager,
        pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=dp, speculative=speculative)
    plan = memory_plan(model, total_bytes, tp, ep=ep, settings=settings, kv_cache_dtype=kv.name,
                       version=version, gpu_name=smallest.name, reserve_gib=reserve_gib)
    return memory_verdict(model, plan, layout, kv, evidence, warnings)


def memory_plan(model: ModelSpec, total_bytes: int, tp: int, *, ep: bool = False,
                settings: memory.ServeSettings | None = None, kv_cache_dtype: str = "auto",
                version: VllmVersion | None = None, gpu_name: str = "",
                reserve_gib: float | None = None) -> memory.MemoryPlan:
    """:func:`memory.plan_memory` with the KV dtype resolved as vLLM resolves it; ``reserve_gib``
    replaces the non-weight terms by one fixed figure."""
    kv = effective_kv_cache_dtype(model, kv_cache_dtype, version)
    served = settings.dtype if settings is not None else "auto"
    plan = memory.plan_memory(model, total_bytes, tp, ep=ep, settings=settings,
                              kv_dtype_bytes=kv_dtype_bytes(model, kv.name, served) if kv.name != "fp8_ds_mla" else 1,
                              fp8_ds_mla=kv.name == "fp8_ds_mla", version=version, gpu_name=gpu_name)
    if reserve_gib is None:
        return plan
    weights = plan.terms[0]
    reserve = memory.MemoryTerm("reserve", int(reserve_gib * GIB), "given", "reserve_gib replaces vLLM's "
                                "profile-run terms")
    kv_bytes = plan.budget_bytes - weights.bytes - reserve.bytes
    blocks = max(0, kv_bytes) // (plan.kv_bytes_per_token * KV_BLOCK_SIZE)
    return replace(plan, terms=(weights, reserve), kv_cache_bytes=max(0, kv_bytes),
                   kv_tokens=blocks * KV_BLOCK_SIZE, outside_budget=())


def _after_kv_failure(plan: memory.MemoryPlan) -> str | None:
    """vLLM's error when what it allocates after the KV cache (CUDA graphs where not counted, then
    the sampler warm-up) does not fit outside the budget; None when it fits."""
    headroom = plan.total_bytes - plan.budget_bytes
    graphs = sum(t.bytes for t in plan.outside_budget if t.name == "CUDA graphs")
    after = sum(t.bytes for t in plan.outside_budget)
    if after <= headroom:
        return None
    outside = ", ".join(f"{t.name} {_gib(t.bytes)} GiB" for t in plan.outside_budget)
    where = (f"after the KV cache vLLM allocates {outside} = {_gib(after)} GiB, more than the "
             f"{_gib(headroom)} GiB the gpu_memory_utilization budget leaves outside it")
    if graphs > headroom:
        return (f"CUDA out of memory while capturing CUDA graphs (gpu_model_runner.py:capture_model): {where}. "
                "Lower `gpu_memory_utilization` or pass --enforce-eager.")
    requests = min(plan.max_num_seqs, plan.max_num_batched_tokens)
    return (f"CUDA out of memory occurred when warming up sampler with {requests} dummy requests. "
            "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the "
            f"engine. ({where})")


def memory_verdict(model: ModelSpec, plan: memory.MemoryPlan, layout: str, kv: KvCacheDtype,
                   evidence: dict[str, Any], warnings: list[str]) -> Verdict:
    """Turn a :class:`memory.MemoryPlan` into the fit verdict, in vLLM's words when it does not fit."""
    length = plan.max_model_len
    tokens = plan.kv_tokens
    available = plan.kv_cache_bytes
    evidence.update({"weights_per_gpu_bytes": plan.terms[0].bytes, "budget_bytes": plan.budget_bytes,
                     "non_kv_bytes": plan.non_kv_bytes, "kv_cache_bytes": available,
                     "kv_cache_dtype": kv.name, "kv_bytes_per_token": plan.kv_bytes_per_token,
                     "kv_cache_tokens": tokens, "max_model_len": length, "max_num_seqs": plan.max_num_seqs,
                     "max_num_batched_tokens": plan.max_num_batched_tokens,
                     "terms": {t.name: {"bytes": t.bytes, "how": t.how} for t in plan.terms},
                     "weights_read_from": model.weights.read_from if model.weights else "derived from config.json"})
    details = [*plan.lines(), f"KV-cache dtype: {kv.reason}"]
    weights = model.weights or derived_weights_for(model)
    if not weights.from_headers:
        warnings.append(f"{model.name}: weights {weights.provenance()}")
    if available <= 0:
        return Verdict.failed(
            f"{model.name} at {layout}: No available memory for the cache blocks: "
            f"{_gib(plan.non_kv_bytes)} GiB of weights and profile-run memory per GPU exceed the "
            f"{_gib(plan.budget_bytes)} GiB budget. Try increasing `gpu_memory_utilization`, or use more GPUs.",
            details=tuple(details), evidence=evidence, warnings=tuple(warnings), rule_set=plan.rule_set)
    if length is None:
        return Verdict.failed(
            f"{model.name}: max_model_len is not given and the config has no "
            "max_position_embeddings; pass max_model_len", details=tuple(details), evidence=evidence,
            rule_set=plan.rule_set)
    concurrency = plan.max_concurrency or 0.0
    evidence["max_concurrency"] = concurrency
    details += [f"Maximum concurrency for {length:,} tokens per request: {concurrency:.2f}x",
                f"at max_num_seqs={plan.max_num_seqs} running together: {tokens // plan.max_num_seqs:,} tokens each"]
    if tokens < length:
        needed = length * plan.kv_bytes_per_token
        return Verdict.failed(
            f"{model.name} at {layout}: To serve at least one request with the models's max seq len "
            f"({length}), ({_gib(needed)} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({_gib(available)} GiB). Based on the available memory, the estimated "
            f"maximum model length is {tokens}. Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine.",
            details=tuple(details), evidence=evidence, warnings=tuple(warnings), rule_set=plan.rule_set)
    after_kv = _after_kv_failure(plan)
    if after_kv is not None:
        evidence["after_kv_cache_bytes"] = sum(t.bytes for t in plan.outside_budget)
        return Verdict.failed(f"{model.name} at {layout}: {after_kv}", details=tuple(details), evidence=evidence,
                              warnings=tuple(warnings), rule_set=plan.rule_set)
    if concurrency < 2:
        warnings.append(f"thin headroom: the KV cache holds {concurrency:.2f} requests of {length:,} tokens")
    return Verdict.passed(
        f"{model.name} fits at {layout}: {tokens:,} KV tokens, {concurrency:.2f} requests of "
        f"{length:,} tokens", details=tuple(details), evidence=evidence, warnings=tuple(warnings),
        rule_set=plan.rule_set)
