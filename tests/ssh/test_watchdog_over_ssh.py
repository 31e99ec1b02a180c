"""The watchdog over the real loopback sshd: SIGKILL of a real pytest run stops its remote server.

The remote watchdog reads the stdin of an ssh session whose client is a child of the pytest run.
The session is multiplexed over the run's ControlMaster, which is a daemon (ControlPersist) and
outlives the run: the test checks that it is still there when the server is already gone, so
the EOF came through the session, not from the connection closing. The "remote" host is this
machine, so its processes are read from the local /proc.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_watch import wait_for_output
from tests.sshd import LoopbackSshd
from tests.unit.test_watchdog import SERVER_TEST, STUBBORN, alive, wait_until

pytestmark = pytest.mark.ssh

WATCHING = re.compile(r"watchdog pid (\d+) on \S+ stops session (\d+) if this process dies first \(log (\S+)\)")


def masters(control_dir_prefix: str = "/tmp/gpuready-ssh-") -> dict[int, str]:
    """ssh ControlMaster processes (``ssh: /tmp/gpuready-ssh-XXXX/master [mux]``) by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if cmdline.startswith("ssh: ") and "[mux]" in cmdline and control_dir_prefix in cmdline:
                found[int(entry.name)] = cmdline.split()[1]
    return found


def control_paths_of_children(parent: int) -> set[str]:
    """The ControlPath of each ssh client that ``parent`` runs (the watchdog's session among them)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if ppid == parent and argv[0].endswith(b"ssh"):
                found |= {a.decode().split("=", 1)[1] for a in argv if a.startswith(b"ControlPath=")}
    return found


def test_sigkill_of_pytest_stops_its_server_on_the_ssh_host(
    pytester: pytest.Pytester, tmp_path: Path, loopback_sshd: LoopbackSshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("GPUREADY_HOST", "GPUREADY_SSH_OPTIONS", "GPUREADY_SSH_IDENTITY"):
        monkeypatch.delenv(variable, raising=False)
    pytester.makepyfile(test_server=SERVER_TEST.format(command=STUBBORN))
    out = tmp_path / "stdout.txt"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s",
             "--vllm-ready-timeout", "600", *loopback_sshd.pytest_args(), str(pytester.path / "test_server.py")],
            cwd=pytester.path, stdout=stdout, stderr=subprocess.STDOUT,
        )
    ours: set[str] = set()
    try:
        match = wait_for_output(proc, out, WATCHING, 300)
        sid, log = int(match.group(2)), match.group(3)
        wait_until(lambda: len(alive(sid)) >= 3, 60, "the remote server's processes")
        ours = control_paths_of_children(proc.pid)  # the watchdog's ssh client names the run's master
        assert len(ours) == 1, ours
        assert set(masters().values()) >= ours
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        wait_until(lambda: not alive(sid), 60, f"remote session {sid} to be stopped after pytest died")
        # The ControlMaster outlived pytest, yet the server went: the session's EOF stopped it.
        assert set(masters().values()) >= ours
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for path in ours:  # the killed run's master: ours to end
            subprocess.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", "x"], capture_output=True,
                           timeout=30, check=False)
    wait_until(lambda: "processes gone " in Path(log).read_text(), 60, "the watchdog's last line")
    text = Path(log).read_text()
    assert f"session {sid}: pytest is gone (eof); stopping the server" in text
    assert re.search(rf"session {sid}: SIGKILL to {sid} ", text) is None  # the wrapper sh took SIGTERM
    assert re.search(rf"session {sid}: all 4 processes gone ", text), text  # wrapper sh, command sh, 2 sleeps
