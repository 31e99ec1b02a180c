"""Xid errors raised while something runs (a vLLM launch, a benchmark level), and what NVIDIA says to do.

Why it exists: an Xid during a launch or a benchmark is the driver saying the GPU failed under
the test (Xid 79: fallen off the bus; 48: double-bit ECC; 119: GSP timeout). vLLM then dies with
``CUDA error: unspecified launch failure`` or silently slows down, and the test's own failure
message names the symptom, not the cause. DCGM fails any active test on any Xid
(``DcgmRecorder.cpp``, ``gpu-health-anchors.md`` D19); so does this watcher's caller.

Two sources, one record (:class:`XidRecord`):

* **NVML events** on this machine: ``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents(h,
  nvmlEventTypeXidCriticalError, es)`` per watched GPU, and a thread blocked in
  ``nvmlEventSetWait_v2`` until :meth:`XidWatcher.stop`. It needs no root (measured on the H200:
  supported mask ``0xff9f`` as uid 65534) and sees only Xids raised after registration, which is
  exactly "during".
* **The kernel log** elsewhere (over the host's ssh connection) or where NVML cannot start: the
  ``NVRM: Xid`` lines of ``dmesg`` read once at start and once at stop; the lines that are new
  at stop are the Xids raised in between (a multiset difference, so no clock is compared).
  ``dmesg`` needs root where ``kernel.dmesg_restrict`` is 1: then the record says so
  (:attr:`XidRecord.unwatched`), which callers report once per host, never as an error.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.host.gpus import nvml as load_nvml
from pytest_gpuready.host.health_readers import XID_SCRIPT, parse_xid_log, xid_codes
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.xid_catalog import xid_action

NVML_XID_EVENT = 0x0000000000000008
"""``nvmlEventTypeXidCriticalError`` (nvml.h; pynvml's constant of the same name)."""
NVML_ERROR_TIMEOUT = 10
"""``NVML_ERROR_TIMEOUT``: ``nvmlEventSetWait_v2`` returned without an event."""
DEFAULT_WAIT_MS = 500

_BUS = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")


def bus_key(text: str) -> tuple[int, int, int] | None:
    """``0000:3b:00`` (kernel log) and ``00000000:3B:00.0`` (nvidia-smi) -> the same (domain, bus, device)."""
    match = _BUS.search(text)
    if match is None:
        return None
    return int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16)


@dataclass(frozen=True)
class XidEvent:
    """One Xid: the number, the GPU (index from NVML, PCI address from the kernel log), where it was seen."""

    xid: int
    source: str
    """``NVML`` or ``kernel log``."""
    gpu: int | None = None
    pci: str | None = None
    detail: str = ""
    """The kernel log line, or the NVML event's fields."""

    def where(self) -> str:
        if self.gpu is not None and self.pci:
            return f"GPU {self.gpu} (PCI {self.pci})"
        if self.gpu is not None:
            return f"GPU {self.gpu}"
        return f"PCI {self.pci}" if self.pci else "a GPU"

    def describe(self) -> str:
        """``GPU 0: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, ...: NVIDIA's immediate action ...)``."""
        text = f"{self.where()}: Xid {self.xid} ({xid_action(self.xid)})"
        return f"{text} [{self.source}: {self.detail[:200]}]" if self.detail else f"{text} [{self.source}]"

    def to_dict(self) -> dict[str, Any]:
        return {"xid": self.xid, "gpu": self.gpu, "pci": self.pci, "source": self.source, "detail": self.detail,
                "action": xid_action(self.xid)}


@dataclass(frozen=True)
class XidRecord:
    """What a watcher saw between start and stop."""

    host: str
    source: str | None
    """``NVML events``, ``kernel log``, or None when nothing could be watched."""
    events: tuple[XidEvent, ...] = ()
    unwatched: str | None = None
    """Why no Xid could be watched (the kernel log not readable without root, no NVML and no dmesg)."""
    errors: tuple[str, ...] = ()
    gpus: tuple[int, ...] | None = None
    started_at: float = 0.0
    stopped_at: float = 0.0

    @property
    def seen(self) -> bool:
        return bool(self.events)

    def failure(self, during: str) -> str:
        """``gpu-box: Xid during the launch: GPU 0: Xid 79 (...)``: the line a failed test starts with."""
        listed = "; ".join(event.describe() for event in self.events[:5])
        more = f"; and {len(self.events) - 5} more" if len(self.events) > 5 else ""
        return f"{self.host}: Xid during {during}: {listed}{more}"

    def describe(self) -> str:
        if self.unwatched is not None:
            return f"{self.host}: Xid not watched: {self.unwatched}"
        if not self.events:
            return f"{self.host}: no Xid ({self.source})"
        return "; ".join(event.describe() for event in self.events)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "events": [event.to_dict() for event in self.events],
                "unwatched": self.unwatched, "errors": list(self.errors),
                "duration_s": round(self.stopped_at - self.started_at, 3)}


