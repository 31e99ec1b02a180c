"""The memory model against real vLLM startups: predicted ``GPU KV cache size`` within 2% of the
log's, and the fits / does-not-fit verdict right, for every log with a known model.

The logs are vLLM 0.25.0 on an H200 (tests/data/vllm-logs/H200-MEMORY-RUNS.md); the model's
measured constants were fitted on none of them: the TP=1 non-torch base (0.28 GiB) came from the 1B
logs in shared/data/vllm-logs, and the V2 sampler's 6 bytes per logit is read from vLLM's code (the
bf16 logits and one float32 copy) and was only checked against the 8B logs here, as an upper bound.
``python -m pytest tests/unit/test_memory_model.py -s`` prints the error per log (the table in
docs/checks/memory_fit.md).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from pytest_gpuready.model.checks import memory_plan
from pytest_gpuready.model.memory import GIB, MIB
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.model.spec import ModelSpec, model_spec_from_config
from pytest_gpuready.model.vllm_version import parse_vllm_version

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = DATA / "vllm-logs"
H200_CUDA_TOTAL = (143771 - 616) * MIB
"""The H200's memory as CUDA reports it: nvidia-smi total less the driver-reserved 616 MiB."""

LLAMA_1B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 16,
            "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 8,
            "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 4096,
            "torch_dtype": "bfloat16"}
"""The 1B random Llama of H200-MEMORY-RUNS.md."""


def model(name: str) -> ModelSpec:
    if name == "llama-1b":
        return model_spec_from_config(LLAMA_1B, name=name)
    config = json.loads((DATA / "configs" / "meta-llama__Llama-3.1-8B.json").read_text())
    return model_spec_from_config(config, name=name)


def read_log(path: Path) -> dict[str, object]:
    text = path.read_text(errors="replace")
    args = ast.literal_eval(re.search(r"non-default args: (\{.*\})", text).group(1))  # type: ignore[union-attr]
    available = float(re.search(r"Available KV cache memory: (-?[\d.]+) GiB", text).group(1))  # type: ignore[union-attr]
    tokens = re.search(r"GPU KV cache size: ([\d,]+) tokens", text)
    return {"args": args, "available_gib": available,
            "tokens": int(tokens.group(1).replace(",", "")) if tokens else 0,
            "failed": "No available memory for the cache blocks" in text}


H200_LOGS = sorted(LOGS.glob("vllm-0.25.0-h200-*.log"))


@pytest.mark.parametrize("path", H200_LOGS, ids=[p.stem for p in H200_LOGS])
def test_predicted_kv_cache_within_two_percent_of_vllm(path: Path) -> None:
    log = read_log(path)
    args: dict[str, object] = log["args"]  # type: ignore[assignment]
    name = "llama-1b" if "llama-1b" in path.name else "Llama-3.1-8B"
    settings = ServeArgs(
        gpu_memory_utilization=float(args["gpu_memory_utilization"]),  # type: ignore[arg-type]
        max_model_len=int(args["max_model_len"]),  # type: ignore[call-overload]
        max_num_seqs=args.get("max_num_seqs"),  # type: ignore[arg-type]
        max_num_batched_tokens=args.get("max_num_batched_tokens"),  # type: ignore[arg-type]
        enforce_eager=bool(args.get("enforce_eager")), kv_cache_dtype=str(args.get("kv_cache_dtype", "auto")))
    plan = memory_plan(model(name), H200_CUDA_TOTAL, settings, version=parse_vllm_version("0.25.0"))
    predicted_gib = (plan.budget_bytes - plan.non_kv_bytes) / GIB
    fits = predicted_gib > 0
    assert fits == (not log["failed"]), f"{path.name}: predicted {predicted_gib:.2f} GiB"
    real_tokens = int(log["tokens"])  # type: ignore[call-overload]
    print(f"\n{path.stem}: KV {predicted_gib:.2f} GiB predicted vs {log['available_gib']} GiB; "
          f"tokens {plan.kv_tokens:,} vs {real_tokens:,}")
    if real_tokens:
        error = (plan.kv_tokens - real_tokens) / real_tokens
        print(f"  error {error:+.2%}")
        assert abs(error) < 0.02
    else:
        assert abs(predicted_gib - float(log["available_gib"])) < 0.1  # type: ignore[arg-type]
