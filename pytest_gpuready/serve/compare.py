"""A benchmark level against its baseline: which way each metric is better, how far is too far,
and a decision that survives noise, within a run and between runs.

A baseline keeps several runs of a level (each with its rounds). Per metric, with the runs'
medians and the rounds of this run:

* the change is this run's median over its rounds against the baseline's centre (the geometric
  mean of its runs' medians), in the worse direction: for a metric where higher is better (output
  tok/s, request/s) ``baseline / now``, for one where lower is better (TTFT, ITL, E2E latency, p50
  and p99) ``now / baseline``;
* a metric *regressed* when all three hold:

  1. that factor exceeds ``1 + tolerance`` (default 10%: asv's 1.1, CodSpeed's 10%);
  2. the two-sided Mann-Whitney U test of this run's rounds against the baseline's (all runs
     pooled) gives p < 0.002 (asv's rule): not one stray round;
  3. this run is outside the spread of the baseline's runs: the one-sided Student-t prediction
     test over their medians gives p < 0.01 (Bencher's t-test threshold, :mod:`.spread`): not the
     shift every run of an unchanged server shows. It needs 3 runs or more;

  *improved* likewise the other way; otherwise the metric is ``ok`` and :attr:`MetricComparison.note`
  says which condition held it back;
* a factor beyond the tolerance that cannot be decided is *undecided* (the gate says so rather
  than passing): too few rounds for the rank test ever to reach p < 0.002 (fewer than 7 + 7 with
  one baseline run), or a baseline of fewer runs than ``min_runs`` (3 by default; 1 or 2 accept
  the rank test alone, as asv does).

Pure: samples in, :class:`MetricComparison` out (the fixture and the reports render it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gpuready.serve.bench import LevelResult
from pytest_gpuready.serve.ranktest import mann_whitney_u, min_p_value
from pytest_gpuready.serve.spread import RUN_P_THRESHOLD, SPREAD_RUNS, run_centre, run_spread

DEFAULT_TOLERANCE = 0.10
P_THRESHOLD = 0.002
DEFAULT_MIN_RUNS = SPREAD_RUNS
"""Baseline runs a level needs before the gate decides: the fewest the run-to-run spread is judged from."""
HIGHER = "higher"
LOWER = "lower"


@dataclass(frozen=True)
class Metric:
    """One compared figure of a level: how to read it from a round, its unit, which way is better."""

    name: str
    label: str
    unit: str
    better: str
    read: Callable[[LevelResult], float]


METRICS: tuple[Metric, ...] = (
    Metric("output_tok_s", "output tok/s", "tok/s", HIGHER, lambda r: r.output_throughput),
    Metric("req_s", "request/s", "req/s", HIGHER, lambda r: r.request_throughput),
    Metric("ttft_p50", "TTFT p50", "ms", LOWER, lambda r: r.ttft.median_ms),
    Metric("ttft_p99", "TTFT p99", "ms", LOWER, lambda r: r.ttft.p99_ms),
    Metric("itl_p50", "ITL p50", "ms", LOWER, lambda r: r.itl.median_ms),
    Metric("itl_p99", "ITL p99", "ms", LOWER, lambda r: r.itl.p99_ms),
    Metric("e2el_p50", "E2E p50", "ms", LOWER, lambda r: r.e2el.median_ms),
    Metric("e2el_p99", "E2E p99", "ms", LOWER, lambda r: r.e2el.p99_ms),
)
METRIC_BY_NAME: dict[str, Metric] = {metric.name: metric for metric in METRICS}

Tolerances = Mapping[str, float]
"""Metric name -> tolerance as a fraction (0.05 for 5%); metrics not named get the default."""


NOT_GATED = math.inf
"""The tolerance ``off``: the metric is compared and recorded, never a regression."""


def parse_percent(text: str, what: str) -> float:
    """``5%`` -> 0.05 (a number > 0 followed by ``%``); ``off`` -> :data:`NOT_GATED`."""
    raw = text.strip()
    if raw.lower() == "off":
        return NOT_GATED
    if not raw.endswith("%"):
        raise ValueError(f"{what}: expected a percentage like 5%, or off, got {raw!r}")
    try:
        value = float(raw[:-1])
    except ValueError:
        raise ValueError(f"{what}: expected a percentage like 5%, or off, got {raw!r}") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{what}: expected a percentage > 0, got {raw!r}")
    return value / 100.0


def parse_tolerances(text: str) -> dict[str, float]:
    """``output_tok_s:5%,ttft_p99:20%`` -> ``{"output_tok_s": 0.05, "ttft_p99": 0.2}``.

    A bare percentage (``15%``) sets every metric; a later entry wins over an earlier one; ``off``
    (``itl_p50:off``) compares and records a metric without ever calling it regressed.
    """
    tolerances: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if ":" not in part:
            value = parse_percent(part, "tolerance")
            tolerances.update({metric.name: value for metric in METRICS})
            continue
        name, _, percent = part.partition(":")
        name = name.strip()
        if name not in METRIC_BY_NAME:
            raise ValueError(f"unknown metric {name!r}: expected one of {', '.join(METRIC_BY_NAME)}")
        tolerances[name] = parse_percent(percent, name)
    if not tolerances:
        raise ValueError("expected METRIC:PERCENT[,...] like output_tok_s:5%,ttft_p99:20%")
    return tolerances


def tolerance_of(name: str, *layers: Tolerances | None) -> float:
    """The tolerance of ``name``: the first layer that names it (per test, then options), else 10%."""
    for layer in layers:
        if layer and name in layer:
            return float(layer[name])
    return DEFAULT_TOLERANCE


def samples_of(rounds: Sequence[LevelResult]) -> dict[str, list[float]]:
    """Every metric's value in each round: what a baseline stores and the rank test compares."""
    return {metric.name: [float(metric.read(r)) for r in rounds] for metric in METRICS}