class _NvmlEvents:
    """Xid events of the watched GPUs through one NVML event set, read by a thread until closed."""

    def __init__(self, nvml: Any, gpus: Sequence[int] | None, wait_ms: int) -> None:
        self.nvml = nvml
        self.wait_ms = wait_ms
        nvml.nvmlInit()
        try:
            indices = list(gpus) if gpus is not None else list(range(int(nvml.nvmlDeviceGetCount())))
            self.event_set = nvml.nvmlEventSetCreate()
            self.registered: list[int] = []
            self.unsupported: list[str] = []
            for index in indices:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & NVML_XID_EVENT:
                    self.unsupported.append(f"GPU {index} does not report Xid events (supported 0x{supported:x})")
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, NVML_XID_EVENT, self.event_set)
                self.registered.append(index)
        except BaseException:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            raise

    def wait_one(self) -> XidEvent | None:
        """Block up to ``wait_ms`` for an event; None when the wait timed out."""
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self.event_set, self.wait_ms)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == NVML_ERROR_TIMEOUT:
                return None
            raise
        if not int(data.eventType) & NVML_XID_EVENT:
            return None
        gpu: int | None
        try:
            gpu = int(nvml.nvmlDeviceGetIndex(data.device))
        except Exception:  # a GPU that fell off the bus may not answer its index any more
            gpu = None
        detail = (f"nvmlEventTypeXidCriticalError eventData={int(data.eventData)} "
                  f"gpuInstanceId=0x{int(data.gpuInstanceId):x} computeInstanceId=0x{int(data.computeInstanceId):x}")
        return XidEvent(xid=int(data.eventData), source="NVML", gpu=gpu, detail=detail)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlEventSetFree(self.event_set)
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def _kernel_xid_lines(host: Host, timeout: float) -> tuple[tuple[str, ...], str | None]:
    """The kernel log's Xid lines now, or why they cannot be read."""
    result = host.run(XID_SCRIPT, timeout=timeout)
    log = parse_xid_log(result.stdout)
    return log.lines, log.unreadable


