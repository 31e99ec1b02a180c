"""Baseline options and the comparison of ``benchmark_serving`` results with the stored ones.

``--gpuready-baseline PATH`` compares every level a ``benchmark_serving`` call measures with the
runs stored under the same id (test, server, concurrency); ``--gpuready-baseline-save`` adds this
run's levels to the file as one more run each; ``--gpuready-baseline-min-runs N`` is how many runs
a level needs before a change is called; ``--gpuready-compare-fail output_tok_s:5%,...`` sets
the tolerances; ``--gpuready-github-benchmark DIR`` exports every level for
github-action-benchmark. The decision per level is :mod:`pytest_gpuready.serve.regression`'s.

Where things happen, so the file is written once under xdist:

* in the process that runs the test: the comparison (:class:`BenchComparison`), kept pending on
  the test and asserted at the end of its call (:func:`pytest_runtest_call`) unless the test
  asserted it itself (``bench.expect_no_regression(...)``); what it found goes into the test's
  ``benchmarks`` report entry and its JUnit properties;
* in the process that sees every report (the xdist controller, or the only process):
  :class:`BaselineCollector` reads those entries, writes the baseline file and the
  github-action-benchmark JSON at the end of the session, and prints the comparison table.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.errors import ConfigError, GpuReadyError
from pytest_gpuready.host.clock_events import ClockEventRecord
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.options import (
    BASELINE_SETTINGS,
    GPUREADY_BASELINE,
    GPUREADY_BASELINE_MIN_RUNS,
    GPUREADY_BASELINE_SAVE,
    GPUREADY_COMPARE_FAIL,
    GPUREADY_GITHUB_BENCHMARK,
)
from pytest_gpuready.plugin.recording import CURRENT_ITEM_KEY, PAYLOAD_ATTRIBUTE, plain, record
from pytest_gpuready.plugin.summary import MAX_WIDTH, fit
from pytest_gpuready.serve import baseline as store
from pytest_gpuready.serve.bench import BenchResult
from pytest_gpuready.serve.compare import (
    DEFAULT_MIN_RUNS,
    HIGHER,
    METRIC_BY_NAME,
    METRICS,
    Tolerances,
    parse_percent,
    rounds_needed,
    samples_of,
)
from pytest_gpuready.serve.regression import LevelComparison, judge_level
from pytest_gpuready.serve.spec import ServeSpec

DEFAULT_BASELINE_ROUNDS = rounds_needed()
"""Rounds per level when a baseline is used and the test names none: the fewest with which the
rank test can reach p < 0.002 (7)."""

_STATE_KEY = pytest.StashKey["BaselineState"]()
_PENDING_KEY = pytest.StashKey[list["BenchComparison"]]()


@dataclass
class BaselineState:
    """The session's baseline: where, whether to save, what the file held at the start."""

    path: Path | None
    save: bool
    tolerances: dict[str, float] | None
    min_runs: int = DEFAULT_MIN_RUNS
    levels: dict[str, store.StoredLevel] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.path is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    s.add_settings(parser, BASELINE_SETTINGS)


def pytest_configure(config: pytest.Config) -> None:
    resolved = s.resolve_all(config, BASELINE_SETTINGS)
    raw = resolved["gpuready_baseline"]
    path = Path(config.invocation_params.dir, os.path.expanduser(raw)) if raw else None
    save = bool(resolved["gpuready_baseline_save"])
    if save and path is None:
        raise pytest.UsageError("--gpuready-baseline-save: give the file with --gpuready-baseline PATH")
    state = BaselineState(path, save, resolved["gpuready_compare_fail"], resolved["gpuready_baseline_min_runs"])
    if path is not None:
        source = _source(config, GPUREADY_BASELINE)
        if path.exists():
            try:
                state.levels = store.load(path)
            except store.BaselineFileError as exc:
                raise pytest.UsageError(f"{source} {raw!r}: {exc}") from None
        elif not save:
            raise pytest.UsageError(f"{source} {raw!r}: no such file (write it first with "
                                    "--gpuready-baseline-save)")
    config.stash[_STATE_KEY] = state
    if not hasattr(config, "workerinput") and config.pluginmanager.get_plugin(_COLLECTOR_NAME) is None:
        config.pluginmanager.register(BaselineCollector(config), _COLLECTOR_NAME)


def _source(config: pytest.Config, setting: s.Setting[Any]) -> str:
    """Where a resolved value came from, as the usage errors name it: the flag, ``$ENV`` or ``ini KEY``."""
    if config.getoption(setting.dest, default=None) is not None:
        return setting.flag
    return f"${setting.env}" if os.environ.get(setting.env) else f"ini {setting.ini}"


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin(_COLLECTOR_NAME)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)


