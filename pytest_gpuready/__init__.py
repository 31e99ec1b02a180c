"""pytest-gpuready: hardware preflight checks for deploying LLMs with vLLM on multi-GPU servers.

The public API is re-exported here; the pytest plugin itself lives in :mod:`pytest_gpuready.plugin`.

PYTEST_DONT_REWRITE: this package asserts nothing through ``assert`` for pytest to rewrite, and an
already-imported package (a ``pytester`` run inside a test session) must not warn that it cannot be.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real imports, for type checkers; at run time names load on first use
    from pytest_gpuready.errors import (
        ConfigError,
        GpuReadyError,
        GpuReadyWarning,
        HostError,
        HostSpecError,
        NoGpuError,
        ProbeError,
    )
    from pytest_gpuready.host.checks import check_gpus_clean, check_shm_clean, check_topology
    from pytest_gpuready.host.hosts import CommandResult, Host, HostSpec, LocalHost, SSHHost, connect, parse_host_spec
    from pytest_gpuready.host.probe import snapshot
    from pytest_gpuready.host.snapshot import (
        GpuInfo,
        GpuLink,
        GpuProcess,
        HostSnapshot,
        ShmEntry,
        ShmStatus,
        Topology,
    )
    from pytest_gpuready.model.checks import (
        check_fp8_block_alignment,
        check_memory_fit,
        check_mla_kv_backend,
        check_tp_divisibility,
        effective_kv_cache_dtype,
        kv_cache_bytes_per_token,
    )
    from pytest_gpuready.model.deploy_config import DeployConfig, Deployment, Throughput, load_deploy_config
    from pytest_gpuready.model.rules import DeploymentCheck, check_deployment
    from pytest_gpuready.model.serve_args import Layout, ServeArgs
    from pytest_gpuready.model.spec import ModelSpec, inspect_model, model_spec_from_config
    from pytest_gpuready.model.vllm_version import parse_vllm_version
    from pytest_gpuready.plugin.outcomes import checked, expect
    from pytest_gpuready.plugin.server_fixtures import BenchmarkServing, ServerFactory, ServingBenchmark
    from pytest_gpuready.serve.bench import BenchResult, run_benchmark
    from pytest_gpuready.serve.footprint import Footprint
    from pytest_gpuready.serve.readiness import ReadyInfo
    from pytest_gpuready.serve.server import VLLMServer
    from pytest_gpuready.serve.server_errors import (
        EngineDeadError,
        ServerDiedError,
        ServerError,
        ServerExitedError,
        ServerMismatchError,
        ServerStartTimeout,
    )
    from pytest_gpuready.serve.spec import ServeSpec, build_argv, build_env, spec_from_deployment
    from pytest_gpuready.serve.teardown import TeardownError, TeardownReport
    from pytest_gpuready.verdict import Verdict

_EXPORTS: dict[str, str] = {
    "BenchResult": "pytest_gpuready.serve.bench",
    "BenchmarkServing": "pytest_gpuready.plugin.server_fixtures",
    "CommandResult": "pytest_gpuready.host.hosts",
    "ConfigError": "pytest_gpuready.errors",
    "DeployConfig": "pytest_gpuready.model.deploy_config",
    "DeploymentCheck": "pytest_gpuready.model.rules",
    "Layout": "pytest_gpuready.model.serve_args",
    "ServeArgs": "pytest_gpuready.model.serve_args",
    "check_deployment": "pytest_gpuready.model.rules",
    "Deployment": "pytest_gpuready.model.deploy_config",
    "EngineDeadError": "pytest_gpuready.serve.server_errors",
    "Footprint": "pytest_gpuready.serve.footprint",
    "GpuInfo": "pytest_gpuready.host.snapshot",
    "GpuLink": "pytest_gpuready.host.snapshot",
    "GpuProcess": "pytest_gpuready.host.snapshot",
    "GpuReadyError": "pytest_gpuready.errors",
    "GpuReadyWarning": "pytest_gpuready.errors",
    "Host": "pytest_gpuready.host.hosts",
    "HostError": "pytest_gpuready.errors",
    "HostSnapshot": "pytest_gpuready.host.snapshot",
    "HostSpec": "pytest_gpuready.host.hosts",
    "HostSpecError": "pytest_gpuready.errors",
    "LocalHost": "pytest_gpuready.host.hosts",
    "ModelSpec": "pytest_gpuready.model.spec",
    "NoGpuError": "pytest_gpuready.errors",
    "ProbeError": "pytest_gpuready.errors",
    "ReadyInfo": "pytest_gpuready.serve.readiness",
    "SSHHost": "pytest_gpuready.host.hosts",
    "ServeSpec": "pytest_gpuready.serve.spec",
    "ServerError": "pytest_gpuready.serve.server_errors",
    "ServerDiedError": "pytest_gpuready.serve.server_errors",
    "ServerExitedError": "pytest_gpuready.serve.server_errors",
    "ServerFactory": "pytest_gpuready.plugin.server_fixtures",
    "ServerMismatchError": "pytest_gpuready.serve.server_errors",
    "ServerStartTimeout": "pytest_gpuready.serve.server_errors",
    "ServingBenchmark": "pytest_gpuready.plugin.server_fixtures",
    "ShmEntry": "pytest_gpuready.host.snapshot",
    "ShmStatus": "pytest_gpuready.host.snapshot",
    "TeardownError": "pytest_gpuready.serve.teardown",
    "TeardownReport": "pytest_gpuready.serve.teardown",
    "Throughput": "pytest_gpuready.model.deploy_config",
    "Topology": "pytest_gpuready.host.snapshot",
    "VLLMServer": "pytest_gpuready.serve.server",
    "Verdict": "pytest_gpuready.verdict",
    "build_argv": "pytest_gpuready.serve.spec",
    "build_env": "pytest_gpuready.serve.spec",
    "check_fp8_block_alignment": "pytest_gpuready.model.checks",
    "check_gpus_clean": "pytest_gpuready.host.checks",
    "check_memory_fit": "pytest_gpuready.model.checks",
    "check_mla_kv_backend": "pytest_gpuready.model.checks",
    "check_shm_clean": "pytest_gpuready.host.checks",
    "check_topology": "pytest_gpuready.host.checks",
    "check_tp_divisibility": "pytest_gpuready.model.checks",
    "checked": "pytest_gpuready.plugin.outcomes",
    "connect": "pytest_gpuready.host.hosts",
    "effective_kv_cache_dtype": "pytest_gpuready.model.checks",
    "expect": "pytest_gpuready.plugin.outcomes",
    "inspect_model": "pytest_gpuready.model.spec",
    "kv_cache_bytes_per_token": "pytest_gpuready.model.checks",
    "load_deploy_config": "pytest_gpuready.model.deploy_config",
    "model_spec_from_config": "pytest_gpuready.model.spec",
    "parse_host_spec": "pytest_gpuready.host.hosts",
    "parse_vllm_version": "pytest_gpuready.model.vllm_version",
    "run_benchmark": "pytest_gpuready.serve.bench",
    "snapshot": "pytest_gpuready.host.probe",
    "spec_from_deployment": "pytest_gpuready.serve.spec",
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


__version__ = "0.2.0"  # the one home of the version: pyproject.toml reads it (CHANGELOG.md)

__all__ = [
    "BenchResult",
    "BenchmarkServing",
    "CommandResult",
    "ConfigError",
    "DeployConfig",
    "Deployment",
    "DeploymentCheck",
    "EngineDeadError",
    "Footprint",
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
    "Layout",
    "LocalHost",
    "ModelSpec",
    "NoGpuError",
    "ProbeError",
    "ReadyInfo",
    "SSHHost",
    "ServeArgs",
    "ServeSpec",
    "ServerDiedError",
    "ServerError",
    "ServerExitedError",
    "ServerFactory",
    "ServerMismatchError",
    "ServerStartTimeout",
    "ServingBenchmark",
    "ShmEntry",
    "ShmStatus",
    "TeardownError",
    "TeardownReport",
    "Throughput",
    "Topology",
    "VLLMServer",
    "Verdict",
    "__version__",
    "build_argv",
    "build_env",
    "check_deployment",
    "check_fp8_block_alignment",
    "check_gpus_clean",
    "check_memory_fit",
    "check_mla_kv_backend",
    "check_shm_clean",
    "check_topology",
    "check_tp_divisibility",
    "checked",
    "connect",
    "effective_kv_cache_dtype",
    "expect",
    "inspect_model",
    "kv_cache_bytes_per_token",
    "load_deploy_config",
    "model_spec_from_config",
    "parse_host_spec",
    "parse_vllm_version",
    "run_benchmark",
    "snapshot",
    "spec_from_deployment",
]
