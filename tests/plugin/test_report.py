"""The reports of a run: the JSON report (validated against the shipped schema), the JUnit XML under
each junit_family with -W error, and the terminal summary (per-host tables, failed invariants,
red for dirty GPUs with --color=yes). The host is this machine with the labelled stand-in
nvidia-smi (CI has no GPU); the ssh tier runs the same reports for a fleet under xdist.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready.plugin.report_document import SCHEMA_PATH
from tests.report_schema import validate

Standin = Callable[[str], Path]
PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm", "-p", "no:cacheprovider")
"""The host preflight minus /dev/shm, whose outcome depends on this machine's real /dev/shm."""


@pytest.fixture(autouse=True)
def _no_host_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("GPUREADY_HOST", "GPUREADY_HOSTS_FILE", "GPUREADY_REPORT", "GPUREADY_JSON", "GPUREADY_PLOT"):
        monkeypatch.delenv(variable, raising=False)


def test_the_schema_ships_in_the_package() -> None:
    assert SCHEMA_PATH.parent.name == "plugin"
    from importlib.resources import files

    shipped = files("pytest_gpuready.plugin").joinpath("report.schema.json")
    assert json.loads(shipped.read_text())["title"] == "pytest-gpuready report"


def test_report_of_a_dirty_h200_validates_and_holds_the_evidence(pytester: pytest.Pytester,
                                                                  standin: Standin) -> None:
    standin("h200-one-process")
    path = pytester.path / "out" / "report.json"
    result = pytester.runpytest(*PREFLIGHT, "--gpuready-report", str(path))
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"gpuready: report written to {path}"])
    document = json.loads(path.read_text())
    validate(document)
    assert document["plugin"]["name"] == "pytest-gpuready"
    assert document["exit_status"] == 1
    assert document["workers"] == []
    [host] = document["hosts"]
    assert host["name"] == "local"
    assert host["driver_versions"] == ["580.159.04"]
    assert host["gpu_count"] == 1
    assert host["snapshot"]["gpus"][0]["memory_used_mib"] == 21007
    assert host["snapshot"]["processes"][0]["pid"] == 431
    outcomes = {t["nodeid"].rsplit("::", 1)[1]: t["outcome"] for t in document["tests"]}
    assert outcomes == {"test_gpus_are_clean": "failed", "test_gpu_topology": "passed"}
    failed = next(t for t in document["tests"] if t["outcome"] == "failed")
    assert failed["message"].startswith("1 of 1 GPUs on local are not clean")
    assert set(failed["durations"]) == {"setup", "call", "teardown"}
    [verdict] = [v for v in document["verdicts"] if v["name"] == "gpus_clean"]
    assert verdict["ok"] is False
    assert verdict["test"] == failed["nodeid"]
    assert verdict["host"] == "local"
    assert verdict["details"][0].startswith("GPU 0: 21007 MiB used, held by pid 431")
    assert verdict["evidence"], "the measured values travel with the verdict"
    assert document["timings"]["per_host"]["local"]["tests"] == 2


def test_junit_properties_under_every_family_with_warnings_as_errors(pytester: pytest.Pytester,
                                                                      standin: Standin) -> None:
    """The plugin appends to user_properties itself: no record_property warning under xunit2."""
    standin("h200-idle")
    for family in ("xunit1", "xunit2", "legacy"):
        junit = pytester.path / f"{family}.xml"
        result = pytester.runpytest(*PREFLIGHT, "-W", "error", "-o", f"junit_family={family}",
                                    f"--junitxml={junit}")
        result.assert_outcomes(passed=2)
        assert "warnings summary" not in result.stdout.str()
        cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}
        properties = {p.get("name"): p.get("value") for p in cases["test_gpus_are_clean"].iter("property")}
        assert str(properties["gpuready.gpus_clean"]).startswith("1 GPUs on local are clean"), family
        assert ("file" in cases["test_gpus_are_clean"].attrib) == (family != "xunit2")


