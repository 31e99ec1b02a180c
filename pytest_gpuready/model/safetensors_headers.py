"""Read safetensors headers (never tensor data) and tell whether a checkpoint is complete.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every tensor's
dtype, shape and byte range, then the data. The header alone gives the weight bytes per dtype,
the parameter count and the file size the data needs, so a 540 GB checkpoint is sized and
checked for truncated downloads by reading a few megabytes.

Reading is split from analysis: :func:`read_raw_directory` (here) and the script that
:func:`read_raw_directory_remote` sends through :meth:`Host.run` (one round trip for the whole
directory, config files included) both produce a :class:`RawDirectory`; :func:`analyse_directory`
turns either into a :class:`ModelFiles`, so local and remote inspection share one parser and
report the same problems in the same words.

Header-only reading is done here by hand rather than with ``safetensors.safe_open`` so that the
remote side needs nothing but ``python3``; the tests check our reading against safe_open's.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import stat
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from pytest_gpuready.errors import HostError, ProbeError, excerpt
from pytest_gpuready.files import (
    MIB,
    FileRefused,
    decode_text,
    describe_kind,
    gc_paused,
    open_regular_file,
    os_error_reason,
    read_bytes_bounded,
    read_fd,
)
from pytest_gpuready.host.hosts import Host

MAX_HEADER_BYTES = 100_000_000
"""safetensors refuses larger headers (its ``HeaderTooLarge`` error). A real 230B checkpoint's
largest header is 12 MiB."""
MAX_SIDE_FILE_BYTES = 16 * MIB
"""config.json and hf_quant_config.json: a few KiB in real checkpoints."""
MAX_INDEX_BYTES = 128 * MIB
"""model.safetensors.index.json: 9.4 MiB for a 230B checkpoint with 96,103 tensors."""

INDEX_NAME = "model.safetensors.index.json"
INDEX_SUFFIX = ".safetensors.index.json"
SIDE_FILES = ("config.json", "hf_quant_config.json")
"""Small files read in the same pass as the headers, so remote inspection is one round trip."""

DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
"""Element widths of the safetensors dtypes (``safetensors/src/tensor.rs`` ``Dtype::bitsize``)."""

_REMOTE_MARKER = "GPUREADY-MODELDIR-1:"
_MAX_PROBLEMS_PER_SHARD = 3


class TensorInfo(NamedTuple):
    """One tensor's entry in a header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class RawShard:
    """What was read from one shard: its size and the header bytes, or why they are absent."""

    name: str
    file_size: int | None
    """None when the file does not exist."""
    header_len: int | None = None
    """None when the file is shorter than the 8-byte length prefix."""
    header: bytes | None = None
    """None when the length prefix points past the end of the file or over the safetensors limit."""
    error: str | None = None
    """An I/O error (permission denied) that kept the shard from being read."""


@dataclass(frozen=True)
class RawDirectory:
    """A model directory as read, locally or by the remote script: nothing interpreted yet."""

    path: str
    is_directory: bool
    side_files: Mapping[str, str | None] = field(default_factory=dict)
    """Text of each of :data:`SIDE_FILES`; None when the file is absent."""
    index_name: str | None = None
    index_text: str | None = None
    listed_safetensors: tuple[str, ...] = ()
    """Every ``*.safetensors`` in the directory."""
    shards: tuple[RawShard, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)
    """File name -> I/O error for side files or the index that exist but could not be read."""
    parsed_index: tuple[dict[str, str], int | None, list[str]] | None = field(
        default=None, repr=False, compare=False)
    """The index as :func:`read_raw_directory` already parsed it (so it is parsed once)."""
    reader_bytes_read: int | None = None
    """Bytes the remote reader read while reading (its ``/proc/self/io`` rchar), when it could tell."""
    report_bytes: int | None = None
    """Size of the encoded report that came back from the host."""


