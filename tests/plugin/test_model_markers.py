"""Model markers, fixtures, options and the deployment preflight, end to end with pytester.

The model configs are the public ones; weights are sparse checkpoints with real safetensors
headers (tests/checkpoints.py); GPUs, where a check needs them, come from the labelled stand-in
nvidia-smi replaying captured outputs (CI has no GPU).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.checkpoints import minimax_m2_tensors, write_checkpoint

Standin = Callable[[str], Path]
ROOT = Path(__file__).parent.parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
EXAMPLE = ROOT / "examples" / "deploy.yaml"
PLUGIN = ("-p", "pytest_gpuready.plugin.model_fixtures", "-p", "no:cacheprovider")
DEPLOYMENTS = ("--pyargs", "pytest_gpuready.preflight.test_deployments")


@pytest.fixture(autouse=True)
def _no_gpuready_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUREADY_HOST", "GPUREADY_MODEL", "GPUREADY_CONFIG", "GPUREADY_VLLM_VERSION",
                 "GPUREADY_GPU_ARCH", "GPUREADY_STANDIN_SCENARIO"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as it is: no nvidia-smi on PATH, no NVML."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")


def add_model(pytester: pytest.Pytester, public: str, name: str) -> Path:
    directory = pytester.path / "models" / name
    directory.mkdir(parents=True)
    shutil.copy(CONFIGS / f"{public}.json", directory / "config.json")
    return directory


@pytest.fixture
def models(pytester: pytest.Pytester) -> Path:
    add_model(pytester, "MiniMaxAI__MiniMax-M2.5", "MiniMax-M2.5")
    add_model(pytester, "nvidia__Kimi-K2.5-NVFP4", "Kimi-K2.5-NVFP4")
    add_model(pytester, "meta-llama__Llama-3.1-8B", "Llama-3.1-8B")
    return pytester.path / "models"


def test_markers_are_listed_with_signatures(pytester: pytest.Pytester) -> None:
    """``--markers`` shows the Python signatures of plugin/markers.py (keyword-only after ``*``)."""
    result = pytester.runpytest(*PLUGIN, "--markers")
    result.stdout.fnmatch_lines([
        "@pytest.mark.model(path): the model directory model_spec reads*",
        "@pytest.mark.deployment(name): the deploy-file deployment this test uses*",
        "@pytest.mark.fp8_block_alignment(tp, ep=False, *, vllm_version=None, gpu_arch=None): fail before the test "
        "runs unless*",
        '@pytest.mark.mla_kv_backend_supported(kv_cache_dtype="auto", *, gpu_arch=None, vllm_version=None): *',
        "@pytest.mark.memory_fit(tp, *, gpus=None, gpu_memory_utilization=0.9, max_model_len=None, max_num_seqs=None,"
        ' kv_cache_dtype="auto", reserve_gib=None, *',
    ])


def test_help_lists_the_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*PLUGIN, "--help")
    result.stdout.fnmatch_lines([
        "*--gpuready-model=PATH*",
        "*--gpuready-config=FILE*",
        "*--vllm-version=VERSION*",
        "*--gpu-arch=SM*",
    ])


def test_fp8_marker_fails_like_vllm(pytester: pytest.Pytester, models: Path) -> None:
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.model("models/MiniMax-M2.5")

        @pytest.mark.fp8_block_alignment(tp=4)
        def test_tp4():
            pass

        @pytest.mark.fp8_block_alignment(8)
        def test_tp8():
            pass

        @pytest.mark.fp8_block_alignment(tp=8, ep=True)
        def test_tp8_ep():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--vllm-version", "0.17.0")
    result.assert_outcomes(passed=2, failed=1)  # measured in setup, a violation: FAILED, not ERROR
    result.stdout.fnmatch_lines([
        "*_ test_tp8 _*",
        "MiniMax-M2.5 does not load at TP=8: The output_size of gate's and up's weight = 192 is not divisible by "
        "weight quantization block_n = 128.",
        "  layer: mlp.experts (routed experts, intermediate_size=1536), layers 0-61: 1536 / 8 = 192 per GPU, *",
        "  what would work: loads at TP=4, or TP=8 with --enable-expert-parallel, or TP=8 on vLLM >= 0.29 *",
        "  (rules: vLLM <= 0.28 rules (vLLM 0.17.0))",
    ])
    assert "Traceback" not in result.stdout.str()


def test_fp8_marker_on_newest_rules_passes_with_a_visible_warning(pytester: pytest.Pytester, models: Path) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/MiniMax-M2.5")
        @pytest.mark.fp8_block_alignment(tp=8)
        def test_tp8():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--gpu-arch", "sm120")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([
        "*GpuReadyWarning: MiniMax-M2.5 at TP=8: FP8 MoE block scales refined from [[]128, 128[]] to [[]64, 64[]]*",
    ])


def test_fp8_marker_on_regridded_blocks_without_an_arch_skips_saying_what_to_pass(
        pytester: pytest.Pytester, models: Path) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/MiniMax-M2.5")
        @pytest.mark.fp8_block_alignment(tp=8)
        def test_tp8():
            pass

        @pytest.mark.model("models/MiniMax-M2.5")
        @pytest.mark.fp8_block_alignment(tp=8, gpu_arch="sm86")
        def test_tp8_on_an_rtx_3090():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines([
        "*No FP8 MoE backend supports the deployment configuration.*this GPU is SM86*",
        "SKIPPED*MiniMax-M2.5 at TP=8: loads only on SM89+ GPUs: FP8 MoE block scales refined*",
    ])


def test_fp8_marker_version_argument_wins(pytester: pytest.Pytester, models: Path) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/MiniMax-M2.5")
        @pytest.mark.fp8_block_alignment(tp=8, vllm_version="0.17.0")
        def test_tp8():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--vllm-version", "0.33.0")
    result.assert_outcomes(failed=1)


def test_mla_marker_on_sm120(pytester: pytest.Pytester, models: Path) -> None:
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.model("models/Kimi-K2.5-NVFP4")

        @pytest.mark.mla_kv_backend_supported
        def test_auto_kv():
            pass

        @pytest.mark.mla_kv_backend_supported(kv_cache_dtype="bfloat16")
        def test_bf16_kv():
            pass

        @pytest.mark.mla_kv_backend_supported(gpu_arch="sm90")
        def test_on_hopper():
            pass

        @pytest.mark.model("models/Llama-3.1-8B")
        @pytest.mark.mla_kv_backend_supported
        def test_not_mla():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--gpu-arch", "sm120", "--vllm-version", "0.17.0")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_auto_kv _*",
        "Kimi-K2.5-NVFP4 on SM120 with KV cache fp8_e4m3: No valid attention backend found for cuda with "
        "AttentionSelectorConfig(head_size=576, *). Reasons: {*TRITON_MLA: [[]kv_cache_dtype not supported[]]*}.",
        "  what would work: --kv-cache-dtype bfloat16 (TRITON_MLA; twice the KV memory of fp8), or vLLM >= 0.18 *",
    ])


def test_mla_marker_without_an_architecture_skips_saying_what_to_pass(
        pytester: pytest.Pytester, models: Path, no_gpu: None) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/Kimi-K2.5-NVFP4")
        @pytest.mark.mla_kv_backend_supported
        def test_kimi():
            pass

        @pytest.mark.model("models/Llama-3.1-8B")
        @pytest.mark.mla_kv_backend_supported
        def test_llama_needs_no_gpu():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED*no GPU here to tell the architecture: pass --gpu-arch SM (e.g. sm120) or --gpu-host HOST, or set "
        "gpu_arch in the deployment",
    ])


def test_mla_marker_reads_the_architecture_from_the_gpus(pytester: pytest.Pytester, models: Path,
                                                         standin: Standin) -> None:
    standin("rtx8-clean")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/Kimi-K2.5-NVFP4")
        @pytest.mark.mla_kv_backend_supported(vllm_version="0.17.0")
        def test_kimi():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["Kimi-K2.5-NVFP4 on SM120 with KV cache fp8_e4m3: No valid attention backend*"])


@pytest.mark.parametrize(("marker", "message"), [
    ('fp8_block_alignment(tp="8")',
     "@pytest.mark.fp8_block_alignment: tp='8'; expected a whole number >= 1 (the tensor-parallel size)"),
    ("fp8_block_alignment(tp=8, pp=2)",
     "@pytest.mark.fp8_block_alignment: unexpected argument pp=; expected tp, ep, vllm_version, gpu_arch"),
    ("fp8_block_alignment(8, False, '0.17.0')",
     "@pytest.mark.fp8_block_alignment: too many positional arguments (8, False, '0.17.0'); expected (tp, ep, "
     "vllm_version, gpu_arch)"),
    ("fp8_block_alignment(tp=8, ep='yes')", "@pytest.mark.fp8_block_alignment: ep='yes'; expected True or False"),
    ("fp8_block_alignment(tp=8, vllm_version='new')",
     "@pytest.mark.fp8_block_alignment: vllm_version='new'; expected a version string like '0.17.0'"),
    ("mla_kv_backend_supported(kv_cache_dtype='fp4')",
     "@pytest.mark.mla_kv_backend_supported: kv_cache_dtype='fp4'; expected one of auto, bfloat16, *"),
    ("mla_kv_backend_supported(gpu_arch='hopper')",
     "@pytest.mark.mla_kv_backend_supported: gpu_arch='hopper'; expected sm90, sm100, sm120 or '12.0'"),
    ("memory_fit(tp=4, gpus='0,1')",
     "@pytest.mark.memory_fit: gpus='0,1'; expected a list of GPU indexes like [[]0, 1, 2, 3[]]"),
])
def test_bad_marker_arguments_fail_the_test_in_one_line(pytester: pytest.Pytester, models: Path, marker: str,
                                                        message: str) -> None:
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.model("models/Kimi-K2.5-NVFP4")
        @pytest.mark.{marker}
        def test_x():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--gpu-arch", "sm90")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str()


def test_model_spec_fixture_sources(pytester: pytest.Pytester, models: Path) -> None:
    pytester.makepyfile("""
        import pytest

        def test_from_option(model_spec):
            assert model_spec.name == "Llama-3.1-8B"
            assert model_spec.weights is not None and not model_spec.weights.from_headers

        @pytest.mark.model("models/MiniMax-M2.5")
        def test_from_marker(model_spec):
            assert model_spec.expert_ffn_key == "intermediate_size"

        @pytest.mark.model("models/nowhere")
        def test_missing(model_spec):
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--gpuready-model", "models/Llama-3.1-8B")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([f"{pytester.path}/models/nowhere: directory not found; expected a model directory "
                                 "with config.json"])


