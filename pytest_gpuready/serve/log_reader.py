"""The server's log file, read as it grows, on this machine or on an ssh host.

The log is the only place vLLM says why it is slow (loading shards, compiling) or why it died
(the exception), so it is read incrementally while waiting for readiness and in full for the
startup figures. Remotely each read is one ``tail -c +N | base64`` round trip on the multiplexed
connection; base64 keeps byte offsets exact whatever the log holds.
"""

from __future__ import annotations

import base64
import codecs
import shlex
from pathlib import Path

from pytest_gpuready.errors import HostError
from pytest_gpuready.host.hosts import Host

MAX_READ_BYTES = 4 * 1024 * 1024


class LogReader:
    """Incremental reader of one log file; ``text`` accumulates what has been read so far."""

    def __init__(self, path: str, host: Host | None = None) -> None:
        self.path = path
        self.host = host
        self._offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""

    @property
    def is_remote(self) -> bool:
        return self.host is not None and not self.host.is_local

    def _read_bytes(self) -> bytes:
        if not self.is_remote:
            try:
                with Path(self.path).open("rb") as handle:
                    handle.seek(self._offset)
                    return handle.read(MAX_READ_BYTES)
            except FileNotFoundError:
                return b""
        assert self.host is not None
        script = (f"tail -c +{self._offset + 1} {shlex.quote(self.path)} 2>/dev/null"
                  f" | head -c {MAX_READ_BYTES} | base64")
        result = self.host.run(script, timeout=60)
        if result.returncode != 0:
            raise HostError(f"{self.host.name}: cannot read the server log {self.path}: {result.stderr.strip()}")
        return base64.b64decode("".join(result.stdout.split()))

    def read_new(self) -> str:
        """Text appended since the last call (possibly ending in a partial line)."""
        parts: list[str] = []
        while True:
            data = self._read_bytes()
            if not data:
                break
            self._offset += len(data)
            parts.append(self._decoder.decode(data))
            if len(data) < MAX_READ_BYTES:
                break
        new = "".join(parts)
        self._text += new
        return new

    @property
    def text(self) -> str:
        """Everything read so far."""
        return self._text

    def read_all(self) -> str:
        """Read what is new and return the whole log."""
        self.read_new()
        return self.text
