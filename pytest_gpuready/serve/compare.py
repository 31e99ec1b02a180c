"""A benchmark level against its baseline: which way each metric is better, how far is too far,
and a decision that survives noise.

The rule is asv's (``asv compare``), applied per metric over the rounds of one level:

* the change is the ratio of the medians over the rounds, in the worse direction: for a metric
  where higher is better (output tok/s, request/s) ``baseline / now``, for one where lower is
  better (TTFT, ITL, E2E latency, p50 and p99) ``now / baseline``;
* a metric *regressed* when that factor exceeds ``1 + tolerance`` (default 10%: asv's 1.1) **and**
  the two-sided Mann-Whitney U test of the rounds gives p < 0.002; *improved* likewise the other
  way; otherwise it is within noise;
* a factor beyond the tolerance with too few rounds for the test ever to reach p < 0.002 (fewer
  than 7 + 7) is *undecided*: the gate says so rather than passing.

Pure: samples in, :class:`LevelComparison` out (the fixture and the reports render it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpuready.serve.bench import LevelResult
from pytest_gpuready.serve.ranktest import mann_whitney_u, min_p_value

DEFAULT_TOLERANCE = 0.10
P_THRESHOLD = 0.002
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


def parse_percent(text: str, what: str) -> float:
    """``5%`` -> 0.05 (a number > 0 followed by ``%``)."""
    raw = text.strip()
    if not raw.endswith("%"):
        raise ValueError(f"{what}: expected a percentage like 5%, got {raw!r}")
    try:
        value = float(raw[:-1])
    except ValueError:
        raise ValueError(f"{what}: expected a percentage like 5%, got {raw!r}") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{what}: expected a percentage > 0, got {raw!r}")
    return value / 100.0


def parse_tolerances(text: str) -> dict[str, float]:
    """``output_tok_s:5%,ttft_p99:20%`` -> ``{"output_tok_s": 0.05, "ttft_p99": 0.2}``.

    A bare percentage (``15%``) sets every metric; a later entry wins over an earlier one.
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
    """Median over the baseline's rounds."""
    now: float
    tolerance: float
    p_value: float
    effect_size: float
    """Rank-biserial correlation of now against the baseline (+1: every round now above every
    baseline round)."""
    rounds: tuple[int, int]
    """(baseline rounds, rounds now)."""
    verdict: str
    """``ok``, ``regressed``, ``improved`` or ``undecided``."""

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
        """``output tok/s 812.4 -> 402.1 (-50.5%, factor 2.02 > 1.10, p=0.0006, r=-1.00)``."""
        label = METRIC_BY_NAME[self.name].label if self.name in METRIC_BY_NAME else self.name
        relation = ">" if self.factor > 1 + self.tolerance else "<="
        return (f"{label} {self.baseline:.4g} -> {self.now:.4g} {self.unit} ({self.change:+.1%}, "
                f"factor {self.factor:.2f} {relation} {1 + self.tolerance:.2f}, p={self.p_value:.2g}, "
                f"r={self.effect_size:+.2f}, {self.rounds[0]}+{self.rounds[1]} rounds)")

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.name, "better": self.better, "unit": self.unit, "baseline": self.baseline,
                "now": self.now, "change": self.change if math.isfinite(self.change) else None,
                "factor": self.factor if math.isfinite(self.factor) else None, "tolerance": self.tolerance,
                "p_value": self.p_value, "effect_size": self.effect_size,
                "baseline_rounds": self.rounds[0], "rounds": self.rounds[1], "verdict": self.verdict}


def compare_metric(metric: Metric, baseline: Sequence[float], now: Sequence[float], tolerance: float,
                   p_threshold: float = P_THRESHOLD) -> MetricComparison:
    """asv's rule for one metric: beyond the tolerance *and* p < ``p_threshold``."""
    if not baseline or not now:
        raise ValueError(f"{metric.name}: no rounds to compare ({len(baseline)} baseline, {len(now)} now)")
    test = mann_whitney_u(now, baseline)
    base_median = statistics.median(baseline)
    now_median = statistics.median(now)
    result = MetricComparison(metric.name, metric.better, metric.unit, base_median, now_median, tolerance,
                              test.p_value, test.effect_size, (len(baseline), len(now)), "ok")
    limit = 1.0 + tolerance
    factor = result.factor
    worse, better = factor > limit, (1.0 / factor if factor else math.inf) > limit
    if not (worse or better):
        return result
    if test.p_value < p_threshold:
        return _with(result, "regressed" if worse else "improved")
    if worse and min_p_value(len(now), len(baseline)) >= p_threshold:
        return _with(result, "undecided")
    return result


def _with(result: MetricComparison, verdict: str) -> MetricComparison:
    return MetricComparison(result.name, result.better, result.unit, result.baseline, result.now, result.tolerance,
                            result.p_value, result.effect_size, result.rounds, verdict)


def rounds_needed(p_threshold: float = P_THRESHOLD) -> int:
    """The fewest rounds per side (equal on both) for which the test can reach ``p_threshold``."""
    rounds = 1
    while min_p_value(rounds, rounds) >= p_threshold:
        rounds += 1
    return rounds


def compare_samples(baseline: Mapping[str, Sequence[float]], now: Mapping[str, Sequence[float]],
                    *layers: Tolerances | None) -> tuple[MetricComparison, ...]:
    """Every metric both sides measured, each with its tolerance from ``layers`` (first wins)."""
    compared = []
    for metric in METRICS:
        if metric.name in baseline and metric.name in now:
            compared.append(compare_metric(metric, baseline[metric.name], now[metric.name],
                                           tolerance_of(metric.name, *layers)))
    return tuple(compared)


__all__ = [
    "DEFAULT_TOLERANCE",
    "HIGHER",
    "LOWER",
    "METRICS",
    "METRIC_BY_NAME",
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
