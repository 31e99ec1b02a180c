"""Our metric aggregation equals vLLM's own ``calculate_metrics`` on the same request timings.

No server: random but realistic per-request timings are fed both to
:func:`pytest_gpuready.serve.bench.calculate_metrics` and to ``vllm.benchmarks.serve.calculate_metrics``
from the installed vLLM, and every reported figure must agree. This pins "the metrics exactly as
``vllm bench serve`` defines them" to the code vLLM ships, not to our reading of it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from pytest_gpuready.serve.bench import RequestOutcome, calculate_metrics

# Importing vLLM imports torch, which warns about its own deprecations; they are not ours.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _outcomes(seed: int, count: int) -> list[RequestOutcome]:
    rng = random.Random(seed)
    outcomes = []
    for i in range(count):
        if i % 7 == 3:
            outcomes.append(RequestOutcome(False, start_time=rng.uniform(0, 2), error="HTTP 503"))
            continue
        tokens = rng.choice([1, 2, 16, 64])
        ttft = rng.uniform(0.01, 0.4)
        itl = tuple(rng.expovariate(200.0) for _ in range(tokens - 1))
        outcomes.append(RequestOutcome(True, rng.uniform(0, 2), ttft, ttft + sum(itl), itl,
                                       rng.randint(8, 64), tokens))
    return outcomes


def _vllm_metrics(outcomes: list[RequestOutcome], duration_s: float) -> Any:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics as vllm_calculate_metrics

    outputs = []
    for o in outcomes:
        out = RequestFuncOutput()
        out.success = o.success
        out.start_time = o.start_time
        out.ttft = o.ttft_s
        out.latency = o.latency_s
        out.itl = list(o.itl_s)
        out.prompt_len = o.prompt_tokens
        out.output_tokens = o.output_tokens or 0
        out.error = o.error or ""
        outputs.append(out)
    metrics, _ = vllm_calculate_metrics(
        input_requests=[], outputs=outputs, dur_s=duration_s, tokenizer=None,
        selected_percentiles=[99.0], goodput_config_dict={},
    )
    return metrics


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_figure_matches_vllm_calculate_metrics(seed: int, capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = _outcomes(seed, 40)
    ours = calculate_metrics(outcomes, duration_s=3.5, concurrency=8)
    theirs = _vllm_metrics(outcomes, 3.5)
    capsys.readouterr()  # vLLM prints its failed requests and a plotting tip
    assert (ours.completed, ours.failed) == (theirs.completed, theirs.failed)
    assert ours.total_input_tokens == theirs.total_input
    assert ours.total_output_tokens == theirs.total_output
    assert ours.request_throughput == pytest.approx(theirs.request_throughput)
    assert ours.output_throughput == pytest.approx(theirs.output_throughput)
    assert ours.total_token_throughput == pytest.approx(theirs.total_token_throughput)
    assert ours.max_output_tokens_per_s == pytest.approx(theirs.max_output_tokens_per_s)
    for name in ("ttft", "tpot", "itl", "e2el"):
        stats = getattr(ours, name)
        assert stats.mean_ms == pytest.approx(getattr(theirs, f"mean_{name}_ms")), name
        assert stats.median_ms == pytest.approx(getattr(theirs, f"median_{name}_ms")), name
        assert stats.std_ms == pytest.approx(getattr(theirs, f"std_{name}_ms")), name
        assert stats.p99_ms == pytest.approx(dict(getattr(theirs, f"percentiles_{name}_ms"))[99.0]), name