def test_terminal_summary_has_a_table_per_host_and_a_line_per_failure(
        pytester: pytest.Pytester, standin: Standin, monkeypatch: pytest.MonkeyPatch) -> None:
    standin("h200-one-process")
    monkeypatch.setenv("COLUMNS", "120")  # wider than the summary's 100 columns
    result = pytester.runpytest(*PREFLIGHT, "--color=no")
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "gpuready: GPUs on local, driver 580.159.04" in line)
    assert lines[start + 1] == "GPU  Name         Used / Total MiB  Memory                  Processes"
    # pid 431 is the capture's; "(gone)" follows when no process 431 runs on this machine
    assert lines[start + 2].startswith("0    NVIDIA H200    21007 / 143771  [###.................]  431 python3 "
                                       "20998 MiB")
    result.stdout.fnmatch_lines([
        "*= gpuready: failed invariants =*",
        "local  gpus_clean: 1 of 1 GPUs on local are not clean (tolerance 64 MiB) (+1 more)",
    ])
    failures = next(i for i, line in enumerate(lines) if "gpuready: failed invariants" in line)
    assert all(len(line) <= 100 for line in lines[start:start + 3] + lines[failures:failures + 2])


def test_dirty_gpus_are_red_with_color(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("rtx8-tp4-loaded")
    result = pytester.runpytest(*PREFLIGHT, "--color=yes", "-W", "default")
    red = "\x1b[31m"
    busy = [line for line in result.outlines if "NVIDIA RTX PRO 6000" in line and "[#" in line]
    idle = [line for line in result.outlines if "NVIDIA RTX PRO 6000" in line and "[...." in line]
    assert len(busy) == 4
    assert all(red in line for line in busy)
    assert len(idle) == 4
    assert not any(red in line for line in idle)


def test_the_old_option_name_still_writes_the_report_and_says_it_is_deprecated(
        pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    path = pytester.path / "figures.json"
    result = pytester.runpytest(*PREFLIGHT, f"--gpuready-json={path}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gpuready: DeprecationWarning: --gpuready-json is deprecated: use --gpuready-report "
                                 "PATH*"])
    validate(json.loads(path.read_text()))


def test_the_deprecation_is_a_line_even_where_warnings_are_errors(pytester: pytest.Pytester, standin: Standin) -> None:
    """This repository's own ``filterwarnings = error`` once turned the deprecation into an INTERNALERROR."""
    standin("h200-idle")
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    path = pytester.path / "figures.json"
    result = pytester.runpytest(*PREFLIGHT, f"--gpuready-json={path}")
    assert result.ret == 0, result.outlines
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["gpuready: DeprecationWarning: --gpuready-json is deprecated*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    validate(json.loads(path.read_text()))


def test_two_report_paths_and_plots_without_matplotlib_are_usage_errors(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--gpuready-report", "a.json", "--gpuready-json", "b.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuready-json 'b.json' and --gpuready-report 'a.json' name two files*"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were not installed
    result = pytester.runpytest("--gpuready-plot", "plots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuready-plot needs matplotlib: pip install 'pytest-gpuready[plot]'"])


def test_no_report_is_written_unless_asked(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    result = pytester.runpytest(*PREFLIGHT)
    result.assert_outcomes(passed=2)
    assert "report written" not in result.stdout.str()
    assert list(pytester.path.glob("*.json")) == []


def test_a_host_probed_for_the_header_is_in_the_report_when_no_test_runs(
        pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    path = pytester.path / "report.json"
    result = pytester.runpytest("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "no_such_test",
                                "-p", "no:cacheprovider", f"--gpuready-report={path}")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    document = json.loads(path.read_text())
    validate(document)
    assert document["tests"] == []
    [host] = document["hosts"]
    assert host["probed"] is True
    assert host["snapshot"]["gpus"][0]["name"] == "NVIDIA H200"
