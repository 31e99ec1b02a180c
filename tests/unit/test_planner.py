"""The planner on the seeds' case (MiniMax-M2.5 FP8 on 8x RTX PRO 6000), on the real captured
topology and on the preset, its command line, and its deploy file run by the preflight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpuready.host.gpus import parse_query_gpu
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.host.topology import parse_topo_matrix
from pytest_gpuready.model.deploy_config import ServeArgs, load_deploy_config
from pytest_gpuready.model.spec import inspect_model
from pytest_gpuready.model.vllm_version import parse_vllm_version
from pytest_gpuready.plan.cli import main
from pytest_gpuready.plan.planner import Layout, LayoutRow, plan_layouts
from pytest_gpuready.plan.presets import PRESETS, parse_gpus, preset_snapshot

ROOT = Path(__file__).resolve().parents[2]
MINIMAX = ROOT / "examples" / "models" / "MiniMax-M2.5"
SCENARIO = ROOT / "tests" / "standin" / "scenarios" / "rtx8-clean"


def real_rtx8() -> HostSnapshot:
    """The captured 8x RTX PRO 6000 box: nvidia-smi query and topo -m (tests/standin rtx8-clean)."""
    lines = (SCENARIO / "query-gpu.csv").read_text().splitlines()
    fields = tuple(lines[0].removeprefix("# fields: ").split(","))
    gpus = parse_query_gpu("\n".join(line for line in lines if not line.startswith("#")) + "\n", fields)
    topology = parse_topo_matrix((SCENARIO / "topo.txt").read_text(), "gpu-box-7")
    return HostSnapshot("gpu-box-7", 0.0, "nvidia-smi", tuple(gpus), topology=topology)


def row(rows: list[LayoutRow], tp: int, ep: bool = False, pp: int = 1, kv: str = "auto") -> LayoutRow:
    return next(r for r in rows if r.layout == Layout(tp, pp, ep, kv))


@pytest.fixture(scope="module", params=["real topology", "preset"])
def seeds_plan(request: pytest.FixtureRequest) -> list[LayoutRow]:
    snapshot = real_rtx8() if request.param == "real topology" else preset_snapshot(*parse_gpus("8xRTX-PRO-6000"))
    assert snapshot.require_gpus()[0].compute_capability == (12, 0)
    return plan_layouts(inspect_model(MINIMAX), snapshot, model_path=str(MINIMAX),
                        vllm_version=parse_vllm_version("0.17.0"), serve=ServeArgs(max_model_len=196608))


def test_the_seeds_answer(seeds_plan: list[LayoutRow]) -> None:
    tp8 = row(seeds_plan, 8)
    assert tp8.word("fp8") == "FAIL"
    assert tp8.first_failure == ("fp8: MiniMax-M2.5 does not load at TP=8: The output_size of gate's and up's "
                                 "weight = 192 is not divisible by weight quantization block_n = 128.")
    assert row(seeds_plan, 8, ep=True).ok
    tp2_ep = row(seeds_plan, 2, ep=True)
    assert tp2_ep.word("memory") == "FAIL"
    assert "No available memory for the cache blocks" in (tp2_ep.first_failure or "")
    tp4 = row(seeds_plan, 4)
    assert tp4.ok
    assert tp4.gpus == (0, 1, 2, 3)
    assert tp4.locality == "one NUMA node"
    assert row(seeds_plan, 8, ep=True).locality == "crosses NUMA"
    best = seeds_plan[0]
    assert (best.layout.tp, best.layout.pp, best.gpus) == (4, 1, (0, 1, 2, 3))


def test_rows_are_sorted_best_first(seeds_plan: list[LayoutRow]) -> None:
    keys = [(not r.ok, not r.numa_local, r.layout.pp > 1) for r in seeds_plan]
    assert keys == sorted(keys)
    working = [r.kv_tokens for r in seeds_plan if r.ok and r.numa_local and r.layout.pp == 1]
    assert working == sorted(working, reverse=True)


def test_every_preset_the_brief_names() -> None:
    names = {p.name for p in PRESETS.values()}
    assert {"H100-80GB", "H200", "A100-80GB", "L40S", "RTX-PRO-6000", "RTX-4090", "RTX-3090"} <= names
    assert PRESETS["rtx-pro-6000"].compute_capability == (12, 0)


def test_bad_gpus_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(MINIMAX), "--gpus", "8xFOO"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuready plan: --gpus '8xFOO': unknown GPU 'FOO'; expected one of H100-80GB, ")
    assert err.count("\n") == 1


def test_missing_model_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "nope"), "--gpus", "H200"]) == 2
    assert capsys.readouterr().err == (f"gpuready plan: {tmp_path / 'nope'}: directory not found; expected a model "
                                       "directory with config.json\n")


def test_write_deploy_is_loaded_and_run_by_the_preflight(tmp_path: Path) -> None:
    deploy = tmp_path / "planned.yaml"
    assert main(["plan", str(MINIMAX), "--gpus", "8xRTX-PRO-6000", "--vllm-version", "0.17.0",
                 "--max-model-len", "196608", "--write-deploy", str(deploy), "--choose", "2"]) == 0
    config = load_deploy_config(deploy)
    assert config.names == ("MiniMax-M2.5-tp4-kvfp8", "MiniMax-M2.5-tp4-ep-kvfp8")
    first = config.deployments[0]
    assert (first.tp, first.gpus, first.kv_cache_dtype) == (4, (0, 1, 2, 3), "fp8")
    assert first.serve.max_model_len == 196608
    assert first.gpu_arch == (12, 0)
    result = subprocess.run(
        # The deployment half of the preflight (the host half reads this machine's /dev/shm).
        [sys.executable, "-m", "pytest", "--pyargs", "pytest_gpuready.preflight.test_deployments",
         "--gpuready-config", str(deploy), "-p", "no:cacheprovider", "-v", "-rs"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "test_fp8_block_alignment[MiniMax-M2.5-tp4-kvfp8] PASSED" in result.stdout
    assert "test_tp_divisibility[MiniMax-M2.5-tp4-ep-kvfp8] PASSED" in result.stdout


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "pytest_gpuready", "plan", str(MINIMAX), "--gpus", "4xH200",
                             "--vllm-version", "0.32.0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2].split()[:2] == ["#", "layout"]
    assert json.dumps(result.stderr) == '""'
