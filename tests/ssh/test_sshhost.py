"""SSHHost against a real OpenSSH server on loopback: commands, quoting, multiplexing, failures.

Every failure case is a real ssh failure produced by the real client (a closed port, a wrong key,
a name that cannot resolve, a peer that never speaks ssh, an unknown host key) and the test checks
the one-line cause an engineer would read in a CI log.
"""

from __future__ import annotations

import gc
import os
import shlex
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import HostError, HostSpecError, SSHHost, connect, parse_host_spec
from pytest_gpuready.host.hosts import validate_ssh_option
from tests.sshd import LoopbackSshd, keygen, loopback_sshd

pytestmark = pytest.mark.ssh


def _host(server: LoopbackSshd, spec: str | None = None, *, identity_file: str | None = None,
          ssh_options: tuple[str, ...] | None = None, connect_timeout: float = 5) -> SSHHost:
    host = connect(spec or server.spec,
                   identity_file=identity_file or server.identity_file,
                   ssh_options=server.ssh_options if ssh_options is None else ssh_options,
                   connect_timeout=connect_timeout)
    assert isinstance(host, SSHHost)
    return host


@pytest.fixture(scope="module")
def shared_host(loopback_sshd: LoopbackSshd) -> Iterator[SSHHost]:
    """One host for the tests that only run commands, so they share one master connection."""
    host = _host(loopback_sshd)
    yield host
    host.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: connecting to it is refused, reliably."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that completes the TCP handshake but never sends the ssh banner."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # never accept(): the kernel finishes the handshake, nobody ever speaks
        yield sock.getsockname()[1]


def test_command_returns_stdout_stderr_and_exit_code(shared_host: SSHHost) -> None:
    result = shared_host.run("echo out; echo err >&2; exit 3")
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.duration_s > 0


def test_command_runs_as_the_remote_user_on_the_remote_environment(
    shared_host: SSHHost, loopback_sshd: LoopbackSshd
) -> None:
    result = shared_host.run('id -un; printf "%s\\n" "$GPUREADY_STANDIN_SCENARIO_FILE"')
    assert result.stdout.splitlines() == [loopback_sshd.user, loopback_sshd.scenario_file]


