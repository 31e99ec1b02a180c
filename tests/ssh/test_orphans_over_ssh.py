"""Orphaned engines over the real loopback sshd: the lineage comes in the probe's one round trip,
and the reaper's re-check and signals run on the host. The "remote" processes are this machine's:
a real orphaned stand-in engine, listed by the labelled stand-in nvidia-smi through a ``pids`` file
in a copy of the ``h200-orphan-enginecore`` scenario (sshd passes no environment through).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_gpuready import SSHHost, check_gpus_clean, snapshot
from pytest_gpuready.host.orphans import find_orphans, reap_orphans
from tests.engines import orphaned_engine
from tests.sshd import STANDIN_SCENARIOS, LoopbackSshd

pytestmark = pytest.mark.ssh


def test_an_orphan_on_an_ssh_host_is_named_and_reaped(
    loopback_sshd: LoopbackSshd, loopback_host: SSHHost, tmp_path: Path
) -> None:
    scenario = tmp_path / "orphan"
    shutil.copytree(STANDIN_SCENARIOS / "h200-orphan-enginecore", scenario)
    with orphaned_engine(ignore_term=True) as engine, loopback_sshd.use_scenario(scenario):
        (scenario / "pids").write_text(f"3504={engine.pid}\n")
        commands_before = loopback_host.commands_run
        snap = snapshot(loopback_host)
        assert loopback_host.commands_run == commands_before + 1  # GPUs, processes and lineage: one round trip
        (process,) = snap.processes
        assert (process.pid, process.ppid, process.start_ticks) == (engine.pid, 1, engine.start_ticks)
        verdict = check_gpus_clean(snap)
        assert verdict.details == (
            f"GPU 0: 71832 MiB used, held by pid {engine.pid} (VLLM::EngineCore, an orphaned vLLM engine: its API "
            f"server is gone, parent pid 1) 71824 MiB; stop it with: kill {engine.pid}",)
        report = reap_orphans(loopback_host, find_orphans(snap), grace_s=0.5)
        assert [o.pid for o in report.stopped] == [engine.pid]
        assert report.needed_kill == (engine.pid,)
        assert not engine.alive()
        assert check_gpus_clean(snapshot(loopback_host)).ok
