"""Bounded, regular-file-only reads (pytest_gpuready.files), and the model-directory readers, local and
remote, against files that are FIFOs, devices, symlink loops, too big, NUL-laden, not UTF-8 or nested
too deeply. Real files, FIFOs and symlinks in a temporary directory; the remote reader runs through a
real ``sh`` on this machine (LocalHost), the very script ssh would carry.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuready import ConfigError, LocalHost
from pytest_gpuready.errors import excerpt
from pytest_gpuready.files import FileRefused, loads_json, read_bytes_bounded, read_text_bounded
from pytest_gpuready.model.safetensors_headers import (
    analyse_directory,
    read_raw_directory,
    read_raw_directory_remote,
)

CONFIG = (Path(__file__).parent.parent / "data" / "configs" / "meta-llama__Llama-3.1-8B.json").read_text()


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    """FIFOs a test makes; afterwards each gets a writer, so a reader that did block would return."""
    made: list[Path] = []
    yield made
    for path in made:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _fifo(fifos: list[Path], path: Path) -> Path:
    os.mkfifo(path)
    fifos.append(path)
    return path


def _in_thread(fn: object, deadline_s: float = 60) -> object:
    """Run ``fn`` in a thread and fail (not hang) when it has not returned by the deadline."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()  # type: ignore[operator]
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert not thread.is_alive(), "the read blocked"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.mark.parametrize(("make", "reason"), [
    ("fifo", "a FIFO (named pipe); expected a regular file"),
    ("zero", "a character device; expected a regular file"),
    ("loop", "a symlink loop (too many levels of symbolic links)"),
    ("dir", "a directory; expected a regular file"),
    ("missing", "deploy file not found"),
    ("big", "2.0 MiB, over the limit of 1.0 MiB for a deploy file"),
])
def test_refused_before_reading(tmp_path: Path, fifos: list[Path], make: str, reason: str) -> None:
    path = tmp_path / "deploy.yaml"
    if make == "fifo":
        _fifo(fifos, path)
    elif make == "zero":
        path.symlink_to("/dev/zero")
    elif make == "loop":
        path.symlink_to(path)
    elif make == "dir":
        path.mkdir()
    elif make == "big":
        with path.open("wb") as handle:
            handle.truncate(2 * 1024 * 1024)
    with pytest.raises(FileRefused) as info:
        _in_thread(lambda: read_bytes_bounded(path, 1024 * 1024, "deploy file"))
    assert str(info.value) == f"{path}: {reason}"
    assert info.value.reason == reason
    assert isinstance(info.value, ConfigError)


def test_a_regular_file_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(CONFIG)
    assert read_text_bounded(path, len(CONFIG)) == CONFIG
    with pytest.raises(FileRefused, match="over the limit of"):
        read_text_bounded(path, len(CONFIG) - 1)


def test_text_rules(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\nb: \0\n")
    with pytest.raises(FileRefused, match=r"x.yaml: contains a NUL byte \(line 2, byte offset 8\); expected text$"):
        read_text_bounded(path, 100)
    path.write_bytes(b"a: 1\nb: \xe9\n")
    with pytest.raises(FileRefused, match=r"x.yaml: not UTF-8 text \(byte 0xe9 at line 2, byte offset 8\)$"):
        read_text_bounded(path, 100)
    with pytest.raises(FileRefused, match="the path contains a NUL byte"):
        read_text_bounded("a\0b", 100)


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 100_000 + "]" * 100_000, "f.json: JSON nested too deeply (arrays or objects inside one another more "
                                    "levels than the decoder allows, about 1000)"),
    ("{" + '"a": {' * 5000 + "}" * 5001, "f.json: JSON nested too deeply *"),
    ("1" * 5000, "f.json: not valid JSON (Exceeds the limit (4300 digits)*"),
    ('{"a": 1,}', "f.json: not valid JSON (line 1 column 9: Expecting property name enclosed in double quotes)"),
])
def test_json_failures_name_the_file(text: str, message: str) -> None:
    import fnmatch

    with pytest.raises(ConfigError) as info:
        loads_json(text, "f.json")
    assert fnmatch.fnmatchcase(str(info.value), message), str(info.value)


def test_excerpt_is_bounded() -> None:
    graph: list[object] = ["lol"] * 9
    for _ in range(9):
        graph = [graph] * 9  # 9**10 strings if expanded; shared, so cheap to build
    started = time.monotonic()
    text = excerpt(graph)
    assert time.monotonic() - started < 30  # finished, not expanded
    assert len(text) <= 160
    assert len(excerpt("x" * 10_000_000)) <= 160
    assert excerpt({"min": 60, "max": 50}) == "{'min': 60, 'max': 50}"  # the file's order


