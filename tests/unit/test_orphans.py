"""Orphaned vLLM engines: named in gpus_clean, stopped by the reaper, and nothing else ever signalled.

The data is the real H200 capture (tests/data/nvidia-smi/h200x1-orphan-enginecore.txt): after
SIGKILL of the API server (pid 3398), ``VLLM::EngineCore`` pid 3504 lived on at parent pid 1
holding 71,824 MiB. The pure tests rebuild that process table from the capture's ``ps`` lines;
the process tests use real processes named as vLLM names its engines (tests/engines.py) and the
labelled stand-in nvidia-smi listing their pids in place of the captured ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost, check_gpus_clean, snapshot
from pytest_gpuready.host.orphans import (
    find_orphans,
    orphan_reason,
    parse_lineage,
    parse_stat,
    read_lineage_locally,
    reap_orphans,
)
from pytest_gpuready.host.snapshot import GpuProcess, HostSnapshot, ProcessInfo
from tests.conftest import DATA
from tests.engines import orphaned_engine, served_engine

CAPTURE = (DATA / "nvidia-smi" / "h200x1-orphan-enginecore.txt").read_text()
API_SERVER_ARGS = next(line.split(None, 4)[4] for line in CAPTURE.splitlines() if line.startswith(" 3398 "))
ISSUE_LINE = ("GPU 0: 71832 MiB used, held by pid 3504 (VLLM::EngineCore, an orphaned vLLM engine: its API server is "
              "gone, parent pid 1) 71824 MiB; stop it with: kill 3504")


def captured_snapshot(standin: Callable[[str], Path]) -> HostSnapshot:
    """The stand-in's replay of the capture 3 s after the kill (there is no pid 3504 here: lineage added below)."""
    standin("h200-orphan-enginecore")
    return snapshot(LocalHost(), reader="nvidia-smi")


def with_lineage(snap: HostSnapshot, *lineage: ProcessInfo) -> HostSnapshot:
    processes = tuple(dataclasses.replace(p, alive=True, lineage=lineage) for p in snap.processes)
    return dataclasses.replace(snap, processes=processes)


ENGINE_AFTER_KILL = ProcessInfo(3504, 1, 3398, 5000, "VLLM::EngineCor", "VLLM::EngineCore")
ENGINE_BEFORE_KILL = ProcessInfo(3504, 3398, 3398, 5000, "VLLM::EngineCor", "VLLM::EngineCore")
API_SERVER = ProcessInfo(3398, 3345, 3398, 4900, "python3", API_SERVER_ARGS)


def test_the_captured_orphan_reads_as_the_issue_asks(standin: Callable[[str], Path]) -> None:
    snap = with_lineage(captured_snapshot(standin), ENGINE_AFTER_KILL)
    verdict = check_gpus_clean(snap)
    assert not verdict.ok
    assert verdict.details == (ISSUE_LINE,)
    assert verdict.evidence["gpus"][0]["processes"][0]["orphaned"] == "parent pid 1"
    (orphan,) = find_orphans(snap)
    assert (orphan.pid, orphan.process.used_memory_mib, orphan.reason) == (3504, 71824, "parent pid 1")


def test_an_engine_whose_api_server_lives_is_a_running_server(standin: Callable[[str], Path]) -> None:
    snap = with_lineage(captured_snapshot(standin), ENGINE_BEFORE_KILL, API_SERVER)
    verdict = check_gpus_clean(snap)
    assert verdict.details == (
        "GPU 0: 71832 MiB used, held by pid 3504 (VLLM::EngineCore, a vLLM engine of the running server pid 3398) "
        "71824 MiB",)
    assert find_orphans(snap) == []


def test_a_parent_that_is_not_a_vllm_api_server_makes_an_orphan() -> None:
    subreaper = ProcessInfo(812, 1, 812, 100, "systemd", "/lib/systemd/systemd --user")
    worker = ProcessInfo(3600, 3504, 3398, 5100, "VLLM::Worker_TP", "VLLM::Worker_TP0")
    engine = dataclasses.replace(ENGINE_AFTER_KILL, ppid=812)
    process = GpuProcess(3600, "VLLM::Worker_TP0", 40000, "GPU-x", 0, alive=True, lineage=(worker, engine, subreaper))
    assert orphan_reason(process) == ("parent pid 3504 (VLLM::EngineCor), whose parent pid 812 "
                                      "(/lib/systemd/systemd --user) is not a vLLM API server")
    served = dataclasses.replace(process, lineage=(worker, ENGINE_BEFORE_KILL, API_SERVER))
    assert orphan_reason(served) is None


