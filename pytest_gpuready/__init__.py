"""pytest-gpuready: hardware preflight checks for deploying LLMs with vLLM on multi-GPU servers.

The public API is re-exported here; the pytest plugin itself lives in :mod:`pytest_gpuready.plugin`.

PYTEST_DONT_REWRITE: this package asserts nothing through ``assert`` for pytest to rewrite, and an
already-imported package (a ``pytester`` run inside a test session) must not warn that it cannot be.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real imports, for type checkers; at run time names load on first use
    from pytest_gpuready.bench import BenchResult, run_benchmark
    from pytest_gpuready.deploy_config import DeployConfig, Deployment, load_deploy_config
    from pytest_gpuready.errors import (
        ConfigError,
        GpuReadyError,
        GpuReadyWarning,
        HostError,
        HostSpecError,
        NoGpuError,
        ProbeError,
    )
    from pytest_gpuready.hosts import CommandResult, Host, HostSpec, LocalHost, SSHHost, connect, parse_host_spec
    from pytest_gpuready.invariants import check_gpus_clean, check_shm_clean, check_topology
    from pytest_gpuready.model_invariants import (
        check_fp8_block_alignment,
        check_memory_fit,
        check_mla_kv_backend,
        check_tp_divisibility,
        kv_cache_bytes_per_token,
    )
    from pytest_gpuready.models import ModelSpec, inspect_model, model_spec_from_config
    from pytest_gpuready.probe import snapshot
    from pytest_gpuready.serve_spec import ServeSpec
    from pytest_gpuready.server import VLLMServer
    from pytest_gpuready.snapshot import GpuInfo, GpuLink, GpuProcess, HostSnapshot, ShmEntry, ShmStatus, Topology
    from pytest_gpuready.verdict import Verdict
    from pytest_gpuready.vllm_version import parse_vllm_version

_EXPORTS: dict[str, str] = {
    "BenchResult": "pytest_gpuready.bench",
    "CommandResult": "pytest_gpuready.hosts",
    "ConfigError": "pytest_gpuready.errors",
    "DeployConfig": "pytest_gpuready.deploy_config",
    "Deployment": "pytest_gpuready.deploy_config",
    "GpuInfo": "pytest_gpuready.snapshot",
    "GpuLink": "pytest_gpuready.snapshot",
    "GpuProcess": "pytest_gpuready.snapshot",
    "GpuReadyError": "pytest_gpuready.errors",
    "GpuReadyWarning": "pytest_gpuready.errors",
    "Host": "pytest_gpuready.hosts",
    "HostError": "pytest_gpuready.errors",
    "HostSnapshot": "pytest_gpuready.snapshot",
    "HostSpec": "pytest_gpuready.hosts",
    "HostSpecError": "pytest_gpuready.errors",
    "LocalHost": "pytest_gpuready.hosts",
    "ModelSpec": "pytest_gpuready.models",
    "NoGpuError": "pytest_gpuready.errors",
    "ProbeError": "pytest_gpuready.errors",
    "SSHHost": "pytest_gpuready.hosts",
    "ServeSpec": "pytest_gpuready.serve_spec",
    "ShmEntry": "pytest_gpuready.snapshot",
    "ShmStatus": "pytest_gpuready.snapshot",
    "Topology": "pytest_gpuready.snapshot",
    "VLLMServer": "pytest_gpuready.server",
    "Verdict": "pytest_gpuready.verdict",
    "check_fp8_block_alignment": "pytest_gpuready.model_invariants",
    "check_gpus_clean": "pytest_gpuready.invariants",
    "check_memory_fit": "pytest_gpuready.model_invariants",
    "check_mla_kv_backend": "pytest_gpuready.model_invariants",
    "check_shm_clean": "pytest_gpuready.invariants",
    "check_topology": "pytest_gpuready.invariants",
    "check_tp_divisibility": "pytest_gpuready.model_invariants",
    "connect": "pytest_gpuready.hosts",
    "inspect_model": "pytest_gpuready.models",
    "kv_cache_bytes_per_token": "pytest_gpuready.model_invariants",
    "load_deploy_config": "pytest_gpuready.deploy_config",
    "model_spec_from_config": "pytest_gpuready.models",
    "parse_host_spec": "pytest_gpuready.hosts",
    "parse_vllm_version": "pytest_gpuready.vllm_version",
    "run_benchmark": "pytest_gpuready.bench",
    "snapshot": "pytest_gpuready.probe",
}
"""Public name -> module. Imported lazily (PEP 562): pytest loads this package for every run of
every suite where the plugin is installed, and the launch and benchmark modules bring requests
with them, which is most of the plugin's import time."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_gpuready' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "BenchResult",
    "CommandResult",
    "ConfigError",
    "DeployConfig",
    "Deployment",
    "GpuInfo",
    "GpuLink",
    "GpuProcess",
    "GpuReadyError",
    "GpuReadyWarning",
    "Host",
    "HostError",
    "HostSnapshot",
    "HostSpec",
    "HostSpecError",
    "LocalHost",
    "ModelSpec",
    "NoGpuError",
    "ProbeError",
    "SSHHost",
    "ServeSpec",
    "ShmEntry",
    "ShmStatus",
    "Topology",
    "VLLMServer",
    "Verdict",
    "__version__",
    "check_fp8_block_alignment",
    "check_gpus_clean",
    "check_memory_fit",
    "check_mla_kv_backend",
    "check_shm_clean",
    "check_topology",
    "check_tp_divisibility",
    "connect",
    "inspect_model",
    "kv_cache_bytes_per_token",
    "load_deploy_config",
    "model_spec_from_config",
    "parse_host_spec",
    "parse_vllm_version",
    "run_benchmark",
    "snapshot",
]
