"""Build safetensors checkpoints whose data regions are holes: real headers, sparse files.

A 540 GB checkpoint cannot be downloaded in CI, but header-only inspection never reads the data,
so a file made of a real safetensors header followed by ``truncate`` to the size the header
describes is, for everything this plugin does, the real thing (``safetensors.safe_open`` opens
it; see tests/unit/test_safetensors_headers.py). The disk holds only the headers.

Faults are built the same way: a shard missing from the directory, a shard truncated short of
its header's data, a header length larger than the file.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def header_bytes(tensors: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> tuple[bytes, int]:
    """The JSON header (space-padded to 8 bytes, as safetensors writes it) and the data size."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                               "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, offset


def write_shard(path: Path, tensors: Sequence[TensorSpec], *, metadata: dict[str, str] | None = None,
                size_delta: int = 0, header_len_override: int | None = None) -> int:
    """Write one sparse shard; ``size_delta`` < 0 truncates it, > 0 appends trailing bytes.

    ``header_len_override`` writes a length prefix that disagrees with the header (corrupt file).
    Returns the file size.
    """
    raw, data_size = header_bytes(tensors, {"format": "pt"} if metadata is None else metadata)
    length = len(raw) if header_len_override is None else header_len_override
    size = 8 + len(raw) + data_size + size_delta
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", length))
        handle.write(raw)
        handle.truncate(max(size, 0))
    return size


def split_into_shards(tensors: Sequence[TensorSpec], shards: int) -> list[list[TensorSpec]]:
    """Consecutive runs of tensors of roughly equal bytes, like save_pretrained's max_shard_size."""
    target = sum(t.nbytes for t in tensors) / shards
    groups: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for tensor in tensors:
        if current and size + tensor.nbytes > target and len(groups) < shards - 1:
            groups.append(current)
            current, size = [], 0
        current.append(tensor)
        size += tensor.nbytes
    groups.append(current)
    return groups


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_checkpoint(directory: Path, tensors: Sequence[TensorSpec], shards: int,
                     config: dict[str, object] | None = None, *, index: bool = True) -> list[str]:
    """Write a sharded checkpoint with ``model.safetensors.index.json``; returns the shard names."""
    directory.mkdir(parents=True, exist_ok=True)
    groups = split_into_shards(tensors, shards)
    names = [shard_name(i, len(groups)) for i in range(len(groups))]
    weight_map = {}
    for name, group in zip(names, groups, strict=True):
        write_shard(directory / name, group)
        weight_map.update({t.name: name for t in group})
    if index:
        total = sum(t.nbytes for t in tensors)
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config, indent=2))
    return names


def minimax_m2_tensors(layers: int = 62, experts: int = 256, hidden: int = 3072, expert_ffn: int = 1536,
                       heads: int = 48, kv_heads: int = 8, head_dim: int = 128, vocab: int = 200064,
                       block: int = 128) -> list[TensorSpec]:
    """The tensor names, shapes and dtypes of MiniMax-M2.5's FP8 checkpoint (230B parameters):
    FP8 linear weights with F32 ``weight_scale_inv`` per 128x128 block, BF16 embeddings, norms
    and router."""

    def fp8(name: str, rows: int, cols: int) -> Iterable[TensorSpec]:
        yield TensorSpec(f"{name}.weight", "F8_E4M3", (rows, cols))
        yield TensorSpec(f"{name}.weight_scale_inv", "F32", (math.ceil(rows / block), math.ceil(cols / block)))

    tensors = [TensorSpec("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors += [TensorSpec(f"{p}.input_layernorm.weight", "BF16", (hidden,)),
                    TensorSpec(f"{p}.post_attention_layernorm.weight", "BF16", (hidden,))]
        tensors += fp8(f"{p}.self_attn.q_proj", q, hidden)
        tensors += fp8(f"{p}.self_attn.k_proj", kv, hidden)
        tensors += fp8(f"{p}.self_attn.v_proj", kv, hidden)
        tensors += fp8(f"{p}.self_attn.o_proj", hidden, q)
        tensors += [TensorSpec(f"{p}.self_attn.q_norm.weight", "BF16", (q,)),
                    TensorSpec(f"{p}.self_attn.k_norm.weight", "BF16", (kv,)),
                    TensorSpec(f"{p}.block_sparse_moe.gate.weight", "BF16", (experts, hidden)),
                    TensorSpec(f"{p}.block_sparse_moe.e_score_correction_bias", "F32", (experts,))]
        for e in range(experts):
            tensors += fp8(f"{p}.block_sparse_moe.experts.{e}.w1", expert_ffn, hidden)
            tensors += fp8(f"{p}.block_sparse_moe.experts.{e}.w3", expert_ffn, hidden)
            tensors += fp8(f"{p}.block_sparse_moe.experts.{e}.w2", hidden, expert_ffn)
    tensors += [TensorSpec("model.norm.weight", "BF16", (hidden,)),
                TensorSpec("lm_head.weight", "BF16", (vocab, hidden))]
    return tensors


def small_tensors() -> list[TensorSpec]:
    """A few tensors of a two-layer model: enough for unit tests of completeness."""
    return [
        TensorSpec("model.embed_tokens.weight", "BF16", (512, 64)),
        TensorSpec("model.layers.0.self_attn.o_proj.weight", "F8_E4M3", (64, 64)),
        TensorSpec("model.layers.0.self_attn.o_proj.weight_scale_inv", "F32", (1, 1)),
        TensorSpec("model.layers.0.input_layernorm.weight", "BF16", (64,)),
        TensorSpec("model.layers.1.mlp.down_proj.weight", "BF16", (64, 128)),
        TensorSpec("model.layers.2.eh_proj.weight", "BF16", (64, 128)),
        TensorSpec("lm_head.weight", "BF16", (512, 64)),
    ]
