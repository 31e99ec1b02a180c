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
from pytest_gpuready.host.checks import describe_process
from pytest_gpuready.host.orphans import (
    Judgement,
    Orphan,
    find_orphans,
    find_running_engines,
    judge,
    orphan_reason,
    parse_lineage,
    parse_stat,
    read_lineage_locally,
    reap_orphans,
)
from pytest_gpuready.host.snapshot import GpuProcess, HostSnapshot, ProcessInfo
from tests.conftest import DATA
from tests.engines import adopted_engine, job_engine, orphaned_engine, served_engine

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
HOST_INIT = ProcessInfo(1, 0, 1, 1, "systemd", "/sbin/init")
"""Pid 1 of the H200 host (a systemd host: the capture's ``ps`` was filtered, this is what /proc/1 reads there)."""
ENGINE_BEFORE_KILL = ProcessInfo(3504, 3398, 3398, 5000, "VLLM::EngineCor", "VLLM::EngineCore")
API_SERVER = ProcessInfo(3398, 3345, 3398, 4900, "python3", API_SERVER_ARGS)


def test_the_captured_orphan_reads_as_the_issue_asks(standin: Callable[[str], Path]) -> None:
    snap = with_lineage(captured_snapshot(standin), ENGINE_AFTER_KILL, HOST_INIT)
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


def test_a_subreaper_parent_makes_an_orphan() -> None:
    subreaper = ProcessInfo(812, 1, 812, 100, "systemd", "/lib/systemd/systemd --user")
    worker = ProcessInfo(3600, 3504, 3398, 5100, "VLLM::Worker_TP", "VLLM::Worker_TP0")
    engine = dataclasses.replace(ENGINE_AFTER_KILL, ppid=812)
    process = GpuProcess(3600, "VLLM::Worker_TP0", 40000, "GPU-x", 0, alive=True, lineage=(worker, engine, subreaper))
    assert orphan_reason(process) == ("parent pid 3504 (VLLM::EngineCor), whose parent is the subreaper pid 812 "
                                      "(/lib/systemd/systemd --user)")
    served = dataclasses.replace(process, lineage=(worker, ENGINE_BEFORE_KILL, API_SERVER))
    assert orphan_reason(served) is None


BATCH_JOB = ProcessInfo(3, 2, 2, 4900, "python", "python batch_infer.py --model /models/llama")
JOB_ENGINE = ProcessInfo(4, 3, 2, 5000, "VLLM::EngineCor", "VLLM::EngineCore")


def test_an_engine_of_a_live_script_is_a_running_job_named_with_its_owner() -> None:
    """vLLM's offline ``LLM(...)``: the engine is a child of the user's own script, not of an API server."""
    process = GpuProcess(4, "VLLM::EngineCore", 71824, "GPU-x", 0, alive=True, lineage=(JOB_ENGINE, BATCH_JOB))
    assert judge(process) == Judgement(owner=BATCH_JOB)
    assert describe_process(process) == ("pid 4 (VLLM::EngineCore) of pid 3 (python batch_infer.py --model "
                                         "/models/llama) 71824 MiB")
    # A live parent of any kind, even one that is no vLLM and no init (a CI runner, a shell): a running job.
    for parent in ("bash", "gitlab-runner", "sleep"):
        other = dataclasses.replace(BATCH_JOB, comm=parent, cmdline=parent)
        assert judge(dataclasses.replace(process, lineage=(JOB_ENGINE, other))) == Judgement(owner=other)


def test_pid_1_that_started_the_engine_is_its_owner_not_a_reaper() -> None:
    """``docker run image python batch_infer.py``: the script is pid 1 of its container, in its engine's session."""
    script_as_init = ProcessInfo(1, 0, 1, 10, "python", "python batch_infer.py")
    engine = ProcessInfo(40, 1, 1, 500, "VLLM::EngineCor", "VLLM::EngineCore")
    process = GpuProcess(40, "VLLM::EngineCore", 71824, "GPU-x", 0, alive=True, lineage=(engine, script_as_init))
    assert judge(process) == Judgement(owner=script_as_init)
    # The same pid 1 with the engine in another session (the session of its dead starter): adopted, orphaned.
    adopted = dataclasses.replace(engine, session_id=33)
    assert orphan_reason(dataclasses.replace(process, lineage=(adopted, script_as_init))) == "parent pid 1"
    # A named init needs no session proof: it never starts an engine itself.
    tini = ProcessInfo(1, 0, 1, 10, "tini", "/sbin/tini -- sh")
    assert orphan_reason(dataclasses.replace(process, lineage=(engine, tini))) == "parent pid 1"


