"""Clock-event reasons of a host's GPUs: decoding the bit mask, one reading, and a sampler.

Why it exists: a serving benchmark that ran while the GPU slowed itself down (HW slowdown,
thermal, power brake) measured the cooling, not vLLM. DCGM fails its stress tests on exactly
these bits, and a throughput baseline must call such a level *invalid*, not a regression
(``gpu-health-anchors.md`` c.5 §5). ``SW power cap`` is different: an H200 under a bf16 matmul
runs at its 700 W cap with bit ``0x4`` set (captured in ``all-fields-load.tsv``), so it is
recorded and never judged.

The API is small and shared: :func:`read_clock_events` reads the current mask of each GPU once
(NVML on this machine, else one ``nvidia-smi --query-gpu`` over the host's connection, never one
call per GPU), and :class:`ClockEventSampler` reads it in a background thread while a benchmark
level runs and returns a :class:`ClockEventRecord`: every reason seen per GPU, and which of them
throttle. The health checks (before load) and the benchmark (during each level) both use it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gpuready.errors import GpuReadyError, ProbeError
from pytest_gpuready.host.gpus import nvml as load_nvml
from pytest_gpuready.host.hosts import Host

CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML's ``nvmlClocksEventReason*`` bits, named as nvidia-smi's ``clocks_event_reasons.*`` fields."""

THROTTLING_MASK = 0x8 | 0x20 | 0x40 | 0x80
"""HW slowdown, SW thermal, HW thermal, HW power brake: the GPU slowed itself; a level run so is invalid."""

RECORDED_ONLY_MASK = 0x4
"""SW power cap: the board at its power limit, normal under full load (Azure NHC ignores it too)."""

QUERY_FIELD = "clocks_event_reasons.active"
LEGACY_QUERY_FIELD = "clocks_throttle_reasons.active"
"""The name before driver 535.54.03 (Azure NHC switches names at that version)."""

DEFAULT_INTERVAL_S = 0.5

