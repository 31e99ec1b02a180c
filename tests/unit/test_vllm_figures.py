"""Each class of vLLM load error, quoted with vLLM's own figures in vLLM's own words.

Every verdict below must contain vLLM's sentence, its numbers filled in, as the format string
in vLLM's source has it (shared/reference/vllm-invariants.md gives each with its location), so
a user can match the preflight's line against the startup log's. One test per message class;
each asserts the figure vLLM would print.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from pytest_gpuready import Layout, check_deployment
from pytest_gpuready.model.checks import check_fp8_block_alignment, check_mla_kv_backend, check_tp_divisibility
from pytest_gpuready.model.rules import check_world_size
from pytest_gpuready.model.spec import ModelSpec, model_spec_from_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def spec(name: str) -> ModelSpec:
    quant = CONFIGS / f"{name}.hf_quant_config.json"
    return model_spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name,
                                  hf_quant_config=json.loads(quant.read_text()) if quant.exists() else None)


def quoted(pattern: str, text: str) -> tuple[str, ...]:
    """The figures of vLLM's sentence ``pattern`` (a regex with groups) found in ``text``."""
    match = re.search(pattern, text)
    assert match is not None, f"vLLM's wording {pattern!r} is not in {text!r}"
    return match.groups()


def test_heads_quote_the_head_count_and_the_tp_size() -> None:
    """``Total number of attention heads ({H}) must be divisible by tensor parallel size ({tp}).``
    (``ModelConfig.verify_with_parallel_config``)."""
    verdict = check_tp_divisibility(spec("MiniMaxAI__MiniMax-M2.5"), 5)
    assert quoted(r"Total number of attention heads \((\d+)\) must be divisible by tensor parallel size "
                  r"\((\d+)\)\.", verdict.summary) == ("48", "5")


def test_divide_quotes_both_numbers() -> None:
    """``{a} is not divisible by {b}`` (``vllm/distributed/utils.py`` ``divide``): Mixtral's padded vocab."""
    verdict = check_tp_divisibility(spec("mistralai__Mixtral-8x22B-v0.1"), 3)
    assert quoted(r": (\d+) is not divisible by (\d+)", verdict.summary) == ("32000", "3")


def test_expert_count_is_quoted() -> None:
    """``Tensor parallel size {tp} is greater than the number of experts {E}.`` (``minimax_m2.py``)."""
    few = replace(spec("MiniMaxAI__MiniMax-M2.5"), num_experts=4, num_attention_heads=8)
    verdict = check_tp_divisibility(few, 8)
    assert quoted(r"Tensor parallel size (\d+) is greater than the number of experts (\d+)\.",
                  verdict.summary) == ("8", "4")


def test_fp8_block_quotes_the_shard_and_the_block() -> None:
    """``Weight input_size_per_partition = {n} is not divisible by weight quantization block_k = {k}.``
    (``validate_fp8_block_shape``): DeepSeek-V3's dense MLP at TP=32 is 576 wide per GPU."""
    verdict = check_fp8_block_alignment(spec("deepseek-ai__DeepSeek-V3"), 32, vllm_version="0.17.0")
    assert quoted(r"Weight input_size_per_partition = (\d+) is not divisible by weight quantization "
                  r"block_k = (\d+)\.", verdict.summary) == ("576", "128")


def test_fp8_moe_block_quotes_the_expert_shard() -> None:
    """``The output_size of gate's and up's weight = {ispp} is not divisible by weight quantization
    block_n = {n}.`` (``Fp8MoEMethod.create_weights``, <= 0.28): MiniMax-M2.5 at TP=8."""
    verdict = check_fp8_block_alignment(spec("MiniMaxAI__MiniMax-M2.5"), 8, vllm_version="0.17.0")
    assert quoted(r"The output_size of gate's and up's weight = (\d+) is not divisible by weight quantization "
                  r"block_n = (\d+)\.", verdict.summary) == ("192", "128")


def test_mla_selector_quotes_the_head_size_576() -> None:
    """``No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, ...)``
    (``vllm/platforms/cuda.py``): DeepSeek-V3.2's sparse MLA on SM80."""
    verdict = check_mla_kv_backend(spec("deepseek-ai__DeepSeek-V3.2"), (8, 0), "auto", "0.32.0", tp=8)
    assert quoted(r"No valid attention backend found for cuda with AttentionSelectorConfig\(head_size=(\d+),",
                  verdict.summary) == ("576",)


def test_world_size_quotes_both_gpu_counts() -> None:
    """``World size ({ws}) is larger than the number of available GPUs ({n}) in this node.``"""
    verdict = check_world_size(Layout(tp=8, pp=2), 8)
    assert quoted(r"World size \((\d+)\) is larger than the number of available GPUs \((\d+)\) in this node\.",
                  verdict.summary) == ("16", "8")


def test_quantization_capability_quotes_both_capabilities() -> None:
    """``... Minimum capability: {min}. Current capability: {cap}.`` (``VllmConfig._get_quantization_config``)."""
    check = check_deployment(spec("openai__gpt-oss-20b"), Layout(tp=1), (7, 5), "0.32.0")
    assert quoted(r"The quantization method (\w+) is not supported for the current GPU\. Minimum capability: "
                  r"(\d+)\. Current capability: (\d+)\.", check.reason) == ("mxfp4", "80", "75")


def test_nvfp4_moe_backend_quotes_each_backend_and_its_reason() -> None:
    """``NvFp4 MoE backend '{name}' does not support the deployment configuration since {reason}.``
    then ``No NvFp4 MoE backend supports the deployment configuration.`` (``oracle/nvfp4.py``)."""
    check = check_deployment(spec("nvidia__DeepSeek-V4-Flash-NVFP4"), Layout(tp=1), (12, 0), "0.22.0")
    verdict = check.verdicts["nvfp4_moe_backend"]
    assert check.reason.endswith("No NvFp4 MoE backend supports the deployment configuration.")
    assert quoted(r"NvFp4 MoE backend '(\w+)' does not support the deployment configuration since kernel does "
                  r"not support current device (SM\d+)\.", "\n".join(verdict.details)) == (
                      "FLASHINFER_TRTLLM", "SM120")
