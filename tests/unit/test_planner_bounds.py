"""The planner stays bounded on any config: what no model has is refused, what is huge is cut and said.

Each hostile input is run through the real command line (``python -m pytest_gpuready plan``) in a
subprocess with a limit, so a hang fails the test instead of stalling the suite; the limit only
bounds a hang, it guesses nothing about the machine's speed. The 10,000-GPU host is the labelled
stand-in nvidia-smi replaying the captured H200 row 10,000 times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpuready.model.backends import GPU_CAPABILITIES, parse_gpu_arch
from pytest_gpuready.model.derived_weights import architecture_tensors, derive_weights
from pytest_gpuready.model.spec import SIZE_LIMITS, model_spec_from_config
from tests.conftest import SCENARIOS, STANDIN_BIN

ROOT = Path(__file__).resolve().parents[2]
MINIMAX = ROOT / "examples" / "models" / "MiniMax-M2.5"
CONFIGS = ROOT / "tests" / "data" / "configs"
LIMIT_S = 120
"""A plan takes about a second here; the limit only turns a hang into a failure."""


def plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gpuready", "plan", *args], capture_output=True,
                          text=True, timeout=LIMIT_S, env={**os.environ, **(env or {})}, check=False)


def model_dir(tmp_path: Path, **overrides: object) -> Path:
    config = json.loads((MINIMAX / "config.json").read_text())
    config.update(overrides)
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size",
                                 "num_local_experts"])
def test_a_size_no_model_has_is_one_line_and_at_once(tmp_path: Path, key: str) -> None:
    folder = model_dir(tmp_path, **{key: 10**18})
    done = plan(str(folder), "--gpus", "8xH200")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"gpuready plan: {folder}/config.json: key '{key}' is 1000000000000000000; "
                                  f"expected a whole number from {0 if key == 'num_local_experts' else 1} to "
                                  f"{SIZE_LIMITS[key]} (")
    assert done.stderr.endswith("no model has more)\n")


def test_a_config_at_every_limit_is_planned(tmp_path: Path) -> None:
    """The largest sizes accepted still give a plan (every row failing memory), in bounded time."""
    limits = {key: SIZE_LIMITS[key] for key in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                "num_key_value_heads", "head_dim", "vocab_size",
                                                "intermediate_size", "num_local_experts")}
    done = plan(str(model_dir(tmp_path, **limits)), "--gpus", "8xH200")
    assert done.returncode == 1, done.stderr
    assert "1024 layers" in done.stdout.splitlines()[0]
    assert "no layout is known to work" in done.stdout


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.json") if "hf_quant" not in p.name))
def test_closed_form_weights_equal_the_sum_over_every_tensor(name: str) -> None:
    """The closed form (a representative layer times its run) is the layer-by-layer sum, exactly."""
    spec = model_spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)
    derived = derive_weights(spec)
    assert derived.parameter_count == sum(t.numel for t in architecture_tensors(spec))


def test_an_exclusion_naming_one_layer_is_counted_on_that_layer_only() -> None:
    """``modules_to_not_convert`` with a layer number keeps that layer's weights unquantized (2 bytes
    per weight for bf16, not FP8's 1 + scales): the closed form falls back to layer by layer there."""
    config = json.loads((CONFIGS / "MiniMaxAI__MiniMax-M2.5.json").read_text())
    base = derive_weights(model_spec_from_config(config))
    config["quantization_config"] = {**config["quantization_config"],
                                     "modules_to_not_convert": ["model.layers.3.self_attn"]}
    one_layer = derive_weights(model_spec_from_config(config))
    spec = model_spec_from_config(config)
    attention = [t for t in architecture_tensors(spec) if t.name.startswith("model.layers.3.self_attn.")
                 and t.linear]
    fp8 = sum(t.numel + ((t.rows + 127) // 128) * ((t.cols + 127) // 128) * 4 for t in attention)
    assert one_layer.total_bytes - base.total_bytes == sum(t.numel * 2 for t in attention) - fp8


def test_a_host_listing_ten_thousand_gpus_is_planned_on_64_and_says_so(tmp_path: Path) -> None:
    scenario = tmp_path / "10k"
    scenario.mkdir()
    source = SCENARIOS / "h200-idle"
    header, row = (source / "query-gpu.csv").read_text().splitlines()[:2]
    fields = row.split(", ")
    rows = [", ".join([str(i), f"GPU-{i:08d}{fields[1][12:]}", *fields[2:3], f"00000000:{i // 256:02x}:{i % 256:02x}.0",
                       *fields[4:]]) for i in range(10_000)]
    (scenario / "query-gpu.csv").write_text("\n".join([header, *rows]) + "\n")
    (scenario / "query-compute-apps.csv").write_text((source / "query-compute-apps.csv").read_text())
    done = plan(str(MINIMAX), "--gpu-host", "local",
                env={"PATH": f"{STANDIN_BIN}:{os.environ['PATH']}", "GPUREADY_STANDIN_SCENARIO": str(scenario)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2] == ("cut: local lists 10000 GPUs; planned on the first 64 (GPU 0-63); layouts "
                                           "of more than 64 GPUs are multi-node and not enumerated")
    used = {int(g) for line in done.stdout.splitlines() if "CUDA_VISIBLE_DEVICES=" in line
            for g in line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0].split(",")}
    assert used
    assert max(used) < 64


@pytest.mark.parametrize(("total", "shown"), [("539000000000", '"539000000000"'), (-5, "-5"), (True, "true"),
                                               (0, "0"), (5.5e11, "551000000000.0")])
def test_a_malformed_index_total_size_is_an_error_naming_file_and_key(tmp_path: Path, total: object,
                                                                       shown: str) -> None:
    folder = model_dir(tmp_path)
    index = {"metadata": {"total_size": total}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    done = plan(str(folder), "--gpus", "8xH200")
    assert done.returncode == 2
    assert done.stdout == ""
    if isinstance(total, float):
        shown = json.dumps(total)
    assert done.stderr == (f"gpuready plan: {folder.name}: cannot size the weights, 1 of 1 shard(s) unreadable "
                           f"(model.safetensors.index.json: key 'metadata.total_size' is {shown}; expected the "
                           "checkpoint's size in bytes, a whole number > 0)\n")


def test_a_good_index_total_size_is_still_the_authority(tmp_path: Path) -> None:
    folder = model_dir(tmp_path)
    index = {"metadata": {"total_size": 230_000_000_000},
             "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    done = plan(str(folder), "--gpus", "8xH200")
    assert done.returncode == 0, done.stderr
    assert "214.2 GiB" in done.stdout or "26.8 GiB" in done.stdout  # 230e9 B: whole at TP=1, / 8 at TP=8


@pytest.mark.parametrize(("arch", "why"), [
    ("sm89x", "is not a GPU architecture; expected sm90, sm100, sm120"),
    ("sm1000", "is not a GPU architecture: no NVIDIA GPU has compute capability 100.0; expected one of sm70, "),
    ("sm99999999999999999999999", "is not a GPU architecture; expected sm90, sm100, sm120"),
    ("sm95", "is not a GPU architecture: no NVIDIA GPU has compute capability 9.5"),
    ("99.0", "is not a GPU architecture: no NVIDIA GPU has compute capability 99.0"),
])
def test_a_gpu_arch_no_gpu_has_is_refused_in_one_line(arch: str, why: str) -> None:
    done = plan(str(MINIMAX), "--gpus", "8xH200", "--gpu-arch", arch)
    assert done.returncode == 2
    assert done.stdout == ""
    error = done.stderr.splitlines()[-1]
    assert error.startswith(f"gpuready plan: error: argument --gpu-arch: {arch!r} {why}")


def test_every_real_capability_is_accepted_in_every_spelling() -> None:
    for major, minor in GPU_CAPABILITIES:
        for text in (f"sm{major}{minor}", f"sm_{major}{minor}a", f"SM{major}{minor}", f"{major}.{minor}"):
            assert parse_gpu_arch(text) == (major, minor)
