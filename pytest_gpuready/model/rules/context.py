"""``--max-model-len`` against the checkpoint's config: a static rule, no hardware needed.

``ModelConfig`` (``_get_and_verify_max_len``, ``vllm/config/model.py``, 0.19-0.32) raises, while
the config is built, ``User-specified max_model_len (N) is greater than the derived max_model_len
(max_position_embeddings=M ...)`` unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set:
:func:`pytest_gpuready.model.checks.check_max_model_len` on the serve arguments' ``max_model_len``.
"""

from __future__ import annotations

from pytest_gpuready.model.checks import check_max_model_len
from pytest_gpuready.model.rules.common import CONFIG, Capability, staged
from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict


def check_context_length(model: ModelSpec, layout: Layout, capability: Capability | str | None = None,
                         vllm_version: VllmVersion | str | None = None, *, allow_long: bool = False) -> Verdict:
    """Is ``--max-model-len`` within what the config allows (or allowed by the environment)?"""
    return staged(check_max_model_len(model, layout.max_model_len, allow_long=allow_long), CONFIG, -1)
