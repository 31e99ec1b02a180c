"""``srun`` fans the preflight out (one task per node; here three tasks on the one node), each task
writes its ``--gpuready-report``, and ``gpuready report merge`` makes them one report that
validates against the shipped schema, with the per-host table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report_schema import validate
from tests.slurm_cluster import SlurmCluster
from tests.sshd import STANDIN_BIN, STANDIN_SCENARIOS

pytestmark = pytest.mark.slurm

TASKS = 3


def test_srun_fan_out_and_one_merged_report(node: SlurmCluster, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    # task 1 sees a GPU held by a process, the others a clean one (the stand-in's scenario per task)
    task = (f"[ $SLURM_PROCID = 1 ] && export GPUREADY_STANDIN_SCENARIO={STANDIN_SCENARIOS / 'h200-one-process'}; "
            f"exec {sys.executable} -m pytest --pyargs pytest_gpuready.preflight.test_host --noconftest "
            f"-p no:cacheprovider -q --gpu-host local --shm-leak-pattern '{node.shm_pattern}' "
            f"--gpuready-report {reports}/task$SLURM_PROCID.json")
    # --overcommit: more tasks than the 2 CPUs of a CI machine; --immediate: fail, never queue
    done = node.run(node.binaries["srun"], "-N1", f"-n{TASKS}", "--overcommit", "--immediate=30",
                    f"--chdir={tmp_path}", "sh", "-c", task,
                    timeout=240, PATH=f"{STANDIN_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
                    GPUREADY_STANDIN_SCENARIO=str(STANDIN_SCENARIOS / "h200-idle"))
    assert done.returncode == 1, done.stdout + done.stderr  # task 1's preflight failed, so srun says so
    files = sorted(reports.glob("task*.json"))
    assert [f.name for f in files] == [f"task{i}.json" for i in range(TASKS)]

    merged_path = tmp_path / "merged.json"
    merge = subprocess.run([sys.executable, "-m", "pytest_gpuready", "report", "merge", *map(str, files),
                            "-o", str(merged_path)], capture_output=True, text=True, timeout=60, check=False)
    assert merge.returncode == 1, merge.stderr  # one of the runs failed
    merged = json.loads(merged_path.read_text())
    validate(merged)
    assert len(merged["tests"]) == 3 * TASKS
    assert merged["exit_status"] == 1
    assert [h["name"] for h in merged["hosts"]] == [node.node]  # 'local' in each task is this node
    assert merged["timings"]["per_host"][node.node]["tests"] == 3 * TASKS
    assert [m["path"] for m in merged["merged_from"]] == list(map(str, files))
    failed = [t for t in merged["tests"] if t["outcome"] == "failed"]
    assert [t["nodeid"].rsplit("::", 1)[1] for t in failed] == ["test_gpus_are_clean"]

    lines = merge.stdout.splitlines()
    assert lines[0].split() == ["host", "GPUs", "driver", "tests", "ok", "fail", "err", "skip", "first", "failure"]
    row = lines[1].split()
    assert row[:8] == [node.node, "1", "580.159.04", "9", "8", "1", "0", "0"]
    assert "  gpus_clean: GPU 0: 21007 MiB used, held " in lines[1]  # cut to 100 columns
    assert len(lines[1]) <= 100
    # One line per host and invariant: the headline and how many details more (docs/report.md).
    assert f"{node.node}  gpus_clean: 1 of 1 GPUs on local are not clean (tolerance 64 MiB) (+1 more)" in merge.stdout
    assert lines[-1] == f"merged {TASKS} reports: 1 hosts, {3 * TASKS} tests; written to {merged_path}"
