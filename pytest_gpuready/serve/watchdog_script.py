"""The watchdog that stops a server when the pytest process that started it is gone.

This file is a standalone ``python3`` program (standard library only, no package imports) that
runs beside a launched server, locally or on an ssh host, the same way in both places
(``python3 -c "$(this file)" SID START_TICKS GRACE_S LOG``). The pattern is testcontainers'
Ryuk: a reaper tied to the life of its client, not to the client's good behaviour.

- Its stdin is a pipe whose write end only pytest holds (over ssh: the stdin of an ssh session
  that pytest holds open). However pytest ends (SIGKILL, the OOM killer, a CI cancel) the kernel
  closes that end, and the watchdog reads EOF.
- On EOF it signals the server's session: SIGTERM, a grace, then SIGKILL to whoever is left. A
  line ``release`` before the EOF means pytest stopped the server itself: it exits, signalling
  nothing. SIGHUP or SIGTERM to the watchdog counts as EOF (its owner is going away).
- It signals only processes of the session it was given. A process counts when the session
  leader is still the process that was started (same pid and start time: a pid cannot be reused
  while the leader lives, so the session id still names our session), or when it was seen as a
  member while that held (same pid and start time now). So an ``EngineCore`` whose API server
  (the leader) died first is still found. Each pid's start time is read again right before each
  signal, through a pidfd where the kernel has them, so a recycled pid is never signalled.
- It lives in a session of its own (``setsid``), so the TERM/KILL it sends, and a signal to
  pytest's process group, do not reach it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from types import FrameType

POLL_S = 1.0
"""How often the session's members are read while waiting (so members are known if the leader dies)."""
KILL_WAIT_S = 10.0


def _pids(pids: list[int]) -> str:
    return " ".join(str(pid) for pid in pids)


class OwnerGone(Exception):
    """SIGHUP or SIGTERM arrived: treated as EOF."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise OwnerGone(signum)


def read_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgrp, session, start ticks) of ``pid`` from /proc/PID/stat, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def session_members(sid: int, min_start: int) -> dict[int, int]:
    """Live processes whose session or process group is ``sid``, started at or after ``min_start``."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = read_stat(int(entry))
        if stat is None:
            continue
        state, pgrp, session, start = stat
        if (session == sid or pgrp == sid) and start >= min_start and state not in ("Z", "X"):
            found[int(entry)] = start
    return found


def leader_matches(sid: int, start: int) -> bool:
    stat = read_stat(sid)
    return stat is not None and stat[3] == start and stat[0] not in ("Z", "X")


class Watch:
    def __init__(self, sid: int, start: int, log: str) -> None:
        self.sid = sid
        self.start = start
        self.log_path = log
        self.known: dict[int, int] = {}  # pid -> start ticks, seen as members while the leader was ours

    def say(self, text: str) -> None:
        if not self.log_path:
            return
        try:
            with open(self.log_path, "a") as handle:
                handle.write(f"{time.time():.3f} watchdog: {text}\n")
        except OSError:
            pass

    def refresh(self) -> None:
        if leader_matches(self.sid, self.start):
            members = session_members(self.sid, self.start)
            new = sorted(set(members) - set(self.known))
            if new:
                self.say(f"session {self.sid}: members seen: {_pids(new)}")
            self.known.update(members)

    def targets(self) -> dict[int, int]:
        """Processes that are provably the server's now (see the module docstring)."""
        found: dict[int, int] = {}
        if leader_matches(self.sid, self.start):
            found.update(session_members(self.sid, self.start))
        for pid, start in self.known.items():
            stat = read_stat(pid)
            if stat is not None and stat[3] == start and stat[0] not in ("Z", "X"):
                found[pid] = start
        return found

    def signal(self, pid: int, start: int, signum: int) -> bool:
        """Send ``signum`` to ``pid`` only if it is still the process that started at ``start``."""
        pidfd = None
        if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                pidfd = None
        try:
            stat = read_stat(pid)  # after pidfd_open: the fd names the process whose start we read
            if stat is None or stat[3] != start or stat[0] in ("Z", "X"):
                return False
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
            return True
        except OSError:
            return False
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def stop(self, grace_s: float) -> int:
        began = time.monotonic()
        targets = self.targets()
        if not targets:
            self.say(f"session {self.sid}: nothing left to stop")
            return 0
        sent = [pid for pid, start in sorted(targets.items()) if self.signal(pid, start, signal.SIGTERM)]
        self.say(f"session {self.sid}: SIGTERM to {_pids(sent) or 'nobody'}")
        left = self.wait_gone(targets, grace_s)
        if left:
            sent = [pid for pid, start in sorted(left.items()) if self.signal(pid, start, signal.SIGKILL)]
            self.say(f"session {self.sid}: SIGKILL to {_pids(sent)} after {grace_s:.1f} s")
            left = self.wait_gone(left, KILL_WAIT_S)
        took = time.monotonic() - began
        if left:
            self.say(f"session {self.sid}: still running after SIGKILL: {_pids(sorted(left))}")
            return 1
        self.say(f"session {self.sid}: all {len(targets)} processes gone {took:.2f} s after pytest")
        return 0

    def wait_gone(self, targets: dict[int, int], timeout_s: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            left: dict[int, int] = {}
            for pid, start in targets.items():
                stat = read_stat(pid)
                if stat is not None and stat[3] == start and stat[0] not in ("Z", "X"):
                    left[pid] = start
            for pid, start in self.targets().items():  # members spawned meanwhile (a worker forked late)
                left.setdefault(pid, start)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)


def wait_for_owner(watch: Watch) -> str:
    """Block until stdin ends (return "eof") or says ``release`` (return "release")."""
    buffered = b""
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                return "eof"
            buffered = (buffered + chunk)[-64:]
            if b"release" in buffered:
                return "release"
        watch.refresh()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write("usage: watchdog SID START_TICKS GRACE_S LOG\n")
        return 2
    sid, start, grace_s, log = int(argv[0]), int(argv[1]), float(argv[2]), argv[3]
    with contextlib.suppress(OSError):  # already a session leader (started so, or by sshd)
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    watch = Watch(sid, start, log)
    signal.signal(signal.SIGHUP, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        watch.refresh()
        os.write(1, f"watching {sid} {os.getpid()}\n".encode())
        why = wait_for_owner(watch)
    except OwnerGone as exc:
        why = f"signal {exc.args[0]}"
    except OSError as exc:
        why = f"stdin error {exc}"
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if why == "release":
        watch.say(f"session {sid}: released (pytest stopped the server itself)")
        return 0
    watch.say(f"session {sid}: pytest is gone ({why}); stopping the server")
    return watch.stop(grace_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
