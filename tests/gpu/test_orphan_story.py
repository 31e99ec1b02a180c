"""The orphaned-engine story end to end on a real GPU with a real vLLM (run by scripts/gpu-lifecycle.sh).

1. ``vllm_server`` launches a random 1B Llama (``GPUREADY_GPU_MODEL``, written by
   ``python tests/tiny_model.py --size 1b DIR``) and it becomes ready on the GPU;
2. the test kills the API server alone with SIGKILL, as an engineer's ``kill -9`` does: its
   ``VLLM::EngineCore`` lives on at parent pid 1, holding the GPU;
3. the built-in preflight's ``gpus_clean`` fails naming it, in the issue's words;
4. the same preflight with ``--gpu-reap-orphans`` stops it and passes; the GPU reads clean;
5. ``shm_clean`` names the ``sem.loky-<pid>-*`` the engine left, and ``--shm-remove-leftovers``
   removes it, so the fixture's teardown finds nothing of the server left.

Figures and texts go to $GPUREADY_GPU_REPORT (JSON, the key ``orphan_story``) when set. Skipped
without nvidia-smi, without vLLM, or without the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready import LocalHost, ServeArgs, ServerFactory, ServeSpec, check_gpus_clean, snapshot
from pytest_gpuready.host.orphans import find_orphans

MODEL = os.environ.get("GPUREADY_GPU_MODEL", "")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a real NVIDIA GPU (nvidia-smi not found)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM importable"),
    pytest.mark.skipif(not MODEL, reason="set GPUREADY_GPU_MODEL to a model directory (tests/tiny_model.py --size 1b)"),
]

COMMAND = f"{sys.executable} -m vllm.entrypoints.openai.api_server --enforce-eager --gpu-memory-utilization 0.5"
ORPHAN_LINE = re.compile(r"GPU 0: (\d+) MiB used, held by pid (\d+) \(([^,()]*EngineCore[^,()]*), an orphaned vLLM "
                         r"engine: its API server is gone, parent pid 1\) (\d+) MiB; stop it with: kill (\d+)")
PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-p", "no:cacheprovider", "-rA")


def _report(key: str, value: Any) -> None:
    target = os.environ.get("GPUREADY_GPU_REPORT")
    if not target:
        return
    path = Path(target)
    data = json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}
    data.setdefault("orphan_story", {})[key] = value
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def wait_until(predicate: Any, timeout_s: float, what: str) -> float:
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout_s:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def test_orphaned_engine_named_reaped_and_the_gpu_clean(vllm_server: ServerFactory, pytester: pytest.Pytester) -> None:
    spec = ServeSpec(model=MODEL, served_model_name="m1b", args=ServeArgs(max_model_len=4096), command=COMMAND)
    server = vllm_server(spec)
    assert server.footprint is not None
    _report("footprint", server.footprint.to_dict())
    _report("startup_s", server.ready.startup_s if server.ready else None)
    engines = [p for p in server.processes() if "VLLM::EngineCore" in f"{p.comm} {p.cmdline}"]
    assert len(engines) == 1, server.processes()
    engine_pid = engines[0].pid
    assert server.pid is not None

    os.kill(server.pid, signal.SIGKILL)  # the API server alone, as `kill -9 <api server>` does
    wait_until(lambda: not server.is_alive(), 60, "the API server to die")
    assert server.death() == "killed by SIGKILL"
    reparented_s = wait_until(
        lambda: [o.pid for o in find_orphans(snapshot(LocalHost(), reader="nvidia-smi"))] == [engine_pid], 60,
        "nvidia-smi to show the EngineCore orphaned")
    _report("orphan_seen_s", reparented_s)

    named = pytester.runpytest_subprocess(*PREFLIGHT, "-k", "gpus")
    named_text = named.stdout.str()
    _report("gpus_clean_without_option", [line for line in named.outlines if "GPU 0:" in line])
    match = ORPHAN_LINE.search(named_text)
    assert match is not None, named_text[-3000:]
    assert int(match.group(2)) == engine_pid == int(match.group(5))
    _report("orphan_name_as_the_driver_reports_it", match.group(3))
    named.assert_outcomes(failed=1)

    began = time.monotonic()
    reaped = pytester.runpytest_subprocess(*PREFLIGHT, "-k", "gpus", "--gpu-reap-orphans")
    _report("reap_run_s", time.monotonic() - began)
    _report("reap_output", [line for line in reaped.outlines if "gpuready:" in line or "PASSED" in line
                            or "FAILED" in line])
    reaped.stdout.fnmatch_lines([f"gpuready: stopped orphaned vLLM engines on local: pid {engine_pid} "
                                 "(*EngineCore*) * MiB on GPU 0*"])
    reaped.assert_outcomes(passed=1)
    after = snapshot(LocalHost(), reader="nvidia-smi")
    verdict = check_gpus_clean(after, gpus=[0])
    _report("after_reap", verdict.message)
    assert verdict.ok, verdict.message

    leftovers = pytester.runpytest_subprocess(*PREFLIGHT, "-k", "shm", "--shm-remove-leftovers")
    _report("shm_output", [line for line in leftovers.outlines if "shm" in line or "loky" in line])
    loky = [name for name in os.listdir("/dev/shm") if name.startswith(f"sem.loky-{engine_pid}-")]
    assert loky == [], f"left by the killed engine and not removed: {loky}"
