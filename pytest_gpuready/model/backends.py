"""vLLM's MLA attention backends as data: which GPU architecture, KV-cache dtype and vLLM version
each one accepts, and the order vLLM tries them in.

vLLM picks an attention backend at engine start, after the weights are loaded; when none fits
it raises ``No valid attention backend found ... Reasons: {...}``. Keeping the support matrix
here, in one place with its sources, lets :func:`pytest_gpuready.model.checks.check_mla_kv_backend`
give the same answer in milliseconds, and makes a vLLM upgrade a data change.

Sources (read from the vLLM wheels; see ``shared/reference/vllm-invariants.md`` §2.2-2.3):
each backend class in ``vllm/v1/attention/backends/mla/*.py`` (``supports_compute_capability``,
``supported_kv_cache_dtypes``, ``supports_combination``); the priority lists in
``vllm/platforms/cuda.py`` ``_get_backend_priorities`` (0.17.0:L48-82, 0.33.0:L84-155); the
reason strings and their order in ``vllm/v1/attention/backend.py`` ``validate_configuration``.
Versions read: 0.11, 0.13, 0.15, 0.17, 0.18, 0.22, 0.28, 0.33; a rule that changed between two
of those is dated by the later one. Re-read against 0.18-0.32 on 2026-12-01: TOKENSPEED_MLA
exists from 0.21, FLASHINFER_MLA_SPARSE_SM120 and the SM12x branch from 0.24,
FLASH_ATTN_MLA_SPARSE from 0.25, FLASHINFER_MLA_SPARSE_SM90 from 0.30 (they had been dated 0.28
and 0.33); vLLM 0.32 itself checks this table in tests/vllm/test_rules_match_vllm.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_gpuready.model.vllm_version import VllmVersion

Version = tuple[int, int]

KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "nvfp4", "nvfp4_ds_mla",
)
"""Values ``--kv-cache-dtype`` takes (``vllm/config/cache.py`` 0.17.0:L23-31; ``float16`` and the
nvfp4 names from 0.33.0:L44-67)."""

FP8_KV_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})

KV_DTYPE_ALIASES: dict[str, tuple[Version, dict[str, str]]] = {
    "DeepseekV32ForCausalLM": ((0, 11), {"fp8": "fp8_ds_mla", "fp8_e4m3": "fp8_ds_mla", "fp8_e5m2": "fp8_ds_mla",
                                         "bfloat16": "auto"}),
}
"""``--kv-cache-dtype`` values a model's config hook rewrites before the backend is chosen, by
architecture: (since, {given: used}). DeepSeek-V3.2's sparse MLA keeps an FP8 cache only in its
own ``fp8_ds_mla`` pages, which FLASHMLA_SPARSE accepts: ``DeepseekV32ForCausalLM.
verify_and_update_config`` (``vllm/model_executor/models/config.py``, from 0.11, when V3.2 arrived)
turns every ``fp8*`` into ``fp8_ds_mla`` ("Using custom fp8 kv-cache format for DeepSeekV3.2")
and ``bfloat16`` into ``auto``."""


def kv_dtype_alias(architectures: Sequence[str], kv_cache_dtype: str,
                   version: VllmVersion | None) -> str | None:
    """The dtype vLLM uses instead of ``kv_cache_dtype`` for this architecture, or None."""
    for arch in architectures:
        entry = KV_DTYPE_ALIASES.get(arch)
        if entry is not None and _at(version) >= entry[0]:
            return entry[1].get(kv_cache_dtype)
    return None


MIN_FP8_CAPABILITY = (8, 9)
"""``CudaPlatform.supports_fp8()`` is ``has_device_capability(89)`` (``vllm/platforms/cuda.py`` 0.33.0:L587)."""

_COMMON_FP8 = frozenset({"auto", "bfloat16", "fp8", "fp8_e4m3"})


@dataclass(frozen=True)
class Versioned:
    """A value that holds from vLLM ``since`` on, until the next entry's ``since``."""

    since: Version
    value: frozenset[str] | None
    """None: the backend declares no list (every dtype passes the selector)."""


