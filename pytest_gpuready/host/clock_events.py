"""The GPU's clock-event reasons, sampled while a benchmark level runs: a throttled GPU is no regression.

NVML reports why the clocks are below their maximum as a bit mask
(``nvmlDeviceGetCurrentClocksEventReasons``; ``clocks_event_reasons.active`` in
``nvidia-smi --query-gpu``, ``clocks_throttle_reasons.active`` on drivers before 535). The bits are
NVML's ``nvmlClocksEventReason*`` constants (nvml.h). A level measured while the hardware slowed
the clocks (HW slowdown, thermal, power brake) measured the cooling or the power supply, not the
deployment: the comparison calls it ``invalid: throttled (...)``. The software power cap is what a
GPU under full load normally runs at, so it is recorded only.

A minimal reader behind a small interface (:class:`ClockEventReader`: ``read() -> {gpu: mask}``),
so the GPU health checks can supply theirs; :class:`ClockEventSampler` polls one on a thread
for the length of a level.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_gpuready.errors import HostError, ProbeError
from pytest_gpuready.host.hosts import Host

REASONS: tuple[tuple[int, str, str], ...] = (
    (0x0000000000000001, "gpu_idle", "GPU idle"),
    (0x0000000000000002, "applications_clocks_setting", "applications clocks setting"),
    (0x0000000000000004, "sw_power_cap", "SW power cap"),
    (0x0000000000000008, "hw_slowdown", "HW slowdown"),
    (0x0000000000000010, "sync_boost", "sync boost"),
    (0x0000000000000020, "sw_thermal_slowdown", "SW thermal slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown", "HW thermal slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown", "HW power brake slowdown"),
    (0x0000000000000100, "display_clock_setting", "display clock setting"),
)
"""(bit, name, label) of each reason, as nvml.h defines them."""
LABEL = {name: label for _, name, label in REASONS}
INVALIDATING = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
"""Reasons that make a level's figures the hardware's, not the deployment's."""
RECORDED_ONLY = ("sw_power_cap",)

SMI_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
"""The field by its name since driver 535, and before."""


def decode(mask: int) -> tuple[str, ...]:
    """The reasons set in ``mask`` (unknown bits are ignored)."""
    return tuple(name for bit, name, _ in REASONS if mask & bit)


class ClockEventReader(Protocol):
    """Reads the current clock-event mask of each GPU; raises :class:`ProbeError` if it cannot."""

    def read(self) -> Mapping[int, int]: ...


