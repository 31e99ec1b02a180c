"""Thresholds on a running deployment, as pure checks: measured figures in, :class:`Verdict` out.

The failure message is the whole point of a gate, so it reads like what an engineer would
write in the channel: ``single-stream output 61.2 tok/s < 80 tok/s required (MiniMax-M2.5,
TP=4, 4x RTX PRO 6000)``, with the sample behind it (requests, lengths, duration, latency) as
details. A figure that was not measured is a failed verdict that says so, never a pass.
"""

from __future__ import annotations

from pytest_gpuready.serve.bench import BenchResult, LevelResult
from pytest_gpuready.verdict import Verdict

LATENCY_METRICS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}
STATS = ("mean", "median", "p99")


def number(value: float) -> str:
    """A threshold as written: ``80``, ``2500``, ``1000000``, ``0.5`` (never ``1e+06``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def streams_label(concurrency: int) -> str:
    """``single-stream`` for 1, else ``64-stream``."""
    return "single-stream" if concurrency == 1 else f"{concurrency}-stream"


def _level(result: BenchResult, concurrency: int, what: str, context: str) -> LevelResult | Verdict:
    try:
        return result.at(concurrency)
    except KeyError as exc:
        return Verdict.failed(f"{streams_label(concurrency)} {what}: not measured ({exc.args[0]}) ({context})")


def sample_details(result: BenchResult, level: LevelResult) -> tuple[str, ...]:
    """The sample behind a figure: how many requests, of what size, how long, what latency."""
    lines = [
        f"measured over {level.completed} request{'' if level.completed == 1 else 's'} of "
        f"{result.prompt_tokens} prompt + "
        f"{result.output_tokens} output tokens at concurrency {level.concurrency} in {level.duration_s:.1f} s "
        f"({level.failed} failed)",
        f"TTFT median {level.ttft.median_ms:.1f} ms, p99 {level.ttft.p99_ms:.1f} ms; "
        f"TPOT median {level.tpot.median_ms:.2f} ms, p99 {level.tpot.p99_ms:.2f} ms",
    ]
    lines += [f"request error: {error}" for error in level.errors[:3]]
    return tuple(lines)


def check_output_throughput(result: BenchResult, concurrency: int, min_tok_s: float, context: str) -> Verdict:
    """Output token throughput at ``concurrency`` streams is at least ``min_tok_s``."""
    level = _level(result, concurrency, "output", context)
    if isinstance(level, Verdict):
        return level
    measured = level.output_throughput
    evidence = {"concurrency": concurrency, "output_tok_s": measured, "min_output_tok_s": min_tok_s,
                "completed": level.completed, "failed": level.failed}
    relation = ">=" if measured >= min_tok_s else "<"
    summary = (f"{streams_label(concurrency)} output {measured:.1f} tok/s {relation} "
               f"{number(min_tok_s)} tok/s required ({context})")
    if measured >= min_tok_s:
        return Verdict.passed(summary, details=sample_details(result, level), evidence=evidence)
    return Verdict.failed(summary, details=sample_details(result, level), evidence=evidence)


def check_latency(
    result: BenchResult, concurrency: int, metric: str, max_ms: float, context: str, stat: str = "p99"
) -> Verdict:
    """``stat`` (mean, median, p99) of ``metric`` (ttft, tpot, itl, e2el) at ``concurrency`` is at most ``max_ms``."""
    if metric not in LATENCY_METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {', '.join(LATENCY_METRICS)}")
    if stat not in STATS:
        raise ValueError(f"stat {stat!r}: expected one of {', '.join(STATS)}")
    name = f"{stat} {LATENCY_METRICS[metric]}"
    level = _level(result, concurrency, name, context)
    if isinstance(level, Verdict):
        return level
    measured = getattr(level, metric).get(stat)
    evidence = {"concurrency": concurrency, "metric": metric, "stat": stat, "ms": measured, "max_ms": max_ms}
    relation = "<=" if measured <= max_ms else ">"
    summary = (f"{streams_label(concurrency)} {name} {measured:.1f} ms {relation} {number(max_ms)} ms "
               f"allowed ({context})")
    if measured <= max_ms:
        return Verdict.passed(summary, details=sample_details(result, level), evidence=evidence)
    return Verdict.failed(summary, details=sample_details(result, level), evidence=evidence)


def check_no_failed_requests(result: BenchResult, context: str) -> Verdict:
    """Every benchmark request completed: a failed request is a serving problem, not noise."""
    failed = [level for level in result.levels if level.failed]
    if not failed:
        total = sum(level.completed for level in result.levels)
        return Verdict.passed(f"all {total} benchmark requests completed ({context})")
    details = tuple(f"{streams_label(level.concurrency)}: {level.failed} of {level.completed + level.failed} "
                    f"failed: {'; '.join(level.errors[:3]) or 'no error text'}" for level in failed)
    count = sum(level.failed for level in failed)
    return Verdict.failed(f"{count} benchmark request{'' if count == 1 else 's'} failed ({context})", details=details)


def check_weights_per_gpu(
    weights_gib: tuple[float, ...], min_gib: float | None, max_gib: float | None, context: str
) -> Verdict:
    """Each rank's weights (vLLM's ``Model loading took X GiB``) lie within [min_gib, max_gib]."""
    if not weights_gib:
        return Verdict.failed(
            f"weights per GPU: not measured: the vLLM log has no 'Model loading took ... GiB' line ({context})")
    problems = []
    for rank, gib in enumerate(weights_gib):
        if min_gib is not None and gib < min_gib:
            problems.append(f"weights {gib:g} GiB on rank {rank} < {number(min_gib)} GiB expected ({context})")
        if max_gib is not None and gib > max_gib:
            problems.append(f"weights {gib:g} GiB on rank {rank} > {number(max_gib)} GiB allowed ({context})")
    bounds = f"[{'' if min_gib is None else number(min_gib)}, {'' if max_gib is None else number(max_gib)}] GiB"
    evidence = {"weights_gib": list(weights_gib), "min_gib": min_gib, "max_gib": max_gib}
    if problems:
        return Verdict.failed(problems[0], details=tuple(problems[1:]), evidence=evidence)
    shown = "/".join(f"{g:g}" for g in weights_gib)
    return Verdict.passed(f"weights {shown} GiB per GPU within {bounds} ({context})", evidence=evidence)