@dataclass(frozen=True)
class MlaBackend:
    """One MLA backend's static support, as its class in vLLM declares it."""

    name: str
    majors: frozenset[int] | None
    """Compute-capability majors it runs on; None for any."""
    kv_cache_dtypes: tuple[Versioned, ...]
    sparse: bool = False
    exists_since: Version = (0, 0)
    dense_needs_hopper: bool = False
    """Dense FlashMLA needs capability family 90 (``is_flashmla_dense_supported``)."""
    qk_nope_head_dims: tuple[tuple[Version, tuple[int, ...]], ...] = ()
    source: str = ""
    notes: str = ""

    def kv_dtypes_at(self, version: Version) -> frozenset[str] | None:
        chosen: frozenset[str] | None = None
        for entry in self.kv_cache_dtypes:
            if version >= entry.since:
                chosen = entry.value
        return chosen

    def nope_dims_at(self, version: Version) -> tuple[int, ...] | None:
        chosen: tuple[int, ...] | None = None
        for since, dims in self.qk_nope_head_dims:
            if version >= since:
                chosen = dims
        return chosen


MLA_BACKENDS: dict[str, MlaBackend] = {b.name: b for b in (
    MlaBackend(
        "FLASHMLA", frozenset({9, 10}),
        (Versioned((0, 0), _COMMON_FP8), Versioned((0, 18), _COMMON_FP8 | {"float16"})),
        dense_needs_hopper=True,
        source="vllm/v1/attention/backends/mla/flashmla.py; vllm/v1/attention/ops/flashmla.py 0.17.0:L51-60",
        notes="dense FlashMLA is Hopper-only",
    ),
    MlaBackend(
        "FLASHMLA_SPARSE", frozenset({9, 10}),
        (Versioned((0, 0), frozenset({"auto", "bfloat16", "fp8_ds_mla"})),
         Versioned((0, 33), frozenset({"auto", "bfloat16", "fp8_ds_mla", "fp8", "nvfp4_ds_mla"}))),
        sparse=True,
        source="vllm/v1/attention/backends/mla/flashmla_sparse.py",
    ),
    MlaBackend(
        "CUTLASS_MLA", frozenset({10}), (Versioned((0, 0), _COMMON_FP8),),
        source="vllm/v1/attention/backends/mla/cutlass_mla.py",
    ),
    MlaBackend(
        "FLASHINFER_MLA", frozenset({10}), (Versioned((0, 0), _COMMON_FP8),),
        qk_nope_head_dims=(((0, 0), (128,)), ((0, 18), (64, 128)), ((0, 33), (64, 128, 192))),
        source="vllm/v1/attention/backends/mla/flashinfer_mla.py",
    ),
    MlaBackend(
        "FLASHINFER_MLA_SPARSE", frozenset({10}),
        (Versioned((0, 0), frozenset({"auto", "bfloat16"})), Versioned((0, 18), _COMMON_FP8)),
        sparse=True, exists_since=(0, 17),
        source="vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py",
    ),
    MlaBackend(
        "TRITON_MLA", None,
        (Versioned((0, 0), None), Versioned((0, 13), frozenset({"auto"})),
         Versioned((0, 15), frozenset({"auto", "bfloat16"})),
         Versioned((0, 18), frozenset({"auto", "float16", "bfloat16", "fp8", "fp8_e4m3"}))),
        source="vllm/v1/attention/backends/mla/triton_mla.py (0.11.0:L69-70, 0.17.0:L97-99)",
        notes="portable fallback; before 0.13 it declared no dtypes and raised "
              "'TritonMLA V1 with FP8 KV cache not yet supported' at init; FP8 KV from 0.18 "
              "(vllm-project/vllm#35577)",
    ),
    MlaBackend(
        "FLASH_ATTN_MLA", frozenset({9}),
        (Versioned((0, 0), frozenset({"auto", "bfloat16"})),
         Versioned((0, 18), frozenset({"auto", "float16", "bfloat16"}))),
        source="vllm/v1/attention/backends/mla/flashattn_mla.py; needs FA3 (fa_utils.flash_attn_supports_mla)",
        notes="no FP8 KV cache (vllm-project/vllm#46695)",
    ),
    MlaBackend(
        "FLASH_ATTN_MLA_SPARSE", frozenset({9}), (Versioned((0, 0), frozenset({"auto", "bfloat16"})),),
        sparse=True, exists_since=(0, 25),
        source="vllm/v1/attention/backends/mla/flashattn_mla_sparse.py (0.25+)",
    ),
    MlaBackend(
        "TOKENSPEED_MLA", frozenset({10}), (Versioned((0, 0), frozenset({"fp8", "fp8_e4m3"})),),
        exists_since=(0, 21),
        source="vllm/v1/attention/backends/mla/tokenspeed_mla.py (0.21+; R1 dims and an FP8 KV cache only)",
    ),
    MlaBackend(
        "FLASHINFER_MLA_SPARSE_SM90", frozenset({9}), (Versioned((0, 0), _COMMON_FP8),),
        sparse=True, exists_since=(0, 30),
        source="vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py (0.30+)",
    ),
    MlaBackend(
        "FLASHINFER_MLA_SPARSE_SM120", frozenset({12}),
        (Versioned((0, 0), frozenset({"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"})),),
        sparse=True, exists_since=(0, 24),
        source="vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py (0.24+; needs FlashInfer's sparse MLA decode)",
    ),
)}


