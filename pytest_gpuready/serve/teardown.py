"""Bringing a launched server down and proving it left nothing.

Teardown signals only the processes of the session it started (see
:mod:`pytest_gpuready.serve.processes`): SIGTERM, a short poll until they are gone, SIGKILL for
survivors. Then it polls until the GPUs the server used are clean and the ``/dev/shm`` files
the server owns (held by its processes, or named for one of their pids) are gone, and reports
how long that took and what was left. Every wait is a poll against a deadline, never a fixed
sleep, so a fast machine is not slowed and a busy one is not failed early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gpuready.errors import HostError, ProbeError
from pytest_gpuready.host.checks import check_gpus_clean
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.serve import processes
from pytest_gpuready.serve.footprint import SnapshotFn
from pytest_gpuready.serve.launch import LaunchedProcess
from pytest_gpuready.serve.server_errors import ServerError
from pytest_gpuready.serve.shm_ownership import ShmOwnership
from pytest_gpuready.verdict import Verdict


@dataclass(frozen=True)
class TeardownReport:
    """How the server was brought down and what, if anything, it left."""

    server: str
    duration_s: float
    stopped: tuple[str, ...] = ()
    """Each process that was running when teardown began (``pid N (cmd)``)."""
    needed_kill: tuple[str, ...] = ()
    """Processes still alive after SIGTERM and the grace period, so sent SIGKILL."""
    survivors: tuple[str, ...] = ()
    """Processes alive even after SIGKILL (stuck in the kernel, e.g. the GPU driver)."""
    shm_leftovers: tuple[str, ...] = ()
    gpu_verdict: Verdict | None = None
    exit_code: int | None = None
    attached: bool = False
    notes: tuple[str, ...] = ()
    died: str | None = None
    """How the server had ended before the stop (``killed by SIGKILL``), when it had: not by our hand."""

    @property
    def ok(self) -> bool:
        gpu_ok = self.gpu_verdict is None or self.gpu_verdict.ok
        return not self.survivors and not self.shm_leftovers and gpu_ok

    @property
    def summary(self) -> str:
        if self.attached:
            return f"{self.server}: attached to a running server; not stopped"
        gpus = ""
        if self.gpu_verdict is not None:
            gpus = ", GPUs clean" if self.gpu_verdict.ok else ", GPUs NOT clean"
        how = f"{len(self.stopped)} processes stopped"
        if self.needed_kill:
            how += f" ({len(self.needed_kill)} needed SIGKILL)"
        shm = ", /dev/shm clean" if not self.shm_leftovers else f", {len(self.shm_leftovers)} /dev/shm files left"
        state = "clean" if self.ok else "NOT clean"
        dead = f"the server had died before the stop ({self.died}); " if self.died else ""
        return f"{self.server}: teardown {state} in {self.duration_s:.1f} s: {dead}{how}{shm}{gpus}"

    @property
    def message(self) -> str:
        lines = [self.summary]
        lines += [f"  needed SIGKILL: {p}" for p in self.needed_kill]
        lines += [f"  still running after SIGKILL: {p}" for p in self.survivors]
        lines += [f"  left in /dev/shm: {name}" for name in self.shm_leftovers]
        if self.gpu_verdict is not None and not self.gpu_verdict.ok:
            lines += [f"  {line}" for line in self.gpu_verdict.message.splitlines()]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "duration_s": round(self.duration_s, 3), "stopped": list(self.stopped),
            "needed_kill": list(self.needed_kill), "survivors": list(self.survivors),
            "shm_leftovers": list(self.shm_leftovers), "exit_code": self.exit_code,
            "gpus_clean": None if self.gpu_verdict is None else self.gpu_verdict.ok, "died": self.died,
        }


class TeardownError(ServerError):
    """Teardown left processes, GPU memory or /dev/shm files behind.

    Here beside its report, not in :mod:`~pytest_gpuready.serve.server_errors`: that module is
    imported by ``launch``, which this one imports, and the two would import each other.
    """

    def __init__(self, report: TeardownReport) -> None:
        self.report = report
        super().__init__(report.message)


def poll_until(predicate: Callable[[], bool], timeout_s: float, *, local: bool) -> bool:
    """Poll ``predicate`` at short, growing intervals until true or ``timeout_s``; no fixed sleeps."""
    deadline = time.monotonic() + timeout_s
    interval = 0.05 if local else 0.25
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
        interval = min(interval * 1.5, 0.5 if local else 1.0)


@dataclass(frozen=True)
class Signalled:
    """What :func:`stop_session` did: who was running, who needed SIGKILL, who survived it."""

    stopped: tuple[str, ...]
    needed_kill: tuple[str, ...]
    survivors: tuple[str, ...]


def session_members(host: Host, process: LaunchedProcess, signal_name: str | None = None,
                    ) -> list[processes.ServerProcess]:
    """The live members of the launched process's session (signalled in the same round trip if asked)."""
    process.reap()
    members = processes.session_members(host, process.pid, process.start_ticks, signal_name)
    return [p for p in members if p.alive]


