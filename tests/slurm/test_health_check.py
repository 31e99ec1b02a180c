"""``gpuready slurm-health`` as the cluster's HealthCheckProgram, run by slurmd itself.

The node's GPU is the labelled stand-in ``nvidia-smi`` (CI has no GPU) replaying captured H200
output; a dirty GPU is held by a real process here (a stand-in vLLM engine re-parented to pid 1,
as one is after its API server was killed). Everything else is real: slurmd runs the check every
few seconds with an empty environment, the check drains and resumes through scontrol, and the
tests read the node as an operator does (``sinfo -R``). Each waits on the node's state or on the
check's own log, with a deadline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engines import orphaned_engine
from tests.report_schema import validate
from tests.slurm_cluster import SlurmCluster, wait_for
from tests.sshd import STANDIN_SCENARIOS

pytestmark = pytest.mark.slurm


def drained_reason(cluster: SlurmCluster) -> str | None:
    state, reason = cluster.state()
    return reason if state.startswith("drain") else None


def orphan_scenario(tmp_path: Path, pid: int) -> Path:
    """``h200-orphan-enginecore`` with its captured engine (pid 3504) standing for a live local process."""
    scenario = tmp_path / "h200-orphan-enginecore"
    shutil.copytree(STANDIN_SCENARIOS / "h200-orphan-enginecore", scenario)
    (scenario / "pids").write_text(f"3504={pid}\n")
    return scenario


def test_a_clean_node_stays_up(node: SlurmCluster) -> None:
    since = time.time()
    node.enable("health")
    runs = node.wait_for_checks(since, 2)
    healthy = (0, f"gpuready slurm-health: node {node.node}: healthy")
    assert [(r.returncode, r.output) for r in runs[:2]] == [healthy] * 2
    assert node.state() == ("idle", "")
    report = json.loads((node.reports / f"{node.node}-health.json").read_text())
    validate(report)
    outcomes = {t["nodeid"].rsplit("::", 1)[1]: t["outcome"] for t in report["tests"]}
    assert {"test_gpus_are_clean", "test_shm_is_clean", "test_gpu_topology"} <= set(outcomes)
    assert any("test_health.py" in t["nodeid"] for t in report["tests"])  # the GPU health checks too
    assert set(outcomes.values()) == {"passed"}
    assert report["hosts"][0]["gpu_count"] == 1


def test_an_orphaned_engine_drains_the_node_with_its_cause_and_its_end_resumes_it(
        node: SlurmCluster, tmp_path: Path) -> None:
    with orphaned_engine() as engine:
        node.use_scenario(orphan_scenario(tmp_path, engine.pid))
        node.enable("health")
        reason = wait_for("the health check to drain the node", lambda: drained_reason(node))
        assert reason.startswith(f"gpuready: gpus_clean: GPU 0: 71832 MiB used, held by pid {engine.pid} "
                                 "(VLLM::EngineCor"), reason
        assert "orphaned vLLM engine" in reason
        assert len(reason.encode()) <= 255
        assert f"{reason}|{node.node}" in node.reasons()  # what an operator reads in sinfo -R
        assert engine.alive()  # named, never signalled without --gpu-reap-orphans
    # the engine is gone: the stand-in driver frees its memory, as the real one does
    wait_for("the health check to resume the node", lambda: node.state() == ("idle", ""))
    # the node is idle once scontrol has resumed it; the check's log line comes as it exits
    resumed = wait_for("the resuming check's log line",
                       lambda: [r for r in node.runs("health") if "resumed" in r.output] or None)
    assert "(gpuready had drained it: gpuready: gpus_clean: GPU 0" in resumed[-1].output


def test_an_operators_drain_is_left_alone_clean_or_dirty(node: SlurmCluster) -> None:
    operator = "operator: swapping a PSU"
    node.scontrol("update", f"NodeName={node.node}", "State=DRAIN", f"Reason={operator}")
    since = time.time()
    node.enable("health")
    node.wait_for_checks(since, 2)  # healthy: a gpuready drain would have been resumed by now
    assert node.state() == ("drained", operator)

    node.use_scenario("h200-one-process")
    since = time.time()
    runs = node.wait_for_checks(since, 2)
    assert runs[-1].returncode == 1
    assert f"left drained as the operator set it ({operator})" in runs[-1].output
    assert "gpus_clean: GPU 0: 21007 MiB used, held by pid 431" in runs[-1].output
    assert node.state() == ("drained", operator)


def test_a_hung_driver_is_cut_at_the_deadline_and_drains_naming_it(node: SlurmCluster) -> None:
    node.use_scenario("hang-query-gpu")
    node.set_args("health", "--timeout", "20")
    try:
        since = time.time()
        node.enable("health")
        reason = wait_for("the health check to drain the node", lambda: drained_reason(node), timeout=120)
        run = node.wait_for_checks(since, 1)[0]
        assert run.ended - run.started < 20 + 5, run  # its own bound, well inside slurmd's 60 s
        # the probe's own deadline (a share of the run's) names what hung, well before the run's
        assert reason.startswith("gpuready: test_gpus_are_clean "), reason
        assert "local: GPUs could not be read: nvidia-smi --query-gpu did not answer within 8 s" in reason, reason
    finally:
        node.set_args("health")


def test_with_slurms_empty_environment_scontrol_needs_the_conf_and_the_error_says_so(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    """What slurmd gives a HealthCheckProgram: no SLURM_CONF, no PATH (here, no /etc/slurm/slurm.conf)."""
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("this machine has /etc/slurm/slurm.conf: scontrol finds a configuration without SLURM_CONF")
    done = subprocess.run([sys.executable, "-m", "pytest_gpuready", "slurm-health", "--report",
                           f"{tmp_path}/{{node}}.json"], env={"SLURMD_NODENAME": cluster.node}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 3
    assert done.stderr.startswith(f"gpuready slurm-health: node {cluster.node}: scontrol show node: ")
    assert "Could not establish a configuration source" in done.stderr
    assert done.stderr.endswith("; set SLURM_CONF or pass --slurm-conf FILE (Slurm runs a health check with an "
                                "empty environment)\n")
