"""Header-only reading of safetensors checkpoints: sizes, completeness, local and remote alike."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from pytest_gpuready import HostError, LocalHost, ProbeError
from pytest_gpuready.model.safetensors_headers import (
    MAX_HEADER_BYTES,
    RawShard,
    decode_remote_output,
    inspect_files,
    inspect_files_remote,
    parse_shard,
    read_raw_directory_remote,
)
from tests.checkpoints import TensorSpec, small_tensors, write_checkpoint, write_shard

NAMES = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
         "model-00003-of-00003.safetensors"]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    names = write_checkpoint(tmp_path / "ckpt", small_tensors(), shards=3)
    assert names == NAMES
    return tmp_path / "ckpt"


def test_complete_checkpoint_sizes_from_headers(checkpoint: Path) -> None:
    files = inspect_files(checkpoint)
    tensors = small_tensors()
    assert files.problems == ()
    assert files.index_name == "model.safetensors.index.json"
    assert files.shard_names == tuple(NAMES)
    assert files.total_bytes == sum(t.nbytes for t in tensors)
    assert files.tensor_count == len(tensors)
    assert files.parameter_count() == sum(t.nbytes // {"BF16": 2, "F32": 4}.get(t.dtype, 1) for t in tensors)
    by_dtype = files.bytes_by_dtype()
    assert by_dtype["F8_E4M3"] == 64 * 64
    assert by_dtype["F32"] == 4
    assert by_dtype["BF16"] == sum(t.nbytes for t in tensors if t.dtype == "BF16")


def test_headers_agree_with_safetensors_safe_open(checkpoint: Path) -> None:
    """Our reading of the builder's files is what the safetensors package itself reads."""
    files = inspect_files(checkpoint)
    for shard in files.shards:
        with safe_open(str(checkpoint / shard.name), framework="numpy") as handle:
            assert sorted(handle.keys()) == sorted(shard.tensors)
            assert handle.metadata() == dict(shard.metadata)
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                assert list(handle.get_slice(name).get_shape()) == list(shard.tensors[name].shape)


def test_sparse_files_hold_only_headers(checkpoint: Path) -> None:
    big = checkpoint / "big.safetensors"
    size = write_shard(big, [TensorSpec("w", "BF16", (32768, 16384))])
    assert size > 1024**3
    assert os.stat(big).st_blocks * 512 < 1024**2


def test_reading_a_1_gib_shard_reads_only_its_header(tmp_path: Path) -> None:
    directory = tmp_path / "one"
    directory.mkdir()
    write_shard(directory / "model.safetensors", [TensorSpec("w", "BF16", (32768, 16384))])

    def rchar() -> int:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
        raise AssertionError("no rchar in /proc/self/io")

    before = rchar()
    files = inspect_files(directory)
    read = rchar() - before
    assert files.total_bytes == 32768 * 16384 * 2
    assert read < 64 * 1024, f"read {read} bytes to inspect a 1 GiB shard"


def test_missing_shard(checkpoint: Path) -> None:
    (checkpoint / NAMES[1]).unlink()
    files = inspect_files(checkpoint)
    assert files.problems == (f"{NAMES[1]}: missing (named in model.safetensors.index.json)",)
    assert len(files.shards) == 2


def test_truncated_shard(checkpoint: Path) -> None:
    path = checkpoint / NAMES[0]
    full = path.stat().st_size
    os.truncate(path, full - 100)
    (problem,) = inspect_files(checkpoint).problems
    assert problem.startswith(f"{NAMES[0]}: file is {full - 100} bytes but its header describes {full} ")
    assert problem.endswith("truncated download, 100 bytes missing")


def test_trailing_bytes(checkpoint: Path) -> None:
    path = checkpoint / NAMES[2]
    full = path.stat().st_size
    os.truncate(path, full + 8)
    (problem,) = inspect_files(checkpoint).problems
    assert problem.endswith(": 8 unexpected trailing bytes")


def test_header_length_larger_than_the_file(checkpoint: Path) -> None:
    path = checkpoint / NAMES[1]
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.write(struct.pack("<Q", size * 10))
    (problem,) = inspect_files(checkpoint).problems
    assert problem == (f"{NAMES[1]}: header length {size * 10} is larger than the file ({size} bytes): "
                       "truncated download or not a safetensors file")


