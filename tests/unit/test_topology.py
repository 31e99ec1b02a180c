"""``nvidia-smi topo -m`` parsing on real outputs (tab-separated and pasted with spaces)."""

from __future__ import annotations

import pytest

from pytest_gpuready import ProbeError
from pytest_gpuready.host.topology import parse_topo_matrix
from tests.conftest import captured


def test_single_h200_with_ansi_underlined_header() -> None:
    topology = parse_topo_matrix(captured("h200x1-topo.txt"))
    assert topology.links == ()
    assert topology.cpu_affinity == {0: "0-15"}
    assert topology.numa_affinity == {0: 0}


def test_pcie_box_with_nics_and_two_numa_nodes() -> None:
    topology = parse_topo_matrix(captured("rtx4090x8-topo.txt"))
    assert len(topology.links) == 28  # 8 choose 2; NIC columns are not GPU links
    assert {link.link for link in topology.links} == {"SYS"}
    assert topology.link(6, 7) == "SYS"
    assert topology.numa_affinity == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    assert topology.cpu_affinity[4] == "56-111,168-223"


def test_nvlink_board_pasted_with_spaces() -> None:
    topology = parse_topo_matrix(captured("h100x8-topo.txt"))
    assert {link.link for link in topology.links} == {"NV18"}
    assert all(link.is_nvlink for link in topology.links)
    assert topology.numa_affinity[7] == 1


def test_no_matrix_is_an_error() -> None:
    with pytest.raises(ProbeError, match="printed no GPU matrix"):
        parse_topo_matrix("No devices were found\n", "box")


def test_unknown_link_is_an_error() -> None:
    text = captured("rtx4090x8-topo.txt").replace("GPU1\tSYS", "GPU1\tWAT", 1)
    with pytest.raises(ProbeError, match="unknown link 'WAT' between GPU1 and GPU0"):
        parse_topo_matrix(text)


def test_truncated_row_is_an_error() -> None:
    text = captured("rtx4090x8-topo.txt").replace("GPU3\tSYS\tSYS\tSYS\t X \tSYS\tSYS", "GPU3\tSYS")
    with pytest.raises(ProbeError, match="row for GPU3 is truncated"):
        parse_topo_matrix(text)
