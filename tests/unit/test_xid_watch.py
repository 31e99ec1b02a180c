"""The Xid watcher: NVML events from the labelled fake NVML (the event shape a real driver
delivers), and the kernel log through a real shell and the stand-in ``dmesg`` replaying real
Xid lines (tests/data/kmsg)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pynvml
import pytest

from pytest_gpuready.host.hosts import LocalHost
from pytest_gpuready.host.xid_catalog import XID_CATALOG, xid_action
from pytest_gpuready.host.xid_watch import XidWatcher, bus_key
from tests.conftest import DATA
from tests.standin.fake_nvml import FakeNvml

KMSG_BIN = Path(__file__).resolve().parents[1] / "standin" / "kmsg"
KMSG = DATA / "kmsg"


class _NoNvml(FakeNvml):
    """NVML that cannot start, as on a machine without the driver."""

    def nvmlInit(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


@pytest.fixture
def kernel_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "kmsg.txt"
    shutil.copy(KMSG / "boot.txt", log)
    monkeypatch.setenv("PATH", f"{KMSG_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUREADY_STANDIN_KMSG", str(log))
    return log


def _append(log: Path, name: str) -> None:
    with log.open("a") as out:
        out.write((KMSG / name).read_text())


def test_the_catalog_says_nvidias_action() -> None:
    assert xid_action(79).startswith("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, GPU has fallen off the bus: "
                                     "NVIDIA's immediate action RESTART_BM (reboot the node")
    assert XID_CATALOG[48].immediate_action == "WORKFLOW_XID_48"
    assert XID_CATALOG[119].immediate_action == "RESET_GPU"
    assert "see NVIDIA's Xid catalog, https://docs.nvidia.com/deploy/xid-errors/" in xid_action(4242)


def test_bus_ids_of_the_kernel_log_and_nvidia_smi_match() -> None:
    assert bus_key("0000:2b:00") == bus_key("00000000:2B:00.0") == (0, 0x2B, 0)
    assert bus_key("garbled") is None


def test_nvml_events_of_the_watched_gpus_are_the_record() -> None:
    nvml = FakeNvml(gpus=2)
    watcher = XidWatcher(LocalHost(), gpus=[1], nvml=nvml, wait_ms=50).start()
    nvml.raise_xid(0, 13)  # another GPU's application error: not registered, never delivered
    nvml.raise_xid(1, 79)
    record = watcher.stop()
    assert record.source == "NVML events"
    assert [(e.gpu, e.xid, e.source) for e in record.events] == [(1, 79, "NVML")]
    assert record.failure("the launch").startswith(
        "local: Xid during the launch: GPU 1: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    assert "gpuInstanceId=0xffffffff" in record.events[0].detail
    assert (nvml.open_event_sets, nvml.inits, nvml.shutdowns) == (0, 1, 1)
    assert watcher.stop() is record


def test_no_event_no_xid_and_a_quiet_wait_is_not_an_error() -> None:
    nvml = FakeNvml(gpus=1)
    watcher = XidWatcher(LocalHost(), nvml=nvml, wait_ms=20).start()
    record = watcher.stop()
    assert (record.seen, record.errors, record.unwatched) == (False, (), None)
    assert record.describe() == "local: no Xid (NVML events)"


def test_gpus_without_xid_events_fall_back_to_the_kernel_log(kernel_log: Path) -> None:
    nvml = FakeNvml(gpus=1, overrides={"nvmlDeviceGetSupportedEventTypes": 0x1})
    record = XidWatcher(LocalHost(), nvml=nvml).start().stop()
    assert record.source == "kernel log"
    assert nvml.shutdowns == 1


def test_the_kernel_log_new_lines_are_the_xids_raised_meanwhile(kernel_log: Path) -> None:
    watcher = XidWatcher(LocalHost(), nvml=_NoNvml(), buses={"00000000:2B:00.0": 3}).start()
    _append(kernel_log, "xid-79.txt")  # the driver logs an Xid 79 while the watch runs
    record = watcher.stop()
    assert record.source == "kernel log"
    assert [(e.gpu, e.pci, e.xid) for e in record.events] == [(3, "0000:2b:00", 79)]  # the old Xid 79 is history
    assert record.events[0].describe().startswith("GPU 3 (PCI 0000:2b:00): Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN")
    assert "NVML events unavailable" not in record.describe()


def test_kernel_log_xids_of_gpus_not_watched_are_left_out(kernel_log: Path) -> None:
    watcher = XidWatcher(LocalHost(), gpus=[0], use_nvml=False, buses={"00000000:2B:00.0": 5}).start()
    _append(kernel_log, "xid-79.txt")
    assert watcher.stop().events == ()


def test_an_unreadable_kernel_log_is_said_not_an_error(kernel_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_STANDIN_KMSG_DENY", "1")
    record = XidWatcher(LocalHost(), use_nvml=False).start().stop()
    assert record.source is None
    assert record.unwatched == ("the kernel log is not readable here (dmesg: read kernel buffer failed: "
                                "Operation not permitted)")
    assert not record.seen


def _dead_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_xid_that_kills_the_server_in_a_level_is_named_first() -> None:
    from pytest_gpuready.serve.bench import ServerGoneError, run_benchmark

    nvml = FakeNvml(gpus=1)
    checks: list[int] = []

    def alive() -> bool:  # before the level: alive; then the GPU falls off the bus and the server dies
        checks.append(1)
        if len(checks) == 2:
            nvml.raise_xid(0, 79)
        return len(checks) < 2

    with pytest.raises(ServerGoneError) as excinfo:
        run_benchmark(f"http://127.0.0.1:{_dead_port()}", "m", concurrency=[4], requests=100, warmup=0, alive=alive,
                      xid_watch=lambda: XidWatcher(LocalHost(), nvml=nvml, wait_ms=20))
    assert str(excinfo.value).startswith("local: Xid during concurrency 4: GPU 0: Xid 79 (ROBUST_CHANNEL_GPU_HAS")
    assert excinfo.value.xids is not None
    assert excinfo.value.xids.seen
    assert nvml.open_event_sets == 0


def test_an_xid_during_a_level_stops_the_benchmark_with_the_level_attached() -> None:
    from pytest_gpuready.serve.bench import XidDuringBenchmarkError, run_benchmark

    nvml = FakeNvml(gpus=1)

    class RaisedOnce(XidWatcher):
        def start(self) -> XidWatcher:  # the driver raises Xid 48 once the level's watch is registered
            super().start()
            nvml.raise_xid(0, 48)
            return self

    with pytest.raises(XidDuringBenchmarkError) as excinfo:
        run_benchmark(f"http://127.0.0.1:{_dead_port()}", "m", concurrency=[2, 8], requests=4, warmup=0,
                      xid_watch=lambda: RaisedOnce(LocalHost(), nvml=nvml, wait_ms=20))
    assert str(excinfo.value).startswith("local: Xid during the benchmark level at concurrency 2: GPU 0: Xid 48 "
                                         "(ROBUST_CHANNEL_GPU_ECC_DBE, Double Bit ECC Error: NVIDIA's immediate "
                                         "action WORKFLOW_XID_48")
    assert str(excinfo.value).endswith("the benchmark stopped there")
    level = excinfo.value.level
    assert level.concurrency == 2
    assert level.xids is not None
    assert level.to_dict()["xids"]["events"][0]["xid"] == 48
