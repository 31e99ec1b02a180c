"""pytest-gpuready: hardware preflight checks for deploying LLMs with vLLM on multi-GPU servers.

The public API is re-exported here; the pytest plugin itself lives in :mod:`pytest_gpuready.plugin`.

PYTEST_DONT_REWRITE: this package asserts nothing through ``assert`` for pytest to rewrite, and an
already-imported package (a ``pytester`` run inside a test session) must not warn that it cannot be.
"""

from __future__ import annotations

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