def test_model_spec_without_a_model_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(model_spec): pass")
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*no model: pass --gpuready-model PATH, mark the test with "
                                 "@pytest.mark.model(path), or use a deployment"])


def test_malformed_config_json_fails_in_setup(pytester: pytest.Pytester) -> None:
    directory = pytester.path / "broken"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    pytester.makepyfile("def test_x(model_spec): pass")
    result = pytester.runpytest(*PLUGIN, "--gpuready-model", "broken")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"{directory}/config.json: key 'num_hidden_layers' is missing; expected a whole "
                                 "number >= 1 (the number of transformer layers)"])


@pytest.mark.parametrize(("args", "env", "message"), [
    (("--vllm-version", "latest"), {},
     "ERROR: --vllm-version 'latest': expected a vLLM version like 0.17.0 or 0.11.0rc2"),
    (("--gpu-arch", "hopper"), {}, "ERROR: --gpu-arch 'hopper': expected sm90, sm100, sm120 or a compute capability "
                                  "like 12.0"),
    ((), {"GPUREADY_VLLM_VERSION": "x"}, "ERROR: $GPUREADY_VLLM_VERSION 'x': expected a vLLM version like *"),
    (("--gpuready-config", "nope.yaml"), {}, "ERROR: --gpuready-config: */nope.yaml: deploy file not found"),
])
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                      args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*PLUGIN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_malformed_deploy_file_is_one_usage_error_line(pytester: pytest.Pytester) -> None:
    deploy = pytester.path / "deploy.yaml"
    deploy.write_text("deployments:\n  - name: a\n    model: m\n    tp: 4\n    gpus: [0, 1]\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*PLUGIN, "--gpuready-config", "deploy.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --gpuready-config: {deploy}: deployment 'a': key 'gpus': expected "
                                 "exactly tp=4 GPU indexes, got [[]0, 1[]]"])


