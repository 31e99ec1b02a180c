"""The NVFP4 MoE backend rule: does vLLM's oracle find a kernel for these experts on this GPU?

:func:`pytest_gpuready.model.moe_backends.select_nvfp4_moe_backend` walks vLLM's
``select_nvfp4_moe_backend`` (``vllm/model_executor/layers/fused_moe/oracle/nvfp4.py``, read
0.15-0.33; sources per backend in that module). vLLM runs it while it builds the first MoE
layer's experts, so ``No NvFp4 MoE backend supports the deployment configuration.`` comes after
that layer's attention and dense projections. Real cases it reproduces:

- NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4 on an RTX 5090 (SM120), vllm-project/vllm#35065: the
  experts are non-gated ReLU^2 (``is_act_and_mul=False``, ``relu2_no_mul``). In 0.15 the only
  SM120 kernels (VLLM_CUTLASS, MARLIN) are gated-only and FLASHINFER_CUTLASS is SM90/SM100
  only: no backend. 0.16 opens FLASHINFER_CUTLASS to SM120 (vllm-project/vllm#33417) and
  Marlin to non-gated experts; vllm-project/vllm#52308 has it running on SM120 under 0.27.
- DeepSeek-V4-Flash-NVFP4 on an RTX PRO 6000 (SM120), vllm-project/vllm#45661: the model sets
  ``swiglu_limit``; 0.22-0.23 keep only FLASHINFER_TRTLLM for it, an SM100 kernel: no backend.
  0.24 adds FLASHINFER_CUTLASS and MARLIN to the backends that apply the clamp.

Which model sets what (``vllm/model_executor/models/`` and, from 0.22, ``vllm/models/``):
Nemotron-H ``activation_without_mul(mlp_hidden_act)`` with ``is_act_and_mul=False``
(``nemotron_h.py``); gpt-oss ``swigluoai`` (``gpt_oss.py``; its clamp lives in the activation,
not in ``swiglu_limit``); DeepSeek-V4 ``swiglu_limit=config.swiglu_limit`` (0.22+,
``vllm/models/deepseek_v4/nvidia/model.py``); everything else ``silu``, gated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_gpuready.model.moe_backends import (
    FINAL_ERROR,
    NEWEST_READ,
    ORACLE_SINCE,
    MoeKernelConfig,
    select_nvfp4_moe_backend,
    source_of,
)
from pytest_gpuready.model.rules.common import (
    BUILD,
    NEEDS_CAPABILITY,
    Capability,
    arch_text,
    at,
    coerce_capability,
    staged,
    version_of,
)
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

RULE_SET = (f"vLLM NVFP4 MoE oracle (select_nvfp4_moe_backend, read {ORACLE_SINCE[0]}.{ORACLE_SINCE[1]}-"
            f"{NEWEST_READ[0]}.{NEWEST_READ[1]})")
NEEDS_VERSION = (f"a vLLM version from {ORACLE_SINCE[0]}.{ORACLE_SINCE[1]} on (the NVFP4 MoE oracle is read "
                 f"{ORACLE_SINCE[0]}.{ORACLE_SINCE[1]} to {NEWEST_READ[0]}.{NEWEST_READ[1]})")
NON_GATED = {"NemotronHForCausalLM": "mlp_hidden_act"}
"""Architectures whose experts are non-gated: the config key that names their activation."""
SWIGLU_LIMIT_ARCHITECTURES = frozenset({"DeepseekV4ForCausalLM"})


def nvfp4_experts(model: ModelSpec) -> bool:
    """Are the routed experts NVFP4 (W4A4), so that vLLM builds them through the NVFP4 oracle?"""
    quant = model.quantization
    if quant is None or not model.is_moe:
        return False
    algo = (quant.algo or "").upper()
    if quant.method.startswith("modelopt"):
        return algo == "NVFP4" or "NVFP4" in (a.upper() for a in quant.layer_algos)
    return quant.method == "compressed-tensors" and algo == "FLOAT4" and _ct_w4a4(model.config)


def _ct_w4a4(config: Mapping[str, Any]) -> bool:
    """compressed-tensors NVFP4 with 4-bit activations (W4A4); NVFP4A16 goes through Marlin's own path."""
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config") or {}
    groups = qc.get("config_groups") if isinstance(qc, Mapping) else None
    for group in (groups or {}).values():
        acts = group.get("input_activations") if isinstance(group, Mapping) else None
        if isinstance(acts, Mapping) and acts.get("num_bits") == 4:
            return True
    return False


