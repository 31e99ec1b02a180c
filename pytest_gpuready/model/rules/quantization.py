"""The quantization method against the GPU: each method declares a minimum compute capability.

``VllmConfig._get_quantization_config`` (``vllm/config/vllm.py``) raises, while the config is
built, ``The quantization method {method} is not supported for the current GPU. Minimum
capability: {min}. Current capability: {cap}.`` when ``get_min_capability()`` of the method's
config class is above the GPU's. That is the rule for MXFP4 (gpt-oss) below SM80, FP8 below SM75
(weight-only FP8 runs on Marlin from SM75), and ModelOpt FP8 below SM89 until vLLM 0.26.

Minimums, read from each class's ``get_min_capability`` in the vLLM wheels (0.13, 0.15, 0.17,
0.20, 0.24-0.28, 0.32, 0.33): ``fp8`` (``fp8.py``) 80 in 0.13, 75 from 0.15; ``mxfp4``
(``mxfp4.py``) 80; ``modelopt`` FP8 (``ModelOptFp8Config``) 89 until 0.26, 80 from 0.27;
``modelopt_fp4`` (``ModelOptNvFp4Config``) 80 in 0.13, 75 from 0.15; ``compressed-tensors`` 70
(its schemes choose kernels by capability later).
"""

from __future__ import annotations

from pytest_gpuready.model.rules.common import (
    CONFIG,
    NEEDS_CAPABILITY,
    Capability,
    at,
    coerce_capability,
    staged,
    version_of,
)
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

MIN_CAPABILITY: dict[str, tuple[tuple[tuple[int, int], int], ...]] = {
    "fp8": (((0, 0), 80), ((0, 15), 75)),
    "mxfp4": (((0, 0), 80),),
    "modelopt": (((0, 0), 89), ((0, 27), 80)),
    "modelopt_fp4": (((0, 0), 80), ((0, 15), 75)),
    "compressed-tensors": (((0, 0), 70),),
}
"""Method -> (since version, minimum capability as major*10+minor)."""
RULE_SET = "vLLM quantization minimum capabilities (read 0.13-0.33)"


def min_capability(method: str, version: VllmVersion | None) -> int | None:
    """``get_min_capability()`` of ``method`` in that vLLM, or None when not modelled."""
    table = MIN_CAPABILITY.get(method)
    if table is None:
        return None
    chosen = table[0][1]
    for since, value in table:
        if at(version) >= since:
            chosen = value
    return chosen


def vllm_method(model: ModelSpec) -> str | None:
    """The method name vLLM settles on: ModelOpt NVFP4 checkpoints say ``modelopt`` and become
    ``modelopt_fp4`` (``ModelOptNvFp4Config.override_quantization_method``)."""
    quant = model.quantization
    if quant is None:
        return None
    if quant.method.startswith("modelopt") and (quant.algo or "").upper() == "NVFP4":
        return "modelopt_fp4"
    return quant.method


def check_quantization_capability(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                                  vllm_version: VllmVersion | str | None = None) -> Verdict:
    """Is the checkpoint's quantization method supported on this GPU at all?"""
    quant = model.quantization
    if quant is None:
        return Verdict.passed(f"{model.name} is not quantized: no minimum capability", rule_set=RULE_SET)
    version = version_of(vllm_version)
    method = vllm_method(model) or quant.method
    minimum = min_capability(method, version)
    evidence = {"method": method, "min_capability": minimum}
    if minimum is None:
        return Verdict.passed(f"{model.name}: the minimum capability of {method} is not modelled",
                              evidence=evidence, rule_set=RULE_SET)
    cap = coerce_capability(capability)
    if cap is None:
        return Verdict.undecided(
            f"{model.name}: {method} needs compute capability {minimum / 10:.1f} or newer; this GPU's is "
            "not known", needs=NEEDS_CAPABILITY, evidence=evidence, rule_set=RULE_SET)
    current = cap[0] * 10 + cap[1]
    if current < minimum:
        return staged(Verdict.failed(
            f"The quantization method {method} is not supported for the current GPU. Minimum "
            f"capability: {minimum}. Current capability: {current}.", evidence=evidence, rule_set=RULE_SET),
            CONFIG, 0, 2)
    return Verdict.passed(f"{model.name}: {method} runs on compute capability {current} "
                          f"(needs {minimum})", evidence=evidence, rule_set=RULE_SET)
