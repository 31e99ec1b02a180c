"""After a stop, the server answers for its own processes on the GPU, not for another session's.

Captured H200 snapshots replayed by the labelled stand-in nvidia-smi: ``h200-one-process`` (pid
431 ``python3`` holds 20,998 MiB) and ``h200-orphan-enginecore`` (pid 3504 ``VLLM::EngineCore``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_gpuready import LocalHost, snapshot
from pytest_gpuready.serve.teardown import released_by


def test_a_gpu_held_by_another_sessions_process_does_not_fail_this_teardown(standin: Callable[[str], Path]) -> None:
    standin("h200-one-process")
    snap = snapshot(LocalHost(), reader="nvidia-smi")
    verdict = released_by(snap, None, 64, own_pids={3504, 3398})
    assert verdict.ok
    assert verdict.summary == ("the server's processes have left the GPUs; GPU 0 held by other processes (pid 431), "
                               "not the server's")


def test_the_servers_own_process_or_an_unexplained_gpu_still_fails(standin: Callable[[str], Path]) -> None:
    standin("h200-orphan-enginecore")
    snap = snapshot(LocalHost(), reader="nvidia-smi")
    assert not released_by(snap, None, 64, own_pids={3504}).ok  # its own engine is still there
    assert not released_by(snap, None, 64, own_pids=()).ok  # no members known: the GPU must read clean
    standin("h200-idle")
    assert released_by(snapshot(LocalHost(), reader="nvidia-smi"), None, 64, own_pids={3504}).ok
