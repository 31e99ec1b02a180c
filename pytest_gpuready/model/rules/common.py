"""What every rule shares: its signature, the GPU capability argument, and vLLM's order of failure.

A rule is a pure function ``(ModelSpec, Layout, capability, vLLM version) -> Verdict``. The
capability is the GPU's compute capability as ``(major, minor)`` (or ``"sm120"``), or None when
the caller does not know it: a rule whose answer depends on it then returns an *undecided*
verdict (``Verdict.needs`` set) instead of promising a load.

Each failing verdict records where vLLM would raise it, ``evidence["vllm_stage"] = [phase,
layer, step]``: phase 0 while ``EngineArgs.create_engine_config()`` builds the config, 1 while
the model is constructed (layer by layer, the embedding as layer -1; within a layer step 0 the
attention projections, 1 the attention backend, 2 the MLP's linear layers, 3 the routed experts
and their MoE kernel), 2 while the weights are
processed after loading. :func:`pytest_gpuready.model.rules.check_deployment` reports the
failure with the lowest stage first, which is the one vLLM's own error would name.
"""

from __future__ import annotations

from typing import Any, Protocol

from pytest_gpuready.model.backends import format_arch, parse_gpu_arch
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion, coerce_version
from pytest_gpuready.verdict import Verdict

Capability = tuple[int, int]
CONFIG, BUILD, LOAD = 0, 1, 2
NEEDS_CAPABILITY = "the GPU's compute capability (pass --gpu-arch SM, or --gpu-host HOST)"


class Rule(Protocol):
    """The signature every rule in :data:`pytest_gpuready.model.rules.RULES` has."""

    def __call__(self, model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                 vllm_version: VllmVersion | str | None = None) -> Verdict: ...


def coerce_capability(value: Capability | str | None) -> Capability | None:
    """``(12, 0)``, ``"sm120"`` or ``"12.0"`` -> ``(12, 0)``; None stays None; ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_gpu_arch(value)
    major, minor = value
    return (int(major), int(minor))


def version_of(value: VllmVersion | str | None) -> VllmVersion | None:
    return coerce_version(value)


def at(version: VllmVersion | None) -> tuple[int, int]:
    """The release as ``(major, minor)``; an unknown version is the newest (the rules' default)."""
    return (10**6, 0) if version is None else (version.major, version.minor)


def arch_text(capability: Capability | None) -> str:
    return format_arch(capability) if capability is not None else "an unknown GPU"


def staged(verdict: Verdict, phase: int, layer: int = 0, step: int = 0) -> Verdict:
    """The verdict with where vLLM raises it (kept when the check already recorded a finer one)."""
    if verdict.ok or "vllm_stage" in verdict.evidence:
        return verdict
    evidence: dict[str, Any] = dict(verdict.evidence)
    evidence["vllm_stage"] = [phase, layer, step]
    return Verdict(verdict.ok, verdict.summary, verdict.details, evidence, verdict.warnings,
                   verdict.rule_set, verdict.needs)


def stage_of(verdict: Verdict) -> tuple[int, int, int]:
    stage = verdict.evidence.get("vllm_stage")
    if isinstance(stage, (list, tuple)) and len(stage) == 3:
        return (int(stage[0]), int(stage[1]), int(stage[2]))
    return (9, 0, 0)
