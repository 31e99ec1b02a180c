"""One connection and one snapshot cache per pytest session.

The session connects to the GPU host lazily (nothing is contacted until a check asks), keeps
the last :class:`HostSnapshot` until something that could change the host marks it stale
(the vLLM server fixture does, on start and stop), and remembers a failure so that an
unreachable host costs one ConnectTimeout per session, not one per test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.host.hosts import Host, HostSpec, connect
from pytest_gpuready.host.probe import snapshot as take_snapshot
from pytest_gpuready.host.snapshot import HostSnapshot


@dataclass
class HostSession:
    """The GPU host of this pytest session and what was last seen on it."""

    spec: HostSpec
    named_explicitly: bool
    """True when the user named the host (option, env or ini): a GPU-less host is then an error, not a skip."""
    reader: str = "auto"
    identity_file: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    snapshots_taken: int = 0
    _host: Host | None = field(default=None, init=False, repr=False)
    _latest: HostSnapshot | None = field(default=None, init=False, repr=False)
    _stale: bool = field(default=True, init=False, repr=False)
    _error: GpuReadyError | None = field(default=None, init=False, repr=False)

    @property
    def host(self) -> Host:
        if self._host is None:
            self._host = connect(self.spec, identity_file=self.identity_file,
                                 ssh_options=self.ssh_options, connect_timeout=self.connect_timeout)
        return self._host

    @property
    def latest(self) -> HostSnapshot | None:
        """The last snapshot taken, if any (for reports; never probes)."""
        return self._latest

    def snapshot(self, refresh: bool = False) -> HostSnapshot:
        """The current snapshot: the cached one unless stale or ``refresh``; probe errors re-raise."""
        if not refresh and not self._stale:
            if self._error is not None:
                raise self._error
            if self._latest is not None:
                return self._latest
        try:
            self._latest = take_snapshot(self.host, reader=self.reader, gpus_expected=self.named_explicitly)
            self._error = None
        except GpuReadyError as exc:
            self._error = exc
            raise
        finally:
            self._stale = False
            self.snapshots_taken += 1
        return self._latest

    def invalidate(self) -> None:
        """Mark the cached snapshot stale: the next :meth:`snapshot` probes again."""
        self._stale = True

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None


HOST_SESSION_KEY = pytest.StashKey[HostSession]()


def get_host_session(config: pytest.Config) -> HostSession:
    """The session's :class:`HostSession` (created at configure time by the plugin)."""
    return config.stash[HOST_SESSION_KEY]
