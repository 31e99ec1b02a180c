"""Checkpoint bytes from ``config.json`` alone, for planning before a 200-540 GB download.

The weights are a sum over the tensors the architecture implies (dense GQA, MoE with shared
experts, MLA), each stored at the quantization's bytes per weight plus its scales. The
tensor list follows the checkpoints' own names (``model.layers.N.self_attn.q_proj``, ...) and
the modules vLLM builds for them: ``LlamaForCausalLM``, ``DeepseekV2ForCausalLM`` (MLA, shared
experts, ``first_k_dense_replace``), ``MiniMaxM2ForCausalLM``, ``Qwen2MoeForCausalLM``.

When the directory has ``model.safetensors.index.json``, its ``metadata.total_size`` is the
authority for the total and this module only says how it splits (replicated on every TP rank,
and unused MTP layers). Every figure from here is labelled *derived* in the verdicts.

Bytes per weight, by quantization (the formats as their producers write them):

* unquantized: the config's ``torch_dtype`` (2 bytes for bf16/fp16, 4 for float32);
* ``fp8`` with ``weight_block_size [n, k]``: 1 byte, plus one float32 ``weight_scale_inv`` per
  ``n x k`` block; per-tensor fp8: 1 byte plus one float32 scale;
* ModelOpt / compressed-tensors NVFP4 (``group_size 16``): half a byte, plus one FP8 scale per
  16 weights and a float32 global scale per tensor;
* MXFP4 (gpt-oss): half a byte, plus one e8m0 scale byte per 32 weights;
* 4-bit integer (AWQ, GPTQ, compressed-tensors ``int4``): half a byte, plus a 16-bit scale and
  a 4-bit zero point per group (128 unless the config says otherwise);
* 8-bit (compressed-tensors ``float8``/``int8`` channel-wise): 1 byte plus a float32 scale
  per output row.

Embeddings, the LM head, norms and MoE routers stay in ``torch_dtype``, as do the modules a
config excludes (``ignored_layers``, ``modules_to_not_convert``, ``ignore``).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class DerivedTensor:
    """One weight matrix (or vector) the architecture implies."""

    name: str
    """Checkpoint-style name, e.g. ``model.layers.3.mlp.experts.gate_up``."""
    rows: int
    """Output features (the dimension column-parallel layers split)."""
    cols: int
    """Input features (1 for vectors such as norms and biases)."""
    count: int = 1
    """How many identical tensors (routed experts)."""
    linear: bool = True
    """A linear layer the quantization applies to (norms, embeddings, routers are not)."""
    replicated: bool = False
    """Held whole by every TP rank (norms, routers, MLA down-projections)."""
    unused: bool = False
    """A layer past ``num_hidden_layers`` (MTP / next-n), which vLLM does not load."""
    stored_bytes: int | None = None
    """Bytes per element when the checkpoint fixes them (float32 routing biases)."""

    @property
    def numel(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True)
class DerivedWeights:
    """Bytes of a checkpoint derived from its config, with the split the memory fit needs."""

    total_bytes: int
    replicated_bytes: int
    unused_bytes: int
    parameter_count: int
    """Weights in the checkpoint, counted as the model's parameters (not the packed elements)."""
    bytes_per_weight: str
    """How the quantized weights were sized, e.g. ``fp8 block [128, 128]: 1 byte + fp32 scale per block``."""
    routed_expert_bytes: int = 0
    """Bytes of the routed experts of the loaded layers: with data parallelism vLLM splits them over
    TP x DP ranks (``FusedMoEParallelConfig.make``) while the rest stays split over TP."""


def _dtype_bytes(config_dtype: str) -> int:
    return DTYPE_BYTES.get(config_dtype, 2)


