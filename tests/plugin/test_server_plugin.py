"""The server fixtures end to end with pytester, without vLLM: options, usage errors, fast failure,
skips. (The fixtures with a real vLLM are in tests/vllm/.) The launch command is configurable,
so a plain ``sh`` script that exits with vLLM's kind of error stands where ``vllm serve`` would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

PLUGIN = ("-p", "pytest_gpuready.plugin.server_fixtures", "-p", "no:cacheprovider")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

FAILING = """
from pytest_gpuready import ServeSpec

SPEC = ServeSpec(model="/models/MiniMax-M2.5", label="MiniMax-M2.5")

def test_first(vllm_server):
    vllm_server(SPEC)

def test_second(vllm_server):
    vllm_server(SPEC)
"""

FAKE_VLLM = ("sh -c 'echo \"INFO 01-15 10:12:01 [gpu_worker.py:424] Loading weights\"; "
             "echo \"ValueError: Free memory on device cuda:0 (8.88/121.69 GiB) on startup is less than desired "
             "GPU memory utilization (0.85, 103.44 GiB).\" >&2; exit 1' fake-vllm")


def test_help_lists_the_server_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*PLUGIN, "--help")
    result.stdout.fnmatch_lines([
        "*--vllm-cmd=COMMAND*Command that launches vLLM before the model*",
        "*--vllm-ready-timeout=SECONDS*",
        "*--vllm-url=URL*Attach to an already running vLLM server*",
        "*--gpuready-report=PATH*",
    ])


@pytest.mark.parametrize(("args", "message"), [
    (("--vllm-ready-timeout", "soon"), "ERROR: --vllm-ready-timeout 'soon': expected a number > 0"),
    (("--vllm-url", "gpu-box:8000"),
     "ERROR: --vllm-url 'gpu-box:8000': expected the server's base URL like http://10.0.0.7:8000"),
    (("--vllm-cmd", "vllm 'serve"),
     "ERROR: --vllm-cmd \"vllm 'serve\": expected a command line like 'vllm serve' (No closing quotation)"),
])
def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    result = pytester.runpytest(*PLUGIN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_env_var_sets_the_ready_timeout_and_a_bad_one_names_the_variable(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUREADY_VLLM_READY_TIMEOUT", "-5")
    result = pytester.runpytest(*PLUGIN)
    result.stderr.fnmatch_lines(["ERROR: $GPUREADY_VLLM_READY_TIMEOUT '-5': expected a number > 0"])


def test_a_server_that_exits_fails_the_test_at_once_and_later_requests_without_retrying(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_launch=FAILING)
    report = pytester.path / "figures.json"
    result = pytester.runpytest(*PLUGIN, "--vllm-cmd", FAKE_VLLM, f"--gpuready-report={report}")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        f"gpuready: vLLM launch command: {FAKE_VLLM}",
        "*_ test_first _*",
        "vLLM MiniMax-M2.5 exited with code 1 before it was ready: ValueError: Free memory on device cuda:0 "
        "(8.88/121.69 GiB) on startup is less than desired GPU memory utilization (0.85, 103.44 GiB). "
        "(command: sh -c '*' fake-vllm --model /models/MiniMax-M2.5 --host 127.0.0.1 --port *)",
        "--- last lines of the vLLM log (*) ---",
        "INFO 01-15 10:12:01 [gpu_worker.py:424] Loading weights",
        "*_ test_second _*",
        "vLLM MiniMax-M2.5 exited with code 1 before it was ready: *",
        "(this server already failed to start earlier in the session)",
    ])
    assert "Traceback" not in result.stdout.str()
    assert json.loads(report.read_text())["servers"] == []


def test_a_deployment_name_without_a_deploy_file_skips_with_what_to_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_named(vllm_server):\n    vllm_server('MiniMax-M2.5-tp4')\n")
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no deploy file: pass --gpuready-config FILE*"])


def test_minimax_example_skips_without_a_gpu(pytester: pytest.Pytester, no_gpu_path: None) -> None:
    shutil.copy(EXAMPLES / "test_minimax_m25.py", pytester.path / "test_minimax_m25.py")
    shutil.copy(EXAMPLES / "deploy.yaml", pytester.path / "deploy.yaml")
    shutil.copytree(EXAMPLES / "models", pytester.path / "models")
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["*no NVIDIA GPU*"])


def test_the_tiny_cpu_example_skips_without_a_model(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUREADY_EXAMPLE_MODEL", raising=False)
    shutil.copy(EXAMPLES / "test_tiny_cpu.py", pytester.path / "test_tiny_cpu.py")
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*set GPUREADY_EXAMPLE_MODEL to a model directory*"])