def test_what_cannot_be_proved_is_not_an_orphan() -> None:
    assert orphan_reason(GpuProcess(3504, "VLLM::EngineCore", 71824, "u", 0, alive=True)) is None  # no lineage
    pid_1_unread = GpuProcess(3504, "VLLM::EngineCore", 71824, "u", 0, alive=True, lineage=(ENGINE_AFTER_KILL,))
    assert judge(pid_1_unread) == Judgement()
    other_namespace = dataclasses.replace(ENGINE_AFTER_KILL, ppid=0)
    assert judge(dataclasses.replace(pid_1_unread, lineage=(other_namespace,))) == Judgement()
    python = ProcessInfo(431, 1, 431, 10, "python3", "python3 train.py")
    assert orphan_reason(GpuProcess(431, "python3", 20998, "u", 0, alive=True, lineage=(python, HOST_INIT))) is None
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


def test_a_live_jobs_engine_is_never_signalled_even_when_asked(
    standin: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The engine of a running ``python batch_infer.py`` (vLLM's ``LLM(...)``): named with its owner, and
    the reap script's own re-check refuses it even when handed it as an orphan."""
    standin("h200-orphan-enginecore")
    with job_engine(tmp_path) as engine:
        assert engine.api_server is not None
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        snap = snapshot(LocalHost(), reader="nvidia-smi")
        assert find_orphans(snap) == []
        (running,) = find_running_engines(snap)
        assert running.owner.pid == engine.api_server.pid
        assert running.describe() == (f"pid {engine.pid} (VLLM::EngineCore) of pid {engine.api_server.pid} "
                                      f"({running.owner.label}) 71824 MiB on GPU 0")
        assert running.owner.label.endswith("python batch_infer.py VLLM::EngineCore 0 300 0")
        assert check_gpus_clean(snap).details == (
            f"GPU 0: 71832 MiB used, held by {running.describe().removesuffix(' on GPU 0')}",)
        forged = Orphan(snap.processes[0], "forged")
        report = reap_orphans(LocalHost(), [forged], grace_s=0.5)
        assert (report.stopped, [o.pid for o in report.skipped]) == ((), [engine.pid])
        assert engine.alive()
        assert engine.api_server.poll() is None


@pytest.mark.parametrize(("reaper", "orphaned"), [("tini", True), ("", False)], ids=["named-init", "unknown-kind"])
def test_an_engine_adopted_by_a_live_subreaper(standin: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
                                              reaper: str, orphaned: bool) -> None:
    """A real subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) adopts the engine of a starter that is gone.
    Named as an init names itself (``tini``, kernel name set here: a stand-in), it is a reaper and the
    engine an orphan; under a live parent of no known kind (``python3``) the engine is a running job."""
    standin("h200-orphan-enginecore")
    with adopted_engine(reaper) as engine:
        assert engine.api_server is not None
        assert engine.ppid() == engine.api_server.pid
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        snap = snapshot(LocalHost(), reader="nvidia-smi")
        orphans = find_orphans(snap)
        if orphaned:
            (orphan,) = orphans
            assert orphan.reason.startswith(f"parent the subreaper pid {engine.api_server.pid} (")
            report = reap_orphans(LocalHost(), orphans, grace_s=5)
            assert [o.pid for o in report.stopped] == [engine.pid]
            assert not engine.alive()
        else:
            assert orphans == []
            assert [r.owner.pid for r in find_running_engines(snap)] == [engine.api_server.pid]
            report = reap_orphans(LocalHost(), [Orphan(snap.processes[0], "forged")], grace_s=0.5)
            assert [o.pid for o in report.skipped] == [engine.pid]
            assert engine.alive()
        assert engine.api_server.poll() is None  # the subreaper itself is never signalled
