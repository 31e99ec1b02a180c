"""pytest-gpuready: hardware preflight checks for deploying LLMs with vLLM on multi-GPU servers.

The public API is re-exported here; the pytest plugin itself lives in :mod:`pytest_gpuready.plugin`.
"""

from __future__ import annotations

from pytest_gpuready.errors import ConfigError, GpuReadyError, HostError, HostSpecError, NoGpuError, ProbeError
from pytest_gpuready.hosts import CommandResult, Host, HostSpec, LocalHost, SSHHost, connect, parse_host_spec
from pytest_gpuready.verdict import Verdict

__version__ = "0.1.0"

__all__ = [
    "CommandResult",
    "ConfigError",
    "GpuReadyError",
    "Host",
    "HostError",
    "HostSpec",
    "HostSpecError",
    "LocalHost",
    "NoGpuError",
    "ProbeError",
    "SSHHost",
    "Verdict",
    "__version__",
    "connect",
    "parse_host_spec",
]
