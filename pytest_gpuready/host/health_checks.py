"""GPU health checks: what DCGM level 1, GCM, GPUd and Azure NHC agree on, and the vLLM startup
failures nobody checked for (driver too old for the wheel, /dev/shm too small, no GPU visible,
MIG, fabric manager down, P2P broken under TP).

Pure functions of a :class:`HostSnapshot` (its ``health``): data in, :class:`Verdict` out. The
thresholds are those of ``gpu-health-anchors.md`` (DCGM, GCM, Azure NHC), each named beside its
constant. Every message names the host, the GPU index, the field and its value. A field the GPU
does not support is "not supported on this GPU" in the evidence (never an error, never a silent
pass: the evidence says what was not judged); a part that could not be read raises ProbeError,
so the check errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.clock_events import THROTTLING_MASK, reason_names, throttling_reasons
from pytest_gpuready.host.health import NOT_SUPPORTED, GpuHealth, HostHealth
from pytest_gpuready.host.health_readers import xid_codes
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.host.xid_catalog import xid_action
from pytest_gpuready.verdict import Verdict

MIB = 1024 * 1024
GIB = 1024 * MIB

UNCORRECTABLE_REMAP_LIMIT = 512
"""DCGM: uncorrectable row remaps at or above this many mean the GPU is out of spare rows (RMA)."""
RETIRED_PAGES_LIMIT = 63
"""DCGM: 63 or more retired pages (pre-Ampere) -> the GPU is due for replacement."""
CORRECTED_VOLATILE_WARN = 50_000_000
"""GCM: more corrected (single-bit) volatile ECC errors than this since the driver loaded: warn."""
SHM_MIN_SIZE_BYTES = GIB
"""vLLM with TP x PP > 1 needs /dev/shm for NCCL and its shared-memory broadcast; Docker's default is 64 MB."""
MIN_DRIVER_FOR_CUDA = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
"""The minimum Linux driver of each CUDA major (CUDA toolkit release notes, table 3)."""
AZURE_CRITICAL_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120})
"""Azure NHC fails a node on these Xids (``gpu-health-anchors.md`` table e, rank 13)."""
_DATACENTER = re.compile(r"\b(A100|A30|A40|A10G?|A16|A2|A800|H100|H200|H800|H20|GH200|B100|B200|GB200|B300|"
                         r"L4|L40S?|L20|T4|V100|P100|P40|Tesla)\b|Data Center", re.IGNORECASE)
"""GPUs on which a forward-compatibility libcuda works (NVIDIA: data-center GPUs only)."""

Check = Callable[..., Verdict]


def _health(snapshot: HostSnapshot) -> HostHealth:
    return snapshot.require_health()


def _gpus(snapshot: HostSnapshot, health: HostHealth, gpus: Sequence[int] | None) -> list[GpuHealth]:
    """The selected GPUs' readings; a part that was not read at all is an error."""
    if "fields" in health.errors and not any(g.lost for g in health.gpus):
        raise ProbeError(f"{snapshot.host}: GPU health fields could not be read: {health.errors['fields']}")
    if gpus is None:
        return list(health.gpus)
    chosen = []
    for index in gpus:
        gpu = health.gpu(index)
        if gpu is None:
            present = ", ".join(str(g.index) for g in health.gpus) or "none"
            raise ProbeError(f"{snapshot.host}: there is no GPU {index} (GPUs present: {present})")
        chosen.append(gpu)
    return chosen


def _where(snapshot: HostSnapshot, gpu: GpuHealth) -> str:
    return f"{snapshot.host} GPU {gpu.index}" if gpu.index >= 0 else f"{snapshot.host}: a GPU"


def _field_evidence(gpus: Sequence[GpuHealth], fields: Sequence[str]) -> dict[str, dict[str, str]]:
    return {str(g.index): ({name: g.shown(name) for name in fields} if g.lost is None else {"lost": g.lost})
            for g in gpus}


