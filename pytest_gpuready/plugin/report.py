"""The report header's line per host: what an engineer reads first in a CI log.

(The terminal summary's tables are :mod:`pytest_gpuready.plugin.summary`.)
"""

from __future__ import annotations

from collections import Counter

from pytest_gpuready.host.snapshot import HostSnapshot


def header_lines(snapshot: HostSnapshot) -> list[str]:
    """``gpuready: host local via nvml, driver 580.159.04, 1x NVIDIA H200 (143771 MiB, SM90), vLLM 0.25.0,
    CUDA 13.0 (driver), build CUDA 13.0 (torch 2.11.0+cu130)``."""
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
    cuda = cuda_line(snapshot)
    if cuda is not None:
        parts.append(cuda)
    return [", ".join(parts)]


def cuda_line(snapshot: HostSnapshot) -> str | None:
    """``CUDA 13.0 (driver), build CUDA 13.0 (torch 2.11.0+cu130)``, or None without a health reading."""
    health = snapshot.health
    if health is None:
        return None
    driver = f"CUDA {health.driver_cuda[0]}.{health.driver_cuda[1]} (driver)" if health.driver_cuda else \
        "driver CUDA unknown"
    build = health.build
    if build.cuda is not None:
        return f"{driver}, build CUDA {build.cuda[0]}.{build.cuda[1]} ({build.cuda_source})"
    return f"{driver}, build CUDA none ({'torch +cpu' if build.is_cpu_build else 'no CUDA torch/vLLM found'})"