def stop_session(host: Host, process: LaunchedProcess, *, term_grace_s: float, kill_timeout_s: float) -> Signalled:
    """SIGTERM every member of the session, SIGKILL whoever outlives ``term_grace_s``."""
    running = session_members(host, process, "TERM")
    stopped = tuple(p.label for p in running)
    needed_kill: tuple[str, ...] = ()
    if running and not poll_until(lambda: not session_members(host, process), term_grace_s, local=host.is_local):
        stubborn = session_members(host, process, "KILL")
        needed_kill = tuple(p.label for p in stubborn)
        poll_until(lambda: not session_members(host, process), kill_timeout_s, local=host.is_local)
    survivors = tuple(p.label for p in session_members(host, process))
    return Signalled(stopped, needed_kill, survivors)


def wait_shm_gone(host: Host, ownership: ShmOwnership, timeout_s: float) -> tuple[str, ...]:
    """Poll until none of the server's own /dev/shm files remains; return those that still do.

    Only files the server owns (see :mod:`~pytest_gpuready.serve.shm_ownership`) are waited for
    and reported: a file another process created meanwhile is never blamed.
    """
    if not ownership.held and not ownership.pids:
        return ()
    latest: list[set[str]] = []

    def gone() -> bool:
        try:
            latest.append(ownership.present(host))
        except (ProbeError, HostError):
            latest.append(set())
        return not latest[-1]

    if poll_until(gone, timeout_s, local=host.is_local):
        return ()
    return tuple(sorted(latest[-1]))


def released_by(snapshot: HostSnapshot, gpus: Sequence[int] | None, max_used_mib: int,
                own_pids: Collection[int]) -> Verdict:
    """The server's GPUs after its stop: clean, or, where processes that are not the server's hold
    them (another session's server on a shared GPU), free of the server's own processes.

    A GPU nobody else holds must read clean (no process, memory within the tolerance): memory left
    with no process listed is the server's until proved otherwise. Where another process holds the
    GPU its memory cannot be told apart, so only the server's pids are looked for: never blamed for
    what is not its own.
    """
    verdict = check_gpus_clean(snapshot, gpus=gpus, max_used_mib=max_used_mib)
    if verdict.ok or not own_pids:
        return verdict
    selected = {g.index for g in snapshot.require_gpus() if gpus is None or g.index in gpus}
    on_gpus = [p for p in snapshot.processes if p.gpu_index in selected]
    foreign = [p for p in on_gpus if p.pid not in own_pids]
    ours = [p for p in on_gpus if p.pid in own_pids]
    if ours or not foreign:
        return verdict
    held = sorted({p.gpu_index for p in foreign if p.gpu_index is not None})
    return Verdict.passed(
        f"the server's processes have left the GPUs; GPU {','.join(map(str, held))} held by other processes "
        f"(pid {', '.join(str(p.pid) for p in foreign)}), not the server's",
        evidence={**verdict.evidence, "foreign_pids": [p.pid for p in foreign]})


def wait_gpus_clean(snapshot_fn: SnapshotFn, gpus: Sequence[int] | None, max_used_mib: int,
                    timeout_s: float, *, local: bool, own_pids: Collection[int] = ()) -> Verdict:
    """Poll until the server's GPUs read clean (see :func:`released_by`); the last verdict either way."""
    latest: list[Verdict] = []

    def clean() -> bool:
        try:
            verdict = released_by(snapshot_fn(), gpus, max_used_mib, own_pids)
        except (ProbeError, HostError) as exc:
            verdict = Verdict.failed(f"GPUs could not be read after teardown: {exc}")
        latest.append(verdict)
        return verdict.ok

    poll_until(clean, timeout_s, local=local)
    return latest[-1]


__all__ = [
    "Signalled",
    "TeardownError",
    "TeardownReport",
    "poll_until",
    "released_by",
    "session_members",
    "stop_session",
    "wait_gpus_clean",
    "wait_shm_gone",
]