def _not_supported(gpus: Sequence[GpuHealth], fields: Sequence[str]) -> list[str]:
    """``GPU 0: retired_pages.pending not supported on this GPU`` for the evidence's notes."""
    notes = []
    for gpu in gpus:
        if gpu.lost is not None:
            continue
        for name in fields:
            value = gpu.get(name)
            if value is NOT_SUPPORTED:
                notes.append(f"GPU {gpu.index}: {name} {NOT_SUPPORTED}")
            elif value is None:
                notes.append(f"GPU {gpu.index}: {name} {gpu.shown(name)}")
    return notes


def _verdict(snapshot: HostSnapshot, what: str, failures: list[str], warnings: list[str],
             evidence: dict[str, Any], ok_summary: str) -> Verdict:
    evidence = {"host": snapshot.host, **evidence}
    if failures:
        return Verdict.failed(f"{what} on {snapshot.host}: {len(failures)} problem(s)", details=tuple(failures),
                              evidence=evidence, warnings=tuple(warnings))
    return Verdict.passed(ok_summary, evidence=evidence, warnings=tuple(warnings))


def _alive(gpus: Sequence[GpuHealth], snapshot: HostSnapshot | None = None) -> list[GpuHealth]:
    """The GPUs that answered; with ``snapshot``, a lost one is an error (its fields cannot be judged)."""
    lost = [g for g in gpus if g.lost is not None]
    if lost and snapshot is not None:
        raise ProbeError(f"{_where(snapshot, lost[0])} does not answer ({lost[0].lost}): its health fields "
                         "cannot be read")
    return [g for g in gpus if g.lost is None]


GpuRule = Callable[[GpuHealth, str, list[str], list[str]], None]
"""One check's rule for one GPU: ``rule(gpu, where, failures, warnings)`` appends what it finds."""


def _per_gpu(snapshot: HostSnapshot, gpus: Sequence[int] | None, what: str, fields: Sequence[str],
             rule: GpuRule, ok_summary: Callable[[list[GpuHealth]], str],
             evidence: dict[str, Any] | None = None) -> Verdict:
    """A check of each selected GPU's health fields: the part every such check shares.

    The selected GPUs must all answer (a lost one is an error: its fields cannot be judged);
    ``rule`` judges each; the evidence is every GPU's ``fields`` and what was not judged, then
    ``evidence``; ``ok_summary`` of the selected GPUs is the summary when nothing failed.
    """
    selected = _alive(_gpus(snapshot, _health(snapshot), gpus), snapshot)
    failures: list[str] = []
    warnings: list[str] = []
    for gpu in selected:
        rule(gpu, _where(snapshot, gpu), failures, warnings)
    return _verdict(snapshot, what, failures, warnings,
                    {"gpus": _field_evidence(selected, fields), "not_judged": _not_supported(selected, fields),
                     **(evidence or {})},
                    ok_summary(selected))


def _indexes(gpus: Sequence[GpuHealth]) -> str:
    return ",".join(str(g.index) for g in gpus)


# ---------------------------------------------------------------------------------- checks

