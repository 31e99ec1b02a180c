"""``--gpu-arch`` in a pytest run: a value no GPU has is a usage error; beside a deploy file whose
deployments set their own ``gpu_arch``, the run says once which value the checks use and why.

The precedence is the README's ("Options and their precedence"): for the model checks a
deployment's (or a marker's) GPU architecture wins over the options.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy.yaml"
DEPLOYMENTS = ("--pyargs", "pytest_gpuready.preflight.test_deployments", "-p", "no:cacheprovider")


@pytest.mark.parametrize("arch", ["sm89x", "sm1000", "sm99999999999999999999999"])
def test_a_gpu_arch_no_gpu_has_is_a_usage_error_before_any_test(pytester: pytest.Pytester, arch: str) -> None:
    pytester.makepyfile("def test_ran():\n    open('ran', 'w').close()\n")
    result = pytester.runpytest("--gpu-arch", arch)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (f"ERROR: --gpu-arch {arch!r}: expected sm90, sm100, sm120 or a compute "
                                      "capability like 12.0")
    assert not (pytester.path / "ran").exists()


def test_the_deploy_files_gpu_arch_wins_over_the_option_and_the_run_says_so_once(pytester: pytest.Pytester,
                                                                                  ) -> None:
    result = pytester.runpytest(*DEPLOYMENTS, "--gpuready-config", str(DEPLOY), "--gpu-arch", "sm90", "-k",
                                "mla_kv_backend")
    said = [line for line in result.stdout.lines if "disagree" in line]
    assert said == [
        f"gpuready: --gpu-arch SM90 and the gpu_arch of {DEPLOY} disagree: MiniMax-M2.5-tp4, MiniMax-M2.5-tp8, "
        "MiniMax-M2.5-tp8-ep, Kimi-K2.5-NVFP4-tp8, Kimi-K2.5-NVFP4-tp8-bf16kv use SM120, the deploy file's value "
        "(a deployment's gpu_arch wins over the options; a marker's gpu_arch over both)"]
    # ... and the checks did use SM120: Kimi's FP8 KV cache has no MLA backend there (SM90 has FlashMLA).
    result.stdout.fnmatch_lines(["Kimi-K2.5-NVFP4 on SM120 with KV cache fp8_e4m3: No valid attention backend*"])


def test_no_line_when_they_agree_or_the_option_is_not_given(pytester: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for args in (("--gpu-arch", "sm120"), ()):
        result = pytester.runpytest(*DEPLOYMENTS, "--gpuready-config", str(DEPLOY), "-k", "mla_kv_backend", *args)
        assert not [line for line in result.stdout.lines if "disagree" in line]
    monkeypatch.setenv("GPUREADY_GPU_ARCH", "sm90")
    result = pytester.runpytest(*DEPLOYMENTS, "--gpuready-config", str(DEPLOY), "-k", "mla_kv_backend")
    result.stdout.fnmatch_lines(["gpuready: $GPUREADY_GPU_ARCH SM90 and the gpu_arch of * disagree: *"])


def test_a_config_only_model_with_a_broken_index_total_is_an_error_not_a_fallback(pytester: pytest.Pytester,
                                                                                  ) -> None:
    model = pytester.path / "models" / "MiniMax-M2.5"
    model.mkdir(parents=True)
    (model / "config.json").write_text((ROOT / "examples" / "models" / "MiniMax-M2.5" / "config.json").read_text())
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": "539000000000"}, "weight_map": {"lm_head.weight": "model-00001.safetensors"}}))
    deploy = pytester.path / "deploy.yaml"
    deploy.write_text("deployments:\n  - name: m\n    model: models/MiniMax-M2.5\n    tp: 4\n    gpu_arch: sm120\n")
    result = pytester.runpytest(*DEPLOYMENTS, "--gpuready-config", str(deploy), "-k", "model_files")
    result.assert_outcomes(failed=1)  # a weights file that is there and cannot be read: never "config only"
    result.stdout.fnmatch_lines(["*model.safetensors.index.json: key 'metadata.total_size' is \"539000000000\"; "
                                 "expected the checkpoint's size in bytes, a whole number > 0*"])