def test_precedence_cli_over_env_over_ini(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nvllm_version = 0.15.0\ngpu_arch = sm90\n")
    pytester.makepyfile("""
        from pytest_gpuready.plugin.options import GPU_ARCH, VLLM_VERSION

        def test_resolved(pytestconfig):
            print("RESOLVED", VLLM_VERSION.get(pytestconfig), GPU_ARCH.get(pytestconfig))
    """)
    result = pytester.runpytest(*PLUGIN, "-s")
    result.stdout.fnmatch_lines(["*RESOLVED 0.15.0 (9, 0)*"])
    monkeypatch.setenv("GPUREADY_VLLM_VERSION", "0.17.0")
    result = pytester.runpytest(*PLUGIN, "-s")
    result.stdout.fnmatch_lines(["*RESOLVED 0.17.0 (9, 0)*"])
    result = pytester.runpytest(*PLUGIN, "-s", "--vllm-version", "0.33.0", "--gpu-arch", "12.0")
    result.stdout.fnmatch_lines(["*RESOLVED 0.33.0 (12, 0)*"])


# ---------------------------------------------------------------- deployments

def test_preflight_without_a_deploy_file_skips_saying_what_to_pass(pytester: pytest.Pytester, no_gpu: None) -> None:
    result = pytester.runpytest(*PLUGIN, *DEPLOYMENTS, "-rs")
    result.assert_outcomes(skipped=8)
    assert result.stdout.str().count("no deploy file: pass --gpuready-config FILE (or set GPUREADY_CONFIG) to "
                                     "check deployments") == 8


def test_preflight_on_the_shipped_example(pytester: pytest.Pytester, no_gpu: None) -> None:
    """The README's main job: the TP=8 and Kimi-on-SM120 failures, the rest passing, GPU checks skipped."""
    result = pytester.runpytest(*PLUGIN, *DEPLOYMENTS, "--gpuready-config", str(EXAMPLE), "-rs", "-v")
    result.assert_outcomes(passed=22, failed=4, skipped=14)
    result.stdout.fnmatch_lines_random([
        "*test_tp_divisibility[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_weights_footprint_expectation[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_fp8_block_alignment[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_fp8_block_alignment[[]MiniMax-M2.5-tp8[]] FAILED*",
        "*test_fp8_block_alignment[[]MiniMax-M2.5-tp8-ep[]] PASSED*",
        "*test_mla_kv_backend[[]Kimi-K2.5-NVFP4-tp8[]] FAILED*",
        "*test_mla_kv_backend[[]Kimi-K2.5-NVFP4-tp8-bf16kv[]] PASSED*",
        "*test_mla_kv_backend[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_vllm_load_rules[[]MiniMax-M2.5-tp8[]] FAILED*",
        "*test_vllm_load_rules[[]MiniMax-M2.5-tp8-ep[]] PASSED*",
        "*test_vllm_load_rules[[]Kimi-K2.5-NVFP4-tp8[]] FAILED*",
        "SKIPPED [[]5[]] *: no GPU here: pass --gpu-host HOST to check memory fit",
        "SKIPPED [[]3[]] *: models/MiniMax-M2.5: config only, no safetensors weights to check",
        "gpuready: deploy file *deploy.yaml: MiniMax-M2.5-tp4, MiniMax-M2.5-tp8, MiniMax-M2.5-tp8-ep, *",
    ])


def test_failed_invariants_are_one_line_per_deployment_and_check(pytester: pytest.Pytester, no_gpu: None) -> None:
    """docs/report.md: host, deployment, the headline (the verdict's summary), ``(+N more)``; the
    headline is cut for the count, never the count; different deployments never share a line."""
    result = pytester.runpytest(*PLUGIN, *DEPLOYMENTS, "--gpuready-config", str(EXAMPLE), "--color=no")
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "gpuready: failed invariants" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("="))
    failures = lines[start + 1:end]
    assert [line.split(":")[0] for line in failures] == [
        "local  MiniMax-M2.5-tp8  fp8_block_alignment",
        "local  MiniMax-M2.5-tp8  vllm_load_rules",
        "local  Kimi-K2.5-NVFP4-tp8  vllm_load_rules",
        "local  Kimi-K2.5-NVFP4-tp8  mla_kv_backend",
    ]
    assert all(len(line) <= 100 and re.search(r"\.\.\. \(\+2 more\)$", line) for line in failures), failures
    assert failures[0].startswith("local  MiniMax-M2.5-tp8  fp8_block_alignment: MiniMax-M2.5 does not load at TP=8")
    assert failures[2].startswith("local  Kimi-K2.5-NVFP4-tp8  vllm_load_rules: Kimi-K2.5-NVFP4 on SM120 with KV")


