"""Serving benchmark: streaming completions at fixed lengths and concurrencies, measured as vLLM does.

The numbers must mean what the numbers of ``vllm bench serve`` mean, or a threshold copied from a
vLLM benchmark report would gate the wrong thing. So each request is timed on the client exactly
as ``vllm/benchmarks/lib/endpoint_request_func.py`` times an OpenAI completions request:

* TTFT: from just before the POST to the first SSE event that carries ``choices``;
* ITL: the gaps between successive events that carry ``choices``;
* E2EL (latency): from the POST to the last such event;
* output tokens and prompt tokens: the server's ``usage`` (``stream_options.include_usage``);

and aggregated as ``calculate_metrics`` in ``vllm/benchmarks/serve.py`` does (see
:func:`calculate_metrics`). The workload is vLLM's ``random`` dataset in spirit: every request gets
its own prompt of exactly ``prompt_tokens`` token ids (sent as a list of ints, which vLLM accepts,
so the count is exact and no prefix is shared), ``max_tokens=output_tokens`` with ``ignore_eos``.

Concurrency is N workers on one event loop (:mod:`pytest_gpuready.serve.loadgen`), each with its own
keep-alive HTTP connection, pulling from a shared request counter: the same "at most N in flight"
as ``--max-concurrency N`` with an infinite request rate.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import requests as requests_lib

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.host.clock_events import ClockEventRecord, ClockEventSampler
from pytest_gpuready.host.xid_watch import XidRecord, XidWatcher
from pytest_gpuready.serve.loadgen import Endpoint, RequestOutcome, run_coroutine, run_requests

DEFAULT_CONCURRENCY = (1, 8, 64)
DEFAULT_PROMPT_TOKENS = 256
DEFAULT_OUTPUT_TOKENS = 128
DEFAULT_WARMUP = 2
MAX_ROUNDS = 50
MILLISECONDS = 1000.0

# Text whose tokens make up the prompts' vocabulary (random draws from its token ids).
_VOCAB_TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "A GPU server runs large language models; engineers measure throughput in tokens per second, "
    "time to first token, and inter-token latency. 0123456789 Sphinx of black quartz, judge my vow! "
    "Serving, batching, scheduling, memory, cache, kernels, attention, experts, tensor parallel."
)


class BenchmarkError(GpuReadyError):
    """The benchmark could not measure: no request succeeded, or the server does not report usage."""


class ServerGoneError(BenchmarkError):
    """The server's process ended during the benchmark (``alive`` said so): the benchmark stopped sending."""

    def __init__(self, message: str, sent: int, failed: int, xids: XidRecord | None = None) -> None:
        self.sent = sent
        self.failed = failed
        self.xids = xids
        """The Xids raised during the level the server died in (None: not watched)."""
        super().__init__(message)


class XidDuringBenchmarkError(BenchmarkError):
    """The driver raised an Xid on the server's GPUs while a level ran: the GPU failed under load."""

    def __init__(self, message: str, level: LevelResult) -> None:
        self.level = level
        super().__init__(message)


@dataclass(frozen=True)
class LatencyStats:
    """mean / median / std / p99 in milliseconds, as vLLM reports them (numpy's definitions)."""

    mean_ms: float
    median_ms: float
    std_ms: float
    p99_ms: float

    def get(self, stat: str) -> float:
        if stat not in ("mean", "median", "std", "p99"):
            raise ValueError(f"stat {stat!r}: expected mean, median, std or p99")
        value: float = getattr(self, f"{stat}_ms")
        return value


@dataclass(frozen=True)
class LevelResult:
    """All metrics at one concurrency, named as in ``vllm bench serve``'s result."""

    concurrency: int
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    errors: tuple[str, ...] = ()
    clock_events: ClockEventRecord | None = None
    """The GPUs' clock-event reasons sampled while this level ran (None: not sampled). A level whose
    GPUs slowed themselves (HW slowdown, thermal, power brake) measured the cooling, not vLLM."""
    xids: XidRecord | None = None
    """The Xids raised on the server's GPUs while this level ran (None: not watched)."""

    @property
    def throttled(self) -> dict[int, tuple[str, ...]]:
        """GPU -> throttling reasons seen during the level (empty: none, or not sampled)."""
        return self.clock_events.throttled if self.clock_events is not None else {}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "max_concurrency": self.concurrency,
            "completed": self.completed,
            "failed": self.failed,
            "duration": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            stats: LatencyStats = getattr(self, name)
            for stat, value in asdict(stats).items():
                data[f"{stat.removesuffix('_ms')}_{name}_ms"] = value
        data["errors"] = list(self.errors)
        if self.clock_events is not None:
            data["clock_events"] = self.clock_events.to_dict()
        if self.xids is not None:
            data["xids"] = self.xids.to_dict()
        return data


