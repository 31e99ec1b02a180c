"""The KV-cache dtype as vLLM resolves it, its size per token, and the MLA attention backend for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_gpuready.model import memory
from pytest_gpuready.model.backends import (
    FP8_KV_DTYPES,
    MIN_FP8_CAPABILITY,
    format_arch,
    kv_dtype_alias,
    select_mla_backend,
)
from pytest_gpuready.model.checks.common import (
    _capability,
    _version,
)
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import (
    TRITON_MLA_FP8_KV,
    VllmVersion,
)
from pytest_gpuready.verdict import Verdict

NVFP4_KV_DTYPES = frozenset({"nvfp4", "nvfp4_ds_mla"})

# ---------------------------------------------------------------- KV cache dtype and MLA backend

@dataclass(frozen=True)
class KvCacheDtype:
    """The KV-cache dtype vLLM will use, and why."""

    name: str
    reason: str

    @property
    def is_fp8(self) -> bool:
        return self.name in FP8_KV_DTYPES


def effective_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str = "auto",
                             vllm_version: VllmVersion | str | None = None) -> KvCacheDtype:
    """``--kv-cache-dtype`` after vLLM's resolution: ``auto`` takes the checkpoint's request
    (ModelOpt ``kv_cache_scheme`` / ``kv_cache_quant_algo``, compressed-tensors
    ``kv_cache_scheme``); an explicit value wins, except that compressed-tensors checkpoints force
    fp8 on GQA attention in vLLM 0.17 (0.33 honours the flag; releases between were not read
    and are treated like 0.17). Sources: vllm-invariants.md §2.4."""
    version = _version(vllm_version)
    quant = model.quantization
    asked = quant.kv_cache_dtype if quant else None
    alias = kv_dtype_alias(model.architectures, kv_cache_dtype, version)
    if alias is not None:
        return KvCacheDtype(alias, f"--kv-cache-dtype {kv_cache_dtype} is used as {alias} for "
                                   f"{model.architectures[0]} (models/config.py: verify_and_update_config)")
    if kv_cache_dtype != "auto":
        if (quant is not None and quant.method == "compressed-tensors" and asked
                and not model.is_mla and version is not None and not version.at_least(0, 33)):
            return KvCacheDtype("fp8", f"forced by {quant.kv_cache_source} on vLLM {version} "
                                       f"(--kv-cache-dtype {kv_cache_dtype} is ignored before 0.33)")
        return KvCacheDtype(kv_cache_dtype, f"--kv-cache-dtype {kv_cache_dtype}")
    if asked and quant is not None:
        return KvCacheDtype(asked, f"--kv-cache-dtype auto resolves to {asked} from {quant.kv_cache_source}")
    return KvCacheDtype("auto", f"--kv-cache-dtype auto: the model dtype ({model.torch_dtype})")


def _selector_config(model: ModelSpec, kv: str) -> str:
    """The start of vLLM's ``AttentionSelectorConfig.__repr__`` (later versions append more fields)."""
    return (f"AttentionSelectorConfig(head_size={model.mla_head_size}, dtype=torch.{model.torch_dtype}, "
            f"kv_cache_dtype={kv}, block_size=None, use_mla=True, has_sink=False, "
            f"use_sparse={model.is_sparse_mla}, ...)")