def check_cuda_driver_compat(snapshot: HostSnapshot) -> Verdict:
    """The driver's CUDA is at least the build's (torch / vLLM wheels); no compat libcuda on a non-datacenter GPU."""
    health = _health(snapshot)
    build = health.build
    driver = health.driver_cuda
    names = sorted({g.name for g in snapshot.gpus or () if g.name})
    evidence: dict[str, Any] = {
        "driver_cuda": f"{driver[0]}.{driver[1]}" if driver else None,
        "build_cuda": (f"{build.cuda[0]}.{build.cuda[1]}" if build.cuda else None), "build_source": build.cuda_source,
        "torch": build.torch, "vllm": build.vllm, "cuda_runtime": [f"{n} {v}" for n, v in build.cuda_runtime],
        "compat_libcuda": list(build.compat_libcuda), "gpus": names,
    }
    failures: list[str] = []
    warnings: list[str] = []
    if driver is None:
        raise ProbeError(f"{snapshot.host}: the driver's CUDA version could not be read: "
                         f"{health.errors.get('cuda', 'unknown cause')}")
    drivers = sorted({g.driver_version for g in snapshot.gpus or () if g.driver_version})
    driver_text = f"driver {', '.join(drivers)} (CUDA {driver[0]}.{driver[1]})" if drivers else \
        f"the driver's CUDA {driver[0]}.{driver[1]}"
    if build.cuda is None:
        why = ("a CPU build (torch +cpu)" if build.is_cpu_build
               else "no torch, vLLM or CUDA runtime wheel with a CUDA tag")
        summary = f"{snapshot.host}: {driver_text}; build CUDA unknown: {why} found on python3's path"
        evidence["build_cuda"] = f"not found ({why})"
    else:
        need = build.cuda
        if driver[0] < need[0]:
            minimum = MIN_DRIVER_FOR_CUDA.get(need[0], f"the R{need[0]}x branch")
            failures.append(
                f"{snapshot.host}: {driver_text} is older than the build's CUDA {need[0]}.{need[1]} "
                f"({build.cuda_source}): vLLM would fail with 'The NVIDIA driver on your system is too old' / "
                f"'CUDA driver version is insufficient for CUDA runtime version'; what would work: a torch/vLLM "
                f"build for CUDA {driver[0]}.x (e.g. the cu{driver[0]}{min(driver[1], 9)} wheel) "
                f"or a driver >= {minimum}")
        elif driver == need or driver > need:
            pass
        else:
            warnings.append(
                f"{snapshot.host}: {driver_text} is older than the build's CUDA {need[0]}.{need[1]} "
                f"({build.cuda_source}) within one major: it runs by minor-version compatibility, but kernels "
                f"needing a newer PTX JIT fail; a driver of CUDA {need[0]}.{need[1]} or newer avoids it")
        summary = (f"{snapshot.host}: {driver_text} runs the build's CUDA {need[0]}.{need[1]} "
                   f"({build.cuda_source})")
    if build.compat_libcuda:
        consumer = [n for n in names if not _DATACENTER.search(n)]
        if consumer:
            failures.append(
                f"{snapshot.host}: a forward-compatibility libcuda is on the library path "
                f"({', '.join(build.compat_libcuda)}) with {', '.join(consumer)}, which is not a data-center GPU: "
                "CUDA would fail with Error 804 (forward compatibility was attempted on non supported HW); "
                "remove the compat directory from LD_LIBRARY_PATH / ld.so.conf, or upgrade the driver")
        else:
            warnings.append(f"{snapshot.host}: a forward-compatibility libcuda is on the library path "
                            f"({', '.join(build.compat_libcuda)}): CUDA uses it instead of the driver's")
    return _verdict(snapshot, "CUDA driver vs build", failures, warnings, evidence, summary)


def _recovery(action: str) -> str:
    lowered = action.lower()
    if "reboot" in lowered:
        return "reboot the node"
    if "drain" in lowered:
        return "drain the GPU's work, then reset it (nvidia-smi -r)"
    if "reset" in lowered:
        return "reset the GPU (nvidia-smi -r) or reboot"
    return "follow the driver's recovery action"


def check_gpu_alive(snapshot: HostSnapshot, gpus: Sequence[int] | None = None) -> Verdict:
    """Every GPU answers (not ``GPU is lost`` / ``reset required``) and asks for no recovery action."""
    health = _health(snapshot)
    selected = _gpus(snapshot, health, gpus)
    failures: list[str] = []
    for gpu in selected:
        if gpu.lost is not None:
            fix = "reboot to recover it" if "lost" in gpu.lost.lower() else "reset it (nvidia-smi -r) or reboot"
            failures.append(f"{_where(snapshot, gpu)} does not answer: {gpu.lost}; {fix}")
            continue
        action = gpu.get("gpu_recovery_action")
        if isinstance(action, str) and action.lower() != "none":
            failures.append(f"{_where(snapshot, gpu)}: gpu_recovery_action = {action}: {_recovery(action)}")
    evidence = {"gpus": _field_evidence(selected, ("gpu_recovery_action",)),
                "not_judged": _not_supported(_alive(selected), ("gpu_recovery_action",))}
    return _verdict(snapshot, "GPUs alive", failures, [], evidence,
                    f"GPU {_indexes(selected)} on {snapshot.host} answer and ask for no recovery action")


