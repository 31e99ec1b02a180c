"""examples/ci/github-actions-serving-baseline.yml: it parses, saves the baseline only on main and
only after comparing, and every option of its pytest command is one the plugin declares (a renamed
option would break a user's copy of it)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from pytest_gpuready.plugin import options

WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "ci" / "github-actions-serving-baseline.yml"


def steps() -> list[dict[str, Any]]:
    document: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    job: dict[str, Any] = document["jobs"]["serving-gate"]
    assert "self-hosted" in job["runs-on"]
    listed: list[dict[str, Any]] = job["steps"]
    return listed


def test_the_baseline_is_restored_compared_then_saved_on_main_only() -> None:
    names = [step.get("uses", "").split("@")[0] or step["name"] for step in steps()]
    restore, gate, save = (names.index("actions/cache/restore"), names.index("Serve, benchmark and compare"),
                           names.index("actions/cache/save"))
    assert restore < gate < save
    saving = steps()[save]
    assert saving["if"] == "always() && github.ref == 'refs/heads/main'"
    assert saving["with"]["key"] == steps()[restore]["with"]["key"]
    assert steps()[restore]["with"]["restore-keys"] == "serving-baseline-"
    command = steps()[gate]["run"]
    assert "github.ref == 'refs/heads/main' && '--gpuready-baseline-save'" in command
    chart = next(step for step in steps() if step.get("uses", "").startswith("benchmark-action/"))
    assert chart["with"]["tool"] == "customBiggerIsBetter"
    assert chart["with"]["output-file-path"] == "bench/bigger-is-better.json"


def test_every_option_of_the_command_is_declared() -> None:
    gate = next(step for step in steps() if step.get("name") == "Serve, benchmark and compare")
    command = re.sub(r"\$\{\{.*?\}\}", "--gpuready-baseline-save", gate["run"])
    words = shlex.split(command)
    assert words[:3] == ["python3", "-m", "pytest"]
    declared = {setting.flag for setting in options.ALL_SETTINGS}
    ours = [word.split("=", 1)[0] for word in words if word.startswith("--gpuready")]
    assert ours
    assert [flag for flag in ours if flag not in declared] == []
    env = yaml.safe_load(WORKFLOW.read_text())["jobs"]["serving-gate"]["env"]
    assert set(env) <= {setting.env for setting in options.ALL_SETTINGS}
    assert options.GPUREADY_BASELINE.env in env
