"""Host invariants: clean GPUs, a clean and roomy /dev/shm, a sensible TP group topology.

Pure functions of a :class:`HostSnapshot`: data in, :class:`Verdict` out, no I/O. A snapshot
section that was not measured raises (ProbeError / NoGpuError) instead of passing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import combinations

from pytest_gpuready.host.orphans import find_orphans, judge, kill_hint, served_by
from pytest_gpuready.host.shm import LEAK_PATTERNS, creator_pid, matches_leak_pattern, shm_display_name
from pytest_gpuready.host.snapshot import GpuInfo, GpuProcess, HostSnapshot, ShmEntry
from pytest_gpuready.verdict import Verdict

DEFAULT_MAX_USED_MIB = 64
"""Idle GPUs read 0-3 MiB used (RTX PRO 6000: 3 MiB; H200 via NVML v2: 0 MiB); a CUDA context alone takes ~500 MiB."""

DEFAULT_SHM_MIN_FREE_MIB = 1024
"""Docker's default /dev/shm is 64 MB, which breaks NCCL and vLLM's shared-memory broadcast."""

MIB = 1024 * 1024


def select_gpus(snapshot: HostSnapshot, gpus: Sequence[int] | None) -> tuple[GpuInfo, ...]:
    """The GPUs named by index (all when None); an index the host lacks is a ProbeError."""
    present = snapshot.require_gpus()
    if gpus is None:
        return present
    return tuple(snapshot.gpu(index) for index in gpus)


def describe_process(process: GpuProcess) -> str:
    """``pid 431 (python3) 20998 MiB``, noting vLLM engines, whose they are, and pids that are gone.

    An engine of a live job that is not a vLLM API server reads ``pid 4 (VLLM::EngineCore) of pid 3
    (python batch_infer.py) 71824 MiB``: who holds the GPU, and that it is not an orphan.
    """
    notes = [process.name]
    command = f"{process.name} {process.cmdline or ''}"
    judged = judge(process)
    server = served_by(process)
    owner = ""
    if judged.reason is not None:
        notes.append(f"an orphaned vLLM engine: its API server is gone, {judged.reason}")
    elif server is not None:
        notes.append(f"a vLLM engine of the running server pid {server.pid}")
    elif judged.owner is not None:
        owner = f" of pid {judged.owner.pid} ({judged.owner.label})"  # a running job: LLM(...) in a script
    elif "VLLM::EngineCore" in command or "VLLM::Worker" in command:
        notes.append("a vLLM engine process")
    elif "vllm" in command.lower():
        notes.append("vLLM")
    if process.alive is False:
        notes.append("pid not running here: exited with its memory still held, or in another PID namespace")
    memory = f" {process.used_memory_mib} MiB" if process.used_memory_mib is not None else " (memory not reported)"
    return f"pid {process.pid} ({', '.join(notes)}){owner}{memory}"


def check_gpus_clean(
    snapshot: HostSnapshot, gpus: Sequence[int] | None = None, max_used_mib: int = DEFAULT_MAX_USED_MIB
) -> Verdict:
    """A GPU is clean when no compute process holds it and its used memory is at most ``max_used_mib``."""
    selected = select_gpus(snapshot, gpus)
    dirty: list[str] = []
    evidence: dict[str, object] = {"host": snapshot.host, "max_used_mib": max_used_mib, "reader": snapshot.gpu_reader}
    per_gpu: dict[int, dict[str, object]] = {}
    for gpu in selected:
        processes = snapshot.processes_on(gpu.index)
        per_gpu[gpu.index] = {
            "used_mib": gpu.memory_used_mib,
            "total_mib": gpu.memory_total_mib,
            "processes": [{"pid": p.pid, "name": p.name, "used_mib": p.used_memory_mib, "alive": p.alive,
                           "ppid": p.ppid, "session_id": p.session_id, "orphaned": judge(p).reason}
                          for p in processes],
        }
        if not processes and gpu.memory_used_mib <= max_used_mib:
            continue
        line = f"GPU {gpu.index}: {gpu.memory_used_mib} MiB used"
        if processes:
            line += ", held by " + ", ".join(describe_process(p) for p in processes)
            orphans = [o for o in find_orphans(snapshot) if o.process.gpu_index == gpu.index]
            if orphans:
                line += f"; {kill_hint(orphans)}"
        else:
            line += (f" (over {max_used_mib} MiB) and no compute process visible: held from another container "
                     "or PID namespace, or memory not yet released by a process that just exited")
        dirty.append(line)
    evidence["gpus"] = per_gpu
    indexes = ",".join(str(g.index) for g in selected)
    if dirty:
        return Verdict.failed(
            f"{len(dirty)} of {len(selected)} GPUs on {snapshot.host} are not clean (tolerance {max_used_mib} MiB)",
            details=tuple(dirty), evidence=evidence,
        )
    return Verdict.passed(
        f"{len(selected)} GPUs on {snapshot.host} are clean "
        f"(GPU {indexes}; at most {max_used_mib} MiB used, no processes)",
        evidence=evidence,
    )


def _age(mtime: float, now: float) -> str:
    seconds = max(0.0, now - mtime)
    if seconds < 120:
        return f"{seconds:.0f} s old"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min old"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h old"
    return f"{seconds / 86400:.0f} days old"


def _describe_entry(entry: ShmEntry, now: float) -> str:
    state = {True: "in use by a live process", False: "no process holds it",
             None: "could not tell whether in use (the probe is not root)"}[entry.in_use]
    size = f"{entry.size_bytes / MIB:.1f} MiB"
    pid = creator_pid(entry.name)
    made_by = f", named for pid {pid} (a vLLM engine's loky semaphore)" if pid is not None else ""
    return (f"{shm_display_name(entry.name)}: {size}, owner {entry.owner}, {_age(entry.mtime, now)}{made_by}, "
            f"{state}")


def _in_use_warnings(host: str, live: Sequence[ShmEntry], now: float) -> tuple[str, ...]:
    """One warning for the /dev/shm files live processes hold, however many: a shared machine has
    dozens (other users' servers), and a warning each would bury the summary."""
    if not live:
        return ()
    if len(live) == 1:
        return (f"{_describe_entry(live[0], now)} (a running server's; not a leftover)",)
    oldest = min(live, key=lambda e: e.mtime)
    size = sum(e.size_bytes for e in live)
    return (f"/dev/shm on {host}: {len(live)} files matching the leftover patterns are in use by live processes "
            f"(running servers'; not leftovers), {size / MIB:.1f} MiB in all, the oldest "
            f"{shm_display_name(oldest.name)} ({_age(oldest.mtime, now)}); each is in the shm_clean verdict's "
            f"evidence (in_use) of --gpuready-report, or list them with: ls -la /dev/shm on {host}",)


def check_shm_clean(
    snapshot: HostSnapshot,
    min_free_mib: int = DEFAULT_SHM_MIN_FREE_MIB,
    patterns: Sequence[str] = LEAK_PATTERNS,
    ignore: Sequence[str] = (),
    now: float | None = None,
) -> Verdict:
    """No leftovers of vLLM/NCCL/multiprocessing in /dev/shm, and at least ``min_free_mib`` free.

    Files a live process still uses are not leftovers: they are listed as warnings (a server
    is running), and :func:`check_gpus_clean` is the check that fails for a running server.
    """
    status = snapshot.require_shm()
    now = time.time() if now is None else now
    matched = [e for e in status.entries
               if matches_leak_pattern(e.name, patterns) and not matches_leak_pattern(e.name, ignore)]
    stale = [e for e in matched if e.in_use is not True]
    live = [e for e in matched if e.in_use is True]
    problems = [_describe_entry(e, now) for e in stale]
    free_mib = status.free_bytes // MIB
    total_mib = status.total_bytes // MIB
    if free_mib < min_free_mib:
        problems.append(
            f"/dev/shm has {free_mib} MiB free of {total_mib} MiB; at least {min_free_mib} MiB required "
            "(NCCL and vLLM's shared-memory broadcast need room; in Docker raise --shm-size or use --ipc=host)"
        )
    evidence = {
        "host": snapshot.host, "free_mib": free_mib, "total_mib": total_mib, "min_free_mib": min_free_mib,
        "leftovers": [{"name": e.name, "size_bytes": e.size_bytes, "owner": e.owner, "in_use": e.in_use}
                      for e in stale],
    }
    evidence["in_use"] = [{"name": e.name, "size_bytes": e.size_bytes, "owner": e.owner, "mtime": e.mtime}
                          for e in live]
    warnings = _in_use_warnings(snapshot.host, live, now)
    if problems:
        stale_bytes = sum(e.size_bytes for e in stale)
        summary = (f"/dev/shm on {snapshot.host} is not clean: {len(stale)} leftover files "
                   f"({stale_bytes / MIB:.1f} MiB), {free_mib} MiB free")
        return Verdict.failed(summary, details=tuple(problems), evidence=evidence, warnings=warnings)
    return Verdict.passed(
        f"/dev/shm on {snapshot.host} is clean: no leftovers, {free_mib} of {total_mib} MiB free",
        evidence=evidence, warnings=warnings,
    )


def check_topology(snapshot: HostSnapshot, gpus: Sequence[int] | None = None, strict: bool = False) -> Verdict:
    """How a tensor-parallel group's GPUs are linked, with the warnings vLLM users need.

    Warns when vLLM will disable its custom all-reduce (more than two GPUs that are not all
    NVLink-connected: "Custom allreduce is disabled because it's not supported on more than two
    PCIe-only GPUs") and when the group spans NUMA nodes (all-reduce crosses the SMP
    interconnect: a SYS link inside the group). GPUs on several NUMA nodes joined by NVLink (an
    8-GPU HGX board) are fine: all-reduce stays on NVLink. With ``strict`` warnings fail the check.
    """
    selected = [g.index for g in select_gpus(snapshot, gpus)]
    topology = snapshot.require_topology()
    pair_links = {(a, b): topology.link(a, b) for a, b in combinations(selected, 2)}
    missing = [f"GPU{a}-GPU{b}" for (a, b), link in pair_links.items() if link is None]
    if missing:
        return Verdict.failed(f"topology of {snapshot.host} lacks links {', '.join(missing)}",
                              evidence={"selected": selected})
    links = {f"{a}-{b}": link for (a, b), link in pair_links.items()}
    evidence = {"host": snapshot.host, "gpus": selected, "links": links,
                "numa": {i: topology.numa_affinity.get(i) for i in selected},
                "cpu_affinity": {i: topology.cpu_affinity.get(i) for i in selected}}
    warnings: list[str] = []
    all_nvlink = all(link is not None and link.startswith("NV") for link in pair_links.values())
    if len(selected) > 2 and not all_nvlink:
        kinds = sorted({link for link in pair_links.values() if link and not link.startswith("NV")})
        warnings.append(
            f"GPUs {','.join(map(str, selected))} are not all NVLink-connected ({', '.join(kinds)} links): "
            "vLLM will log "
            "\"Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs\" "
            "and fall back to NCCL all-reduce"
        )
    if any(link == "SYS" for link in pair_links.values()):
        by_node: dict[str, list[int]] = {}
        for index in selected:
            node = topology.numa_affinity.get(index)
            by_node.setdefault("unknown" if node is None else str(node), []).append(index)
        placement = "; ".join(f"node {node}: GPU {','.join(map(str, idx))}" for node, idx in sorted(by_node.items()))
        warnings.append(
            f"the TP group spans NUMA nodes ({placement}): all-reduce traffic crosses the SMP interconnect "
            "(SYS links between PCIe GPUs); pick GPUs of one node, or expect slower all-reduce"
        )
    kinds_text = ", ".join(sorted({link for link in links.values() if link})) or "single GPU"
    summary = f"GPU {','.join(map(str, selected))} on {snapshot.host}: links {kinds_text}"
    if warnings and strict:
        return Verdict.failed(summary, details=tuple(warnings), evidence=evidence, warnings=tuple(warnings))
    return Verdict.passed(summary, evidence=evidence, warnings=tuple(warnings))
