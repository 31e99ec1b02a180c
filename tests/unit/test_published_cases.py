"""The planner and the memory model against published deployments: each class of issue 20 with the
real case, its source and vLLM's own figure or words (the table in docs/plan.md, "Published cases").

The GPUs are the presets (``pytest_gpuready/plan/presets.py``), whose CUDA totals carry their
sources; the configs are the real ones in tests/data/configs (SOURCES.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.checks import check_memory_fit, kv_cache_bytes_per_token, memory_plan
from pytest_gpuready.model.memory import GIB, MIB, SpeculativeSettings
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.model.spec import ModelSpec, derived_weights_for, model_spec_from_config
from pytest_gpuready.model.vllm_version import parse_vllm_version
from pytest_gpuready.plan.presets import PRESETS, closest_preset, parse_gpus, preset_snapshot

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
V019 = parse_vllm_version("0.19.0")
V011 = parse_vllm_version("0.11.0")


def config(name: str, **overrides: Any) -> ModelSpec:
    data = json.loads((CONFIGS / f"{name}.json").read_text())
    data.update(overrides)
    return model_spec_from_config(data, name=name)


def h100(count: int = 1) -> HostSnapshot:
    return preset_snapshot(*parse_gpus(f"{count}xH100-80GB"))


def cuda_total(preset: str) -> int:
    p = PRESETS[preset.lower()]
    return (p.memory_total_mib - p.memory_reserved_mib) * MIB


# ---------------------------------------------------------------- after the KV cache is sized

def test_gpt_oss_20b_on_one_h100_at_095_is_a_misfit_in_vllms_words() -> None:
    """gpt-oss-20b, one H100 80GB, 0.95, vLLM 0.19.0 (issue 20): vLLM logs ``Available KV cache
    memory: 58.47 GiB`` and then ``CUDA out of memory occurred when warming up sampler with 1024
    dummy requests``. The sampler's 3.45 GiB and the 0.66 GiB of graphs exceed the 3.96 GiB
    outside the budget."""
    model = config("openai__gpt-oss-20b")
    verdict = check_memory_fit(model, h100(), 1, gpu_memory_utilization=0.95, vllm_version=V019)
    assert not verdict.ok
    assert verdict.needs is None
    assert "CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try " \
           "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine." in verdict.summary
    available = verdict.evidence["kv_cache_bytes"] / GIB
    assert abs(available - 58.47) / 58.47 < 0.01, available
    # The same model at vLLM's default 0.9 fits (the common deployment), and so does 0.95 with
    # fewer sequences, as vLLM's message suggests.
    assert check_memory_fit(model, h100(), 1, gpu_memory_utilization=0.9, vllm_version=V019).ok
    assert check_memory_fit(model, h100(), 1, gpu_memory_utilization=0.95, max_num_seqs=256,
                            vllm_version=V019).ok


def test_gpt_oss_120b_at_tp2_095_on_h100_is_a_misfit() -> None:
    """vLLM's gpt-oss recipe warns of 0.95 on H100 (issue 20); gpt-oss-120b is the 20b's
    architecture with 36 layers and 128 experts (its config.json), TP=2, vLLM 0.19."""
    layer_types = ["sliding_attention", "full_attention"] * 18
    model = config("openai__gpt-oss-20b", num_hidden_layers=36, num_local_experts=128, layer_types=layer_types)
    verdict = check_memory_fit(model, h100(2), 2, gpu_memory_utilization=0.95, vllm_version=V019)
    assert not verdict.ok
    assert "warming up sampler with 1024 dummy requests" in verdict.summary


def test_qwen3_32b_tp2_095_sampler_warm_up() -> None:
    """llm-d's nightly (https://github.com/llm-d/llm-d/issues/787): Qwen/Qwen3-32B at TP=2, 0.95,
    vLLM 0.11.0: ``KV cache allocated: 41.87 GiB per worker`` then the sampler warm-up OOM. The
    architecture is Qwen3-32B-FP8's config less its quantization (the same model, bf16); the GPU
    is taken as an H100 80GB (the report does not name it)."""
    data = json.loads((CONFIGS / "Qwen__Qwen3-32B-FP8.json").read_text())
    data.pop("quantization_config")
    model = model_spec_from_config(data, name="Qwen3-32B")
    verdict = check_memory_fit(model, h100(2), 2, gpu_memory_utilization=0.95, vllm_version=V011)
    assert not verdict.ok
    assert "warming up sampler with 1024 dummy requests" in verdict.summary
    # 40.23 GiB predicted: -3.9%, with the H100 assumed and the 1.6 GiB TP communicator term.
    assert abs(verdict.evidence["kv_cache_bytes"] / GIB - 41.87) / 41.87 < 0.05


# ---------------------------------------------------------------- float32

def test_float32_doubles_the_kv_bytes_llama_8b_h100() -> None:
    """Llama-3.1-8B, ``--dtype float32``, one H100 80GB at 0.95, vLLM 0.19 (issue 20): vLLM logged
    ``GPU KV cache size: 175,296 tokens``; before, the model predicted 350,896 (bf16 KV bytes)."""
    model = config("meta-llama__Llama-3.1-8B")
    assert kv_cache_bytes_per_token(model, 1, "auto", dtype="float32") == 262_144
    assert kv_cache_bytes_per_token(model, 1, "auto") == 131_072
    plan = memory_plan(model, cuda_total("H100-80GB"), ServeArgs(gpu_memory_utilization=0.95, dtype="float32"),
                       version=V019, gpu_name="NVIDIA H100 80GB HBM3")
    assert plan.kv_bytes_per_token == 262_144
    assert abs(plan.kv_tokens - 175_296) / 175_296 < 0.01, plan.kv_tokens


# ---------------------------------------------------------------- versions

@pytest.mark.parametrize("version", ["0.6.3", "0.8.5", "0.10.1.1"])
def test_a_v0_engine_version_is_undecided_naming_the_modelled_range(version: str) -> None:
    """Before 0.11 the V0 engine sized the KV cache (over-predicted by 28-70% on a 24 GB GPU,
    issue 20): no figure from the V1 accounting, *undecided* with the range that is modelled."""
    model = config("meta-llama__Llama-3.1-8B")
    snapshot = preset_snapshot(*parse_gpus("1xRTX-4090"))
    verdict = check_memory_fit(model, snapshot, 1, max_model_len=8192, vllm_version=version)
    assert verdict.needs is not None
    assert not verdict.ok
    assert "0.11 to 0.33" in verdict.needs
    assert f"vLLM {version} is not modelled" in verdict.summary
    assert "kv_cache_tokens" not in verdict.evidence
    assert check_memory_fit(model, snapshot, 1, max_model_len=8192, vllm_version="0.11.0").needs is None


def test_a_version_newer_than_the_newest_read_says_so() -> None:
    model = config("meta-llama__Llama-3.1-8B")
    verdict = check_memory_fit(model, h100(), 1, max_model_len=8192, vllm_version="0.40.0")
    assert verdict.ok
    assert "newer than the newest read, 0.33" in (verdict.rule_set or "")


# ---------------------------------------------------------------- shared experts spelled another way

def test_llama4_scout_counts_its_shared_expert() -> None:
    """Llama-4-Scout-17B-16E-Instruct (config: aiconfigurator's copy, SOURCES.md) at TP=4: vLLM
    logged 53.12 GiB per GPU (issue 20); without the shared expert the derivation said 47.4. Its
    vision tower (about 0.8 B parameters) is not derived, so the text model stays below the log."""
    model = config("meta-llama__Llama-4-Scout-17B-16E-Instruct")
    assert (model.shared_expert_intermediate_size, model.moe_intermediate_size) == (8192, 8192)
    per_gpu = derived_weights_for(model).per_gpu_bytes(4) / GIB
    assert 50.0 < per_gpu < 53.12, per_gpu
    assert abs(per_gpu - 53.12) / 53.12 < 0.06


# ---------------------------------------------------------------- speculative decoding

def test_speculative_decoding_adds_its_memory() -> None:
    """An EAGLE head: its weights, one more layer of KV pages, and the rejection sampler's target
    logits in the warm-up (``_dummy_sampler_run`` with a speculative config)."""
    model = config("meta-llama__Llama-3.1-8B")
    plain = memory_plan(model, cuda_total("H100-80GB"), ServeArgs(), version=V019)
    spec = SpeculativeSettings(num_speculative_tokens=3, draft_layers=1, draft_weight_bytes=int(0.5 * GIB))
    drafted = memory_plan(model, cuda_total("H100-80GB"), ServeArgs(), version=V019, speculative=spec)
    assert drafted.terms[0].bytes == plain.terms[0].bytes + int(0.5 * GIB)
    assert drafted.kv_bytes_per_token == plain.kv_bytes_per_token * 33 // 32
    assert drafted.term("sampler warm-up").bytes == plain.term("sampler warm-up").bytes + 1024 * 128_256 * 2


# ---------------------------------------------------------------- presets

@pytest.mark.parametrize(("name", "cc", "nvlink"), [
    ("A6000", (8, 6), False), ("L40", (8, 9), False), ("L4", (8, 9), False), ("A10G", (8, 6), False),
    ("A800", (8, 0), True), ("H20", (9, 0), True), ("H800", (9, 0), True), ("B200", (10, 0), True),
    ("GB200", (10, 0), True), ("RTX-4090", (8, 9), False), ("RTX-5090", (12, 0), False), ("V100", (7, 0), True),
    ("T4", (7, 5), False),
])
def test_every_preset_has_capability_link_and_memory_source(name: str, cc: tuple[int, int], nvlink: bool) -> None:
    preset = PRESETS[name.lower()]
    assert (preset.compute_capability, preset.nvlink) == (cc, nvlink)
    assert preset.source
    assert 0 <= preset.memory_reserved_mib < preset.memory_total_mib // 20
    gpus = preset_snapshot(2, preset)
    assert gpus.require_gpus()[0].compute_capability == cc


@pytest.mark.parametrize(("preset", "cuda_gib"), [
    ("H100-80GB", 79.19), ("A100-80GB", 79.15), ("RTX-4090", 23.64), ("RTX-3090", 23.69), ("RTX-5090", 31.36),
    ("B200", 178.35), ("T4", 14.56), ("A10G", 22.06),
])
def test_presets_report_the_memory_cuda_sees(preset: str, cuda_gib: float) -> None:
    """The figures the logs quote (``GPU 0 has a total capacity of ...``), each with its link."""
    assert round(PRESETS[preset.lower()].cuda_total_gib, 2) == cuda_gib
    assert "http" in PRESETS[preset.lower()].source or "reproduces" in PRESETS[preset.lower()].source


def test_gpus_suggests_the_closest_preset() -> None:
    with pytest.raises(ConfigError) as info:
        parse_gpus("8xH100")
    assert str(info.value).startswith("--gpus '8xH100': unknown GPU 'H100' (did you mean H100-80GB?); expected "
                                      "one of H100-80GB, ")
    assert (closest_preset("rtx5090"), closest_preset("a100"), closest_preset("quadro")) == \
        ("RTX-5090", "A100-80GB", None)


# ---------------------------------------------------------------- KV dtype aliases

@pytest.mark.parametrize("version", ["0.17.0", "0.25.0", "0.32.0"])
def test_sparse_mla_fp8_is_fp8_ds_mla_on_hopper(version: str) -> None:
    """DeepSeek-V3.2 (FP8) with ``--kv-cache-dtype fp8`` on H100/H200 loads: vLLM's
    ``DeepseekV32ForCausalLM.verify_and_update_config`` logs "Using custom fp8 kv-cache format for
    DeepSeekV3.2" and uses ``fp8_ds_mla``, which FLASHMLA_SPARSE accepts (the plugin used to say no
    backend exists). Its pages are 656 bytes per token per layer."""
    from pytest_gpuready.model.checks import check_mla_kv_backend

    model = config("deepseek-ai__DeepSeek-V3.2")
    verdict = check_mla_kv_backend(model, (9, 0), "fp8", version, tp=8)
    assert verdict.ok, verdict.summary
    assert "fp8_ds_mla: vLLM would use FLASHMLA_SPARSE" in verdict.summary
    assert kv_cache_bytes_per_token(model, 8, "fp8") == 61 * 656


# ---------------------------------------------------------------- layouts that are not powers of two

def test_non_power_of_two_layouts_are_rows_with_vllms_failure() -> None:
    """Six- and ten-GPU boxes: TP=3 and 6 (5 and 10) are rows, failing as vLLM fails, e.g.
    Llama-3.1-8B's 32 heads at TP=3 and Mixtral-8x22B's vocab 32000 at TP=3 (before its 8 KV heads)."""
    from pytest_gpuready.plan.planner import plan_layouts

    llama = config("meta-llama__Llama-3.1-8B")
    rows = plan_layouts(llama, preset_snapshot(*parse_gpus("6xL40S")), model_path="/m", vllm_version=V019)
    by_tp = {r.layout.tp: r for r in rows if r.layout.pp == 1 and r.layout.dp == 1}
    assert {3, 6} <= set(by_tp)
    assert "Total number of attention heads (32) must be divisible by tensor parallel size (3)" in by_tp[3].reason
    ten = plan_layouts(llama, preset_snapshot(*parse_gpus("10xL40S")), model_path="/m", vllm_version=V019)
    assert {5, 10} <= {r.layout.tp for r in ten}
    mixtral = config("mistralai__Mixtral-8x22B-v0.1")
    rows = plan_layouts(mixtral, preset_snapshot(*parse_gpus("6xH100-80GB")), model_path="/m", vllm_version=V019)
    tp3 = next(r for r in rows if r.layout.tp == 3 and r.layout.pp == 1 and r.layout.dp == 1)
    assert tp3.status == "fails"
    assert "32000" in tp3.reason


# ---------------------------------------------------------------- NVFP4 MoE backend selection

NEMOTRON_NVFP4_QUANT = {"producer": {"name": "modelopt"},
                        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16}}
"""The NVFP4 checkpoint's quantization as its model card and vllm#52308 give it (ModelOpt NVFP4,
FP8 KV cache); the architecture is the BF16 checkpoint's config (SOURCES.md)."""


