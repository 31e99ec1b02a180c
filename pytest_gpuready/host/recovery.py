"""Putting a dirty host right, on opt-in: the loops behind ``--gpu-reap-orphans`` and ``--shm-remove-leftovers``.

Each acts only on what the probe proved is no one's (see :mod:`~pytest_gpuready.host.orphans` and
:func:`~pytest_gpuready.host.shm.remove_leftovers`, which re-check on the host right before each
signal or ``rm``), then reads the host again and says what it did. The pytest layer only decides
whether to call them and reports what they return.

``reprobe`` is how a fresh snapshot is taken (the caller's cache, refreshed): these functions
never keep one of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_gpuready.host.checks import check_shm_clean
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.orphans import ReapReport, find_orphans, reap_orphans
from pytest_gpuready.host.shm import remove_leftovers
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.verdict import Verdict

REAP_RELEASE_TIMEOUT_S = 60.0
"""How long the driver may take to release a stopped engine's memory before the check reads the GPU."""
REPROBE_INTERVAL_S = 0.25


def reap_orphans_and_reprobe(host: Host, snapshot: HostSnapshot, reprobe: Callable[[], HostSnapshot], *,
                             release_timeout_s: float = REAP_RELEASE_TIMEOUT_S,
                             ) -> tuple[ReapReport | None, HostSnapshot]:
    """Stop the orphaned vLLM engines of ``snapshot`` and return what was done and the host after it.

    None and ``snapshot`` itself when there is no orphan. Otherwise the host is read again until the
    stopped pids have left the GPU listing (the driver releases their memory a moment after they
    exit), or ``release_timeout_s`` has passed: the last snapshot then shows what is still held.
    """
    orphans = find_orphans(snapshot)
    if not orphans:
        return None, snapshot
    report = reap_orphans(host, orphans)
    stopped = {o.pid for o in report.stopped}
    deadline = time.monotonic() + release_timeout_s
    while True:
        fresh = reprobe()
        if not {p.pid for p in fresh.processes} & stopped or time.monotonic() >= deadline:
            return report, fresh
        time.sleep(REPROBE_INTERVAL_S)


@dataclass(frozen=True)
class ShmCleanup:
    """The /dev/shm check after an attempt to remove the leftovers, and the names removed."""

    verdict: Verdict
    removed: tuple[str, ...]


def remove_shm_leftovers_and_recheck(host: Host, snapshot: HostSnapshot, reprobe: Callable[[], HostSnapshot], *,
                                     min_free_mib: int, patterns: Sequence[str]) -> ShmCleanup:
    """Remove the leftovers of ``snapshot`` no live process holds, then check /dev/shm again on a fresh probe.

    Raises what :func:`~pytest_gpuready.host.shm.remove_leftovers` raises when it cannot tell what is
    in use (a probe that cannot see every process): nothing is removed then.
    """
    removed = remove_leftovers(host, snapshot.require_shm(), patterns)
    verdict = check_shm_clean(reprobe(), min_free_mib=min_free_mib, patterns=patterns)
    return ShmCleanup(verdict, tuple(removed))


__all__ = [
    "REAP_RELEASE_TIMEOUT_S",
    "ShmCleanup",
    "reap_orphans_and_reprobe",
    "remove_shm_leftovers_and_recheck",
]