LINK_FIELDS = ("pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
"""The PCIe link read with every sample: an idle GPU lowers its link generation to save power ("may be
reduced when the GPU is not in use", nvidia-smi help), so only a reading under load can say that a
link is narrower or slower than it may be (DCGM's PCIe test; ``gpu-health-anchors.md`` rank 14)."""


def reason_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in ``mask`` (unknown bits as ``0x...``), lowest bit first."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return tuple(names)


def throttling_reasons(mask: int) -> tuple[str, ...]:
    """The throttling reasons in ``mask`` (empty: the GPU did not slow itself)."""
    return reason_names(mask & THROTTLING_MASK)


def parse_mask(text: str) -> int | None:
    """``0x0000000000000004`` -> 4; ``[N/A]`` / ``[Not Supported]`` -> None (not supported on this GPU)."""
    value = text.strip()
    if value.startswith("[") or value in ("N/A", ""):
        return None
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        raise ProbeError(f"clock-event reasons read {value[:40]!r}, "
                         "expected a bit mask like 0x0000000000000001") from None


def clock_events_command() -> str:
    """One ``nvidia-smi`` call for every GPU's mask, falling back to the pre-535 field name."""
    tail = "--format=csv,noheader"
    return (f"nvidia-smi --query-gpu=index,{QUERY_FIELD} {tail} 2>/dev/null "
            f"|| nvidia-smi --query-gpu=index,{LEGACY_QUERY_FIELD} {tail}")


@dataclass(frozen=True)
class LinkReading:
    """One GPU's PCIe link at one sample: current and maximum generation and width (None: not read)."""

    gen: int | None
    gen_max: int | None
    width: int | None
    width_max: int | None


@dataclass(frozen=True)
class ClockSample:
    """One sample of every GPU: its clock-event mask and, where read, its PCIe link."""

    masks: Mapping[int, int | None]
    links: Mapping[int, LinkReading] = field(default_factory=dict)


def sample_command() -> str:
    """One ``nvidia-smi`` call for every GPU's mask and PCIe link, falling back to the pre-535 mask
    name, then to the mask alone (a driver or stand-in that lacks a link field)."""
    tail = "--format=csv,noheader,nounits 2>/dev/null"
    links = ",".join(LINK_FIELDS)
    return (f"nvidia-smi --query-gpu=index,{QUERY_FIELD},{links} {tail} "
            f"|| nvidia-smi --query-gpu=index,{LEGACY_QUERY_FIELD},{links} {tail} "
            f"|| {clock_events_command()}")


def _link_value(text: str) -> int | None:
    value = text.strip()
    return int(value) if value.isdigit() else None


def parse_clock_sample(text: str, host: str = "host") -> ClockSample:
    """Rows of :func:`sample_command`: ``index, mask, gen, gen max, width, width max`` (or ``index, mask``)."""
    masks: dict[int, int | None] = {}
    links: dict[int, LinkReading] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if not line.strip():
            continue
        if len(cells) not in (2, 2 + len(LINK_FIELDS)) or not cells[0].isdigit():
            raise ProbeError(f"{host}: nvidia-smi --query-gpu=index,{QUERY_FIELD},...: "
                             f"unexpected line {line.strip()[:80]!r}")
        index = int(cells[0])
        try:
            masks[index] = parse_mask(cells[1])
        except ProbeError as exc:
            raise ProbeError(f"{host}: GPU {index}: {exc}") from None
        if len(cells) > 2:
            gen, gen_max, width, width_max = (_link_value(cell) for cell in cells[2:])
            links[index] = LinkReading(gen, gen_max, width, width_max)
    if not masks:
        raise ProbeError(f"{host}: nvidia-smi --query-gpu=index,{QUERY_FIELD} listed no GPUs")
    return ClockSample(masks, links)


def parse_clock_events(text: str, host: str = "host") -> dict[int, int | None]:
    """Parse ``index, mask`` rows into GPU index -> mask (None where the GPU does not support it)."""
    masks: dict[int, int | None] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        index, sep, value = line.partition(",")
        if not sep or not index.strip().isdigit():
            raise ProbeError(f"{host}: nvidia-smi --query-gpu=index,{QUERY_FIELD}: "
                             f"unexpected line {line.strip()[:80]!r}")
        try:
            masks[int(index)] = parse_mask(value)
        except ProbeError as exc:
            raise ProbeError(f"{host}: GPU {int(index)}: {exc}") from None
    if not masks:
        raise ProbeError(f"{host}: nvidia-smi --query-gpu=index,{QUERY_FIELD} listed no GPUs")
    return masks


def _nvml_mask(nvml: Any, handle: Any) -> int | None:
    getter = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)  # the name before nvidia-ml-py 12.535
    try:
        return int(getter(handle))
    except nvml.NVMLError_NotSupported:
        return None


def _nvml_int(call: Callable[[Any], Any], handle: Any) -> int | None:
    try:
        return int(call(handle))
    except Exception:  # NotSupported, or a GPU that stopped answering: the link is "not read"
        return None


class _NvmlReader:
    """Masks and PCIe links through NVML, initialised once for a sampler's life (each init costs ~11 ms)."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            nvml = load_nvml()
        self._nvml = nvml
        nvml.nvmlInit()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._max = [(_nvml_int(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                      _nvml_int(nvml.nvmlDeviceGetMaxPcieLinkWidth, h)) for h in self._handles]

    def masks(self) -> dict[int, int | None]:
        return {index: _nvml_mask(self._nvml, handle) for index, handle in enumerate(self._handles)}

    def __call__(self) -> ClockSample:
        nvml = self._nvml
        links = {index: LinkReading(_nvml_int(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle), self._max[index][0],
                                    _nvml_int(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle), self._max[index][1])
                 for index, handle in enumerate(self._handles)}
        return ClockSample(self.masks(), links)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _smi_reader(host: Host, timeout: float) -> Callable[[], ClockSample]:
    command = sample_command()

    def read() -> ClockSample:
        result = host.run(command, timeout=timeout)
        if result.returncode != 0:
            detail = " ".join((result.stdout + " " + result.stderr).split())[:200]
            raise ProbeError(f"{host.name}: reading clock-event reasons failed (exit {result.returncode}): {detail}")
        return parse_clock_sample(result.stdout, host.name)

    return read


def read_clock_events(host: Host, timeout: float = 10.0) -> dict[int, int | None]:
    """Each GPU's current clock-event mask, once: NVML on this machine (else nvidia-smi), nvidia-smi elsewhere."""
    if host.is_local:
        try:
            reader = _NvmlReader()
        except Exception:  # no NVML here: nvidia-smi says why, if it can
            return dict(_smi_reader(host, timeout)().masks)
        try:
            return reader.masks()
        finally:
            reader.close()
    return dict(_smi_reader(host, timeout)().masks)


