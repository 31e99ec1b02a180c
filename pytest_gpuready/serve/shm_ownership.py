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


def _stamp_script(label: str, pids: Iterable[int]) -> str:
    """``LABEL PID SESSION START`` for each pid that exists (pids are ints: nothing else is interpolated)."""
    listed = " ".join(str(int(p)) for p in pids)
    return (f"for p in {listed}; do {{ read -r line < /proc/$p/stat; }} 2>/dev/null || continue; "
            f'rest=${{line##*) }}; set -- $rest; echo "{label} $p $4 ${{20}}"; done')


def _stamps(text: str, label: str) -> dict[int, tuple[int, int]]:
    found: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == label and all(p.isdigit() for p in parts[1:]):
            found[int(parts[1])] = (int(parts[2]), int(parts[3]))
    return found


def read_listing_and_holders(host: Host, pids: Iterable[int]) -> tuple[list[ShmListingEntry], ShmHolders]:
    """/dev/shm's entries and what ``pids`` hold there, in one round trip."""
    script = f"{SHM_LIST_SCRIPT}\n{shm_holders_script(pids)}\n"
    result = host.run(script, timeout=30)
    return parse_shm_listing_entries(result.stdout, host.name), parse_shm_holders(result.stdout, host.name)


def read_members_holding(host: Host, sid: int, pids: Iterable[int],
                         ) -> tuple[list[ShmListingEntry], dict[str, set[int]]]:
    """/dev/shm's entries, and which of ``pids`` hold which of them, counting only pids that are
    members of session ``sid`` both right before and right after the read with the same start time
    (a member that exits meanwhile and whose pid another process takes is never credited)."""
    chosen = sorted({int(p) for p in pids})
    script = "\n".join([_stamp_script("before", chosen), SHM_LIST_SCRIPT, shm_holders_script(chosen),
                        _stamp_script("after", chosen)]) + "\n"
    result = host.run(script, timeout=30)
    before, after = _stamps(result.stdout, "before"), _stamps(result.stdout, "after")
    members = {pid for pid in chosen if pid in before and before.get(pid) == after.get(pid) and before[pid][0] == sid}
    entries = parse_shm_listing_entries(result.stdout, host.name)
    holders = parse_shm_holders(result.stdout, host.name)
    held = {e.name: set(holders.pids_holding(e.name, e.inode) & members) for e in entries}
    return entries, {name: pids_ for name, pids_ in held.items() if pids_}


@dataclass
class ShmOwnership:
    """The /dev/shm files one server owns, learnt from its processes as it runs."""

    pids: set[int] = field(default_factory=set)
    """Every member of the server's session seen so far."""
    held: set[str] = field(default_factory=set)
    """Names some member held open or mapped when sampled."""
    errors: list[str] = field(default_factory=list)

    def sample(self, host: Host, sid: int, member_pids: Iterable[int]) -> None:
        """Record the members of session ``sid`` and the files they hold now (a failed read is noted, never fatal)."""
        members = set(member_pids)
        self.pids |= members
        if not members:
            return
        try:
            _, held = read_members_holding(host, sid, members)
        except (ProbeError, HostError) as exc:
            self.errors.append(str(exc))
            return
        self.held |= set(held)

    def owns(self, name: str) -> bool:
        return name in self.held or creator_pid(name) in self.pids

    def present(self, host: Host) -> set[str]:
        """The owned files that exist now."""
        entries, _ = read_listing_and_holders(host, ())
        return {e.name for e in entries if self.owns(e.name)}


__all__ = ["ShmOwnership", "read_listing_and_holders", "read_members_holding"]
