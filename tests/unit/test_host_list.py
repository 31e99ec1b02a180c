"""The hosts file and display names: what a fleet is made of, and the lines it must refuse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_gpuready import HostSpec, HostSpecError
from pytest_gpuready.host.host_list import (
    MAX_HOSTS_FILE_BYTES,
    display_names,
    merge_hosts,
    parse_hosts_text,
    read_hosts_file,
)


def test_one_spec_a_line_with_comments_and_blank_lines() -> None:
    text = "# the H200 fleet\n\nroot@gpu-box-7\n  ssh://ubuntu@10.0.0.8:2222   # the spare\nlocal\n"
    assert parse_hosts_text(text, "fleet.txt") == (
        HostSpec("ssh", hostname="gpu-box-7", user="root"),
        HostSpec("ssh", hostname="10.0.0.8", user="ubuntu", port=2222),
        HostSpec("local"),
    )


@pytest.mark.parametrize(("text", "message"), [
    ("gpu-1\ngpu;reboot\n",
     "fleet.txt line 2: 'gpu;reboot': 'gpu;reboot' is not a host name or address; expected 'local', 'host', "
     "'user@host' or 'ssh://user@host:port'"),
    ("gpu-1\n\n-oProxyCommand=x\n", "fleet.txt line 3: '-oProxyCommand=x': "),
    ("ssh://root@gpu-1:70000\n", "fleet.txt line 1: 'ssh://root@gpu-1:70000': port 70000 is out of range 1-65535"),
    ("root@gpu-1\n# again\nroot@gpu-1\n", "fleet.txt line 3: 'root@gpu-1' is already listed on line 1"),
])
def test_a_bad_line_is_named_with_its_number(text: str, message: str) -> None:
    with pytest.raises(HostSpecError) as excinfo:
        parse_hosts_text(text, "fleet.txt")
    assert str(excinfo.value).startswith(message)
    assert "\n" not in str(excinfo.value)


def test_display_names_are_short_and_unique() -> None:
    specs = (HostSpec("ssh", hostname="gpu-box-7", user="root"), HostSpec("ssh", hostname="10.0.0.8", port=2222),
             HostSpec("ssh", hostname="fd00::7", port=22), HostSpec("local"))
    assert display_names(specs) == ("gpu-box-7", "10.0.0.8:2222", "[fd00::7]:22", "local")
    # two hosts that differ by user alone keep the user, so the ids stay distinct
    same = (HostSpec("ssh", hostname="gpu-1", user="alice"), HostSpec("ssh", hostname="gpu-1", user="bob"))
    assert display_names(same) == ("alice@gpu-1", "bob@gpu-1")


def test_a_host_given_twice_is_refused() -> None:
    spec = HostSpec("ssh", hostname="gpu-1")
    with pytest.raises(HostSpecError, match="host gpu-1 is given twice"):
        merge_hosts((spec,), (HostSpec("ssh", hostname="gpu-2"), spec))


def test_reading_refuses_what_is_not_a_small_text_file(tmp_path: Path) -> None:
    with pytest.raises(HostSpecError, match=r"missing\.txt: hosts file not found"):
        read_hosts_file(str(tmp_path / "missing.txt"))
    with pytest.raises(HostSpecError, match="a directory; expected a regular file"):
        read_hosts_file(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # never opened: a pipe nobody writes to cannot hang the session
    with pytest.raises(HostSpecError, match=r"a FIFO \(named pipe\); expected a regular file"):
        read_hosts_file(str(fifo))
    big = tmp_path / "big.txt"
    big.write_text("gpu-1\n" * (MAX_HOSTS_FILE_BYTES // 6 + 1))
    with pytest.raises(HostSpecError, match=r"over the limit of 1\.0 MiB for a hosts file"):
        read_hosts_file(str(big))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"gpu-1\n\xff\xfe\n")
    with pytest.raises(HostSpecError, match=r"not UTF-8 text \(byte 0xff at line 2"):
        read_hosts_file(str(binary))
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n")
    with pytest.raises(HostSpecError, match="lists no host"):
        read_hosts_file(str(empty))