def test_deployment_marker_runs_the_static_checks(pytester: pytest.Pytester, no_gpu: None) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.deployment("MiniMax-M2.5-tp4")
        def test_tp4(deployment, model_spec):
            assert deployment.expect.single_stream.min_output_tok_s == 80
            assert model_spec.name == "MiniMax-M2.5"

        @pytest.mark.deployment("MiniMax-M2.5-tp8")
        def test_tp8():
            pass

        @pytest.mark.deployment("Kimi-K2.5-NVFP4-tp8-bf16kv")
        def test_kimi_bf16():
            pass

        @pytest.mark.deployment("huge")
        def test_unknown():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--gpuready-config", str(EXAMPLE))
    result.assert_outcomes(passed=2, failed=1, errors=1)  # a violation fails; an unknown name is an error
    result.stdout.fnmatch_lines(["FAILED *::test_tp8*"])
    result.stdout.fnmatch_lines_random([
        "MiniMax-M2.5 does not load at TP=8: The output_size of gate's and up's weight = 192 *",
        f"{EXAMPLE}: no deployment named 'huge'; the file has MiniMax-M2.5-tp4, *",
    ])


def test_deployment_marker_without_a_deploy_file_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.deployment("MiniMax-M2.5-tp4")
        def test_tp4():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=1)


