"""What can go wrong with a server, as exceptions that carry vLLM's own last lines.

Each one is a :class:`~pytest_gpuready.errors.GpuReadyError` whose first line is the cause and
whose body is the tail of the server's log: vLLM explains a failed load only there.
"""

from __future__ import annotations

from pytest_gpuready.errors import GpuReadyError


class ServerError(GpuReadyError):
    """The server could not be started, did not become ready, or died."""

    def __init__(self, message: str, log_tail: str = "", log_path: str | None = None) -> None:
        self.summary = message
        self.log_tail = log_tail
        self.log_path = log_path
        text = message
        if log_tail:
            where = f" ({log_path})" if log_path else ""
            text += f"\n--- last lines of the vLLM log{where} ---\n{log_tail}"
        super().__init__(text)


class ServerExitedError(ServerError):
    """The server process exited before it was ready."""


class EngineDeadError(ServerError):
    """``/health`` answered 503 or the log printed a fatal line: the engine will not serve."""


class ServerStartTimeout(ServerError):
    """The deadline passed while the server was still loading."""


class ServerMismatchError(ServerError):
    """The server is up but serves another model name or another max_model_len than the spec."""


class ServerDiedError(ServerError):
    """The server's process ended while it was supposed to serve (during a benchmark, between tests)."""


class XidDuringLaunchError(ServerError):
    """The driver raised an Xid on the server's GPUs while it started: the GPU failed under the launch."""


__all__ = [
    "EngineDeadError",
    "ServerDiedError",
    "ServerError",
    "ServerExitedError",
    "ServerMismatchError",
    "ServerStartTimeout",
    "XidDuringLaunchError",
]
