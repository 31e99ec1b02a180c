"""The processes of one launched server, found by session id, and how they are signalled.

vLLM's API server spawns an EngineCore, workers (one per TP rank) and a multiprocessing
resource tracker. Killing only the API server's pid orphans the EngineCore, which keeps its GPU
memory (the trap behind "Free memory on device ... is less than desired"). The server is
therefore started as the leader of a new session, and every process whose session id (or
process group) is the leader's pid belongs to it; nothing is ever found by name.

One POSIX ``sh`` script lists the members from ``/proc/PID/stat`` and, in the same run, sends a
signal to exactly those pids, so the same code works on the local machine and over ssh, and no
pid read in one round trip is signalled in another. A member must also have started no earlier
than the leader: a recycled pid can never be mistaken for ours.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gpuready.host.hosts import Host

_SESSION_SCRIPT = r"""
sid={sid}; min_start={min_start}; sig={sig}
pids=""
for f in /proc/[0-9]*/stat; do
  {{ read -r line < "$f"; }} 2>/dev/null || continue
  rest=${{line##*) }}
  set -- $rest
  [ "$4" = "$sid" ] || [ "$3" = "$sid" ] || continue
  [ "${{20}}" -ge "$min_start" ] 2>/dev/null || continue
  pid=${{f#/proc/}}; pid=${{pid%/stat}}
  comm=${{line#*(}}; comm=${{comm%)*}}
  cmd=$(tr '\000\n\t' '   ' < "/proc/$pid/cmdline" 2>/dev/null)
  printf '%s\t%s\t%s\t%s\n' "$pid" "$1" "$comm" "$cmd"
  [ "$1" = Z ] || pids="$pids $pid"
done
if [ -n "$sig" ] && [ -n "$pids" ]; then kill -s "$sig" $pids 2>/dev/null; fi
exit 0
"""

_START_TIME_SCRIPT = r"""
{{ read -r line < /proc/{pid}/stat; }} 2>/dev/null || exit 3
rest=${{line##*) }}
set -- $rest
echo "${{20}}"
"""


@dataclass(frozen=True)
class ServerProcess:
    """One member of the server's session: pid, state letter, kernel name, command line."""

    pid: int
    state: str
    comm: str
    cmdline: str

    @property
    def alive(self) -> bool:
        """Zombies (Z) and dead (X) entries hold no memory; they only await their parent."""
        return self.state not in ("Z", "X")

    @property
    def label(self) -> str:
        name = self.cmdline.strip() or self.comm
        return f"pid {self.pid} ({name[:120]})"


def session_script(sid: int, min_start: int, signal_name: str | None) -> str:
    """The listing (and optional signalling) script; the numbers are ints, nothing else is interpolated."""
    if signal_name not in (None, "TERM", "KILL", "INT"):
        raise ValueError(f"signal {signal_name!r}: expected TERM, KILL or INT")
    return _SESSION_SCRIPT.format(sid=int(sid), min_start=int(min_start), sig=signal_name or "")


def parse_members(text: str) -> list[ServerProcess]:
    members: list[ServerProcess] = []
    for line in text.splitlines():
        parts = line.split("\t", 3)
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        members.append(ServerProcess(int(parts[0]), parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
    return members


def session_members(host: Host, sid: int, min_start: int, signal_name: str | None = None) -> list[ServerProcess]:
    """The processes of session ``sid`` (started at or after ``min_start`` clock ticks), signalling them if asked."""
    result = host.run(session_script(sid, min_start, signal_name), timeout=30)
    return parse_members(result.stdout)


def process_start_time(host: Host, pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks since boot), or None if gone."""
    result = host.run(_START_TIME_SCRIPT.format(pid=int(pid)), timeout=30)
    text = result.stdout.strip()
    return int(text) if result.returncode == 0 and text.isdigit() else None
