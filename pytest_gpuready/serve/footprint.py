"""What a server holds on its GPUs: the baseline before it started, growth while it loads, the footprint once ready.

The figures come from two independent sources that a reader can compare: a fresh
:class:`~pytest_gpuready.host.snapshot.HostSnapshot` (what the driver says each GPU holds) and
the startup log (what vLLM says it loaded and reserved for the KV cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from pytest_gpuready.errors import HostError, ProbeError
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.serve import vllm_log

SnapshotFn: TypeAlias = Callable[[], HostSnapshot]


def short_gpu_name(name: str) -> str:
    """How engineers say it: ``NVIDIA RTX PRO 6000 Blackwell Server Edition`` -> ``RTX PRO 6000``."""
    short = name.strip()
    if short.lower().startswith("nvidia "):
        short = short[len("nvidia "):]
    if " Blackwell" in short and not short.startswith("Blackwell"):
        short = short[: short.index(" Blackwell")]
    return short


@dataclass(frozen=True)
class Footprint:
    """Memory the ready server holds: per-GPU MiB from a fresh snapshot, and what its log said."""

    log: vllm_log.StartupFigures
    gpu_memory_mib: Mapping[int, int] | None = None
    gpu_total_mib: Mapping[int, int] | None = None
    gpu_names: Mapping[int, str] | None = None
    baseline_mib: Mapping[int, int] | None = None
    """GPU memory used before the server started (so growth = used - baseline)."""
    log_available: bool = True

    @property
    def hardware(self) -> str:
        """``4x RTX PRO 6000`` (short names, see :func:`short_gpu_name`), or ``no GPU``."""
        if not self.gpu_names:
            return "no GPU"
        names = sorted({short_gpu_name(n) for n in self.gpu_names.values()})
        return f"{len(self.gpu_names)}x {' + '.join(names)}"

    def growth_mib(self) -> dict[int, int] | None:
        if self.gpu_memory_mib is None:
            return None
        base = self.baseline_mib or {}
        return {i: used - base.get(i, 0) for i, used in self.gpu_memory_mib.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "gpu_memory_mib": dict(self.gpu_memory_mib) if self.gpu_memory_mib is not None else None,
            "gpu_growth_mib": self.growth_mib(),
            "gpu_total_mib": dict(self.gpu_total_mib) if self.gpu_total_mib is not None else None,
            "log": self.log.to_dict() if self.log_available else None,
        }

    def describe(self) -> str:
        parts = [self.log.describe() if self.log_available else "no startup log (attached)"]
        if self.gpu_memory_mib is not None:
            parts.append("GPU memory " + ", ".join(f"{i}: {m} MiB" for i, m in sorted(self.gpu_memory_mib.items())))
        return "; ".join(parts)


class GpuMemoryWatch:
    """The GPUs a server uses, as the driver reports them: baseline, growth, footprint.

    ``gpus`` limits every figure to the server's GPUs (None: all). A snapshot that cannot be
    taken is "not known" here, never zero: progress lines and footprints leave GPU figures out
    rather than report a number nobody measured.
    """

    def __init__(self, snapshot_fn: SnapshotFn | None, gpus: Sequence[int] | None) -> None:
        self.snapshot_fn = snapshot_fn
        self.gpus = tuple(gpus) if gpus is not None else None
        self.has_gpus: bool | None = None
        """True once a snapshot showed GPUs, False if it showed none, None while unknown."""
        self.baseline_mib: dict[int, int] | None = None

    def select(self, per_gpu: Mapping[int, int]) -> dict[int, int]:
        return {i: v for i, v in per_gpu.items() if self.gpus is None or i in self.gpus}

    def _snapshot(self) -> HostSnapshot | None:
        if self.snapshot_fn is None:
            return None
        try:
            return self.snapshot_fn()
        except (ProbeError, HostError):
            return None

    def take_baseline(self) -> None:
        """Before the launch: does the host have GPUs, and how much of ours is already used."""
        if self.snapshot_fn is None:
            return
        snap = self._snapshot()
        if snap is None:
            self.has_gpus = None
            return
        self.has_gpus = bool(snap.gpus) and snap.no_gpu_reason is None
        if self.has_gpus and snap.gpus is not None:
            self.baseline_mib = self.select({g.index: g.memory_used_mib for g in snap.gpus})

    def used_mib(self) -> dict[int, int] | None:
        """Memory used now on the server's GPUs, or None when there are none or they cannot be read."""
        if not self.has_gpus:
            return None
        snap = self._snapshot()
        if snap is None or snap.gpus is None:
            return None
        return self.select({g.index: g.memory_used_mib for g in snap.gpus})

    def growth_text(self) -> str | None:
        """``+71200 MiB (0: 71832)`` for a progress line, or None when not known."""
        used = self.used_mib()
        if used is None:
            return None
        base = self.baseline_mib or {}
        growth = sum(used.values()) - sum(base.get(i, 0) for i in used)
        return f"+{growth} MiB (" + ", ".join(f"{i}: {m}" for i, m in sorted(used.items())) + ")"

    def footprint(self, log_text: str, *, attached: bool) -> Footprint:
        """The footprint once ready: the startup log's figures and a fresh read of the server's GPUs."""
        figures = vllm_log.parse_startup_log(log_text)
        used: dict[int, int] | None = None
        totals: dict[int, int] | None = None
        names: dict[int, str] | None = None
        if self.snapshot_fn is not None and (self.has_gpus or attached):
            snap = self._snapshot()
            if snap is not None and snap.gpus and snap.no_gpu_reason is None:
                self.has_gpus = True
                chosen = [g for g in snap.gpus if self.gpus is None or g.index in self.gpus]
                used = {g.index: g.memory_used_mib for g in chosen}
                totals = {g.index: g.memory_total_mib for g in chosen}
                names = {g.index: g.name for g in chosen}
        return Footprint(figures, used, totals, names, self.baseline_mib, log_available=not attached)


__all__ = ["Footprint", "GpuMemoryWatch", "SnapshotFn", "short_gpu_name"]