@dataclass(frozen=True)
class BenchResult:
    """Results at each concurrency, with the workload that produced them."""

    url: str
    model: str
    prompt_tokens: int
    output_tokens: int
    prompt_mode: str
    """``token_ids`` (exact lengths) or ``text`` (the server's /tokenize was not available)."""
    levels: tuple[LevelResult, ...]
    """Per concurrency, every round's requests taken together (throughput over the rounds' summed time)."""
    warmup: int = 0
    rounds: tuple[tuple[LevelResult, ...], ...] = ()
    """Per concurrency (in the order of ``levels``), each round on its own: the samples a baseline
    comparison ranks. Empty for results built by hand."""
    requests: tuple[int, ...] = ()
    """Requests per round at each concurrency (in the order of ``levels``)."""

    def rounds_at(self, concurrency: int) -> tuple[LevelResult, ...]:
        """Each round at ``concurrency`` (the pooled level alone when rounds were not kept)."""
        for index, level in enumerate(self.levels):
            if level.concurrency == concurrency:
                return self.rounds[index] if index < len(self.rounds) else (level,)
        return ()

    def at(self, concurrency: int) -> LevelResult:
        for level in self.levels:
            if level.concurrency == concurrency:
                return level
        measured = ", ".join(str(level.concurrency) for level in self.levels)
        raise KeyError(f"no result at concurrency {concurrency}; measured: {measured}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "model": self.model, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "prompt_mode": self.prompt_mode, "warmup": self.warmup,
            "levels": [{**level.to_dict(), "rounds": len(self.rounds_at(level.concurrency)),
                        "requests_per_round": self.requests[index] if index < len(self.requests) else None}
                       for index, level in enumerate(self.levels)],
        }

    def table(self) -> str:
        """A compact table like vLLM's result block, one column per concurrency."""
        rows: list[tuple[str, Callable[[LevelResult], str]]] = [
            ("Concurrency", lambda r: f"{r.concurrency}"),
            ("Successful / failed", lambda r: f"{r.completed}/{r.failed}"),
            ("Duration (s)", lambda r: f"{r.duration_s:.2f}"),
            ("Request throughput (req/s)", lambda r: f"{r.request_throughput:.2f}"),
            ("Output token throughput (tok/s)", lambda r: f"{r.output_throughput:.1f}"),
            ("Total token throughput (tok/s)", lambda r: f"{r.total_token_throughput:.1f}"),
            ("Mean / P99 TTFT (ms)", lambda r: f"{r.ttft.mean_ms:.1f} / {r.ttft.p99_ms:.1f}"),
            ("Mean / P99 TPOT (ms)", lambda r: f"{r.tpot.mean_ms:.2f} / {r.tpot.p99_ms:.2f}"),
            ("Mean / P99 ITL (ms)", lambda r: f"{r.itl.mean_ms:.2f} / {r.itl.p99_ms:.2f}"),
            ("Mean / P99 E2EL (ms)", lambda r: f"{r.e2el.mean_ms:.1f} / {r.e2el.p99_ms:.1f}"),
        ]
        lines = [f"{self.model} at {self.url}: {self.prompt_tokens} prompt + {self.output_tokens} output tokens"]
        for label, fmt in rows:
            lines.append(f"  {label:<34}" + "".join(f"{fmt(level):>18}" for level in self.levels))
        return "\n".join(lines)


# ---------------------------------------------------------------------------- pure statistics