def test_header_length_over_the_safetensors_limit() -> None:
    raw = RawShard("x.safetensors", 10**10, MAX_HEADER_BYTES + 1)
    header, problems = parse_shard(raw)
    assert header is None
    assert problems == [f"x.safetensors: header length {MAX_HEADER_BYTES + 1} exceeds the safetensors "
                        f"limit of {MAX_HEADER_BYTES} bytes (not a safetensors file, or corrupt)"]


def test_file_shorter_than_the_length_prefix(checkpoint: Path) -> None:
    os.truncate(checkpoint / NAMES[0], 5)
    assert inspect_files(checkpoint).problems == (
        f"{NAMES[0]}: only 5 bytes, too short for a safetensors header (truncated download?)",)


def test_header_not_json(tmp_path: Path) -> None:
    raw = RawShard("x.safetensors", 8 + 4, 4, b"{no}")
    _, problems = parse_shard(raw)
    assert problems[0].startswith("x.safetensors: header is not valid JSON (")


def test_header_that_is_not_an_object() -> None:
    _, problems = parse_shard(RawShard("x.safetensors", 8 + 2, 2, b"[]"))
    assert problems == ["x.safetensors: header is a JSON list, expected an object"]


def test_bad_tensor_entries_are_named() -> None:
    header = {"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [0, 10]},
              "c": {"dtype": "F32", "shape": [2], "data_offsets": [10, 18]}}
    raw = json.dumps(header).encode()
    _, problems = parse_shard(RawShard("x.safetensors", 8 + len(raw) + 18, len(raw), raw))
    assert problems == [
        "x.safetensors: tensor 'a': unknown dtype 'Q9'",
        "x.safetensors: tensor 'b': data_offsets [0, 10] hold 10 bytes; shape [4] of F32 needs 16",
    ]


def test_index_naming_a_tensor_the_shard_lacks(checkpoint: Path) -> None:
    index_path = checkpoint / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.9.ghost.weight"] = NAMES[0]
    index_path.write_text(json.dumps(index))
    assert inspect_files(checkpoint).problems == (
        f"{NAMES[0]}: 1 tensor(s) that model.safetensors.index.json places here are not in its header "
        "(first: 'model.layers.9.ghost.weight')",)


