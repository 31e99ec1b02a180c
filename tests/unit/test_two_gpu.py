"""The two-GPU checks on the plugin's side: the worker's output judged (the labelled stand-in
Python replays it: tests/standin/workers/README.md), the hard timeout against a real hanging
process, the topology of a TP=2 group from captured ``nvidia-smi topo -m`` outputs, and the
NCCL threshold keyed by that topology. Nothing here imports torch."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from pytest_gpuready import ProbeError
from pytest_gpuready.host.checks import check_topology
from pytest_gpuready.host.gpu_workers import (
    NVLINK_BUSBW_MIN_GBPS,
    PCIE_BUSBW_MIN_GBPS,
    check_nccl_allreduce,
    check_p2p_functional,
    group_fabric,
    parse_worker_output,
)
from pytest_gpuready.host.gpus import parse_query_gpu
from pytest_gpuready.host.hosts import LocalHost
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.host.topology import parse_topo_matrix
from tests.conftest import captured

WORKERS = Path(__file__).resolve().parents[1] / "standin" / "workers"
PYTHON = str(WORKERS / "python")
NVLINK = parse_topo_matrix(captured("h100x8-topo.txt"))
PCIE = parse_topo_matrix(captured("rtx4090x8-topo.txt"))


def replay(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("GPUREADY_STANDIN_WORKER", str(WORKERS / name))


def test_the_worker_output_is_read_line_by_line() -> None:
    facts, done = parse_worker_output((WORKERS / "p2p-ok.txt").read_text() + "NCCL INFO noise\n")
    assert [f["kind"] for f in facts] == ["versions", "pair", "done"]
    assert done
    with pytest.raises(ProbeError, match="not JSON"):
        parse_worker_output("@@gpuready {broken\n")


def test_the_workers_import_no_plugin_module_and_torch_only_inside() -> None:
    for name in ("p2p_ipc.py", "nccl_allreduce.py"):
        text = (Path(sys.modules["pytest_gpuready"].__file__ or "").parent / "host" / "workers" / name).read_text()
        assert "pytest_gpuready" not in text.split('"""', 2)[2]  # the code after the docstring
        assert "\nimport torch" not in text  # only importlib.import_module("torch") in the worker's processes
    assert "torch" not in sys.modules


def test_p2p_passes_when_every_byte_came_back(monkeypatch: pytest.MonkeyPatch) -> None:
    replay(monkeypatch, "p2p-ok.txt")
    verdict = check_p2p_functional(LocalHost(), [0, 1], python=PYTHON)
    assert verdict.ok, verdict.message
    assert verdict.summary == "local: P2P over CUDA IPC works for GPUs 0,1 (0<->1 1.412 s)"


def test_p2p_fails_on_a_wrong_write_and_says_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    replay(monkeypatch, "p2p-corrupt.txt")
    verdict = check_p2p_functional(LocalHost(), [0, 1], python=PYTHON)
    assert not verdict.ok
    assert verdict.details[0] == "GPU 0 <-> GPU 1: bytes came back wrong (read True, write False)"
    assert "iommu=pt" in verdict.details[1]


def test_no_torch_on_the_host_is_an_error_not_a_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    replay(monkeypatch, "no-torch.txt")
    with pytest.raises(ProbeError, match=r"local: the P2P check could not run: /usr/bin/python3 cannot import torch"):
        check_p2p_functional(LocalHost(), [0, 1], python=PYTHON)
    with pytest.raises(ProbeError, match="needs two GPUs or more"):
        check_p2p_functional(LocalHost(), [0], python=PYTHON)


def test_the_real_worker_without_torch_says_so() -> None:
    """The real worker script, run by this machine's Python (no torch here): an error, not a pass."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed here")
    with pytest.raises(ProbeError, match="cannot import torch"):
        check_p2p_functional(LocalHost(), [0, 1], python=sys.executable, timeout_s=30)


def test_a_tp2_group_over_pcie_and_over_nvlink() -> None:
    assert group_fabric(PCIE, [0, 1]) == "PCIe"
    assert group_fabric(NVLINK, [0, 1]) == "NVLink"
    with pytest.raises(ProbeError, match="lacks links GPU0-GPU1"):
        group_fabric(parse_topo_matrix(captured("h200x1-topo.txt")), [0, 1])


def test_check_topology_for_a_tp2_group_from_captures() -> None:
    gpus = parse_query_gpu(captured("rtxpro6000x8-minimax-tp4-loaded.txt"),
                           ("index", "memory.used", "memory.total", "power.draw"))
    box = HostSnapshot("gpu-box-7", 0.0, "nvidia-smi", tuple(gpus), topology=PCIE)
    same_node = check_topology(box, [0, 1])
    assert same_node.ok
    assert same_node.evidence["links"] == {"0-1": "SYS"}
    across = check_topology(box, [3, 4])
    assert any("spans NUMA nodes (node 0: GPU 3; node 1: GPU 4)" in w for w in across.warnings)
    hgx = check_topology(HostSnapshot("hgx", 0.0, "nvidia-smi", tuple(gpus), topology=NVLINK), [0, 1])
    assert (hgx.ok, hgx.warnings, hgx.evidence["links"]) == (True, (), {"0-1": "NV18"})


def test_nccl_passes_on_pcie_above_its_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    replay(monkeypatch, "nccl-pcie.txt")
    verdict = check_nccl_allreduce(LocalHost(), [0, 1], PCIE, python=PYTHON)
    assert verdict.ok, verdict.message
    assert verdict.summary == ("local: NCCL all-reduce of 256 MB over GPUs 0,1 (PCIe): bus bandwidth 21.9 GB/s "
                               f"(threshold {PCIE_BUSBW_MIN_GBPS:g} GB/s for PCIe)")


def test_the_same_figure_on_an_nvlink_pair_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    replay(monkeypatch, "nccl-pcie.txt")  # an NVLink pair that ran at PCIe speed: NVLink down or not used
    verdict = check_nccl_allreduce(LocalHost(), [0, 1], NVLINK, python=PYTHON)
    assert not verdict.ok
    assert f"(threshold {NVLINK_BUSBW_MIN_GBPS:g} GB/s for NVLink)" in verdict.summary


def test_a_wrong_sum_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    replay(monkeypatch, "nccl-wrong-sum.txt")
    verdict = check_nccl_allreduce(LocalHost(), [0, 1], PCIE, python=PYTHON)
    assert not verdict.ok
    assert verdict.summary.endswith("wrong sum in 50 elements")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_hung_all_reduce_fails_within_the_hard_timeout_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    replay(monkeypatch, "nccl-hang.txt")
    monkeypatch.setenv("GPUREADY_STANDIN_PIDDIR", str(tmp_path))
    verdict = check_nccl_allreduce(LocalHost(), [0, 1], PCIE, python=PYTHON, timeout_s=1, grace_s=1)
    assert not verdict.ok
    assert verdict.summary.endswith("hung: no result within 2 s, the worker was killed")
    pids = [int((tmp_path / name).read_text()) for name in ("worker", "child")]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