@dataclass(frozen=True)
class MetricComparison:
    """One metric of one level, baseline against now."""

    name: str
    better: str
    unit: str
    baseline: float
    """The baseline's centre: the geometric mean of its runs' medians (one run: its median)."""
    now: float
    """This run's median over its rounds."""
    tolerance: float
    p_value: float
    """Two-sided Mann-Whitney U of this run's rounds against the baseline's (runs pooled)."""
    effect_size: float
    """Rank-biserial correlation of now against the baseline (+1: every round now above every
    baseline round)."""
    rounds: tuple[int, int]
    """(baseline rounds, every run pooled; rounds now)."""
    verdict: str
    """``ok``, ``regressed``, ``improved`` or ``undecided``."""
    runs: int = 1
    """Baseline runs compared with."""
    run_p_value: float | None = None
    """One-sided p of this run against the spread of the baseline's runs (the worse side, or the
    better side for an improvement); None with fewer than 3 runs."""
    detectable: float | None = None
    """The smallest worse change this baseline calls (signed: -0.23 for a throughput, +0.4 for a
    latency): the tolerance or the spread's bound, whichever is further; None below 3 runs."""
    note: str = ""
    """Why the verdict is what it is (see :func:`compare_metric`)."""

    @property
    def change(self) -> float:
        """Relative change of the median, signed as the metric moves: -0.23 is 23% lower."""
        return self.now / self.baseline - 1.0 if self.baseline else math.inf

    @property
    def factor(self) -> float:
        """How many times worse (> 1) or better (< 1) now is, in the metric's direction."""
        if self.baseline <= 0 or self.now <= 0:
            return 1.0 if self.baseline == self.now else math.inf  # nothing to compare (no ITL of 1 token)
        return self.baseline / self.now if self.better == HIGHER else self.now / self.baseline

    def describe(self) -> str:
        """``output tok/s 812.4 -> 402.1 tok/s (-50.5%, factor 2.02 > 1.10; rounds p=0.0006, r=-1.00,
        21+7; 3 runs, spread p=0.0003, calls beyond -23.1%)``."""
        label = METRIC_BY_NAME[self.name].label if self.name in METRIC_BY_NAME else self.name
        if math.isinf(self.tolerance):
            return (f"{label} {self.baseline:.4g} -> {self.now:.4g} {self.unit} ({self.change:+.1%}; not gated, "
                    f"{self.runs} run{'' if self.runs == 1 else 's'})")
        relation = ">" if self.factor > 1 + self.tolerance else "<="
        runs = f"{self.runs} run{'' if self.runs == 1 else 's'}"
        if self.run_p_value is not None:
            runs += f", spread p={self.run_p_value:.2g}"
        if self.detectable is not None:
            runs += f", calls beyond {self.detectable:+.1%}"
        text = (f"{label} {self.baseline:.4g} -> {self.now:.4g} {self.unit} ({self.change:+.1%}, "
                f"factor {self.factor:.2f} {relation} {1 + self.tolerance:.2f}; rounds p={self.p_value:.2g}, "
                f"r={self.effect_size:+.2f}, {self.rounds[0]}+{self.rounds[1]}; {runs})")
        return f"{text}: {self.note}" if self.note else text

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.name, "better": self.better, "unit": self.unit, "baseline": self.baseline,
                "now": self.now, "change": self.change if math.isfinite(self.change) else None,
                "factor": self.factor if math.isfinite(self.factor) else None,
                "tolerance": self.tolerance if math.isfinite(self.tolerance) else None,
                "p_value": self.p_value, "effect_size": self.effect_size,
                "baseline_rounds": self.rounds[0], "rounds": self.rounds[1], "verdict": self.verdict,
                "baseline_runs": self.runs, "run_p_value": self.run_p_value, "detectable": self.detectable,
                "note": self.note}


WITHIN_TOLERANCE = "within the tolerance"
NOT_GATED_NOTE = "not gated (tolerance off)"
WITHIN_ROUNDS = "within the noise of the rounds"
WITHIN_SPREAD = "within the run-to-run spread of the baseline's runs"
TOO_FEW_ROUNDS = "too few rounds"
TOO_FEW_RUNS = "too few baseline runs"
SPREAD_NOT_JUDGED = "run-to-run spread not judged"


