"""Which /dev/shm files are one server's: by who holds them, never by when they appeared.

Two pytest sessions, or a foreign process, create ``psm_*`` files in the same /dev/shm while a
server runs; attributing files by their arrival blames the server for all of them. Here a
server's files are

- the files its session's processes hold open or mapped (``/proc/PID/fd`` and
  ``/proc/PID/maps``, read exactly by :func:`pytest_gpuready.host.shm.read_shm_holders`), read
  while it runs (once ready) and again right before the stop, and
- the files whose names carry one of its pids (``sem.loky-<pid>-*``), since a killed engine's
  loky semaphore is held by nobody afterwards.

Teardown then waits for those files alone to go, and reports only those that stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_gpuready.errors import HostError, ProbeError
from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.shm import (
    SHM_LIST_SCRIPT,
    ShmHolders,
    ShmListingEntry,
    creator_pid,
    parse_shm_holders,
    parse_shm_listing_entries,
    shm_holders_script,
)


def read_listing_and_holders(host: Host, pids: Iterable[int]) -> tuple[list[ShmListingEntry], ShmHolders]:
    """/dev/shm's entries and what ``pids`` hold there, in one round trip."""
    script = f"{SHM_LIST_SCRIPT}\n{shm_holders_script(pids)}\n"
    result = host.run(script, timeout=30)
    return parse_shm_listing_entries(result.stdout, host.name), parse_shm_holders(result.stdout, host.name)


@dataclass
class ShmOwnership:
    """The /dev/shm files one server owns, learnt from its processes as it runs."""

    pids: set[int] = field(default_factory=set)
    """Every member of the server's session seen so far."""
    held: set[str] = field(default_factory=set)
    """Names some member held open or mapped when sampled."""
    errors: list[str] = field(default_factory=list)

    def sample(self, host: Host, member_pids: Iterable[int]) -> None:
        """Record the members and the files they hold now (a failed read is noted, never fatal)."""
        members = set(member_pids)
        self.pids |= members
        if not members:
            return
        try:
            entries, holders = read_listing_and_holders(host, members)
        except (ProbeError, HostError) as exc:
            self.errors.append(str(exc))
            return
        self.held |= {e.name for e in entries if holders.pids_holding(e.name) & members}

    def owns(self, name: str) -> bool:
        return name in self.held or creator_pid(name) in self.pids

    def present(self, host: Host) -> set[str]:
        """The owned files that exist now."""
        entries, _ = read_listing_and_holders(host, ())
        return {e.name for e in entries if self.owns(e.name)}


__all__ = ["ShmOwnership", "read_listing_and_holders"]