def _int(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class LayerClass:
    """A run of decoder layers that imply the same tensors (only their names' layer number differs)."""

    first: int
    count: int
    moe: bool
    unused: bool


def layer_classes(spec: Any) -> tuple[LayerClass, ...]:
    """The model's layers as at most three runs: dense, MoE, and the unused MTP / next-n layers.

    The derivation is a sum over these runs, a representative layer times its count, so its cost
    does not grow with ``num_hidden_layers`` (:func:`derive_weights`).
    """
    dense = spec.dense_layer_count if spec.is_moe else spec.num_layers
    runs = [LayerClass(0, dense, False, False)]
    if spec.is_moe:
        runs.append(LayerClass(dense, spec.num_layers - dense, True, False))
    runs.append(LayerClass(spec.num_layers, spec.num_nextn_predict_layers, spec.is_moe, True))
    return tuple(run for run in runs if run.count > 0)


def model_tensors(spec: Any) -> Iterator[DerivedTensor]:
    """The tensors outside the decoder layers: embedding, LM head, final norm."""
    hidden, vocab = spec.hidden_size, spec.vocab_size
    yield DerivedTensor("model.embed_tokens", vocab, hidden, linear=False)
    if not spec.tie_word_embeddings:
        yield DerivedTensor("lm_head", vocab, hidden, linear=False)
    yield DerivedTensor("model.norm", hidden, 1, linear=False, replicated=True)


def layer_tensors(spec: Any, layer: int, moe_layer: bool, unused: bool) -> Iterator[DerivedTensor]:
    """The tensors of decoder layer ``layer``, named as the checkpoints name them."""
    config: Mapping[str, Any] = spec.config.get("text_config") or spec.config
    hidden = spec.hidden_size
    vocab = spec.vocab_size
    heads = spec.num_attention_heads
    attention_bias = bool(config.get("attention_bias")) or spec.text_model_type in ("qwen2", "qwen2_moe")
    prefix = f"model.layers.{layer}."
    yield from (_with_unused(t, unused) for t in _attention(spec, config, prefix, hidden, heads, attention_bias))
    yield DerivedTensor(prefix + "input_layernorm", hidden, 1, linear=False, replicated=True, unused=unused)
    yield DerivedTensor(prefix + "post_attention_layernorm", hidden, 1, linear=False, replicated=True,
                        unused=unused)
    if moe_layer:
        yield from (_with_unused(t, unused) for t in _moe(spec, config, prefix, hidden))
    elif spec.intermediate_size:
        width = spec.intermediate_size
        yield DerivedTensor(prefix + "mlp.gate_up_proj", 2 * width, hidden, unused=unused)
        yield DerivedTensor(prefix + "mlp.down_proj", hidden, width, unused=unused)
    if unused and spec.is_mla:
        # DeepSeek's MTP module: enorm, hnorm, eh_proj, its own embedding and head copies.
        yield DerivedTensor(prefix + "eh_proj", hidden, 2 * hidden, unused=True, linear=False)
        yield DerivedTensor(prefix + "enorm", 2 * hidden, 1, linear=False, unused=True)
        yield DerivedTensor(prefix + "embed_tokens", vocab, hidden, linear=False, unused=True)
        yield DerivedTensor(prefix + "shared_head.head", vocab, hidden, linear=False, unused=True)
        yield DerivedTensor(prefix + "shared_head.norm", hidden, 1, linear=False, unused=True)


def architecture_tensors(spec: Any) -> Iterator[DerivedTensor]:
    """Every weight tensor of the text model, layer by layer (for inspection and tests; the sizes
    come from :func:`derive_weights`, whose cost does not depend on the layer count).

    ``spec`` is a :class:`~pytest_gpuready.model.spec.ModelSpec` (typed loosely to keep this
    module free of an import cycle with spec.py).
    """
    yield from model_tensors(spec)
    for run in layer_classes(spec):
        for layer in range(run.first, run.first + run.count):
            yield from layer_tensors(spec, layer, run.moe, run.unused)


def _with_unused(tensor: DerivedTensor, unused: bool) -> DerivedTensor:
    if not unused:
        return tensor
    return DerivedTensor(tensor.name, tensor.rows, tensor.cols, tensor.count, tensor.linear,
                         tensor.replicated, True, tensor.stored_bytes)


def _attention(spec: Any, config: Mapping[str, Any], prefix: str, hidden: int, heads: int,
               bias: bool) -> Iterator[DerivedTensor]:
    attn = prefix + "self_attn."
    if spec.is_mla:
        rope = spec.qk_rope_head_dim or 0
        nope = spec.qk_nope_head_dim or 0
        v_dim = spec.v_head_dim or 0
        q_width = heads * (nope + rope)
        if spec.q_lora_rank:
            yield DerivedTensor(attn + "q_a_proj", spec.q_lora_rank, hidden, replicated=True)
            yield DerivedTensor(attn + "q_a_layernorm", spec.q_lora_rank, 1, linear=False, replicated=True)
            yield DerivedTensor(attn + "q_b_proj", q_width, spec.q_lora_rank)
        else:
            yield DerivedTensor(attn + "q_proj", q_width, hidden)
        kv_lora = spec.kv_lora_rank or 0
        yield DerivedTensor(attn + "kv_a_proj_with_mqa", kv_lora + rope, hidden, replicated=True)
        yield DerivedTensor(attn + "kv_a_layernorm", kv_lora, 1, linear=False, replicated=True)
        yield DerivedTensor(attn + "kv_b_proj", heads * (nope + v_dim), kv_lora)
        yield DerivedTensor(attn + "o_proj", hidden, heads * v_dim)
        return
    head_dim = spec.head_dim
    q_width, kv_width = heads * head_dim, spec.num_kv_heads * head_dim
    yield DerivedTensor(attn + "q_proj", q_width, hidden)
    yield DerivedTensor(attn + "k_proj", kv_width, hidden)
    yield DerivedTensor(attn + "v_proj", kv_width, hidden)
    if bias:
        yield DerivedTensor(attn + "qkv_bias", q_width + 2 * kv_width, 1, linear=False)
    yield DerivedTensor(attn + "o_proj", hidden, q_width)
    if config.get("use_qk_norm") or spec.text_model_type in ("qwen3", "qwen3_moe"):
        per_layer = config.get("qk_norm_type") == "per_layer"
        q_norm, k_norm = (q_width, kv_width) if per_layer else (head_dim, head_dim)
        yield DerivedTensor(attn + "q_norm", q_norm, 1, linear=False, replicated=not per_layer)
        yield DerivedTensor(attn + "k_norm", k_norm, 1, linear=False, replicated=not per_layer)


def _moe(spec: Any, config: Mapping[str, Any], prefix: str, hidden: int) -> Iterator[DerivedTensor]:
    experts = spec.num_experts
    width = spec.moe_intermediate_size or 0
    yield DerivedTensor(prefix + "mlp.gate", experts, hidden, linear=False, replicated=True)
    if config.get("topk_method") == "noaux_tc" or config.get("use_routing_bias"):
        yield DerivedTensor(prefix + "mlp.gate.e_score_correction_bias", experts, 1, linear=False,
                            replicated=True, stored_bytes=4)
    yield DerivedTensor(prefix + "mlp.experts.gate_up_proj", 2 * width, hidden, count=experts)
    yield DerivedTensor(prefix + "mlp.experts.down_proj", hidden, width, count=experts)
    shared = spec.shared_expert_intermediate_size
    if shared:
        yield DerivedTensor(prefix + "mlp.shared_experts.gate_up_proj", 2 * shared, hidden)
        yield DerivedTensor(prefix + "mlp.shared_experts.down_proj", hidden, shared)
        if spec.text_model_type in ("qwen2_moe", "qwen3_next"):
            yield DerivedTensor(prefix + "mlp.shared_expert_gate", 1, hidden, linear=False, replicated=True)


# ---------------------------------------------------------------- bytes per weight

@dataclass(frozen=True)
class _Format:
    """How one quantized linear weight is stored: bytes for its elements and its scales."""

    label: str
    weight_bits: int
    block: tuple[int, int] | None = None
    """FP8 block [n, k]: one float32 scale per block."""
    group: int | None = None
    """Group quantization: a scale (and maybe a zero point) per ``group`` input elements."""
    group_scale_bytes: float = 0.0
    per_row_scale_bytes: int = 0
    per_tensor_bytes: int = 0

    def bytes_for(self, tensor: DerivedTensor) -> int:
        rows, cols = tensor.rows, tensor.cols
        total = math.ceil(rows * cols * self.weight_bits / 8)
        if self.block is not None:
            total += math.ceil(rows / self.block[0]) * math.ceil(cols / self.block[1]) * 4
        if self.group:
            total += math.ceil(rows * math.ceil(cols / self.group) * self.group_scale_bytes)
        total += rows * self.per_row_scale_bytes + self.per_tensor_bytes
        return total * tensor.count


def _weight_format(quant: Any) -> _Format | None:
    """The storage format of the quantized linear layers, or None when unquantized."""
    if quant is None:
        return None
    method = quant.method
    algo = (quant.algo or "").lower()
    if method == "fp8":
        if quant.weight_block_size:
            n, k = quant.weight_block_size
            return _Format(f"fp8 block [{n}, {k}]: 1 byte + a float32 scale per block", 8, block=(n, k))
        return _Format("fp8 per tensor: 1 byte + a float32 scale", 8, per_tensor_bytes=8)
    if method == "mxfp4":
        # gpt-oss: each expert weight as 4-bit ``*_blocks`` and one e8m0 ``*_scales`` byte per 32
        # (OCP MX); attention, router and embeddings stay 16-bit (``modules_to_not_convert``).
        return _Format("mxfp4: 1/2 byte + an e8m0 scale per 32 weights", 4, group=32, group_scale_bytes=1.0)
    if method in ("modelopt_fp4",) or "fp4" in algo or algo == "float4":
        return _Format("nvfp4: 1/2 byte + an fp8 scale per 16 weights", 4, group=16,
                       group_scale_bytes=1.0, per_tensor_bytes=8)
    if method.startswith("modelopt"):
        return _Format("modelopt fp8: 1 byte + a float32 scale", 8, per_tensor_bytes=8)
    if method == "compressed-tensors":
        if quant.weight_block_size:
            n, k = quant.weight_block_size
            return _Format(f"fp8 block [{n}, {k}]: 1 byte + a float32 scale per block", 8, block=(n, k))
        if algo in ("float8", "int8"):
            return _Format(f"{algo} channel-wise: 1 byte + a float32 scale per row", 8, per_row_scale_bytes=4)
        return _Format("int4 group 128: 1/2 byte + a 16-bit scale per 128", 4, group=128, group_scale_bytes=2.0)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        return _Format(f"{method} 4-bit group 128: 1/2 byte + a 16-bit scale and 4-bit zero per 128", 4,
                       group=128, group_scale_bytes=2.5)
    return None


def _excluded(patterns: tuple[str, ...], name: str) -> bool:
    if not patterns:
        return False
    variants = (name, "language_model." + name, "model.language_model." + name.removeprefix("model."))
    for pattern in patterns:
        if pattern.startswith("re:"):
            if any(re.match(pattern[3:], v) for v in variants):
                return True
            continue
        if any(ch in pattern for ch in "*?["):
            # A glob names a module or any tensor under it ("model.layers.*.self_attn" in gpt-oss).
            if any(fnmatch.fnmatchcase(v, p) for v in variants for p in (pattern, "*." + pattern, pattern + ".*")):
                return True
            continue
        if "." not in pattern:
            if pattern in name.split("."):
                return True
            continue
        if any(v == pattern or v.startswith(pattern + ".") or v.endswith("." + pattern) for v in variants):
            return True
    return False


def _layer_independent(patterns: tuple[str, ...]) -> bool:
    """Whether ``patterns`` exclude the same tensors of every layer: plain module names without a
    digit (``lm_head``, ``mlp.gate``, ``self_attn``) can only match a layer's tensor by a part of its
    name that is the same in every layer; a glob, a regex or a name with a layer number may not."""
    return all(not p.startswith("re:") and not any(ch in p for ch in "*?[") and not any(ch.isdigit() for ch in p)
               for p in patterns)


@dataclass
class _Sums:
    total: int = 0
    replicated: int = 0
    unused: int = 0
    params: int = 0
    experts: int = 0

    def add(self, tensor: DerivedTensor, size: int, times: int = 1) -> None:
        self.total += size * times
        self.params += tensor.numel * times
        if tensor.unused:
            self.unused += size * times
        elif tensor.replicated:
            self.replicated += size * times
        elif ".mlp.experts." in tensor.name:
            self.experts += size * times


def derive_weights(spec: Any) -> DerivedWeights:
    """Size the checkpoint from ``spec``'s architecture and quantization (see the module doc).

    In closed form: each run of like layers (:func:`layer_classes`) is one representative layer
    times its count, so a config's ``num_hidden_layers`` costs nothing; only exclusion patterns
    that may tell layers apart (a glob, a regex, a layer number) are matched layer by layer.
    """
    fmt = _weight_format(spec.quantization)
    excluded = spec.quantization.excluded_modules if spec.quantization else ()
    plain = _dtype_bytes(spec.torch_dtype)
    sums = _Sums()

    def size_of(tensor: DerivedTensor) -> int:
        quantized = fmt is not None and tensor.linear and not _excluded(excluded, tensor.name)
        plain_size = tensor.numel * (tensor.stored_bytes or plain)
        return fmt.bytes_for(tensor) if quantized and fmt is not None else plain_size

    for tensor in model_tensors(spec):
        sums.add(tensor, size_of(tensor))
    per_layer = not _layer_independent(excluded)
    for run in layer_classes(spec):
        layers = range(run.first, run.first + run.count) if per_layer else (run.first,)
        times = 1 if per_layer else run.count
        for layer in layers:
            for tensor in layer_tensors(spec, layer, run.moe, run.unused):
                sums.add(tensor, size_of(tensor), times)
    label = fmt.label if fmt else f"{spec.torch_dtype}: {plain} bytes per weight"
    return DerivedWeights(sums.total, sums.replicated, sums.unused, sums.params, label, sums.experts)
