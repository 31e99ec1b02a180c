"""GPU presets for planning without a host (``--gpus 8xH100-80GB``).

Each preset is what ``nvidia-smi`` reports for the card (``memory.total`` in MiB, compute
capability) plus the layout assumptions a multi-GPU box of that card usually has, stated so a
plan on a preset can be read: 8-GPU boxes put GPUs 0-3 on NUMA node 0 and 4-7 on node 1 (the
8x H100 and 8x RTX PRO 6000 captures in tests/data/nvidia-smi); SXM cards (H100, H200, A100)
link every pair by NVLink, PCIe cards (L40S, RTX) go through PCIe, with the pairs on one NUMA
node counted as one PCIe host bridge (``NODE``) and the rest ``SYS``. A real host
(``--gpu-host``) replaces all of this with its own ``nvidia-smi topo -m``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.host.snapshot import GpuInfo, GpuLink, HostSnapshot, Topology
from pytest_gpuready.plan.planner import MAX_PLAN_GPUS


@dataclass(frozen=True)
class GpuPreset:
    name: str
    marketing_name: str
    memory_total_mib: int
    memory_reserved_mib: int
    """Memory CUDA does not see (driver/firmware); 0 where not measured."""
    compute_capability: tuple[int, int]
    nvlink: bool


PRESETS: dict[str, GpuPreset] = {p.name.lower(): p for p in (
    GpuPreset("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 0, (9, 0), True),
    GpuPreset("H200", "NVIDIA H200", 143771, 616, (9, 0), True),
    # 616 MiB reserved: measured (shared/data/nvidia-smi/h200x1-nvml.txt, NVML v2 reserved)
    GpuPreset("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 0, (8, 0), True),
    GpuPreset("L40S", "NVIDIA L40S", 46068, 0, (8, 9), False),
    GpuPreset("RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell", 97887, 0, (12, 0), False),
    GpuPreset("RTX-4090", "NVIDIA GeForce RTX 4090", 24564, 0, (8, 9), False),
    GpuPreset("RTX-3090", "NVIDIA GeForce RTX 3090", 24576, 0, (8, 6), False),
)}

_SPEC_RE = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9._-]+)\s*$")


def parse_gpus(spec: str) -> tuple[int, GpuPreset]:
    """``8xH100-80GB`` -> (8, the H100 preset); a one-line ConfigError naming the choices otherwise."""
    match = _SPEC_RE.match(spec)
    choices = ", ".join(p.name for p in PRESETS.values())
    if match is None:
        raise ConfigError(f"--gpus {spec!r}: expected COUNTxNAME like 8xH100-80GB; names: {choices}")
    count = int(match.group(1) or 1)
    preset = PRESETS.get(match.group(2).lower())
    if preset is None:
        raise ConfigError(f"--gpus {spec!r}: unknown GPU {match.group(2)!r}; expected one of {choices}")
    if not 1 <= count <= MAX_PLAN_GPUS:
        raise ConfigError(f"--gpus {spec!r}: expected 1 to {MAX_PLAN_GPUS} GPUs, got {count}")
    return count, preset


def preset_snapshot(count: int, preset: GpuPreset) -> HostSnapshot:
    """A clean host of ``count`` preset GPUs, with the layout assumptions of the module doc."""
    per_node = count // 2 if count >= 8 else count
    gpus = tuple(GpuInfo(index=i, uuid=f"GPU-preset-{i}", name=preset.marketing_name, pci_bus_id=f"preset:{i}",
                         memory_used_mib=0, memory_total_mib=preset.memory_total_mib,
                         memory_reserved_mib=preset.memory_reserved_mib,
                         compute_capability=preset.compute_capability) for i in range(count))
    numa = {i: i // per_node for i in range(count)}
    links = []
    for a in range(count):
        for b in range(a + 1, count):
            same_node = "NODE" if numa[a] == numa[b] else "SYS"
            links.append(GpuLink(a, b, "NV18" if preset.nvlink else same_node))
    topology = Topology(tuple(links), numa_affinity=dict(numa.items()))
    return HostSnapshot(f"{count}x{preset.name} (preset)", 0.0, "preset", gpus, topology=topology)
