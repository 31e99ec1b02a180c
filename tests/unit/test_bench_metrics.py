"""The benchmark's pure parts: vLLM's metric definitions on hand-computed numbers, SSE framing, prompts.

The numbers in the first test are worked out by hand in the comments; the same aggregation is
compared with vLLM's own ``calculate_metrics`` in tests/vllm/test_metrics_match_vllm.py.
"""

from __future__ import annotations

import math
import random

import pytest

from pytest_gpuready import BenchResult
from pytest_gpuready.serve.bench import PromptFactory, RequestOutcome, calculate_metrics, latency_stats, percentile
from pytest_gpuready.serve.loadgen import iter_sse_data
from pytest_gpuready.serve.thresholds import (
    check_latency,
    check_no_failed_requests,
    check_output_throughput,
    check_weights_per_gpu,
    streams_label,
)

# A: 5 output tokens, chunks at 0.1, 0.2, 0.3, 0.5 s after its start at 0.0.
A = RequestOutcome(True, start_time=0.0, ttft_s=0.1, latency_s=0.5, itl_s=(0.1, 0.1, 0.2),
                   prompt_tokens=10, output_tokens=5)
# B: 3 output tokens, started at 0.05, chunks 0.2, 0.3, 0.4 s after.
B = RequestOutcome(True, start_time=0.05, ttft_s=0.2, latency_s=0.4, itl_s=(0.1, 0.1),
                   prompt_tokens=10, output_tokens=3)
FAILED = RequestOutcome(False, start_time=0.1, error="HTTP 500: boom")


def test_metrics_as_vllm_defines_them() -> None:
    level = calculate_metrics([A, B, FAILED], duration_s=1.0, concurrency=2)
    assert (level.completed, level.failed) == (2, 1)
    assert level.total_input_tokens == 20          # 10 + 10, from usage.prompt_tokens
    assert level.total_output_tokens == 8          # 5 + 3 (+ 0 for the failure)
    assert level.request_throughput == 2.0         # 2 completed / 1 s
    assert level.output_throughput == 8.0          # 8 tokens / 1 s
    assert level.total_token_throughput == 28.0    # (20 + 8) / 1 s
    # TTFT 0.1 and 0.2 s: mean = median = 150 ms, population std 50 ms, p99 = 100 + 0.99 * 100 = 199 ms
    assert level.ttft.mean_ms == pytest.approx(150.0)
    assert level.ttft.median_ms == pytest.approx(150.0)
    assert level.ttft.std_ms == pytest.approx(50.0)
    assert level.ttft.p99_ms == pytest.approx(199.0)
    # TPOT: A (0.5 - 0.1) / (5 - 1) = 0.1 s, B (0.4 - 0.2) / (3 - 1) = 0.1 s
    assert level.tpot.mean_ms == pytest.approx(100.0)
    assert level.tpot.std_ms == pytest.approx(0.0)
    # ITL pooled: 0.1 0.1 0.2 0.1 0.1 -> mean 120 ms, median 100 ms, std 40 ms,
    # p99 at rank 4 * 0.99 = 3.96 -> 100 + 0.96 * 100 = 196 ms
    assert level.itl.mean_ms == pytest.approx(120.0)
    assert level.itl.median_ms == pytest.approx(100.0)
    assert level.itl.std_ms == pytest.approx(40.0)
    assert level.itl.p99_ms == pytest.approx(196.0)
    # E2EL 0.5 and 0.4 s
    assert level.e2el.mean_ms == pytest.approx(450.0)
    assert level.e2el.p99_ms == pytest.approx(499.0)
    # Peak: every chunk (A at .1 .2 .3 .5, B at .25 .35 .45) falls in second 0: 7 tokens
    assert level.max_output_tokens_per_s == 7.0
    assert level.errors == ("HTTP 500: boom",)


def test_single_token_requests_have_no_tpot_and_missing_counts_count_one() -> None:
    one = RequestOutcome(True, 0.0, 0.05, 0.05, (), 4, 1)
    unknown = RequestOutcome(True, 0.0, 0.05, 0.25, (0.1, 0.1), 4, None)
    level = calculate_metrics([one, unknown], duration_s=0.5, concurrency=1)
    assert level.total_output_tokens == 2
    assert level.tpot.mean_ms == 0.0  # no request with more than one token: vLLM reports 0
    assert level.output_throughput == 4.0


def test_no_successful_request_gives_zeros_like_vllm() -> None:
    level = calculate_metrics([FAILED], duration_s=2.0, concurrency=1)
    assert (level.completed, level.failed, level.output_throughput) == (0, 1, 0.0)
    assert level.ttft.mean_ms == 0.0


def test_duration_must_be_positive() -> None:
    with pytest.raises(ValueError, match="duration_s must be > 0"):
        calculate_metrics([A], duration_s=0.0, concurrency=1)


def test_percentile_is_numpys_linear_interpolation() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 99) == 0.0


def test_percentile_and_std_agree_with_numpy_on_random_samples() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    for size in (1, 2, 3, 10, 101):
        values = [rng.expovariate(10.0) for _ in range(size)]
        stats = latency_stats(values)
        assert stats.p99_ms == pytest.approx(float(np.percentile(values, 99)) * 1000)
        assert stats.median_ms == pytest.approx(float(np.median(values)) * 1000)
        assert stats.std_ms == pytest.approx(float(np.std(values)) * 1000)
        assert stats.mean_ms == pytest.approx(float(np.mean(values)) * 1000)


