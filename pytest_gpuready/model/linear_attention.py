"""Gated DeltaNet linear-attention layers (Qwen3-Next, Qwen3.5), read from ``config.json``.

These hybrid models interleave linear-attention layers (``linear_attn``) with full-attention
layers (``self_attn``). The linear-attention projections are tensor-parallel layers like any
other, so an FP8 block-quantized checkpoint must split them into whole blocks too, and their
head counts must divide by TP. vLLM builds them in ``QwenGatedDeltaNet``
(``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`` from 0.22; before that
``vllm/model_executor/models/qwen3_next.py`` and ``gdn_linear_attn.py``):

- ``in_proj_qkvz``: column-parallel, ``2*key_dim + 2*value_dim`` outputs. Qwen3-Next keeps one
  fused output (an interleaved GQA layout), so its shard must be a multiple of ``block_n``;
  Qwen3.5 has four outputs ``[key_dim, key_dim, value_dim, value_dim]`` (a merged layer, which
  may mismatch the block).
- ``in_proj_ba``: column-parallel, ``2*num_v_heads`` outputs: one fused output for Qwen3-Next
  (0.13-0.15 and 0.18-0.33; 0.17 had two), two for Qwen3.5. vLLM's comment: "ba_proj doesn't
  support blockwise fp8 quantization"; the official FP8 checkpoints keep it in BF16
  (``modules_to_not_convert``), a re-quantized one that does not gets
  ``Weight output_partition_size = 8 is not divisible by weight quantization block_n = 128.``
  (Qwen3-Next, 32 value heads, TP=8).
- ``out_proj``: row-parallel, ``value_dim`` inputs.
- ``A_log`` / ``dt_bias``: ``divide(num_v_heads, tp)``; ``conv1d``: ``divide(conv_dim, tp)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_gpuready.model.spec import ModelSpec

GDN_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
"""Text model types built with Gated DeltaNet layers."""
INTERLEAVED_MODEL_TYPES = frozenset({"qwen3_next"})
"""Qwen3-Next stores ``in_proj_qkvz`` and ``in_proj_ba`` fused (``gqa_interleaved_layout=True``)."""


@dataclass(frozen=True)
class GatedDeltaNet:
    """The geometry of a model's linear-attention layers."""

    linear_layers: tuple[int, ...]
    full_layers: tuple[int, ...]
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    interleaved: bool

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def qkvz_outputs(self) -> list[int]:
        sizes = [self.key_dim, self.key_dim, self.value_dim, self.value_dim]
        return [sum(sizes)] if self.interleaved else sizes

    def ba_outputs(self, version_minor: tuple[int, int] | None) -> list[int]:
        """``in_proj_ba``'s output partitions; Qwen3-Next had two in vLLM 0.17 only."""
        fused = self.interleaved and not (version_minor is not None and (0, 16) <= version_minor < (0, 18))
        return [2 * self.num_v_heads] if fused else [self.num_v_heads, self.num_v_heads]


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def gated_deltanet(model: ModelSpec) -> GatedDeltaNet | None:
    """The linear-attention geometry, or None for models without Gated DeltaNet layers.

    Layer kinds come from ``layer_types`` (Qwen3.5) or ``full_attention_interval`` (Qwen3-Next:
    layer ``i`` is full attention when ``(i + 1) % interval == 0``, as in transformers'
    ``Qwen3NextConfig``; default 4).
    """
    if model.text_model_type not in GDN_MODEL_TYPES:
        return None
    text = _text_config(model.config)
    num_k = _int(text, "linear_num_key_heads")
    num_v = _int(text, "linear_num_value_heads")
    head_k = _int(text, "linear_key_head_dim")
    head_v = _int(text, "linear_value_head_dim")
    if num_k is None or num_v is None or head_k is None or head_v is None:
        return None
    layers = range(model.num_layers)
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and len(kinds) >= model.num_layers:
        linear = tuple(i for i in layers if kinds[i] == "linear_attention")
    else:
        interval = _int(text, "full_attention_interval") or 4
        linear = tuple(i for i in layers if (i + 1) % interval)
    full = tuple(i for i in layers if i not in set(linear))
    return GatedDeltaNet(
        linear_layers=linear, full_layers=full, num_k_heads=num_k, num_v_heads=num_v,
        head_k_dim=head_k, head_v_dim=head_v,
        conv_kernel=_int(text, "linear_conv_kernel_dim") or 4,
        interleaved=model.text_model_type in INTERLEAVED_MODEL_TYPES,
    )


def attention_layers(model: ModelSpec) -> range | tuple[int, ...]:
    """The layers with full (softmax) attention: all of them, except in hybrid models."""
    gdn = gated_deltanet(model)
    return gdn.full_layers if gdn is not None else range(model.num_layers)