@pytest.fixture
def sparse_minimax(pytester: pytest.Pytester) -> Path:
    """MiniMax-M2.5's real tensor layout as a sparse 230 GB checkpoint, and a deploy file for it."""
    directory = pytester.path / "MiniMax-M2.5"
    config = json.loads((CONFIGS / "MiniMaxAI__MiniMax-M2.5.json").read_text())
    write_checkpoint(directory, minimax_m2_tensors(), shards=119, config=config)
    (pytester.path / "deploy.yaml").write_text(
        "deployments:\n"
        "  - name: MiniMax-M2.5-tp4\n    model: MiniMax-M2.5\n    gpus: [0, 1, 2, 3]\n    vllm_version: \"0.17.0\"\n"
        "    serve: {max_model_len: 196608}\n    expect: {weights_per_gpu_gib: {min: 50, max: 57}}\n")
    return directory


def test_memory_fit_and_files_on_the_stand_in_box(pytester: pytest.Pytester, standin: Standin,
                                                  sparse_minimax: Path) -> None:
    standin("rtx8-clean")
    result = pytester.runpytest(*PLUGIN, *DEPLOYMENTS, "--gpuready-config", "deploy.yaml", "-v")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines_random([
        "*test_vllm_load_rules[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_memory_fit[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_model_files_complete[[]MiniMax-M2.5-tp4[]] PASSED*",
        "*test_weights_footprint_expectation[[]MiniMax-M2.5-tp4[]] PASSED*",
    ])


def test_memory_fit_fails_on_busy_gpus_and_files_on_a_truncated_shard(pytester: pytest.Pytester, standin: Standin,
                                                                      sparse_minimax: Path) -> None:
    standin("rtx8-tp4-loaded")
    shard = sparse_minimax / "model-00007-of-00119.safetensors"
    os.truncate(shard, shard.stat().st_size - 4096)
    result = pytester.runpytest(*PLUGIN, *DEPLOYMENTS, "--gpuready-config", "deploy.yaml",
                                "-k", "memory_fit or files_complete")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines_random([
        "MiniMax-M2.5 at TP=4: GPU 0: Free memory on device cuda:0 (1.14/95.59 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 86.03 GiB). *",
        "MiniMax-M2.5: 119 shards, 214.2 GiB, 96,103 tensors: 1 problem(s) with the files, first: "
        "model-00007-of-00119.safetensors: file is * bytes*",
        "  model-00007-of-00119.safetensors: file is * bytes but its header describes * truncated download, "
        "4096 bytes missing",
    ])


