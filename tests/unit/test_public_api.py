"""The public API the issues promise is importable from the package root, with the promised defaults."""

from __future__ import annotations

import inspect

import pytest_gpuready


def test_promised_names_are_exported() -> None:
    promised = {
        "connect", "Host", "HostSnapshot", "GpuInfo", "GpuProcess", "ShmEntry", "Verdict",
        "check_gpus_clean", "check_shm_clean", "inspect_model", "ModelSpec", "check_fp8_block_alignment",
        "check_tp_divisibility", "check_mla_kv_backend", "kv_cache_bytes_per_token", "check_memory_fit",
        "check_topology",
    }
    assert promised <= set(pytest_gpuready.__all__)
    for name in pytest_gpuready.__all__:
        assert hasattr(pytest_gpuready, name), name


def test_check_gpus_clean_defaults() -> None:
    parameters = inspect.signature(pytest_gpuready.check_gpus_clean).parameters
    assert parameters["gpus"].default is None
    assert parameters["max_used_mib"].default == 64


def test_verdict_fields() -> None:
    verdict = pytest_gpuready.Verdict.failed("2 of 8 GPUs are not clean", details=("GPU 0: 1 MiB",),
                                             evidence={"gpus": [0]})
    assert not verdict
    assert (verdict.ok, verdict.summary, dict(verdict.evidence)) == (False, "2 of 8 GPUs are not clean", {"gpus": [0]})
    assert verdict.message == "2 of 8 GPUs are not clean\n  GPU 0: 1 MiB"


def test_every_lazy_export_is_in_all() -> None:
    assert set(pytest_gpuready._EXPORTS) == set(pytest_gpuready.__all__) - {"__version__"}
