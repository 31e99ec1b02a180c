"""Host invariants on snapshots built from captured outputs; every failure message is checked."""

from __future__ import annotations

import pytest

from pytest_gpuready import (
    GpuProcess,
    HostSnapshot,
    NoGpuError,
    ProbeError,
    ShmEntry,
    ShmStatus,
    check_gpus_clean,
    check_shm_clean,
    check_topology,
)
from pytest_gpuready.host.checks import describe_process
from pytest_gpuready.host.gpus import parse_query_compute_apps, parse_query_gpu
from pytest_gpuready.host.topology import parse_topo_matrix
from tests.conftest import captured

MIB = 1024 * 1024
NOW = 1_800_000_000.0


def rtx_snapshot(capture: str, topo: str = "rtx4090x8-topo.txt") -> HostSnapshot:
    gpus = parse_query_gpu(captured(capture), ("index", "memory.used", "memory.total", "power.draw"))
    return HostSnapshot("gpu-box-7", NOW, "nvidia-smi", tuple(gpus), topology=parse_topo_matrix(captured(topo)))


def h200_with_process(alive: bool | None, cmdline: str | None = None) -> HostSnapshot:
    gpus = parse_query_gpu(captured("h200x1-idle.txt").replace(", 0, 143771,", ", 21007, 143771,"))
    (process,) = parse_query_compute_apps(captured("h200x1-one-process.txt").splitlines()[0], gpus)
    process = GpuProcess(process.pid, process.name, process.used_memory_mib, process.gpu_uuid, process.gpu_index,
                         alive=alive, cmdline=cmdline)
    return HostSnapshot("root@10.1.230.174", NOW, "nvidia-smi", tuple(gpus), processes=(process,))


def test_clean_rtx_box_passes() -> None:
    # the clean capture has index and memory.used; its header gives 97887 MiB each as the total
    rows = "".join(f"{line}, 97887 MiB\n" for line in captured("rtxpro6000x8-clean.txt").splitlines())
    gpus = parse_query_gpu(rows, ("index", "memory.used", "memory.total"))
    snapshot = HostSnapshot("gpu-box-7", NOW, "nvidia-smi", tuple(gpus))
    verdict = check_gpus_clean(snapshot)
    assert verdict.ok
    assert verdict.summary == (
        "8 GPUs on gpu-box-7 are clean (GPU 0,1,2,3,4,5,6,7; at most 64 MiB used, no processes)"
    )