def test_memory_fit_marker(pytester: pytest.Pytester, standin: Standin, sparse_minimax: Path) -> None:
    standin("rtx8-clean")
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.model("MiniMax-M2.5")

        @pytest.mark.memory_fit(tp=4, max_model_len=196608)
        def test_fits():
            pass

        @pytest.mark.memory_fit(tp=4, max_model_len=2_000_000)
        def test_too_long():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*MiniMax-M2.5: User-specified max_model_len (2000000) is greater than the "
                                 "derived max_model_len (max_position_embeddings=196608 *"])


def test_deployment_fixture_without_a_name(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(deployment): pass")
    result = pytester.runpytest(*PLUGIN, "--gpuready-config", str(EXAMPLE))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["the deployment fixture needs @pytest.mark.deployment(name)"])


@pytest.mark.parametrize(("marker", "message"), [
    ("fp8_block_alignment(8, tp=8)", "@pytest.mark.fp8_block_alignment: tp given twice"),
    ("model(42)\n        @pytest.mark.fp8_block_alignment(tp=1)", "@pytest.mark.model: path=42; expected a model "
                                                                  "directory path"),
    ("memory_fit(tp=4, gpu_memory_utilization=1.5)",
     "@pytest.mark.memory_fit: arguments={*}; expected ServeArgs.gpu_memory_utilization (--gpu-memory-utilization): "
     "expected a number > 0 and <= 1, got 1.5"),
])
def test_more_bad_marker_arguments(pytester: pytest.Pytester, models: Path, standin: Standin, marker: str,
                                   message: str) -> None:
    standin("rtx8-clean")
    write_checkpoint(pytester.path / "tiny", minimax_m2_tensors(layers=1, experts=2), shards=1,
                     config=json.loads((CONFIGS / "MiniMaxAI__MiniMax-M2.5.json").read_text()))
    pytester.makepyfile(f"""
        import pytest

        pytestmark = pytest.mark.model("tiny")

        @pytest.mark.{marker}
        def test_x():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


def test_gpus_without_a_reported_architecture(pytester: pytest.Pytester, models: Path, standin: Standin) -> None:
    standin("legacy-driver")  # an old driver: no compute_cap field
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/Kimi-K2.5-NVFP4")
        @pytest.mark.mla_kv_backend_supported
        def test_x():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["local: the GPUs' compute capability was not reported; pass --gpu-arch SM"])


def test_gpus_of_mixed_architectures(pytester: pytest.Pytester, models: Path, standin: Standin,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A box with an H200 and an RTX PRO 6000: rows from the two real captures, in one scenario."""
    scenarios = Path(__file__).parent.parent / "standin" / "scenarios"
    mixed = pytester.path / "mixed-scenario"
    mixed.mkdir()
    h200 = (scenarios / "h200-idle" / "query-gpu.csv").read_text().splitlines()
    rtx = [line for line in (scenarios / "rtx8-clean" / "query-gpu.csv").read_text().splitlines()
           if not line.startswith("#")]
    (mixed / "query-gpu.csv").write_text("\n".join([*h200, rtx[1]]) + "\n")
    (mixed / "topo.txt").write_text((scenarios / "h200-idle" / "topo.txt").read_text())
    standin("h200-idle")
    monkeypatch.setenv("GPUREADY_STANDIN_SCENARIO", str(mixed))
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/Kimi-K2.5-NVFP4")
        @pytest.mark.mla_kv_backend_supported
        def test_x():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["local: the GPUs mix architectures (SM120, SM90); pass --gpu-arch SM or select "
                                 "GPUs of one kind"])


def test_a_marker_typo_is_reported_even_without_a_model(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.fp8_block_alignment(tp=8, epp=True)
        def test_x():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["@pytest.mark.fp8_block_alignment: unexpected argument epp=; expected tp, ep, "
                                 "vllm_version, gpu_arch"])


CORRUPTIONS = ("header-not-json", "header-past-eof", "header-2**63", "nested-too-deep", "index-outside",
               "symlink-loop")


