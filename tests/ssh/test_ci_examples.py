"""The CI gates of examples/ci/: each file parses, gates the deploy on the preflight, publishes its
reports even when the preflight fails, and its pytest command really runs: here, against two
"hosts" of the loopback sshd (the stand-in nvidia-smi replays an idle H200 on each) with
examples/deploy.yaml, whose two broken deployments must stop the pipeline (exit 1).

The command is taken from the file as written; only the interpreter (``python3`` -> this one) and
the ssh credentials (environment variables a CI would set as secrets) are the test's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.report_schema import validate
from tests.sshd import LoopbackSshd

pytestmark = pytest.mark.ssh

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CI = EXAMPLES / "ci"


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((CI / name).read_text())
    return document


def github_command(workflow: dict[str, Any]) -> str:
    [command] = [step["run"] for step in workflow["jobs"]["gpu-preflight"]["steps"]
                 if "pytest_gpuready.preflight" in step.get("run", "")]
    return str(command)


def gitlab_command(pipeline: dict[str, Any]) -> str:
    [command] = [line for line in pipeline["gpu-preflight"]["script"] if "pytest_gpuready.preflight" in line]
    return str(command)


def test_the_github_workflow_gates_the_deploy_and_always_publishes() -> None:
    workflow = load("github-actions-gpu-preflight.yml")
    jobs = workflow["jobs"]
    assert "self-hosted" in jobs["gpu-preflight"]["runs-on"]
    assert jobs["deploy"]["needs"] == "gpu-preflight"
    publishing = [step for step in jobs["gpu-preflight"]["steps"] if step.get("if") == "always()"]
    assert {step["uses"].split("@")[0] for step in publishing} == {"mikepenz/action-junit-report",
                                                                   "actions/upload-artifact"}
    assert "preflight.json" in publishing[1]["with"]["path"]
    assert "--junitxml=preflight.xml" in github_command(workflow)


def test_the_gitlab_job_gates_the_deploy_and_reports_junit() -> None:
    pipeline = load("gitlab-ci-gpu-preflight.yml")
    assert pipeline["stages"] == ["preflight", "deploy"]
    assert pipeline["deploy"]["needs"] == ["gpu-preflight"]
    artifacts = pipeline["gpu-preflight"]["artifacts"]
    assert artifacts["when"] == "always"
    assert artifacts["reports"]["junit"] == "preflight.xml"
    assert "preflight.json" in artifacts["paths"]
    assert "--junitxml=preflight.xml" in gitlab_command(pipeline)


@pytest.fixture
def deploy_repo(tmp_path: Path, loopback_fleet: LoopbackSshd) -> Path:
    """A checkout as the CI files expect it: deploy/deploy.yaml (the example's) and deploy/fleet.txt."""
    deploy = tmp_path / "repo" / "deploy"
    deploy.mkdir(parents=True)
    shutil.copy(EXAMPLES / "deploy.yaml", deploy / "deploy.yaml")
    shutil.copytree(EXAMPLES / "models", deploy / "models")
    first, second = loopback_fleet.ports[:2]
    (deploy / "fleet.txt").write_text(f"# two loopback hosts\n{loopback_fleet.spec_for(first)}\n"
                                      f"{loopback_fleet.spec_for(second)}\n")
    return deploy.parent


@pytest.mark.parametrize(("name", "command_of"), [
    ("github-actions-gpu-preflight.yml", github_command),
    ("gitlab-ci-gpu-preflight.yml", gitlab_command),
])
def test_the_command_of_the_ci_file_runs_and_stops_the_pipeline(
        name: str, command_of: Any, deploy_repo: Path, loopback_fleet: LoopbackSshd) -> None:
    pytest.importorskip("xdist")  # the fleet extra the CI files install
    argv = shlex.split(command_of(load(name)))
    assert argv[:3] == ["python3", "-m", "pytest"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUREADY_")}
    env["GPUREADY_SSH_IDENTITY"] = loopback_fleet.identity_file
    env["GPUREADY_SSH_OPTIONS"] = "\n".join(loopback_fleet.ssh_options)
    with contextlib.ExitStack() as stack:
        for port in loopback_fleet.ports[:2]:
            stack.enter_context(loopback_fleet.use_scenario("h200-idle", port=port))
        before = loopback_fleet.accepted_by_port()
        proc = subprocess.run([sys.executable, *argv[1:], "-p", "no:cacheprovider"], cwd=deploy_repo, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        after = loopback_fleet.accepted_by_port()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output  # two deployments of the example do not load: the deploy stops
    first, second = (f"127.0.0.1:{port}" for port in loopback_fleet.ports[:2])
    assert f"test_fp8_block_alignment[MiniMax-M2.5-tp8-{first}] " in output
    assert "gpuready: xdist runs each host's tests on one worker" in output
    hosts = loopback_fleet.ports[:2]
    assert {port: after.get(port, 0) - before.get(port, 0) for port in hosts} == {port: 1 for port in hosts}
    cases = [case.get("name") for case in ET.parse(deploy_repo / "preflight.xml").iter("testcase")]
    assert f"test_gpus_are_clean[{first}]" in cases
    assert f"test_gpus_are_clean[{second}]" in cases
    report = json.loads((deploy_repo / "preflight.json").read_text())
    validate(report)
    failed = {(v["host"], v["name"]) for v in report["verdicts"] if not v["ok"]}
    assert {(first, "fp8_block_alignment"), (second, "fp8_block_alignment"), (first, "mla_kv_backend"),
            (second, "mla_kv_backend")} <= failed
