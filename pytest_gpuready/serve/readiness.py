"""Knowing when a server is ready, or dead, against one monotonic deadline.

Readiness follows vLLM's own contract: ``/health`` refuses connections while the model loads,
answers 503 once the engine is dead and 200 when serving; then ``/v1/models`` must list the
served name (and ``max_model_len`` when the spec sets it). Every poll also checks that the
process lives and that the log has not printed a fatal line, so a crash fails at once with
the exit code and the log's last lines instead of after thirty minutes.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import requests

from pytest_gpuready.serve import vllm_log
from pytest_gpuready.serve.footprint import GpuMemoryWatch
from pytest_gpuready.serve.launch import LaunchedProcess, describe_exit
from pytest_gpuready.serve.log_reader import LogReader
from pytest_gpuready.serve.server_errors import (
    EngineDeadError,
    ServerError,
    ServerExitedError,
    ServerMismatchError,
    ServerStartTimeout,
)

ProgressFn: TypeAlias = Callable[[str], None]
FailFn: TypeAlias = Callable[[type[ServerError], str], ServerError]
"""Builds the error to raise, with the server's log tail attached."""


@dataclass(frozen=True)
class ReadyInfo:
    """What the server said once ready."""

    url: str
    model_ids: tuple[str, ...]
    max_model_len: int | None
    startup_s: float
    vllm_version: str | None = None


@dataclass(frozen=True)
class ModelCard:
    """The ``/v1/models`` entry that matched the spec."""

    served_name: str
    model_ids: tuple[str, ...]
    max_model_len: int | None


@dataclass
class ReadinessWait:
    """One wait for one launch (or attachment): poll until ready, dead, or out of time."""

    name: str
    url: str
    http: requests.Session
    fail: FailFn
    say: ProgressFn
    timeout_s: float
    poll_interval_s: float
    progress_interval_s: float
    fatal_grace_s: float
    process: LaunchedProcess | None
    """None when attached: someone else's process, not ours to watch."""
    log: LogReader | None
    argv: Sequence[str]
    memory: GpuMemoryWatch

    def check_alive(self, fatal_seen_at: float | None, fatal_line: str | None) -> None:
        """Raise if the process exited, or the engine printed a fatal line and did not exit in its grace."""
        if self.process is None:
            return
        code = self.process.exit_code()
        if code is not None:
            cause = vllm_log.find_cause(self.log.read_all()) if self.log is not None else None
            reason = describe_exit(code) if code >= 0 else f"was {describe_exit(code)}"
            extra = f": {cause}" if cause else ""
            raise self.fail(ServerExitedError,
                            f"vLLM {self.name} {reason} before it was ready{extra} "
                            f"(command: {shlex.join(self.argv)})")
        if fatal_seen_at is not None and time.monotonic() - fatal_seen_at >= self.fatal_grace_s:
            raise self.fail(EngineDeadError,
                            f"vLLM {self.name}: the engine failed ({fatal_line}) and the server "
                            f"did not exit within {self.fatal_grace_s:g} s; stopping it")

    def progress_line(self, elapsed: float, state: str) -> str:
        text = f"vLLM {self.name}: {elapsed:.0f} s, {state}"
        growth = self.memory.growth_text()
        if growth is not None:
            text += f", GPU memory {growth}"
        if self.log is not None:
            last = vllm_log.last_line(self.log.text)
            if last:
                text += f", log: {last[:160]}"
        return text

    def until_healthy(self, started: float) -> None:
        """Return once ``/health`` answers 200 with the process alive; raise on death or at the deadline."""
        deadline = started + self.timeout_s
        next_progress = started + min(self.progress_interval_s, 5.0)
        fatal_seen_at: float | None = None
        fatal_line: str | None = None
        state = "waiting for the process"
        while True:
            if self.log is not None:
                self.log.read_new()
                if fatal_seen_at is None:
                    fatal_line = vllm_log.find_fatal_line(self.log.text)
                    if fatal_line is not None:
                        fatal_seen_at = time.monotonic()
            self.check_alive(fatal_seen_at, fatal_line)
            try:
                response = self.http.get(f"{self.url}/health", timeout=(3, 10))
            except requests.RequestException:
                state = "loading (/health refuses connections)"
            else:
                if response.status_code == 200:
                    self.check_alive(fatal_seen_at, fatal_line)
                    return
                if response.status_code == 503:
                    raise self.fail(EngineDeadError, f"vLLM {self.name}: /health answered 503: the engine is dead")
                state = f"/health answered {response.status_code}"
            now = time.monotonic()
            if now >= deadline:
                raise self.fail(ServerStartTimeout,
                                f"vLLM {self.name} was not ready after {self.timeout_s:g} s "
                                f"(--vllm-ready-timeout); last state: {state}")
            if now >= next_progress:
                self.say(self.progress_line(now - started, state))
                next_progress = now + self.progress_interval_s
            time.sleep(min(self.poll_interval_s, max(0.0, deadline - now)))

    def served_model(self, wanted: str, *, lenient: bool, max_model_len: int | None) -> ModelCard:
        """The ``/v1/models`` card for ``wanted`` (``lenient``: the only model served will do)."""
        try:
            response = self.http.get(f"{self.url}/v1/models", timeout=(3, 30))
            response.raise_for_status()
            data: Any = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise self.fail(ServerError, f"vLLM {self.name}: /v1/models failed: {exc}") from exc
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise self.fail(ServerError, f"vLLM {self.name}: /v1/models answered {str(data)[:200]!r}")
        ids = tuple(str(m.get("id")) for m in models if isinstance(m, dict))
        card = next((m for m in models if isinstance(m, dict) and m.get("id") == wanted), None)
        if card is None and lenient and len(ids) == 1:
            card = models[0]
        if card is None:
            raise self.fail(ServerMismatchError,
                            f"vLLM at {self.url} serves {', '.join(ids) or 'no model'}, not {wanted!r}")
        max_len = card.get("max_model_len")
        max_len = int(max_len) if isinstance(max_len, int) else None
        if max_model_len is not None and max_len is not None and max_len != max_model_len:
            raise self.fail(ServerMismatchError,
                            f"vLLM {self.name}: max_model_len is {max_len}, the spec asks {max_model_len}")
        return ModelCard(str(card.get("id")), ids, max_len)

    def server_version(self) -> str | None:
        """``/version``'s answer, or None where the server has no such route."""
        with contextlib.suppress(requests.RequestException, ValueError, AttributeError):
            version = self.http.get(f"{self.url}/version", timeout=5).json().get("version")
            return str(version) if version is not None else None
        return None


__all__ = ["ModelCard", "ProgressFn", "ReadinessWait", "ReadyInfo"]
