"""GPU health preflight: the facts DCGM and GCM check, and the vLLM startup failures nobody checks for.

Host-wide checks run once per host; the checks that depend on a layout (GPUs visible, /dev/shm
size, MIG at TP > 1, P2P of the TP group) run once per deployment of ``--gpuready-config``, with
ids like ``test_gpus_visible[MiniMax-M2.5-tp8]``, or once at TP = 1 on ``--gpu-ids`` without a
deploy file. Every check reads the snapshot taken in the probe's one round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_gpuready.host.health_checks import run_health_check
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.plugin.model_fixtures import deploy_config_of
from pytest_gpuready.plugin.options import GPU_IDS
from pytest_gpuready.plugin.outcomes import checked, expect

pytestmark = pytest.mark.gpuready

NO_DEPLOY_FILE_LAYOUT = "tp1"


@dataclass(frozen=True)
class HealthLayout:
    """The layout a layout-dependent health check judges: a deployment's, or TP = 1."""

    name: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    gpus: tuple[int, ...] | None = None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One layout-dependent test per deployment (one at TP = 1 without a deploy file)."""
    if "health_layout" in metafunc.fixturenames:
        config = deploy_config_of(metafunc.config)
        if config is None:
            layouts = [HealthLayout(NO_DEPLOY_FILE_LAYOUT)]
        else:
            layouts = [HealthLayout(d.name, d.tp, d.pp, d.dp, d.gpus) for d in config.deployments]
        metafunc.parametrize("health_layout", layouts, ids=[layout.name for layout in layouts])


def _run(name: str, snapshot: HostSnapshot, request: pytest.FixtureRequest,
         layout: HealthLayout | None = None) -> None:
    gpus = layout.gpus if layout is not None and layout.gpus is not None else GPU_IDS.get(request.config)
    if layout is not None and layout.gpus is None and gpus is None and name == "p2p":
        gpus = tuple(range(layout.tp)) if layout.tp > 1 else None
    shape = layout or HealthLayout("host")
    verdict = checked(lambda: run_health_check(name, snapshot, gpus=gpus, tp=shape.tp, pp=shape.pp, dp=shape.dp))
    expect(verdict, request.node, name)


def test_cuda_driver_compat(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """The driver's CUDA runs the host's torch/vLLM build; no compat libcuda on a non-datacenter GPU."""
    _run("cuda_driver_compat", gpu_snapshot, request)


def test_gpus_alive(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """No GPU lost or waiting for a reset; no recovery action asked."""
    _run("gpu_alive", gpu_snapshot, request)


def test_gpu_memory_health(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """No pending or failed row remap, no uncorrectable ECC, SRAM and retired pages within DCGM's limits."""
    _run("memory_health", gpu_snapshot, request)


def test_gpu_fabric(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """On an NVSwitch machine the fabric manager registered every GPU (else CUDA Error 802)."""
    _run("fabric", gpu_snapshot, request)


def test_gpu_clocks_and_links(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """No HW slowdown, thermal or power-brake clock event before load; PCIe links at full width."""
    _run("clocks_and_links", gpu_snapshot, request)


def test_xid_history(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """Xid lines already in the kernel log (warnings); said once when the log is not readable."""
    _run("xid_history", gpu_snapshot, request)


def test_gpus_visible(gpu_snapshot: HostSnapshot, health_layout: HealthLayout,
                      request: pytest.FixtureRequest) -> None:
    """At least TP x PP x DP GPUs visible after CUDA_VISIBLE_DEVICES."""
    _run("gpus_visible", gpu_snapshot, request, health_layout)


def test_shm_capacity(gpu_snapshot: HostSnapshot, health_layout: HealthLayout,
                      request: pytest.FixtureRequest) -> None:
    """With TP x PP > 1, /dev/shm holds at least 1 GiB (containers: --ipc=host or --shm-size)."""
    _run("shm_capacity", gpu_snapshot, request, health_layout)


def test_gpu_modes(gpu_snapshot: HostSnapshot, health_layout: HealthLayout, request: pytest.FixtureRequest) -> None:
    """MIG off for TP > 1, compute mode not Prohibited, persistence on."""
    _run("gpu_modes", gpu_snapshot, request, health_layout)


def test_p2p(gpu_snapshot: HostSnapshot, health_layout: HealthLayout, request: pytest.FixtureRequest) -> None:
    """P2P read/write between the TP group's GPUs over PCIe; IOMMU and ACS that make TP hang (warnings)."""
    _run("p2p", gpu_snapshot, request, health_layout)
