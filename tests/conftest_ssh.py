"""Fixtures of the ssh test tier: a real loopback OpenSSH server and hosts connected to it.

A plugin module (listed in ``pytest_plugins`` of the root conftest.py as ``tests.conftest_ssh``) so
that any test directory can ask for ``loopback_sshd``. The server is started once per session;
tests that need it without it being installed are skipped with the install command as the reason,
while CI installs ``openssh-server`` so that there the tier always runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_gpuready import SSHHost, connect
from tests.sshd import LoopbackSshd, SshdUnavailable
from tests.sshd import loopback_sshd as start_loopback_sshd


@pytest.fixture(scope="session")
def loopback_sshd() -> Iterator[LoopbackSshd]:
    """A real sshd on 127.0.0.1 with a generated key pair; stopped at the end of the session."""
    try:
        with start_loopback_sshd() as server:
            yield server
    except SshdUnavailable as exc:
        pytest.skip(str(exc))


FLEET_PORTS = 3
"""Hosts of the fleet sshd: enough for one dirty, one clean and one more, with one unreachable beside them."""


@pytest.fixture(scope="session")
def loopback_fleet() -> Iterator[LoopbackSshd]:
    """A real sshd on :data:`FLEET_PORTS` loopback ports, each a "host" with its own stand-in scenario."""
    try:
        with start_loopback_sshd(ports=FLEET_PORTS, extra_config=("LogLevel VERBOSE",)) as server:
            yield server
    except SshdUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def loopback_host(loopback_sshd: LoopbackSshd) -> Iterator[SSHHost]:
    """An :class:`SSHHost` for the loopback sshd, its master connection closed after the test."""
    host = connect(loopback_sshd.spec, identity_file=loopback_sshd.identity_file,
                   ssh_options=loopback_sshd.ssh_options, connect_timeout=5)
    assert isinstance(host, SSHHost)
    try:
        yield host
    finally:
        host.close()
