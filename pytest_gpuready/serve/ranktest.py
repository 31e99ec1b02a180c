"""The Mann-Whitney U test, exact for the small samples a benchmark's rounds give.

A regression gate on rounds of a serving benchmark must not call noise a regression. asv's rule
(``asv compare``: a factor of 1.1 *and* a Mann-Whitney U test at p < 0.002) is the anchor; scipy
is not a dependency, so the exact test is written out here: the null distribution of U for
samples of sizes m and n are the coefficients of the Gaussian binomial coefficient
``[m + n choose m]_q``, built as ``prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)`` in integers.

Ties are broken conservatively, as asv does: of the U values the ties allow, the one closest to
``m n / 2`` (the least significant) is used, and the p-value is the exact two-sided one of the
tie-free distribution at that U. So a tie never makes a difference look more significant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

MAX_SAMPLE = 200
"""Largest sample the exact distribution is built for (m n + 1 integers; 200 x 200 is 40,001)."""


@dataclass(frozen=True)
class RankTest:
    """U (pairs where the first sample is larger, a tie counting one half) and the two-sided p."""

    u: float
    p_value: float
    m: int
    n: int

    @property
    def effect_size(self) -> float:
        """Rank-biserial correlation ``2 U / (m n) - 1`` in [-1, 1]: -1 when every value of the first
        sample is below every value of the second, +1 when above, 0 when they interleave evenly."""
        return 2.0 * self.u / (self.m * self.n) - 1.0


@lru_cache(maxsize=64)
def u_distribution(m: int, n: int) -> tuple[int, ...]:
    """How many of the ``C(m+n, m)`` orderings give each U = 0..m n (no ties)."""
    if m < 0 or n < 0:
        raise ValueError(f"sample sizes must be >= 0, got {m} and {n}")
    if m > n:
        return u_distribution(n, m)  # symmetric in m and n
    size = m * n + 1
    coefficients = [0] * size
    coefficients[0] = 1
    for i in range(1, m + 1):
        # multiply by (1 - q^(n+i)) from the top down, then divide by (1 - q^i) from the bottom up
        shift = n + i
        for k in range(size - 1, shift - 1, -1):
            coefficients[k] -= coefficients[k - shift]
        for k in range(i, size):
            coefficients[k] += coefficients[k - i]
    return tuple(coefficients)


def _cdf(m: int, n: int, u: int) -> float:
    """P(U <= u) with no ties."""
    counts = u_distribution(m, n)
    if u < 0:
        return 0.0
    return sum(counts[: u + 1]) / math.comb(m + n, m)


def min_p_value(m: int, n: int) -> float:
    """The smallest two-sided p-value samples of sizes m and n can give: ``2 / C(m+n, m)``.

    asv's rule cannot call a difference significant at p < 0.002 with fewer than 7 + 7 (or
    6 + 7) rounds; :mod:`~pytest_gpuready.serve.compare` says so instead of passing.
    """
    if m == 0 or n == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(m + n, m))


def mann_whitney_u(first: Sequence[float], second: Sequence[float]) -> RankTest:
    """Exact two-sided Mann-Whitney U test of ``first`` against ``second`` (ties: conservative).

    ``u`` counts the pairs (a, b) with a > b, a tie counting one half (the usual mid-rank U).
    """
    m, n = len(first), len(second)
    if m == 0 or n == 0:
        raise ValueError("mann_whitney_u: both samples need at least one value")
    if m > MAX_SAMPLE or n > MAX_SAMPLE:
        raise ValueError(f"mann_whitney_u: at most {MAX_SAMPLE} values per sample, got {m} and {n}")
    if any(math.isnan(v) for v in (*first, *second)):
        raise ValueError("mann_whitney_u: a sample holds NaN")
    greater = sum(1 for a in first for b in second if a > b)
    ties = sum(1 for a in first for b in second if a == b)
    centre = m * n / 2
    # the ties allow any U from greater to greater + ties: the p-value is that of the one
    # closest to the centre (the least significant)
    if greater <= centre <= greater + ties:
        p = 1.0
    else:
        conservative = greater if greater > centre else greater + ties
        p = min(1.0, 2.0 * _cdf(m, n, min(conservative, m * n - conservative)))
    u = greater + ties / 2
    return RankTest(u=u, p_value=p, m=m, n=n)


__all__ = ["MAX_SAMPLE", "RankTest", "mann_whitney_u", "min_p_value", "u_distribution"]
