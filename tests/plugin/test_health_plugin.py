"""The health preflight, fixture and marker end to end: pytester, the labelled stand-in nvidia-smi,
the H200's captured answers, and for each unhealthy path a copy of them with one field changed."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS

Standin = Callable[[str], Path]
HEALTH = ("--pyargs", "pytest_gpuready.preflight.test_health", "-p", "no:cacheprovider", "-k", "not shm")


def changed(tmp_path: Path, standin: Standin, monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """h200-idle with one line of its all-fields.tsv (the H200's captured fields) changed."""
    scenario = tmp_path / "h200-changed"
    shutil.copytree(SCENARIOS / "h200-idle", scenario)
    lines = (scenario / "all-fields.tsv").read_text().splitlines()
    assert any(line.startswith(f"{name}\t") for line in lines), name
    (scenario / "all-fields.tsv").write_text(
        "\n".join(f"{name}\t{value}" if line.startswith(f"{name}\t") else line for line in lines) + "\n")
    standin("h200-idle")
    monkeypatch.setenv("GPUREADY_STANDIN_SCENARIO", str(scenario))


def test_the_idle_h200_is_healthy(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    result = pytester.runpytest(*HEALTH, "--gpu-host", "local")
    result.stdout.fnmatch_lines(["gpuready: host local via nvidia-smi, driver 580.159.04, 1x NVIDIA H200 "
                                 "(143771 MiB, SM90), vLLM *, CUDA 13.0 (driver), build CUDA *"])
    result.assert_outcomes(passed=9)


@pytest.mark.parametrize(("name", "value", "test", "message"), [
    ("remapped_rows.pending", "Yes", "test_gpu_memory_health",
     "  local GPU 0: remapped_rows.pending = Yes: a row remap waits for a GPU reset (DCGM: reset required)*"),
    ("remapped_rows.failure", "Yes", "test_gpu_memory_health",
     "  local GPU 0: remapped_rows.failure = Yes: a row remap failed*(DCGM: RMA)"),
    ("ecc.errors.uncorrected.volatile.total", "2", "test_gpu_memory_health",
     "  local GPU 0: ecc.errors.uncorrected.volatile.total = 2 > 0*"),
    ("ecc.errors.uncorrected.aggregate.sram.thresholdExceeded", "Yes", "test_gpu_memory_health",
     "  local GPU 0: ecc.errors.uncorrected.aggregate.sram.thresholdExceeded = Yes*"),
    ("gpu_recovery_action", "Node Reboot", "test_gpus_alive",
     "  local GPU 0: gpu_recovery_action = Node Reboot: reboot the node"),
    ("fabric.state", "Not Started", "test_gpu_fabric",
     "  local GPU 0: fabric.state = Not Started: the fabric manager has not registered this GPU; CUDA would fail "
     "with Error 802*start nvidia-fabricmanager*"),
    ("compute_mode", "Prohibited", "test_gpu_modes[[]tp1[]]", "  local GPU 0: compute_mode = Prohibited*"),
    ("clocks_event_reasons.active", "0x0000000000000008", "test_gpu_clocks_and_links",
     "  local GPU 0: clocks_event_reasons.active = 0x0000000000000008 (hw_slowdown): the GPU slows itself*"),
])
def test_one_field_changed_fails_its_test(pytester: pytest.Pytester, standin: Standin, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, name: str, value: str, test: str,
                                          message: str) -> None:
    changed(tmp_path, standin, monkeypatch, name, value)
    result = pytester.runpytest(*HEALTH, "--gpu-host", "local")
    result.assert_outcomes(passed=8, failed=1)
    result.stdout.fnmatch_lines([f"*_ {test} _*", "*on local: 1 problem(s)", message])
    assert "Traceback" not in result.stdout.str()


def test_mig_fails_the_tp2_deployment_only(pytester: pytest.Pytester, standin: Standin, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    changed(tmp_path, standin, monkeypatch, "mig.mode.current", "Enabled")
    deploy = pytester.makefile(".yaml", deploy=(
        "deployments:\n"
        "  - {name: one, model: m, tp: 1}\n"
        "  - {name: two, model: m, tp: 2}\n"))
    result = pytester.runpytest(*HEALTH, "--gpu-host", "local", "--gpuready-config", str(deploy), "-k",
                                "gpu_modes", "-W", "default")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*_ test_gpu_modes[[]two[]] _*",
                                 "  local GPU 0: mig.mode.current = Enabled*TP = 2 cannot span MIG instances*"])
    result.stdout.fnmatch_lines(["*GpuReadyWarning: local GPU 0: mig.mode.current = Enabled*at TP = 1*"])


def test_a_persistence_mode_off_warns(pytester: pytest.Pytester, standin: Standin, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    changed(tmp_path, standin, monkeypatch, "persistence_mode", "Disabled")
    result = pytester.runpytest(*HEALTH, "--gpu-host", "local", "-W", "default")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(["*GpuReadyWarning: local GPU 0: persistence_mode = Disabled*nvidia-persistenced*"])


def test_fields_the_driver_does_not_know_are_named(pytester: pytest.Pytester, standin: Standin,
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = tmp_path / "old-driver"
    shutil.copytree(SCENARIOS / "h200-idle", scenario)
    lines = (scenario / "all-fields.tsv").read_text().splitlines()
    (scenario / "all-fields.tsv").write_text(  # a driver before row remapping and recovery actions
        "\n".join(line for line in lines if not line.startswith(("remapped_rows.", "gpu_recovery_action",
                                                                "clocks_event_reasons.active")))
        + "\nclocks_throttle_reasons.active\t0x0000000000000001\n")
    standin("h200-idle")
    monkeypatch.setenv("GPUREADY_STANDIN_SCENARIO", str(scenario))
    pytester.makepyfile(test_fields="""
        from pytest_gpuready.host.health_checks import check_memory_health
        def test_it(gpu_snapshot):
            verdict = check_memory_health(gpu_snapshot)
            notes = verdict.evidence["not_judged"]
            assert any("remapped_rows.pending not read: this driver's nvidia-smi was not asked" in n for n in notes)
            assert gpu_snapshot.health.gpus[0].get("clocks_event_reasons.active") == 1
    """)
    pytester.runpytest("-p", "no:cacheprovider", "--gpu-host", "local").assert_outcomes(passed=1)


def test_a_lost_gpu_fails_alive_and_errors_the_rest(pytester: pytest.Pytester, standin: Standin,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = tmp_path / "lost"
    scenario.mkdir()
    # what nvidia-smi prints for a lost GPU (JosephKJ/OWOD#81); 15 is nvidia-smi's exit code for it (man page)
    (scenario / "fail.txt").write_text("Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. "
                                       "Reboot the system to recover this GPU\n")
    (scenario / "fail-rc").write_text("15\n")
    standin("h200-idle")
    monkeypatch.setenv("GPUREADY_STANDIN_SCENARIO", str(scenario))
    result = pytester.runpytest(*HEALTH, "--gpu-host", "local", "-k", "alive or memory")
    result.assert_outcomes(failed=1, errors=1)  # alive measured the loss; memory could not be read
    result.stdout.fnmatch_lines([
        "*_ test_gpus_alive _*",
        "  local: a GPU does not answer: Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost.*",
    ])


def test_the_marker_and_the_fixture(pytester: pytest.Pytester, standin: Standin, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    changed(tmp_path, standin, monkeypatch, "remapped_rows.pending", "Yes")
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.gpu_health(tp=1)
        def test_marked():
            pass

        def test_fixture(gpu_health):
            pass

        @pytest.mark.gpu_health(tp=0)
        def test_bad_marker():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-host", "local")
    result.assert_outcomes(failed=2, errors=1)  # measured violations fail (before the body); a bad marker errors
    result.stdout.fnmatch_lines(["*memory_health: local GPU 0: remapped_rows.pending = Yes*"])
    result.stdout.fnmatch_lines(["*@pytest.mark.gpu_health: tp=0; expected a whole number >= 1*"])
