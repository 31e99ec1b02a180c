"""GPU presets for planning without a host (``--gpus 8xH100-80GB``).

Each preset is what ``nvidia-smi`` reports for the card (``memory.total`` in MiB, compute
capability), the memory CUDA sees of it (vLLM's budget is a fraction of that, not of
nvidia-smi's figure) with where that figure comes from (``GpuPreset.source``), plus the layout
assumptions a multi-GPU box of that card usually has, stated so a plan on a preset can be read:
8-GPU boxes put GPUs 0-3 on NUMA node 0 and 4-7 on node 1 (the 8x H100 and 8x RTX PRO 6000
captures in tests/data/nvidia-smi); SXM / HGX cards (H100, H800, H20, H200, B200, GB200, A100,
A800, V100) link every pair by NVLink, PCIe cards (L40S, L40, L4, A10G, A6000, RTX, T4) go
through PCIe, with the pairs on one NUMA node counted as one PCIe host bridge (``NODE``) and the
rest ``SYS``. A real host (``--gpu-host``) replaces all of this with its own ``nvidia-smi topo -m``.
"""

from __future__ import annotations

import difflib
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
    """``nvidia-smi --query-gpu=memory.total`` for the card."""
    memory_reserved_mib: int
    """Memory CUDA does not see (driver/firmware): ``memory_total_mib`` less what
    ``torch.cuda.mem_get_info`` reports as total (what vLLM's budget multiplies); 0 where no
    figure was found (``source`` says so)."""
    compute_capability: tuple[int, int]
    nvlink: bool
    source: str = ""
    """Where the memory figures come from: a capture here, or a public log quoting CUDA's total."""

    @property
    def cuda_total_gib(self) -> float:
        """The memory CUDA sees, in GiB (vLLM's ``Free memory on device (x/TOTAL GiB)``)."""
        return (self.memory_total_mib - self.memory_reserved_mib) / 1024


def _cuda(total_mib: int, cuda_gib: float) -> int:
    """Reserved MiB from nvidia-smi's total and the GiB CUDA reports (2 decimals in the logs)."""
    return total_mib - round(cuda_gib * 1024)


_NOT_FOUND = "no public log quoting CUDA's total was found: CUDA's share taken as nvidia-smi's total"