def visible_gpu_count(health: HostHealth) -> tuple[int, str]:
    """How many GPUs a CUDA process started like the probe would see, and how that was derived."""
    count = health.device_count if health.device_count is not None else len(health.gpus)
    cuda = health.visible_devices.get("CUDA_VISIBLE_DEVICES")
    if cuda is None:
        how = f"{count} GPUs on the host"
        nvidia = health.visible_devices.get("NVIDIA_VISIBLE_DEVICES")
        if nvidia is not None:
            how += f" (NVIDIA_VISIBLE_DEVICES={nvidia!r})"
        return count, how
    visible = 0
    for entry in (e.strip() for e in cuda.split(",")):
        # CUDA stops at the first entry it cannot use
        if (entry.isdigit() and int(entry) < count) or entry.startswith(("GPU-", "MIG-")):
            visible += 1
        else:
            break
    return visible, f"CUDA_VISIBLE_DEVICES={cuda!r} of {count} GPUs on the host"


def check_gpus_visible(snapshot: HostSnapshot, tp: int = 1, pp: int = 1, dp: int = 1) -> Verdict:
    """At least TP x PP x DP GPUs are visible (after ``CUDA_VISIBLE_DEVICES``)."""
    health = _health(snapshot)
    need = tp * pp * dp
    visible, how = visible_gpu_count(health)
    evidence = {"visible": visible, "needed": need, "how": how, "tp": tp, "pp": pp, "dp": dp,
                "env": dict(health.visible_devices)}
    failures = []
    if visible == 0:
        failures.append(f"{snapshot.host}: no GPU visible ({how}): vLLM would fail with "
                        "'Failed to infer device type'; in a container pass --gpus all (or the NVIDIA runtime)")
    elif visible < need:
        failures.append(f"{snapshot.host}: {visible} GPUs visible ({how}), the layout needs TP x PP x DP = "
                        f"{tp} x {pp} x {dp} = {need}")
    return _verdict(snapshot, "GPUs visible", failures, [], evidence,
                    f"{snapshot.host}: {visible} GPUs visible ({how}), the layout needs {need}")