def compare_metric(metric: Metric, baseline_runs: Sequence[Sequence[float]], now: Sequence[float],
                   tolerance: float, min_runs: int = DEFAULT_MIN_RUNS,
                   p_threshold: float = P_THRESHOLD) -> MetricComparison:
    """The rule of the module docstring for one metric: ``baseline_runs`` are the stored runs'
    rounds (oldest first), ``now`` this run's rounds."""
    runs = [list(r) for r in baseline_runs if r]
    if not runs or not now:
        raise ValueError(f"{metric.name}: no rounds to compare ({len(runs)} baseline runs, {len(now)} rounds now)")
    if min_runs < 1:
        raise ValueError(f"min_runs {min_runs!r}: expected a whole number >= 1")
    pooled = [value for run in runs for value in run]
    test = mann_whitney_u(now, pooled)
    medians = [statistics.median(run) for run in runs]
    now_median = statistics.median(now)
    spread = run_spread(medians, metric.better == HIGHER) if len(runs) >= SPREAD_RUNS else None
    detectable = None
    if spread is not None and math.isfinite(tolerance):
        edge = spread.worse_bound()
        tolerated = spread.centre / (1.0 + tolerance) if metric.better == HIGHER else spread.centre * (1.0 + tolerance)
        bound = min(edge, tolerated) if metric.better == HIGHER else max(edge, tolerated)
        detectable = bound / spread.centre - 1.0 if spread.centre else None
    result = MetricComparison(metric.name, metric.better, metric.unit, run_centre(medians), now_median, tolerance,
                              test.p_value, test.effect_size, (len(pooled), len(now)), "ok", len(runs), None,
                              detectable, WITHIN_TOLERANCE)
    if math.isinf(tolerance):
        return replace(result, note=NOT_GATED_NOTE)
    limit = 1.0 + tolerance
    factor = result.factor
    worse, better = factor > limit, (1.0 / factor if factor else math.inf) > limit
    if not (worse or better):
        return result
    if test.p_value >= p_threshold:
        if worse and min_p_value(len(now), len(pooled)) >= p_threshold:
            return replace(result, verdict="undecided", note=f"{TOO_FEW_ROUNDS}: {len(pooled)}+{len(now)} rounds "
                           f"cannot reach p < {p_threshold:g}")
        return replace(result, note=WITHIN_ROUNDS)
    if len(runs) < min_runs:
        if not worse:
            return replace(result, verdict="improved", note=f"{TOO_FEW_RUNS} to judge the spread ({len(runs)})")
        return replace(result, verdict="undecided", note=f"{TOO_FEW_RUNS} ({len(runs)} of {min_runs}) to tell a "
                       "regression from the shift between runs of an unchanged server")
    if spread is None:
        return replace(result, verdict="regressed" if worse else "improved",
                       note=f"{SPREAD_NOT_JUDGED} ({len(runs)} run{'' if len(runs) == 1 else 's'}, "
                       f"min_runs {min_runs})")
    run_p = spread.p_worse(now_median) if worse else spread.p_better(now_median)
    result = replace(result, run_p_value=run_p)
    if run_p >= RUN_P_THRESHOLD:
        return replace(result, note=f"{WITHIN_SPREAD} (p={run_p:.2g} >= {RUN_P_THRESHOLD:g})")
    return replace(result, verdict="regressed" if worse else "improved", note="")


def rounds_needed(p_threshold: float = P_THRESHOLD) -> int:
    """The fewest rounds per side (equal on both) for which the test can reach ``p_threshold``."""
    rounds = 1
    while min_p_value(rounds, rounds) >= p_threshold:
        rounds += 1
    return rounds


def compare_samples(baseline_runs: Sequence[Mapping[str, Sequence[float]]], now: Mapping[str, Sequence[float]],
                    *layers: Tolerances | None, min_runs: int = DEFAULT_MIN_RUNS) -> tuple[MetricComparison, ...]:
    """Every metric this run and at least one baseline run measured, each with its tolerance from
    ``layers`` (first wins)."""
    compared = []
    for metric in METRICS:
        runs = [run[metric.name] for run in baseline_runs if run.get(metric.name)]
        if runs and now.get(metric.name):
            compared.append(compare_metric(metric, runs, now[metric.name], tolerance_of(metric.name, *layers),
                                           min_runs))
    return tuple(compared)


__all__ = [
    "DEFAULT_MIN_RUNS",
    "DEFAULT_TOLERANCE",
    "HIGHER",
    "LOWER",
    "METRICS",
    "METRIC_BY_NAME",
    "NOT_GATED",
    "P_THRESHOLD",
    "Metric",
    "MetricComparison",
    "compare_metric",
    "compare_samples",
    "parse_percent",
    "parse_tolerances",
    "rounds_needed",
    "samples_of",
    "tolerance_of",
]