def state_of(config: pytest.Config) -> BaselineState:
    state = config.stash.get(_STATE_KEY, None)
    return state if state is not None else BaselineState(None, False, None)


def rounds_for(config: pytest.Config, rounds: int | None) -> int:
    """The test's ``rounds``, else 7 with a baseline (the rank test needs them) and 1 without."""
    if rounds is not None:
        return rounds
    return DEFAULT_BASELINE_ROUNDS if state_of(config).active else 1


# ---------------------------------------------------------------- what a level is keyed on

def _gpus_of(snapshot: HostSnapshot | None, spec: ServeSpec) -> list[Any]:
    if snapshot is None or not snapshot.gpus or snapshot.no_gpu_reason is not None:
        return []
    wanted = set(spec.gpus) if spec.gpus is not None else None
    return [g for g in snapshot.gpus if wanted is None or g.index in wanted]


def comparability_key(spec: ServeSpec, snapshot: HostSnapshot | None, host: Host, vllm_version: str | None,
                      result: BenchResult, concurrency: int, requests: int) -> store.ComparabilityKey:
    """The key of one level; :class:`ConfigError` when the model's config cannot be read."""
    gpus = _gpus_of(snapshot, spec)
    names = sorted({g.name for g in gpus})
    drivers = sorted({g.driver_version for g in gpus if g.driver_version})
    return store.ComparabilityKey(
        gpu_model=" + ".join(names) if names else "no GPU",
        gpu_count=len(gpus),
        driver=", ".join(drivers) or None,
        vllm_version=vllm_version,
        model_name=os.path.basename(spec.model.rstrip("/")) or spec.model,
        model_config_sha256=store.model_config_sha256(spec.model, host),
        serve_args=store.serve_args_record(spec),
        concurrency=concurrency,
        prompt_tokens=result.prompt_tokens,
        output_tokens=result.output_tokens,
        requests=requests,
    )


def on_gpu(snapshot: HostSnapshot | None, spec: ServeSpec) -> bool:
    """Whether the server runs on GPUs the host's snapshot shows: then its levels' clock-event
    reasons must have been read for a comparison to count (on a CPU host there are none to read)."""
    return bool(_gpus_of(snapshot, spec))


# ---------------------------------------------------------------- the comparison of one benchmark

def tolerances_of(tolerance: str | float | None, metrics: Mapping[str, str | float]) -> dict[str, float]:
    """``expect_no_regression``'s arguments as fractions: ``"5%"`` or ``0.05``; unknown metric: ValueError."""

    def fraction(value: str | float, what: str) -> float:
        if isinstance(value, str):
            return parse_percent(value, what)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 10:
            raise ValueError(f"{what}: expected a percentage like '5%', a fraction like 0.05 or 'off', "
                             f"got {value!r}")
        return float(value)

    result: dict[str, float] = {}
    if tolerance is not None:
        result.update({metric.name: fraction(tolerance, "tolerance") for metric in METRICS})
    for name, value in metrics.items():
        if name not in METRIC_BY_NAME:
            raise ValueError(f"unknown metric {name!r}: expected one of {', '.join(METRIC_BY_NAME)}")
        result[name] = fraction(value, name)
    return result


@dataclass
class MeasuredLevel:
    """One level of this run, as the comparison and the saved baseline need it."""

    level: str
    concurrency: int
    samples: dict[str, list[float]]
    key: store.ComparabilityKey | None
    key_error: str | None
    clock_events: ClockEventRecord | None