@dataclass
class LinkRecord:
    """One GPU's PCIe link over a sampler's interval: the best (highest) generation and width seen.

    The best, not the last: the level's first sample may come before the load ramps up, when
    the GPU still idles at a lower generation. A link whose best under load is below its maximum
    ran narrower or slower than it may for the whole level.
    """

    gen: int | None = None
    gen_max: int | None = None
    width: int | None = None
    width_max: int | None = None
    samples: int = 0

    def add(self, reading: LinkReading) -> None:
        self.samples += 1
        self.gen = _higher(self.gen, reading.gen)
        self.width = _higher(self.width, reading.width)
        self.gen_max = reading.gen_max if reading.gen_max is not None else self.gen_max
        self.width_max = reading.width_max if reading.width_max is not None else self.width_max

    @property
    def short(self) -> bool:
        slower = self.gen is not None and self.gen_max is not None and self.gen < self.gen_max
        narrower = self.width is not None and self.width_max is not None and self.width < self.width_max
        return slower or narrower

    def describe(self) -> str:
        def text(value: int | None, prefix: str) -> str:
            return f"{prefix}{value}" if value is not None else f"{prefix}?"

        return (f"PCIe {text(self.gen, 'gen ')} {text(self.width, 'x')} at best under load "
                f"(max {text(self.gen_max, 'gen ')} {text(self.width_max, 'x')})")

    def to_dict(self) -> dict[str, Any]:
        return {"gen": self.gen, "gen_max": self.gen_max, "width": self.width, "width_max": self.width_max,
                "samples": self.samples, "short": self.short}


def _higher(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass(frozen=True)
class ClockEventRecord:
    """What a sampler saw over one interval (a benchmark level): every reason per GPU, OR-ed.

    ``seen[gpu]`` is the union of the masks sampled (None: not supported on this GPU);
    ``throttled`` keeps only the throttling reasons; ``errors`` holds the samples that could not
    be read (a level with no sample at all cannot say it was unthrottled: :attr:`measured`).
    """

    seen: Mapping[int, int | None]
    samples: int
    started_at: float
    stopped_at: float
    errors: tuple[str, ...] = ()
    gpus: tuple[int, ...] | None = None
    """The GPUs judged (None: all the host has)."""
    links: Mapping[int, LinkRecord] = field(default_factory=dict)
    """GPU -> its PCIe link over the interval: the best generation and width seen, and the maximum."""

    @property
    def measured(self) -> bool:
        return self.samples > 0

    @property
    def link_shortfalls(self) -> dict[int, str]:
        """GPU -> ``gen 4 x8 at best under load (max gen 5 x16)`` where the link never reached its maximum."""
        return {gpu: link.describe() for gpu, link in sorted(self.links.items())
                if (self.gpus is None or gpu in self.gpus) and link.short}

    @property
    def throttled(self) -> dict[int, tuple[str, ...]]:
        """GPU -> throttling reasons seen (only GPUs that throttled)."""
        out: dict[int, tuple[str, ...]] = {}
        for gpu, mask in self.seen.items():
            if mask is not None and (self.gpus is None or gpu in self.gpus) and mask & THROTTLING_MASK:
                out[gpu] = throttling_reasons(mask)
        return out

    def describe(self) -> str:
        """``GPU 0: sw_power_cap; GPU 1: hw_slowdown, hw_thermal_slowdown (throttled)``, one clause a GPU."""
        if not self.measured:
            return "clock-event reasons not measured: " + ("; ".join(self.errors[:2]) or "no sample taken")
        parts = []
        for gpu in sorted(self.seen):
            if self.gpus is not None and gpu not in self.gpus:
                continue
            mask = self.seen[gpu]
            if mask is None:
                parts.append(f"GPU {gpu}: clocks_event_reasons not supported on this GPU")
                continue
            names = ", ".join(reason_names(mask)) or "none"
            parts.append(f"GPU {gpu}: {names}" + (" (throttled)" if mask & THROTTLING_MASK else ""))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "duration_s": round(self.stopped_at - self.started_at, 3),
            "reasons": {str(gpu): (None if mask is None
                                   else {"mask": f"0x{mask:016x}", "names": list(reason_names(mask))})
                        for gpu, mask in sorted(self.seen.items())
                        if self.gpus is None or gpu in self.gpus},
            "throttled": {str(gpu): list(names) for gpu, names in sorted(self.throttled.items())},
            "errors": list(self.errors),
            **({"pcie": {str(gpu): link.to_dict() for gpu, link in sorted(self.links.items())
                         if self.gpus is None or gpu in self.gpus}} if self.links else {}),
        }


