"""An Xid raised while ``vllm_server`` starts fails that test with the Xid and NVIDIA's action;
a kernel log that cannot be read is said once, never an error. pytester runs with a real
launched process (the labelled stand-in for vLLM's readiness routes) and the stand-in ``dmesg``
replaying real kernel log lines (tests/data/kmsg): the launch command itself appends the Xid
79 lines to the log, as the driver would while the model loads.
"""

from __future__ import annotations

import os
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import DATA

STANDIN = Path(__file__).resolve().parents[1] / "standin"
ROUTES = f"{sys.executable} {STANDIN / 'vllm_routes.py'}"
XID_LAUNCH = (f"sh -c 'cat \"$GPUREADY_XID_LINES\" >> \"$GPUREADY_STANDIN_KMSG\"; exec {ROUTES} \"$@\"' "
              "fake-vllm")

TESTS = """
from pytest_gpuready import ServeSpec

def test_first(vllm_server):
    vllm_server(ServeSpec(model="/m", served_model_name="m"))

def test_again(vllm_server):
    vllm_server(ServeSpec(model="/m", served_model_name="m"))

def test_other(vllm_server):
    vllm_server(ServeSpec(model="/m", served_model_name="m", label="other"))
"""


def _nvml_answers() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture
def kernel_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if _nvml_answers():
        pytest.skip("NVML answers here: the watcher reads NVML events, not the stand-in kernel log")
    log = tmp_path / "kmsg.txt"
    shutil.copy(DATA / "kmsg" / "boot.txt", log)  # an older Xid 79 in it: history, not this launch's
    monkeypatch.setenv("PATH", f"{STANDIN / 'kmsg'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUREADY_STANDIN_KMSG", str(log))
    monkeypatch.setenv("GPUREADY_XID_LINES", str(DATA / "kmsg" / "xid-79.txt"))
    return log


def test_an_xid_during_the_launch_fails_the_test_with_nvidias_action(
    pytester: pytest.Pytester, kernel_log: Path,
) -> None:
    pytester.makepyfile(test_xid=TESTS.split("def test_other")[0])
    result = pytester.runpytest("-p", "no:cacheprovider", "--vllm-cmd", XID_LAUNCH)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_first _*",
        "vLLM m: local: Xid during the launch: PCI 0000:2b:00: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, "
        "GPU has fallen off the bus: NVIDIA's immediate action RESTART_BM (reboot the node; if it repeats, contact "
        "support to reseat or replace the GPU)) [kernel log: [ 5107.644336] NVRM: Xid (PCI:0000:2b:00): 79, GPU has "
        "fallen off the bus.]; the server was stopped",
        "*_ test_again _*",
        "*(this server already failed to start earlier in the session)",
    ])
    assert "1101234" not in result.stdout.str()  # the Xid 79 logged before the launch is history
    assert "Traceback" not in result.stdout.str()


def test_an_unreadable_kernel_log_is_said_once_and_launches_pass(
    pytester: pytest.Pytester, kernel_log: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUREADY_STANDIN_KMSG_DENY", "1")
    pytester.makepyfile(test_xid=TESTS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", "--vllm-cmd", XID_LAUNCH, f"--junitxml={junit}")
    result.assert_outcomes(passed=3)  # two launches (two specs), neither could watch
    said = [p.get("value", "") for p in ET.parse(junit).iter("property") if p.get("name") == "gpuready.xid_watch"]
    assert len(said) == 1, said
    assert said[0].startswith("local: Xid not watched during launches and benchmarks: NVML events unavailable (")
    assert said[0].endswith("the kernel log is not readable here (dmesg: read kernel buffer failed: "
                            "Operation not permitted)")
    result.stdout.fnmatch_lines(["*GpuReadyWarning: local: Xid not watched during launches and benchmarks*"])