def nvfp4_spec(name: str, hf_quant_config: dict[str, Any] | None = None) -> ModelSpec:
    quant = CONFIGS / f"{name}.hf_quant_config.json"
    return model_spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name,
                                  hf_quant_config=hf_quant_config or json.loads(quant.read_text()))


NEMOTRON = "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
DSV4 = "nvidia__DeepSeek-V4-Flash-NVFP4"
NO_BACKEND = "No NvFp4 MoE backend supports the deployment configuration."


def test_nemotron_nano_nvfp4_on_rtx_5090_has_no_moe_backend_on_015() -> None:
    """vllm-project/vllm#35065: NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4 on an RTX 5090 (SM120) stops
    with ``No NvFp4 MoE backend supports the deployment configuration``. Its experts are
    non-gated ReLU^2; in 0.15 the SM120 kernels are gated-only and FlashInfer CUTLASS is SM90/SM100
    only. 0.16 opens FlashInfer CUTLASS to SM120 (vllm#33417); vllm#52308 runs it on SM120 (0.27)."""
    from pytest_gpuready import Layout, check_deployment

    model = nvfp4_spec(NEMOTRON, NEMOTRON_NVFP4_QUANT)
    check = check_deployment(model, Layout(tp=1), "sm120", "0.15.1")
    assert check.word == "fails"
    assert check.first_failure is not None
    assert check.first_failure[0] == "nvfp4_moe_backend"
    assert check.reason.endswith(NO_BACKEND)
    verdict = check.first_failure[1]
    assert verdict.evidence["reasons"] == {
        "FLASHINFER_TRTLLM": "kernel does not support current device",
        "FLASHINFER_CUTEDSL": "kernel does not support current device",
        "FLASHINFER_CUTLASS": "kernel does not support current device",
        "VLLM_CUTLASS": "kernel does not support no act_and_mul MLP layer",
        "MARLIN": "kernel does not support no act_and_mul MLP layer"}
    assert ("NvFp4 MoE backend 'MARLIN' does not support the deployment configuration since kernel does not "
            "support no act_and_mul MLP layer.") in verdict.details
    for version, chosen in (("0.16.0", "FLASHINFER_CUTLASS"), ("0.27.0", "FLASHINFER_CUTLASS")):
        later = check_deployment(model, Layout(tp=1), "sm120", version).verdicts["nvfp4_moe_backend"]
        assert later.ok, (version, later.summary)
        assert later.evidence["chosen"] == chosen, version
    # On a B200 (SM100) the same 0.15 finds FlashInfer CUTLASS, which takes non-gated experts.
    assert check_deployment(model, Layout(tp=1), "sm100", "0.15.0").verdicts["nvfp4_moe_backend"].ok


