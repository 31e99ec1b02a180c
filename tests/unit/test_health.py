"""GPU health: the H200's real answers are healthy; each unhealthy path is those answers with one field changed.

The nvidia-smi path parses a health row built from ``all-fields-idle.tsv`` (every field as the
H200 answered it); the NVML path reads the labelled fake NVML (tests/standin/fake_nvml.py), which
answers with the H200's NVML values.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_gpuready.errors import NoGpuError, ProbeError
from pytest_gpuready.host.health import HEALTH_FIELDS, NOT_SUPPORTED, BuildInfo, HostHealth, XidLog, cuda_tag
from pytest_gpuready.host.health_checks import (
    check_cuda_driver_compat,
    check_fabric,
    check_gpu_alive,
    check_gpu_health,
    check_gpu_modes,
    check_gpus_visible,
    check_memory_health,
    check_p2p,
    check_shm_capacity,
    check_xid_history,
)
from pytest_gpuready.host.health_readers import (
    BUILD_SCRIPT,
    parse_build,
    parse_cuda_version,
    parse_health_query,
    parse_iommu,
    parse_p2p_matrix,
    parse_xid_log,
    read_health_nvml,
)
from pytest_gpuready.host.snapshot import GpuInfo, HostSnapshot, ShmStatus
from tests.conftest import DATA, captured
from tests.standin.fake_nvml import NOT_SUPPORTED as FAKE_NOT_SUPPORTED
from tests.standin.fake_nvml import FakeNvml

HEALTH = DATA / "nvidia-smi" / "h200-health"


def idle_fields() -> dict[str, str]:
    lines = (HEALTH / "all-fields-idle.tsv").read_text().splitlines()
    return {key: value for key, _, value in (line.partition("\t") for line in lines)}


def health_row(changes: Mapping[str, str] | None = None) -> str:
    """The health section as nvidia-smi prints it for the H200, with ``{field: value}`` changes."""
    fields = idle_fields()
    fields.update(changes or {})
    return f"@@fields {','.join(HEALTH_FIELDS)}\n" + ", ".join(fields[f] for f in HEALTH_FIELDS) + "\n"


def h200(section: str | None = None, *, driver_cuda: tuple[int, int] | None = (13, 0),
         build: BuildInfo | None = None, shm_mib: int = 24105, name: str = "NVIDIA H200",
         changes: Mapping[str, str] | None = None) -> HostSnapshot:
    gpus = parse_health_query(section or health_row(changes), "gpu-box")
    health = HostHealth(reader="nvidia-smi", gpus=gpus, device_count=len(gpus), driver_cuda=driver_cuda,
                        build=build or BuildInfo(torch="2.11.0", cuda_runtime=(("nvidia-cuda-runtime", "13.0.96"),)))
    info = GpuInfo(0, "GPU-10510b6f", name, "00000000:00:06.0", 0, 143771, 616, 79.6, (9, 0), "580.159.04")
    shm = ShmStatus((), shm_mib * 1024 * 1024, shm_mib * 1024 * 1024, True)
    return HostSnapshot("gpu-box", 0.0, "nvidia-smi", (info,), shm=shm, health=health)


def test_the_h200_as_captured_is_healthy() -> None:
    verdict = check_gpu_health(h200())
    assert verdict.ok, verdict.message
    assert verdict.summary == "GPU health on gpu-box: 10 checks passed"
    memory = verdict.evidence["checks"]["memory_health"]["evidence"]
    assert memory["gpus"]["0"]["retired_pages.pending"] == "not supported on this GPU"
    assert "GPU 0: retired_pages.double_bit.count not supported on this GPU" in memory["not_judged"]
    fabric = verdict.evidence["checks"]["fabric"]
    assert fabric["summary"] == "gpu-box: fabric.state not supported on this GPU (no NVSwitch fabric)"


def test_the_load_capture_records_the_power_cap_without_judging_it() -> None:
    load = dict(line.split("\t", 1) for line in (HEALTH / "all-fields-load.tsv").read_text().splitlines())
    verdict = check_gpu_health(h200(changes={"clocks_event_reasons.active": load["clocks_event_reasons.active"]}))
    assert verdict.ok
    assert verdict.evidence["checks"]["clocks_and_links"]["evidence"]["gpus"]["0"][
        "clocks_event_reasons.active"] == "0x0000000000000004"


@pytest.mark.parametrize(("name", "value", "check", "message"), [
    ("remapped_rows.pending", "Yes", check_memory_health,
     "gpu-box GPU 0: remapped_rows.pending = Yes: a row remap waits for a GPU reset (DCGM: reset required)"),
    ("remapped_rows.failure", "Yes", check_memory_health,
     "gpu-box GPU 0: remapped_rows.failure = Yes: a row remap failed"),
    ("remapped_rows.uncorrectable", "512", check_memory_health,
     "gpu-box GPU 0: remapped_rows.uncorrectable = 512 >= 512 (DCGM: RMA)"),
    ("ecc.errors.uncorrected.volatile.total", "3", check_memory_health,
     "gpu-box GPU 0: ecc.errors.uncorrected.volatile.total = 3 > 0"),
    ("ecc.errors.uncorrected.aggregate.sram.thresholdExceeded", "Yes", check_memory_health,
     "gpu-box GPU 0: ecc.errors.uncorrected.aggregate.sram.thresholdExceeded = Yes"),
    ("retired_pages.double_bit.count", "63", check_memory_health,
     "gpu-box GPU 0: retired pages = 63 (single-bit + double-bit) >= 63 (DCGM: RMA)"),
    ("retired_pages.pending", "Yes", check_memory_health, "gpu-box GPU 0: retired_pages.pending = Yes"),
    ("gpu_recovery_action", "Drain and Reset", check_gpu_alive,
     "gpu-box GPU 0: gpu_recovery_action = Drain and Reset: drain the GPU's work, then reset it"),
    ("fabric.state", "In Progress", check_fabric,
     "gpu-box GPU 0: fabric.state = In Progress: the fabric manager has not registered this GPU; CUDA would "
     "fail with Error 802"),
    ("compute_mode", "Prohibited", check_gpu_modes, "gpu-box GPU 0: compute_mode = Prohibited"),
    ("clocks_event_reasons.active", "0x0000000000000048", None,
     "gpu-box GPU 0: clocks_event_reasons.active = 0x0000000000000048 (hw_slowdown, hw_thermal_slowdown)"),
])
def test_one_field_changed_fails_naming_host_gpu_field_and_value(name: str, value: str, check: object,
                                                                 message: str) -> None:
    verdict = check_gpu_health(h200(changes={name: value}))
    assert not verdict.ok
    assert any(message in line for line in verdict.details), verdict.message


def test_fabric_completed_with_an_error_status() -> None:
    verdict = check_fabric(h200(changes={"fabric.state": "Completed", "fabric.status": "NVML_ERROR_UNKNOWN"}))
    assert not verdict.ok
    assert "fabric.status = NVML_ERROR_UNKNOWN (fabric.state = Completed)" in verdict.message


def test_mig_fails_with_tp_and_warns_at_tp1() -> None:
    snap = h200(changes={"mig.mode.current": "Enabled", "mig.mode.pending": "Enabled"})
    assert "TP = 2 cannot span MIG instances" in check_gpu_modes(snap, tp=2).message
    single = check_gpu_modes(snap, tp=1)
    assert single.ok
    assert "mig.mode.current = Enabled" in single.warnings[0]


def test_exclusive_process_and_persistence_off_warn() -> None:
    verdict = check_gpu_modes(h200(changes={"compute_mode": "Exclusive_Process",
                                      "persistence_mode": "Disabled"}))
    assert verdict.ok
    assert [w.split(":")[1].strip() for w in verdict.warnings] == [
        "compute_mode = Exclusive_Process", "persistence_mode = Disabled"]


def test_corrected_errors_above_gcm_warn() -> None:
    verdict = check_memory_health(h200(changes={"ecc.errors.corrected.volatile.total": "50000001"}))
    assert verdict.ok
    assert "ecc.errors.corrected.volatile.total = 50000001 > 50000000 (GCM: warn)" in verdict.warnings[0]


def test_a_narrow_link_warns() -> None:
    verdict = check_gpu_health(h200(changes={"pcie.link.width.current": "8"}))
    assert verdict.ok
    assert "gpu-box GPU 0: pcie.link.width.current = x8 < pcie.link.width.max = x16" in " ".join(verdict.warnings)


def test_driver_older_than_the_build_fails_saying_what_would_work() -> None:
    verdict = check_cuda_driver_compat(h200(driver_cuda=(12, 8)))
    assert not verdict.ok
    assert ("gpu-box: driver 580.159.04 (CUDA 12.8) is older than the build's CUDA 13.0 (nvidia-cuda-runtime "
            "13.0.96)") in verdict.message
    assert "a torch/vLLM build for CUDA 12.x (e.g. the cu128 wheel) or a driver >= 580.65.06" in verdict.message


def test_compat_libcuda_on_a_consumer_gpu_is_error_804() -> None:
    build = BuildInfo(torch="2.11.0+cu130", compat_libcuda=("/usr/local/cuda-13.0/compat",))
    verdict = check_cuda_driver_compat(h200(build=build, name="NVIDIA GeForce RTX 5090"))
    assert not verdict.ok
    assert "CUDA would fail with Error 804" in verdict.message
    assert check_cuda_driver_compat(h200(build=build)).ok  # an H200: forward compatibility works


def test_no_gpu_visible_and_too_few() -> None:
    snap = h200()
    assert snap.health is not None
    hidden = replace(snap, health=replace(snap.health, visible_devices={"CUDA_VISIBLE_DEVICES": ""}))
    assert "vLLM would fail with 'Failed to infer device type'" in check_gpus_visible(hidden).message
    few = check_gpus_visible(snap, tp=4, pp=1, dp=2)
    assert "gpu-box: 1 GPUs visible (1 GPUs on the host), the layout needs TP x PP x DP = 4 x 1 x 2 = 8" in few.message


def test_small_shm_fails_only_with_several_workers() -> None:
    snap = h200(shm_mib=64)
    assert check_shm_capacity(snap, tp=1).ok
    verdict = check_shm_capacity(snap, tp=2)
    assert "gpu-box: /dev/shm is 64 MiB (64 MiB free), TP x PP = 2 needs at least 1024 MiB" in verdict.message
    assert "--ipc=host or --shm-size" in verdict.message


def test_lost_gpu_from_the_driver_message() -> None:
    # the message nvidia-smi prints for a lost GPU (JosephKJ/OWOD#81)
    section = ("@@fields " + ",".join(HEALTH_FIELDS) + "\nUnable to determine the device handle for GPU 0000:02:00.0: "
               "GPU is lost. Reboot the system to recover this GPU\n")
    verdict = check_gpu_alive(h200(section))
    assert not verdict.ok
    assert "gpu-box: a GPU does not answer: Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost" \
        in verdict.message
    assert "reboot to recover it" in verdict.message


def test_xid_history_warns_and_unreadable_is_said_once() -> None:
    snap = h200()
    assert snap.health is not None
    line = "[ 1234.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    logged = replace(snap, health=replace(snap.health, xid=parse_xid_log(line)))
    verdict = check_xid_history(logged)
    assert verdict.ok
    assert verdict.warnings[0].startswith("gpu-box: kernel log: Xid 79 on PCI 0000:3b:00 "
                                          "(ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, GPU has fallen off the bus: "
                                          "NVIDIA's immediate action RESTART_BM (reboot the node")
    unreadable = parse_xid_log("@@unreadable dmesg: read kernel buffer failed: Operation not permitted")
    quiet = check_xid_history(replace(snap, health=replace(snap.health, xid=unreadable)))
    assert quiet.ok
    assert quiet.warnings == ("gpu-box: Xid history not checked: the kernel log is not readable here (dmesg: read "
                              "kernel buffer failed: Operation not permitted)",)


def test_p2p_matrices_as_captured() -> None:
    assert parse_p2p_matrix((HEALTH / "topo-p2p-r.txt").read_text()) == {}  # the H200: one GPU, underlined header
    assert parse_p2p_matrix(captured("rtx5090x2-p2p-rw.txt")) == {(0, 1): "GNS"}


def test_p2p_not_ok_and_iommu_warn() -> None:
    snap = h200()
    assert snap.health is not None
    from pytest_gpuready.host.health import P2PReading
    p2p = P2PReading(pairs={(0, 1): {"read": "GPU not supported", "write": "GPU not supported"}}, iommu="translated")
    second = replace(snap.health.gpus[0], index=1)
    two = replace(snap, health=replace(snap.health, p2p=p2p, gpus=(*snap.health.gpus, second)))
    verdict = check_p2p(two, gpus=[0, 1])
    assert verdict.ok
    assert "gpu-box GPU 0-GPU 1: P2P read = GPU not supported" in verdict.warnings[0]
    assert "TP may hang" in verdict.warnings[2]


def test_iommu_and_acs() -> None:
    assert parse_iommu("@@cmdline iommu=pt\n@@units 2\n@@acs-unreadable not root")[0] == "passthrough"
    mode, acs, _ = parse_iommu("@@units 2\n00:01.0 PCI bridge: x\n\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ "
                               "CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n")
    assert mode == "translated"
    assert acs is not None
    assert acs[0].startswith("00:01.0: ACSCtl: SrcValid+")


def test_driver_cuda_from_the_plain_table_and_q() -> None:
    assert parse_cuda_version((HEALTH / "nvidia-smi-plain.txt").read_text()) == (13, 0)
    assert parse_cuda_version((HEALTH / "nvidia-smi-q.txt").read_text()) == (13, 0)


def test_build_cuda_from_dist_info_without_importing(tmp_path: Path) -> None:
    for name, version in (("torch-2.11.0", "2.11.0+cu130"), ("vllm-0.25.0", "0.25.0"),
                          ("nvidia_cuda_runtime_cu12-12.8.90", "12.8.90")):
        folder = tmp_path / f"{name}.dist-info"
        folder.mkdir()
        (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: x\nVersion: {version}\n")
    script = BUILD_SCRIPT.replace("python3", sys.executable, 1)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0,1"}
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60).stdout
    build, vllm, visible = parse_build(out)
    assert (build.torch, vllm, build.cuda, build.cuda_source) == ("2.11.0+cu130", "0.25.0", (13, 0),
                                                                  "torch 2.11.0+cu130")
    assert ("nvidia-cuda-runtime-cu12", "12.8.90") in build.cuda_runtime
    assert visible["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cuda_tag("2.9.0+cu128") == (12, 8)
    assert BuildInfo(cuda_runtime=(("nvidia-cuda-runtime", "13.0.96"),)).cuda == (13, 0)


def test_a_health_reading_that_failed_errors_and_no_gpu_skips() -> None:
    snap = h200()
    assert snap.health is not None
    broken = replace(snap, health=replace(snap.health, errors={"fields": "nvidia-smi failed (exit 9)"}))
    with pytest.raises(ProbeError, match=r"gpu-box: GPU health fields could not be read: nvidia-smi failed"):
        check_memory_health(broken)
    with pytest.raises(NoGpuError):
        check_gpu_health(replace(snap, no_gpu_reason="no NVIDIA GPU on this machine"))


def test_nvml_reader_with_the_fake_answers_as_the_h200() -> None:
    health = read_health_nvml(FakeNvml())
    gpu = health.gpus[0]
    assert health.driver_cuda == (13, 0)
    assert gpu.get("remapped_rows.pending") is False
    assert gpu.get("retired_pages.pending") is NOT_SUPPORTED
    assert gpu.get("fabric.state") is NOT_SUPPORTED
    assert gpu.get("gpu_recovery_action") == "None"
    assert "ecc.errors.uncorrected.aggregate.sram.thresholdExceeded" in gpu.unread


def test_nvml_reader_one_answer_changed() -> None:
    health = read_health_nvml(FakeNvml(overrides={"nvmlDeviceGetRemappedRows": (0, 0, 1, 0)}))
    snap = replace(h200(), health=replace(health, build=BuildInfo(torch="2.11.0+cu130")))
    assert "remapped_rows.pending = Yes" in check_memory_health(snap).message
    lost = read_health_nvml(FakeNvml(lost=True))
    assert lost.gpus[0].lost == "NVML: GPU is lost"
    assert "gpu-box GPU 0 does not answer: NVML: GPU is lost; reboot to recover it" in check_gpu_alive(
        replace(snap, health=lost)).message
    unsupported = read_health_nvml(FakeNvml(overrides={"nvmlDeviceGetMigMode": FAKE_NOT_SUPPORTED}))
    assert unsupported.gpus[0].get("mig.mode.current") is NOT_SUPPORTED
    assert XidLog().unreadable is None