def test_index_not_json(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors.index.json").write_text("{")
    problems = inspect_files(checkpoint).problems
    assert problems[0].startswith("model.safetensors.index.json: not valid JSON (")


def test_index_without_weight_map(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors.index.json").write_text('{"metadata": {}}')
    files = inspect_files(checkpoint)
    assert files.problems == ("model.safetensors.index.json: key 'weight_map' is missing or not an "
                              "object of tensor -> file",)
    assert files.shard_names == tuple(NAMES)  # falls back to the directory listing


def test_index_naming_a_path_outside_the_directory(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    problems = inspect_files(checkpoint).problems
    expected = "model.safetensors.index.json: shard '../../etc/passwd' is not a file name in the model directory"
    assert expected in problems


def test_without_index_every_safetensors_file_counts(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m", small_tensors(), shards=2, index=False)
    files = inspect_files(tmp_path / "m")
    assert files.index_name is None
    assert len(files.shard_names) == 2
    assert files.problems == ()


def test_config_only_directory_has_no_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    files = inspect_files(tmp_path)
    assert not files.has_weights
    assert files.side_files["config.json"] == "{}"
    assert files.side_files["hf_quant_config.json"] is None


def test_remote_reader_matches_local(checkpoint: Path) -> None:
    """The script sent through Host.run (here a real local sh + python3) sees what the local reader sees."""
    os.truncate(checkpoint / NAMES[0], 20)
    (checkpoint / NAMES[2]).unlink()
    (checkpoint / "config.json").write_text('{"model_type": "llama"}')
    host = LocalHost()
    remote = inspect_files_remote(host, str(checkpoint))
    local = inspect_files(checkpoint)
    assert host.commands_run == 1
    assert remote.problems == local.problems
    assert remote.total_bytes == local.total_bytes
    assert remote.side_files == local.side_files
    assert len(remote.problems) == 2


def test_remote_reader_quotes_the_path(tmp_path: Path) -> None:
    odd = tmp_path / "it's a $(dir); rm -rf x"
    write_checkpoint(odd, small_tensors(), shards=1, config={"a": 1})
    files = inspect_files_remote(LocalHost(), str(odd))
    assert files.problems == ()
    assert files.side_files["config.json"] is not None


def test_remote_reader_on_a_missing_directory(tmp_path: Path) -> None:
    raw = read_raw_directory_remote(LocalHost(), str(tmp_path / "nope"))
    assert raw.is_directory is False


def test_remote_reader_without_python(tmp_path: Path) -> None:
    expected = r"^local: no-such-python3 is not on PATH; it is needed to read model files there$"
    with pytest.raises(HostError, match=expected):
        read_raw_directory_remote(LocalHost(), str(tmp_path), python="no-such-python3")


def test_garbled_remote_report() -> None:
    expected = r"^gpu-box: the model-directory reader printed 'Welcome to Ubuntu', not its report$"
    with pytest.raises(ProbeError, match=expected):
        decode_remote_output("gpu-box", "Welcome to Ubuntu\n")
    with pytest.raises(ProbeError, match=r"^gpu-box: the model-directory report is garbled"):
        decode_remote_output("gpu-box", "GPUREADY-MODELDIR-1:not-base64!!\n")


def test_shard_that_cannot_be_read(checkpoint: Path) -> None:
    (checkpoint / NAMES[0]).unlink()
    (checkpoint / NAMES[0]).mkdir()  # unreadable as a file, even for root
    (problem,) = inspect_files(checkpoint).problems
    assert problem == f"{NAMES[0]}: a directory; expected a regular file"


def test_index_that_cannot_be_read(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors.index.json").unlink()
    (checkpoint / "model.safetensors.index.json").mkdir()
    problems = inspect_files(checkpoint).problems
    assert problems[0] == "model.safetensors.index.json: a directory; expected a regular file"


def test_metadata_that_is_not_an_object() -> None:
    raw = b'{"__metadata__": [1]}'
    _, problems = parse_shard(RawShard("x.safetensors", 8 + len(raw), len(raw), raw))
    assert problems == ["x.safetensors: header __metadata__ is not an object of strings"]


def test_many_bad_tensors_are_summarised() -> None:
    header = {f"t{i}": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]} for i in range(6)}
    raw = json.dumps(header).encode()
    _, problems = parse_shard(RawShard("x.safetensors", 8 + len(raw), len(raw), raw))
    assert problems[:3] == [f"x.safetensors: tensor 't{i}': unknown dtype 'Q9'" for i in range(3)]
    assert problems[3:] == ["x.safetensors: 3 further tensor problems not listed"]


def test_remote_reader_that_fails(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match=rf"^local: reading {tmp_path} failed \(exit 1\): no output$"):
        read_raw_directory_remote(LocalHost(), str(tmp_path), python="false")


def test_remote_report_missing_keys() -> None:
    import base64
    import zlib

    encoded = base64.b64encode(zlib.compress(b'{"path": "/m"}')).decode()
    with pytest.raises(ProbeError, match=r"^gpu-box: the model-directory report lacks 'shards'$"):
        decode_remote_output("gpu-box", f"GPUREADY-MODELDIR-1:{encoded}\n")


def test_builder_faults_truncated_and_oversized_header_length(tmp_path: Path) -> None:
    directory = tmp_path / "faulty"
    directory.mkdir()
    tensors = small_tensors()
    (directory / "config.json").write_text("{}")
    write_shard(directory / "a.safetensors", tensors[:3], size_delta=-1000)
    size = write_shard(directory / "b.safetensors", tensors[3:], header_len_override=10**7)
    problems = inspect_files(directory).problems
    assert problems[0].endswith("truncated download, 1000 bytes missing")
    assert problems[1] == (f"b.safetensors: header length {10**7} is larger than the file ({size} bytes): "
                           "truncated download or not a safetensors file")
