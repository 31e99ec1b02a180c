"""The attention backend rule: an MLA model needs an MLA backend for this GPU and KV-cache dtype.

:func:`pytest_gpuready.model.checks.check_mla_kv_backend` walks vLLM's priority list
(:mod:`pytest_gpuready.model.backends`), sparse MLA (DeepSeek-V3.2, GLM-5) included. vLLM
selects the backend when it builds the first attention layer (``Attention.__init__`` ->
``get_attn_backend``), so its ``No valid attention backend found ...`` comes after the
embedding and that layer's projections, and before its MLP.
"""

from __future__ import annotations

from pytest_gpuready.model.checks import check_mla_kv_backend
from pytest_gpuready.model.linear_attention import attention_layers
from pytest_gpuready.model.rules.common import BUILD, NEEDS_CAPABILITY, Capability, coerce_capability, staged
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict


def check_attention_backend(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                            vllm_version: VllmVersion | str | None = None) -> Verdict:
    """Is there an attention backend for the model's MLA on this GPU with the layout's KV dtype?"""
    cap = coerce_capability(capability)
    if model.is_mla and cap is None:
        kind = "sparse MLA" if model.is_sparse_mla else "MLA"
        return Verdict.undecided(f"{model.name} uses {kind}: which backend vLLM has for it depends on the GPU",
                                 needs=NEEDS_CAPABILITY)
    verdict = check_mla_kv_backend(model, cap, layout.kv_cache_dtype, vllm_version, tp=layout.tp)
    layers = attention_layers(model)
    return staged(verdict, BUILD, layers[0] if len(layers) else 0, 1)
