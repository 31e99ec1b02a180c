"""The baseline comparison's pure parts: the exact Mann-Whitney U test, metric directions,
tolerances, the comparability key, clock-event reasons and the level verdict."""

from __future__ import annotations

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
    result = compare_metric(THROUGHPUT, BASE, slower, 0.10)
    assert result.verdict == "regressed"
    assert result.change == pytest.approx(-0.2, abs=0.01)
    assert result.factor == pytest.approx(1.25, abs=0.01)
    assert result.p_value < 0.002
    assert result.effect_size == -1.0
    assert "output tok/s 100 -> 80" in result.describe()
    assert "factor 1.25 > 1.10" in result.describe()


def test_a_higher_latency_regresses_and_a_lower_one_improves() -> None:
    assert compare_metric(TTFT, BASE, [v * 1.3 for v in BASE], 0.10).verdict == "regressed"
    assert compare_metric(TTFT, BASE, [v * 0.7 for v in BASE], 0.10).verdict == "improved"
    assert compare_metric(THROUGHPUT, BASE, [v * 1.3 for v in BASE], 0.10).verdict == "improved"


def test_within_the_tolerance_is_ok_however_significant() -> None:
    result = compare_metric(THROUGHPUT, BASE, [v * 0.95 for v in BASE], 0.10)
    assert result.p_value < 0.002
    assert result.verdict == "ok"


def test_beyond_the_tolerance_but_within_noise_is_ok() -> None:
    # the medians differ by > 10%, but the rounds interleave: one noisy round does not make a regression
    noisy_base = [100.0, 60.0, 100.0, 62.0, 100.0, 101.0, 99.0]
    noisy_now = [88.0, 100.0, 61.0, 87.0, 100.0, 86.0, 63.0]
    result = compare_metric(THROUGHPUT, noisy_base, noisy_now, 0.10)
    assert result.factor > 1.1
    assert result.p_value > 0.002
    assert result.verdict == "ok"


def test_too_few_rounds_to_decide_is_undecided_not_a_pass() -> None:
    result = compare_metric(THROUGHPUT, BASE[:3], [v * 0.5 for v in BASE[:3]], 0.10)
    assert result.verdict == "undecided"


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


def test_a_baseline_file_round_trips_and_a_bad_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    level = store.StoredLevel(key(), {"output_tok_s": BASE}, "2026-12-01T00:00:00+00:00")
    store.save(path, {"t | s | c8": level})
    assert store.load(path) == {"t | s | c8": level}
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
    stored = store.StoredLevel(key(), samples, "")
    throttled = masks({0: 0x4}, {0: 0x4 | 0x8}, {0: 0x4})
    verdict = judge_level("l", 8, key(), samples, throttled, stored)
    assert verdict.verdict == "invalid"
    assert verdict.reason.startswith("throttled (GPU 0: hw_slowdown over ")
    capped = masks({0: 0x4})  # an H200 at its 700 W cap under load reads 0x...04
    assert judge_level("l", 8, key(), samples, capped, stored).verdict == "ok"


def test_the_level_verdicts_in_order() -> None:
    samples = {"output_tok_s": BASE, "ttft_p99": BASE}
    stored = store.StoredLevel(key(), samples, "")
    unread = ClockEventRecord(seen={}, samples=0, started_at=0.0, stopped_at=1.0, errors=("NVML gone",))
    assert judge_level("l", 8, key(), samples, unread, stored).verdict == "invalid"
    assert "clock-event reasons not read" in judge_level("l", 8, key(), samples, unread, stored).reason
    assert judge_level("l", 8, key(), samples, unread, stored, on_gpu=False).verdict == "ok"  # a CPU host
    assert judge_level("l", 8, key(), samples, None, None, on_gpu=False).verdict == "no baseline"
    refused = judge_level("l", 8, key(vllm_version="0.26.0"), samples, None, stored, on_gpu=False)
    assert refused.line() == "c8: not comparable: vLLM version differs (baseline 0.25.0, now 0.26.0)"
    slower = {"output_tok_s": [v * 0.5 for v in BASE], "ttft_p99": [v * 1.05 for v in BASE]}
    regressed = judge_level("l", 8, key(), slower, None, stored, on_gpu=False)
    assert regressed.verdict == "regressed"
    assert regressed.reason.startswith("output tok/s 100 -> 50")
    assert judge_level("l", 8, key(), slower, None, stored, {"output_tok_s": 1.5}, on_gpu=False).verdict == "ok"
