"""Real processes named as vLLM names its engines, for the orphan tests (CI has no GPU).

A stand-in engine is a real process whose kernel name (``/proc/PID/comm``) is set the way vLLM's
setproctitle sets it (``VLLM::EngineCore``, kept as ``VLLM::EngineCor``: 15 bytes). An *orphaned*
one is double-forked so that its parent exits and it is re-parented to pid 1, exactly as an
EngineCore is after SIGKILL of its API server. A *served* one is the child of a live process whose
command line names ``vllm.entrypoints.openai.api_server``. The stand-in ``nvidia-smi`` lists their
pids in place of the captured ones (``GPUREADY_STANDIN_PIDS``). Each exits by itself after
``LIFETIME_S`` so that a crashed test leaves nothing for long. A *job's* engine is the child of a
live ``python batch_infer.py`` (vLLM's offline ``LLM(...)``); an *adopted* one is an orphan whose new
parent is a live subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), as under ``systemd --user``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LIFETIME_S = 300

_ENGINE = r"""
import ctypes, os, signal, sys, time
name, ignore_term, lifetime, mode = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3]), sys.argv[4]
orphan = mode != "0"
r, w = os.pipe()
if mode.startswith("subreaper:"):  # adopt the orphan below, as systemd --user or a container's init does
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    if mode != "subreaper:":
        with open("/proc/self/comm", "w") as handle:
            handle.write(mode.partition(":")[2])

def become_engine():
    with open("/proc/self/comm", "w") as handle:
        handle.write(name)
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.write(w, f"{os.getpid()}\n".encode())
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        time.sleep(1)
    os._exit(0)

if orphan:
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            become_engine()
        os._exit(0)
    os.waitpid(first, 0)
    print(os.read(r, 64).decode().strip(), flush=True)
    if mode.startswith("subreaper:"):
        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
        deadline = time.monotonic() + lifetime
        while time.monotonic() < deadline:
            time.sleep(1)
else:
    child = os.fork()
    if child == 0:
        become_engine()
    print(os.read(r, 64).decode().strip(), flush=True)
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        time.sleep(1)
"""


@dataclass
class Engine:
    pid: int
    start_ticks: int
    api_server: subprocess.Popen[str] | None = None
    """The live parent of a served engine, a job's engine or an adopted one (None for an orphan of pid 1)."""

    def alive(self) -> bool:
        """Still this process (same start time) and not a zombie."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        return fields[0] not in ("Z", "X") and int(fields[19]) == self.start_ticks

    def ppid(self) -> int:
        return int(Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _spawn(name: str, *, orphan: bool, ignore_term: bool, owner: Path | None = None,
           subreaper: str | None = None) -> Engine:
    mode = "0" if not orphan else f"subreaper:{subreaper}" if subreaper is not None else "1"
    program = ["-c", _ENGINE] if owner is None else [owner.name]  # run as `python batch_infer.py`, in its folder
    argv = [sys.executable, *program, name, "1" if ignore_term else "0", str(LIFETIME_S), mode]
    if not orphan and owner is None:
        argv.append("vllm.entrypoints.openai.api_server")  # what makes the parent a vLLM API server
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=owner.parent if owner is not None else None)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    engine = Engine(pid, _start_ticks(pid), None if orphan and subreaper is None else proc)
    if orphan:
        adopter = 1 if subreaper is None else proc.pid
        if subreaper is None:
            proc.wait()
            proc.stdout.close()
        deadline = time.monotonic() + 30
        while engine.ppid() != adopter and time.monotonic() < deadline:  # re-parenting is immediate; be generous
            time.sleep(0.05)
    return engine


def _stop(engine: Engine) -> None:
    if engine.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine.pid, signal.SIGKILL)
    if engine.api_server is not None:
        engine.api_server.kill()
        engine.api_server.wait()
        if engine.api_server.stdout is not None:
            engine.api_server.stdout.close()


@contextlib.contextmanager
def orphaned_engine(name: str = "VLLM::EngineCore", *, ignore_term: bool = False) -> Iterator[Engine]:
    """A stand-in engine re-parented to pid 1 (its "API server" is gone)."""
    engine = _spawn(name, orphan=True, ignore_term=ignore_term)
    try:
        yield engine
    finally:
        _stop(engine)


@contextlib.contextmanager
def served_engine(name: str = "VLLM::EngineCore") -> Iterator[Engine]:
    """A stand-in engine whose parent is a live "API server"."""
    engine = _spawn(name, orphan=False, ignore_term=False)
    try:
        yield engine
    finally:
        _stop(engine)


@contextlib.contextmanager
def job_engine(script_dir: Path, name: str = "VLLM::EngineCore") -> Iterator[Engine]:
    """A stand-in engine whose parent is a live ``python batch_infer.py``, as vLLM's offline ``LLM(...)`` makes it."""
    script = script_dir / "batch_infer.py"
    script.write_text(_ENGINE)
    engine = _spawn(name, orphan=False, ignore_term=False, owner=script)
    try:
        yield engine
    finally:
        _stop(engine)


@contextlib.contextmanager
def adopted_engine(reaper_name: str = "", name: str = "VLLM::EngineCore") -> Iterator[Engine]:
    """A stand-in engine whose starter is gone, adopted by a live subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``).

    ``reaper_name`` sets the subreaper's kernel name (``tini`` stands in for a container's init);
    empty keeps ``python3``: a live parent of no known kind.
    """
    engine = _spawn(name, orphan=True, ignore_term=False, subreaper=reaper_name)
    try:
        yield engine
    finally:
        _stop(engine)
