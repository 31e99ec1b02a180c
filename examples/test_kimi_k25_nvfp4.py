"""Example: nvidia/Kimi-K2.5-NVFP4 on RTX PRO 6000 Blackwell (SM120) and the FP8 KV cache it asks for.

The checkpoint's config.json carries ``kv_cache_scheme {num_bits: 8, type: float}``, so
``--kv-cache-dtype auto`` means an FP8 KV cache. On SM120 the only MLA attention backend is
TRITON_MLA, which has no FP8 KV cache before vLLM 0.18: vLLM 0.17 stops with "No valid attention
backend found ... Reasons: {... TRITON_MLA: [kv_cache_dtype not supported] ...}". The fix on 0.17
is ``--kv-cache-dtype bfloat16`` (twice the KV memory). These gates run anywhere::

    pytest examples/test_kimi_k25_nvfp4.py [--gpu-host root@gpu-box-7]
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuready import ModelSpec, check_mla_kv_backend, kv_cache_bytes_per_token, model_spec_from_config

HERE = Path(__file__).parent
CONFIG = HERE / "models/Kimi-K2.5-NVFP4/config.json"


@pytest.mark.model("models/Kimi-K2.5-NVFP4")
@pytest.mark.mla_kv_backend_supported(kv_cache_dtype="bfloat16", gpu_arch="sm120", vllm_version="0.17.0")
def test_bfloat16_kv_cache_has_a_backend_on_sm120_with_vllm_017(model_spec: ModelSpec) -> None:
    assert model_spec.is_mla


@pytest.mark.model("models/Kimi-K2.5-NVFP4")
@pytest.mark.mla_kv_backend_supported(gpu_arch="sm120", vllm_version="0.18.0")
def test_checkpoint_kv_dtype_works_on_sm120_from_vllm_018(model_spec: ModelSpec) -> None:
    assert model_spec.kv_lora_rank == 512


@pytest.mark.model("models/Kimi-K2.5-NVFP4")
@pytest.mark.mla_kv_backend_supported(gpu_arch="sm90", vllm_version="0.17.0")
def test_checkpoint_kv_dtype_works_on_h200(model_spec: ModelSpec) -> None:
    assert model_spec.is_mla


def test_auto_kv_cache_is_refused_on_sm120_with_vllm_017() -> None:
    """The known failure, asserted with the library function: vLLM's own wording, and the fix."""
    spec = model_spec_from_config(json.loads(CONFIG.read_text()))
    verdict = check_mla_kv_backend(spec, (12, 0), kv_cache_dtype="auto", vllm_version="0.17.0")
    assert not verdict.ok
    assert "No valid attention backend found" in verdict.message
    assert "TRITON_MLA: [kv_cache_dtype not supported]" in verdict.message
    assert "--kv-cache-dtype bfloat16" in verdict.message


def test_bf16_kv_cache_costs_twice_the_fp8_one() -> None:
    """MLA stores one 576-wide latent per layer and token on every GPU: TP does not shrink it."""
    spec = model_spec_from_config(json.loads(CONFIG.read_text()))
    fp8 = kv_cache_bytes_per_token(spec, tp=8, kv_cache_dtype="fp8")
    bf16 = kv_cache_bytes_per_token(spec, tp=8, kv_cache_dtype="bfloat16")
    assert (fp8, bf16) == (35_136, 70_272)
    assert kv_cache_bytes_per_token(spec, tp=1, kv_cache_dtype="bfloat16") == bf16


@pytest.mark.model("/models/Kimi-K2.5-NVFP4")  # the real checkpoint on the GPU host
@pytest.mark.memory_fit(tp=8, kv_cache_dtype="bfloat16", max_model_len=131072)
@pytest.mark.gpus_clean
def test_fits_on_the_gpu_host_with_a_bf16_kv_cache(model_spec: ModelSpec) -> None:
    """Needs --gpu-host and the checkpoint there: weights plus one 128k-token request per GPU."""
    assert model_spec.weights is not None
