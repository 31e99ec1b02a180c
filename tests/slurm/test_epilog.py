"""``gpuready slurm-health --epilog`` as the cluster's Epilog: after a real job (``srun``), slurmd
runs it with the job's variables; a process the job left behind holding the (stand-in) GPU drains
the node with the job named, and exits 1 so that Slurm knows the epilog failed."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.engines import _start_ticks
from tests.slurm_cluster import SlurmCluster, wait_for
from tests.sshd import STANDIN_SCENARIOS

pytestmark = pytest.mark.slurm

LEAVE_BEHIND = r"""
import os, sys, time
comm, pids_file, captured = sys.argv[1], sys.argv[2], sys.argv[3]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # re-parented to pid 1: out of the job's process tree, so Slurm leaves it running
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # and off the job's output pipes, so srun returns
            os.dup2(devnull, fd)
        if comm:
            with open("/proc/self/comm", "w") as handle:
                handle.write(comm)
        with open(pids_file + ".partial", "w") as handle:
            handle.write(f"{captured}={os.getpid()}\n")
        os.rename(pids_file + ".partial", pids_file)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.wait()
while not os.path.exists(pids_file):
    time.sleep(0.01)
print(os.environ["SLURM_JOB_ID"])
"""


def run_job(cluster: SlurmCluster, scenario: Path, captured: int, comm: str) -> tuple[str, int]:
    """A job that leaves a process behind, mapped onto the scenario's captured GPU process; its job id and that pid."""
    done = cluster.run(cluster.binaries["srun"], "-N1", "-n1", "--job-name=leaves-a-process", sys.executable, "-c",
                       LEAVE_BEHIND, comm, str(scenario / "pids"), str(captured), timeout=120)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    pid = int((scenario / "pids").read_text().split("=")[1])
    return job, pid


def scenario_copy(tmp_path: Path, name: str) -> Path:
    scenario = tmp_path / name
    shutil.copytree(STANDIN_SCENARIOS / name, scenario)
    return scenario


def alive(pid: int, ticks: int) -> bool:
    try:
        return _start_ticks(pid) == ticks and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError):
        return False


def test_the_epilog_drains_a_node_a_job_left_a_gpu_process_on(node: SlurmCluster, tmp_path: Path) -> None:
    scenario = scenario_copy(tmp_path, "h200-one-process")
    node.use_scenario(scenario)
    node.enable("epilog")
    job, pid = run_job(node, scenario, captured=431, comm="")
    ticks = _start_ticks(pid)
    try:
        reason = wait_for("the epilog to drain the node", lambda: node.state()[1] or None)
        assert node.state()[0].startswith("drain")
        assert reason.startswith(f"gpuready: after job {job}: gpus_clean: GPU 0: 21007 MiB used, held by pid {pid} "), \
            reason
        run = wait_for("the epilog's log line", lambda: node.runs("epilog") or None)[-1]
        assert run.returncode == 1, run  # slurmd logs the epilog as failed; the reason stays gpuready's
        assert alive(pid, ticks)  # not an orphaned vLLM engine: named, never signalled
    finally:
        if alive(pid, ticks):
            os.kill(pid, signal.SIGKILL)


def test_the_epilog_reaps_an_orphaned_engine_the_job_left_and_the_node_stays_up(
        node: SlurmCluster, tmp_path: Path) -> None:
    scenario = scenario_copy(tmp_path, "h200-orphan-enginecore")
    node.use_scenario(scenario)
    node.set_args("epilog", "--gpu-reap-orphans")
    node.enable("epilog")
    since = time.time()
    _, pid = run_job(node, scenario, captured=3504, comm="VLLM::EngineCore")
    ticks = _start_ticks(pid)
    try:
        run = wait_for("the epilog of the job", lambda: node.runs("epilog", since) or None, timeout=90)[-1]
        assert run.returncode == 0, run
        assert run.output == (f"gpuready slurm-health: node {node.node}: healthy; stopped orphaned vLLM engines on "
                              f"local: pid {pid} (VLLM::EngineCore) 71824 MiB on GPU 0"), run
        assert not alive(pid, ticks)  # stopped by --gpu-reap-orphans: its owner (the job) is gone
        assert node.state() == ("idle", "")
    finally:
        node.set_args("epilog")
        if alive(pid, ticks):
            os.kill(pid, signal.SIGKILL)


def test_the_epilog_drains_a_node_a_job_left_a_dev_shm_file_on(node: SlurmCluster) -> None:
    leftover = Path("/dev/shm") / f"{node.shm_pattern.rstrip('*')}psm_job"
    node.enable("epilog")
    try:
        write = f"open({str(leftover)!r}, 'wb').write(bytes(1 << 20)); import os; print(os.environ['SLURM_JOB_ID'])"
        done = node.run(node.binaries["srun"], "-N1", "-n1", sys.executable, "-c", write, timeout=120)
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip()
        reason = wait_for("the epilog to drain the node", lambda: node.state()[1] or None)
        assert reason.startswith(f"gpuready: after job {job}: shm_clean: {leftover}: 1.0 MiB, owner root, "), reason
        assert reason.endswith("no process holds it"), reason
        assert leftover.exists()  # named; removing it is --shm-remove-leftovers' job, opt-in
    finally:
        leftover.unlink(missing_ok=True)
