"""Fuzz tests (hypothesis) over the parsers of input the plugin does not control: nvidia-smi CSV rows
and deploy files. Any input gives a parsed value or the documented error, never another exception;
and a row built from known values parses back to those values, wherever the free text puts commas.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gpuready import ConfigError, ProbeError, load_deploy_config
from pytest_gpuready.host.gpus import (
    QUERY_APPS_FIELDS,
    QUERY_GPU_FIELDS,
    parse_query_compute_apps,
    parse_query_gpu,
)
from pytest_gpuready.host.snapshot import GpuInfo

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UUID = "GPU-f2fae499-8acc-9d1b-c9d7-1eddd5be03b4"
GPU = GpuInfo(0, UUID, "NVIDIA H200", "00000000:00:06.0", 0, 143771)

# What nvidia-smi can put in a free-text cell: printable text, commas and ", " included; no line breaks.
free_text = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40) \
    .map(str.strip).filter(lambda t: t and t not in ("N/A",) and not (t.startswith("[") and t.endswith("]")))
mib = st.integers(min_value=0, max_value=10**7)


@FUZZ
@given(st.text(max_size=400))
def test_any_query_gpu_text_parses_or_is_a_probe_error(text: str) -> None:
    with contextlib.suppress(ProbeError):
        parse_query_gpu(text, QUERY_GPU_FIELDS, "fuzz")


@FUZZ
@given(st.text(max_size=400))
def test_any_compute_apps_text_parses_or_is_a_probe_error(text: str) -> None:
    with contextlib.suppress(ProbeError):
        parse_query_compute_apps(text, [GPU], QUERY_APPS_FIELDS, "fuzz")


@FUZZ
@given(st.lists(st.sampled_from([*QUERY_GPU_FIELDS, "1", "[N/A]", ", ", ",", " ", "x", UUID, "\n"]),
                max_size=40))
def test_row_like_noise_parses_or_is_a_probe_error(tokens: list[str]) -> None:
    text = ", ".join(tokens)
    with contextlib.suppress(ProbeError):
        parse_query_gpu(text, QUERY_GPU_FIELDS, "fuzz")


@FUZZ
@given(index=st.integers(0, 15), name=free_text, used=mib, total=mib, reserved=mib)
def test_gpu_row_round_trips_whatever_the_name(index: int, name: str, used: int, total: int, reserved: int) -> None:
    row = f"{index}, {UUID}, {name}, 00000000:00:06.0, {used}, {total}, {reserved}, 121.88, 9.0, 580.159.04"
    (gpu,) = parse_query_gpu(row, QUERY_GPU_FIELDS, "fuzz")
    assert (gpu.index, gpu.name, gpu.memory_used_mib, gpu.memory_total_mib, gpu.memory_reserved_mib) == \
        (index, name, used, total, reserved)
    assert gpu.driver_version == "580.159.04"


@FUZZ
@given(pid=st.integers(1, 2**22), name=free_text, used=mib)
def test_process_row_round_trips_whatever_the_name(pid: int, name: str, used: int) -> None:
    (process,) = parse_query_compute_apps(f"{pid}, {name}, {used}, {UUID}", [GPU], QUERY_APPS_FIELDS, "fuzz")
    assert (process.pid, process.name, process.used_memory_mib, process.gpu_index) == (pid, name, used, 0)


# ---------------------------------------------------------------- deploy files

_DIR = Path(tempfile.mkdtemp(prefix="gpuready-fuzz-"))


def _load(data: bytes) -> None:
    path = _DIR / f"deploy-{os.getpid()}.yaml"
    path.write_bytes(data)
    try:
        load_deploy_config(path)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        assert len(message) < 1200
        assert message.startswith(str(path))


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes_load_or_are_a_config_error(data: bytes) -> None:
    _load(data)


yaml_tokens = st.sampled_from([
    "deployments:", "defaults:", "- ", "  ", "    ", "\n", "name: a", "model: m", "tp: 2", "tp: *x", "&x ",
    "*x", "[", "]", "{", "}", ", ", ": ", "? ", "<<: *x", "gpus: [0, 1]", "serve:", "expect:", "\t", "'", '"',
    "!!python/object:os.system", "!!binary", "1e999", "0x1F", "~", "null", "yes", "2001-12-14", "\\0", "%YAML 1.1",
    "---", "...", "#", "|", ">", "-1", "kv_cache_dtype: fp8", "vllm_version: '0.17.0'",
])


@FUZZ
@given(st.lists(yaml_tokens, max_size=60))
def test_yaml_like_noise_loads_or_is_a_config_error(tokens: list[str]) -> None:
    _load("".join(tokens).encode())


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=30,
)
deployment = st.fixed_dictionaries({"name": st.text(max_size=12) | st.just("tiny")},
                                   optional={k: json_like for k in ("model", "tp", "gpus", "ep", "serve", "expect",
                                                                     "kv_cache_dtype", "gpu_arch", "vllm_version")})


@FUZZ
@given(st.dictionaries(st.sampled_from(["deployments", "defaults", "other"]),
                       st.lists(deployment, max_size=3) | json_like, max_size=3))
def test_structured_documents_load_or_are_a_config_error(document: dict[str, object]) -> None:
    _load(yaml.safe_dump(document).encode())


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> object:
    yield None
    for path in _DIR.iterdir():
        path.unlink()
    _DIR.rmdir()