@pytest.mark.parametrize(
    "payload",
    [
        "it's \"quoted\"",
        "$HOME ${PATH} $(id -u) `id -u`",
        "a; b && c || d | e & f",
        "line one\nline two\n\ttabbed\n",
        "glob * ? [a-z] ~ # not a comment",
        "back\\slash \\n \\\\ 'mixed \"nest\" $x'",
        "-n -e --",
    ],
)
def test_script_with_shell_metacharacters_arrives_intact(shared_host: SSHHost, payload: str) -> None:
    result = shared_host.run(f"printf '%s' {shlex.quote(payload)}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == payload


def test_multiline_script_with_variables_runs_in_one_remote_shell(shared_host: SSHHost) -> None:
    script = "x='a b'\nset -- one two three\necho \"$x|$#\"\ncd /tmp && pwd\n"
    assert shared_host.run(script).stdout == "a b|3\n/tmp\n"


def test_stdin_reaches_the_remote_script(shared_host: SSHHost) -> None:
    data = b"\x00binary\nand text\xff"
    result = shared_host.run("od -An -tx1 | tr -d ' \\n'", stdin=data)
    assert result.stdout == data.hex()


def test_many_runs_use_one_connection(loopback_sshd: LoopbackSshd) -> None:
    host = _host(loopback_sshd)
    before = loopback_sshd.accepted_connections()
    try:
        outputs = [host.run(f"echo {i}").stdout for i in range(6)]
        assert outputs == [f"{i}\n" for i in range(6)]
        assert loopback_sshd.accepted_connections() - before == 1
    finally:
        host.close()


def test_close_stops_the_master_and_a_later_run_reconnects(loopback_sshd: LoopbackSshd) -> None:
    host = _host(loopback_sshd)
    before = loopback_sshd.accepted_connections()
    host.run("true")
    control_dir = host.control_dir
    assert control_dir is not None
    assert os.listdir(control_dir), "the master connection's socket should be in the control dir"
    check = subprocess.run([*host.ssh_argv()[:-1], "-O", "check", host.spec.target],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr

    host.close()
    assert host.control_dir is None
    assert not os.path.exists(control_dir)
    host.close()  # closing twice is harmless

    try:
        assert host.run("echo again").stdout == "again\n"
        assert loopback_sshd.accepted_connections() - before == 2
    finally:
        host.close()


def test_long_tmpdir_still_gives_a_working_control_socket(loopback_sshd: LoopbackSshd, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A unix socket path must fit in 104-108 bytes; a macOS-like long $TMPDIR must not break ssh."""
    long_tmp = tmp_path / ("d" * 70)
    long_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    host = _host(loopback_sshd)
    try:
        assert host.run("echo ok").stdout == "ok\n"
        assert host.control_dir is not None
        assert host.control_dir.startswith("/tmp/gpuready-ssh-")
    finally:
        host.close()


def test_a_host_dropped_without_close_still_stops_its_master(loopback_sshd: LoopbackSshd) -> None:
    """An interrupted session never calls close(): garbage collection (or exit) stops the master."""
    host = _host(loopback_sshd)
    host.run("true")
    control_dir = host.control_dir
    assert control_dir is not None
    disconnects_before = Path(loopback_sshd.log_path).read_text().count("disconnected by user")
    del host
    gc.collect()
    assert not os.path.exists(control_dir)
    deadline = time.monotonic() + 10
    while Path(loopback_sshd.log_path).read_text().count("disconnected by user") == disconnects_before:
        assert time.monotonic() < deadline, "the master connection was not closed"
        time.sleep(0.05)


def test_close_before_any_run_does_nothing(loopback_sshd: LoopbackSshd) -> None:
    host = _host(loopback_sshd)
    host.close()
    assert host.control_dir is None


def test_connection_refused_names_host_and_cause(closed_port: int) -> None:
    host = connect(f"ssh://root@127.0.0.1:{closed_port}", connect_timeout=5)
    with pytest.raises(HostError) as excinfo:
        host.run("true")
    message = str(excinfo.value)
    assert message.startswith(f"root@127.0.0.1:{closed_port}: ")
    assert "connection refused" in message
    host.close()


def test_wrong_key_is_authentication_failed(loopback_sshd: LoopbackSshd, tmp_path: Path) -> None:
    wrong_key = keygen(tmp_path / "id_wrong", "not-authorized")
    host = _host(loopback_sshd, identity_file=str(wrong_key))
    try:
        with pytest.raises(HostError, match=r"authentication failed") as excinfo:
            host.run("true")
        assert str(excinfo.value).startswith(f"{loopback_sshd.user}@127.0.0.1:{loopback_sshd.port}: ")
    finally:
        host.close()


def test_unresolvable_name_is_unknown_host() -> None:
    host = connect("root@gpu-box-7.invalid", connect_timeout=5)
    with pytest.raises(HostError) as excinfo:
        host.run("true")
    assert str(excinfo.value).startswith("root@gpu-box-7.invalid: ")
    assert "unknown host" in str(excinfo.value)
    host.close()


def test_peer_that_never_speaks_ssh_times_out(silent_port: int) -> None:
    host = connect(f"ssh://root@127.0.0.1:{silent_port}", connect_timeout=1)
    with pytest.raises(HostError) as excinfo:
        host.run("true")
    assert str(excinfo.value).startswith(f"root@127.0.0.1:{silent_port}: ")
    assert "timed out" in str(excinfo.value)
    host.close()


def test_unknown_host_key_is_verification_failure(loopback_sshd: LoopbackSshd, tmp_path: Path) -> None:
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    host = _host(loopback_sshd, ssh_options=(f"UserKnownHostsFile={empty_known_hosts}",
                                             "GlobalKnownHostsFile=/dev/null",
                                             "StrictHostKeyChecking=yes"))
    try:
        with pytest.raises(HostError, match=r"host key verification failed"):
            host.run("true")
    finally:
        host.close()
    assert empty_known_hosts.read_text() == "", "strict checking must not learn the key"


def test_changed_host_key_is_verification_failure(loopback_sshd: LoopbackSshd, tmp_path: Path) -> None:
    other_key = keygen(tmp_path / "other_host_key", "someone-else")
    public = " ".join(Path(f"{other_key}.pub").read_text().split()[:2])
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{loopback_sshd.port} {public}\n")
    host = _host(loopback_sshd, ssh_options=(f"UserKnownHostsFile={known_hosts}",
                                             "GlobalKnownHostsFile=/dev/null",
                                             "StrictHostKeyChecking=yes"))
    try:
        with pytest.raises(HostError, match=r"host key verification failed"):
            host.run("true")
    finally:
        host.close()


def test_proxy_command_through_a_bastion_keeps_one_connection(loopback_sshd: LoopbackSshd) -> None:
    """A jump host (here the same sshd, as a bastion) is dialled once, for the master connection."""
    bastion = shlex.join([*loopback_sshd.ssh_argv()[:-1], "-W", "%h:%p", f"{loopback_sshd.user}@127.0.0.1"])
    host = _host(loopback_sshd, ssh_options=(*loopback_sshd.ssh_options, f"ProxyCommand={bastion}"))
    before = loopback_sshd.accepted_connections()
    try:
        assert [host.run("echo via-bastion").stdout for _ in range(3)] == ["via-bastion\n"] * 3
        assert loopback_sshd.accepted_connections() - before == 2  # the bastion hop and the target
    finally:
        host.close()


def test_failed_proxy_hop_is_named(loopback_sshd: LoopbackSshd) -> None:
    host = _host(loopback_sshd, ssh_options=(*loopback_sshd.ssh_options, "ProxyCommand=false"))
    try:
        with pytest.raises(HostError, match=r"connection closed before the ssh handshake \(a ProxyJump/ProxyCommand"):
            host.run("true")
    finally:
        host.close()


def test_session_over_the_servers_limit_falls_back_to_a_fresh_connection() -> None:
    """sshd caps sessions per connection (MaxSessions, default 10). Past it, ssh opens a direct
    connection for that command instead of failing: the command runs, at the cost of a connection."""
    with loopback_sshd(extra_config=("MaxSessions 1",)) as server:
        host = _host(server)
        with subprocess.Popen([*host.ssh_argv(), "--", "echo held; exec sleep 30"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as held:
            try:
                assert held.stdout is not None
                assert held.stdout.readline() == b"held\n"  # the master is up, its one session taken
                assert server.accepted_connections() == 1
                assert host.run("echo second").stdout == "second\n"
                assert server.accepted_connections() == 2
            finally:
                host.close()  # ends the master, and with it the held session
                held.wait(timeout=10)


def test_user_ssh_option_wins_over_the_plugin_default(loopback_sshd: LoopbackSshd) -> None:
    """ssh keeps the first value of a keyword: a user's -o must come before the plugin's defaults."""
    host = _host(loopback_sshd, ssh_options=(*loopback_sshd.ssh_options, "ServerAliveInterval=3"))
    resolved = subprocess.run([*host.ssh_argv(), "-G"], capture_output=True, text=True, check=True)
    assert "serveraliveinterval 3" in resolved.stdout.splitlines()
    assert "batchmode yes" in resolved.stdout.splitlines()
    host.close()


def test_ssh_option_connect_timeout_becomes_the_host_timeout(loopback_sshd: LoopbackSshd) -> None:
    host = _host(loopback_sshd, ssh_options=(*loopback_sshd.ssh_options, "ConnectTimeout=3"),
                 connect_timeout=10)
    assert host.connect_timeout == 3
    host.close()


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("StrictHostKeyChecking", r"expected 'Key=Value'"),
        ("=yes", r"expected 'Key=Value'"),
        ("-oProxyCommand=touch /tmp/x", r"expected 'Key=Value'"),
        ("User=root\nProxyCommand=x", r"expected 'Key=Value'"),
        ("Port=", r"expected 'Key=Value'"),
        ("BatchMode=no", r"BatchMode is set by pytest-gpuready"),
        ("controlpath=/tmp/%C", r"controlpath is set by pytest-gpuready"),
        ("ControlMaster=no", r"ControlMaster is set by pytest-gpuready"),
        ("ControlPersist=yes", r"ControlPersist is set by pytest-gpuready"),
        ("ConnectTimeout=soon", r"ConnectTimeout takes whole seconds"),
        ("ConnectTimeout=0", r"ConnectTimeout takes whole seconds"),
    ],
)
def test_bad_ssh_option_is_rejected_naming_it(option: str, expected: str) -> None:
    with pytest.raises(HostSpecError, match=expected) as excinfo:
        SSHHost(parse_host_spec("root@gpu-box-7"), ssh_options=(option,))
    assert str(excinfo.value).startswith(f"--ssh-option {option!r}: ")
    if "ConnectTimeout" not in option:  # the timeout's value is read when the host is built
        with pytest.raises(HostSpecError, match=expected):
            validate_ssh_option(option)


@pytest.mark.parametrize("option", ["Port=2222", "ProxyJump=bastion", "IdentityAgent none",
                                    "ProxyCommand=ssh -W %h:%p bastion", "User=ubuntu"])
def test_good_ssh_option_is_passed_with_dash_o(option: str) -> None:
    host = SSHHost(parse_host_spec("root@gpu-box-7"), ssh_options=(option,))
    argv = host.ssh_argv()
    assert argv[1:3] == ["-o", option]
    assert argv[-1] == "root@gpu-box-7"


def test_address_is_what_ssh_dials_not_the_alias(loopback_sshd: LoopbackSshd) -> None:
    """HTTP to a server on the host must use the real name of an ssh-config alias (ssh -G resolves it)."""
    alias = connect(f"ssh://root@gpu-box-alias:{loopback_sshd.port}", identity_file=loopback_sshd.identity_file,
                    ssh_options=(*loopback_sshd.ssh_options, "HostName=127.0.0.1"), connect_timeout=5)
    try:
        assert alias.address == "127.0.0.1"
        assert alias.run("echo reached").stdout == "reached\n"  # and ssh really dials it
    finally:
        alias.close()
    plain = connect(loopback_sshd.spec, identity_file=loopback_sshd.identity_file,
                    ssh_options=loopback_sshd.ssh_options)
    assert plain.address == "127.0.0.1"
    plain.close()