def test_sse_events_split_anywhere_are_reassembled() -> None:
    stream = (b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\n'
              b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    for cut in range(1, len(stream)):
        chunks = iter([stream[:cut], stream[cut:]])
        assert [data for data, _ in iter_sse_data(chunks)] == [
            '{"choices":[{"text":"a"}]}', '{"choices":[{"text":"b"}]}',
            '{"choices":[],"usage":{"completion_tokens":2}}', "[DONE]",
        ]


def test_sse_comments_and_a_final_event_without_blank_line() -> None:
    data = [d for d, _ in iter_sse_data(iter([b": ping\n\ndata: 1\n\ndata: 2"]))]
    assert data == ["1", "2"]


def test_token_id_prompts_have_the_exact_length_and_differ() -> None:
    factory = PromptFactory(32, vocabulary=tuple(range(100, 200)), seed=3)
    prompts: list[list[int]] = []
    for _ in range(50):
        prompt = factory.next_prompt()
        assert isinstance(prompt, list)
        prompts.append(prompt)
    assert all(len(p) == 32 for p in prompts)
    assert all(100 <= t < 200 for p in prompts for t in p)
    assert len({tuple(p) for p in prompts}) == 50  # no shared prefix for the prefix cache to reuse
    again = PromptFactory(32, vocabulary=tuple(range(100, 200)), seed=3)
    assert again.next_prompt() == prompts[0]


def test_text_prompts_when_the_server_cannot_tokenize() -> None:
    prompt = PromptFactory(20, seed=1, mode="text").next_prompt()
    assert isinstance(prompt, str)
    assert len(prompt.split()) == 20


# ---------------------------------------------------------------- thresholds and their messages

def _result() -> BenchResult:
    single = calculate_metrics([A], duration_s=1.0, concurrency=1)
    many = calculate_metrics([A, B, FAILED], duration_s=1.0, concurrency=2)
    return BenchResult("http://gpu-box:8000", "minimax", 10, 5, "token_ids", (single, many))


CONTEXT = "MiniMax-M2.5, TP=4, 4x RTX PRO 6000"


def test_streams_label() -> None:
    assert streams_label(1) == "single-stream"
    assert streams_label(256) == "256-stream"


def test_throughput_below_threshold_reads_like_an_engineer_wrote_it() -> None:
    verdict = check_output_throughput(_result(), 1, 80, CONTEXT)
    assert not verdict.ok
    assert verdict.summary == "single-stream output 5.0 tok/s < 80 tok/s required (MiniMax-M2.5, TP=4, 4x RTX PRO 6000)"
    assert verdict.details[0] == ("measured over 1 request of 10 prompt + 5 output tokens at concurrency 1 "
                                  "in 1.0 s (0 failed)")
    assert verdict.evidence["output_tok_s"] == 5.0


def test_throughput_meeting_threshold_passes() -> None:
    verdict = check_output_throughput(_result(), 2, 8, CONTEXT)
    assert verdict.ok
    assert verdict.summary == "2-stream output 8.0 tok/s >= 8 tok/s required (MiniMax-M2.5, TP=4, 4x RTX PRO 6000)"


def test_threshold_at_an_unmeasured_concurrency_fails_as_not_measured() -> None:
    verdict = check_output_throughput(_result(), 256, 2500, CONTEXT)
    assert not verdict.ok
    assert verdict.summary == ("256-stream output: not measured (no result at concurrency 256; measured: 1, 2) "
                               "(MiniMax-M2.5, TP=4, 4x RTX PRO 6000)")


def test_latency_threshold() -> None:
    bad = check_latency(_result(), 2, "ttft", 150, CONTEXT)
    assert bad.summary == "2-stream p99 TTFT 199.0 ms > 150 ms allowed (MiniMax-M2.5, TP=4, 4x RTX PRO 6000)"
    assert not bad.ok
    assert check_latency(_result(), 2, "tpot", 100.5, CONTEXT, stat="mean").ok
    with pytest.raises(ValueError, match="metric 'ttlt'"):
        check_latency(_result(), 2, "ttlt", 1, CONTEXT)
    with pytest.raises(ValueError, match="stat 'p95'"):
        check_latency(_result(), 2, "ttft", 1, CONTEXT, stat="p95")


def test_failed_requests_are_reported_with_their_errors() -> None:
    verdict = check_no_failed_requests(_result(), CONTEXT)
    assert not verdict.ok
    assert verdict.summary == "1 benchmark request failed (MiniMax-M2.5, TP=4, 4x RTX PRO 6000)"
    assert verdict.details == ("2-stream: 1 of 3 failed: HTTP 500: boom",)


def test_weights_per_gpu_bounds() -> None:
    ok = check_weights_per_gpu((53.44, 53.44, 53.44, 53.44), 50, 57, CONTEXT)
    assert ok.ok
    assert ok.summary == ("weights 53.44/53.44/53.44/53.44 GiB per GPU within [50, 57] GiB "
                          "(MiniMax-M2.5, TP=4, 4x RTX PRO 6000)")
    high = check_weights_per_gpu((53.4, 61.2), 50, 57, CONTEXT)
    assert high.summary == "weights 61.2 GiB on rank 1 > 57 GiB allowed (MiniMax-M2.5, TP=4, 4x RTX PRO 6000)"
    unmeasured = check_weights_per_gpu((), 50, 57, CONTEXT)
    assert not unmeasured.ok
    assert "not measured" in unmeasured.summary


def test_result_lookup_and_table() -> None:
    result = _result()
    assert result.at(2).completed == 2
    with pytest.raises(KeyError, match="no result at concurrency 8"):
        result.at(8)
    table = result.table()
    assert "Output token throughput (tok/s)" in table
    assert table.splitlines()[0] == "minimax at http://gpu-box:8000: 10 prompt + 5 output tokens"
    data = result.to_dict()
    assert data["levels"][1]["p99_ttft_ms"] == pytest.approx(199.0)
    assert data["levels"][1]["output_throughput"] == 8.0
    assert math.isclose(data["levels"][0]["mean_e2el_ms"], 500.0)