def check_shm_capacity(snapshot: HostSnapshot, tp: int = 1, pp: int = 1,
                       min_size_bytes: int = SHM_MIN_SIZE_BYTES) -> Verdict:
    """With TP x PP > 1, /dev/shm is at least ``min_size_bytes`` (1 GiB) in size."""
    shm = snapshot.require_shm()
    size_mib, free_mib = shm.total_bytes // MIB, shm.free_bytes // MIB
    evidence = {"size_mib": size_mib, "free_mib": free_mib, "min_size_mib": min_size_bytes // MIB, "tp": tp, "pp": pp}
    failures = []
    if tp * pp > 1 and shm.total_bytes < min_size_bytes:
        failures.append(f"{snapshot.host}: /dev/shm is {size_mib} MiB ({free_mib} MiB free), TP x PP = {tp * pp} "
                        f"needs at least {min_size_bytes // MIB} MiB for NCCL and vLLM's shared-memory broadcast: "
                        "run the container with --ipc=host or --shm-size=16g (vLLM PR #1125)")
    summary = (f"{snapshot.host}: /dev/shm is {size_mib} MiB ({free_mib} MiB free)"
               + ("" if tp * pp > 1 else "; TP x PP = 1 needs no shared memory between workers"))
    return _verdict(snapshot, "/dev/shm capacity", failures, [], evidence, summary)


MEMORY_FIELDS = (
    "ecc.mode.current", "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.uncorrectable",
    "remapped_rows.correctable", "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded", "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count", "retired_pages.pending",
)


def check_memory_health(snapshot: HostSnapshot, gpus: Sequence[int] | None = None) -> Verdict:
    """Row remaps, ECC, SRAM and retired pages against DCGM's and GCM's thresholds."""
    def rule(gpu: GpuHealth, where: str, failures: list[str], warnings: list[str]) -> None:
        value = gpu.get
        if value("remapped_rows.pending") is True:
            failures.append(f"{where}: remapped_rows.pending = Yes: a row remap waits for a GPU reset "
                            "(DCGM: reset required); reset it (nvidia-smi -r) before use")
        if value("remapped_rows.failure") is True:
            failures.append(f"{where}: remapped_rows.failure = Yes: a row remap failed, the GPU is out of "
                            "spare rows (DCGM: RMA)")
        unc = value("remapped_rows.uncorrectable")
        if isinstance(unc, int) and not isinstance(unc, bool) and unc >= UNCORRECTABLE_REMAP_LIMIT:
            failures.append(f"{where}: remapped_rows.uncorrectable = {unc} >= {UNCORRECTABLE_REMAP_LIMIT} (DCGM: RMA)")
        vol = value("ecc.errors.uncorrected.volatile.total")
        if isinstance(vol, int) and not isinstance(vol, bool) and vol > 0:
            failures.append(f"{where}: ecc.errors.uncorrected.volatile.total = {vol} > 0: uncorrectable memory "
                            "errors since the driver loaded (GCM, Google CHS: fail); reset the GPU and watch for "
                            "Xid 48/94/95")
        if value("ecc.errors.uncorrected.aggregate.sram.thresholdExceeded") is True:
            failures.append(f"{where}: ecc.errors.uncorrected.aggregate.sram.thresholdExceeded = Yes (DCGM: fail; "
                            "the GPU is due for service)")
        retired = [value(n) for n in ("retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count")]
        counts = [v for v in retired if isinstance(v, int) and not isinstance(v, bool)]
        if counts and sum(counts) >= RETIRED_PAGES_LIMIT:
            failures.append(f"{where}: retired pages = {sum(counts)} (single-bit + double-bit) >= "
                            f"{RETIRED_PAGES_LIMIT} (DCGM: RMA)")
        if value("retired_pages.pending") is True:
            failures.append(f"{where}: retired_pages.pending = Yes: a page retirement waits for a GPU reset")
        corrected = value("ecc.errors.corrected.volatile.total")
        if isinstance(corrected, int) and not isinstance(corrected, bool) and corrected > CORRECTED_VOLATILE_WARN:
            warnings.append(f"{where}: ecc.errors.corrected.volatile.total = {corrected} > "
                            f"{CORRECTED_VOLATILE_WARN} (GCM: warn)")
        if value("ecc.mode.current") == "Disabled" and _DATACENTER.search(_name(snapshot, gpu)):
            warnings.append(f"{where}: ecc.mode.current = Disabled on a data-center GPU: memory errors go unnoticed")

    return _per_gpu(snapshot, gpus, "GPU memory health", MEMORY_FIELDS, rule, lambda selected: (
        f"GPU {_indexes(selected)} on {snapshot.host}: no pending or failed remaps, no uncorrectable ECC errors"))


def _name(snapshot: HostSnapshot, gpu: GpuHealth) -> str:
    for info in snapshot.gpus or ():
        if info.index == gpu.index:
            return info.name
    return gpu.name or ""


def check_fabric(snapshot: HostSnapshot, gpus: Sequence[int] | None = None) -> Verdict:
    """On an NVSwitch machine, every GPU's fabric registration completed with success (else CUDA Error 802)."""
    def rule(gpu: GpuHealth, where: str, failures: list[str], warnings: list[str]) -> None:
        state, status = gpu.get("fabric.state"), gpu.get("fabric.status")
        if state is NOT_SUPPORTED or state is None:
            return
        if str(state).lower() != "completed":
            failures.append(f"{where}: fabric.state = {state}: the fabric manager has not "
                            "registered this GPU; CUDA would fail with Error 802 (system not yet initialized): "
                            "start nvidia-fabricmanager (systemctl start nvidia-fabricmanager)")
        elif status is not NOT_SUPPORTED and status is not None and str(status).lower() != "success":
            failures.append(f"{where}: fabric.status = {status} (fabric.state = {state}): "
                            "registration completed with an error; check nvidia-fabricmanager's log")

    def summary(selected: list[GpuHealth]) -> str:
        supported = [g for g in selected if g.get("fabric.state") not in (NOT_SUPPORTED, None)]
        return (f"{snapshot.host}: fabric registration completed on GPU {_indexes(supported)}"
                if supported else f"{snapshot.host}: fabric.state not supported on this GPU (no NVSwitch fabric)")

    return _per_gpu(snapshot, gpus, "GPU fabric", ("fabric.state", "fabric.status"), rule, summary)


MODE_FIELDS = ("mig.mode.current", "mig.mode.pending", "compute_mode", "persistence_mode")


def check_gpu_modes(snapshot: HostSnapshot, gpus: Sequence[int] | None = None, tp: int = 1) -> Verdict:
    """MIG off (fail with TP > 1, warn at TP = 1), compute mode Default, persistence on (warn)."""
    def rule(gpu: GpuHealth, where: str, failures: list[str], warnings: list[str]) -> None:
        mig, pending = gpu.get("mig.mode.current"), gpu.get("mig.mode.pending")
        if mig == "Enabled":
            text = (f"{where}: mig.mode.current = Enabled: vLLM does not support MIG directly "
                    "(vllm-project/vllm#17047)")
            if tp > 1:
                failures.append(f"{text}; TP = {tp} cannot span MIG instances: disable MIG (nvidia-smi -mig 0)")
            else:
                warnings.append(f"{text}; at TP = 1 it serves from one instance's share of the GPU")
        if isinstance(mig, str) and isinstance(pending, str) and mig != pending:
            warnings.append(f"{where}: mig.mode.pending = {pending} differs from mig.mode.current = {mig}: "
                            "the change applies at the next GPU reset")
        mode = gpu.get("compute_mode")
        if mode == "Prohibited":
            failures.append(f"{where}: compute_mode = Prohibited: no CUDA context can be created "
                            "(nvidia-smi -c DEFAULT)")
        elif mode == "Exclusive_Process":
            warnings.append(f"{where}: compute_mode = Exclusive_Process: a second CUDA context (another tenant, "
                            "a profiler) fails with 'busy or unavailable'")
        if gpu.get("persistence_mode") == "Disabled":
            warnings.append(f"{where}: persistence_mode = Disabled: each CUDA start re-initialises the GPU "
                            "(DCGM: warn); run nvidia-persistenced")

    return _per_gpu(snapshot, gpus, "GPU modes", MODE_FIELDS, rule, lambda selected: (
        f"GPU {_indexes(selected)} on {snapshot.host}: MIG, compute mode and persistence allow TP = {tp}"),
        evidence={"tp": tp})


LINK_FIELDS = ("clocks_event_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max",
               "pcie.link.width.current", "pcie.link.width.max")


def check_clocks_and_links(snapshot: HostSnapshot, gpus: Sequence[int] | None = None) -> Verdict:
    """Before load, no GPU slows itself (HW slowdown, thermal, power brake); PCIe links at their width.

    SW power cap is recorded, never judged. An idle GPU may lower its PCIe generation to save power
    (nvidia-smi's help says so), so the generation is only recorded here; a narrower link warns.
    """
    def rule(gpu: GpuHealth, where: str, failures: list[str], warnings: list[str]) -> None:
        mask = gpu.get("clocks_event_reasons.active")
        if isinstance(mask, int) and not isinstance(mask, bool) and mask & THROTTLING_MASK:
            failures.append(f"{where}: clocks_event_reasons.active = 0x{mask:016x} "
                            f"({', '.join(reason_names(mask))}): the GPU slows itself before any load "
                            f"({', '.join(throttling_reasons(mask))}); check cooling and power before measuring")
        width, width_max = gpu.get("pcie.link.width.current"), gpu.get("pcie.link.width.max")
        if isinstance(width, int) and isinstance(width_max, int) and width < width_max:
            warnings.append(f"{where}: pcie.link.width.current = x{width} < pcie.link.width.max = x{width_max}: "
                            "the slot or riser runs the link narrower than it can go")

    return _per_gpu(snapshot, gpus, "GPU clocks and links", LINK_FIELDS, rule, lambda selected: (
        f"GPU {_indexes(selected)} on {snapshot.host}: no clock slowdown before load, PCIe links at full width"))


def describe_xid(line: str) -> str:
    """``Xid 79 on PCI 0000:3b:00 (the GPU has fallen off the bus: reboot; ...)`` from a kernel log line."""
    codes = xid_codes(line)
    if codes is None:
        return line[:200]
    bus, xid = codes
    return f"Xid {xid} on PCI {bus} ({xid_action(xid)})"


def check_xid_history(snapshot: HostSnapshot) -> Verdict:
    """The kernel log's Xid lines (older than this run): warnings naming each Xid and NVIDIA's action."""
    health = _health(snapshot)
    xid = health.xid
    if xid.unreadable is not None:
        return Verdict.passed(f"{snapshot.host}: Xid history not checked: {xid.unreadable}",
                              evidence={"host": snapshot.host, "unreadable": xid.unreadable},
                              warnings=(f"{snapshot.host}: Xid history not checked: {xid.unreadable}",))
    warnings = tuple(f"{snapshot.host}: kernel log: {describe_xid(line)}"
                     + ("; Azure NHC fails a node on this Xid" if (xid_codes(line) or ("", 0))[1]
                        in AZURE_CRITICAL_XIDS else "") + f": {line[:160]}"
                     for line in xid.lines[-10:])
    return Verdict.passed(f"{snapshot.host}: {len(xid.lines)} Xid line(s) in the kernel log",
                          evidence={"host": snapshot.host, "lines": list(xid.lines)}, warnings=warnings)


def check_p2p(snapshot: HostSnapshot, gpus: Sequence[int] | None = None) -> Verdict:
    """P2P read/write between every pair of a TP group without NVLink; IOMMU and ACS that break it (warnings)."""
    health = _health(snapshot)
    indexes = [g.index for g in _gpus(snapshot, health, gpus)]
    p2p = health.p2p
    evidence: dict[str, Any] = {"gpus": indexes, "iommu": p2p.iommu,
                                "acs_redirect": list(p2p.acs_redirect) if p2p.acs_redirect is not None else None,
                                "acs_unreadable": p2p.acs_unreadable}
    if len(indexes) < 2:
        return Verdict.passed(f"{snapshot.host}: GPU {','.join(map(str, indexes))}: one GPU, no P2P pair to check",
                              evidence={"host": snapshot.host, **evidence})
    topology = snapshot.topology
    pairs = list(combinations(sorted(indexes), 2))
    pcie_pairs = [(a, b) for a, b in pairs if not (topology and (topology.link(a, b) or "").startswith("NV"))]
    warnings: list[str] = []
    status = {f"{a}-{b}": dict(p2p.pairs.get((a, b), {})) for a, b in pairs}
    evidence["pairs"] = status
    if pcie_pairs and not p2p.pairs:
        raise ProbeError(f"{snapshot.host}: P2P status could not be read: {p2p.error or 'no P2P matrix'}")
    for a, b in pcie_pairs:
        for kind in ("read", "write"):
            value = p2p.pairs.get((a, b), {}).get(kind)
            if value is not None and value != "OK":
                warnings.append(f"{snapshot.host} GPU {a}-GPU {b}: P2P {kind} = {value}: NCCL routes TP traffic "
                                "through host memory; if TP hangs at start-up, set NCCL_P2P_DISABLE=1")
    if pcie_pairs and p2p.iommu == "translated":
        warnings.append(f"{snapshot.host}: the IOMMU translates DMA (no iommu=pt on the kernel command line) and GPU "
                        f"{','.join(map(str, indexes))} talk over PCIe: TP may hang (vllm-project/vllm#9920, #33041); "
                        "boot with iommu=pt, or set NCCL_P2P_DISABLE=1")
    for bridge in p2p.acs_redirect or ():
        warnings.append(f"{snapshot.host}: ACS redirect on PCI bridge {bridge}: P2P between GPUs behind it goes "
                        "through the root complex and TP may hang; disable ACS (setpci) or set NCCL_P2P_DISABLE=1")
    summary = (f"{snapshot.host}: GPU {','.join(map(str, indexes))}: P2P "
               + ("all NVLink" if not pcie_pairs else f"read/write over PCIe checked for {len(pcie_pairs)} pair(s)"))
    return Verdict.passed(summary, evidence={"host": snapshot.host, **evidence}, warnings=tuple(warnings))


HEALTH_CHECKS: dict[str, Check] = {
    "cuda_driver_compat": check_cuda_driver_compat,
    "gpu_alive": check_gpu_alive,
    "gpus_visible": check_gpus_visible,
    "shm_capacity": check_shm_capacity,
    "memory_health": check_memory_health,
    "fabric": check_fabric,
    "gpu_modes": check_gpu_modes,
    "clocks_and_links": check_clocks_and_links,
    "xid_history": check_xid_history,
    "p2p": check_p2p,
}
"""Every finer check, by the name its verdict is recorded under (``gpuready.NAME``)."""


def run_health_check(name: str, snapshot: HostSnapshot, gpus: Sequence[int] | None = None,
                     tp: int = 1, pp: int = 1, dp: int = 1) -> Verdict:
    """One check of :data:`HEALTH_CHECKS` with the arguments it takes."""
    if name == "cuda_driver_compat" or name == "xid_history":
        return HEALTH_CHECKS[name](snapshot)
    if name == "gpus_visible":
        return check_gpus_visible(snapshot, tp=tp, pp=pp, dp=dp)
    if name == "shm_capacity":
        return check_shm_capacity(snapshot, tp=tp, pp=pp)
    if name == "gpu_modes":
        return check_gpu_modes(snapshot, gpus, tp=tp)
    return HEALTH_CHECKS[name](snapshot, gpus)


def check_gpu_health(snapshot: HostSnapshot, gpus: Sequence[int] | None = None,
                     tp: int = 1, pp: int = 1, dp: int = 1) -> Verdict:
    """Every check of :data:`HEALTH_CHECKS` at once: fails with each failing check's details.

    A check that cannot measure raises (the caller errors), as each finer check does.
    """
    verdicts = {name: run_health_check(name, snapshot, gpus, tp, pp, dp) for name in HEALTH_CHECKS}
    failed = [name for name, v in verdicts.items() if not v.ok]
    details = tuple(f"{name}: {line}" for name in failed for line in (verdicts[name].details or
                                                                     (verdicts[name].summary,)))
    warnings = tuple(w for v in verdicts.values() for w in v.warnings)
    evidence = {"host": snapshot.host, "tp": tp, "pp": pp, "dp": dp,
                "checks": {name: {"ok": v.ok, "summary": v.summary, "evidence": dict(v.evidence)}
                           for name, v in verdicts.items()}}
    if failed:
        return Verdict.failed(f"GPU health on {snapshot.host}: {len(failed)} of {len(verdicts)} checks failed "
                              f"({', '.join(failed)})", details=details, evidence=evidence, warnings=warnings)
    return Verdict.passed(f"GPU health on {snapshot.host}: {len(verdicts)} checks passed", evidence=evidence,
                          warnings=warnings)