class BenchComparison:
    """The levels of one ``benchmark_serving`` call against the baseline, pending until asserted."""

    def __init__(self, config: pytest.Config, context: str, levels: list[MeasuredLevel], on_gpu: bool,
                 entry: dict[str, Any] | None) -> None:
        self.config = config
        self.context = context
        self.levels = levels
        self.on_gpu = on_gpu
        self.entry = entry
        self.state = state_of(config)
        self.checked = False
        self.finalized = False
        self.comparisons: list[LevelComparison] = self.judge(None)

    def judge(self, per_test: Tolerances | None, min_runs: int | None = None) -> list[LevelComparison]:
        """Every level's verdict: ``per_test`` tolerances over the options', ``min_runs`` over the option's."""
        judged = []
        for measured in self.levels:
            if measured.key is None:
                judged.append(LevelComparison(measured.level, measured.concurrency, "not comparable",
                                              f"the level's key could not be made: {measured.key_error}"))
                continue
            judged.append(judge_level(measured.level, measured.concurrency, measured.key, measured.samples,
                                      measured.clock_events, self.state.levels.get(measured.level),
                                      per_test, self.state.tolerances, on_gpu=self.on_gpu,
                                      min_runs=min_runs if min_runs is not None else self.state.min_runs))
        return judged

    def saving(self, comparison: LevelComparison) -> bool:
        """Whether this run is added to the level: with --gpuready-baseline-save, when it passed, had
        nothing to compare with, or was undecided only for want of runs (how a baseline grows);
        never a regressed, throttled or otherwise undecided level."""
        measured = next(m for m in self.levels if m.level == comparison.level)
        return self.state.save and measured.key is not None and (
            comparison.verdict in ("ok", "improved", "no baseline", "not comparable") or comparison.growing)

    def failures(self) -> list[LevelComparison]:
        return [c for c in self.comparisons if not c.ok and not self.saving(c)]

    def message(self) -> str:
        failed = self.failures()
        regressed = sum(1 for c in failed if c.verdict == "regressed")
        head = (f"{regressed} of {len(self.comparisons)} levels regressed" if regressed
                else f"{len(failed)} of {len(self.comparisons)} levels could not be compared (not a pass)")
        lines = [f"baseline comparison ({self.state.path}): {head} ({self.context})"]
        lines += [f"  {c.line()}" for c in self.comparisons]
        return "\n".join(lines)

    def expect(self, per_test: Tolerances | None, min_runs: int | None = None) -> list[LevelComparison]:
        """Judge with ``per_test`` tolerances and ``min_runs`` (over the options'), record, fail unless
        every level passes."""
        __tracebackhide__ = True
        self.comparisons = self.judge(per_test, min_runs)
        self.checked = True
        self.finalize()
        if self.failures():
            pytest.fail(self.message(), pytrace=False)
        return self.comparisons

    def finalize(self) -> None:
        """Put the comparison into the test's report entry and JUnit properties (once, with its final tolerances)."""
        if self.entry is not None:
            self.entry["comparison"] = plain(self.to_dict())
        if self.finalized:
            return
        self.finalized = True
        for comparison in self.comparisons:
            prefix = f"baseline.c{comparison.concurrency}"
            record(self.config, f"{prefix}.verdict", comparison.verdict)
            record(self.config, f"{prefix}.reason", comparison.reason)
            head = comparison.headline()
            if head is not None:
                record(self.config, f"{prefix}.{head.name}.change", round(head.change, 4))
                record(self.config, f"{prefix}.{head.name}.p_value", head.p_value)
                record(self.config, f"{prefix}.{head.name}.effect_size", round(head.effect_size, 3))

    def to_dict(self) -> dict[str, Any]:
        levels = []
        for measured, comparison in zip(self.levels, self.comparisons, strict=True):
            stored = self.state.levels.get(measured.level)
            levels.append({
                **comparison.to_dict(),
                "saved": self.saving(comparison),
                "key": measured.key.to_dict() if measured.key is not None else None,
                "samples": measured.samples,
                "clock_events": measured.clock_events.to_dict() if measured.clock_events is not None else None,
                "baseline_samples": stored.pooled() if stored is not None else None,
            })
        return {"baseline": str(self.state.path) if self.state.path else None, "save": self.state.save,
                "levels": levels}


def start_comparison(config: pytest.Config, comparison: BenchComparison) -> None:
    """Keep ``comparison`` pending on the running test: asserted at the end of its call."""
    item = config.stash.get(CURRENT_ITEM_KEY, None)
    if item is not None:
        item.stash.setdefault(_PENDING_KEY, []).append(comparison)


def measured_levels(result: BenchResult, test: str, server: str, occurrence: int, spec: ServeSpec,
                    snapshot: HostSnapshot | None, host: Host, vllm_version: str | None) -> list[MeasuredLevel]:
    levels = []
    for index, level in enumerate(result.levels):
        requests = result.requests[index] if index < len(result.requests) else level.completed + level.failed
        key: store.ComparabilityKey | None = None
        key_error = None
        try:
            key = comparability_key(spec, snapshot, host, vllm_version, result, level.concurrency, requests)
        except (ConfigError, GpuReadyError) as exc:
            key_error = str(exc)
        levels.append(MeasuredLevel(store.level_id(test, server, level.concurrency, occurrence), level.concurrency,
                                    samples_of(result.rounds_at(level.concurrency)), key, key_error,
                                    level.clock_events))
    return levels