def check_mla_kv_backend(model: ModelSpec, compute_capability: tuple[int, int] | str | None,
                         kv_cache_dtype: str = "auto",
                         vllm_version: VllmVersion | str | None = None, *, tp: int = 1) -> Verdict:
    """Is there an MLA attention backend for this GPU, KV-cache dtype and vLLM version?

    Walks vLLM's priority list for the architecture with the effective KV dtype and returns
    the backend it would pick, or fails with vLLM's ``No valid attention backend found ...
    Reasons: {...}`` and the settings that would work. Non-MLA models pass ("does not apply"),
    and need no ``compute_capability`` (None).
    """
    version = _version(vllm_version)
    rule_set = TRITON_MLA_FP8_KV.select(version)
    kv = effective_kv_cache_dtype(model, kv_cache_dtype, version)
    evidence: dict[str, Any] = {"mla": model.is_mla, "kv_cache_dtype": kv.name,
                                "kv_cache_dtype_reason": kv.reason,
                                "vllm_version": str(version) if version else None}
    if not model.is_mla:
        return Verdict.passed(
            f"MLA backend check does not apply: {model.name} uses {model.text_model_type} "
            "attention, not MLA", evidence=evidence, rule_set=rule_set)
    if compute_capability is None:
        raise ValueError(f"{model.name} uses MLA: the MLA backend check needs the GPU's compute "
                         "capability (e.g. 'sm120' or (12, 0))")
    capability = _capability(compute_capability)
    arch = format_arch(capability)
    evidence["gpu_arch"] = arch
    details = [f"KV-cache dtype: {kv.reason}"]
    if kv.is_fp8 and capability < MIN_FP8_CAPABILITY:
        fallback = "float16" if capability < (8, 0) else "bfloat16"
        if version is None or version.at_least(0, 26):
            # TritonMLAImpl.__init__ (vllm/v1/attention/backends/mla/triton_mla.py, 0.26-0.33)
            summary = (f"FP8 KV cache is not supported by the Triton MLA backend on {arch} (compute capability "
                       f"{capability[0]}.{capability[1]}); native FP8 (fp8e4nv) requires SM89+. Re-run with "
                       f"--kv-cache-dtype {fallback}.")
        else:
            summary = (f"an FP8 KV cache ({kv.name}) needs compute capability >= 8.9; this GPU is "
                       f"{capability[0]}.{capability[1]} (vLLM {version} fails in the profile run: fp8e4nv data "
                       "type is not supported on CUDA arch < 89)")
        return Verdict.failed(
            f"{model.name} on {arch}: {summary}",
            details=(*details, f"what would work: --kv-cache-dtype {fallback}"),
            evidence=evidence, rule_set=rule_set)
    choice = select_mla_backend(capability=capability, kv_cache_dtype=kv.name,
                                sparse=model.is_sparse_mla, qk_nope_head_dim=model.qk_nope_head_dim,
                                version=version, num_heads=max(1, model.num_attention_heads // max(1, tp)),
                                head_size=model.mla_head_size)
    evidence.update({"backends_tried": list(choice.tried), "reasons": choice.reasons,
                     "backend": choice.chosen})
    if choice.chosen is not None:
        rejected = [f"{name}: {', '.join(why)}" for name, why in choice.reasons.items()]
        if choice.chosen == "TRITON_MLA" and kv.is_fp8 and version is not None \
                and not version.at_least(0, 13):
            return Verdict.failed(
                f"{model.name} on {arch} with KV cache {kv.name}: vLLM {version} picks TRITON_MLA, "
                "whose init raises NotImplementedError: TritonMLA V1 with FP8 KV cache not yet supported",
                details=(*details, *_mla_fixes(model, capability, version)),
                evidence=evidence, rule_set=rule_set)
        if rejected:
            details.append("passed over: " + "; ".join(rejected))
        return Verdict.passed(
            f"{model.name} on {arch} with KV cache {kv.name}: vLLM would use {choice.chosen}",
            details=tuple(details), evidence=evidence, rule_set=rule_set)
    message = (f"No valid attention backend found for cuda with {_selector_config(model, kv.name)}. "
               f"Reasons: {choice.reasons_text()}.")
    return Verdict.failed(
        f"{model.name} on {arch} with KV cache {kv.name}: {message}",
        details=(*details, *_mla_fixes(model, capability, version)),
        evidence=evidence, rule_set=rule_set)


def _mla_fixes(model: ModelSpec, capability: tuple[int, int], version: VllmVersion | None) -> list[str]:
    options = []
    for dtype in ("bfloat16",):
        choice = select_mla_backend(capability=capability, kv_cache_dtype=dtype,
                                    sparse=model.is_sparse_mla, qk_nope_head_dim=model.qk_nope_head_dim,
                                    version=version)
        if choice.chosen:
            options.append(f"--kv-cache-dtype {dtype} ({choice.chosen}; twice the KV memory of fp8)")
    kv = effective_kv_cache_dtype(model, "auto", version)
    if version is not None:
        newest = select_mla_backend(capability=capability, kv_cache_dtype=kv.name,
                                    sparse=model.is_sparse_mla, qk_nope_head_dim=model.qk_nope_head_dim,
                                    version=None)
        if newest.chosen and not TRITON_MLA_FP8_KV.is_new(version):
            options.append(f"vLLM >= 0.18 ({newest.chosen} supports {kv.name} there)")
        elif newest.chosen:
            options.append(f"a newer vLLM ({newest.chosen})")
    if not options:
        return ["what would work: no KV-cache dtype or vLLM version has an MLA backend for this GPU"]
    return ["what would work: " + ", or ".join(options)]


# ---------------------------------------------------------------- KV cache size and memory fit

def kv_dtype_bytes(model: ModelSpec, kv_cache_dtype: str, dtype: str = "auto") -> int:
    """Bytes per KV element for a resolved dtype: "auto" is the dtype the model is *served* in
    (``CacheConfig.cache_dtype == "auto"`` takes ``ModelConfig.dtype``), i.e. ``--dtype`` when
    given (float32: 4 bytes, vLLM 0.19 on an H100 logs half the bf16 tokens), else the config's."""
    name = kv_cache_dtype
    if name == "auto":
        name = model.torch_dtype if dtype == "auto" else dtype
    if name in ("bfloat16", "float16", "half", "bf16", "fp16"):
        return 2
    if name in ("float32", "float"):
        return 4
    if name in FP8_KV_DTYPES or name in NVFP4_KV_DTYPES:
        return 1  # stored as uint8 (STR_DTYPE_TO_TORCH_DTYPE); nvfp4 packs two per byte plus scales
    raise ValueError(f"KV-cache dtype {kv_cache_dtype!r}: its size per element is not modelled; "
                     "expected auto, bfloat16, float16 or an fp8 variant")


def kv_cache_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str = "auto",
                             dtype: str = "auto") -> int:
    """KV-cache bytes one token takes on one GPU, as vLLM sizes pages (vllm-invariants.md §3.1).

    GQA: ``2 x layers x max(1, kv_heads // tp) x head_dim x bytes``. MLA: ``layers x
    (kv_lora_rank + qk_rope_head_dim) x bytes``, not divided by TP (every rank stores the
    latent); ``fp8_ds_mla`` pages are 656 bytes per token per layer, ``nvfp4_ds_mla`` 352, and
    ``nvfp4`` takes ``head_dim // 2 + head_dim // 16`` bytes per head. ``auto`` resolves through
    the checkpoint's KV request first (Kimi-K2.5-NVFP4 -> fp8), then the served ``dtype``.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    kv = effective_kv_cache_dtype(model, kv_cache_dtype).name
    return memory.kv_bytes_per_token(model, tp, kv_dtype_bytes(model, kv, dtype), kv_cache_dtype=kv)
