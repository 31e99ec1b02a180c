"""Over the real loopback sshd: a hung remote nvidia-smi is named and killed on the host; and a peer
that sends its ssh banner and then stalls the key exchange is cut at the connect timeout plus a small
margin, with the documented cause. The "remote" host is this machine, so its /proc tells what survived.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import HostError, connect, snapshot
from pytest_gpuready.host.hosts import HANDSHAKE_MARGIN_S
from tests.plugin.test_probe_timeout import assert_all_gone
from tests.sshd import STANDIN_SCENARIOS, LoopbackSshd

pytestmark = pytest.mark.ssh


def test_hung_remote_nvidia_smi_is_named_and_killed_on_the_host(loopback_sshd: LoopbackSshd,
                                                                tmp_path: Path) -> None:
    scenario = tmp_path / "hang-query-gpu"
    shutil.copytree(STANDIN_SCENARIOS / "hang-query-gpu", scenario)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    (scenario / "hang").write_text(f"--query-gpu\n{piddir}\n")  # the remote stand-in records its pids here
    host = connect(loopback_sshd.spec, identity_file=loopback_sshd.identity_file,
                   ssh_options=loopback_sshd.ssh_options, connect_timeout=10)
    try:
        with loopback_sshd.use_scenario(scenario):
            started = time.monotonic()
            snap = snapshot(host, timeout=2)
            took = time.monotonic() - started
    finally:
        host.close()
    hung = "nvidia-smi --query-gpu did not answer within 2 s"
    assert snap.errors == {"gpus": hung, "health": hung}  # the health fields: a second --query-gpu, same trip
    assert snap.shm is not None
    assert snap.topology is None
    assert took < 60  # finished, not hung (the probe's own watchdog acts at 2 s)
    assert_all_gone(piddir)


@pytest.fixture
def stalling_peer() -> Iterator[int]:
    """A TCP server on loopback that sends an ssh banner, then reads and never answers: the key
    exchange stalls (what an overloaded sshd or a middlebox holding the connection looks like)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
            conn.settimeout(0.2)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)
        for conn in held:
            conn.close()
        listener.close()


def test_stalled_handshake_is_cut_with_its_cause(stalling_peer: int) -> None:
    host = connect(f"ssh://root@127.0.0.1:{stalling_peer}", connect_timeout=3,
                   ssh_options=("StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"))
    started = time.monotonic()
    try:
        with pytest.raises(HostError) as info:
            host.run("true", timeout=300)
    finally:
        host.close()
    took = time.monotonic() - started
    message = str(info.value)
    assert message.startswith(f"root@127.0.0.1:{stalling_peer}: ssh failed: handshake stalled (connected, but the key "
                              f"exchange and login did not finish within {3 + HANDSHAKE_MARGIN_S:g} s")
    assert "\n" not in message
    assert took < 45  # finished, not hung: the stall took 47 s with ConnectTimeout 3 (and the command's 300)