@dataclass(frozen=True)
class ShardHeader:
    """A parsed, validated header of one shard, with its sums precomputed.

    Only ``tensor name -> bytes`` is kept per tensor (a dict of str and int, which the garbage
    collector does not track): a 230B checkpoint has ~100k tensors, and one Python object per
    tensor would cost more than the parse. :attr:`tensors` re-reads the header for callers that
    want dtypes and shapes.
    """

    name: str
    file_size: int
    header_len: int
    data_size: int
    tensor_sizes: Mapping[str, int]
    metadata: Mapping[str, str]
    bytes_by_dtype: Mapping[str, int]
    numel: int
    raw_header: bytes = field(default=b"", repr=False, compare=False)

    @property
    def expected_file_size(self) -> int:
        return 8 + self.header_len + self.data_size

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor as a :class:`TensorInfo` (parses the header again; not for hot paths)."""
        header = json.loads(self.raw_header)
        header.pop("__metadata__", None)
        return {name: TensorInfo(e["dtype"], tuple(e["shape"]), *e["data_offsets"])
                for name, e in header.items() if name in self.tensor_sizes}


@dataclass(frozen=True)
class ModelFiles:
    """A model directory's side files and weights, with every completeness problem found."""

    path: str
    side_files: Mapping[str, str | None]
    index_name: str | None
    shard_names: tuple[str, ...]
    """The shards the checkpoint consists of (from the index, else the directory listing)."""
    shards: tuple[ShardHeader, ...]
    """The shards whose headers parsed."""
    problems: tuple[str, ...]
    index_total_size: int | None = None
    is_directory: bool = True
    side_errors: Mapping[str, str] = field(default_factory=dict)
    """Side files (config.json, ...) that exist but could not be read, with the cause."""
    directory_error: str | None = None
    """Why the path is not a readable directory (a symlink loop, a file, not found), if it is not."""
    weights_present: bool = False
    """A weights file is there: a shard exists (readable or not: a symlink loop, a header that is
    not JSON), or the index itself is unreadable or names shards outside the directory. False for
    a config-only directory, with or without an index whose shards are all absent (a plan before
    the download): only then may the weights be derived from the config."""

    @property
    def has_weights(self) -> bool:
        return bool(self.shard_names)

    @property
    def unreadable_shards(self) -> int:
        """Shards the checkpoint consists of whose headers could not be read (sizes unknown)."""
        return len(self.shard_names) - len(self.shards)

    @property
    def tensor_count(self) -> int:
        return sum(len(shard.tensor_sizes) for shard in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(shard.data_size for shard in self.shards)

    @property
    def file_bytes(self) -> int:
        return sum(shard.file_size for shard in self.shards)

    def bytes_by_dtype(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for shard in self.shards:
            for dtype, size in shard.bytes_by_dtype.items():
                totals[dtype] = totals.get(dtype, 0) + size
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def parameter_count(self) -> int:
        """Stored elements over all tensors (a packed 4-bit ``U8`` weight counts its bytes)."""
        return sum(shard.numel for shard in self.shards)

    def sizes(self) -> Iterator[tuple[str, int]]:
        """``(tensor name, bytes)`` over every shard."""
        for shard in self.shards:
            yield from shard.tensor_sizes.items()


class _ShardProblem(Exception):
    """A shard that cannot be used; the message names the file and the cause."""


def _fail(name: str, text: str) -> _ShardProblem:
    return _ShardProblem(f"{name}: {text}")


def parse_shard(raw: RawShard) -> tuple[ShardHeader | None, list[str]]:
    """Validate one shard's header and size; return the header (if usable) and its problems."""
    try:
        return _parse_shard(raw)
    except _ShardProblem as exc:
        return None, [str(exc)]


def _parse_shard(raw: RawShard) -> tuple[ShardHeader, list[str]]:
    name = raw.name
    if raw.error is not None:
        raise _fail(name, raw.error)
    if raw.file_size is None:
        raise _fail(name, "missing")
    if raw.header_len is None:
        raise _fail(name, f"only {raw.file_size} bytes, too short for a safetensors header "
                          "(truncated download?)")
    if raw.header_len > MAX_HEADER_BYTES:
        raise _fail(name, f"header length {raw.header_len} exceeds the safetensors limit of "
                          f"{MAX_HEADER_BYTES} bytes (not a safetensors file, or corrupt)")
    if 8 + raw.header_len > raw.file_size:
        raise _fail(name, f"header length {raw.header_len} is larger than the file "
                          f"({raw.file_size} bytes): truncated download or not a safetensors file")
    try:
        header = json.loads(raw.header or b"")
    except RecursionError:
        raise _fail(name, "header is JSON nested too deeply (more levels than the decoder allows, "
                          "about 1000); expected an object of tensors") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int of > 4300 digits
        raise _fail(name, f"header is not valid JSON ({str(exc)[:160]})") from None
    if not isinstance(header, dict):
        raise _fail(name, f"header is a JSON {type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise _fail(name, "header __metadata__ is not an object of strings")
    problems: list[str] = []
    data_size = 0
    numel_total = 0
    by_dtype: dict[str, int] = {}
    sizes: dict[str, int] = {}
    bad: list[str] = []
    bits_of = DTYPE_BITS
    for tensor_name, entry in header.items():
        # Fast path, inlined: a 230B checkpoint has ~100k entries.
        try:
            dtype = entry["dtype"]
            shape = entry["shape"]
            begin, end = entry["data_offsets"]
            numel = 1
            for dim in shape:
                if dim.__class__ is not int or dim < 0:
                    raise ValueError
                numel *= dim
            if not (begin.__class__ is int and end.__class__ is int and 0 <= begin <= end
                    and shape.__class__ is list
                    and end - begin == (numel * bits_of[dtype] + 7) // 8):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            bad.append(tensor_name)
            continue
        numel_total += numel
        sizes[tensor_name] = end - begin
        by_dtype[dtype] = by_dtype.get(dtype, 0) + end - begin
        if end > data_size:
            data_size = end
    for tensor_name in bad:
        entry = header[tensor_name]
        if len(problems) >= _MAX_PROBLEMS_PER_SHARD:
            problems.append(f"{name}: {len(bad) - _MAX_PROBLEMS_PER_SHARD} further tensor problems not listed")
            break
        try:
            _tensor_info(entry)
        except ValueError as exc:
            problems.append(f"{name}: tensor {tensor_name!r}: {exc}")
    expected = 8 + raw.header_len + data_size
    if raw.file_size < expected:
        problems.append(
            f"{name}: file is {raw.file_size} bytes but its header describes {expected} "
            f"(8 + {raw.header_len} header + {data_size} data): truncated download, "
            f"{expected - raw.file_size} bytes missing")
    elif raw.file_size > expected:
        problems.append(
            f"{name}: file is {raw.file_size} bytes but its header describes {expected} "
            f"(8 + {raw.header_len} header + {data_size} data): "
            f"{raw.file_size - expected} unexpected trailing bytes")
    shard = ShardHeader(name, raw.file_size, raw.header_len, data_size, sizes,
                        {str(k): str(v) for k, v in metadata.items()}, by_dtype, numel_total, raw.header or b"")
    return shard, problems


def _tensor_info(entry: object) -> TensorInfo:
    """Validate one header entry, raising ValueError that says what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError("entry is not an object with dtype, shape and data_offsets")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {excerpt(dtype)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"shape {excerpt(shape)} is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"data_offsets {excerpt(offsets)} is not [begin, end]")
    info = TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])
    bits = info.numel * DTYPE_BITS[dtype]
    needed = (bits + 7) // 8
    if info.nbytes != needed:
        raise ValueError(f"data_offsets {offsets} hold {info.nbytes} bytes; "
                         f"shape {excerpt(list(shape))} of {dtype} needs {needed}")
    return info


def shard_names_for(index_weight_map: Mapping[str, str] | None, listed: Iterable[str]) -> list[str]:
    """Which files make up the checkpoint: the index's shards when there is an index (vLLM loads
    only those), else every ``*.safetensors`` in the directory."""
    if index_weight_map:
        return sorted(set(index_weight_map.values()))
    return sorted(listed)


def _parse_index(name: str, text: str) -> tuple[dict[str, str], int | None, list[str]]:
    try:
        index = json.loads(text)
    except RecursionError:
        return {}, None, [f"{name}: JSON nested too deeply (more levels than the decoder allows, about 1000)"]
    except ValueError as exc:  # JSONDecodeError, an int of > 4300 digits
        return {}, None, [f"{name}: not valid JSON ({str(exc)[:160]})"]
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        return {}, None, [f"{name}: key 'weight_map' is missing or not an object of tensor -> file"]
    problems = [f"{name}: shard {shard!r} is not a file name in the model directory"
                for shard in sorted(set(weight_map.values()))
                if "/" in shard or "\\" in shard or shard in ("", ".", "..")]
    metadata = index.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        problems.append(f"{name}: key 'metadata' is {excerpt(metadata)}; expected an object (with total_size)")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total <= 0):
        # A string ("539000000000"), a negative or a boolean total is a broken index, never "no total":
        # planning from the config instead would show 1.9 GiB per GPU for a 502 GiB checkpoint.
        shown = json.dumps(total) if isinstance(total, (str, int, float, bool)) else excerpt(total)
        problems.append(f"{name}: key 'metadata.total_size' is {shown[:80]}; expected the checkpoint's "
                        "size in bytes, a whole number > 0")
        total = None
    return dict(weight_map), total, problems


def analyse_directory(raw: RawDirectory) -> ModelFiles:
    """Parse every header read and list every completeness problem, each naming its file."""
    with gc_paused():
        return _analyse_directory(raw)


def _analyse_directory(raw: RawDirectory) -> ModelFiles:
    problems: list[str] = [f"{name}: {error}" for name, error in raw.errors.items()
                           if name not in SIDE_FILES and (name != "." or raw.is_directory)]
    side_errors = {name: error for name, error in raw.errors.items() if name in SIDE_FILES}
    weight_map: dict[str, str] = {}
    index_total: int | None = None
    index_faulty = bool(problems)  # the index (or another weights file) exists and cannot be read
    if raw.index_name is not None and raw.index_text is not None:
        parsed = raw.parsed_index or _parse_index(raw.index_name, raw.index_text)
        weight_map, index_total, index_problems = parsed
        problems += index_problems
        index_faulty = index_faulty or bool(index_problems)
    names = shard_names_for(weight_map, raw.listed_safetensors)
    by_name = {shard.name: shard for shard in raw.shards}
    shards: list[ShardHeader] = []
    for name in names:
        shard_raw = by_name.get(name, RawShard(name, None))
        header, shard_problems = parse_shard(shard_raw)
        if shard_raw.file_size is None and shard_raw.error is None and raw.index_name:
            shard_problems = [f"{name}: missing (named in {raw.index_name})"]
        problems += shard_problems
        if header is not None:
            shards.append(header)
    if weight_map:
        problems += _index_consistency(raw.index_name or INDEX_NAME, weight_map, shards)
    present = index_faulty or any(shard.file_size is not None or shard.error is not None
                                  for shard in raw.shards)
    return ModelFiles(raw.path, dict(raw.side_files), raw.index_name, tuple(names), tuple(shards),
                      tuple(problems), index_total, raw.is_directory, side_errors,
                      None if raw.is_directory else raw.errors.get("."), present)


def _index_consistency(index_name: str, weight_map: Mapping[str, str],
                       shards: Iterable[ShardHeader]) -> list[str]:
    problems = []
    placed: dict[str, list[str]] = {}
    for tensor, shard_name in weight_map.items():
        placed.setdefault(shard_name, []).append(tensor)
    for shard in shards:
        expected = [t for t in placed.get(shard.name, ()) if t not in shard.tensor_sizes]
        if expected:
            problems.append(f"{shard.name}: {len(expected)} tensor(s) that {index_name} places "
                            f"here are not in its header (first: {expected[0]!r})")
    return problems


# ---------------------------------------------------------------- local reading

def read_raw_shard(path: Path) -> RawShard:
    """Read the length prefix and header of one file (at most 8 + header bytes); only a regular
    file is opened, never blocking (a FIFO named like a shard is refused, not waited on)."""
    name = path.name
    try:
        with open_regular_file(path, name) as (fd, size):
            prefix = read_fd(fd, 8)
            if len(prefix) < 8:
                return RawShard(name, size)
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                return RawShard(name, size, header_len)
            return RawShard(name, size, header_len, read_fd(fd, header_len))
    except FileRefused as exc:
        if not os.path.lexists(path):
            return RawShard(name, None)
        return RawShard(name, None, error=exc.reason)
    except OSError as exc:
        return RawShard(name, None, error=os_error_reason(exc))


def _find_index(listing: Iterable[str]) -> str | None:
    names = sorted(n for n in listing if n.endswith(INDEX_SUFFIX))
    if INDEX_NAME in names:
        return INDEX_NAME
    return names[0] if names else None


def read_raw_directory(path: str | os.PathLike[str]) -> RawDirectory:
    """Read a local model directory's side files, index and every shard header."""
    directory = Path(path)
    try:
        mode = os.stat(directory).st_mode
    except OSError as exc:
        return RawDirectory(str(directory), False, errors={".": os_error_reason(exc, "directory")})
    except ValueError:  # a NUL byte in the path
        return RawDirectory(str(directory), False, errors={".": "the path contains a NUL byte"})
    if not stat.S_ISDIR(mode):
        return RawDirectory(str(directory), False, errors={".": describe_kind(mode)})
    try:
        listing = sorted(entry.name for entry in os.scandir(directory))
    except OSError as exc:
        return RawDirectory(str(directory), True, errors={".": os_error_reason(exc)})
    errors: dict[str, str] = {}
    side: dict[str, str | None] = {}
    for name in SIDE_FILES:
        side[name] = None
        if name in listing:
            try:
                side[name] = _read_text(directory / name, name, MAX_SIDE_FILE_BYTES)
            except FileRefused as exc:
                errors[name] = exc.reason
    index_name = _find_index(listing)
    index_text = None
    if index_name is not None:
        try:
            index_text = _read_text(directory / index_name, index_name, MAX_INDEX_BYTES)
        except FileRefused as exc:
            errors[index_name] = exc.reason
    listed = tuple(n for n in listing if n.endswith(".safetensors"))
    parsed = None
    if index_name is not None and index_text is not None:
        with gc_paused():
            parsed = _parse_index(index_name, index_text)
    shards = tuple(read_raw_shard(directory / name)
                   for name in shard_names_for(parsed[0] if parsed else None, listed)
                   if "/" not in name and name not in ("", ".", ".."))
    return RawDirectory(str(directory), True, side, index_name, index_text, listed, shards, errors, parsed)


def _read_text(path: Path, name: str, limit: int) -> str:
    """A side file or index: a regular file of at most ``limit`` bytes, UTF-8, without NUL."""
    return decode_text(read_bytes_bounded(path, limit, name, where=name), name)


def inspect_files(path: str | os.PathLike[str]) -> ModelFiles:
    """Read and analyse a local model directory (headers only)."""
    return analyse_directory(read_raw_directory(path))


# ---------------------------------------------------------------- remote reading

_REMOTE_SCRIPT = r'''
import base64, errno, json, os, stat, struct, sys, zlib
MAX_HEADER = MAX_HEADER_BYTES_VALUE
MAX_SIDE = MAX_SIDE_FILE_BYTES_VALUE
MAX_INDEX = MAX_INDEX_BYTES_VALUE
SIDE = SIDE_FILES_VALUE
path = sys.argv[1]
def rchar():
    try:
        with open("/proc/self/io") as handle:
            for line in handle:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
rchar_start = rchar()
out = {"path": path, "is_directory": False, "side": {}, "errors": {},
       "index_name": None, "index_text": None, "listed": [], "shards": []}
# The same rules, and the same words, as pytest_gpuready.files on the local side.
KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
class Refused(Exception):
    pass
def kind(mode):
    for test, text in KINDS:
        if test(mode):
            return text
    return "neither a file nor a directory"
def err(exc, what="file"):
    code = getattr(exc, "errno", None)
    if code == errno.ENOENT:
        return what + " not found"
    if code == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if code == errno.ENAMETOOLONG:
        return "the path is too long for this system"
    if code == errno.ENOTDIR:
        return "a part of the path is not a directory"
    return "cannot be read: " + (getattr(exc, "strerror", None) or str(exc))
def size_text(size):
    return "%.1f MiB" % (size / 1048576.0) if size >= 1048576 else "%d bytes" % size
def open_regular(name, limit=None):
    # a FIFO or device is refused before it is opened; the open cannot block either way
    full = os.path.join(path, name)
    status = os.stat(full)
    if not stat.S_ISREG(status.st_mode):
        raise Refused(kind(status.st_mode) + "; expected a regular file")
    if limit is not None and status.st_size > limit:
        shown, cap = size_text(status.st_size), size_text(limit)
        if shown == cap:
            shown, cap = "%d bytes" % status.st_size, "%d bytes" % limit
        raise Refused("%s, over the limit of %s for a %s" % (shown, cap, name))
    fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise Refused(kind(opened.st_mode) + "; expected a regular file")
    return os.fdopen(fd, "rb"), opened.st_size
def text(name, limit):
    try:
        handle, _ = open_regular(name, limit)
        with handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise Refused("over the limit of %s for a %s (it grew while read)" % (size_text(limit), name))
        at = data.find(b"\0")
        if at >= 0:
            raise Refused("contains a NUL byte (line %d, byte offset %d); expected text"
                          % (data.count(b"\n", 0, at) + 1, at))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Refused("not UTF-8 text (byte 0x%02x at line %d, byte offset %d)"
                          % (data[exc.start], data.count(b"\n", 0, exc.start) + 1, exc.start))
    except Refused as exc:
        out["errors"][name] = str(exc)
    except OSError as exc:
        out["errors"][name] = err(exc)
    return None
def shard(name):
    entry = {"name": name, "size": None, "header_len": None, "header": None, "error": None}
    try:
        handle, entry["size"] = open_regular(name)
        with handle:
            prefix = handle.read(8)
            if len(prefix) == 8:
                (length,) = struct.unpack("<Q", prefix)
                entry["header_len"] = length
                if length <= MAX_HEADER and 8 + length <= entry["size"]:
                    raw = handle.read(length)
                    try:
                        entry["header"] = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        entry["header"] = raw.decode("latin-1")
                        entry["latin1"] = True
    except Refused as exc:
        entry["error"] = str(exc)
    except OSError as exc:
        if exc.errno != errno.ENOENT or os.path.lexists(os.path.join(path, name)):
            entry["error"] = err(exc)
    return entry
try:
    mode = os.stat(path).st_mode
    out["is_directory"] = stat.S_ISDIR(mode)
    if not out["is_directory"]:
        out["errors"]["."] = kind(mode)
except OSError as exc:
    out["errors"]["."] = err(exc, "directory")
if out["is_directory"]:
    try:
        listing = sorted(os.listdir(path))
    except OSError as exc:
        listing = []
        out["errors"]["."] = err(exc)
    for name in SIDE:
        out["side"][name] = text(name, MAX_SIDE) if name in listing else None
    indexes = sorted(n for n in listing if n.endswith(".safetensors.index.json"))
    if "model.safetensors.index.json" in indexes:
        out["index_name"] = "model.safetensors.index.json"
    elif indexes:
        out["index_name"] = indexes[0]
    if out["index_name"]:
        out["index_text"] = text(out["index_name"], MAX_INDEX)
    out["listed"] = [n for n in listing if n.endswith(".safetensors")]
    names = out["listed"]
    try:
        weight_map = json.loads(out["index_text"] or "null")["weight_map"]
        names = sorted(set(v for v in weight_map.values() if isinstance(v, str)))
    except Exception:  # RecursionError and ValueError included: the local side names the problem
        pass
    out["shards"] = [shard(n) for n in names if "/" not in n and n not in ("", ".", "..")]
rchar_end = rchar()
if rchar_start is not None and rchar_end is not None:
    out["read_bytes"] = rchar_end - rchar_start
data = json.dumps(out).encode("utf-8")
sys.stdout.write("MARKER" + base64.b64encode(zlib.compress(data, 1)).decode("ascii") + "\n")
'''


def remote_script() -> str:
    """The python3 source that reads a model directory's headers and prints one encoded line."""
    return (_REMOTE_SCRIPT
            .replace("MAX_HEADER_BYTES_VALUE", str(MAX_HEADER_BYTES))
            .replace("MAX_SIDE_FILE_BYTES_VALUE", str(MAX_SIDE_FILE_BYTES))
            .replace("MAX_INDEX_BYTES_VALUE", str(MAX_INDEX_BYTES))
            .replace("SIDE_FILES_VALUE", repr(SIDE_FILES))
            .replace("MARKER", _REMOTE_MARKER))


def remote_command(path: str, python: str = "python3") -> str:
    """The sh command line: the script comes on stdin, the path as a quoted argument."""
    return f"{shlex.quote(python)} - {shlex.quote(path)}"


def decode_remote_output(host_name: str, stdout: str) -> RawDirectory:
    """Decode the remote script's line into a :class:`RawDirectory`; anything else is a ProbeError."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(_REMOTE_MARKER)), None)
    if line is None:
        shown = stdout.strip()[:120] or "nothing"
        raise ProbeError(f"{host_name}: the model-directory reader printed {shown!r}, not its report")
    try:
        with gc_paused():
            payload = json.loads(zlib.decompress(base64.b64decode(line[len(_REMOTE_MARKER):])))
    except (ValueError, zlib.error) as exc:
        raise ProbeError(f"{host_name}: the model-directory report is garbled ({exc})") from None
    try:
        shards = tuple(
            RawShard(
                entry["name"], entry["size"], entry["header_len"],
                None if entry["header"] is None
                else entry["header"].encode("latin-1" if entry.get("latin1") else "utf-8"),
                entry["error"])
            for entry in payload["shards"])
        return RawDirectory(
            payload["path"], payload["is_directory"], payload["side"], payload["index_name"],
            payload["index_text"], tuple(payload["listed"]), shards, payload["errors"],
            reader_bytes_read=payload.get("read_bytes"))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ProbeError(f"{host_name}: the model-directory report lacks {exc}") from None


def read_raw_directory_remote(host: Host, path: str, python: str = "python3",
                              timeout: float = 120.0) -> RawDirectory:
    """Read a model directory on ``host`` in one round trip (headers only)."""
    result = host.run(remote_command(path, python), timeout=timeout,
                      stdin=remote_script().encode("utf-8"))
    if result.returncode == 127:
        raise HostError(f"{host.name}: {python} is not on PATH; it is needed to read model files there")
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"{host.name}: reading {path} failed (exit {result.returncode}): {tail}")
    raw = decode_remote_output(host.name, result.stdout)
    return replace(raw, report_bytes=len(result.stdout))


def inspect_files_remote(host: Host, path: str, python: str = "python3") -> ModelFiles:
    """Read and analyse a model directory on ``host`` (headers only, one round trip)."""
    return analyse_directory(read_raw_directory_remote(host, path, python))
