"""What a checkpoint is, read from its files: :class:`ModelSpec`.

The load-time rules vLLM enforces (FP8 block alignment, TP divisibility, MLA backends, KV-cache
size) are arithmetic on a handful of ``config.json`` numbers plus the quantization config and
the weight sizes. This module reads exactly those, once, into typed data, so the checks in
:mod:`pytest_gpuready.model.checks` stay pure and every rule can be tested with a public
config and no weights.

Key names differ between model families; each one read here is listed with the family that
uses it, and where vLLM reads it (see ``shared/reference/vllm-invariants.md`` §1-2, §5).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gpuready.errors import ConfigError, excerpt
from pytest_gpuready.files import loads_json
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.model.derived_weights import derive_weights
from pytest_gpuready.model.safetensors_headers import ModelFiles, inspect_files, inspect_files_remote

MLA_MODEL_TYPES = frozenset({
    "AXK1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "glm_moe_dsa",
    "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash",
    "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid",
})
"""Text-config model types vLLM runs with MLA when ``kv_lora_rank`` is set
(``vllm/transformers_utils/model_arch_config_convertor.py`` ``is_deepseek_mla``, 0.17.0:L232-251)."""

_REPLICATED_RE = re.compile(
    r"(norm\.|norm$|layernorm|\.gate\.weight$|\.gate\.e_score_correction_bias$|e_score_correction_bias"
    r"|kv_a_proj_with_mqa|q_a_proj)"
)
"""Tensors every TP rank holds in full: norms, MoE routers, MLA down-projections."""


@dataclass(frozen=True)
class Quantization:
    """How the checkpoint is quantized, as vLLM will read it."""

    method: str
    """``quant_method``: fp8, compressed-tensors, modelopt, modelopt_fp4, awq, ..."""
    source: str
    """The file (and key) it came from."""
    algo: str | None = None
    """ModelOpt ``quant_algo`` (NVFP4, FP8) or the compressed-tensors weight type."""
    weight_block_size: tuple[int, int] | None = None
    """``[block_n, block_k]``: fp8 ``weight_block_size`` or compressed-tensors ``block_structure``."""
    activation_scheme: str | None = None
    excluded_modules: tuple[str, ...] = ()
    kv_cache_dtype: str | None = None
    """The KV-cache dtype this checkpoint makes ``--kv-cache-dtype auto`` resolve to (vLLM's name)."""
    kv_cache_source: str | None = None
    layer_algos: tuple[str, ...] = ()
    """ModelOpt ``MIXED_PRECISION``: the ``quant_algo`` of each entry of ``quantized_layers``
    (DeepSeek-V4-Flash-NVFP4 keeps NVFP4 experts beside 16-bit attention), distinct, in order."""

    @property
    def is_fp8_block(self) -> bool:
        return self.weight_block_size is not None

    def describe(self) -> str:
        parts = [self.method]
        if self.algo:
            parts.append(self.algo)
        if self.weight_block_size:
            parts.append(f"block {list(self.weight_block_size)}")
        return " ".join(parts)


HEADERS = "safetensors headers"
INDEX_TOTAL = "index metadata.total_size"
DERIVED = "derived from config.json"


@dataclass(frozen=True)
class Weights:
    """Sizes from the safetensors headers, and what is wrong with the files."""

    total_bytes: int
    bytes_by_dtype: Mapping[str, int]
    parameter_count: int
    tensor_count: int
    shard_count: int
    problems: tuple[str, ...]
    replicated_bytes: int = 0
    """Bytes every TP rank holds in full (norms, routers, MLA down-projections)."""
    unused_bytes: int = 0
    """Bytes of layers past ``num_hidden_layers`` (MTP / next-n heads), which vLLM does not load."""
    index_name: str | None = None
    read_from: str = HEADERS
    """Where the sizes come from: the safetensors headers, the index's ``metadata.total_size``
    (split derived from the config), or the config alone (``derived_weights``)."""
    bytes_per_weight: str | None = None
    """For derived sizes: how the quantized weights were sized."""
    unreadable_shards: int = 0
    """Shards whose headers could not be read: their sizes are missing from the totals."""

    @property
    def complete(self) -> bool:
        """Every shard read and sound. Never for derived sizes: an estimate is not a checkpoint."""
        return self.from_headers and not self.problems

    @property
    def sized(self) -> bool:
        """The totals cover the whole checkpoint (read or derived), not only its readable shards."""
        return self.unreadable_shards == 0

    @property
    def from_headers(self) -> bool:
        """True when every size was read from the checkpoint's own safetensors headers."""
        return self.read_from == HEADERS

    def provenance(self) -> str:
        """One phrase for verdicts: where the weight figure comes from."""
        if self.from_headers:
            return "read from the safetensors headers"
        if self.read_from == INDEX_TOTAL:
            return (f"read from {self.index_name or 'the index'} metadata.total_size; the TP split is "
                    "derived from config.json")
        return f"derived from config.json ({self.bytes_per_weight}), not read from weights"

    def per_gpu_bytes(self, tp: int) -> int:
        """Weights one GPU holds at TP=tp (or TP=tp with EP: experts are split the same way)."""
        loaded = self.total_bytes - self.unused_bytes
        sharded = max(0, loaded - self.replicated_bytes)
        return sharded // max(1, tp) + self.replicated_bytes


@dataclass(frozen=True)
class ModelSpec:
    """A model's architecture, quantization and weights: everything the checks need."""

    name: str
    source: str
    model_type: str
    text_model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int | None = None
    """Dense MLP width (None when every layer is MoE and the key means the expert width)."""
    moe_intermediate_size: int | None = None
    """Routed-expert FFN width: ``moe_intermediate_size``, or ``intermediate_size`` for MiniMax-M2
    and Mixtral-style configs (``vllm/model_executor/models/minimax_m2.py`` 0.17.0:L99-105)."""
    expert_ffn_key: str | None = None
    num_experts: int = 0
    num_experts_per_tok: int | None = None
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    """Total width of the shared-expert MLP, TP-sharded even with expert parallelism."""
    first_k_dense_replace: int = 0
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    index_topk: int | None = None
    """Set for sparse-attention MLA models (DeepSeek-V3.2): they need sparse MLA backends."""
    max_position_embeddings: int | None = None
    num_nextn_predict_layers: int = 0
    torch_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    quantization: Quantization | None = None
    weights: Weights | None = None
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.moe_intermediate_size is not None

    @property
    def is_mla(self) -> bool:
        """vLLM's test: text model type in its MLA list and ``kv_lora_rank`` set."""
        return self.kv_lora_rank is not None and self.text_model_type in MLA_MODEL_TYPES

    @property
    def is_sparse_mla(self) -> bool:
        return self.is_mla and self.index_topk is not None

    @property
    def mla_head_size(self) -> int | None:
        """``kv_lora_rank + qk_rope_head_dim`` (576 for DeepSeek-V3 and Kimi-K2)."""
        if not self.is_mla:
            return None
        return (self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0)

    @property
    def dense_layer_count(self) -> int:
        if not self.is_moe:
            return self.num_layers
        return min(self.first_k_dense_replace, self.num_layers) if self.intermediate_size else 0

    @property
    def moe_layer_count(self) -> int:
        return self.num_layers - self.dense_layer_count if self.is_moe else 0

    @property
    def attention_output_size(self) -> int:
        """Input width of ``o_proj`` (row-parallel): heads x v_head_dim for MLA, heads x head_dim else."""
        if self.is_mla and self.v_head_dim is not None:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.head_dim

    def describe(self) -> str:
        kind = "MLA" if self.is_mla else "GQA"
        moe = f", MoE {self.num_experts} experts x {self.moe_intermediate_size}" if self.is_moe else ""
        quant = self.quantization.describe() if self.quantization else "unquantized"
        return f"{self.name} ({self.text_model_type}, {self.num_layers} layers, {kind}{moe}, {quant})"


_WIDTH = 1 << 20
SIZE_LIMITS: Mapping[str, int] = {
    "num_hidden_layers": 1024,            # the deepest released LLMs have under 200
    "num_nextn_predict_layers": 64,       # DeepSeek-V3 / GLM: 1
    "first_k_dense_replace": 1024,
    "hidden_size": 1 << 17,               # the widest: 18432 (Nemotron-4 340B)
    "num_attention_heads": 1 << 12,       # DeepSeek-V3: 128
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,                  # 64-256; MLA's 576 is kv_lora_rank + rope
    "vocab_size": 1 << 22,                # the largest: 262144 (Gemma 3)
    "intermediate_size": _WIDTH,          # the widest: 73728 (Nemotron-4 340B)
    "moe_intermediate_size": _WIDTH,
    "shared_expert_intermediate_size": _WIDTH,
    "shared_intermediate_size": _WIDTH,
    "n_routed_experts": 1 << 16,          # Kimi-K2: 384
    "num_experts": 1 << 16,
    "num_local_experts": 1 << 16,
    "n_shared_experts": 1 << 10,
    "num_experts_per_tok": 1 << 16,
    "kv_lora_rank": 1 << 16,              # DeepSeek-V3: 512
    "q_lora_rank": 1 << 16,
    "qk_rope_head_dim": 1 << 16,
    "qk_nope_head_dim": 1 << 16,
    "v_head_dim": 1 << 16,
    "index_topk": 1 << 24,
    "max_position_embeddings": 1 << 34,   # the longest declared: 10M tokens (Llama 4 Scout)
}
"""The largest value each size key of a config may have: orders of magnitude above every released
model, so a real config always passes, and a typo or a hostile config (``num_hidden_layers:
1000000000000000000``) is a one-line error instead of a plan of absurd figures."""


class _Keys:
    """Typed access to one config object, with one-line errors naming file, key and expectation."""

    def __init__(self, data: Mapping[str, Any], file: str, prefix: str = "",
                 fallback: Mapping[str, Any] | None = None) -> None:
        self.data = data
        self.file = file
        self.prefix = prefix
        self.fallback = fallback or {}

    def _lookup(self, key: str) -> tuple[Any, str]:
        if key in self.data:
            return self.data[key], f"{self.prefix}{key}"
        return self.fallback.get(key), key

    def error(self, key: str, value: Any, expected: str) -> ConfigError:
        if value is None:
            return ConfigError(f"{self.file}: key '{key}' is missing; expected {expected}")
        return ConfigError(f"{self.file}: key '{key}' is {_json_excerpt(value)}; expected {expected}")

    def integer(self, key: str, *, required: bool = False, minimum: int = 0,
            meaning: str = "") -> int | None:
        value, shown = self._lookup(key)
        expected = f"a whole number >= {minimum}" + (f" ({meaning})" if meaning else "")
        if value is None:
            if required:
                raise self.error(shown if key in self.data else f"{self.prefix}{key}", None, expected)
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(shown, value, expected)
        maximum = SIZE_LIMITS.get(key)
        if maximum is not None and value > maximum:
            raise self.error(shown, value, f"a whole number from {minimum} to {maximum} ("
                             + (f"{meaning}; " if meaning else "") + "no model has more)")
        return value

    def req(self, key: str, *, minimum: int = 1, meaning: str = "") -> int:
        value = self.integer(key, required=True, minimum=minimum, meaning=meaning)
        assert value is not None
        return value

    def text(self, key: str) -> str | None:
        value, shown = self._lookup(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(shown, value, "a string")
        return value

    def flag(self, key: str) -> bool | None:
        value, shown = self._lookup(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(shown, value, "true or false")
        return value


LLAMA4_MODEL_TYPES = frozenset({"llama4", "llama4_text"})
"""Text model types whose MoE layers carry an implicit shared expert (no config key names it)."""


def model_spec_from_config(
    config: Mapping[str, Any],
    *,
    name: str | None = None,
    source: str = "config.json",
    hf_quant_config: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json`` (no weights needed).

    Architecture keys are read from ``text_config`` when there is one (multimodal wrappers such
    as Kimi-K2.5), falling back to the top level; the quantization config is read from the top
    level first, as vLLM does. ``source`` names the file in error messages.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: expected a JSON object, got {type(config).__name__}")
    top = _Keys(config, source)
    text_config = config.get("text_config")
    if text_config is not None and not isinstance(text_config, Mapping):
        raise top.error("text_config", text_config, "an object with the language model's config")
    keys = _Keys(text_config, source, "text_config.", fallback=config) if text_config else top

    model_type = top.text("model_type") or ""
    text_model_type = (keys.text("model_type") if text_config else None) or model_type
    architectures = config.get("architectures") or (text_config or {}).get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise top.error("architectures", architectures, "a list of class names")

    num_layers = keys.req("num_hidden_layers", meaning="the number of transformer layers")
    hidden = keys.req("hidden_size", meaning="the model width")
    heads = keys.req("num_attention_heads", meaning="query heads")
    kv_heads = keys.integer("num_key_value_heads", minimum=1) or heads
    head_dim = keys.integer("head_dim", minimum=1)
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"{source}: key '{keys.prefix}head_dim' is missing and hidden_size "
                              f"{hidden} is not a multiple of num_attention_heads {heads}; "
                              "expected an explicit head_dim")
        head_dim = hidden // heads
    vocab = keys.req("vocab_size", meaning="tokenizer vocabulary size")

    experts_key = next((k for k in ("n_routed_experts", "num_experts", "num_local_experts")
                        if keys.integer(k)), None)
    experts = (keys.integer(experts_key) or 0) if experts_key else 0
    moe_i = keys.integer("moe_intermediate_size", minimum=1)
    dense_i = keys.integer("intermediate_size", minimum=1)
    expert_key: str | None = None
    if experts and moe_i is not None:
        expert_key = "moe_intermediate_size"
    elif experts and experts_key == "num_local_experts":
        # MiniMax-M2 / Mixtral: every layer is MoE and intermediate_size is the expert width.
        if dense_i is None:
            raise ConfigError(f"{source}: the config has {experts} experts (num_local_experts) but "
                              f"key '{keys.prefix}intermediate_size' is missing; expected the expert "
                              "FFN width (MiniMax-M2 and Mixtral configs keep it there)")
        moe_i, dense_i, expert_key = dense_i, None, "intermediate_size"
    elif experts:
        raise ConfigError(f"{source}: the config has {experts} experts ({experts_key}) but key "
                          f"'{keys.prefix}moe_intermediate_size' is missing; expected the "
                          "expert FFN width")
    else:
        moe_i = None

    shared = keys.integer("n_shared_experts") or 0
    shared_width = 0
    if shared and moe_i:
        shared_width = shared * moe_i
    for width_key in ("shared_expert_intermediate_size", "shared_intermediate_size"):
        width = keys.integer(width_key)
        if width:
            shared_width = width
            shared = shared or 1
    if experts and not shared_width and text_model_type in LLAMA4_MODEL_TYPES:
        # Llama 4 spells its shared expert no other way than the architecture: every MoE layer
        # holds one ``shared_expert`` MLP of ``intermediate_size`` beside the routed experts
        # (vllm/model_executor/models/llama4.py: Llama4MoE). Scout at TP=4 logs 53.12 GiB.
        shared_width, shared = moe_i or 0, 1

    kv_lora = keys.integer("kv_lora_rank", minimum=1)
    spec = ModelSpec(
        name=name or str(config.get("_name_or_path") or "") or model_type or "model",
        source=source,
        model_type=model_type,
        text_model_type=text_model_type,
        architectures=tuple(architectures),
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=dense_i,
        moe_intermediate_size=moe_i,
        expert_ffn_key=expert_key,
        num_experts=experts,
        num_experts_per_tok=keys.integer("num_experts_per_tok"),
        num_shared_experts=shared,
        shared_expert_intermediate_size=shared_width,
        first_k_dense_replace=keys.integer("first_k_dense_replace") or 0,
        kv_lora_rank=kv_lora,
        q_lora_rank=keys.integer("q_lora_rank", minimum=1),
        qk_rope_head_dim=keys.integer("qk_rope_head_dim"),
        qk_nope_head_dim=keys.integer("qk_nope_head_dim"),
        v_head_dim=keys.integer("v_head_dim", minimum=1),
        index_topk=keys.integer("index_topk", minimum=1),
        max_position_embeddings=keys.integer("max_position_embeddings", minimum=1),
        num_nextn_predict_layers=keys.integer("num_nextn_predict_layers") or 0,
        torch_dtype=keys.text("torch_dtype") or keys.text("dtype") or "bfloat16",
        tie_word_embeddings=bool(keys.flag("tie_word_embeddings")),
        quantization=parse_quantization(config, source, text_config, hf_quant_config),
        config=config,
    )
    if spec.kv_lora_rank is not None and spec.qk_rope_head_dim is None and spec.is_mla:
        raise ConfigError(f"{source}: key '{keys.prefix}qk_rope_head_dim' is missing; expected a "
                          "whole number (MLA models need it with kv_lora_rank)")
    return spec


# ---------------------------------------------------------------- quantization

def _block(value: Any, file: str, key: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ConfigError(f"{file}: key '{key}' is {_json_excerpt(value)}; expected [block_n, block_k], "
                          "two whole numbers > 0 (vLLM: the quantization block size of weight must "
                          "have 2 dimensions)")
    return (value[0], value[1])


def _string_list(value: Any, file: str, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{file}: key '{key}' is {_json_excerpt(value)}; expected a list of module names")
    return tuple(value)


def kv_dtype_from_modelopt(value: Any) -> str | None:
    """ModelOpt's KV request -> vLLM's cache dtype name (``get_kv_cache_quant_algo_string`` and
    ``MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP`` in ``vllm/utils/torch_utils.py`` 0.17.0:L262-342)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if value.get("type") == "float" and value.get("num_bits") == 8:
            return "fp8_e4m3"
        if value.get("type") == "float" and value.get("num_bits") == 4:
            return "nvfp4"
        return None
    if isinstance(value, str):
        lowered = value.lower()
        return {"fp8": "fp8_e4m3"}.get(lowered, lowered)
    return None


def parse_quantization(
    config: Mapping[str, Any],
    source: str = "config.json",
    text_config: Mapping[str, Any] | None = None,
    hf_quant_config: Mapping[str, Any] | None = None,
) -> Quantization | None:
    """Read ``quantization_config`` (or, when absent, the legacy ``hf_quant_config.json``)."""
    qc = config.get("quantization_config")
    key_prefix = "quantization_config"
    if qc is None and text_config is not None:
        qc = text_config.get("quantization_config")
        key_prefix = "text_config.quantization_config"
    if qc is None:
        if hf_quant_config is not None:
            return _parse_legacy_modelopt(hf_quant_config)
        return None
    if not isinstance(qc, Mapping):
        raise ConfigError(f"{source}: key '{key_prefix}' is {_json_excerpt(qc)}; expected an object")
    method = qc.get("quant_method")
    if not isinstance(method, str) or not method:
        raise ConfigError(f"{source}: key '{key_prefix}.quant_method' is "
                          f"{'missing' if method is None else _json_excerpt(method)}; expected a string "
                          "such as fp8, compressed-tensors or modelopt")
    where = f"{source} {key_prefix}"
    if method == "fp8":
        ignored = _string_list(qc.get("ignored_layers"), source, f"{key_prefix}.ignored_layers")
        not_convert = _string_list(qc.get("modules_to_not_convert"), source,
                                   f"{key_prefix}.modules_to_not_convert")
        return Quantization(
            method=method, source=where, algo=qc.get("fmt") if isinstance(qc.get("fmt"), str) else None,
            weight_block_size=_block(qc.get("weight_block_size"), source, f"{key_prefix}.weight_block_size"),
            activation_scheme=qc.get("activation_scheme") if isinstance(qc.get("activation_scheme"), str) else None,
            excluded_modules=ignored + not_convert,
        )
    if method == "compressed-tensors":
        return _parse_compressed_tensors(qc, source, key_prefix)
    if method.startswith("modelopt"):
        nested = qc.get("quantization")
        inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else {}
        kv_value = inner.get("kv_cache_scheme") or qc.get("kv_cache_scheme") or qc.get("kv_cache_quant_algo")
        kv_key = ("kv_cache_scheme" if (inner.get("kv_cache_scheme") or qc.get("kv_cache_scheme"))
                  else "kv_cache_quant_algo")
        kv_dtype = kv_dtype_from_modelopt(kv_value)
        algo = qc.get("quant_algo") or inner.get("quant_algo")
        excluded = (_string_list(qc.get("ignore"), source, f"{key_prefix}.ignore")
                    + _string_list(qc.get("exclude_modules"), source, f"{key_prefix}.exclude_modules"))
        return Quantization(
            method=method, source=where, algo=algo if isinstance(algo, str) else None,
            layer_algos=_layer_algos(qc.get("quantized_layers") or inner.get("quantized_layers")),
            excluded_modules=excluded, kv_cache_dtype=kv_dtype,
            kv_cache_source=f"{where}.{kv_key} (ModelOpt)" if kv_dtype else None,
        )
    # mxfp4 (gpt-oss), awq, gptq, ...: the modules they leave in 16-bit.
    return Quantization(method=method, source=where, excluded_modules=_string_list(
        qc.get("modules_to_not_convert"), source, f"{key_prefix}.modules_to_not_convert"))


def _parse_compressed_tensors(qc: Mapping[str, Any], source: str, key_prefix: str) -> Quantization:
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise ConfigError(f"{source}: key '{key_prefix}.config_groups' is not an object; "
                          "expected group name -> scheme")
    block = None
    algo = None
    for group_name, group in groups.items():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        if algo is None and weights.get("type") and weights.get("num_bits"):
            algo = f"{weights.get('type')}{weights.get('num_bits')}"
        found = _block(weights.get("block_structure"), source,
                       f"{key_prefix}.config_groups.{group_name}.weights.block_structure")
        if found is not None and block is None:
            block = found
    kv_scheme = qc.get("kv_cache_scheme")
    kv_dtype = "fp8" if isinstance(kv_scheme, Mapping) else None
    return Quantization(
        method="compressed-tensors", source=f"{source} {key_prefix}", algo=algo,
        weight_block_size=block,
        excluded_modules=_string_list(qc.get("ignore"), source, f"{key_prefix}.ignore"),
        kv_cache_dtype=kv_dtype,
        kv_cache_source=f"{source} {key_prefix}.kv_cache_scheme (compressed-tensors)" if kv_dtype else None,
    )


def _layer_algos(layers: Any) -> tuple[str, ...]:
    """The distinct ``quant_algo`` values of a ModelOpt ``quantized_layers`` map (else none)."""
    if not isinstance(layers, Mapping):
        return ()
    found = [entry.get("quant_algo") for entry in layers.values() if isinstance(entry, Mapping)]
    return tuple(dict.fromkeys(a for a in found if isinstance(a, str)))


def _parse_legacy_modelopt(hf_quant: Mapping[str, Any]) -> Quantization:
    file = "hf_quant_config.json"
    inner = hf_quant.get("quantization")
    if not isinstance(inner, Mapping):
        raise ConfigError(f"{file}: key 'quantization' is "
                          f"{'missing' if inner is None else _json_excerpt(inner)}; expected an object "
                          "with quant_algo and kv_cache_quant_algo")
    algo = inner.get("quant_algo")
    if not isinstance(algo, str):
        raise ConfigError(f"{file}: key 'quantization.quant_algo' is "
                          f"{'missing' if algo is None else _json_excerpt(algo)}; "
                          "expected a string such as FP8 or NVFP4")
    kv_dtype = kv_dtype_from_modelopt(inner.get("kv_cache_quant_algo"))
    method = "modelopt_fp4" if algo.upper() == "NVFP4" else "modelopt"
    return Quantization(
        method=method, source=file, algo=algo, layer_algos=_layer_algos(inner.get("quantized_layers")),
        excluded_modules=_string_list(inner.get("exclude_modules"), file, "quantization.exclude_modules"),
        kv_cache_dtype=kv_dtype,
        kv_cache_source=f"{file} quantization.kv_cache_quant_algo (ModelOpt, legacy)" if kv_dtype else None,
    )


# ---------------------------------------------------------------- files

def _load_json(text: str, file: str) -> Any:
    return loads_json(text, file)


def _json_excerpt(value: Any) -> str:
    """A value as JSON for a one-line message, cut at 120 characters."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError, TypeError):
        return excerpt(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _unused_prefixes(num_layers: int) -> tuple[str, ...]:
    """Name prefixes of the layers past ``num_layers`` (MTP / next-n heads sit right after them)."""
    return tuple(f"{root}layers.{i}." for i in range(num_layers, num_layers + 16)
                 for root in ("model.", "language_model.model.", "model.language_model."))


def weights_from_files(files: ModelFiles, num_layers: int) -> Weights | None:
    """Sum the headers into :class:`Weights`; None when the directory has no safetensors.

    Layers past ``num_layers`` (MTP / next-n heads) are counted as unused; norms, routers and MLA
    down-projections as replicated on every TP rank. One pass over ~100k names with C-level
    string tests; the regex only sees the few thousand names that are not routed experts.
    """
    if not files.has_weights and not files.weights_present:
        return None
    unused_prefixes = _unused_prefixes(num_layers)
    replicated = unused = 0
    for tensor_name, nbytes in files.sizes():
        if tensor_name.startswith(unused_prefixes):
            unused += nbytes
        elif ".experts." not in tensor_name and _REPLICATED_RE.search(tensor_name):
            replicated += nbytes
    return Weights(
        total_bytes=files.total_bytes,
        bytes_by_dtype=files.bytes_by_dtype(),
        parameter_count=files.parameter_count(),
        tensor_count=files.tensor_count,
        shard_count=len(files.shard_names),
        problems=files.problems,
        replicated_bytes=replicated,
        unused_bytes=unused,
        index_name=files.index_name,
        unreadable_shards=files.unreadable_shards,
    )


def derived_weights_for(spec: ModelSpec, index_total: int | None = None,
                        index_name: str | None = None) -> Weights:
    """Weights for a directory without safetensors files: the index's total when there is one,
    else the config-derived total; the replicated / unused split is always derived."""
    derived = derive_weights(spec)
    total = derived.total_bytes
    replicated, unused = derived.replicated_bytes, derived.unused_bytes
    read_from = DERIVED
    if index_total:
        scale = index_total / max(1, derived.total_bytes)
        total, replicated, unused = index_total, int(replicated * scale), int(unused * scale)
        read_from = INDEX_TOTAL
    return Weights(total_bytes=total, bytes_by_dtype={}, parameter_count=derived.parameter_count,
                   tensor_count=0, shard_count=0, problems=(), replicated_bytes=replicated,
                   unused_bytes=unused, index_name=index_name, read_from=read_from,
                   bytes_per_weight=derived.bytes_per_weight)


def spec_from_files(files: ModelFiles, where: str) -> ModelSpec:
    """Build the spec from a read model directory (``where`` names it in errors)."""
    for name, error in files.side_errors.items():
        raise ConfigError(f"{where}/{name}: {error}")
    config_text = files.side_files.get("config.json")
    if config_text is None:
        raise ConfigError(f"{where}/config.json: missing; expected the model's Hugging Face config")
    config = _load_json(config_text, f"{where}/config.json")
    hf_quant = None
    hf_quant_text = files.side_files.get("hf_quant_config.json")
    if hf_quant_text is not None:
        hf_quant = _load_json(hf_quant_text, f"{where}/hf_quant_config.json")
        if not isinstance(hf_quant, Mapping):
            raise ConfigError(f"{where}/hf_quant_config.json: expected a JSON object")
    name = os.path.basename(where.rstrip("/")) or where
    spec = model_spec_from_config(config, name=name, source=f"{where}/config.json",
                                  hf_quant_config=hf_quant)
    if files.shards or files.weights_present:
        # A weights file that is there but cannot be read is a problem of the checkpoint (named
        # in weights.problems), never a config-only directory.
        return replace(spec, weights=weights_from_files(files, spec.num_layers))
    # No weights file here (a config-only directory, perhaps with the index): plan from the
    # index's total_size or the architecture; such weights are an estimate, never complete. (A
    # broken index, a total_size that is no size included, is a weights file that cannot be read:
    # weights_present, above.)
    return replace(spec, weights=derived_weights_for(spec, files.index_total_size, files.index_name))


def inspect_model(path: str | os.PathLike[str], host: Host | None = None) -> ModelSpec:
    """Read a model directory (here, or on ``host`` in one round trip): config and headers only.

    Raises :class:`ConfigError` when the directory or its ``config.json`` is missing or
    malformed; incomplete weights are not an error here but listed in ``weights.problems``.
    """
    text_path = os.fspath(path)
    if host is None:
        files = inspect_files(text_path)
        where = text_path
    else:
        files = inspect_files_remote(host, text_path)
        where = f"{host.name}:{text_path}"
    if not files.is_directory:
        cause = files.directory_error or "not a directory"
        raise ConfigError(f"{where}: {cause}; expected a model directory with config.json")
    return spec_from_files(files, where)
