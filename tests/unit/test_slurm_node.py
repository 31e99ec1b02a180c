"""This node's Slurm state from real ``scontrol show node -o`` lines (tests/data/slurm), and the
one-line drain reason within Slurm's limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuready.slurm.node import MAX_REASON_BYTES, NodeState, SlurmError, one_line_reason, parse_node

DATA = Path(__file__).parent.parent / "data" / "slurm"


def node(name: str) -> NodeState:
    return parse_node("vm", (DATA / f"scontrol-show-node-{name}.txt").read_text())


def test_an_idle_node() -> None:
    idle = node("idle")
    assert (idle.state, idle.flags, idle.reason) == ("IDLE", frozenset(), None)
    assert not idle.drained
    assert not idle.busy


def test_a_node_gpuready_drained_is_told_from_one_an_operator_drained() -> None:
    ours = node("drained-by-gpuready")
    assert (ours.state, ours.flags) == ("IDLE", frozenset({"DRAIN"}))
    assert ours.reason == "gpuready: gpus_clean: GPU 0: 71832 MiB used, held by pid 3504 (VLLM::EngineCore)"
    assert ours.drained_by_gpuready
    theirs = node("drained-operator")
    assert theirs.reason == "operator: swapping a PSU"  # Slurm's [root@time] stamp is not the reason
    assert theirs.drained
    assert not theirs.drained_by_gpuready


def test_a_node_running_a_job_is_busy_drained_or_not() -> None:
    assert node("allocated").busy
    draining = node("draining-operator")
    assert (draining.state, draining.flags) == ("MIXED", frozenset({"DRAIN"}))
    assert draining.busy
    assert draining.drained


@pytest.mark.parametrize("text", ["", "slurm_load_node error: Invalid node name specified\n", "NodeName=vm Arch=x"])
def test_what_is_not_a_node_line_is_one_error_naming_it(text: str) -> None:
    with pytest.raises(SlurmError, match=r"^scontrol show node vm: expected 'NodeName=\.\.\. State=\.\.\.', got "):
        parse_node("vm", text)


def test_a_reason_is_one_line_with_the_prefix_once() -> None:
    assert one_line_reason("gpus_clean: GPU 0:\n  held by\tpid 4") == "gpuready: gpus_clean: GPU 0: held by pid 4"
    assert one_line_reason("gpuready: already prefixed") == "gpuready: already prefixed"


@pytest.mark.parametrize("filler", ["x", "é", "漢", "🙂"])
def test_a_long_reason_is_cut_within_the_databases_255_bytes(filler: str) -> None:
    reason = one_line_reason("shm_clean: " + filler * 400)
    assert len(reason.encode()) <= MAX_REASON_BYTES
    assert len(reason.encode()) > MAX_REASON_BYTES - 4  # cut at the limit, not far below it
    assert reason.endswith("...")
    assert reason.startswith("gpuready: shm_clean: " + filler)
