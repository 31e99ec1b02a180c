"""parse_host_spec: the forms ``--gpu-host`` accepts, and the values it must refuse.

A host spec ends up in the ssh client's argv, so anything that ssh could read as an option
(a leading ``-``) or that a shell would interpret is refused before a process is started.
"""

from __future__ import annotations

import pytest

from pytest_gpuready import HostSpec, HostSpecError, SSHHost, parse_host_spec


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("local", HostSpec("local")),
        ("  local  ", HostSpec("local")),
        ("gpu-box-7", HostSpec("ssh", hostname="gpu-box-7")),
        ("root@10.1.230.174", HostSpec("ssh", hostname="10.1.230.174", user="root")),
        ("ml.infra_01@gpu-box-7.example.com",
         HostSpec("ssh", hostname="gpu-box-7.example.com", user="ml.infra_01")),
        ("ssh://gpu-box-7", HostSpec("ssh", hostname="gpu-box-7")),
        ("ssh://root@gpu-box-7:2222", HostSpec("ssh", hostname="gpu-box-7", user="root", port=2222)),
        ("ssh://root@gpu-box-7:2222/", HostSpec("ssh", hostname="gpu-box-7", user="root", port=2222)),
        ("ssh://user@[::1]:2222", HostSpec("ssh", hostname="::1", user="user", port=2222)),
        ("ssh://[fe80::1]", HostSpec("ssh", hostname="fe80::1")),
        ("root@[2001:db8::7]", HostSpec("ssh", hostname="2001:db8::7", user="root")),
        ("ssh://root@127.0.0.1:1", HostSpec("ssh", hostname="127.0.0.1", user="root", port=1)),
        ("ssh://root@127.0.0.1:65535", HostSpec("ssh", hostname="127.0.0.1", user="root", port=65535)),
    ],
)
def test_accepted_spec(spec: str, expected: HostSpec) -> None:
    assert parse_host_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "name", "target"),
    [
        ("local", "local", "localhost"),
        ("gpu-box-7", "gpu-box-7", "gpu-box-7"),
        ("ssh://root@gpu-box-7:2222", "root@gpu-box-7:2222", "root@gpu-box-7"),
        ("ssh://user@[::1]:2222", "user@[::1]:2222", "user@::1"),
        ("root@[::1]", "root@[::1]", "root@::1"),
    ],
)
def test_spec_name_and_ssh_target(spec: str, name: str, target: str) -> None:
    parsed = parse_host_spec(spec)
    assert str(parsed) == name
    assert parsed.target == target


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("host;rm -rf /", r"contains whitespace or a control character"),
        ("host;reboot", r"is not a host name or address"),
        ("host$(id)", r"is not a host name or address"),
        ("`id`", r"is not a host name or address"),
        ("gpu box", r"contains whitespace or a control character"),
        ("host|cat", r"is not a host name or address"),
        ("host&", r"is not a host name or address"),
        ("ho'st", r"is not a host name or address"),
        ('ho"st', r"is not a host name or address"),
        ("host\nother", r"contains whitespace or a control character"),
        ("host>out", r"is not a host name or address"),
        ("$(reboot)@host", r"has characters a login name cannot have"),
        ("ro;ot@host", r"has characters a login name cannot have"),
        ("ssh://root@host;id:22", r"is not a host name or address"),
    ],
)
def test_shell_metacharacters_are_refused(spec: str, expected: str) -> None:
    with pytest.raises(HostSpecError, match=expected) as excinfo:
        parse_host_spec(spec)
    assert str(excinfo.value).startswith(f"--gpu-host {spec!r}: ")
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize(
    "spec",
    ["root\n@gpu-box-7", "ssh://root@gpu-box-7\n:22", "ssh://root@gpu-box-7:22\n/",
     "ssh://root@[::1\n]:22", "gpu-box\t7", "gpu\x00box", "gpu\x1bbox"],
)
def test_embedded_newline_or_control_character_is_refused(spec: str) -> None:
    """A line break inside a spec must not slip past a ``$`` anchor or crash the port parser."""
    with pytest.raises(HostSpecError, match=r"contains whitespace or a control character"):
        parse_host_spec(spec)


@pytest.mark.parametrize(
    "spec",
    ["-oProxyCommand=touch /tmp/pwned", "-p2222", "root@-oProxyCommand=x", "-l@host",
     "ssh://-oProxyCommand=x", "ssh://root@-host:22"],
)
def test_leading_dash_that_ssh_would_read_as_an_option_is_refused(spec: str) -> None:
    with pytest.raises(HostSpecError) as excinfo:
        parse_host_spec(spec)
    assert str(excinfo.value).startswith(f"--gpu-host {spec!r}: ")


@pytest.mark.parametrize("spec", ["ssh://root@host:0", "ssh://root@host:65536", "ssh://host:99999",
                                  "ssh://user@[::1]:70000"])
def test_port_out_of_range_is_refused(spec: str) -> None:
    with pytest.raises(HostSpecError, match=r"port \d+ is out of range 1-65535"):
        parse_host_spec(spec)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", r"--gpu-host is empty"),
        ("   ", r"--gpu-host is empty"),
        ("http://gpu-box-7", r"unknown scheme 'http'"),
        ("ssh://", r"is not a host name or address"),
        ("@gpu-box-7", r"has characters a login name cannot have"),
        ("a@b@gpu-box-7", r"has characters a login name cannot have"),
        ("root@gpu-box-7:2222", r"is not a host name or address"),
        ("[::1]:2222", r"is not a host name or address"),
        ("ssh://root@gpu-box-7:ssh", r"is not a host name or address"),
    ],
)
def test_malformed_spec_is_refused_with_the_expected_forms(spec: str, expected: str) -> None:
    with pytest.raises(HostSpecError, match=expected) as excinfo:
        parse_host_spec(spec)
    assert "expected" in str(excinfo.value) or "login name" in str(excinfo.value)


def test_ssh_argv_ends_with_the_target_after_all_options() -> None:
    host = SSHHost(parse_host_spec("ssh://root@gpu-box-7:2222"), identity_file="/keys/id_ed25519",
                   ssh_options=("ProxyJump=bastion",))
    argv = host.ssh_argv()
    assert argv[0] == "ssh"
    assert argv[-1] == "root@gpu-box-7"
    assert argv[argv.index("-p"):argv.index("-p") + 2] == ["-p", "2222"]
    assert argv[argv.index("-i"):argv.index("-i") + 2] == ["-i", "/keys/id_ed25519"]
    pairs = {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-o"}
    assert {"BatchMode=yes", "ControlMaster=auto", "IdentitiesOnly=yes", "ProxyJump=bastion"} <= pairs
    assert any(pair.startswith("ConnectTimeout=") for pair in pairs)
    assert any(pair.startswith("ControlPersist=") for pair in pairs)