@dataclass
class XidWatcher:
    """Watch for Xids on ``host`` (its GPUs ``gpus``, default all) from :meth:`start` to :meth:`stop`.

    ``nvml`` replaces the ``pynvml`` module (tests: the labelled fake NVML); ``use_nvml`` forces
    a source (default: NVML on this machine, else the kernel log). ``buses`` maps PCI addresses to
    GPU indexes, so kernel-log Xids of GPUs outside ``gpus`` are left out and the rest named by index.
    """

    host: Host
    gpus: Sequence[int] | None = None
    nvml: Any = None
    use_nvml: bool | None = None
    buses: Mapping[str, int] | None = None
    wait_ms: int = DEFAULT_WAIT_MS
    timeout_s: float = 30.0
    _events: list[XidEvent] = field(default_factory=list, init=False, repr=False)
    _errors: list[str] = field(default_factory=list, init=False, repr=False)
    _source: str | None = field(default=None, init=False, repr=False)
    _unwatched: str | None = field(default=None, init=False, repr=False)
    _nvml_events: _NvmlEvents | None = field(default=None, init=False, repr=False)
    _baseline: tuple[str, ...] | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _started_at: float = field(default=0.0, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)
    record: XidRecord | None = field(default=None, init=False)

    def start(self) -> XidWatcher:
        if self._started:
            raise RuntimeError("XidWatcher already started")
        self._started = True
        self._started_at = time.time()
        nvml_wanted = self.use_nvml if self.use_nvml is not None else (self.host.is_local or self.nvml is not None)
        nvml_note = ""
        if nvml_wanted:
            try:
                self._start_nvml()
                return self
            except Exception as exc:  # no NVML here (no driver, no GPU): the kernel log may still say
                nvml_note = f"NVML events unavailable ({type(exc).__name__}: {exc}); "
        self._start_kernel_log(nvml_note)
        return self

    def _start_nvml(self) -> None:
        nvml = self.nvml
        if nvml is None:
            nvml = load_nvml()
        events = _NvmlEvents(nvml, self.gpus, self.wait_ms)
        if not events.registered:
            events.close()
            raise GpuReadyError("; ".join(events.unsupported) or "no GPU to watch")
        self._nvml_events = events
        self._source = "NVML events"
        self._errors.extend(events.unsupported)
        self._thread = threading.Thread(target=self._nvml_loop, name="gpuready-xid-watch", daemon=True)
        self._thread.start()

    def _nvml_loop(self) -> None:
        events = self._nvml_events
        assert events is not None
        while not self._stop.is_set():
            try:
                event = events.wait_one()
            except Exception as exc:  # an NVML error: kept, and the watch goes on (paced by the stop event)
                with self._lock:
                    if len(self._errors) < 20:
                        self._errors.append(f"nvmlEventSetWait_v2: {type(exc).__name__}: {exc}")
                self._stop.wait(self.wait_ms / 1000.0)
                continue
            if event is not None and (self.gpus is None or event.gpu is None or event.gpu in self.gpus):
                with self._lock:
                    self._events.append(event)

    def _drain(self, events: _NvmlEvents) -> None:
        """Collect the events already queued when the watch stopped (an Xid just before the end counts)."""
        events.wait_ms = 0
        for _ in range(100):
            try:
                event = events.wait_one()
            except Exception:
                return
            if event is None:
                return
            self._events.append(event)

    def _start_kernel_log(self, note: str) -> None:
        try:
            lines, unreadable = _kernel_xid_lines(self.host, self.timeout_s)
        except (GpuReadyError, OSError) as exc:
            self._unwatched = f"{note}the kernel log could not be read ({exc})"
            return
        if unreadable is not None:
            self._unwatched = f"{note}{unreadable}"
            return
        self._baseline = lines
        self._source = "kernel log"

    def _kernel_log_events(self) -> None:
        assert self._baseline is not None
        try:
            lines, unreadable = _kernel_xid_lines(self.host, self.timeout_s)
        except (GpuReadyError, OSError) as exc:
            self._errors.append(f"the kernel log could not be read at the end ({exc})")
            return
        if unreadable is not None:
            self._errors.append(f"the kernel log could not be read at the end: {unreadable}")
            return
        new = Counter(lines) - Counter(self._baseline)
        by_bus = {bus_key(bus): index for bus, index in (self.buses or {}).items()}
        for line in lines:
            if new[line] <= 0:
                continue
            new[line] -= 1
            codes = xid_codes(line)
            if codes is None:
                continue
            pci, xid = codes
            gpu = by_bus.get(bus_key(pci))
            if gpu is not None and self.gpus is not None and gpu not in self.gpus:
                continue
            self._events.append(XidEvent(xid=xid, source="kernel log", gpu=gpu, pci=pci, detail=line))

    def stop(self) -> XidRecord:
        """Stop watching and return what was seen (idempotent)."""
        if self.record is not None:
            return self.record
        if not self._started:
            raise RuntimeError("XidWatcher was not started")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.wait_ms / 1000.0 + 5.0)
            if self._thread.is_alive():
                self._errors.append("the NVML event wait did not return; the event set was left open")
            elif self._nvml_events is not None:
                self._drain(self._nvml_events)
                self._nvml_events.close()
        elif self._baseline is not None:
            self._kernel_log_events()
        with self._lock:
            self.record = XidRecord(
                host=self.host.name, source=self._source, events=tuple(self._events), unwatched=self._unwatched,
                errors=tuple(self._errors), gpus=tuple(self.gpus) if self.gpus is not None else None,
                started_at=self._started_at, stopped_at=time.time(),
            )
        return self.record

    def __enter__(self) -> XidWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["NVML_XID_EVENT", "XidEvent", "XidRecord", "XidWatcher", "bus_key"]
