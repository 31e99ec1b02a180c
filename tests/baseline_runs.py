"""One gated benchmark run against a running vLLM server, as CI would run it: a pytest process of its own.

Shared by the vllm tier's baseline tests (tests/vllm/test_baseline.py) and the false-alarm
benchmark (benchmarks/bench_baseline_noise.py): :func:`run_gate` writes a one-test file that
benchmarks the server at ``--vllm-url`` under a declared :class:`ServeSpec` (what the key records),
runs it with ``--gpuready-baseline`` and returns the exit status, the output and the JSON report's
comparison of each level.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpuready import ServeSpec

GATE_TEST = '''
import json
import os

from pytest_gpuready import ServeSpec
from pytest_gpuready.model.serve_args import ServeArgs

_SPEC = json.loads(os.environ["GPUREADY_GATE_SPEC"])
SPEC = ServeSpec(**{**_SPEC, "args": ServeArgs(**_SPEC["args"])})
WORKLOAD = json.loads(os.environ["GPUREADY_GATE_WORKLOAD"])
if isinstance(WORKLOAD.get("requests"), dict):  # JSON keys are strings; run_benchmark's are concurrencies
    WORKLOAD["requests"] = {int(k): v for k, v in WORKLOAD["requests"].items()}


def test_serving_gate(vllm_server, benchmark_serving):
    benchmark_serving(vllm_server(SPEC), **WORKLOAD)
'''

WORKLOAD: dict[str, Any] = {"concurrency": [1, 8], "prompt_tokens": 16, "output_tokens": 16,
                            "requests": 8, "warmup": 1}
"""Small enough for a 2-core machine: 7 rounds of 8 requests at each level."""


@dataclass
class GateRun:
    returncode: int
    output: str
    report: dict[str, Any]
    junit: Path

    @property
    def levels(self) -> list[dict[str, Any]]:
        """The comparison of each level (``verdict``, ``reason``, ``metrics``...), in measured order."""
        return [level for bench in self.report.get("benchmarks", [])
                for level in (bench.get("comparison") or {}).get("levels", [])]

    def verdicts(self) -> dict[int, str]:
        return {int(level["concurrency"]): str(level["verdict"]) for level in self.levels}

    def level(self, concurrency: int) -> dict[str, Any]:
        return next(level for level in self.levels if level["concurrency"] == concurrency)


def spec_kwargs(spec: ServeSpec) -> dict[str, Any]:
    """``spec`` as the keyword arguments that rebuild it (JSON data)."""
    data = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    data["env"] = dict(spec.env)
    data["args"] = {f.name: getattr(spec.args, f.name) for f in dataclasses.fields(spec.args)}
    data["args"]["extra_args"] = list(spec.args.extra_args)
    data["gpus"] = list(spec.gpus) if spec.gpus is not None else None
    return data


def run_gate(workdir: Path, url: str, spec: ServeSpec, baseline: Path, *options: str,
             workload: Mapping[str, Any] | None = None, name: str = "run", timeout_s: float = 900) -> GateRun:
    """Run the gate once in ``workdir`` (its report is ``NAME.json``); ``options`` are added to pytest's."""
    workdir.mkdir(parents=True, exist_ok=True)
    test_file = workdir / "test_gate.py"
    test_file.write_text(GATE_TEST)
    report = workdir / f"{name}.json"
    junit = workdir / f"{name}.xml"
    env = {**os.environ, "GPUREADY_GATE_SPEC": json.dumps(spec_kwargs(spec)),
           "GPUREADY_GATE_WORKLOAD": json.dumps(dict(workload or WORKLOAD))}
    argv: Sequence[str] = [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider", "-rA",
                           "--vllm-url", url, f"--gpuready-baseline={baseline}", f"--gpuready-report={report}",
                           f"--junitxml={junit}", *options]
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    data = json.loads(report.read_text()) if report.exists() else {}
    return GateRun(done.returncode, done.stdout + done.stderr, data, junit)