def _corrupt(directory: Path, case: str) -> None:
    """One way a weights file can be there and unreadable (each a real file, written here)."""
    shard = directory / "model.safetensors"
    if case == "header-not-json":
        shard.write_bytes(struct.pack("<Q", 5) + b"hello")
    elif case == "header-past-eof":
        shard.write_bytes(struct.pack("<Q", 500) + b"{}")
    elif case == "header-2**63":
        shard.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    elif case == "nested-too-deep":
        header = b"[" * 100_000 + b"]" * 100_000
        shard.write_bytes(struct.pack("<Q", len(header)) + header)
    elif case == "index-outside":
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"lm_head.weight": "../elsewhere.safetensors"}}))
    elif case == "symlink-loop":
        shard.symlink_to(shard.name)


@pytest.mark.parametrize(("case", "fault"), [
    ("header-not-json", "model.safetensors: header is not valid JSON"),
    ("header-past-eof", "model.safetensors: header length 500 is larger than the file (10 bytes)"),
    ("header-2**63", "model.safetensors: header length 9223372036854775808 exceeds the safetensors limit"),
    ("nested-too-deep", "model.safetensors: header is JSON nested too deeply"),
    ("index-outside", "model.safetensors.index.json: shard '../elsewhere.safetensors' is not a file name in the "
                      "model directory"),
    ("symlink-loop", "model.safetensors: a symlink loop"),
], ids=lambda value: value if value in CORRUPTIONS else "")
def test_a_corrupt_checkpoint_fails_naming_the_file_never_config_only(
        pytester: pytest.Pytester, no_gpu: None, case: str, fault: str) -> None:
    """A weights file that is there and cannot be read fails the files check (never "config only"),
    and what needs its size errors (could not measure) instead of passing on a derived guess."""
    directory = add_model(pytester, "MiniMaxAI__MiniMax-M2.5", "MiniMax-M2.5")
    _corrupt(directory, case)
    (pytester.path / "deploy.yaml").write_text(
        "deployments:\n  - name: d\n    model: models/MiniMax-M2.5\n    tp: 4\n    vllm_version: \"0.17.0\"\n"
        "    expect: {weights_per_gpu_gib: {min: 50, max: 57}}\n")
    result = pytester.runpytest(*PLUGIN, *DEPLOYMENTS, "--gpuready-config", "deploy.yaml", "-rfEs",
                                "-k", "files_complete or footprint")
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines([f"MiniMax-M2.5: 1 shards, 0.0 GiB, 0 tensors: * problem(s) with the files, "
                                 f"first: {fault}*"])
    result.stdout.fnmatch_lines(["*ERROR at call of test_weights_footprint_expectation[[]d[]]*",
                                 "MiniMax-M2.5: cannot size the weights, 1 of 1 shard(s) unreadable*"])
    assert "config only" not in result.stdout.str()


def test_a_config_only_directory_is_never_a_complete_checkpoint(pytester: pytest.Pytester, no_gpu: None) -> None:
    """docs/checks/model_spec.md: derived weights are an estimate, so ``weights.complete`` is False."""
    add_model(pytester, "MiniMaxAI__MiniMax-M2.5", "MiniMax-M2.5")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.model("models/MiniMax-M2.5")
        def test_checkpoint_is_complete(model_spec):
            assert model_spec.weights.complete, model_spec.weights.provenance()
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*derived from config.json*"])


def test_an_unreachable_host_errors_every_test_that_needs_it(pytester: pytest.Pytester) -> None:
    """README: "error: the check could not measure: host unreachable". Every host-needing test of
    the preflight errors, the five memory fits (measured in the test's body) included; the static
    checks, which need no host, still fail on what they measured."""
    result = pytester.runpytest("-p", "no:cacheprovider", "--pyargs", "pytest_gpuready.preflight",
                                "--gpuready-config", str(EXAMPLE), "--gpu-host", "ssh://root@127.0.0.1:1", "-rfE")
    result.assert_outcomes(passed=22, failed=4, skipped=9, errors=34)
    text = result.stdout.str()
    assert len(re.findall(r"^FAILED ", text, re.MULTILINE)) == 4  # the static checks' measured violations
    assert len(re.findall(r"^ERROR \S*test_deployments.py::test_memory_fit\[", text, re.MULTILINE)) == 5
    assert len(re.findall(r"^ERROR \S*test_host.py::", text, re.MULTILINE)) == 3
    assert not re.search(r"^FAILED .*test_memory_fit", text, re.MULTILINE)
    assert "All traceback entries are hidden" not in text
