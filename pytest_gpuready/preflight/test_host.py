"""Host preflight: is this machine ready to take a vLLM deploy right now?"""

from __future__ import annotations

import pytest

from pytest_gpuready.host.checks import check_gpus_clean, check_shm_clean, check_topology
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.plugin.options import GPU_IDS, GPU_MAX_USED_MIB, SHM_LEAK_PATTERNS, SHM_MIN_FREE_MIB
from pytest_gpuready.plugin.outcomes import checked, expect

pytestmark = pytest.mark.gpuready


def test_gpus_are_clean(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """No compute process holds a GPU and none shows more than the tolerance used."""
    config = request.config
    verdict = checked(
        lambda: check_gpus_clean(gpu_snapshot, gpus=GPU_IDS.get(config), max_used_mib=GPU_MAX_USED_MIB.get(config))
    )
    expect(verdict, request.node, "gpus_clean")


def test_shm_is_clean(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """No psm_*, sem.mp-*, nccl-* or vLLM leftovers in /dev/shm, and room for NCCL."""
    verdict = checked(lambda: check_shm_clean(gpu_snapshot, min_free_mib=SHM_MIN_FREE_MIB.get(request.config),
                                              patterns=SHM_LEAK_PATTERNS.get(request.config)))
    expect(verdict, request.node, "shm_clean")


def test_gpu_topology(gpu_snapshot: HostSnapshot, request: pytest.FixtureRequest) -> None:
    """The selected GPUs' links: warns where vLLM disables custom all-reduce or the group spans NUMA nodes."""
    verdict = checked(lambda: check_topology(gpu_snapshot, gpus=GPU_IDS.get(request.config)))
    expect(verdict, request.node, "topology")