def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _std(values: Sequence[float]) -> float:
    """Population standard deviation (numpy's ``np.std`` default, ddof=0)."""
    if not values:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def percentile(values: Sequence[float], p: float) -> float:
    """numpy's default (linear interpolation between closest ranks) percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_stats(values_s: Sequence[float]) -> LatencyStats:
    return LatencyStats(
        mean_ms=_mean(values_s) * MILLISECONDS,
        median_ms=percentile(values_s, 50) * MILLISECONDS,
        std_ms=_std(values_s) * MILLISECONDS,
        p99_ms=percentile(values_s, 99) * MILLISECONDS,
    )


def _peak_output_tokens_per_s(outcomes: Sequence[RequestOutcome]) -> float:
    """vLLM's "Peak output token throughput": the most chunk arrivals in one 1-second bucket."""
    ok = [o for o in outcomes if o.success]
    if not ok:
        return 0.0
    begin = min(o.start_time for o in ok)
    end = max(o.start_time + o.latency_s for o in ok)
    buckets = [0] * (math.ceil(end - begin) + 1)
    for outcome in ok:
        moment = outcome.start_time + outcome.ttft_s
        times = [moment]
        for gap in outcome.itl_s:
            moment += gap
            times.append(moment)
        for stamp in times:
            index = int(stamp - begin)
            if 0 <= index < len(buckets):
                buckets[index] += 1
    return float(max(buckets))


def calculate_metrics(outcomes: Sequence[RequestOutcome], duration_s: float, concurrency: int) -> LevelResult:
    """Aggregate per-request outcomes exactly as vLLM's ``calculate_metrics`` (vllm/benchmarks/serve.py).

    TPOT per request is ``(latency - ttft) / (output_tokens - 1)`` for requests with more than one
    output token; ITL pools every request's gaps; throughputs divide by the wall duration of the
    whole level. A successful request without a token count counts 1 token, as vLLM does without
    a tokenizer (run_benchmark never produces one: it marks such a request failed).
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    output_lens: list[int] = []
    total_input = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    completed = 0
    errors: list[str] = []
    for outcome in outcomes:
        if not outcome.success:
            output_lens.append(0)
            if outcome.error:
                errors.append(outcome.error)
            continue
        output_len = outcome.output_tokens or 1
        output_lens.append(output_len)
        total_input += outcome.prompt_tokens
        if output_len > 1:
            tpots.append((outcome.latency_s - outcome.ttft_s) / (output_len - 1))
        itls.extend(outcome.itl_s)
        ttfts.append(outcome.ttft_s)
        e2els.append(outcome.latency_s)
        completed += 1
    total_output = sum(output_lens)
    return LevelResult(
        concurrency=concurrency,
        completed=completed,
        failed=len(outcomes) - completed,
        duration_s=duration_s,
        total_input_tokens=total_input,
        total_output_tokens=total_output,
        request_throughput=completed / duration_s,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        max_output_tokens_per_s=_peak_output_tokens_per_s(outcomes),
        ttft=latency_stats(ttfts),
        tpot=latency_stats(tpots),
        itl=latency_stats(itls),
        e2el=latency_stats(e2els),
        errors=tuple(dict.fromkeys(errors))[:10],
    )


# ---------------------------------------------------------------------------- the load generator

@dataclass
class PromptFactory:
    """Distinct prompts of an exact length: token ids drawn from the server's own tokenization."""

    prompt_tokens: int
    vocabulary: tuple[int, ...] = ()
    seed: int = 0
    mode: str = "token_ids"
    _counter: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def next_prompt(self) -> list[int] | str:
        with self._lock:
            index = self._counter
            self._counter += 1
        rng = random.Random(self.seed * 1_000_003 + index)
        if self.mode == "token_ids":
            return [rng.choice(self.vocabulary) for _ in range(self.prompt_tokens)]
        words = _VOCAB_TEXT.split()
        return " ".join(rng.choice(words) for _ in range(self.prompt_tokens))


def make_prompt_factory(
    session: requests_lib.Session, base_url: str, model: str, prompt_tokens: int, seed: int
) -> PromptFactory:
    """Token-id prompts from the server's ``/tokenize`` (vLLM); plain text where it is missing."""
    try:
        response = session.post(f"{base_url}/tokenize", json={
            "model": model, "prompt": _VOCAB_TEXT, "add_special_tokens": False}, timeout=30)
        tokens = response.json().get("tokens") if response.status_code == 200 else None
    except (requests_lib.RequestException, ValueError, AttributeError):
        tokens = None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens):
        return PromptFactory(prompt_tokens, tuple(sorted(set(tokens))), seed)
    return PromptFactory(prompt_tokens, (), seed, mode="text")