def test_loaded_tp4_box_fails_on_gpus_0_to_3_only() -> None:
    verdict = check_gpus_clean(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt"))
    assert not verdict.ok
    assert verdict.summary == "4 of 8 GPUs on gpu-box-7 are not clean (tolerance 64 MiB)"
    assert verdict.details[0].startswith(
        "GPU 0: 96721 MiB used (over 64 MiB) and no compute process visible: held from another container"
    )
    assert [d.split(":")[0] for d in verdict.details] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert verdict.evidence["gpus"][4]["used_mib"] == 3


def test_other_gpus_of_the_loaded_box_are_clean() -> None:
    """A TP=4 deploy on GPUs 4-7 can go ahead while another model holds 0-3."""
    verdict = check_gpus_clean(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt"), gpus=[4, 5, 6, 7])
    assert verdict.ok, verdict.message


def test_loading_box_fails_too() -> None:
    gpus = parse_query_gpu(captured("rtxpro6000x8-minimax-tp4-loading.txt"), ("index", "memory.used", "memory.total"))
    verdict = check_gpus_clean(HostSnapshot("b", NOW, "nvidia-smi", tuple(gpus)))
    assert "GPU 3: 56179 MiB used" in verdict.message


def test_process_holding_a_gpu_is_named_with_pid_and_mib() -> None:
    verdict = check_gpus_clean(h200_with_process(alive=True))
    assert not verdict.ok
    assert verdict.details == ("GPU 0: 21007 MiB used, held by pid 431 (python3) 20998 MiB",)
    assert verdict.message.startswith("1 of 1 GPUs on root@10.1.230.174 are not clean (tolerance 64 MiB)\n")


def test_orphaned_vllm_engine_is_called_out() -> None:
    verdict = check_gpus_clean(h200_with_process(alive=True, cmdline="VLLM::EngineCore"))
    assert "pid 431 (python3, a vLLM engine process) 20998 MiB" in verdict.details[0]


def test_pid_gone_is_flagged() -> None:
    verdict = check_gpus_clean(h200_with_process(alive=False))
    assert "pid 431 (python3, pid not running here" in verdict.details[0]


def test_process_below_tolerance_still_makes_gpu_dirty() -> None:
    """A process with a tiny footprint still holds a context on the GPU."""
    process = GpuProcess(9, "python3", 2, "GPU-x", 0, alive=True)
    gpus = parse_query_gpu(captured("h200x1-idle.txt"))
    verdict = check_gpus_clean(HostSnapshot("h", NOW, "nvml", tuple(gpus), processes=(process,)))
    assert verdict.details == ("GPU 0: 0 MiB used, held by pid 9 (python3) 2 MiB",)


def test_process_without_memory_figure() -> None:
    assert describe_process(GpuProcess(9, "python3", None, "u")).endswith("(memory not reported)")


def test_tolerance_is_configurable() -> None:
    gpus = parse_query_gpu(captured("rtxpro6000x8-minimax-tp4-loaded.txt"), ("index", "memory.used", "memory.total",
                                                                            "power.draw"))
    snapshot = HostSnapshot("b", NOW, "nvidia-smi", tuple(gpus))
    assert check_gpus_clean(snapshot, gpus=[7], max_used_mib=3).ok
    assert not check_gpus_clean(snapshot, gpus=[7], max_used_mib=2).ok


def test_unknown_gpu_index_is_an_error() -> None:
    with pytest.raises(ProbeError, match=r"there is no GPU 9 \(GPUs present: 0, 1, 2, 3, 4, 5, 6, 7\)"):
        check_gpus_clean(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt"), gpus=[9])


def test_unmeasured_gpus_never_pass() -> None:
    broken = HostSnapshot("b", NOW, "nvidia-smi", None, errors={"gpus": "nvidia-smi failed (exit 9): ..."})
    with pytest.raises(ProbeError, match=r"^b: GPUs could not be read: nvidia-smi failed \(exit 9\)"):
        check_gpus_clean(broken)
    absent = HostSnapshot("local", NOW, "none", None, no_gpu_reason="no NVIDIA GPU on this machine")
    with pytest.raises(NoGpuError, match="no NVIDIA GPU on this machine"):
        check_gpus_clean(absent)


def shm(entries: list[ShmEntry], total_mib: int = 24576, free_mib: int = 24000, root: bool = True) -> HostSnapshot:
    status = ShmStatus(tuple(entries), total_mib * MIB, free_mib * MIB, root)
    return HostSnapshot("gpu-box-7", NOW, "nvidia-smi", (), shm=status)


def test_shm_leftovers_fail_with_size_owner_and_age() -> None:
    verdict = check_shm_clean(shm([
        ShmEntry("psm_3f2a1b7c", 250 * MIB, "root", NOW - 3 * 3600, in_use=False),
        ShmEntry("sem.mp-x1y2", 32, "root", NOW - 90, in_use=False),
        ShmEntry("pulse-shm-1", 67108904, "user", NOW, in_use=False),
    ]), now=NOW)
    assert not verdict.ok
    assert verdict.summary == (
        "/dev/shm on gpu-box-7 is not clean: 2 leftover files (250.0 MiB), 24000 MiB free"
    )
    assert verdict.details == (
        "/dev/shm/psm_3f2a1b7c: 250.0 MiB, owner root, 3 h old, no process holds it",
        "/dev/shm/sem.mp-x1y2: 0.0 MiB, owner root, 90 s old, no process holds it",
    )


def test_shm_files_of_a_running_server_are_warnings_not_failures() -> None:
    verdict = check_shm_clean(shm([ShmEntry("psm_live", MIB, "root", NOW, in_use=True)]), now=NOW)
    assert verdict.ok
    assert verdict.warnings == (
        "/dev/shm/psm_live: 1.0 MiB, owner root, 0 s old, in use by a live process "
        "(a running server's; not a leftover)",
    )


def test_many_files_of_other_processes_are_one_warning() -> None:
    """A shared machine: 87 files of other users' live servers are one warning (count, total size,
    the oldest, where to see each), and every file stays in the evidence."""
    live = [ShmEntry(f"psm_{i:04x}", MIB, "user", NOW - 60 * i, in_use=True) for i in range(87)]
    verdict = check_shm_clean(shm(live), now=NOW)
    assert verdict.ok
    assert verdict.warnings == (
        "/dev/shm on gpu-box-7: 87 files matching the leftover patterns are in use by live processes (running "
        "servers'; not leftovers), 87.0 MiB in all, the oldest /dev/shm/psm_0056 (86 min old); each is in the "
        "shm_clean verdict's evidence (in_use) of --gpuready-report, or list them with: ls -la /dev/shm on gpu-box-7",
    )
    assert len(verdict.evidence["in_use"]) == 87


def test_shm_without_root_cannot_tell_and_fails() -> None:
    verdict = check_shm_clean(shm([ShmEntry("nccl-abc", MIB, "root", NOW, in_use=None)], root=False), now=NOW)
    assert not verdict.ok
    assert "could not tell whether in use (the probe is not root)" in verdict.details[0]


def test_small_shm_fails_with_the_docker_hint() -> None:
    verdict = check_shm_clean(shm([], total_mib=64, free_mib=63))
    assert not verdict.ok
    assert verdict.details == (
        "/dev/shm has 63 MiB free of 64 MiB; at least 1024 MiB required (NCCL and vLLM's shared-memory broadcast "
        "need room; in Docker raise --shm-size or use --ipc=host)",
    )


def test_clean_shm_passes_and_ignore_patterns_apply() -> None:
    snapshot = shm([ShmEntry("psm_mine", MIB, "root", NOW, in_use=False)])
    assert not check_shm_clean(snapshot).ok
    verdict = check_shm_clean(snapshot, ignore=("psm_mine",))
    assert verdict.ok
    assert verdict.summary == "/dev/shm on gpu-box-7 is clean: no leftovers, 24000 of 24576 MiB free"


def test_unmeasured_shm_is_an_error() -> None:
    snapshot = HostSnapshot("b", NOW, "nvidia-smi", (), errors={"shm": "listing /dev/shm failed"})
    with pytest.raises(ProbeError, match="/dev/shm could not be read: listing /dev/shm failed"):
        check_shm_clean(snapshot)


def test_topology_pcie_group_warns_about_custom_allreduce_and_numa() -> None:
    verdict = check_topology(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt"), gpus=[0, 1, 2, 3, 4, 5, 6, 7])
    assert verdict.ok
    assert verdict.summary == "GPU 0,1,2,3,4,5,6,7 on gpu-box-7: links SYS"
    assert "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs" in (
        verdict.warnings[0]
    )
    assert "the TP group spans NUMA nodes (node 0: GPU 0,1,2,3; node 1: GPU 4,5,6,7)" in verdict.warnings[1]
    strict = check_topology(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt"), strict=True)
    assert not strict.ok
    assert strict.details == strict.warnings


def test_topology_two_pcie_gpus_keep_custom_allreduce() -> None:
    verdict = check_topology(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt"), gpus=[0, 1])
    assert not any("Custom allreduce" in w for w in verdict.warnings)


def test_topology_nvlink_board_has_no_warnings_even_across_numa() -> None:
    verdict = check_topology(rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt", topo="h100x8-topo.txt"))
    assert verdict.ok
    assert verdict.warnings == ()
    assert verdict.summary.endswith("links NV18")


def test_topology_unmeasured_is_an_error() -> None:
    snapshot = HostSnapshot("b", NOW, "nvidia-smi", rtx_snapshot("rtxpro6000x8-minimax-tp4-loaded.txt").gpus,
                            errors={"topology": "nvidia-smi failed (exit 3)"})
    with pytest.raises(ProbeError, match="GPU topology could not be read: nvidia-smi failed"):
        check_topology(snapshot)
