"""Shared fixtures of the test suite: captured data and the labelled stand-in nvidia-smi."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
DATA = TESTS / "data"
STANDIN_BIN = TESTS / "standin" / "bin"
SCENARIOS = TESTS / "standin" / "scenarios"


def captured(name: str) -> str:
    """A captured nvidia-smi output without its ``#`` header lines."""
    text = (DATA / "nvidia-smi" / name).read_text()
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Put the stand-in nvidia-smi (CI has no GPU; it replays captured outputs) on PATH with a scenario.

    Also forces nothing else: NVML cannot load on a machine without the driver, so the probe
    falls back to nvidia-smi exactly as it would on a GPU host with a broken NVML.
    """

    def use(scenario: str) -> Path:
        path = SCENARIOS / scenario
        assert path.is_dir(), f"no stand-in scenario {scenario}"
        monkeypatch.setenv("PATH", f"{STANDIN_BIN}:{os.environ['PATH']}")
        monkeypatch.setenv("GPUREADY_STANDIN_SCENARIO", str(path))
        return path

    return use


@pytest.fixture
def no_gpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH with no nvidia-smi at all (this machine's real state)."""
    monkeypatch.delenv("GPUREADY_STANDIN_SCENARIO", raising=False)
    for variable in ("GPUREADY_HOST", "GPUREADY_GPU_IDS"):
        monkeypatch.delenv(variable, raising=False)
