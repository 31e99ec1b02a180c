"""Reading GPUs and their compute processes: nvidia-smi CSV (any host) and NVML (this machine).

nvidia-smi's CSV is parsed strictly: a field that reads ``[N/A]`` where a number is needed, a
row with the wrong number of columns, or a driver error message is a :class:`ProbeError`
naming the GPU and field, because a guess here would turn into a false green. NVML is read
with memory info v2, so driver-reserved memory is not counted as used (an idle H200 reads
615 MiB used through v1 and 0 MiB through v2).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.snapshot import GpuInfo, GpuProcess

QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index", "uuid", "name", "pci.bus_id", "memory.used", "memory.total",
    "memory.reserved", "power.draw", "compute_cap", "driver_version",
)
"""Fields asked of ``nvidia-smi --query-gpu`` on current drivers."""

QUERY_GPU_FIELDS_LEGACY: tuple[str, ...] = (
    "index", "uuid", "name", "pci.bus_id", "memory.used", "memory.total", "power.draw", "driver_version",
)
"""Fallback for drivers that know neither ``memory.reserved`` nor ``compute_cap``."""

QUERY_APPS_FIELDS: tuple[str, ...] = ("pid", "process_name", "used_memory", "gpu_uuid")

_REQUIRED_GPU_FIELDS = ("index", "memory.used", "memory.total")
_UNAVAILABLE = re.compile(r"^\[(N/A|Not Supported|Unknown Error|Insufficient Permissions|GPU is lost)\]$|^N/A$")
_UNIT_SUFFIX = re.compile(r"\s*(MiB|W|%|MHz)$")

def _value(cell: str, has_unit: bool = False) -> str | None:
    """The cell (without its unit, for a field that has one), or None where nvidia-smi says it has
    no value. Free text keeps everything: a GPU named ``... 300 W`` stays so."""
    cell = cell.strip()
    if _UNAVAILABLE.match(cell):
        return None
    return _UNIT_SUFFIX.sub("", cell) if has_unit else cell


def explain_nvidia_smi_failure(output: str, returncode: int) -> str:
    """A one-line cause for a failed nvidia-smi call."""
    text = " ".join(output.split())
    lowered = text.lower()
    if returncode == 127 or "command not found" in lowered or ("not found" in lowered and "nvidia-smi" in lowered):
        return "nvidia-smi is not installed or not on PATH"
    return f"nvidia-smi failed (exit {returncode}): {text[:300] or 'no output'}"


FREE_TEXT_FIELDS = frozenset({"name", "process_name"})
"""Fields whose values are free text and may hold the separator (a process named ``a, b``)."""

_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_UUID = re.compile(r"^(GPU|MIG)-\S+$")
FIELD_SHAPES: dict[str, tuple[re.Pattern[str], str]] = {
    **{name: (_NUMBER, "a number") for name in (
        "index", "pid", "memory.used", "memory.total", "memory.reserved", "power.draw", "used_memory")},
    "compute_cap": (re.compile(r"^\d+\.\d+$"), "a compute capability like 9.0"),
    "uuid": (_UUID, "a GPU uuid like GPU-f2fae499-..."),
    "gpu_uuid": (_UUID, "a GPU uuid like GPU-f2fae499-..."),
    "pci.bus_id": (re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$"),
                   "a PCI bus id like 00000000:18:00.0"),
    "driver_version": (re.compile(r"^\d+(\.\d+)*$"), "a driver version like 580.159.04"),
}
"""The shape each fixed field's value has in every row (besides ``[N/A]``-style placeholders): a
value of another shape means the row does not fit the fields asked, so it is an error, not a guess."""
_UNIT_FIELDS = frozenset({"memory.used", "memory.total", "memory.reserved", "power.draw", "used_memory"})
"""Fields that carry a unit (``MiB``, ``W``) without ``nounits``; only these lose a unit suffix."""


def split_csv_rows(text: str, fields: Sequence[str], what: str) -> list[dict[str, str | None]]:
    """Split ``--format=csv,noheader[,nounits]`` output into dicts keyed by the fields asked for.

    nvidia-smi separates cells with ``", "`` and quotes nothing, so a free-text cell (a GPU or
    process name) may hold the separator. The fixed cells are anchored from both ends: those
    before the free-text field are read from the left, those after it from the right, and the
    free text is what lies between. A row that still does not fit (too few cells, or too many
    with no free-text field to absorb them, or a number field that is not a number) is a
    :class:`ProbeError` naming the line and the expected and actual cell counts: never a number
    read from the wrong column.
    """
    free = [i for i, name in enumerate(fields) if name in FREE_TEXT_FIELDS]
    if len(free) > 1:
        raise ValueError(f"at most one free-text field per query, got {', '.join(fields[i] for i in free)}")
    rows: list[dict[str, str | None]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split(", ")
        if len(cells) > len(fields) and free:
            at = free[0]
            tail = len(fields) - at - 1
            cells = [*cells[:at], ", ".join(cells[at:len(cells) - tail]), *cells[len(cells) - tail:]]
        if len(cells) != len(fields):
            raise ProbeError(
                f"{what}: line {number} has {len(cells)} fields, expected {len(fields)} "
                f"({','.join(fields)}): {line.strip()[:120]!r}"
            )
        row = {field: _value(cell, field in _UNIT_FIELDS) for field, cell in zip(fields, cells, strict=True)}
        for field in fields:
            value = row[field]
            shape = FIELD_SHAPES.get(field)
            if shape is not None and value is not None and not shape[0].match(value):
                raise ProbeError(
                    f"{what}: line {number}: {field} is {value[:40]!r}, expected {shape[1]}; the row does not "
                    f"fit the {len(fields)} fields asked ({','.join(fields)}): {line.strip()[:120]!r}"
                )
        rows.append(row)
    return rows


def _int(row: dict[str, str | None], field: str, what: str) -> int:
    raw = row.get(field)
    if raw is None:
        raise ProbeError(f"{what}: {field} reads [N/A]; it cannot be judged")
    try:
        return int(float(raw))
    except ValueError:
        raise ProbeError(f"{what}: {field} is {raw!r}, expected a number") from None


def _optional_float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def _compute_capability(raw: str | None) -> tuple[int, int] | None:
    if raw is None:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", raw)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_query_gpu(text: str, fields: Sequence[str] = QUERY_GPU_FIELDS, host: str = "host") -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader[,nounits]``."""
    missing = [f for f in _REQUIRED_GPU_FIELDS if f not in fields]
    if missing:
        raise ValueError(f"--query-gpu fields must include {', '.join(missing)}")
    gpus: list[GpuInfo] = []
    for row in split_csv_rows(text, fields, f"{host}: nvidia-smi --query-gpu"):
        index = _int(row, "index", f"{host}: nvidia-smi --query-gpu")
        what = f"{host}: GPU {index}"
        reserved = row.get("memory.reserved")
        gpus.append(GpuInfo(
            index=index,
            uuid=row.get("uuid") or f"GPU-index-{index}",
            name=row.get("name") or "unknown",
            pci_bus_id=row.get("pci.bus_id") or "unknown",
            memory_used_mib=_int(row, "memory.used", what),
            memory_total_mib=_int(row, "memory.total", what),
            memory_reserved_mib=int(float(reserved)) if reserved is not None else None,
            power_draw_w=_optional_float(row.get("power.draw")),
            compute_capability=_compute_capability(row.get("compute_cap")),
            driver_version=row.get("driver_version"),
        ))
    if not gpus:
        raise ProbeError(f"{host}: nvidia-smi listed no GPUs")
    return gpus


