"""The docs' examples, run: what a page shows a user must be what the code does.

Each test takes its snippet from the page itself (a fenced ``python`` block, or an ``ERROR:``
line), so editing the page without the code, or the code without the page, turns it red.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIGS = ROOT / "tests" / "data" / "configs"


def python_block_defining(page: Path, name: str) -> str:
    """The fenced ``python`` block of ``page`` that defines ``def NAME(``."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    return str(next(block for block in blocks if f"def {name}(" in block))


@pytest.fixture(autouse=True)
def _no_gpuready_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUREADY_HOST", "GPUREADY_MODEL", "GPUREADY_CONFIG", "GPUREADY_STANDIN_SCENARIO"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # this machine as it is: no nvidia-smi, no NVML


def test_gpu_snapshot_page_require_gpus_skips_on_a_gpu_less_machine(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(python_block_defining(DOCS / "fixtures" / "gpu_snapshot.md", "test_enough_gpus"))
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "-k", "test_enough_gpus")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no NVIDIA GPU on this machine*"])


def test_model_spec_page_completeness_example_fails_on_a_config_only_directory(pytester: pytest.Pytester) -> None:
    model = pytester.path / "model"
    model.mkdir()
    shutil.copy(CONFIGS / "MiniMaxAI__MiniMax-M2.5.json", model / "config.json")
    pytester.makepyfile(python_block_defining(DOCS / "checks" / "model_spec.md", "test_checkpoint_is_complete"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpuready-model", str(model),
                                "-k", "test_checkpoint_is_complete")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*derived from config.json*"])


def test_deploy_config_page_unknown_key_line_is_the_real_one(pytester: pytest.Pytester) -> None:
    """The page's ``unknown key`` line, key list included, is what the loader says."""
    page = (DOCS / "checks" / "deploy_config.md").read_text()
    [shown] = re.findall(r"^ERROR: --gpuready-config: /srv/deploy.yaml: deployment 'tiny': unknown key.*$", page,
                         re.MULTILINE)
    deploy = pytester.path / "deploy.yaml"
    deploy.write_text("deployments:\n  - name: tiny\n    model: /m\n    kv_cache_dtyp: fp8\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpuready-config", str(deploy))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert shown.replace("/srv/deploy.yaml", str(deploy)) in result.stderr.str()


def test_deploy_config_page_example_counts_are_the_real_ones(pytester: pytest.Pytester) -> None:
    page = (DOCS / "checks" / "deploy_config.md").read_text()
    example = page.split("## Example: the shipped `examples/deploy.yaml`", 1)[1]
    counts = re.search(r"^(\d+) failed, (\d+) passed, (\d+) skipped$", example, re.MULTILINE)
    assert counts is not None
    result = pytester.runpytest("-p", "no:cacheprovider", "--pyargs", "pytest_gpuready.preflight.test_deployments",
                                "--gpuready-config", str(ROOT / "examples" / "deploy.yaml"))
    failed, passed, skipped = (int(n) for n in counts.groups())
    result.assert_outcomes(failed=failed, passed=passed, skipped=skipped)