def moe_kernel_config(model: ModelSpec, layout: Layout, version: VllmVersion | None) -> MoeKernelConfig:
    """What the model's ``FusedMoE`` layers tell the oracle (see the module docstring)."""
    text: Mapping[str, Any] = model.config.get("text_config") or model.config
    activation, gated, limit = "silu", True, None
    for arch in model.architectures:
        if arch in NON_GATED:
            activation, gated = f"{text.get(NON_GATED[arch], 'relu2')}_no_mul", False
        elif arch == "GptOssForCausalLM":
            activation = "swigluoai"
        elif arch in SWIGLU_LIMIT_ARCHITECTURES and at(version) >= (0, 22):
            value = text.get("swiglu_limit")
            limit = float(value) if isinstance(value, (int, float)) else None
    return MoeKernelConfig(activation=activation, gated=gated, hidden_size=model.hidden_size,
                           swiglu_limit=limit, ep_size=layout.ep_size if layout.ep else 1)


def check_nvfp4_moe_backend(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                            vllm_version: VllmVersion | str | None = None) -> Verdict:
    """Is there an NVFP4 MoE kernel for the model's experts on this GPU, in this vLLM?"""
    if not nvfp4_experts(model):
        return Verdict.passed(f"NVFP4 MoE rule does not apply: {model.name} has no NVFP4 experts",
                              rule_set=RULE_SET)
    version = version_of(vllm_version)
    if version is not None and at(version) < ORACLE_SINCE:
        return Verdict.undecided(
            f"{model.name}: vLLM {version} chose NVFP4 MoE kernels before the oracle this rule reads",
            needs=NEEDS_VERSION, rule_set=RULE_SET)
    cap = coerce_capability(capability)
    if cap is None:
        return Verdict.undecided(f"{model.name} has NVFP4 experts: which MoE kernel vLLM has for them "
                                 "depends on the GPU", needs=NEEDS_CAPABILITY, rule_set=RULE_SET)
    moe = moe_kernel_config(model, layout, version)
    choice = select_nvfp4_moe_backend(cap, moe, version)
    where = f"{model.name} on {arch_text(cap)} at {layout.describe()}"
    evidence: dict[str, Any] = {
        "gpu_arch": arch_text(cap), "activation": moe.activation, "is_act_and_mul": moe.gated,
        "swiglu_limit": moe.swiglu_limit, "tried": list(choice.tried), "reasons": dict(choice.reasons),
        "chosen": choice.chosen}
    config = (f"experts: {moe.activation}{'' if moe.gated else ' (non-gated)'}"
              + (f", swiglu_limit={moe.swiglu_limit:g}" if moe.swiglu_limit is not None else ""))
    if choice.unmodelled is not None:
        return Verdict.undecided(
            f"{where}: the oracle reaches {choice.unmodelled}, whose checks are not modelled",
            needs=f"{choice.unmodelled}'s support checks ({source_of(choice.unmodelled)})",
            details=choice.log_lines(), evidence=evidence, rule_set=RULE_SET)
    if choice.chosen is None:
        details = [config, *choice.log_lines()]
        if moe.swiglu_limit is not None and len(choice.tried) < 3:
            details.append(f"the model sets swiglu_limit, so vLLM {version or ''} tries only the backends that "
                           f"apply the clamp: {', '.join(choice.tried)}".replace("  ", " "))
        details.append("what would work: a vLLM where a kernel for these experts runs on this GPU "
                       "(the rule's per-version table is pytest_gpuready/model/moe_backends.py), or an SM100 GPU")
        first_moe_layer = model.dense_layer_count
        return staged(Verdict.failed(f"{where}: {FINAL_ERROR}", details=tuple(details), evidence=evidence,
                                     rule_set=RULE_SET), BUILD, first_moe_layer, 3)
    return Verdict.passed(f"{where}: vLLM would use the {choice.chosen} NvFp4 MoE backend",
                          details=(config, *choice.log_lines()), evidence=evidence, rule_set=RULE_SET)
