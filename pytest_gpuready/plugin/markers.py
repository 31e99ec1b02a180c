"""Every marker of the plugin, declared once as a Python signature that ``--markers`` and the checks derive from.

Each marker is a function decorated with :func:`marker`; it is never called. Its parameters are
the marker's arguments (a ``*`` makes those after it keyword-only), its defaults say what an
argument left out means, and the first paragraph of its docstring is the marker's line in
``pytest --markers``. :meth:`Marker.arguments` checks a ``pytest.Mark`` against the signature
before a fixture reads it, so an unknown or repeated argument fails the test saying what is
expected. A ``None`` default means "what the option or the deployment says" (the docstring
says which); the fixtures apply those, never this module.

To add a marker: one decorated function here, in the tuple of the plugin module that applies it;
``tests/unit/test_options_registry.py`` keeps the README's and the docs' signatures equal to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Marker:
    """One marker: its name, its signature and what it does."""

    name: str
    signature: inspect.Signature
    description: str
    host_bound: bool
    """Whether the marker reads the test's host (so the test runs once per host of a fleet)."""

    @property
    def signature_text(self) -> str:
        """``name(tp, ep=False, *, vllm_version=None)``, defaults as Python writes them (double quotes)."""
        if not self.signature.parameters:
            return self.name
        parts: list[str] = []
        keyword_only = False
        for parameter in self.signature.parameters.values():
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only:
                parts.append("*")
                keyword_only = True
            if parameter.default is inspect.Parameter.empty:
                parts.append(parameter.name)
            else:
                default = parameter.default
                shown = f'"{default}"' if isinstance(default, str) else repr(default)
                parts.append(f"{parameter.name}={shown}")
        return f"{self.name}({', '.join(parts)})"

    @property
    def line(self) -> str:
        """The marker's line for the ``markers`` ini value (what ``pytest --markers`` shows)."""
        return f"{self.signature_text}: {self.description}"

    @property
    def positional(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.signature.parameters.values()
                     if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(self.signature.parameters)

    def arguments(self, mark: pytest.Mark) -> dict[str, Any]:
        """The arguments given, by name (no defaults filled in); a mismatch with the signature fails the test."""
        __tracebackhide__ = True
        allowed = self.parameters
        positional = self.positional
        if not positional:
            unknown = sorted(set(mark.kwargs) - set(allowed))
            if mark.args or unknown:
                given = unknown or [repr(a) for a in mark.args]
                pytest.fail(f"@pytest.mark.{self.name}: unexpected argument {', '.join(given)}; "
                            f"expected keyword arguments {', '.join(a + '=' for a in allowed)}", pytrace=False)
            return dict(mark.kwargs)
        if len(mark.args) > len(positional):
            pytest.fail(f"@pytest.mark.{self.name}: too many positional arguments {mark.args!r}; "
                        f"expected ({', '.join(allowed)})", pytrace=False)
        kwargs = dict(zip(positional, mark.args, strict=False))
        for key, value in mark.kwargs.items():
            if key not in allowed:
                pytest.fail(f"@pytest.mark.{self.name}: unexpected argument {key}=; expected "
                            f"{', '.join(allowed)}", pytrace=False)
            if key in kwargs:
                pytest.fail(f"@pytest.mark.{self.name}: {key} given twice", pytrace=False)
            kwargs[key] = value
        return kwargs


def marker(*, host_bound: bool = True) -> Callable[[Callable[..., None]], Marker]:
    """Declare the decorated function's name, signature and docstring as a marker."""
    def declare(function: Callable[..., None]) -> Marker:
        doc = inspect.getdoc(function) or ""
        first = " ".join(doc.split("\n\n", 1)[0].split())
        return Marker(function.__name__, inspect.signature(function), first, host_bound)
    return declare


# ---------------------------------------------------------------- host markers (host_fixtures)

@marker(host_bound=False)
def gpuready() -> None:
    """a GPU-readiness preflight check (select the whole preflight with -m gpuready)"""


@marker()
def gpus_clean(*, gpus: Sequence[int] | None = None, max_used_mib: int | None = None) -> None:
    """fail before the test runs unless the GPUs (by index; None: --gpu-ids, else all) hold no compute process and at
    most max_used_mib MiB (None: --gpu-max-used-mib, default 64)"""


@marker()
def shm_clean(*, min_free_mib: int | None = None) -> None:
    """fail before the test runs if /dev/shm holds vLLM/NCCL/multiprocessing leftovers (psm_*, sem.mp-*, sem.loky-*,
    nccl-*, *vllm*) or has less than min_free_mib MiB free (None: --shm-min-free-mib, default 1024)"""


# ---------------------------------------------------------------- health markers (health_fixtures)

@marker()
def gpu_health(*, tp: int = 1, pp: int = 1, dp: int = 1, gpus: Sequence[int] | None = None) -> None:
    """fail before the test runs unless the GPUs (by index; None: --gpu-ids, else all) are healthy for that layout:
    driver CUDA vs the build, GPUs alive and visible, /dev/shm size, memory health, fabric, MIG / compute
    mode / persistence, clock slowdown, P2P (docs/checks/gpu_health.md)"""


# ---------------------------------------------------------------- two-GPU markers (two_gpu_fixtures)

@marker(host_bound=False)
def gpu_p2p(*, tp: int = 2, gpus: Sequence[int] | None = None, timeout: float = 60) -> None:
    """fail before the test runs unless a CUDA IPC peer read and write works for every pair of the TP group
    (two processes per pair, hard timeout; docs/checks/two_gpu.md)"""


@marker(host_bound=False)
def nccl_allreduce(*, tp: int = 2, gpus: Sequence[int] | None = None, size_mb: int = 256, timeout: float = 120,
                   min_busbw_gbps: float | None = None) -> None:
    """fail before the test runs unless an NCCL all-reduce over the TP group finishes, sums right and reaches
    the bus bandwidth of its fabric (NVLink 150, PCIe 15 GB/s; docs/checks/two_gpu.md)"""


# ---------------------------------------------------------------- model markers (model_fixtures)

@marker()
def model(path: str) -> None:
    """the model directory model_spec reads for this test (relative to the test file; read on --gpu-host
    when it is not on this machine)"""


@marker()
def deployment(name: str) -> None:
    """the deploy-file deployment this test uses (fixture deployment); every vLLM load rule for its serve
    arguments (those of the preflight's test_vllm_load_rules, max_model_len included) must pass before the test runs"""


@marker()
def fp8_block_alignment(tp: int, ep: bool = False, *, vllm_version: str | None = None,
                        gpu_arch: str | None = None) -> None:
    """fail before the test runs unless the model's FP8 weight blocks divide evenly at this tensor-parallel size
    (routed experts whole with ep=True); re-gridded MoE blocks (vLLM >= 0.29) also need the GPU's
    architecture (None: --vllm-version, --gpu-arch, else the GPU host's)"""


@marker()
def mla_kv_backend_supported(kv_cache_dtype: str = "auto", *, gpu_arch: str | None = None,
                             vllm_version: str | None = None) -> None:
    """fail before the test runs unless vLLM has an MLA attention backend for the model on this GPU with this
    KV-cache dtype (None: --gpu-arch, --vllm-version, else the GPU host's)"""


@marker()
def memory_fit(tp: int, *, gpus: Sequence[int] | None = None, gpu_memory_utilization: float = 0.9,
               max_model_len: int | None = None, max_num_seqs: int | None = None, kv_cache_dtype: str = "auto",
               reserve_gib: float | None = None, pipeline_parallel_size: int = 1, ep: bool = False,
               dtype: str = "auto", quantization: str | None = None, enforce_eager: bool = False,
               max_num_batched_tokens: int | None = None) -> None:
    """fail before the test runs unless the weights, vLLM's profile-run memory and one max_model_len request's KV
    cache fit in gpu_memory_utilization of each GPU"""


HOST_MARKERS: tuple[Marker, ...] = (gpuready, gpus_clean, shm_clean)
HEALTH_MARKERS: tuple[Marker, ...] = (gpu_health,)
TWO_GPU_MARKERS: tuple[Marker, ...] = (gpu_p2p, nccl_allreduce)
MODEL_MARKERS: tuple[Marker, ...] = (model, deployment, fp8_block_alignment, mla_kv_backend_supported, memory_fit)
ALL_MARKERS: tuple[Marker, ...] = HOST_MARKERS + HEALTH_MARKERS + TWO_GPU_MARKERS + MODEL_MARKERS
BY_NAME: dict[str, Marker] = {m.name: m for m in ALL_MARKERS}
HOST_BOUND_MARKERS: tuple[str, ...] = tuple(m.name for m in ALL_MARKERS if m.host_bound)


def arguments(mark: pytest.Mark) -> dict[str, Any]:
    """:meth:`Marker.arguments` of the marker ``mark`` names."""
    __tracebackhide__ = True
    return BY_NAME[mark.name].arguments(mark)
