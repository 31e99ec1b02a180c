"""Text for the report header and the terminal summary: what an engineer reads in nvidia-smi."""

from __future__ import annotations

from collections import Counter

from pytest_gpuready.host.snapshot import HostSnapshot


def header_lines(snapshot: HostSnapshot) -> list[str]:
    """``gpuready: host local via nvml, driver 580.159.04, 1x NVIDIA H200 (143771 MiB, SM90)``."""
    if snapshot.no_gpu_reason is not None:
        return [f"gpuready: host {snapshot.host}: {snapshot.no_gpu_reason}"]
    if snapshot.gpus is None:
        return [f"gpuready: host {snapshot.host}: GPUs could not be read: {snapshot.errors.get('gpus', 'unknown')}"]
    kinds = Counter((g.name, g.memory_total_mib, g.sm) for g in snapshot.gpus)
    described = ", ".join(
        f"{count}x {name} ({total} MiB{', ' + sm if sm else ''})" for (name, total, sm), count in kinds.items()
    )
    drivers = sorted({g.driver_version for g in snapshot.gpus if g.driver_version})
    parts = [f"gpuready: host {snapshot.host} via {snapshot.gpu_reader}"]
    if drivers:
        parts.append(f"driver {', '.join(drivers)}")
    parts.append(described)
    parts.append(f"vLLM {snapshot.vllm_version}" if snapshot.vllm_version else "vLLM not installed")
    return [", ".join(parts)]


def gpu_table(snapshot: HostSnapshot) -> list[str]:
    """The GPU table of the terminal summary: index, name, used/total MiB, processes."""
    if not snapshot.gpus:
        return []
    rows = [("GPU", "Name", "Used / Total MiB", "Processes")]
    for gpu in snapshot.gpus:
        processes = ", ".join(
            f"{p.pid} {p.name} {p.used_memory_mib if p.used_memory_mib is not None else '?'} MiB"
            + ("" if p.alive is not False else " (gone)")
            for p in snapshot.processes_on(gpu.index)
        ) or "-"
        rows.append((str(gpu.index), gpu.name, f"{gpu.memory_used_mib} / {gpu.memory_total_mib}", processes))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}".rstrip() for row in rows
    ]