def mla_priority(capability: tuple[int, int], version: VllmVersion | None, *,
                 kv_cache_dtype: str | None = None, num_heads: int | None = None,
                 head_size: int | None = None) -> list[str]:
    """The MLA backends vLLM tries, in order, on a GPU of ``capability`` (``_get_backend_priorities``
    in ``vllm/platforms/cuda.py``; read in 0.15, 0.17, 0.18, 0.21, 0.23, 0.24, 0.25, 0.28, 0.30, 0.32,
    0.33; a change between two of those is dated by the later one).

    - SM10x: ``FLASHINFER_MLA``, ``TOKENSPEED_MLA`` (0.21+), ``CUTLASS_MLA``, ``FLASH_ATTN_MLA``,
      ``FLASHMLA``, ``TRITON_MLA``, then the sparse backends: ``FLASHMLA_SPARSE`` first, or
      ``FLASHINFER_MLA_SPARSE`` first for <= 16 heads (0.17+) and for a quantized KV cache (0.21+).
    - SM12x (0.24+): ``TRITON_MLA``, ``FLASHINFER_MLA_SPARSE_SM120``; before 0.24 SM12x took the
      list below.
    - Everything else: ``FLASH_ATTN_MLA``, ``FLASHMLA``, ``FLASHINFER_MLA``, ``TRITON_MLA``, then
      ``FLASH_ATTN_MLA_SPARSE`` (0.25+), ``FLASHMLA_SPARSE``, ``FLASHINFER_MLA_SPARSE_SM90`` (0.30+;
      first of the sparse ones when the head size is 512).

    An unknown version gets the newest list.
    """
    at = _at(version)
    major = capability[0]
    quantized_kv = kv_cache_dtype is not None and kv_cache_dtype not in ("auto", "bfloat16", "float16")
    if major == 10:
        names = ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"]
        flashinfer_first = ((at >= (0, 21) and quantized_kv)
                            or (at >= (0, 17) and num_heads is not None and num_heads <= 16))
        names += (["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"] if flashinfer_first
                  else ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"])
    elif major == 12 and at >= (0, 24):
        names = ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
    else:
        names = ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASH_ATTN_MLA_SPARSE",
                 "FLASHMLA_SPARSE"]
        if head_size == 512:
            names.insert(4, "FLASHINFER_MLA_SPARSE_SM90")
        else:
            names.append("FLASHINFER_MLA_SPARSE_SM90")
    return [n for n in names if at >= MLA_BACKENDS[n].exists_since]


def _at(version: VllmVersion | None) -> Version:
    if version is None:
        return (10**6, 0)
    return (version.major, version.minor)


@dataclass(frozen=True)
class BackendChoice:
    """What vLLM's selector would do: the backend chosen, or every rejection with its reasons."""

    tried: tuple[str, ...]
    reasons: dict[str, list[str]] = field(default_factory=dict)
    chosen: str | None = None

    def reasons_text(self) -> str:
        """``{FLASH_ATTN_MLA: [compute capability not supported], ...}`` as vLLM prints it."""
        return "{" + ", ".join(f"{name}: [{', '.join(why)}]" for name, why in self.reasons.items()) + "}"


def backend_reasons(backend: MlaBackend, *, capability: tuple[int, int], kv_cache_dtype: str,
                    sparse: bool, qk_nope_head_dim: int | None,
                    version: VllmVersion | None) -> list[str]:
    """Why ``backend`` rejects this configuration, in ``validate_configuration``'s order and words."""
    at = _at(version)
    reasons = []
    supported = backend.kv_dtypes_at(at)
    if supported is not None and kv_cache_dtype not in supported:
        reasons.append("kv_cache_dtype not supported")
    if sparse != backend.sparse:
        reasons.append("sparse not supported" if sparse else "non-sparse not supported")
    if backend.majors is not None and capability[0] not in backend.majors:
        reasons.append("compute capability not supported")
    combination = _combination_reason(backend, capability, sparse, qk_nope_head_dim, at)
    if combination:
        reasons.append(combination)
    return reasons


