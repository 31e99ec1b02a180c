"""The planner on the seeds' case (MiniMax-M2.5 FP8 on 8x RTX PRO 6000), on the real captured
topology and on the preset: every vLLM rule and the memory model per row, DP layouts, identical
rows folded, undecided rows never shown as working, its command line, and its deploy file run by
the preflight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_gpuready import Layout
from pytest_gpuready.host.gpus import parse_query_gpu
from pytest_gpuready.host.snapshot import GpuLink, HostSnapshot, Topology
from pytest_gpuready.host.topology import parse_topo_matrix
from pytest_gpuready.model.deploy_config import load_deploy_config
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.model.spec import ModelSpec, inspect_model, model_spec_from_config
from pytest_gpuready.model.vllm_version import parse_vllm_version
from pytest_gpuready.plan.cli import main
from pytest_gpuready.plan.placement import gpu_list_text, locality, place
from pytest_gpuready.plan.planner import CHECKS, LayoutRow, plan_layouts
from pytest_gpuready.plan.presets import PRESETS, parse_gpus, preset_snapshot
from pytest_gpuready.plan.table import format_table, layout_label

ROOT = Path(__file__).resolve().parents[2]
MINIMAX = ROOT / "examples" / "models" / "MiniMax-M2.5"
SCENARIOS = ROOT / "tests" / "standin" / "scenarios"
CONFIGS = ROOT / "tests" / "data" / "configs"
V017 = parse_vllm_version("0.17.0")


def captured(scenario: str, host: str) -> HostSnapshot:
    """A captured box: its nvidia-smi query and topo -m (tests/standin/scenarios/SCENARIO)."""
    lines = (SCENARIOS / scenario / "query-gpu.csv").read_text().splitlines()
    fields = tuple(lines[0].removeprefix("# fields: ").split(","))
    gpus = parse_query_gpu("\n".join(line for line in lines if not line.startswith("#")) + "\n", fields)
    topo = SCENARIOS / scenario / "topo.txt"
    topology = parse_topo_matrix(topo.read_text(), host) if topo.exists() else None
    return HostSnapshot(host, 0.0, "nvidia-smi", tuple(gpus), topology=topology)


def config_model(name: str) -> ModelSpec:
    return model_spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)


def row(rows: list[LayoutRow], tp: int, ep: bool = False, pp: int = 1, kv: str = "auto", dp: int = 1) -> LayoutRow:
    """The row that holds this layout (folded rows hold several)."""
    wanted = Layout(tp=tp, pp=pp, dp=dp, ep=ep, kv_cache_dtype=kv)
    return next(r for r in rows if wanted in r.layouts)


@pytest.fixture(scope="module", params=["real topology", "preset"])
def seeds_plan(request: pytest.FixtureRequest) -> list[LayoutRow]:
    snapshot = (captured("rtx8-clean", "gpu-box-7") if request.param == "real topology"
                else preset_snapshot(*parse_gpus("8xRTX-PRO-6000")))
    assert snapshot.require_gpus()[0].compute_capability == (12, 0)
    return plan_layouts(inspect_model(MINIMAX), snapshot, model_path=str(MINIMAX), vllm_version=V017,
                        serve=ServeArgs(max_model_len=196608))


def test_the_seeds_answer(seeds_plan: list[LayoutRow]) -> None:
    tp8 = row(seeds_plan, 8)
    assert tp8.word("fp8") == "FAIL"
    assert tp8.status == "fails"
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
    assert (best.layout.tp, best.layout.pp, best.layout.dp, best.gpus) == (4, 1, 1, (0, 1, 2, 3))


def test_every_row_carries_every_rule_and_the_memory_fit(seeds_plan: list[LayoutRow]) -> None:
    for r in seeds_plan:
        assert list(r.verdicts) == list(CHECKS)
        assert r.word("world") == "ok"
        assert r.word("quant") == "ok"      # fp8 from SM75 (0.15+); SM120 has it
        assert r.word("marlin") == "-"      # SM120 has native FP8: Marlin does not run
        assert r.word("attn") == "-"        # GQA: no MLA backend to choose
    assert row(seeds_plan, 8, ep=True).word("ep") == "ok"
    assert row(seeds_plan, 8).word("ep") == "-"


def test_rows_are_sorted_best_first(seeds_plan: list[LayoutRow]) -> None:
    order = ("works", "undecided", "fails")
    keys = [(order.index(r.status), not r.numa_local, r.layout.pp > 1) for r in seeds_plan]
    assert keys == sorted(keys)
    working = [r.kv_tokens for r in seeds_plan if r.ok and r.numa_local and r.layout.pp == 1]
    assert working == sorted(working, reverse=True)


def test_data_parallel_layouts_up_to_the_gpus(seeds_plan: list[LayoutRow]) -> None:
    layouts = [layout for r in seeds_plan for layout in r.layouts]
    assert len(layouts) == len(set(layouts))
    assert all(layout.total_gpus <= 8 for layout in layouts)
    grid = {(layout.tp, layout.pp, layout.dp) for layout in layouts}
    assert grid == {(tp, pp, dp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) for dp in (1, 2, 4, 8)
                    if tp * pp * dp <= 8}
    # Without EP, DP splits each expert over TP x DP = 8 ranks, as TP=8 does: the same block rule.
    dp2 = row(seeds_plan, 4, dp=2)
    assert dp2.word("fp8") == "FAIL"
    assert "at TP=4 and DP=2" in (dp2.first_failure or "")
    assert "= 192 is not divisible by weight quantization block_n = 128" in (dp2.first_failure or "")
    # With EP, the experts are spread over all 8 GPUs: half the weights of TP=4 per GPU, and it loads.
    dp2_ep = row(seeds_plan, 4, ep=True, dp=2)
    assert dp2_ep.ok
    assert dp2_ep.gpus == tuple(range(8))
    assert dp2_ep.locality == "crosses NUMA"     # the MoE layers' TP x DP group spans both nodes
    weights_dp2 = dp2_ep.memory_figure("weights_per_gpu_bytes") or 0
    weights_tp4 = row(seeds_plan, 4).memory_figure("weights_per_gpu_bytes") or 0
    assert 0.45 < weights_dp2 / weights_tp4 < 0.55
    assert "--data-parallel-size 2" in dp2_ep.command


def test_identical_rows_are_folded(seeds_plan: list[LayoutRow]) -> None:
    tp4 = row(seeds_plan, 4, kv="fp8")
    assert set(tp4.layouts) == {Layout(tp=4, kv_cache_dtype="fp8"), Layout(tp=4, ep=True, kv_cache_dtype="fp8")}
    assert layout_label(tp4) == "TP=4±EP KV fp8"
    assert tp4.word("ep") == "ok"
    # TP=8 and TP=8+EP differ (one fails the block rule): two rows.
    assert row(seeds_plan, 8) is not row(seeds_plan, 8, ep=True)


def test_folding_keeps_every_layout() -> None:
    model = inspect_model(MINIMAX)
    snapshot = preset_snapshot(*parse_gpus("8xRTX-PRO-6000"))
    kwargs = {"model_path": str(MINIMAX), "vllm_version": V017, "serve": ServeArgs(max_model_len=196608)}
    folded = plan_layouts(model, snapshot, **kwargs)  # type: ignore[arg-type]
    every = plan_layouts(model, snapshot, fold=False, **kwargs)  # type: ignore[arg-type]
    assert len(folded) < len(every)
    assert sorted(map(repr, (la for r in folded for la in r.layouts))) == sorted(repr(r.layout) for r in every)
    assert all(not r.alike for r in every)


def test_the_first_failure_is_the_one_vllm_raises_first() -> None:
    model = inspect_model(MINIMAX)
    snapshot = preset_snapshot(*parse_gpus("8xRTX-PRO-6000"))
    # max_model_len is checked while ModelConfig is built, before the FP8 layers are.
    rows = plan_layouts(model, snapshot, model_path=str(MINIMAX), vllm_version=V017,
                        serve=ServeArgs(max_model_len=10_000_000))
    tp8 = row(rows, 8)
    assert [check for check, _ in tp8.failures] == ["memory", "fp8"]
    assert (tp8.first_failure or "").startswith("memory: MiniMax-M2.5: User-specified max_model_len (10000000)")
    # The KV cache is sized after the model is built: there the FP8 layers come first.
    rows = plan_layouts(model, snapshot, model_path=str(MINIMAX), vllm_version=V017,
                        serve=ServeArgs(max_model_len=196608, gpu_memory_utilization=0.3))
    tp8 = row(rows, 8)
    assert [check for check, _ in tp8.failures] == ["fp8", "memory"]


def test_without_the_capability_rows_are_undecided_never_working() -> None:
    # The legacy-driver capture has no compute_cap field: the quantization minimum cannot be judged.
    snapshot = captured("legacy-driver", "old-h200")
    assert snapshot.require_gpus()[0].compute_capability is None
    model = config_model("Qwen__Qwen3-30B-A3B-FP8")
    rows = plan_layouts(model, snapshot, model_path="/models/qwen3", vllm_version=parse_vllm_version("0.32.0"))
    assert rows
    assert all(not r.ok for r in rows)
    tp1 = row(rows, 1)
    assert tp1.status == "undecided"
    assert tp1.word("quant") == "?"
    assert tp1.reason.startswith("undecided (quant")
    assert "compute capability" in tp1.reason
    text = format_table(rows, model, snapshot.host, "rules: vLLM 0.32.0")
    assert "undecided" in text.splitlines()[4]
    assert "no layout is known to work; 1 undecided: pass --gpu-arch SM" in text
    # The same plan with the capability given: it works.
    known = plan_layouts(model, snapshot, model_path="/models/qwen3", vllm_version=parse_vllm_version("0.32.0"),
                         capability=(9, 0))
    assert row(known, 1).ok
    assert row(known, 1).word("quant") == "ok"


def test_fp8_on_ampere_needs_ep_on_vllm_032() -> None:
    """Qwen3-30B-A3B-FP8 on 4x RTX 3090 (SM86): the re-gridded expert blocks have no MoE kernel."""
    model = config_model("Qwen__Qwen3-30B-A3B-FP8")
    rows = plan_layouts(model, preset_snapshot(*parse_gpus("4xRTX-3090")), model_path="/models/qwen3",
                        vllm_version=parse_vllm_version("0.32.0"))
    assert "No FP8 MoE backend supports the deployment configuration." in (row(rows, 4).first_failure or "")
    assert row(rows, 4, ep=True).ok
    assert row(rows, 4, ep=True).word("marlin") == "ok"     # SM86: FP8 runs on Marlin, which 0.32 pads


def interleaved(count: int, link: str) -> HostSnapshot:
    """GPUs numbered across two NUMA nodes (even on node 0, odd on node 1), ``link`` within a node."""
    gpus = preset_snapshot(count, PRESETS["l40s"]).require_gpus()
    numa: dict[int, int | None] = {i: i % 2 for i in range(count)}
    links = tuple(GpuLink(a, b, link if numa[a] == numa[b] else "SYS")
                  for a in range(count) for b in range(a + 1, count))
    return HostSnapshot("interleaved", 0.0, "preset", gpus, topology=Topology(links, numa_affinity=numa))


def test_placement_keeps_each_group_on_one_node() -> None:
    snapshot = interleaved(8, "PIX")
    tp4 = Layout(tp=4)
    assert place(snapshot, tp4, range(8), moe_spans_dp=False) == (0, 2, 4, 6)
    assert locality(snapshot, tp4, (0, 2, 4, 6), moe_spans_dp=False) == "one PCIe switch"
    dp2 = Layout(tp=4, dp=2)
    gpus = place(snapshot, dp2, range(8), moe_spans_dp=False)
    assert gpus == (0, 2, 4, 6, 1, 3, 5, 7)
    assert locality(snapshot, dp2, gpus, moe_spans_dp=False) == "one PCIe switch"
    # A MoE model's experts span the DP engines: that TP x DP group cannot stay on one node.
    assert locality(snapshot, dp2, gpus, moe_spans_dp=True) == "crosses NUMA"
    assert locality(interleaved(8, "NODE"), tp4, (0, 2, 4, 6), moe_spans_dp=False) == "one NUMA node"
    assert gpu_list_text((0, 1, 2, 3, 6, 7)) == "0-3,6,7"
    assert gpu_list_text((0, 2, 4, 6, 1, 3, 5, 7)) == "0,2,4,6,1,3,5,7"


def test_every_preset_the_brief_names() -> None:
    names = {p.name for p in PRESETS.values()}
    assert {"H100-80GB", "H200", "A100-80GB", "L40S", "RTX-PRO-6000", "RTX-4090", "RTX-3090"} <= names
    assert PRESETS["rtx-pro-6000"].compute_capability == (12, 0)


def test_bad_gpus_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(MINIMAX), "--gpus", "8xFOO"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuready plan: --gpus '8xFOO': unknown GPU 'FOO'; expected one of H100-80GB, ")
    assert err.count("\n") == 1


def test_bad_gpu_arch_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(MINIMAX), "--gpus", "H200", "--gpu-arch", "hopper"])
    assert exit_info.value.code == 2
    assert ("argument --gpu-arch: 'hopper' is not a GPU architecture; expected sm90, sm100, sm120 or a compute "
            "capability like 9.0 or 12.0") in capsys.readouterr().err


def test_missing_model_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "nope"), "--gpus", "H200"]) == 2
    assert capsys.readouterr().err == (f"gpuready plan: {tmp_path / 'nope'}: directory not found; expected a model "
                                       "directory with config.json\n")


def test_commands_flag_prints_every_rows_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(MINIMAX), "--gpus", "8xRTX-PRO-6000", "--vllm-version", "0.17.0",
                 "--max-model-len", "196608"]) == 0
    default = capsys.readouterr().out
    assert default.count("vllm serve ") == 3
    assert main(["plan", str(MINIMAX), "--gpus", "8xRTX-PRO-6000", "--vllm-version", "0.17.0",
                 "--max-model-len", "196608", "--commands"]) == 0
    every = capsys.readouterr().out
    table_rows = [line for line in every.split("\n\n")[0].splitlines()[4:]]
    assert every.count("vllm serve ") == len(table_rows)
    assert "--enable-expert-parallel --kv-cache-dtype fp8" in every


def test_write_deploy_is_loaded_and_run_by_the_preflight(tmp_path: Path) -> None:
    deploy = tmp_path / "planned.yaml"
    assert main(["plan", str(MINIMAX), "--gpus", "8xRTX-PRO-6000", "--vllm-version", "0.17.0",
                 "--max-model-len", "196608", "--write-deploy", str(deploy), "--choose", "3"]) == 0
    config = load_deploy_config(deploy)
    assert config.names == ("MiniMax-M2.5-tp4-kvfp8", "MiniMax-M2.5-tp4", "MiniMax-M2.5-dp2-tp2-kvfp8")
    first = config.deployments[0]
    assert (first.tp, first.gpus, first.kv_cache_dtype) == (4, (0, 1, 2, 3), "fp8")
    assert first.serve.max_model_len == 196608
    assert first.gpu_arch == (12, 0)
    dp2 = config.deployments[2]
    assert (dp2.dp, dp2.tp, dp2.gpus) == (2, 2, (0, 1, 2, 3))
    assert "--data-parallel-size" in dp2.serve.argv()
    result = subprocess.run(
        # The deployment half of the preflight (the host half reads this machine's /dev/shm).
        [sys.executable, "-m", "pytest", "--pyargs", "pytest_gpuready.preflight.test_deployments",
         "--gpuready-config", str(deploy), "-p", "no:cacheprovider", "-v", "-rs"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "test_fp8_block_alignment[MiniMax-M2.5-tp4-kvfp8] PASSED" in result.stdout
    assert "test_vllm_load_rules[MiniMax-M2.5-dp2-tp2-kvfp8] PASSED" in result.stdout


def test_write_deploy_to_a_directory_is_refused_before_planning(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(MINIMAX), "--gpus", "8xRTX-PRO-6000", "--write-deploy", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the plan was made
    assert captured.err == (f"gpuready plan: --write-deploy {tmp_path}: is a directory; expected a file path (a new "
                            "or regular file), - for standard output, a character device or a FIFO\n")
    assert os.listdir(tmp_path) == []


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "pytest_gpuready", "plan", str(MINIMAX), "--gpus", "4xH200",
                             "--vllm-version", "0.32.0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3].split()[:2] == ["#", "layout"]
    assert json.dumps(result.stderr) == '""'


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    command = (f"{sys.executable} -m pytest_gpuready plan {MINIMAX} --gpus 8xRTX-PRO-6000 --commands "
               "| head -c 100")
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("plan: MiniMax-M2.5")
    assert result.stderr == ""


def test_an_undecided_gpu_from_the_probe_is_decided_by_gpu_arch() -> None:
    snapshot = captured("legacy-driver", "old-h200")
    gpus = tuple(replace(g, compute_capability=None) for g in snapshot.require_gpus())
    snapshot = replace(snapshot, gpus=gpus)
    model = config_model("Qwen__Qwen3-30B-A3B-FP8")
    rows = plan_layouts(model, snapshot, model_path="/m", capability=(8, 0), vllm_version=parse_vllm_version("0.32.0"))
    assert row(rows, 1).capability == (8, 0)
    assert row(rows, 1).word("marlin") == "ok"


def test_plan_on_a_probed_host(standin: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The probe path (the stand-in nvidia-smi replays the 8x RTX PRO 6000 capture and a real topo -m)."""
    standin("rtx8-clean")
    assert main(["plan", str(MINIMAX), "--vllm-version", "0.17.0", "--max-model-len", "196608"]) == 0
    lines = capsys.readouterr().out.splitlines()
    best = lines[4].split()
    assert best[1:5] == ["TP=4±EP", "KV", "fp8", "0-3"]
    assert lines[4].endswith("one NUMA node")


