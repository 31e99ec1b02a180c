"""The loopback sshd fixture itself: what the ssh tier and the benchmark rely on."""

from __future__ import annotations

import subprocess

import pytest

from pytest_gpuready import SSHHost
from tests.sshd import STANDIN_BIN, LoopbackSshd

pytestmark = pytest.mark.ssh

QUERY = ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"]


def test_remote_path_starts_with_the_labelled_standin(loopback_host: SSHHost) -> None:
    result = loopback_host.run("command -v nvidia-smi; printf '%s' \"$HOME\"; ls -A \"$HOME\"")
    lines = result.stdout.splitlines()
    assert lines[0] == str(STANDIN_BIN / "nvidia-smi")
    assert lines[1].endswith("/home")  # the sshd's own empty HOME: no shell profile of this machine


def test_scenario_switches_without_restarting_sshd(loopback_sshd: LoopbackSshd, loopback_host: SSHHost) -> None:
    with loopback_sshd.use_scenario("h200-idle"):
        assert loopback_host.run(" ".join(QUERY)).stdout == "0, NVIDIA H200\n"
    with loopback_sshd.use_scenario("rtx8-clean"):
        rows = loopback_host.run(" ".join(QUERY)).stdout.splitlines()
        assert len(rows) == 8
        assert rows[7].startswith("7, NVIDIA RTX PRO 6000")
    assert loopback_sshd.scenario() == ""
    no_scenario = loopback_host.run(" ".join(QUERY))
    assert no_scenario.returncode == 2
    assert "no scenario" in no_scenario.stderr


def test_nested_scenarios_restore_the_outer_one(loopback_sshd: LoopbackSshd) -> None:
    with loopback_sshd.use_scenario("h200-idle"):
        outer = loopback_sshd.scenario()
        with loopback_sshd.use_scenario("rtx8-clean"):
            assert loopback_sshd.scenario().endswith("rtx8-clean")
        assert loopback_sshd.scenario() == outer


def test_unknown_scenario_is_refused_naming_it(loopback_sshd: LoopbackSshd) -> None:
    with pytest.raises(FileNotFoundError, match=r"stand-in scenario 'no-such-box': no such directory"), \
            loopback_sshd.use_scenario("no-such-box"):
        pass


def test_plain_ssh_argv_opens_a_fresh_connection_each_time(loopback_sshd: LoopbackSshd) -> None:
    before = loopback_sshd.accepted_connections()
    for _ in range(2):
        proc = subprocess.run([*loopback_sshd.ssh_argv(), "true"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
    assert loopback_sshd.accepted_connections() - before == 2


def test_spec_and_pytest_args_name_this_server(loopback_sshd: LoopbackSshd) -> None:
    assert loopback_sshd.spec == f"ssh://{loopback_sshd.user}@127.0.0.1:{loopback_sshd.port}"
    args = loopback_sshd.pytest_args()
    assert args[:4] == ["--gpu-host", loopback_sshd.spec, "--ssh-identity", loopback_sshd.identity_file]
    assert args[4:] == ["--ssh-option", f"UserKnownHostsFile={loopback_sshd.known_hosts}",
                        "--ssh-option", "StrictHostKeyChecking=yes"]
