"""STAND-IN for nvidia-ml-py's ``pynvml``, for tests only: CI has no NVIDIA GPU.

It answers the health calls with what the real H200 answered (``tests/data/nvidia-smi/h200-health/
nvml-health.txt``, nvidia-ml-py 13.610.43, driver 580.159.04): a value, or the real pynvml
exception class for ``NotSupported``. A test changes one answer (``FakeNvml(overrides={...})``)
to build an unhealthy GPU; ``lost=True`` makes the handle call raise ``GPU is lost`` as the
driver does. The exceptions are the real ones from the installed pynvml, so the code under test
catches exactly what it would on a GPU.
"""

from __future__ import annotations

import ctypes
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
}


class FakeNvml:
    """A module-like object with the pynvml calls the health reader makes (labelled stand-in)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    NVML_P2P_CAPS_INDEX_READ = pynvml.NVML_P2P_CAPS_INDEX_READ
    NVML_P2P_CAPS_INDEX_WRITE = pynvml.NVML_P2P_CAPS_INDEX_WRITE
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    byref = staticmethod(ctypes.byref)

    def __init__(self, gpus: int = 1, overrides: Mapping[str, Any] | None = None, lost: bool = False) -> None:
        self.count = gpus
        self.answers = {**H200_ANSWERS, **(overrides or {})}
        self.lost = lost

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