def test_plan_on_a_probe_without_compute_capability(standin: Callable[[str], Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An old driver reports no compute_cap: nothing is promised (exit 1) until --gpu-arch says it."""
    standin("legacy-driver")
    model_dir = tmp_path / "Qwen3-30B-A3B-FP8"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "Qwen__Qwen3-30B-A3B-FP8.json").read_text())
    assert main(["plan", str(model_dir), "--vllm-version", "0.32.0"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[4].split()[1:4] == ["TP=1", "0", "undecided"]
    assert "no layout is known to work; 1 undecided: pass --gpu-arch SM" in out
    assert main(["plan", str(model_dir), "--vllm-version", "0.32.0", "--gpu-arch", "sm90"]) == 0
    assert capsys.readouterr().out.splitlines()[4].split()[1:6] == ["TP=1", "KV", "fp8", "0", "works"]


# ---------------------------------------------------------------- NVFP4 KV cache

def test_nvfp4_kv_is_sized_as_vllm_packs_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--kv-cache-dtype nvfp4`` on GQA attention: per head and token, ``head_dim // 2`` bytes of
    FP4 data and ``head_dim // 16`` FP8 scales (vLLM's ``nvfp4_kv_cache_full_dim``): Llama-3.1-8B
    (head_dim 128) takes 72 bytes per KV head where bf16 takes 256."""
    from pytest_gpuready.model.checks import kv_cache_bytes_per_token

    llama = config_model("meta-llama__Llama-3.1-8B")
    assert kv_cache_bytes_per_token(llama, 8, "nvfp4") == 2 * 32 * 1 * (64 + 8)
    assert kv_cache_bytes_per_token(llama, 8, "auto") == 2 * 32 * 1 * 128 * 2
    model_dir = tmp_path / "Llama-3.1-8B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())
    assert main(["plan", str(model_dir), "--gpus", "8xH100-80GB", "--kv-cache-dtype", "nvfp4"]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out
    assert " TP=8 KV nvfp4 " in out


def test_an_nvfp4_kv_page_not_modelled_is_an_undecided_memory_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where vLLM's page layout for the KV dtype is not read (nvfp4 on an MLA latent; the sparse-MLA
    layout on GQA attention), the memory verdict is undecided and says why: never a traceback."""
    kimi = config_model("nvidia__Kimi-K2.5-NVFP4")
    llama = config_model("meta-llama__Llama-3.1-8B")
    snapshot = preset_snapshot(*parse_gpus("8xB200"))
    for model, kv, why in ((kimi, "nvfp4", "the KV page of --kv-cache-dtype nvfp4 on an MLA model"),
                           (llama, "nvfp4_ds_mla", "nvfp4_ds_mla is a DeepSeek sparse-MLA page layout")):
        rows = plan_layouts(model, snapshot, model_path="m", kv_cache_dtypes=[kv], fold=False)
        memory = rows[0].memory
        assert memory.needs is not None
        assert not memory.ok
        assert why in memory.summary
        assert all(r.word("memory") == "?" for r in rows)
    # DeepSeek's sparse-MLA page with NVFP4: 352 bytes per token per layer (vLLM's mla_attention.py)
    rows = plan_layouts(config_model("deepseek-ai__DeepSeek-V3.2"), snapshot, model_path="m",
                        kv_cache_dtypes=["nvfp4_ds_mla"], fold=False)
    sized = [r for r in rows if r.memory.needs is None]
    assert sized
    assert all(r.memory_figure("kv_bytes_per_token") == -(-61 // r.layout.pp) * 352 for r in sized)
    model_dir = tmp_path / "Kimi"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "nvidia__Kimi-K2.5-NVFP4.json").read_text())
    assert main(["plan", str(model_dir), "--gpus", "8xB200", "--kv-cache-dtype", "nvfp4"]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().out
