"""The servers of one host for a session: one per distinct spec, shared, and stopped verified at the end.

A launch can take minutes (13 for a 1T-parameter model), so a :class:`ServerPool` starts a server
once per distinct :class:`~pytest_gpuready.serve.spec.ServeSpec` and hands the same one to every
asker. Two servers cannot share GPUs: asking for a spec whose GPUs overlap a running server's
stops that server first, verified clean (a :class:`~pytest_gpuready.serve.teardown.TeardownError`
when it was not). A spec that failed to start, or whose server died, fails at once for every
later asker with its first cause instead of waiting again. With ``attach_url`` nothing is
launched or stopped: the pool attaches to the server there.

The pytest layer (``plugin/server_fixtures.py``) keeps one pool per host, resolves what a test
asked for into a spec, and turns what the pool raises or reports into outcomes; ``on_start`` and
``on_stop`` are where it records the figures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.serve.footprint import SnapshotFn
from pytest_gpuready.serve.readiness import ProgressFn
from pytest_gpuready.serve.server import ServerError, TeardownReport, VLLMServer
from pytest_gpuready.serve.spec import ServeSpec
from pytest_gpuready.serve.teardown import TeardownError


def overlaps(a: ServeSpec, b: ServeSpec) -> bool:
    """Whether two specs may use a GPU in common (a spec without ``gpus`` may use any)."""
    if a.gpus is None or b.gpus is None:
        return True
    return bool(set(a.gpus) & set(b.gpus))


class ServerPool:
    """The servers of one host, one per distinct spec; see the module docstring."""

    def __init__(self, host: Host, log_dir: Path, *, ready_timeout_s: float, attach_url: str | None = None,
                 snapshot: SnapshotFn | None = None, invalidate: Callable[[], None] | None = None,
                 progress: ProgressFn | None = None, on_start: Callable[[VLLMServer], None] | None = None,
                 after_launch: Callable[[VLLMServer], None] | None = None,
                 on_stop: Callable[[VLLMServer, TeardownReport], None] | None = None) -> None:
        self.host = host
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.attach_url = attach_url
        self._snapshot = snapshot
        self._invalidate = invalidate or (lambda: None)
        """Called after every start and stop: the host's cached snapshot is stale then."""
        self._progress = progress
        self._on_start = on_start
        self._after_launch = after_launch
        """Called after every launch, ready or not (the plugin says what its Xid watch could not see)."""
        self._on_stop = on_stop
        self.servers: dict[ServeSpec, VLLMServer] = {}
        self.failures: dict[ServeSpec, str] = {}
        """Specs that failed to start or died: later requests fail at once with the cause, never wait again."""
        self._reported: set[VLLMServer] = set()
        """Servers whose teardown went to ``on_stop``: each is reported once, however often it is stopped."""

    def get(self, spec: ServeSpec, ready_timeout_s: float | None = None) -> VLLMServer:
        """The ready server for ``spec``: the running one, else started (or attached) now."""
        if spec in self.failures:
            raise ServerError(self.failures[spec])
        existing = self.servers.get(spec)
        if existing is not None and existing.running and not existing.is_alive():
            # The pool keeps a server while it has a pid and was not stopped: check that it still lives.
            died = existing.died_error("after it was ready", "not handing it out again")
            self.mark_dead(spec, died.summary)
            raise died
        if existing is not None and (existing.is_attached or existing.running):
            return existing
        timeout = ready_timeout_s if ready_timeout_s is not None else self.ready_timeout_s
        if self.attach_url is not None:
            server = VLLMServer.attach(self.attach_url, spec, self.host, snapshot=self._snapshot,
                                       progress=self._progress, ready_timeout_s=timeout)
        else:
            for other_spec, other in list(self.servers.items()):
                if other.running and overlaps(spec, other_spec):
                    report = self.stop(other_spec)
                    if report is not None and not report.ok:
                        raise TeardownError(report)
            server = VLLMServer(spec, self.host, ready_timeout_s=timeout, log_dir=self.log_dir,
                                progress=self._progress, snapshot=self._snapshot)
        if existing is not None and existing.teardown is not None:
            self._report(existing, existing.teardown)  # stopped by the test itself: its record, before it goes
        self.servers[spec] = server
        try:
            server.start()
        except GpuReadyError as exc:
            first = str(exc).splitlines()[0]
            self.failures[spec] = f"{first}\n(this server already failed to start earlier in the session)"
            raise
        finally:
            self._invalidate()
            if self._after_launch is not None:
                self._after_launch(server)
        if self._on_start is not None:
            self._on_start(server)
        return server

    def mark_dead(self, spec: ServeSpec, cause: str) -> None:
        """Later requests for ``spec`` fail at once with ``cause`` instead of being handed a dead server."""
        self.failures[spec] = f"{cause}\n(this server died earlier in the session)"

    def stop(self, spec: ServeSpec) -> TeardownReport | None:
        """Stop the server of ``spec`` (verified) and return its report; None when there is none.

        A server already stopped returns its first report (:meth:`VLLMServer.stop`), which is not
        reported to ``on_stop`` again.
        """
        server = self.servers.get(spec)
        if server is None:
            return None
        try:
            report = server.stop()
        finally:
            self._invalidate()
        self._report(server, report)
        return report

    def _report(self, server: VLLMServer, report: TeardownReport) -> None:
        """Hand ``report`` to ``on_stop`` unless this server's teardown went there already."""
        if server in self._reported:
            return
        self._reported.add(server)
        if self._on_stop is not None:
            self._on_stop(server, report)

    def emergency_stop(self, reason: str) -> None:
        """Stop every running server of this pool without verification (interrupts, session end)."""
        for server in list(self.servers.values()):
            if server.running:
                with contextlib.suppress(Exception):
                    server.stop(verify=False, note=reason)

    def stop_all(self) -> list[TeardownReport]:
        """Stop every server, each verified; the reports not reported before (one stopped earlier was
        recorded, and judged, then)."""
        reports = []
        for spec, server in list(self.servers.items()):
            new = server not in self._reported
            report = self.stop(spec)
            if report is not None and new:
                reports.append(report)
        return reports


__all__ = ["ServerPool", "overlaps"]