class _GoneCheck:
    """Asked after each failed request: is the server's process gone?

    A SIGKILLed server refuses connections a little before its process can be seen to have
    ended (the kernel closes its sockets, then tears down its memory: longer for a large one),
    so a "still alive" answer is re-checked for up to ``settle_s`` before the request counts as
    an ordinary failure. Once gone, always gone: no further process checks.
    """

    def __init__(self, alive: Callable[[], bool], settle_s: float = 2.0) -> None:
        self.alive = alive
        self.settle_s = settle_s
        self.gone = False
        self._lock = threading.Lock()

    def __call__(self, outcome: RequestOutcome) -> bool:
        if (outcome.error or "").startswith(("HTTP ", "server error:")):
            return self.gone  # the server answered: its process lives
        with self._lock:
            if self.gone:
                return True
            deadline = time.monotonic() + self.settle_s
            while True:
                if not self.alive():
                    self.gone = True
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)


def _run_level(
    endpoint: Endpoint,
    model: str,
    prompts: PromptFactory,
    *,
    concurrency: int,
    requests_total: int,
    output_tokens: int,
    timeout_s: float,
    extra_body: Mapping[str, Any],
    alive: Callable[[], bool] | None = None,
) -> tuple[list[RequestOutcome], float]:
    def payload() -> dict[str, Any]:
        # vLLM bench serve's body for the completions API (endpoint_request_func.py).
        return {
            "model": model,
            "prompt": prompts.next_prompt(),
            "repetition_penalty": 1.0,
            "max_tokens": output_tokens,
            "logprobs": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            **extra_body,
        }

    server_gone = _GoneCheck(alive) if alive is not None else None
    outcomes, duration = run_coroutine(lambda: run_requests(endpoint, payload, concurrency=concurrency,
                                                            total=requests_total, timeout_s=timeout_s,
                                                            server_gone=server_gone))
    if alive is not None and len(outcomes) < requests_total and not alive():
        failed = sum(1 for o in outcomes if not o.success)
        errors = "; ".join(dict.fromkeys(o.error or "?" for o in outcomes if not o.success))[:300]
        raise ServerGoneError(f"the server's process is gone: {failed} of {len(outcomes)} requests sent at "
                              f"concurrency {concurrency} failed ({errors}); no more were sent", len(outcomes), failed)
    return outcomes, duration


