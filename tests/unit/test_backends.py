"""The MLA backend matrix: priority lists per architecture and vLLM version, reasons in vLLM's words."""

from __future__ import annotations

import pytest

from pytest_gpuready import parse_vllm_version
from pytest_gpuready.model.backends import (
    KV_CACHE_DTYPES,
    MLA_BACKENDS,
    backend_reasons,
    format_arch,
    mla_priority,
    parse_gpu_arch,
    select_mla_backend,
)

V017 = parse_vllm_version("0.17.0")
V018 = parse_vllm_version("0.18.0")
V028 = parse_vllm_version("0.28.0")
V033 = parse_vllm_version("0.33.0")


def test_priority_lists_follow_cuda_py() -> None:
    assert mla_priority((9, 0), V017) == ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA",
                                          "FLASHMLA_SPARSE"]
    assert mla_priority((10, 0), V017) == ["FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA",
                                           "TRITON_MLA", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"]
    # 0.17-0.23 have no SM12x branch: SM120 walks the generic list; 0.24 adds it
    assert mla_priority((12, 0), V017)[0] == "FLASH_ATTN_MLA"
    assert mla_priority((12, 0), parse_vllm_version("0.23.0"))[0] == "FLASH_ATTN_MLA"
    assert mla_priority((12, 0), parse_vllm_version("0.24.0")) == ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
    assert mla_priority((12, 1), None) == ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
    # TOKENSPEED_MLA is listed from 0.21 (not 0.33), behind FLASHINFER_MLA
    assert "TOKENSPEED_MLA" not in mla_priority((10, 0), V018)
    assert mla_priority((10, 0), parse_vllm_version("0.21.0"))[:3] == ["FLASHINFER_MLA", "TOKENSPEED_MLA",
                                                                       "CUTLASS_MLA"]
    # the Hopper sparse tail: FLASH_ATTN_MLA_SPARSE from 0.25, FLASHINFER_MLA_SPARSE_SM90 from 0.30
    assert mla_priority((9, 0), parse_vllm_version("0.24.0"))[4:] == ["FLASHMLA_SPARSE"]
    assert mla_priority((9, 0), V028)[4:] == ["FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"]
    assert mla_priority((9, 0), parse_vllm_version("0.32.0"))[4:] == [
        "FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90"]
    # SM10x sparse: FlashInfer first for a quantized KV cache (0.21+) or <= 16 heads per GPU (0.17+)
    assert mla_priority((10, 0), V033, kv_cache_dtype="fp8")[-2:] == ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
    assert mla_priority((10, 0), V033, num_heads=16)[-2:] == ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
    assert mla_priority((10, 0), V033, num_heads=64)[-2:] == ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"]


def test_every_backend_names_its_source() -> None:
    assert all(backend.source for backend in MLA_BACKENDS.values())
    listed = {name for cc in ((9, 0), (10, 0), (12, 0)) for name in mla_priority(cc, None)}
    assert listed == set(MLA_BACKENDS)


def test_triton_mla_fp8_kv_arrives_in_018() -> None:
    triton = MLA_BACKENDS["TRITON_MLA"]
    kwargs = {"capability": (12, 0), "kv_cache_dtype": "fp8_e4m3", "sparse": False, "qk_nope_head_dim": 128}
    assert backend_reasons(triton, version=V017, **kwargs) == ["kv_cache_dtype not supported"]  # type: ignore[arg-type]
    assert backend_reasons(triton, version=V018, **kwargs) == []  # type: ignore[arg-type]
    assert backend_reasons(triton, version=parse_vllm_version("0.11.0"), **kwargs) == []  # type: ignore[arg-type]


def test_reasons_come_in_validate_configurations_order() -> None:
    reasons = backend_reasons(MLA_BACKENDS["FLASHMLA_SPARSE"], capability=(12, 0), kv_cache_dtype="fp8_e4m3",
                              sparse=False, qk_nope_head_dim=128, version=V017)
    assert reasons == ["kv_cache_dtype not supported", "non-sparse not supported", "compute capability not supported"]
    sparse = backend_reasons(MLA_BACKENDS["TRITON_MLA"], capability=(9, 0), kv_cache_dtype="auto", sparse=True,
                             qk_nope_head_dim=128, version=V033)
    assert sparse == ["sparse not supported"]


def test_flashmla_dense_needs_hopper() -> None:
    reasons = backend_reasons(MLA_BACKENDS["FLASHMLA"], capability=(10, 0), kv_cache_dtype="auto", sparse=False,
                              qk_nope_head_dim=128, version=V017)
    assert reasons == ["FlashMLA Dense is only supported on Hopper devices."]


@pytest.mark.parametrize(("version", "dim", "reason"), [
    (V017, 64, "FlashInfer MLA kernel requires qk_nope_head_dim == 128, but got 64"),
    (V018, 64, None),
    (V018, 192, "FlashInfer MLA kernel requires qk_nope_head_dim in [64, 128], but got 192"),
    (V033, 192, None),
])
def test_flashinfer_mla_nope_head_dim(version: object, dim: int, reason: str | None) -> None:
    reasons = backend_reasons(MLA_BACKENDS["FLASHINFER_MLA"], capability=(10, 0), kv_cache_dtype="auto",
                              sparse=False, qk_nope_head_dim=dim, version=version)  # type: ignore[arg-type]
    assert reasons == ([] if reason is None else [reason])


def test_selection_and_reasons_text() -> None:
    choice = select_mla_backend(capability=(12, 0), kv_cache_dtype="fp8_e4m3", sparse=False,
                                qk_nope_head_dim=128, version=V017)
    assert choice.chosen is None
    assert choice.reasons_text().startswith("{FLASH_ATTN_MLA: [kv_cache_dtype not supported, compute capability "
                                            "not supported, FlashAttention MLA not supported on this device], "
                                            "FLASHMLA: [")
    hopper = select_mla_backend(capability=(9, 0), kv_cache_dtype="bfloat16", sparse=False,
                                qk_nope_head_dim=128, version=V017)
    assert hopper.chosen == "FLASH_ATTN_MLA"
    assert hopper.reasons == {}


def test_sparse_mla_on_sm120_from_028() -> None:
    choice = select_mla_backend(capability=(12, 0), kv_cache_dtype="fp8_e4m3", sparse=True,
                                qk_nope_head_dim=128, version=V033)
    assert choice.chosen == "FLASHINFER_MLA_SPARSE_SM120"
    assert choice.reasons == {"TRITON_MLA": ["sparse not supported"]}


@pytest.mark.parametrize(("text", "capability"), [
    ("sm90", (9, 0)), ("SM120", (12, 0)), ("sm_100a", (10, 0)), ("sm121", (12, 1)), ("9.0", (9, 0)),
    ("12.0", (12, 0)), ("sm89", (8, 9)), ("sm103", (10, 3)),
])
def test_parse_gpu_arch(text: str, capability: tuple[int, int]) -> None:
    assert parse_gpu_arch(text) == capability
    assert format_arch(capability).lower() == "sm" + "".join(map(str, capability))


@pytest.mark.parametrize("text", ["hopper", "90", "sm9", "12", "", "sm-90"])
def test_parse_gpu_arch_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a GPU architecture") as info:
        parse_gpu_arch(text)
    assert str(info.value) == (f"{text!r} is not a GPU architecture; expected sm90, sm100, sm120 or a compute "
                               "capability like 9.0 or 12.0")


def test_kv_cache_dtypes_include_vllms_017_choices() -> None:
    assert {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"} <= set(KV_CACHE_DTYPES)


def test_combination_reasons_read_in_vllm_032() -> None:
    # flash_attn_supports_mla() is FA3 on SM90; FlashMLA's sparse kernel runs on Hopper and Blackwell DC
    v032 = parse_vllm_version("0.32.0")
    assert backend_reasons(MLA_BACKENDS["FLASH_ATTN_MLA"], capability=(8, 0), kv_cache_dtype="auto", sparse=True,
                           qk_nope_head_dim=128, version=v032) == [
        "sparse not supported", "compute capability not supported", "FlashAttention MLA not supported on this device"]
    assert backend_reasons(MLA_BACKENDS["FLASHMLA"], capability=(8, 9), kv_cache_dtype="auto", sparse=True,
                           qk_nope_head_dim=128, version=v032) == [
        "sparse not supported", "compute capability not supported",
        "FlashMLA Sparse is only supported on Hopper and Blackwell DC devices."]