def test_deepseek_v4_flash_nvfp4_swiglu_limit_leaves_only_trtllm_on_022() -> None:
    """vllm-project/vllm#45661: DeepSeek-V4-Flash-NVFP4 (ModelOpt MIXED_PRECISION, NVFP4 experts)
    on an RTX PRO 6000 (SM120): ``NotImplementedError: No NvFp4 MoE backend supports the deployment
    configuration.`` Its ``swiglu_limit: 10.0`` restricts the oracle to the backends that apply
    the clamp, in 0.22-0.23 only FLASHINFER_TRTLLM, an SM100 kernel; 0.24 adds FlashInfer CUTLASS
    and Marlin."""
    from pytest_gpuready import Layout, check_deployment

    model = nvfp4_spec(DSV4)
    for version in ("0.22.0", "0.23.0"):
        check = check_deployment(model, Layout(tp=1), (12, 0), version)
        assert check.word == "fails", version
        verdict = check.verdicts["nvfp4_moe_backend"]
        assert verdict.summary.endswith(NO_BACKEND)
        assert verdict.evidence["tried"] == ["FLASHINFER_TRTLLM"]
        assert verdict.evidence["swiglu_limit"] == 10.0
        assert ("NvFp4 MoE backend 'FLASHINFER_TRTLLM' does not support the deployment configuration since "
                "kernel does not support current device SM120.") in verdict.details
    assert check_deployment(model, Layout(tp=1), (10, 0), "0.22.0").verdicts["nvfp4_moe_backend"].ok
    for version in ("0.21.0", "0.24.0", "0.32.0"):
        assert check_deployment(model, Layout(tp=1), (12, 0), version).verdicts["nvfp4_moe_backend"].ok, version


def test_nvfp4_moe_rule_is_undecided_where_it_cannot_see() -> None:
    """Before 0.15 vLLM had no oracle (a fixed CUTLASS-or-Marlin choice): undecided, naming the range
    read; without the GPU's capability: undecided; a non-NVFP4 model: does not apply."""
    from pytest_gpuready import Layout
    from pytest_gpuready.model.rules import check_nvfp4_moe_backend

    model = nvfp4_spec(NEMOTRON, NEMOTRON_NVFP4_QUANT)
    old = check_nvfp4_moe_backend(model, Layout(tp=1), "sm120", "0.14.1")
    assert old.needs is not None
    assert "0.15 to 0.33" in old.needs
    assert check_nvfp4_moe_backend(model, Layout(tp=1), None, "0.15.0").needs is not None
    assert check_nvfp4_moe_backend(config("openai__gpt-oss-20b"), Layout(tp=1), "sm120", "0.15.0").ok
