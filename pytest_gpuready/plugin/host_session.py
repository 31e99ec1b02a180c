"""One connection and one snapshot cache per host per pytest session (per worker under xdist).

A :class:`HostSession` connects to its GPU host lazily (nothing is contacted until a check asks),
keeps the last :class:`HostSnapshot` until something that could change the host marks it stale
(the vLLM server fixture does, on start and stop), and remembers a failure so that an
unreachable host costs one ConnectTimeout per session, not one per test.

A :class:`HostRegistry` holds one HostSession per ``--gpu-host`` / ``--gpu-hosts-file`` entry, by
display name, in the order given. Host-bound fixtures ask :func:`host_session_of` for the
session of their test's host (the hidden, per-host parametrized ``_gpuready_host`` fixture).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.host.hosts import Host, HostSpec, connect
from pytest_gpuready.host.probe import DEFAULT_PROBE_TIMEOUT_S
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
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT_S
    """Seconds a probe section may take before it is killed and named (``--gpu-probe-timeout``)."""
    name: str = ""
    """The display name (test ids, reports): ``gpu-box-7`` for ``root@gpu-box-7``; ``str(spec)`` if empty."""
    snapshots_taken: int = 0
    _host: Host | None = field(default=None, init=False, repr=False)
    _latest: HostSnapshot | None = field(default=None, init=False, repr=False)
    _stale: bool = field(default=True, init=False, repr=False)
    _error: GpuReadyError | None = field(default=None, init=False, repr=False)

    @property
    def display_name(self) -> str:
        return self.name or str(self.spec)

    @property
    def connected(self) -> bool:
        """True once a :class:`Host` was made for this session (an ssh master opens on its first command)."""
        return self._host is not None

    @property
    def last_error(self) -> GpuReadyError | None:
        """The error of the last probe, if it failed (for reports; never probes)."""
        return self._error

    @property
    def host(self) -> Host:
        if self._host is None:
            self._host = connect(self.spec, identity_file=self.identity_file,
                                 ssh_options=self.ssh_options, connect_timeout=self.connect_timeout)
        return self._host

    @property
    def stale(self) -> bool:
        """True when the next :meth:`snapshot` probes the host (never probed, or marked stale)."""
        return self._stale

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
            self._latest = take_snapshot(self.host, reader=self.reader, gpus_expected=self.named_explicitly,
                                         timeout=self.probe_timeout)
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


MAX_CONCURRENT_PROBES = 32
"""Hosts probed at once by :meth:`HostRegistry.snapshot_all`: each costs an ssh client and a few
file descriptors here, so a fleet of hundreds is probed 32 at a time."""


class HostRegistry(Mapping[str, HostSession]):
    """The hosts of this pytest session, by display name, in the order they were given."""

    def __init__(self, sessions: list[HostSession]) -> None:
        if not sessions:
            raise ValueError("a host registry needs at least one host")
        self._sessions = {session.display_name: session for session in sessions}

    def __getitem__(self, name: str) -> HostSession:
        return self._sessions[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def first(self) -> HostSession:
        return next(iter(self._sessions.values()))

    @property
    def is_fleet(self) -> bool:
        """More than one host: host-bound tests are parametrized per host."""
        return len(self._sessions) > 1

    def snapshot_all(self, names: Collection[str] | None = None) -> list[tuple[HostSession, HostSnapshot | Exception]]:
        """Every host's snapshot (or why it could not be taken), in the order the hosts were given;
        only the hosts in ``names`` when given. A host probed before answers from its cache.

        The hosts are probed at once, one thread per host (at most :data:`MAX_CONCURRENT_PROBES`):
        a host's probe is mostly waiting on the network (ssh's handshake, the probe's round trip),
        so a fleet costs about its slowest host instead of the sum of all of them. Each session
        keeps what it got (a snapshot, or the error that a later test re-raises), as if probed
        alone; no two threads ever touch one session.
        """
        def probe(session: HostSession) -> HostSnapshot | Exception:
            try:
                return session.snapshot()
            except Exception as exc:  # reported per host by the caller; the session cached its error
                return exc

        sessions = [s for s in self._sessions.values() if names is None or s.display_name in names]
        to_probe = [s for s in sessions if s.stale]
        if len(to_probe) > 1:  # the others answer from their cache below, without a thread
            workers = min(MAX_CONCURRENT_PROBES, len(to_probe))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpuready-probe") as pool:
                list(pool.map(probe, to_probe))
        return [(session, probe(session)) for session in sessions]

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()


HOST_REGISTRY_KEY = pytest.StashKey[HostRegistry]()
HOST_FIXTURE = "_gpuready_host"
"""The hidden fixture every host-bound fixture depends on; parametrized per host when there are several."""


def under_xdist(config: pytest.Config) -> bool:
    """True in xdist's controller (which hands tests out and runs none) and in its workers."""
    return hasattr(config, "workerinput") or config.getoption("dist", default="no") not in ("no", None)


def get_host_registry(config: pytest.Config) -> HostRegistry:
    """Every host of this session (created at configure time by the plugin)."""
    return config.stash[HOST_REGISTRY_KEY]


def get_host_session(config: pytest.Config) -> HostSession:
    """The first host's :class:`HostSession` (the only one unless several hosts were given).

    Kept for callers written for one host; code that runs inside a test should use
    :func:`host_session_of`, which gives the host of that test.
    """
    return get_host_registry(config).first


def host_session_of(request: pytest.FixtureRequest) -> HostSession:
    """The HostSession of the host the requesting test runs against."""
    session: HostSession = request.getfixturevalue(HOST_FIXTURE)
    return session