# ---------------------------------------------------------------- model directories, local and remote


def _shard(path: Path, header: bytes, data: int = 0) -> None:
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + data)


def _both(directory: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The errors of the local and of the remote reader for the same directory."""
    local = _in_thread(lambda: read_raw_directory(directory))
    remote = _in_thread(lambda: read_raw_directory_remote(LocalHost(), str(directory), timeout=60))
    return dict(local.errors), dict(remote.errors)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("make", "reason"), [
    ("fifo", "a FIFO (named pipe); expected a regular file"),
    ("zero", "a character device; expected a regular file"),
    ("loop", "a symlink loop (too many levels of symbolic links)"),
    ("dir", "a directory; expected a regular file"),
    ("big", "16.0 MiB, over the limit of 16.0 MiB for a config.json"),
    ("nul", "contains a NUL byte (line 1, byte offset 1); expected text"),
    ("latin1", "not UTF-8 text (byte 0xe9 at line 1, byte offset 13)"),
])
def test_side_file_refusals_read_the_same_locally_and_remotely(tmp_path: Path, fifos: list[Path],
                                                               make: str, reason: str) -> None:
    config = tmp_path / "config.json"
    if make == "fifo":
        _fifo(fifos, config)
    elif make == "zero":
        config.symlink_to("/dev/zero")
    elif make == "loop":
        config.symlink_to(config)
    elif make == "dir":
        config.mkdir()
    elif make == "big":
        with config.open("wb") as handle:
            handle.truncate(16 * 1024 * 1024 + 1)
    elif make == "nul":
        config.write_bytes(b"{\0}")
    elif make == "latin1":
        config.write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    local, remote = _both(tmp_path)
    assert local == remote == {"config.json": reason}


def test_shards_and_index_that_are_not_files(tmp_path: Path, fifos: list[Path]) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    _shard(tmp_path / "model-00001-of-00003.safetensors", header, 8)
    _fifo(fifos, tmp_path / "model-00002-of-00003.safetensors")
    (tmp_path / "model-00003-of-00003.safetensors").symlink_to("/dev/zero")
    (tmp_path / "config.json").write_text(CONFIG)
    for reader in (lambda: read_raw_directory(tmp_path),
                   lambda: read_raw_directory_remote(LocalHost(), str(tmp_path), timeout=60)):
        files = analyse_directory(_in_thread(reader))  # type: ignore[arg-type]
        assert sorted(files.problems) == [
            "model-00002-of-00003.safetensors: a FIFO (named pipe); expected a regular file",
            "model-00003-of-00003.safetensors: a character device; expected a regular file",
        ]
    index = tmp_path / "model.safetensors.index.json"
    _fifo(fifos, index)
    local, remote = _both(tmp_path)
    assert local == remote == {"model.safetensors.index.json": "a FIFO (named pipe); expected a regular file"}


def test_deep_json_in_headers_and_index_is_a_named_problem(tmp_path: Path) -> None:
    deep = ("[" * 50_000 + "]" * 50_000).encode()
    _shard(tmp_path / "model.safetensors", deep)
    (tmp_path / "config.json").write_text(CONFIG)
    problems = analyse_directory(read_raw_directory(tmp_path)).problems
    assert problems == ("model.safetensors: header is JSON nested too deeply (more levels than the decoder "
                        "allows, about 1000); expected an object of tensors",)
    (tmp_path / "model.safetensors.index.json").write_bytes(b'{"weight_map": ' + deep + b"}")
    for reader in (lambda: read_raw_directory(tmp_path),
                   lambda: read_raw_directory_remote(LocalHost(), str(tmp_path), timeout=60)):
        files = analyse_directory(_in_thread(reader))  # type: ignore[arg-type]
        assert "model.safetensors.index.json: JSON nested too deeply (more levels than the decoder allows, " \
               "about 1000)" in files.problems


def test_directory_refusals_read_the_same_locally_and_remotely(tmp_path: Path) -> None:
    loop = tmp_path / "model"
    loop.symlink_to(loop)
    local, remote = _both(loop)
    assert local == remote == {".": "a symlink loop (too many levels of symbolic links)"}
    regular = tmp_path / "file"
    regular.write_text("x")
    local, remote = _both(regular)
    assert local == remote == {".": "a regular file"}
    local, remote = _both(tmp_path / "nowhere")
    assert local == remote == {".": "directory not found"}
