"""The gpu tier: NVML and nvidia-smi on a real NVIDIA GPU (run through the device tool; skipped elsewhere).

A torch allocation held by a child process must be found, with its pid and MiB, by both readers,
and the two readers must agree on every GPU. Figures are written to $GPUREADY_GPU_REPORT (JSON)
when set, for docs/gpu-validation.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_gpuready import HostSnapshot, LocalHost, check_gpus_clean, snapshot

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a real NVIDIA GPU (nvidia-smi not found)"),
]

ALLOCATION_GIB = 20
REPORT: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _write_report() -> Iterator[None]:
    yield
    target = os.environ.get("GPUREADY_GPU_REPORT")
    if target:
        existing: dict[str, Any] = {}
        if os.path.exists(target) and os.path.getsize(target):
            with open(target) as handle:
                existing = json.load(handle)  # other gpu-tier modules' sections (the orphan story)
        with open(target, "w") as handle:
            json.dump({**existing, **REPORT}, handle, indent=2, default=str)


def both_readers() -> tuple[HostSnapshot, HostSnapshot]:
    host = LocalHost()
    return snapshot(host, reader="nvml"), snapshot(host, reader="nvidia-smi")


def test_readers_agree_on_an_idle_gpu() -> None:
    nvml, smi = both_readers()
    assert nvml.gpu_reader == "nvml"
    assert smi.gpu_reader == "nvidia-smi"
    REPORT["idle"] = {"nvml": nvml.require_gpus(), "nvidia-smi": smi.require_gpus(),
                      "nvml_probe_s": nvml.probe_duration_s, "smi_probe_s": smi.probe_duration_s}
    assert len(nvml.require_gpus()) == len(smi.require_gpus())
    for a, b in zip(nvml.require_gpus(), smi.require_gpus(), strict=True):
        assert (a.index, a.uuid, a.name, a.pci_bus_id) == (b.index, b.uuid, b.name, b.pci_bus_id)
        assert a.memory_total_mib == b.memory_total_mib
        assert a.compute_capability == b.compute_capability
        assert abs(a.memory_used_mib - b.memory_used_mib) <= 2
        if a.memory_reserved_mib is not None and b.memory_reserved_mib is not None:
            assert abs(a.memory_reserved_mib - b.memory_reserved_mib) <= 2
    verdict = check_gpus_clean(nvml)
    REPORT["idle_verdict"] = verdict.message
    assert verdict.ok, verdict.message


@pytest.fixture
def torch_allocation() -> Iterator[subprocess.Popen[str]]:
    """A child process holding a real torch allocation on GPU 0, like a leftover EngineCore."""
    code = (
        "import sys, torch\n"
        f"x = torch.empty({ALLOCATION_GIB} * 1024**3, dtype=torch.uint8, device='cuda:0')\n"
        "torch.cuda.synchronize()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    yield child
    if child.poll() is None:
        child.kill()
    child.wait(timeout=60)
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            stream.close()


def test_a_real_allocation_is_found_with_pid_and_mib(torch_allocation: subprocess.Popen[str]) -> None:
    nvml, smi = both_readers()
    found = {}
    for name, snap in (("nvml", nvml), ("nvidia-smi", smi)):
        mine = [p for p in snap.processes if p.pid == torch_allocation.pid]
        assert len(mine) == 1, f"{name} did not list pid {torch_allocation.pid}: {snap.processes}"
        (process,) = mine
        assert process.gpu_index == 0
        assert process.alive is True
        assert process.used_memory_mib is not None
        assert process.used_memory_mib >= ALLOCATION_GIB * 1024
        found[name] = process
    assert abs((found["nvml"].used_memory_mib or 0) - (found["nvidia-smi"].used_memory_mib or 0)) <= 2
    assert abs(nvml.gpu(0).memory_used_mib - smi.gpu(0).memory_used_mib) <= 2
    verdict = check_gpus_clean(nvml, gpus=[0])
    assert not verdict.ok
    assert f"held by pid {torch_allocation.pid} (" in verdict.details[0]
    REPORT["held"] = {"processes": found, "gpu0_used": {"nvml": nvml.gpu(0).memory_used_mib,
                                                         "nvidia-smi": smi.gpu(0).memory_used_mib},
                      "verdict": verdict.message}

    started = time.monotonic()
    torch_allocation.kill()
    torch_allocation.wait(timeout=60)
    deadline = started + 60
    while True:  # memory is released shortly after the process exits; poll, do not sleep blindly
        after = snapshot(LocalHost(), reader="nvml")
        if check_gpus_clean(after, gpus=[0]).ok or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    REPORT["release_s"] = time.monotonic() - started
    final = check_gpus_clean(after, gpus=[0])
    assert final.ok, final.message