PRESETS: dict[str, GpuPreset] = {p.name.lower(): p for p in (
    GpuPreset("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, _cuda(81559, 79.19), (9, 0), True,
              "nvidia-smi 81559 MiB; CUDA 79.19 GiB: vLLM's "
              "'Free memory on device (78.66/79.19 GiB)' on H100 80GB HBM3 startups, and the total that "
              "reproduces vLLM 0.19's 175,296 KV tokens for Llama-3.1-8B --dtype float32 at 0.95 (issue 20)"),
    GpuPreset("H800", "NVIDIA H800", 81559, _cuda(81559, 79.19), (9, 0), True,
              "the H100 SXM's 80 GB HBM3 part (export variant: NVLink at 400 GB/s); CUDA's total taken "
              "from the H100's, not measured on an H800"),
    GpuPreset("H20", "NVIDIA H20", 97871, 0, (9, 0), True,
              f"nvidia-smi 97871 MiB (96 GB HBM3, HGX board with NVLink); {_NOT_FOUND}"),
    GpuPreset("H200", "NVIDIA H200", 143771, 616, (9, 0), True,
              "measured: shared/data/nvidia-smi/h200x1-nvml.txt (NVML v2 reserved 616 MiB)"),
    GpuPreset("B200", "NVIDIA B200", 183359, _cuda(183359, 178.35), (10, 0), True,
              "nvidia-smi 183359 MiB; CUDA 178.35 GiB: torch's total on an NVIDIA B200 "
              "(https://github.com/unslothai/unsloth/issues/3411)"),
    GpuPreset("GB200", "NVIDIA GB200", 189471, 0, (10, 0), True,
              f"nvidia-smi 189471 MiB (186 GB HBM3e per Blackwell GPU of a GB200 superchip); {_NOT_FOUND}"),
    GpuPreset("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, _cuda(81920, 79.15), (8, 0), True,
              "nvidia-smi 81920 MiB; CUDA 79.15 GiB: 'GPU 0 has a total capacity of 79.15 GiB' on an "
              "A100 80GB (https://github.com/vllm-project/vllm/issues/4408)"),
    GpuPreset("A800", "NVIDIA A800-SXM4-80GB", 81920, _cuda(81920, 79.15), (8, 0), True,
              "the A100 SXM4 80 GB part (export variant: NVLink at 400 GB/s); CUDA's total taken from "
              "the A100-80GB's"),
    GpuPreset("L40S", "NVIDIA L40S", 46068, 0, (8, 9), False, f"nvidia-smi 46068 MiB; {_NOT_FOUND}"),
    GpuPreset("L40", "NVIDIA L40", 46068, 0, (8, 9), False,
              f"nvidia-smi 46068 MiB (the L40S's 48 GB GDDR6 board); {_NOT_FOUND}"),
    GpuPreset("L4", "NVIDIA L4", 23034, 0, (8, 9), False,
              "nvidia-smi 23034 MiB (https://github.com/NVIDIA/TensorRT-LLM/issues/2398); " + _NOT_FOUND),
    GpuPreset("A10G", "NVIDIA A10G", 23028, _cuda(23028, 22.06), (8, 6), False,
              "nvidia-smi 23028 MiB (AWS g5); CUDA 22.06 GiB: '22.06 GiB total capacity' on a 24 GB A10 "
              "(https://github.com/vllm-project/vllm/issues/928), the A10G's sibling with the same memory"),
    GpuPreset("A6000", "NVIDIA RTX A6000", 49140, 0, (8, 6), False,
              f"nvidia-smi 49140 MiB (48 GB GDDR6; NVLink bridges join pairs at most, PCIe assumed); "
              f"{_NOT_FOUND}"),
    GpuPreset("RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell", 97887, 0, (12, 0), False,
              "nvidia-smi 97887 MiB (tests/data/nvidia-smi 8x RTX PRO 6000 capture); " + _NOT_FOUND),
    GpuPreset("RTX-5090", "NVIDIA GeForce RTX 5090", 32607, _cuda(32607, 31.36), (12, 0), False,
              "nvidia-smi 32607 MiB; CUDA 31.36 GiB: 'GPU 0 has a total capacity of 31.36 GiB' on an RTX "
              "5090 (https://github.com/hiyouga/LlamaFactory/issues/7798)"),
    GpuPreset("RTX-4090", "NVIDIA GeForce RTX 4090", 24564, _cuda(24564, 23.64), (8, 9), False,
              "nvidia-smi 24564 MiB (https://github.com/vllm-project/vllm/issues/7553); CUDA 23.64 GiB: "
              "'GPU 0 has a total capacity of 23.64 GiB' on an RTX 4090 "
              "(https://github.com/ali-vilab/VGen/issues/104)"),
    GpuPreset("RTX-3090", "NVIDIA GeForce RTX 3090", 24576, _cuda(24576, 23.69), (8, 6), False,
              "nvidia-smi 24576 MiB; CUDA 23.69 GiB: 'GPU 0 has a total capacity of 23.69 GiB' on an RTX "
              "3090 (https://github.com/OpenBMB/MiniCPM-V/issues/612)"),
    GpuPreset("V100", "Tesla V100-SXM2-32GB", 32768, 0, (7, 0), True,
              f"nvidia-smi 32768 MiB (SXM2, NVLink); {_NOT_FOUND}. No FP8, no bfloat16: vLLM needs "
              "--dtype half there"),
    GpuPreset("T4", "Tesla T4", 15360, _cuda(15360, 14.56), (7, 5), False,
              "nvidia-smi 15360 MiB; CUDA 14.56-14.58 GiB by driver, the lowest taken: 'GPU 0 has a total "
              "capacity of 14.56 GiB' on a T4 (https://github.com/Zheng-Chong/CatVTON/issues/133; 14.58 in "
              "https://github.com/datawhalechina/self-llm/issues/162)"),
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
        hint = closest_preset(match.group(2))
        suggestion = f" (did you mean {hint}?)" if hint else ""
        raise ConfigError(f"--gpus {spec!r}: unknown GPU {match.group(2)!r}{suggestion}; expected one of {choices}")
    if not 1 <= count <= MAX_PLAN_GPUS:
        raise ConfigError(f"--gpus {spec!r}: expected 1 to {MAX_PLAN_GPUS} GPUs, got {count}")
    return count, preset


def closest_preset(name: str) -> str | None:
    """The preset a mistyped or shortened name most likely means (``H100`` -> ``H100-80GB``,
    ``rtx5090`` -> ``RTX-5090``); None when nothing is close."""
    wanted = re.sub(r"[^a-z0-9]", "", name.lower())
    squashed = {re.sub(r"[^a-z0-9]", "", key): p.name for key, p in PRESETS.items()}
    if wanted in squashed:
        return squashed[wanted]
    for matches in (lambda key: key.startswith(wanted), lambda key: wanted in key):
        found = sorted(n for key, n in squashed.items() if wanted and matches(key))
        if len(found) == 1:
            return found[0]
    close = difflib.get_close_matches(wanted, list(squashed), n=1, cutoff=0.75)
    return squashed[close[0]] if close else None


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
