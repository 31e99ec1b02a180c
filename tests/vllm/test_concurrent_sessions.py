"""Two pytest sessions run servers at once while a foreign process keeps creating ``psm_*`` files.

Teardown attributes /dev/shm files by who holds them, not by when they appeared: both sessions'
teardowns must be clean and neither may name a file of the other session or of the foreign
process. Real pytest runs (subprocesses), real vLLM servers, the real /dev/shm.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from pytest_gpuready import ServeSpec
from tests.vllm.conftest import API_SERVER_COMMAND, SERVER_ENV, wait_until

FOREIGN = r"""
import sys, time
from multiprocessing import resource_tracker, shared_memory
tag, stop = sys.argv[1], sys.argv[2]
held = []
i = 0
import os
while not os.path.exists(stop):
    segment = shared_memory.SharedMemory(name=f"psm_{tag}_{i}", create=True, size=1 << 16)
    resource_tracker.unregister(segment._name, "shared_memory")
    if i % 2:
        segment.close()          # left behind, held by nobody: what a crashed run leaves
    else:
        held.append(segment)     # held open and mapped by this foreign process
    i += 1
    time.sleep(0.5)
"""

INNER = """
from pytest_gpuready import ServeArgs, ServeSpec

def test_start(vllm_server):
    server = vllm_server(ServeSpec(model={model!r}, served_model_name="tiny-llama", args=ServeArgs(max_model_len=1024),
                                   command={command!r}, env={env!r}))
    assert server.footprint is not None
"""
STARTED = re.compile(r"started pid (\d+) \(session \d+\) on local")


def register_server(proc: subprocess.Popen[bytes], out: Path, register: Callable[[int], None]) -> None:
    """Wait until the run has started its server, and register its session for the finalizer."""
    wait_until(lambda: STARTED.search(out.read_text()) or proc.poll() is not None, 600, "the run to start its server")
    started = STARTED.search(out.read_text())
    if started:
        register(int(started.group(1)))


def test_two_sessions_and_a_foreign_process_never_blame_each_others_files(
    tiny_spec: ServeSpec, tmp_path: Path, inner_sessions: Callable[[int], None]
) -> None:
    tag = f"foreign{uuid.uuid4().hex[:8]}"
    stop = tmp_path / "stop"
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN, tag, str(stop)])
    runs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        wait_until(lambda: any(tag in n for n in os.listdir("/dev/shm")), 120, "the foreign process's first file")
        for name in ("a", "b"):
            workdir = tmp_path / name
            workdir.mkdir()
            (workdir / "test_inner.py").write_text(INNER.format(model=tiny_spec.model, command=API_SERVER_COMMAND,
                                                                env=SERVER_ENV))
            out = workdir / "stdout.txt"
            with out.open("wb") as stdout:
                runs.append((subprocess.Popen(
                    [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", str(workdir / "test_inner.py")],
                    cwd=workdir, stdout=stdout, stderr=subprocess.STDOUT), out))
        for proc, out in runs:
            register_server(proc, out, inner_sessions)
        for proc, _ in runs:
            proc.wait(timeout=1800)
        foreign_files = sum(1 for n in os.listdir("/dev/shm") if tag in n)
    finally:
        stop.touch()
        foreign.wait(timeout=60)
        for proc, _ in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for name in os.listdir("/dev/shm"):
            if tag in name:  # the foreign process's files: this test's to remove
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/dev/shm/{name}")
    assert foreign_files >= 4, "the foreign process did not create files during the runs"
    for proc, out in runs:
        text = out.read_text(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        assert re.search(r"gpuready: tiny-llama: teardown clean in [\d.]+ s: \d+ processes stopped, /dev/shm clean",
                         text), text[-3000:]
        assert tag not in text
        assert "left in /dev/shm" not in text
