"""The load-time rules of vLLM as pure functions of (model, layout, GPU capability, vLLM version).

Every rule in :data:`RULES` has the signature of :class:`~pytest_gpuready.model.rules.common.Rule`::

    rule(model: ModelSpec, layout: Layout, capability=None, vllm_version=None) -> Verdict

where ``capability`` is the GPU's compute capability (``(12, 0)``, ``"sm120"``) or None, and
``vllm_version`` a :class:`VllmVersion`, a string or None (newest rules). A rule that cannot decide
without the capability returns ``Verdict.undecided`` (``verdict.needs`` says what it needs); a
failing verdict reads like vLLM's own error and records where vLLM raises it
(``evidence["vllm_stage"]``). :func:`check_deployment` runs them all (plus the world size when
the number of visible GPUs is known, and memory fit when the GPUs are) and names the failure vLLM
would report first. It is the one path: the ``deployment`` marker, the preflight suite, the
planner and library callers all judge a deployment through it, on its
:class:`~pytest_gpuready.model.serve_args.ServeArgs` (``Layout``).

Each rule's module docstring gives its vLLM source locations and the versions it holds for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.rules.attention import check_attention_backend
from pytest_gpuready.model.rules.common import Capability, Rule, coerce_capability, stage_of, version_of
from pytest_gpuready.model.rules.context import check_context_length
from pytest_gpuready.model.rules.fp8 import check_fp8_blocks
from pytest_gpuready.model.rules.marlin import check_marlin_fp8
from pytest_gpuready.model.rules.memory import check_memory
from pytest_gpuready.model.rules.nvfp4_moe import check_nvfp4_moe_backend
from pytest_gpuready.model.rules.parallel import check_expert_parallel, check_tensor_parallel, check_world_size
from pytest_gpuready.model.rules.quantization import check_quantization_capability
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

RULES: Mapping[str, Rule] = {
    "max_model_len": check_context_length,
    "tensor_parallel": check_tensor_parallel,
    "expert_parallel": check_expert_parallel,
    "quantization_capability": check_quantization_capability,
    "fp8_block_alignment": check_fp8_blocks,
    "attention_backend": check_attention_backend,
    "marlin_fp8_tiles": check_marlin_fp8,
    "nvfp4_moe_backend": check_nvfp4_moe_backend,
}
"""The rules by name, each ``(model, layout, capability, vllm_version) -> Verdict``."""


@dataclass(frozen=True)
class DeploymentCheck:
    """Every rule's verdict for one layout, and the failure vLLM would raise first."""

    model: str
    layout: Layout
    verdicts: Mapping[str, Verdict]

    @property
    def failures(self) -> list[tuple[str, Verdict]]:
        """Failed (not undecided) verdicts, in the order vLLM would meet them."""
        failed = [(name, v) for name, v in self.verdicts.items() if not v.ok and v.needs is None]
        return sorted(failed, key=lambda item: stage_of(item[1]))

    @property
    def first_failure(self) -> tuple[str, Verdict] | None:
        failures = self.failures
        return failures[0] if failures else None

    @property
    def undecided(self) -> list[tuple[str, Verdict]]:
        return [(name, v) for name, v in self.verdicts.items() if v.needs is not None]

    @property
    def ok(self) -> bool:
        """Loads: no rule failed and none was left undecided."""
        return all(v.ok for v in self.verdicts.values())

    @property
    def word(self) -> str:
        """One word for a planner row: ``loads``, ``fails`` or ``undecided``."""
        if self.first_failure is not None:
            return "fails"
        return "undecided" if self.undecided else "loads"

    def verdict(self) -> Verdict:
        """One Verdict for the whole layout: vLLM's first failure (the others as details), else
        undecided with what it needs, else a pass carrying every rule's warnings."""
        layout = self.layout.describe()
        first = self.first_failure
        if first is not None:
            name, verdict = first
            others = [f"also ({n}): {v.summary}" for n, v in self.failures[1:]]
            return Verdict.failed(verdict.summary, details=(*verdict.details, *others),
                                  evidence={"rule": name, "layout": layout, **dict(verdict.evidence)},
                                  rule_set=verdict.rule_set)
        warnings = tuple(w for v in self.verdicts.values() for w in v.warnings)
        pending = self.undecided
        if pending:
            name, verdict = pending[0]
            return Verdict.undecided(f"{self.model} at {layout}: {verdict.summary}", needs=verdict.needs or "",
                                     details=tuple(f"{n}: {v.summary}" for n, v in pending[1:]),
                                     evidence={"rule": name, "layout": layout}, warnings=warnings)
        return Verdict.passed(f"{self.model} at {layout}: every vLLM load rule holds ({len(self.verdicts)} rules)",
                              details=tuple(f"{n}: {v.summary}" for n, v in self.verdicts.items()),
                              evidence={"layout": layout}, warnings=warnings)

    @property
    def reason(self) -> str:
        """vLLM's words for the first failure, or what an undecided row needs; empty when it loads."""
        first = self.first_failure
        if first is not None:
            return first[1].summary
        pending = self.undecided
        return f"needs {pending[0][1].needs}" if pending else ""


def check_deployment(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                     vllm_version: VllmVersion | str | None = None, *,
                     visible_gpus: int | None = None, snapshot: HostSnapshot | None = None,
                     gpus: Sequence[int] | None = None, allow_long_max_model_len: bool = False) -> DeploymentCheck:
    """Run every rule for one layout (its whole :class:`ServeArgs`); ``visible_gpus`` adds the
    world-size rule, ``snapshot`` (with the deployment's ``gpus``) the memory fit;
    ``allow_long_max_model_len`` is ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``."""
    cap = coerce_capability(capability)
    version = version_of(vllm_version)
    verdicts: dict[str, Verdict] = {}
    if visible_gpus is not None:
        verdicts["world_size"] = check_world_size(layout, visible_gpus, version)
    for name, rule in RULES.items():
        if name == "max_model_len":
            verdicts[name] = check_context_length(model, layout, cap, version, allow_long=allow_long_max_model_len)
        else:
            verdicts[name] = rule(model, layout, cap, version)
    if snapshot is not None:
        verdicts["memory"] = check_memory(model, layout, snapshot, gpus=gpus, vllm_version=version,
                                          allow_long_max_model_len=allow_long_max_model_len)
    return DeploymentCheck(model.name, layout, verdicts)


__all__ = [
    "RULES",
    "Capability",
    "DeploymentCheck",
    "Layout",
    "Rule",
    "check_attention_backend",
    "check_context_length",
    "check_deployment",
    "check_expert_parallel",
    "check_fp8_blocks",
    "check_marlin_fp8",
    "check_memory",
    "check_nvfp4_moe_backend",
    "check_quantization_capability",
    "check_tensor_parallel",
    "check_world_size",
]