def next_occurrence(config: pytest.Config, server: str) -> int:
    """1 for a test's first benchmark of ``server``, 2 for its second, ..."""
    item = config.stash.get(CURRENT_ITEM_KEY, None)
    if item is None:
        return 1
    return 1 + sum(1 for c in item.stash.get(_PENDING_KEY, []) if c.context == server)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """At the end of a test's call: record every comparison, and fail on one the test did not assert."""
    try:
        yield
    except BaseException:
        for comparison in item.stash.get(_PENDING_KEY, []):
            comparison.finalize()
        raise
    failed = []
    for comparison in item.stash.get(_PENDING_KEY, []):
        comparison.finalize()
        if not comparison.checked and comparison.failures():
            failed.append(comparison.message())
    item.stash[_PENDING_KEY] = []
    if failed:
        pytest.fail("\n".join(failed), pytrace=False)


# ---------------------------------------------------------------- the controller: file, export, table

_COLLECTOR_NAME = "gpuready-baseline-collector"


class BaselineCollector:
    """Gathers the compared levels from every test report; writes the file, the export and the table."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.benchmarks: list[dict[str, Any]] = []
        self.written: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, PAYLOAD_ATTRIBUTE, None)
        if not isinstance(payload, dict):
            return
        for section, entry in payload.get("entries") or []:
            if section == "benchmarks" and isinstance(entry, dict):
                self.benchmarks.append(entry)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        state = state_of(self.config)
        if state.save and state.path is not None:
            self._save(state)
        raw = GPUREADY_GITHUB_BENCHMARK.get(self.config)
        if raw:
            directory = Path(self.config.invocation_params.dir, os.path.expanduser(raw))
            for path in write_github_benchmark(self.benchmarks, directory):
                self.written.append(f"gpuready: github-action-benchmark JSON written to {path}")

    def _save(self, state: BaselineState) -> None:
        assert state.path is not None
        try:
            levels = store.load(state.path) if state.path.exists() else {}
        except store.BaselineFileError:
            levels = dict(state.levels)
        saved = 0
        held: set[int] = set()
        for bench in self.benchmarks:
            for level in (bench.get("comparison") or {}).get("levels") or []:
                if not level.get("saved") or level.get("key") is None:
                    continue
                key = store.ComparabilityKey.from_dict(level["key"])
                run = store.StoredRun(level["samples"], store.now_iso(), level.get("clock_events"))
                kept = levels.get(str(level["level"]))
                stored = kept.with_run(key, run) if kept is not None else store.StoredLevel(key, (run,))
                levels[str(level["level"])] = stored
                held.add(len(stored.runs))
                saved += 1
        if saved:
            store.save(state.path, levels)
        holds = (f" (each now holds {'/'.join(map(str, sorted(held)))} of up to {store.MAX_RUNS_KEPT} runs)"
                 if held else "")
        self.written.append(f"gpuready: baseline {state.path}: {saved} level{'' if saved == 1 else 's'} saved{holds}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        rows = comparison_rows(self.benchmarks)
        if rows:
            rule = min(MAX_WIDTH, self.config.get_terminal_writer().fullwidth)
            terminalreporter.write_sep("=", f"gpuready: baseline comparison ({state_of(self.config).path})",
                                       fullwidth=rule)
            for text, bad in rows:
                terminalreporter.write_line(text, red=bad)
        for line in self.written:
            terminalreporter.write_line(line)


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"


def comparison_rows(benchmarks: Sequence[Mapping[str, Any]], width: int = MAX_WIDTH) -> list[tuple[str, bool]]:
    """The table: test and server, level, baseline runs, metric, baseline, now, change, verdict (each
    line fits ``width``)."""
    body: list[tuple[list[str], bool]] = []
    for bench in benchmarks:
        for level in (bench.get("comparison") or {}).get("levels") or []:
            head = _headline(level.get("metrics") or [])
            test = str(bench.get("test", "")).rsplit("::", 1)[-1]
            runs = int(level.get("baseline_runs") or 0)
            cells = [f"{test} {bench.get('server')}", f"c{level.get('concurrency')}", str(runs) if runs else "-"]
            verdict = str(level.get("verdict")) + (", saved" if level.get("saved") else "")
            if head is not None:
                change, metric = head.get("change"), METRIC_BY_NAME.get(str(head["metric"]))
                unit = str(head.get("unit", ""))
                cells += [metric.label if metric is not None else str(head["metric"]),
                          _number(head.get("baseline"), unit), _number(head.get("now"), unit),
                          f"{change:+.1%}" if change is not None else "-", f"{verdict} (p={head.get('p_value'):.2g})"]
            else:
                cells += ["-", "-", "-", "-", f"{verdict}: {level.get('reason')}"]
            body.append((cells, not level.get("ok") and not level.get("saved")))
    if not body:
        return []
    header = ["test, server", "level", "runs", "metric", "baseline", "now", "change", "verdict"]
    rows = [(header, False), *body]
    columns = len(header)
    widths = [max(len(r[0][i]) for r in rows) for i in range(columns)]
    # the test and server column gives way, so the figures and the verdict keep their room
    widths[0] = max(12, min(widths[0], width - sum(widths[1:]) - 2 * (columns - 1)))
    lines = []
    for cells, bad in rows:
        parts = [fit(cells[0], widths[0]).ljust(widths[0]), cells[1].ljust(widths[1]), cells[2].rjust(widths[2]),
                 cells[3].ljust(widths[3]), *(cells[i].rjust(widths[i]) for i in (4, 5, 6)), cells[7]]
        lines.append((fit("  ".join(parts), width), bad))
    return lines


def _headline(metrics: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for wanted in ("regressed", "undecided", "improved"):
        for metric in metrics:
            if metric.get("verdict") == wanted:
                return metric
    return next((m for m in metrics if m.get("metric") == "output_tok_s"), metrics[0] if metrics else None)


# ---------------------------------------------------------------- github-action-benchmark

_POOLED = {"output_tok_s": "output_throughput", "req_s": "request_throughput", "ttft_p50": "median_ttft_ms",
           "ttft_p99": "p99_ttft_ms", "itl_p50": "median_itl_ms", "itl_p99": "p99_itl_ms",
           "e2el_p50": "median_e2el_ms", "e2el_p99": "p99_e2el_ms"}


def github_benchmark_entries(
        benchmarks: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(bigger-is-better, smaller-is-better) entries ``{name, unit, value, range?, extra?}``.

    The value is the median over the rounds where the level kept them (``range``: half the spread
    of the rounds), else the pooled figure; ``extra`` carries the baseline verdict when there was one.
    """
    bigger: list[dict[str, Any]] = []
    smaller: list[dict[str, Any]] = []
    for bench in benchmarks:
        compared = {int(level["concurrency"]): level for level in (bench.get("comparison") or {}).get("levels") or []}
        for level in bench.get("levels") or []:
            concurrency = int(level["max_concurrency"])
            kept = compared.get(concurrency)
            for metric in METRICS:
                samples = (kept or {}).get("samples", {}).get(metric.name) if kept else None
                if samples:
                    value = float(statistics.median(samples))
                elif _POOLED[metric.name] in level:
                    value = float(level[_POOLED[metric.name]])
                else:
                    continue
                entry: dict[str, Any] = {"name": f"{bench.get('test')} | {bench.get('server')} | c{concurrency} | "
                                                 f"{metric.label}", "unit": metric.unit, "value": value}
                if samples and len(samples) > 1:
                    entry["range"] = f"± {(max(samples) - min(samples)) / 2:.4g}"
                if kept is not None:
                    mine = next((m for m in kept.get("metrics") or [] if m.get("metric") == metric.name), None)
                    extra = f"baseline: {kept.get('verdict')}"
                    if mine is not None and mine.get("change") is not None:
                        extra += f", {mine['change']:+.1%}, p={mine['p_value']:.2g}"
                    entry["extra"] = extra
                (bigger if metric.better == HIGHER else smaller).append(entry)
    return bigger, smaller


def write_github_benchmark(benchmarks: Sequence[Mapping[str, Any]], directory: Path) -> list[Path]:
    bigger, smaller = github_benchmark_entries(benchmarks)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, entries in (("bigger-is-better.json", bigger), ("smaller-is-better.json", smaller)):
        path = directory / name
        partial = path.with_name(f".{name}.partial")
        partial.write_text(json.dumps(entries, indent=1) + "\n")
        partial.replace(path)
        written.append(path)
    return written


__all__ = [
    "BASELINE_SETTINGS",
    "DEFAULT_BASELINE_ROUNDS",
    "GPUREADY_BASELINE",
    "GPUREADY_BASELINE_MIN_RUNS",
    "GPUREADY_BASELINE_SAVE",
    "GPUREADY_COMPARE_FAIL",
    "GPUREADY_GITHUB_BENCHMARK",
    "BenchComparison",
    "LevelComparison",
    "comparability_key",
    "comparison_rows",
    "github_benchmark_entries",
    "measured_levels",
    "on_gpu",
    "rounds_for",
    "start_comparison",
    "state_of",
    "tolerances_of",
]
