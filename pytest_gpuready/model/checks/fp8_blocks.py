"""FP8 block alignment: every TP shard of a block-quantized checkpoint holds whole weight blocks."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any

from pytest_gpuready.model.backends import (
    MIN_FP8_CAPABILITY,
    format_arch,
)
from pytest_gpuready.model.checks.common import (
    MERGED_MISMATCH_ALLOWED,
    REFINE_MIN_BLOCK,
    _capability,
    _layers_text,
    _version,
)
from pytest_gpuready.model.checks.tensor_parallel import check_tp_divisibility
from pytest_gpuready.model.linear_attention import attention_layers, gated_deltanet
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import (
    FP8_MOE_REFINEMENT,
    VllmVersion,
)
from pytest_gpuready.verdict import Verdict

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


@lru_cache(maxsize=64)
def _exclusions(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a module name is excluded, :func:`_matches` over ``patterns`` without the loop: a
    plain dotted pattern matches the name, a dotted prefix or a dotted suffix of it, and a plain
    word any of its parts, so those are set look-ups; wildcards and ``re:`` are tried in turn."""
    dotted, words, others = set(), set(), []
    for pattern in patterns:
        pat = _normalise(pattern)
        if pattern.startswith("re:") or any(ch in pat for ch in "*?["):
            others.append(pattern)
        elif "." in pat:
            dotted.add(pat)
        else:
            words.add(pat)

    def excluded(name: str) -> bool:
        parts = name.split(".")
        if words.intersection(parts):
            return True
        ends = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
        starts = (".".join(parts[i:]) for i in range(1, len(parts)))
        if any(end in dotted for end in ends) or any(start in dotted for start in starts):
            return True
        return any(_matches(p, name) for p in others)

    return excluded


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
    return list(_quantized_layers(patterns, module, tuple(layers)))


@lru_cache(maxsize=1024)
def _quantized_layers(patterns: tuple[str, ...], module: str, layers: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`quantized_layers`, kept: a ModelOpt checkpoint lists ~700 excluded modules, each
    matched against every layer's name, and the FP8 rule asks again for each TP it tries (the
    nearest that loads), so one layout cost seconds before this cache."""

    excluded = _exclusions(patterns)

    def skipped(i: int) -> bool:
        if excluded(f"model.layers.{i}.{module}"):
            return True
        return any(all(excluded(f"model.layers.{i}.{shard}") for shard in shards)
                   for shards in FUSED_SHARDS.get(module, ()))

    return tuple(i for i in layers if not skipped(i))


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


def _fp8_loads_for(model: ModelSpec) -> Callable[..., bool]:
    """:func:`_fp8_loads_now` for ``model``, its answers kept per model: every failing layout asks
    it for each TP around its own (the nearest that loads), and the matrix of layouts asks for the
    same TPs again. The weights' sizes play no part (and hold mappings, which cannot be a key)."""
    config_only = replace(model, weights=None) if model.weights is not None else model
    try:
        hash(config_only)
    except TypeError:  # a spec built by hand with a mapping in it: judged afresh
        return partial(_fp8_loads_now, model)
    return partial(_fp8_loads_kept, config_only)


def _fp8_loads_now(model: ModelSpec, tp: int, ep: bool, version: VllmVersion | None,
                   capability: tuple[int, int] | None, dp: int = 1) -> bool:
    if not check_tp_divisibility(model, tp, ep=ep).ok:
        return False
    parts = fp8_partitions(model, tp, ep, version, compute_capability=capability, dp=dp)
    return not any(p.error or p.needs for p in parts)


_fp8_loads_kept = lru_cache(maxsize=1 << 16)(_fp8_loads_now)


def _nearest_loading(model: ModelSpec, tp: int, ep: bool, version: VllmVersion | None,
                     capability: tuple[int, int] | None, dp: int = 1) -> list[int]:
    """The nearest TP below ``tp`` that loads, and the nearest above it (up to 2 x TP): at TP=3,
    ``[2, 4]`` where both load (not the first power of two below, which may be far)."""
    loads = _fp8_loads_for(model)
    below = next((t for t in range(tp - 1, 0, -1) if loads(t, ep, version, capability, dp)), None)
    above = next((t for t in range(tp + 1, 2 * tp + 1) if loads(t, ep, version, capability, dp)), None)
    return [t for t in (below, above) if t is not None]


def _alternatives(model: ModelSpec, tp: int, ep: bool, version: VllmVersion | None,
                  capability: tuple[int, int] | None, dp: int = 1) -> list[str]:
    options = []
    loads = _fp8_loads_for(model)
    nearest = _nearest_loading(model, tp, ep, version, capability, dp)
    if nearest:
        options.append(" or ".join(f"TP={t}" for t in nearest) + (" with --enable-expert-parallel" if ep else ""))
    if not ep and model.is_moe and loads(tp, True, version, capability, dp):
        options.append(f"TP={tp} with --enable-expert-parallel")
    if version is not None and not FP8_MOE_REFINEMENT.is_new(version):
        if loads(tp, ep, None, max(capability or MIN_FP8_CAPABILITY, MIN_FP8_CAPABILITY), dp):
            gpu = "" if capability is None or capability >= MIN_FP8_CAPABILITY else " on an SM89+ GPU"
            options.append(f"TP={tp} on vLLM >= 0.29{gpu} (re-grids the MoE block scales)")
    elif capability is not None and capability < MIN_FP8_CAPABILITY \
            and loads(tp, ep, version, MIN_FP8_CAPABILITY, dp):
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


