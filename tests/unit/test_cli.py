"""The ``gpuready`` command line: one word picks the command; ``plan`` is the planner unchanged;
bad input to ``slurm-health`` is one line and exit 2, a node it cannot act on exit 3."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpuready.cli import COMMANDS, main
from pytest_gpuready.plan.cli import main as plan_main

MINIMAX = Path(__file__).resolve().parents[2] / "examples" / "models" / "MiniMax-M2.5"
CONSOLE_SCRIPT = Path(sys.executable).parent / "gpuready"


def gpuready(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gpuready", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_no_command_is_the_usage_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gpuready COMMAND [ARGS...]\n\ncommands:\n  plan ")
    for name in COMMANDS:
        assert f"\n  {name} " in err


def test_help_is_the_usage_and_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: gpuready COMMAND")


def test_an_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy"]) == 2
    assert capsys.readouterr().err == "gpuready: unknown command 'deploy': expected one of plan, slurm-health, report\n"


def test_plan_is_the_planner_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", str(MINIMAX), "--gpus", "4xH200", "--vllm-version", "0.32.0"]
    assert plan_main(args) == 0
    direct = capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr() == direct
    assert main(["plan", str(MINIMAX), "--gpus", "8xFOO"]) == plan_main(["plan", str(MINIMAX), "--gpus", "8xFOO"])


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the gpuready console script is not installed here")
def test_the_console_script_is_the_dispatcher() -> None:
    done = subprocess.run([str(CONSOLE_SCRIPT), "plan", str(MINIMAX), "--gpus", "4xH200", "--vllm-version", "0.32.0"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == gpuready("plan", str(MINIMAX), "--gpus", "4xH200", "--vllm-version", "0.32.0").stdout
    assert subprocess.run([str(CONSOLE_SCRIPT), "report", "--help"], capture_output=True, text=True,
                          timeout=60, check=False).stdout.startswith("usage: gpuready report")


@pytest.mark.parametrize(("args", "error"), [
    (["--timeout", "0"], "argument --timeout: '0': expected seconds between 1 and 3600, like 50"),
    (["--timeout", "soon"], "argument --timeout: 'soon': expected seconds between 1 and 3600, like 50"),
    (["--epilog", "--prolog"], "argument --prolog: not allowed with argument --epilog"),
    (["--frob"], "unrecognized arguments: --frob"),
])
def test_slurm_health_bad_options_are_one_line_and_exit_2(args: list[str], error: str) -> None:
    done = gpuready("slurm-health", *args)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"gpuready slurm-health: error: {error}"


def test_slurm_health_a_report_template_with_an_unknown_field_is_one_line(tmp_path: Path) -> None:
    done = gpuready("slurm-health", "--report", f"{tmp_path}/{{host}}.json")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"gpuready slurm-health: --report '{tmp_path}/{{host}}.json': only {{node}} and "
                                  "{mode} may be filled in")


def test_slurm_health_without_scontrol_cannot_act_and_says_so(tmp_path: Path) -> None:
    done = gpuready("slurm-health", "--node", "gpu-07", "--scontrol", str(tmp_path / "no-scontrol"),
                    "--report", f"{tmp_path}/{{node}}-{{mode}}.json")
    assert done.returncode == 3
    assert done.stderr == (f"gpuready slurm-health: node gpu-07: {tmp_path / 'no-scontrol'}: cannot run it: "
                           "No such file or directory\n")
    assert not (tmp_path / "gpu-07-health.json").exists()  # nothing was checked: the node's state is unknown