@dataclass
class ClockEventSampler:
    """Sample clock-event reasons in a background thread until :meth:`stop`.

    ``with ClockEventSampler(host) as sampler: run_level(); record = sampler.record`` or
    ``sampler.start(); ...; record = sampler.stop()``. One sample at start, one every
    ``interval_s``, one at stop, so a short level still has two. ``reader`` replaces the host
    read (tests; a caller with its own NVML session). A sample that fails is kept as an error
    and sampling goes on: a flaky read must not end a benchmark.
    """

    host: Host | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    gpus: Sequence[int] | None = None
    reader: Callable[[], Mapping[int, int | None] | ClockSample] | None = None
    timeout_s: float = 10.0
    _seen: dict[int, int | None] = field(default_factory=dict, init=False, repr=False)
    _samples: int = field(default=0, init=False, repr=False)
    _errors: list[str] = field(default_factory=list, init=False, repr=False)
    _links: dict[int, LinkRecord] = field(default_factory=dict, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _close: Callable[[], None] | None = field(default=None, init=False, repr=False)
    _started_at: float = field(default=0.0, init=False, repr=False)
    record: ClockEventRecord | None = field(default=None, init=False)

    def _resolve_reader(self) -> Callable[[], Mapping[int, int | None] | ClockSample]:
        if self.reader is not None:
            return self.reader
        if self.host is None:
            raise ValueError("ClockEventSampler needs a host or a reader")
        if self.host.is_local:
            try:
                nvml = _NvmlReader()
            except Exception:
                return _smi_reader(self.host, self.timeout_s)
            self._close = nvml.close
            return nvml
        return _smi_reader(self.host, self.timeout_s)

    def _sample(self, read: Callable[[], Mapping[int, int | None] | ClockSample]) -> None:
        try:
            sample = read()
        except (GpuReadyError, OSError) as exc:
            with self._lock:
                if len(self._errors) < 20:
                    self._errors.append(str(exc))
            return
        except Exception as exc:  # an NVML error: kept, named, never raised into the benchmark
            with self._lock:
                if len(self._errors) < 20:
                    self._errors.append(f"{type(exc).__name__}: {exc}")
            return
        masks = sample.masks if isinstance(sample, ClockSample) else sample
        links = sample.links if isinstance(sample, ClockSample) else {}
        with self._lock:
            self._samples += 1
            for gpu, reading in links.items():
                self._links.setdefault(gpu, LinkRecord()).add(reading)
            for gpu, mask in masks.items():
                before = self._seen.get(gpu)
                self._seen[gpu] = mask if before is None else before | (mask or 0)

    def start(self) -> ClockEventSampler:
        if self._thread is not None:
            raise RuntimeError("ClockEventSampler already started")
        try:
            read = self._resolve_reader()
        except (GpuReadyError, OSError) as exc:
            self._errors.append(str(exc))
            read = None
        self._started_at = time.time()
        if read is None:
            self._thread = threading.Thread(target=lambda: None)
            self._thread.start()
            return self
        self._sample(read)

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self._sample(read)
            self._sample(read)

        self._thread = threading.Thread(target=loop, name="gpuready-clock-events", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ClockEventRecord:
        """Stop sampling (after one last sample) and return what was seen."""
        if self.record is not None:
            return self.record
        if self._thread is None:
            raise RuntimeError("ClockEventSampler was not started")
        self._stop.set()
        self._thread.join(self.timeout_s + self.interval_s + 5.0)
        if self._close is not None:
            with contextlib.suppress(Exception):  # shutting NVML down must not fail a finished benchmark
                self._close()
        with self._lock:
            self.record = ClockEventRecord(
                seen=dict(self._seen), samples=self._samples, started_at=self._started_at,
                stopped_at=time.time(), errors=tuple(self._errors),
                gpus=tuple(self.gpus) if self.gpus is not None else None,
                links={gpu: replace(link) for gpu, link in self._links.items()},
            )
        return self.record

    def __enter__(self) -> ClockEventSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