def parse_query_compute_apps(
    text: str, gpus: Sequence[GpuInfo], fields: Sequence[str] = QUERY_APPS_FIELDS, host: str = "host"
) -> list[GpuProcess]:
    """Parse ``nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid``; join GPUs by uuid."""
    index_by_uuid = {gpu.uuid: gpu.index for gpu in gpus}
    processes: list[GpuProcess] = []
    for row in split_csv_rows(text, fields, f"{host}: nvidia-smi --query-compute-apps"):
        uuid = row.get("gpu_uuid") or ""
        used = row.get("used_memory")
        processes.append(GpuProcess(
            pid=_int(row, "pid", f"{host}: compute process"),
            name=row.get("process_name") or "unknown",
            used_memory_mib=int(float(used)) if used is not None else None,
            gpu_uuid=uuid,
            gpu_index=index_by_uuid.get(uuid),
        ))
    return processes


@dataclass(frozen=True)
class NvmlReading:
    """GPUs and compute processes read through NVML on this machine."""

    gpus: tuple[GpuInfo, ...]
    processes: tuple[GpuProcess, ...]


class NvmlUnavailable(Exception):
    """NVML could not be loaded or initialised here; the caller falls back to nvidia-smi."""


def nvml() -> Any:
    """The NVML bindings (nvidia-ml-py's ``pynvml``): imported here only, for every reader of NVML.

    Raises :class:`NvmlUnavailable` when nvidia-ml-py is not installed.
    """
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
    return pynvml


def _mib(value: int | None) -> int | None:
    return None if value is None else int(value) // (1024 * 1024)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> NvmlReading:
    """Read every GPU and its compute processes through NVML (nvidia-ml-py).

    Raises :class:`NvmlUnavailable` when the library or driver cannot be initialised, so the
    probe can try nvidia-smi, which gives the driver's own error text.
    """
    pynvml = nvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not be initialised: {exc}") from exc
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus: list[GpuInfo] = []
        processes: list[GpuProcess] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            reserved: int | None
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                reserved = _mib(memory.reserved)
            except (pynvml.NVMLError, TypeError, AttributeError):
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                reserved = None
            try:
                power: float | None = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except pynvml.NVMLError:
                power = None
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability: tuple[int, int] | None = (int(major), int(minor))
            except pynvml.NVMLError:
                capability = None
            gpus.append(GpuInfo(
                index=index,
                uuid=uuid,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                memory_used_mib=_mib(memory.used) or 0,
                memory_total_mib=_mib(memory.total) or 0,
                memory_reserved_mib=reserved,
                power_draw_w=power,
                compute_capability=capability,
                driver_version=driver,
            ))
            for info in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                processes.append(GpuProcess(
                    pid=int(info.pid),
                    name=_process_name(pynvml, int(info.pid)),
                    used_memory_mib=_mib(info.usedGpuMemory),
                    gpu_uuid=uuid,
                    gpu_index=index,
                    alive=os.path.exists(f"/proc/{int(info.pid)}"),
                    cmdline=_cmdline(int(info.pid)),
                ))
        return NvmlReading(tuple(gpus), tuple(processes))
    except pynvml.NVMLError as exc:
        raise ProbeError(f"local: NVML read failed: {exc}") from exc
    finally:
        pynvml.nvmlShutdown()


def _process_name(pynvml: object, pid: int) -> str:
    try:
        return _text(pynvml.nvmlSystemGetProcessName(pid))  # type: ignore[attr-defined]
    except Exception:
        comm = _read_proc(pid, "comm")
        return comm.strip() if comm else "unknown"


def _read_proc(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def _cmdline(pid: int) -> str | None:
    raw = _read_proc(pid, "cmdline")
    return raw.replace("\0", " ").strip() if raw else None