def run_benchmark(
    url: str,
    model: str,
    concurrency: Sequence[int] | int = DEFAULT_CONCURRENCY,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    output_tokens: int = DEFAULT_OUTPUT_TOKENS,
    requests: int | Mapping[int, int] | None = None,
    warmup: int = DEFAULT_WARMUP,
    *,
    seed: int = 0,
    timeout_s: float = 600.0,
    extra_body: Mapping[str, Any] | None = None,
    alive: Callable[[], bool] | None = None,
    clock_events: Callable[[], ClockEventSampler] | None = None,
    xid_watch: Callable[[], XidWatcher] | None = None,
    rounds: int = 1,
) -> BenchResult:
    """Measure ``model`` at ``url`` at each concurrency; raise :class:`BenchmarkError` if nothing succeeds.

    ``rounds``: each level is measured that many times in a row (``requests`` each): the rounds
    are what a baseline comparison ranks (:mod:`pytest_gpuready.serve.compare`); ``levels`` pools
    them. ``around_level(concurrency)`` is entered around each level's rounds (the plugin samples
    the GPUs' clock-event reasons there).

    ``requests``: requests per concurrency level: one number for all, a mapping concurrency -> count,
    or None for ``max(16, 4 x concurrency)``. ``warmup`` requests run first (at up to the largest
    concurrency) and are not counted, like ``vllm bench serve``'s initial test prompt / ``--num-warmups``.
    Failed requests are counted (``failed``) with their errors, as vLLM does.

    ``alive`` (e.g. :meth:`VLLMServer.is_alive`) is asked after a failed request and before each
    level; once the server's process is gone the benchmark sends nothing more and raises
    :class:`ServerGoneError` instead of counting failures against a dead port.

    ``clock_events`` makes a :class:`~pytest_gpuready.host.clock_events.ClockEventSampler` per level
    (e.g. ``lambda: ClockEventSampler(host, gpus=[0, 1])``); what it saw is the level's ``clock_events``.
    ``xid_watch`` makes a :class:`~pytest_gpuready.host.xid_watch.XidWatcher` per level: an Xid
    raised while a level runs ends the benchmark with :class:`XidDuringBenchmarkError` (the level's
    result attached), and names the Xid first when the server died in that level.
    """
    levels_wanted = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if not levels_wanted or any(not isinstance(c, int) or c < 1 for c in levels_wanted):
        raise ValueError(f"concurrency {concurrency!r}: expected whole numbers >= 1")
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError(f"prompt_tokens and output_tokens must be >= 1, got {prompt_tokens}, {output_tokens}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds {rounds!r}: expected a whole number from 1 to {MAX_ROUNDS}")
    base = url.rstrip("/")
    endpoint = Endpoint.parse(base)
    with requests_lib.Session() as session:
        prompts = make_prompt_factory(session, base, model, prompt_tokens, seed)
    body = dict(extra_body or {})
    if warmup > 0:
        warm, _ = _run_level(endpoint, model, prompts, concurrency=min(warmup, max(levels_wanted)),
                             requests_total=warmup, output_tokens=output_tokens, timeout_s=timeout_s,
                             extra_body=body, alive=alive)
        if not any(o.success for o in warm):
            errors = "; ".join(dict.fromkeys(o.error or "?" for o in warm))
            raise BenchmarkError(f"benchmark of {model} at {base}: every warm-up request failed: {errors}")
    levels: list[LevelResult] = []
    per_round: list[tuple[LevelResult, ...]] = []
    counts: list[int] = []
    for level in levels_wanted:
        count = _requests_for(requests, level)
        if alive is not None and not alive():
            raise ServerGoneError(f"the server's process is gone before concurrency {level}", 0, 0)
        pooled: list[RequestOutcome] = []
        duration_total = 0.0
        results: list[LevelResult] = []
        sampler = clock_events().start() if clock_events is not None else None
        watcher = xid_watch().start() if xid_watch is not None else None
        try:
            for _ in range(rounds):
                outcomes, duration = _run_level(endpoint, model, prompts, concurrency=level,
                                                requests_total=count, output_tokens=output_tokens,
                                                timeout_s=timeout_s, extra_body=body, alive=alive)
                result = calculate_metrics(outcomes, duration, level)
                results.append(result)
                pooled.extend(outcomes)
                duration_total += duration
                if result.completed == 0:
                    break
        except ServerGoneError as exc:
            gone_xids = watcher.stop() if watcher is not None else None
            if gone_xids is None or not gone_xids.seen:
                raise
            raise ServerGoneError(f"{gone_xids.failure(f'concurrency {level}')}; then: {exc}",
                                  exc.sent, exc.failed, gone_xids) from exc
        finally:
            record = sampler.stop() if sampler is not None else None
            xids = watcher.stop() if watcher is not None else None
        pooled_result = results[0] if len(results) == 1 else calculate_metrics(pooled, duration_total, level)
        result = replace(pooled_result, clock_events=record, xids=xids)
        if xids is not None and xids.seen:
            raise XidDuringBenchmarkError(f"{xids.failure(f'the benchmark level at concurrency {level}')}; "
                                          f"the benchmark stopped there", result)
        if results[-1].completed == 0:
            raise BenchmarkError(f"benchmark of {model} at {base}: all {count} requests at concurrency "
                                 f"{level} failed: {'; '.join(results[-1].errors) or 'no error text'}")
        levels.append(result)
        per_round.append(tuple(results))
        counts.append(count)
    return BenchResult(base, model, prompt_tokens, output_tokens, prompts.mode, tuple(levels), warmup,
                       tuple(per_round), tuple(counts))


def _requests_for(requests_spec: int | Mapping[int, int] | None, level: int) -> int:
    if requests_spec is None:
        return max(16, 4 * level)
    if isinstance(requests_spec, int):
        count = requests_spec
    else:
        if level not in requests_spec:
            raise ValueError(f"requests: no count given for concurrency {level}")
        count = requests_spec[level]
    if count < 1:
        raise ValueError(f"requests: expected >= 1 per level, got {count}")
    return count


__all__ = [
    "BenchResult",
    "BenchmarkError",
    "LatencyStats",
    "LevelResult",
    "PromptFactory",
    "RequestOutcome",
    "ServerGoneError",
    "XidDuringBenchmarkError",
    "calculate_metrics",
    "latency_stats",
    "percentile",
    "run_benchmark",
]