def parse_smi(text: str, host: str = "host") -> dict[int, int]:
    """``0, 0x0000000000000004`` lines (``index, clocks_event_reasons.active``) -> {0: 4}."""
    masks: dict[int, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 2 or not cells[0].isdigit():
            raise ProbeError(f"{host}: nvidia-smi clock-event reasons: expected 'index, 0xMASK', got {line.strip()!r}")
        try:
            masks[int(cells[0])] = int(cells[1], 16)
        except ValueError:
            raise ProbeError(f"{host}: nvidia-smi clock-event reasons of GPU {cells[0]}: expected a hex mask, "
                             f"got {cells[1]!r}") from None
    if not masks:
        raise ProbeError(f"{host}: nvidia-smi printed no clock-event reasons")
    return masks


@dataclass
class SmiClockEventReader:
    """``nvidia-smi --query-gpu=index,clocks_event_reasons.active`` on ``host`` (any host, one round trip)."""

    host: Host
    gpus: tuple[int, ...] | None = None
    _field: str | None = None

    def _script(self, name: str) -> str:
        ids = f" -i {','.join(str(g) for g in self.gpus)}" if self.gpus is not None else ""
        return f"nvidia-smi --query-gpu=index,{shlex.quote(name)} --format=csv,noheader{ids}"

    def read(self) -> Mapping[int, int]:
        tried = []
        for name in ([self._field] if self._field else list(SMI_FIELDS)):
            try:
                result = self.host.run(self._script(name), timeout=10)
            except HostError as exc:
                raise ProbeError(f"{self.host.name}: clock-event reasons not read: {exc}") from None
            if result.returncode == 0:
                self._field = name
                return parse_smi(result.stdout, self.host.name)
            tried.append(f"{name}: {(result.stdout + result.stderr).strip()[:200]}")
        raise ProbeError(f"{self.host.name}: clock-event reasons not read ({'; '.join(tried)})")


@dataclass
class NvmlClockEventReader:
    """NVML on this machine (the library the probe uses locally)."""

    gpus: tuple[int, ...] | None = None

    def read(self) -> Mapping[int, int]:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise ProbeError(f"local: clock-event reasons not read: NVML could not be initialised: {exc}") from None
        try:
            get = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            indexes = self.gpus if self.gpus is not None else tuple(range(pynvml.nvmlDeviceGetCount()))
            return {index: int(get(pynvml.nvmlDeviceGetHandleByIndex(index))) for index in indexes}
        except pynvml.NVMLError as exc:
            raise ProbeError(f"local: clock-event reasons not read: {exc}") from None
        finally:
            pynvml.nvmlShutdown()


def reader_for(host: Host, gpu_reader: str, gpus: Sequence[int] | None) -> ClockEventReader:
    """NVML where the probe read this machine's GPUs through NVML, else nvidia-smi on the host."""
    chosen = tuple(gpus) if gpus is not None else None
    if host.is_local and gpu_reader == "nvml":
        return NvmlClockEventReader(chosen)
    return SmiClockEventReader(host, chosen)


@dataclass
class ClockEvents:
    """What the samples of one level saw: per reason, on how many samples of which GPUs it was active."""

    samples: int = 0
    gpus: tuple[int, ...] = ()
    active: dict[str, dict[int, int]] = field(default_factory=dict)
    """reason -> {gpu: samples where it was active}."""
    not_sampled: str | None = None
    """Why there are no samples (no GPU, or the reader failed): None when sampled."""

    def add(self, masks: Mapping[int, int]) -> None:
        self.samples += 1
        self.gpus = tuple(sorted(set(self.gpus) | set(masks)))
        for gpu, mask in masks.items():
            for name in decode(mask):
                per_gpu = self.active.setdefault(name, {})
                per_gpu[gpu] = per_gpu.get(gpu, 0) + 1

    def describe(self, names: Sequence[str]) -> str:
        """``HW slowdown on GPU 0 in 3 of 12 samples; SW thermal slowdown on GPUs 0,1 in 1 of 12 samples``."""
        parts = []
        for name in names:
            per_gpu = self.active.get(name)
            if not per_gpu:
                continue
            gpus = sorted(per_gpu)
            where = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {','.join(str(g) for g in gpus)}"
            parts.append(f"{LABEL.get(name, name)} on {where} in {max(per_gpu.values())} of {self.samples} samples")
        return "; ".join(parts)

    @property
    def throttled(self) -> str | None:
        """``HW slowdown on GPU 0 in 3 of 12 samples`` when a level was throttled, else None."""
        return self.describe(INVALIDATING) or None

    @property
    def power_capped(self) -> str | None:
        return self.describe(RECORDED_ONLY) or None

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "gpus": list(self.gpus), "not_sampled": self.not_sampled,
                "active": {name: {str(g): n for g, n in per_gpu.items()} for name, per_gpu in self.active.items()},
                "throttled": self.throttled, "sw_power_cap": self.power_capped}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClockEvents:
        active = {str(name): {int(g): int(n) for g, n in per_gpu.items()}
                  for name, per_gpu in (data.get("active") or {}).items()}
        return cls(int(data.get("samples") or 0), tuple(int(g) for g in data.get("gpus") or ()), active,
                   data.get("not_sampled"))


class ClockEventSampler:
    """Polls a reader every ``interval_s`` on a thread between :meth:`start` and :meth:`stop`.

    One sample is taken at the start and one at the stop, so even a short level has two; a reader
    that fails ends the sampling with the reason in :attr:`ClockEvents.not_sampled` (the
    comparison then cannot say the level ran unthrottled, and says so).
    """

    def __init__(self, reader: ClockEventReader, interval_s: float = 0.5) -> None:
        self.reader = reader
        self.interval_s = interval_s
        self.events = ClockEvents()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _sample(self) -> bool:
        try:
            masks = self.reader.read()
        except ProbeError as exc:
            with self._lock:
                self.events.not_sampled = str(exc)
            return False
        with self._lock:
            self.events.add(masks)
        return True

    def start(self) -> ClockEventSampler:
        if self._sample():
            self._thread = threading.Thread(target=self._run, name="gpuready-clock-events", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._sample():
                return

    def stop(self) -> ClockEvents:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.events.not_sampled is None:
                self._sample()
        return self.events


__all__ = [
    "INVALIDATING",
    "REASONS",
    "RECORDED_ONLY",
    "ClockEventReader",
    "ClockEventSampler",
    "ClockEvents",
    "NvmlClockEventReader",
    "SmiClockEventReader",
    "decode",
    "parse_smi",
    "reader_for",
]
