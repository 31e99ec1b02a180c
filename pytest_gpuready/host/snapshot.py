"""What a probe saw on a host at one moment: GPUs, their processes, /dev/shm, topology, vLLM.

Plain frozen data, so checks can be pure functions of a snapshot and tests can build one from
captured outputs. :mod:`pytest_gpuready.host.probe` fills it in one round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_gpuready.errors import NoGpuError, ProbeError
from pytest_gpuready.host.health import HostHealth


@dataclass(frozen=True)
class GpuInfo:
    """One GPU, with memory in MiB as nvidia-smi reports it.

    ``memory_used_mib`` excludes driver-reserved memory (NVML memory info v2 / nvidia-smi's
    ``memory.used`` on recent drivers), so an idle GPU reads near 0.
    """

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_used_mib: int
    memory_total_mib: int
    memory_reserved_mib: int | None = None
    power_draw_w: float | None = None
    compute_capability: tuple[int, int] | None = None
    driver_version: str | None = None

    @property
    def memory_free_mib(self) -> int:
        reserved = self.memory_reserved_mib or 0
        return max(0, self.memory_total_mib - reserved - self.memory_used_mib)

    @property
    def sm(self) -> str | None:
        """``SM90``-style architecture name, or None when the capability is unknown."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return f"SM{major}{minor}"


@dataclass(frozen=True)
class ProcessInfo:
    """One process as ``/proc/PID/stat`` and ``cmdline`` showed it in the probe's round trip."""

    pid: int
    ppid: int
    session_id: int
    start_ticks: int
    """Field 22 of /proc/PID/stat: start time in clock ticks since boot (with the pid, names the process)."""
    comm: str
    cmdline: str = ""

    @property
    def label(self) -> str:
        """What ps would show: the command line, else the kernel name."""
        return (self.cmdline.strip() or self.comm)[:120]


@dataclass(frozen=True)
class GpuProcess:
    """A compute process holding memory on a GPU (joined to the GPU by uuid)."""

    pid: int
    name: str
    used_memory_mib: int | None
    gpu_uuid: str
    gpu_index: int | None = None
    alive: bool | None = None
    """False when the pid no longer exists on the host (a zombie context); None when unknown."""
    cmdline: str | None = None
    lineage: tuple[ProcessInfo, ...] = ()
    """The process itself and its ancestors (parent first), read in the same probe round trip as
    the GPU listing; empty when not read. :mod:`pytest_gpuready.host.orphans` judges it."""

    @property
    def info(self) -> ProcessInfo | None:
        """The process's own ``/proc`` entry (ppid, session, start time), when it was read."""
        return self.lineage[0] if self.lineage and self.lineage[0].pid == self.pid else None

    @property
    def ppid(self) -> int | None:
        return self.info.ppid if self.info is not None else None

    @property
    def session_id(self) -> int | None:
        return self.info.session_id if self.info is not None else None

    @property
    def start_ticks(self) -> int | None:
        return self.info.start_ticks if self.info is not None else None


@dataclass(frozen=True)
class ShmEntry:
    """One entry in /dev/shm."""

    name: str
    size_bytes: int
    owner: str
    mtime: float
    in_use: bool | None = None
    """True when a live process has it open or mapped; None when that could not be determined."""
    holders: tuple[int, ...] = ()
    """The pids that have it open or mapped (as far as the probe could see)."""
    kind: str | None = None
    """``f`` regular file, ``d`` directory, ``l`` symlink, ... (``find -printf %y``); None if unknown."""
    inode: int | None = None
    """Its inode when listed, so a removal can tell the same file from a new one of that name."""


@dataclass(frozen=True)
class ShmStatus:
    """/dev/shm's entries and capacity."""

    entries: tuple[ShmEntry, ...]
    total_bytes: int
    free_bytes: int
    can_see_all_processes: bool
    """True when the probe could read every process's open files (root), so ``in_use`` is reliable."""


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs are connected, as ``nvidia-smi topo -m`` names it (NV18, PIX, PXB, PHB, NODE, SYS)."""

    gpu_a: int
    gpu_b: int
    link: str

    @property
    def is_nvlink(self) -> bool:
        return self.link.startswith("NV")


@dataclass(frozen=True)
class Topology:
    """GPU-to-GPU links and each GPU's CPU and NUMA affinity."""

    links: tuple[GpuLink, ...]
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, int | None] = field(default_factory=dict)

    def link(self, a: int, b: int) -> str | None:
        for item in self.links:
            if {item.gpu_a, item.gpu_b} == {a, b}:
                return item.link
        return None


@dataclass(frozen=True)
class HostSnapshot:
    """Everything one probe of a host saw.

    A section that could not be measured holds None and its cause in ``errors`` (key ``gpus``,
    ``shm``, ``topology``, ``vllm``). Use :meth:`require_gpus` rather than ``gpus`` in checks so
    an unmeasured host errors instead of passing. ``no_gpu_reason`` is set instead of an error
    when the local machine simply has no NVIDIA GPU and none was asked for.
    """

    host: str
    taken_at: float
    gpu_reader: str  # "nvml", "nvidia-smi" or "none"
    gpus: tuple[GpuInfo, ...] | None
    processes: tuple[GpuProcess, ...] = ()
    shm: ShmStatus | None = None
    topology: Topology | None = None
    vllm_version: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    no_gpu_reason: str | None = None
    probe_duration_s: float = 0.0
    health: HostHealth | None = None
    """GPU health (:mod:`pytest_gpuready.host.health`), read in the same round trip; None when not asked
    for or not readable (the cause in ``errors['health']``)."""

    def require_gpus(self) -> tuple[GpuInfo, ...]:
        """The GPUs, or raise NoGpuError (skip) / ProbeError (error) with the cause."""
        if self.no_gpu_reason is not None:
            raise NoGpuError(self.no_gpu_reason)
        if self.gpus is None:
            raise ProbeError(f"{self.host}: GPUs could not be read: {self.errors.get('gpus', 'unknown cause')}")
        return self.gpus

    def require_health(self) -> HostHealth:
        """The health reading, or raise NoGpuError (skip) / ProbeError (error) with the cause."""
        if self.no_gpu_reason is not None:
            raise NoGpuError(self.no_gpu_reason)
        if self.health is None:
            raise ProbeError(f"{self.host}: GPU health could not be read: "
                             f"{self.errors.get('health', self.errors.get('gpus', 'not probed'))}")
        return self.health

    def require_shm(self) -> ShmStatus:
        if self.shm is None:
            raise ProbeError(f"{self.host}: /dev/shm could not be read: {self.errors.get('shm', 'unknown cause')}")
        return self.shm

    def require_topology(self) -> Topology:
        self.require_gpus()
        if self.topology is None:
            raise ProbeError(
                f"{self.host}: GPU topology could not be read: {self.errors.get('topology', 'unknown cause')}"
            )
        return self.topology

    def gpu(self, index: int) -> GpuInfo:
        for gpu in self.require_gpus():
            if gpu.index == index:
                return gpu
        present = ", ".join(str(g.index) for g in self.require_gpus()) or "none"
        raise ProbeError(f"{self.host}: there is no GPU {index} (GPUs present: {present})")

    def processes_on(self, index: int) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.gpu_index == index)
