"""The baseline comparison's pure parts: the exact Mann-Whitney U test, metric directions,
tolerances, the comparability key, clock-event reasons and the level verdict."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_gpuready.host.clock_events import ClockEventRecord, ClockEventSampler
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.serve import baseline as store
from pytest_gpuready.serve.compare import (
    METRIC_BY_NAME,
    compare_metric,
    parse_tolerances,
    rounds_needed,
    tolerance_of,
)
from pytest_gpuready.serve.ranktest import mann_whitney_u, min_p_value, u_distribution
from pytest_gpuready.serve.regression import judge_level
from pytest_gpuready.serve.spec import ServeSpec
from pytest_gpuready.serve.spread import regularized_beta, run_spread, t_quantile, t_sf

# ---------------------------------------------------------------- Mann-Whitney U


def test_the_null_distribution_is_the_gaussian_binomial_coefficient() -> None:
    # m = n = 3: the 20 orderings by U (Mann & Whitney 1947, table I)
    assert u_distribution(3, 3) == (1, 1, 2, 3, 3, 3, 3, 2, 1, 1)
    for m, n in ((1, 1), (2, 5), (7, 7), (12, 20)):
        counts = u_distribution(m, n)
        assert sum(counts) == math.comb(m + n, m)
        assert counts == counts[::-1]  # symmetric about m n / 2
        assert u_distribution(n, m) == counts


def test_known_values() -> None:
    # scipy.stats.mannwhitneyu's documented example (method="exact"): U1 = 17, p = 0.1111
    test = mann_whitney_u([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert test.u == 17
    assert test.p_value == pytest.approx(0.1111111, abs=1e-6)
    # complete separation: p = 2 / C(m+n, m)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6]).p_value == pytest.approx(0.1)
    assert mann_whitney_u(range(7), range(10, 17)).p_value == pytest.approx(2 / 3432)
    assert mann_whitney_u(range(7), range(10, 17)).effect_size == -1.0
    assert mann_whitney_u(range(10, 17), range(7)).effect_size == 1.0


def test_ties_are_broken_conservatively() -> None:
    # every value equal: no evidence of a difference at all
    assert mann_whitney_u([5.0] * 7, [5.0] * 7).p_value == 1.0
    # separated but for one tie: less significant than full separation, never more
    separated = mann_whitney_u([1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14]).p_value
    tied = mann_whitney_u([1, 2, 3, 4, 5, 6, 8], [8, 9, 10, 11, 12, 13, 14]).p_value
    assert tied > separated
    assert tied == pytest.approx(2 * 2 / 3432)  # U = 1 (the tie counted against the difference)


def test_asv_threshold_needs_seven_rounds_a_side() -> None:
    assert min_p_value(6, 6) > 0.002 > min_p_value(7, 7)
    assert min_p_value(6, 7) < 0.002
    assert rounds_needed() == 7


def test_bad_samples_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        mann_whitney_u([math.nan], [1.0])
    with pytest.raises(ValueError, match="at most 200"):
        mann_whitney_u([1.0] * 201, [1.0])


# ---------------------------------------------------------------- directions and tolerances


def test_directions() -> None:
    assert METRIC_BY_NAME["output_tok_s"].better == "higher"
    assert METRIC_BY_NAME["req_s"].better == "higher"
    for name in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2el_p50", "e2el_p99"):
        assert METRIC_BY_NAME[name].better == "lower"


def test_tolerances_parse_and_layer() -> None:
    assert parse_tolerances("output_tok_s:5%,ttft_p99:20%") == {"output_tok_s": 0.05, "ttft_p99": 0.2}
    everything = parse_tolerances("15%")
    assert set(everything) == set(METRIC_BY_NAME)
    assert set(everything.values()) == {0.15}
    assert parse_tolerances("15%,itl_p99:50%")["itl_p99"] == 0.5
    assert tolerance_of("ttft_p99", {"ttft_p99": 0.3}, {"ttft_p99": 0.2}) == 0.3  # per test over options
    assert tolerance_of("ttft_p99", None, {"ttft_p99": 0.2}) == 0.2
    assert tolerance_of("ttft_p99", None, None) == 0.10  # the default, asv's 1.1 and CodSpeed's 10%


@pytest.mark.parametrize(("text", "message"), [
    ("output_tok_s:5", "expected a percentage like 5%"),
    ("tok_s:5%", "unknown metric 'tok_s': expected one of output_tok_s, req_s"),
    ("output_tok_s:-5%", "expected a percentage > 0"),
    ("output_tok_s:inf%", "expected a percentage > 0"),
    (",", "expected METRIC:PERCENT"),
])
def test_bad_tolerances_name_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tolerances(text)


THROUGHPUT = METRIC_BY_NAME["output_tok_s"]
TTFT = METRIC_BY_NAME["ttft_p99"]
BASE = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8]


def test_a_slower_throughput_beyond_the_tolerance_and_significant_regresses() -> None:
    slower = [v * 0.8 for v in BASE]
    result = compare_metric(THROUGHPUT, [BASE], slower, 0.10, min_runs=1)  # asv's rule alone: one run
    assert result.verdict == "regressed"
    assert result.change == pytest.approx(-0.2, abs=0.01)
    assert result.factor == pytest.approx(1.25, abs=0.01)
    assert result.p_value < 0.002
    assert result.effect_size == -1.0
    assert "output tok/s 100 -> 80" in result.describe()
    assert "factor 1.25 > 1.10" in result.describe()
    assert "run-to-run spread not judged (1 run, min_runs 1)" in result.describe()


def test_a_higher_latency_regresses_and_a_lower_one_improves() -> None:
    assert compare_metric(TTFT, [BASE], [v * 1.3 for v in BASE], 0.10, min_runs=1).verdict == "regressed"
    assert compare_metric(TTFT, [BASE], [v * 0.7 for v in BASE], 0.10, min_runs=1).verdict == "improved"
    assert compare_metric(THROUGHPUT, [BASE], [v * 1.3 for v in BASE], 0.10, min_runs=1).verdict == "improved"


def test_a_metric_off_is_compared_and_recorded_never_gated() -> None:
    assert parse_tolerances("itl_p50:off,output_tok_s:5%") == {"itl_p50": math.inf, "output_tok_s": 0.05}
    bursts = compare_metric(METRIC_BY_NAME["itl_p50"], RUNS, [v * 1000 for v in BASE], math.inf)
    assert bursts.verdict == "ok"
    assert bursts.note == "not gated (tolerance off)"
    assert bursts.p_value < 0.002  # still measured
    assert bursts.describe() == "ITL p50 92.82 -> 1e+05 ms (+107630.7%; not gated, 3 runs)"
    record = bursts.to_dict()
    assert record["tolerance"] is None
    assert record["detectable"] is None
    json.dumps(record, allow_nan=False)  # plain JSON: no Infinity


def test_within_the_tolerance_is_ok_however_significant() -> None:
    result = compare_metric(THROUGHPUT, [BASE], [v * 0.95 for v in BASE], 0.10)
    assert result.p_value < 0.002
    assert result.verdict == "ok"


def test_beyond_the_tolerance_but_within_noise_is_ok() -> None:
    # the medians differ by > 10%, but the rounds interleave: one noisy round does not make a regression
    noisy_base = [100.0, 60.0, 100.0, 62.0, 100.0, 101.0, 99.0]
    noisy_now = [88.0, 100.0, 61.0, 87.0, 100.0, 86.0, 63.0]
    result = compare_metric(THROUGHPUT, [noisy_base], noisy_now, 0.10, min_runs=1)
    assert result.factor > 1.1
    assert result.p_value > 0.002
    assert result.verdict == "ok"


def test_too_few_rounds_to_decide_is_undecided_not_a_pass() -> None:
    result = compare_metric(THROUGHPUT, [BASE[:3]], [v * 0.5 for v in BASE[:3]], 0.10, min_runs=1)
    assert result.verdict == "undecided"
    assert result.note == "too few rounds: 3+3 rounds cannot reach p < 0.002"
    # three runs of four rounds pooled are enough rounds for the rank test (12 + 4: p >= 2 / C(16, 4))
    assert min_p_value(4, 12) < 0.002 < min_p_value(3, 9)
    assert compare_metric(THROUGHPUT, [BASE[:4]] * 3, [v * 0.5 for v in BASE[:4]], 0.10).verdict == "regressed"


# ---------------------------------------------------------------- between runs (serve/spread.py)

# Student's t quantiles (any table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2) and closed forms
@pytest.mark.parametrize(("p", "df", "t"), [
    (0.975, 1, 12.7062047), (0.99, 2, 6.9645567), (0.99, 4, 3.7469474), (0.99, 9, 2.8214379),
    (0.95, 30, 1.6972609), (0.999, 100, 3.1737394),
])
def test_student_t_quantiles(p: float, df: int, t: float) -> None:
    assert t_quantile(p, df) == pytest.approx(t, abs=1e-6)
    assert t_sf(t, df) == pytest.approx(1 - p, rel=1e-6)
    assert t_quantile(1 - p, df) == pytest.approx(-t, abs=1e-6)


def test_student_t_tail_closed_forms() -> None:
    for t in (0.1, 1.0, 2.0, 7.5, 40.0):
        assert t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-9)  # Cauchy
        assert t_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(t * t + 2)), rel=1e-9)
    assert t_sf(0.0, 5) == 0.5
    assert t_sf(-1.3, 3) == pytest.approx(1 - t_sf(1.3, 3))
    assert regularized_beta(2, 3, 0.4) == pytest.approx(0.5248)  # 1 - sum of the binomial terms: exact


# An unchanged server run after run: each run's rounds agree with each other, the runs do not
# (the H200's unchanged c16 moved -12% to -35% between runs, docs/performance.md). Three baseline runs.
RUNS = [[v * shift for v in BASE] for shift in (1.0, 0.86, 0.93)]


def test_a_shift_within_the_spread_between_runs_is_not_a_regression() -> None:
    # a fourth run 20% below the baseline's centre: beyond the tolerance, every round below every
    # baseline round (p = 2 / C(28, 7)), yet no further out than the runs of an unchanged server go
    now = [v * 0.75 for v in BASE]
    result = compare_metric(THROUGHPUT, RUNS, now, 0.10)
    assert result.factor > 1.1
    assert result.p_value < 0.002
    assert result.runs == 3
    assert result.run_p_value is not None
    assert result.run_p_value > 0.01
    assert result.verdict == "ok"
    assert result.note.startswith("within the run-to-run spread of the baseline's runs (p=")
    assert result.baseline == pytest.approx(100 * (1.0 * 0.86 * 0.93) ** (1 / 3), rel=1e-3)  # geometric mean
    # what it takes to be called: beyond -x% where the spread's bound lies (> the 10% tolerance here)
    assert result.detectable is not None
    assert result.detectable < -0.3
    assert "3 runs, spread p=" in result.describe()
    # one run far enough out is a regression
    far = compare_metric(THROUGHPUT, RUNS, [v * 0.25 for v in BASE], 0.10)
    assert far.verdict == "regressed"
    assert far.run_p_value is not None
    assert far.run_p_value < 0.01
    assert far.change < far.detectable  # type: ignore[operator]


def test_tight_runs_call_a_smaller_change_and_the_tolerance_still_holds() -> None:
    tight = [[v * shift for v in BASE] for shift in (1.0, 0.99, 1.01, 1.0, 0.995)]
    slower = compare_metric(THROUGHPUT, tight, [v * 0.85 for v in BASE], 0.10)
    assert slower.verdict == "regressed"
    assert slower.detectable == pytest.approx(1 / 1.1 - 1, abs=1e-9)  # the tolerance is the further bound
    within = compare_metric(THROUGHPUT, tight, [v * 0.95 for v in BASE], 0.10)
    assert within.verdict == "ok"
    assert within.note == "within the tolerance"
    latency = compare_metric(TTFT, tight, [v * 1.25 for v in BASE], 0.10)
    assert latency.verdict == "regressed"
    assert latency.detectable is not None
    assert latency.detectable > 0
    assert compare_metric(TTFT, tight, [v * 0.75 for v in BASE], 0.10).verdict == "improved"


def test_too_few_baseline_runs_is_undecided_not_a_pass() -> None:
    result = compare_metric(THROUGHPUT, [BASE], [v * 0.5 for v in BASE], 0.10)
    assert result.verdict == "undecided"
    assert result.note.startswith("too few baseline runs (1 of 3)")
    assert compare_metric(THROUGHPUT, RUNS[:2], [v * 0.5 for v in BASE], 0.10).verdict == "undecided"
    # an improvement is not held back, and a small change is within the tolerance at any count
    assert compare_metric(THROUGHPUT, [BASE], [v * 1.5 for v in BASE], 0.10).verdict == "improved"
    assert compare_metric(THROUGHPUT, [BASE], [v * 0.95 for v in BASE], 0.10).verdict == "ok"
    with pytest.raises(ValueError, match="min_runs 0: expected a whole number >= 1"):
        compare_metric(THROUGHPUT, [BASE], BASE, 0.10, min_runs=0)


def test_a_zero_latency_is_judged_on_the_plain_scale() -> None:
    zeros = [[0.0] * 7, [0.0] * 7, [0.0] * 7]
    assert compare_metric(METRIC_BY_NAME["itl_p50"], zeros, [0.0] * 7, 0.10).verdict == "ok"
    spread = run_spread([0.0, 1.0, 2.0], higher_is_better=False)
    assert not spread.log_scale
    assert spread.centre == 1.0
    assert run_spread([1.0, 2.0, 4.0], higher_is_better=True).centre == pytest.approx(2.0)


# ---------------------------------------------------------------- the key


SERVE_ARGS = store.serve_args_record(ServeSpec(model="/models/llama-1b", args=ServeArgs(max_model_len=4096)))


def key(**changes: object) -> store.ComparabilityKey:
    base = store.ComparabilityKey("NVIDIA H200", 1, "580.159.04", "0.25.0", "llama-1b", "ab" * 32,
                                  SERVE_ARGS, 8, 256, 128, 32)
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("change", "line"), [
    ({"gpu_model": "NVIDIA H100 80GB HBM3"}, "GPU model differs (baseline NVIDIA H200, now NVIDIA H100 80GB HBM3)"),
    ({"gpu_count": 2}, "GPU count differs (baseline 1, now 2)"),
    ({"driver": "570.1"}, "driver differs (baseline 580.159.04, now 570.1)"),
    ({"vllm_version": "0.26.0"}, "vLLM version differs (baseline 0.25.0, now 0.26.0)"),
    ({"model_name": "llama-8b"}, "model differs (baseline llama-1b, now llama-8b)"),
    ({"model_config_sha256": "cd" * 32},
     "model config (sha256 of config.json) differs (baseline abababababab, now cdcdcdcdcdcd)"),
    ({"serve_args": {**SERVE_ARGS, "max_num_seqs": 1}}, "serve arguments differ (max_num_seqs: baseline none, now 1)"),
    ({"serve_args": {**SERVE_ARGS, "not_judged": ["--seed", "7"]}},
     "serve arguments differ (not_judged: baseline (none), now --seed 7)"),
    ({"concurrency": 16}, "concurrency differs (baseline 8, now 16)"),
    ({"prompt_tokens": 1024}, "prompt tokens differs (baseline 256, now 1024)"),
    ({"output_tokens": 64}, "output tokens differs (baseline 128, now 64)"),
    ({"requests": 64}, "request count differs (baseline 32, now 64)"),
])
def test_a_differing_key_names_the_part_in_one_line(change: dict[str, object], line: str) -> None:
    assert store.key_difference(key(), key(**change)) == line
    assert store.key_difference(key(), key()) is None


def test_serve_args_are_the_declarations_record_with_the_commands_flags_and_env() -> None:
    spec = ServeSpec(model="/models/llama", served_model_name="llama", port=8123,
                     args=ServeArgs(max_model_len=4096, extra_args=("--seed", "7")),
                     command="/venv/bin/python -m vllm.entrypoints.openai.api_server --enforce-eager",
                     env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    record = store.serve_args_record(spec)
    assert record == {**spec.args.to_record(), "command_flags": ["--enforce-eager"],
                      "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    assert record["max_model_len"] == 4096
    assert record["not_judged"] == ["--seed", "7"]
    served = ServeSpec(model="/models/llama", args=ServeArgs(tp=4, ep=True), gpus=(0, 1, 2, 3))
    assert store.serve_args_record(served)["tp"] == 4
    assert store.serve_args_record(served)["command_flags"] == []
    # another venv, port or served name is the same deployment
    moved = replace(spec, command=spec.command.replace("/venv", "/other"), port=9000, served_model_name="x")
    assert store.serve_args_record(moved) == record


def test_the_config_hash_ignores_formatting(tmp_path: Path) -> None:
    from pytest_gpuready.host.hosts import LocalHost

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"hidden_size": 128, "num_hidden_layers": 2}')
    (tmp_path / "b" / "config.json").write_text('{\n  "num_hidden_layers": 2,\n  "hidden_size": 128\n}\n')
    assert store.model_config_sha256(str(tmp_path / "a"), LocalHost()) == \
        store.model_config_sha256(str(tmp_path / "b"), LocalHost())
    (tmp_path / "b" / "config.json").write_text('{"num_hidden_layers": 3, "hidden_size": 128}')
    assert store.model_config_sha256(str(tmp_path / "a"), LocalHost()) != \
        store.model_config_sha256(str(tmp_path / "b"), LocalHost())


def one_run(samples: dict[str, list[float]], saved: str = "") -> store.StoredLevel:
    return store.StoredLevel(key(), (store.StoredRun(samples, saved),))


def test_a_baseline_file_round_trips_and_a_bad_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    level = one_run({"output_tok_s": BASE}, "2026-12-01T00:00:00+00:00")
    store.save(path, {"t | s | c8": level})
    assert store.load(path) == {"t | s | c8": level}
    # a version-1 file (one run per level, beside its key) reads as one run
    path.write_text(json.dumps({"format": "pytest-gpuready-baseline", "version": 1, "levels": {"t | s | c8": {
        "key": key().to_dict(), "samples": {"output_tok_s": BASE}, "saved": "2026-12-01T00:00:00+00:00"}}}))
    assert store.load(path) == {"t | s | c8": level}
    path.write_text('{"format": "pytest-gpuready-baseline", "version": 3, "levels": {}}')
    with pytest.raises(store.BaselineFileError, match="baseline version 3: this plugin reads versions 1, 2"):
        store.load(path)
    path.write_text(json.dumps({"format": "pytest-gpuready-baseline", "version": 2,
                                "levels": {"x": {"key": key().to_dict(), "runs": []}}}))
    with pytest.raises(store.BaselineFileError, match="level 'x': runs: expected a list of one or more runs"):
        store.load(path)
    path.write_text('{"format": "something else"}')
    with pytest.raises(store.BaselineFileError, match="not a pytest-gpuready baseline"):
        store.load(path)
    path.write_text('{"format": "pytest-gpuready-baseline", "version": 1, "levels": {"x": {"key": {}}}}')
    with pytest.raises(store.BaselineFileError, match="level 'x': key lacks gpu_model"):
        store.load(path)


# ---------------------------------------------------------------- clock-event reasons (host/clock_events.py)


def masks(*readings: dict[int, int | None]) -> ClockEventRecord:
    """What the sampler records from these readings in turn (the last one repeats)."""
    queue = list(readings)
    sampler = ClockEventSampler(reader=lambda: queue.pop(0) if len(queue) > 1 else queue[0], interval_s=0.01)
    return sampler.start().stop()


def test_a_throttled_level_is_invalid_and_a_power_cap_only_recorded() -> None:
    samples = {"output_tok_s": BASE}
    stored = one_run(samples)
    throttled = masks({0: 0x4}, {0: 0x4 | 0x8}, {0: 0x4})
    verdict = judge_level("l", 8, key(), samples, throttled, stored)
    assert verdict.verdict == "invalid"
    assert verdict.reason.startswith("throttled (GPU 0: hw_slowdown over ")
    capped = masks({0: 0x4})  # an H200 at its 700 W cap under load reads 0x...04
    assert judge_level("l", 8, key(), samples, capped, stored).verdict == "ok"


def test_the_level_verdicts_in_order() -> None:
    samples = {"output_tok_s": BASE, "ttft_p99": BASE}
    stored = one_run(samples)
    unread = ClockEventRecord(seen={}, samples=0, started_at=0.0, stopped_at=1.0, errors=("NVML gone",))
    assert judge_level("l", 8, key(), samples, unread, stored).verdict == "invalid"
    assert "clock-event reasons not read" in judge_level("l", 8, key(), samples, unread, stored).reason
    assert judge_level("l", 8, key(), samples, unread, stored, on_gpu=False).verdict == "ok"  # a CPU host
    assert judge_level("l", 8, key(), samples, None, None, on_gpu=False).verdict == "no baseline"
    refused = judge_level("l", 8, key(vllm_version="0.26.0"), samples, None, stored, on_gpu=False)
    assert refused.line() == "c8: not comparable: vLLM version differs (baseline 0.25.0, now 0.26.0)"
    slower = {"output_tok_s": [v * 0.5 for v in BASE], "ttft_p99": [v * 1.05 for v in BASE]}
    growing = judge_level("l", 8, key(), slower, None, stored, on_gpu=False)
    assert growing.verdict == "undecided"
    assert growing.growing  # undecided only for want of runs: --gpuready-baseline-save keeps it
    assert growing.reason.endswith("(save 2 more runs with --gpuready-baseline-save)")
    three = store.StoredLevel(key(), tuple(store.StoredRun({"output_tok_s": run, "ttft_p99": run}, "")
                                           for run in RUNS))
    assert three.pooled()["output_tok_s"] == [v for run in RUNS for v in run]
    regressed = judge_level("l", 8, key(), slower, None, three, on_gpu=False)
    assert regressed.verdict == "regressed"
    assert regressed.runs == 3
    assert not regressed.growing
    assert regressed.reason.startswith("output tok/s 92.82 -> 50 tok/s (-46.1%, factor 1.86 > 1.10; rounds p=1.7e-06")
    assert judge_level("l", 8, key(), slower, None, three, {"output_tok_s": 1.5}, on_gpu=False).verdict == "ok"
    assert judge_level("l", 8, key(), slower, None, stored, on_gpu=False, min_runs=1).verdict == "regressed"
    few_rounds = judge_level("l", 8, key(), {"output_tok_s": [50.0, 51.0]}, None,
                             one_run({"output_tok_s": [100.0, 101.0]}), on_gpu=False, min_runs=1)
    assert few_rounds.verdict == "undecided"
    assert not few_rounds.growing
    assert few_rounds.reason.endswith("(use more rounds (rounds=7 or more with a one-run baseline))")


def test_a_saved_run_is_added_and_the_oldest_dropped() -> None:
    level = one_run({"output_tok_s": [1.0]})
    for n in range(2, 13):
        level = level.with_run(key(), store.StoredRun({"output_tok_s": [float(n)]}, ""))
    assert len(level.runs) == store.MAX_RUNS_KEPT == 10
    assert [run.samples["output_tok_s"][0] for run in level.runs] == [float(n) for n in range(3, 13)]
    moved = level.with_run(key(vllm_version="0.26.0"), store.StoredRun({"output_tok_s": [99.0]}, ""))
    assert len(moved.runs) == 1  # another key starts over
    assert moved.key.vllm_version == "0.26.0"
