"""Memory fit as a rule: :func:`pytest_gpuready.model.checks.memory_fit` on the serve arguments and
the GPUs, with where vLLM raises each failure (so the planner and the suite need not re-derive it).

Unlike the load rules it needs the GPUs (a :class:`~pytest_gpuready.host.snapshot.HostSnapshot`),
so :func:`pytest_gpuready.model.rules.check_deployment` runs it only when given one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.checks import memory_fit
from pytest_gpuready.model.rules.common import BUILD, CONFIG, LOAD, staged
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

KV_SIZING = LOAD + 1
"""After the weights are processed: ``determine_available_memory`` and the KV-cache check."""


def stage_memory(verdict: Verdict) -> Verdict:
    """The memory verdict with where vLLM raises it: a max_model_len above the config's while
    ``ModelConfig`` is built (the first config of ``create_engine_config``); ``Free memory on
    device`` in ``Worker.init_device``, before the model is built; the KV-cache failures after
    loading."""
    evidence = verdict.evidence
    if "kv_cache_bytes" in evidence:
        return staged(verdict, KV_SIZING)
    if "per_gpu" in evidence:
        return staged(verdict, BUILD, -2)
    if "derived_max_model_len" in evidence:
        return staged(verdict, CONFIG, -1)
    return staged(verdict, CONFIG)


def check_memory(model: ModelSpec, layout: Layout, snapshot: HostSnapshot, *, gpus: Sequence[int] | None = None,
                 vllm_version: VllmVersion | str | None = None, allow_long_max_model_len: bool = False) -> Verdict:
    """Weights, the profile run and one max_model_len request's KV cache on each of ``gpus``."""
    return stage_memory(memory_fit(model, snapshot, layout, gpus=gpus, vllm_version=vllm_version,
                                   allow_long_max_model_len=allow_long_max_model_len))