def test_what_cannot_be_proved_is_not_an_orphan() -> None:
    assert orphan_reason(GpuProcess(3504, "VLLM::EngineCore", 71824, "u", 0, alive=True)) is None  # no lineage
    python = ProcessInfo(431, 1, 431, 10, "python3", "python3 train.py")
    assert orphan_reason(GpuProcess(431, "python3", 20998, "u", 0, alive=True, lineage=(python,))) is None
    unread_parent = dataclasses.replace(ENGINE_AFTER_KILL, ppid=3398)
    assert orphan_reason(GpuProcess(3504, "VLLM::EngineCore", 1, "u", 0, alive=True, lineage=(unread_parent,))) is None
    younger_parent = dataclasses.replace(API_SERVER, start_ticks=9999, cmdline="sleep 60")
    gpu = GpuProcess(3504, "VLLM::EngineCore", 1, "u", 0, alive=True, lineage=(ENGINE_BEFORE_KILL, younger_parent))
    assert orphan_reason(gpu) is None


def test_stat_lines_with_spaces_and_parens_in_the_name_parse() -> None:
    info = parse_stat("77 (a) b (c)) S 1 77 77 0 -1 4194560 " + " ".join(["0"] * 12) + " 123456 rest")
    assert info is not None
    assert (info.pid, info.comm, info.ppid, info.session_id, info.start_ticks) == (77, "a) b (c)", 1, 77, 123456)
    assert parse_stat("garbage") is None


def test_a_real_orphan_is_found_named_and_reaped_with_the_standin_listing_its_pid(
    standin: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("h200-orphan-enginecore")
    with orphaned_engine(ignore_term=True) as engine:
        assert engine.ppid() == 1
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        snap = snapshot(LocalHost(), reader="nvidia-smi")
        (process,) = snap.processes
        assert (process.pid, process.ppid, process.start_ticks) == (engine.pid, 1, engine.start_ticks)
        assert process.session_id not in (None, engine.pid)  # the session of its dead parent, as vLLM's
        verdict = check_gpus_clean(snap)
        assert verdict.details == (ISSUE_LINE.replace("3504", str(engine.pid)),)
        report = reap_orphans(LocalHost(), find_orphans(snap), grace_s=0.5)
        assert [o.pid for o in report.stopped] == [engine.pid]
        assert report.needed_kill == (engine.pid,)  # it ignored SIGTERM
        assert not engine.alive()
        after = snapshot(LocalHost(), reader="nvidia-smi")
        assert after.processes == ()
        assert check_gpus_clean(after).ok  # the stand-in frees an exited process's MiB, as the driver does


def test_the_reaper_signals_no_served_engine_and_no_other_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  standin: Callable[[str], Path]) -> None:
    # Three rows, each a real capture: the orphan and, again, the engine row (to be served), plus
    # the python3 process of h200x1-one-process.txt. Their pids are mapped to live local processes.
    scenario = tmp_path / "mixed"
    scenario.mkdir()
    source = standin("h200-orphan-enginecore")
    (scenario / "query-gpu.csv").write_text((source / "query-gpu.csv").read_text())
    apps = (source / "query-compute-apps.csv").read_text().splitlines()
    one = (source.parent / "h200-one-process" / "query-compute-apps.csv").read_text().splitlines()
    rows = [*apps, apps[-1].replace("3504,", "3505,"), one[-1]]
    (scenario / "query-compute-apps.csv").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("GPUREADY_STANDIN_SCENARIO", str(scenario))
    with orphaned_engine() as orphan, served_engine() as served, orphaned_engine("python3") as plain:
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={orphan.pid},3505={served.pid},431={plain.pid}")
        snap = snapshot(LocalHost(), reader="nvidia-smi")
        assert sorted(p.pid for p in snap.processes) == sorted([orphan.pid, served.pid, plain.pid])
        orphans = find_orphans(snap)
        assert [o.pid for o in orphans] == [orphan.pid]
        # Even if asked to, the script's own re-check refuses a served engine and a non-vLLM process.
        forged = [dataclasses.replace(orphans[0], process=p) for p in snap.processes]
        report = reap_orphans(LocalHost(), forged, grace_s=0.5)
        assert [o.pid for o in report.stopped] == [orphan.pid]
        assert sorted(o.pid for o in report.skipped) == sorted([served.pid, plain.pid])
        assert served.alive()
        assert plain.alive()
        assert not orphan.alive()


def test_a_recycled_pid_is_never_signalled(standin: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    standin("h200-orphan-enginecore")
    with orphaned_engine() as engine:
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        (orphan,) = find_orphans(snapshot(LocalHost(), reader="nvidia-smi"))
        info = orphan.process.lineage[0]
        recycled = dataclasses.replace(info, start_ticks=info.start_ticks - 1)
        other = dataclasses.replace(orphan.process, lineage=(recycled,))
        report = reap_orphans(LocalHost(), [dataclasses.replace(orphan, process=other)], grace_s=0.5)
        assert report.stopped == ()
        assert engine.alive()


def test_local_lineage_reads_what_the_probe_section_reads() -> None:
    with served_engine() as engine:
        parsed = parse_lineage(read_lineage_locally([engine.pid]))
        chain = parsed[engine.pid]
        assert chain[0].pid == engine.pid
        assert chain[0].comm == "VLLM::EngineCor"
        assert engine.api_server is not None
        assert chain[1].pid == engine.api_server.pid
        assert "vllm.entrypoints.openai.api_server" in chain[1].cmdline
