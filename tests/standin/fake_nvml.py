"""STAND-IN for nvidia-ml-py's ``pynvml``, for tests only: CI has no NVIDIA GPU.

It answers the health calls with what the real H200 answered (``tests/data/nvidia-smi/h200-health/
nvml-health.txt``, nvidia-ml-py 13.610.43, driver 580.159.04): a value, or the real pynvml
exception class for ``NotSupported``. A test changes one answer (``FakeNvml(overrides={...})``)
to build an unhealthy GPU; ``lost=True`` makes the handle call raise ``GPU is lost`` as the
driver does. The exceptions are the real ones from the installed pynvml, so the code under test
catches exactly what it would on a GPU.

Xid events: ``raise_xid(gpu, xid)`` queues the event a real driver delivers, in pynvml's own
``c_nvmlEventData_t``: ``eventType`` ``nvmlEventTypeXidCriticalError`` (0x8), ``eventData`` the Xid,
``gpuInstanceId`` / ``computeInstanceId`` 0xFFFFFFFF (not attributable to a MIG instance, as
nvml.h's ``nvmlEventData_t`` documents for a GPU without MIG), ``device`` the GPU's handle. It is
delivered only to an event set that registered that GPU, as NVML does; ``nvmlEventSetWait_v2``
blocks up to its timeout and then raises the real ``NVMLError_Timeout``. The supported-event mask
is the H200's (``0xff9f``, measured, gpu-health-anchors.md section d).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping
from typing import Any

import pynvml

NOT_SUPPORTED = object()
"""An answer that raises NVMLError_NotSupported."""

H200_ANSWERS: dict[str, Any] = {
    # from nvml-health.txt (measured on the H200); the rest from section (d.1) of gpu-health-anchors.md
    "nvmlSystemGetCudaDriverVersion_v2": 13000,
    "nvmlDeviceGetPersistenceMode": 1,
    "nvmlDeviceGetComputeMode": 0,
    "nvmlDeviceGetMigMode": [0, 0],
    "nvmlDeviceGetEccMode": [1, 1],
    "nvmlDeviceGetTotalEccErrors": 0,
    "nvmlDeviceGetRetiredPages": NOT_SUPPORTED,
    "nvmlDeviceGetRetiredPagesPendingStatus": NOT_SUPPORTED,
    "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlDeviceGetCurrPcieLinkGeneration": 5,
    "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 16,
    "nvmlDeviceGetMaxPcieLinkWidth": 16,
    "fabric_state": pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,  # nvidia-smi fabric.state N/A on this VM
    "recovery_action": pynvml.NVML_GPU_RECOVERY_ACTION_NONE,      # nvidia-smi gpu_recovery_action None
    "p2p": pynvml.NVML_P2P_STATUS_OK,
    "nvmlDeviceGetSupportedEventTypes": 0xFF9F,  # measured on the H200 (root and uid 65534)
}

_DEVICE_BASE = 0x1000
"""Fake handles inside event data are pointers to this address + the GPU index (never dereferenced)."""


class FakeNvml:
    """A module-like object with the pynvml calls the health reader makes (labelled stand-in)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    NVML_P2P_CAPS_INDEX_READ = pynvml.NVML_P2P_CAPS_INDEX_READ
    NVML_P2P_CAPS_INDEX_WRITE = pynvml.NVML_P2P_CAPS_INDEX_WRITE
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    byref = staticmethod(ctypes.byref)

    def __init__(self, gpus: int = 1, overrides: Mapping[str, Any] | None = None, lost: bool = False) -> None:
        self.count = gpus
        self.answers = {**H200_ANSWERS, **(overrides or {})}
        self.lost = lost
        self.inits = 0
        self.shutdowns = 0
        self._registered: dict[int, set[int]] = {}
        self._pending: dict[int, list[Any]] = {}
        self._freed: set[int] = set()
        self._events = threading.Condition()

    def _answer(self, name: str) -> Any:
        value = self.answers[name]
        if value is NOT_SUPPORTED:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvmlDeviceGet") and name in self.answers:
            return lambda handle, *args: self._answer(name)
        raise AttributeError(name)

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return int(self._answer("nvmlSystemGetCudaDriverVersion_v2"))

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, info: Any) -> int:
        target = info._obj if hasattr(info, "_obj") else info
        target.state = self.answers["fabric_state"]
        target.status = 0
        return 0

    def nvmlDeviceGetFieldValues(self, handle: int, fields: list[int]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(fields))()
        values[0].nvmlReturn = 0
        values[0].value.uiVal = self.answers["recovery_action"]
        return values

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        return int(self.answers["p2p"])

    # ---------------------------------------------------------------- init and Xid events

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetIndex(self, device: Any) -> int:
        if isinstance(device, int):
            return device
        address = ctypes.cast(device, ctypes.c_void_p).value or 0
        return address - _DEVICE_BASE

    def nvmlEventSetCreate(self) -> int:
        with self._events:
            event_set = len(self._registered) + 1
            self._registered[event_set] = set()
            self._pending[event_set] = []
            return event_set

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: int) -> None:
        if not int(types) & self.answers["nvmlDeviceGetSupportedEventTypes"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._events:
            self._registered[event_set].add(int(handle))

    def nvmlEventSetFree(self, event_set: int) -> None:
        with self._events:
            self._freed.add(event_set)

    @property
    def open_event_sets(self) -> int:
        return len(set(self._registered) - self._freed)

    def raise_xid(self, gpu: int, xid: int) -> None:
        """The driver raised Xid ``xid`` on GPU ``gpu``: every event set that registered it gets the event."""
        data = pynvml.c_nvmlEventData_t()
        data.device = ctypes.cast(ctypes.c_void_p(_DEVICE_BASE + gpu), pynvml.c_nvmlDevice_t)
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = 0xFFFFFFFF
        data.computeInstanceId = 0xFFFFFFFF
        with self._events:
            for event_set, gpus in self._registered.items():
                if gpu in gpus and event_set not in self._freed:
                    self._pending[event_set].append(data)
            self._events.notify_all()

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> Any:
        with self._events:
            if not self._pending[event_set]:
                self._events.wait(timeout_ms / 1000.0)
            if not self._pending[event_set]:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return self._pending[event_set].pop(0)
