"""One benchmark level judged against its stored baseline: the verdict and the line that says why.

The verdicts, in the order they are decided:

* ``invalid``: the GPU throttled during the level (HW slowdown, thermal, power brake), or its
  clock-event reasons could not be read on a GPU host: the figures are the hardware's;
* ``no baseline``: the file has no entry for this level;
* ``not comparable``: the key differs (the first part that differs is named);
* ``regressed`` / ``undecided`` / ``improved`` / ``ok``: per metric (:mod:`.compare`: beyond the
  tolerance, significant over the rounds, and outside the spread of the baseline's runs); the
  level takes the worst of its metrics (regressed > undecided > improved > ok).

Only ``ok`` and ``improved`` pass; every other verdict fails the test with its line, and only
``regressed`` is a regression (an ``undecided`` level only because the baseline has too few runs
is still saved by ``--gpuready-baseline-save``: that is how a baseline grows to the runs it needs).
Pure: data in, :class:`LevelComparison` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpuready.host.clock_events import ClockEventRecord
from pytest_gpuready.serve.baseline import ComparabilityKey, StoredLevel, key_difference
from pytest_gpuready.serve.compare import (
    DEFAULT_MIN_RUNS,
    TOO_FEW_RUNS,
    MetricComparison,
    Tolerances,
    compare_samples,
)

PASSING = ("ok", "improved")
_RANK = {"regressed": 3, "undecided": 2, "improved": 1, "ok": 0}


@dataclass(frozen=True)
class LevelComparison:
    """A level's verdict, with the line that explains it and the per-metric comparisons behind it."""

    level: str
    concurrency: int
    verdict: str
    reason: str
    metrics: tuple[MetricComparison, ...] = ()

    @property
    def ok(self) -> bool:
        return self.verdict in PASSING

    @property
    def runs(self) -> int:
        """Baseline runs the level was compared with (0 when it was not compared)."""
        return max((m.runs for m in self.metrics), default=0)

    @property
    def growing(self) -> bool:
        """Undecided only because the baseline has too few runs: saving this run is how it gets them."""
        undecided = [m for m in self.metrics if m.verdict == "undecided"]
        return self.verdict == "undecided" and all(m.note.startswith(TOO_FEW_RUNS) for m in undecided)

    def headline(self) -> MetricComparison | None:
        """The metric the verdict is about (the first regressed, undecided or improved; else output tok/s)."""
        for wanted in ("regressed", "undecided", "improved"):
            for metric in self.metrics:
                if metric.verdict == wanted:
                    return metric
        return next((m for m in self.metrics if m.name == "output_tok_s"), self.metrics[0] if self.metrics else None)

    def line(self) -> str:
        """``c8: regressed: output tok/s 812.4 -> 402.1 tok/s (-50.5%, ...)``."""
        return f"c{self.concurrency}: {self.verdict}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "concurrency": self.concurrency, "verdict": self.verdict,
                "reason": self.reason, "ok": self.ok, "baseline_runs": self.runs,
                "metrics": [m.to_dict() for m in self.metrics]}


def judge_level(level: str, concurrency: int, key: ComparabilityKey, samples: Mapping[str, Sequence[float]],
                clock_events: ClockEventRecord | None, stored: StoredLevel | None,
                *tolerances: Tolerances | None, on_gpu: bool = True,
                min_runs: int = DEFAULT_MIN_RUNS) -> LevelComparison:
    """The verdict of one level (see the module docstring for the order).

    ``min_runs``: baseline runs needed before a change beyond the tolerance is called (fewer:
    ``undecided``).

    ``on_gpu``: the server runs on GPUs, so a level without a single clock-event sample cannot
    be said to have run unthrottled (on a CPU host there is nothing to sample).
    """
    if clock_events is not None and clock_events.throttled:
        return LevelComparison(level, concurrency, "invalid", f"throttled ({throttled_text(clock_events)})")
    if on_gpu and (clock_events is None or not clock_events.measured):
        why = clock_events.describe() if clock_events is not None else "not sampled"
        return LevelComparison(level, concurrency, "invalid",
                               f"clock-event reasons not read, so throttling cannot be ruled out ({why})")
    if stored is None:
        return LevelComparison(level, concurrency, "no baseline", "no stored level of this id in the baseline "
                               "(write one with --gpuready-baseline-save)")
    difference = key_difference(stored.key, key)
    if difference is not None:
        return LevelComparison(level, concurrency, "not comparable", difference)
    metrics = compare_samples(stored.samples, samples, *tolerances, min_runs=min_runs)
    if not metrics:
        return LevelComparison(level, concurrency, "not comparable", "no metric measured on both sides")
    worst = max(metrics, key=lambda m: _RANK[m.verdict]).verdict
    chosen = [m for m in metrics if m.verdict == worst]
    if worst == "ok":
        head = next((m for m in metrics if m.name == "output_tok_s"), metrics[0])
        reason = head.describe()
    elif worst == "undecided":
        head = chosen[0]
        advice = (f"save {min_runs - head.runs} more run{'' if min_runs - head.runs == 1 else 's'} with "
                  "--gpuready-baseline-save" if head.note.startswith(TOO_FEW_RUNS)
                  else "use more rounds (rounds=7 or more with a one-run baseline)")
        reason = f"{head.describe()} ({advice})"
    else:
        reason = "; ".join(m.describe() for m in chosen)
    return LevelComparison(level, concurrency, worst, reason, metrics)


def throttled_text(record: ClockEventRecord) -> str:
    """``GPU 0: hw_slowdown, hw_thermal_slowdown over 14 samples in 6.2 s``."""
    gpus = "; ".join(f"GPU {gpu}: {', '.join(names)}" for gpu, names in sorted(record.throttled.items()))
    return f"{gpus} over {record.samples} samples in {record.stopped_at - record.started_at:.1f} s"


__all__ = ["PASSING", "LevelComparison", "judge_level", "throttled_text"]
