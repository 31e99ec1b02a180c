"""The writer of every plugin output (pytest_gpuready.outputs), on real files, devices, FIFOs and mounts.

The plugin-level cases (a report through pytest, exit codes, messages) are in
tests/plugin/test_report_outputs.py; here: the paths the plugin-level tests do not reach (a block
device, a socket, a dangling symlink, a missing folder), many writers at once, and a write that
fails half-way on a full filesystem (a 64 KiB tmpfs in a private mount namespace), which must
leave the old file whole and no temporary file behind.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_gpuready.outputs import OutputRefused, check_output, check_output_folder, write_output

IS_ROOT = os.geteuid() == 0


def test_a_new_file_in_a_missing_folder_is_written_and_the_folder_made(tmp_path: Path) -> None:
    output = check_output("a/b/report.json", tmp_path)
    assert output.kind == "atomic"
    write_output(output, "{}\n")
    assert (tmp_path / "a" / "b" / "report.json").read_text() == "{}\n"
    assert os.listdir(tmp_path / "a" / "b") == ["report.json"]


def test_a_dangling_symlink_is_kept_and_its_target_written(tmp_path: Path) -> None:
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "real.json")
    write_output(check_output(str(link)), "{}\n")
    assert link.is_symlink()
    assert (tmp_path / "real.json").read_text() == "{}\n"


def test_a_block_device_and_a_socket_are_refused_in_one_line(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(OutputRefused) as excinfo:
            check_output(str(sock_path))
    assert str(excinfo.value) == (f"{sock_path}: is a socket; expected a file path (a new or regular file), - for "
                                  "standard output, a character device or a FIFO")
    if IS_ROOT:
        block = tmp_path / "loop"
        os.mknod(block, stat.S_IFBLK | 0o600, os.makedev(7, 0))
        with pytest.raises(OutputRefused, match=r": is a block device; expected a file path"):
            check_output(str(block))
        assert stat.S_ISBLK(block.stat().st_mode)


def test_a_path_under_a_regular_file_and_an_empty_path_are_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(OutputRefused, match=r"notes.txt is a regular file, not a folder$"):
        check_output(str(tmp_path / "notes.txt" / "report.json"))
    with pytest.raises(OutputRefused, match=r"^report path '' is empty"):
        check_output("", what="report")
    with pytest.raises(OutputRefused, match=r"notes.txt: is a regular file; expected a folder"):
        check_output_folder(str(tmp_path / "notes.txt"), what="plots")


def test_many_writers_of_one_path_each_succeed_and_the_file_is_always_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    output = check_output(str(target))
    errors: list[BaseException] = []
    seen: list[str] = []
    stop = threading.Event()

    def writer(index: int) -> None:
        try:
            for round_ in range(20):
                write_output(output, json.dumps({"writer": index, "round": round_, "pad": "x" * 50_000}))
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        while not stop.is_set():
            if target.exists():
                seen.append(target.read_text())

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    assert errors == []
    assert all(json.loads(text)["pad"] == "x" * 50_000 for text in seen)  # never a part of a report
    assert json.loads(target.read_text())["round"] == 19
    assert os.listdir(tmp_path) == ["report.json"]


_FULL_DISK = """
import os, sys
from pytest_gpuready.outputs import OutputRefused, check_output, write_output
folder = sys.argv[1]
output = check_output(os.path.join(folder, "report.json"))
try:
    write_output(output, "x" * 1_000_000)
except OutputRefused as exc:
    print(exc)
print(open(os.path.join(folder, "report.json")).read(), end="")
print(sorted(os.listdir(folder)))
"""


def test_a_write_that_fills_the_disk_leaves_the_old_file_whole_and_nothing_else(tmp_path: Path) -> None:
    if not IS_ROOT or shutil.which("unshare") is None:
        pytest.skip("a private mount namespace (unshare -m) needs root and util-linux")
    folder = tmp_path / "small"
    folder.mkdir()
    script = (f"mount -t tmpfs -o size=64k none {folder} && echo old > {folder}/report.json && "
              f"exec {sys.executable} -c '{_FULL_DISK}' {folder}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{folder}/report.json: could not be written: No space left on device",
        "old",
        "['report.json']",
    ]