def _combination_reason(backend: MlaBackend, capability: tuple[int, int], sparse: bool,
                        qk_nope_head_dim: int | None, at: Version) -> str | None:
    """``supports_combination`` of the backends that have one (read in 0.17-0.32)."""
    if backend.name in ("FLASH_ATTN_MLA", "FLASH_ATTN_MLA_SPARSE") and capability[0] != 9:
        return "FlashAttention MLA not supported on this device"  # flash_attn_supports_mla(): FA3 on SM90
    if backend.name == "FLASHMLA":
        if sparse:
            if capability[0] not in (9, 10):
                return "FlashMLA Sparse is only supported on Hopper and Blackwell DC devices."
            return None
        if capability[0] != 9:
            return "FlashMLA Dense is only supported on Hopper devices."
    dims = backend.nope_dims_at(at)
    if dims is not None and qk_nope_head_dim is not None and qk_nope_head_dim not in dims:
        wanted = f"== {dims[0]}" if len(dims) == 1 else f"in {list(dims)}"
        return f"FlashInfer MLA kernel requires qk_nope_head_dim {wanted}, but got {qk_nope_head_dim}"
    return None


def select_mla_backend(*, capability: tuple[int, int], kv_cache_dtype: str, sparse: bool,
                       qk_nope_head_dim: int | None, version: VllmVersion | None,
                       candidates: Sequence[str] | None = None, num_heads: int | None = None,
                       head_size: int | None = None) -> BackendChoice:
    """Walk the priority list like vLLM's selector: the first backend with no reasons wins.

    ``num_heads`` is the attention heads per GPU (it orders the SM10x sparse backends)."""
    tried = list(candidates) if candidates is not None else mla_priority(
        capability, version, kv_cache_dtype=kv_cache_dtype, num_heads=num_heads, head_size=head_size)
    reasons: dict[str, list[str]] = {}
    for name in tried:
        why = backend_reasons(MLA_BACKENDS[name], capability=capability, kv_cache_dtype=kv_cache_dtype,
                              sparse=sparse, qk_nope_head_dim=qk_nope_head_dim, version=version)
        if not why:
            return BackendChoice(tuple(tried), reasons, name)
        reasons[name] = why
    return BackendChoice(tuple(tried), reasons, None)


_ARCH_RE = re.compile(r"^(?:sm_?)?(\d+)([af]?)$", re.IGNORECASE)
"""``sm90``, ``sm_90a`` (architecture-specific), ``sm_100f`` (family-specific): nvcc's spellings."""
_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)$")

GPU_CAPABILITIES: tuple[tuple[int, int], ...] = (
    (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9),
    (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1),
)
"""Every compute capability an NVIDIA GPU has (CUDA's list, Maxwell to Blackwell; 10.1 is Thor's
name before CUDA 13 called it 11.0). A ``--gpu-arch`` outside it names no GPU: ``sm1000`` would
read as capability 100.0, ``sm99999999999999999999999`` as a 23-digit major."""


def parse_gpu_arch(text: str) -> tuple[int, int]:
    """``sm90``, ``SM120``, ``sm_100a``, ``9.0`` or ``12.0`` -> ``(major, minor)``; ValueError for
    anything else, and for a well-formed name no GPU has (:data:`GPU_CAPABILITIES`)."""
    value = str(text).strip()
    dotted = _DOTTED_RE.match(value)
    capability: tuple[int, int] | None = None
    if dotted:
        capability = int(dotted.group(1)), int(dotted.group(2))
    else:
        match = _ARCH_RE.match(value)
        if match and value.lower().startswith("sm") and 2 <= len(match.group(1)) <= 4:
            digits = match.group(1)
            capability = int(digits[:-1]), int(digits[-1])
    if capability is None:
        raise ValueError(f"{text!r} is not a GPU architecture; expected sm90, sm100, sm120 or a compute "
                         "capability like 9.0 or 12.0")
    if capability not in GPU_CAPABILITIES:
        known = ", ".join(f"sm{major}{minor}" for major, minor in GPU_CAPABILITIES if major >= 7)
        raise ValueError(f"{text!r} is not a GPU architecture: no NVIDIA GPU has compute capability "
                         f"{capability[0]}.{capability[1]}; expected one of {known}")
    return capability


def format_arch(capability: tuple[int, int]) -> str:
    return f"SM{capability[0]}{capability[1]}"
