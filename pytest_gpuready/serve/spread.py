"""Run-to-run spread: is a new run's figure outside what the baseline's own runs showed?

The rounds of one run share its server start, its GPU's state and the machine around it, so a
rank test over rounds (asv's) sees a shift between two runs as significant even when every run of
an unchanged server shifts that much: on the H200, 11 of 20 unchanged levels were called regressed
that way (docs/performance.md#baseline-false-alarms). What separates a regression from that is the
spread *between* runs, so a baseline keeps several runs and a new run is judged against them.

The test is Bencher's t-test threshold (bencher.dev, "Thresholds & Alerts": Student's t over the
stored runs, boundary 0.99), on the logarithm of each run's median (throughput and latency are
ratios: a change of x% is the same distance from any baseline): with k runs of mean ``m`` and
standard deviation ``s``, a new run's ``(m - x) / (s sqrt(1 + 1/k))`` follows Student's t with
k - 1 degrees of freedom when nothing changed (a prediction interval), so the one-sided p-value of
the direction that is worse is the chance of a run that far out from an unchanged server. Three
runs are the fewest with which that bound is finite enough to use (t at 0.99 with 2 degrees of
freedom is 6.96; with 1 it is 31.8).

Student's t distribution is written out (scipy is not a dependency): its tail through the
regularized incomplete beta function, by the continued fraction of Numerical Recipes (``betacf``,
modified Lentz), and its quantile by bisection of that tail.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RUN_P_THRESHOLD = 0.01
"""One-sided: Bencher's default boundary of 0.99."""
SPREAD_RUNS = 3
"""The fewest baseline runs the spread is judged from."""

_EPS = 1e-15
_TINY = 1e-300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes 6.4, modified Lentz's method)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0) or not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_beta: expected a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    if not df > 0:
        raise ValueError(f"t_sf: degrees of freedom must be > 0, got {df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = ``p`` (bisection of :func:`t_sf`; exact to about 1e-9)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: expected 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_sf(high, df) > 1.0 - p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if t_sf(middle, df) > 1.0 - p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-10 * max(1.0, high):
            break
    return (low + high) / 2.0


@dataclass(frozen=True)
class RunSpread:
    """What k baseline runs say about one metric: their centre, and how far a new run may fall.

    ``higher_is_better`` decides which tail is "worse". On the log scale (every value > 0) the
    centre is the geometric mean of the runs' medians and a bound is a ratio; otherwise (a zero
    latency) the arithmetic mean and a difference.
    """

    runs: int
    centre: float
    log_scale: bool
    mean: float
    """Of the runs' figures on the scale used."""
    scale: float
    """``s sqrt(1 + 1/k)``: the standard error of a new run around ``mean``."""
    higher_is_better: bool

    def _distance(self, value: float) -> float:
        """How far ``value`` lies on the worse side of the mean (negative: on the better side)."""
        if self.log_scale and value <= 0:
            return math.inf if self.higher_is_better else -math.inf  # nothing at all: worst throughput, best latency
        x = math.log(value) if self.log_scale else value
        return self.mean - x if self.higher_is_better else x - self.mean

    def p_worse(self, value: float) -> float:
        """One-sided p of a run at ``value`` or worse from an unchanged server."""
        return self._tail(self._distance(value))

    def p_better(self, value: float) -> float:
        """One-sided p of a run at ``value`` or better from an unchanged server."""
        return self._tail(-self._distance(value))

    def _tail(self, distance: float) -> float:
        if self.scale == 0.0 or math.isinf(distance):
            return 0.0 if distance > 0 else 1.0
        return t_sf(distance / self.scale, self.runs - 1)

    def worse_bound(self, p_threshold: float = RUN_P_THRESHOLD) -> float:
        """The value beyond which a run is outside the spread (worse side): the test's boundary."""
        reach = t_quantile(1.0 - p_threshold, self.runs - 1) * self.scale
        edge = self.mean - reach if self.higher_is_better else self.mean + reach
        return math.exp(edge) if self.log_scale else edge


def run_spread(run_values: Sequence[float], higher_is_better: bool) -> RunSpread:
    """The spread of the baseline runs' figures (one per run, e.g. each run's median); needs 2 or more."""
    k = len(run_values)
    if k < 2:
        raise ValueError(f"run_spread: needs 2 or more runs, got {k}")
    log_scale = all(v > 0 for v in run_values)
    values = [math.log(v) for v in run_values] if log_scale else [float(v) for v in run_values]
    mean = statistics.fmean(values)
    scale = statistics.stdev(values) * math.sqrt(1.0 + 1.0 / k)
    return RunSpread(k, run_centre(run_values), log_scale, mean, scale, higher_is_better)


def run_centre(run_values: Sequence[float]) -> float:
    """The baseline's figure from its runs: the geometric mean when every value is > 0, else the mean."""
    if not run_values:
        raise ValueError("run_centre: no runs")
    if all(v > 0 for v in run_values):
        return math.exp(statistics.fmean(math.log(v) for v in run_values))
    return statistics.fmean(run_values)


__all__ = [
    "RUN_P_THRESHOLD",
    "SPREAD_RUNS",
    "RunSpread",
    "regularized_beta",
    "run_centre",
    "run_spread",
    "t_quantile",
    "t_sf",
]
