"""ModelSpec from public configs and from checkpoint directories; malformed input named precisely."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready import ConfigError, LocalHost, ModelSpec, inspect_model, model_spec_from_config
from tests.checkpoints import small_tensors, write_checkpoint

CONFIGS = Path(__file__).parent.parent / "data" / "configs"


def public(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def spec(name: str) -> ModelSpec:
    return model_spec_from_config(public(name), name=name)


def test_minimax_m25_expert_width_is_intermediate_size() -> None:
    model = spec("MiniMaxAI__MiniMax-M2.5")
    assert (model.model_type, model.num_layers, model.hidden_size) == ("minimax_m2", 62, 3072)
    assert model.expert_ffn_key == "intermediate_size"
    assert (model.moe_intermediate_size, model.intermediate_size) == (1536, None)
    assert (model.num_experts, model.num_experts_per_tok, model.shared_expert_intermediate_size) == (256, 8, 0)
    assert (model.num_attention_heads, model.num_kv_heads, model.head_dim) == (48, 8, 128)
    assert model.attention_output_size == 6144
    assert not model.is_mla
    assert model.is_moe
    assert (model.dense_layer_count, model.moe_layer_count) == (0, 62)
    quant = model.quantization
    assert quant is not None
    assert (quant.method, quant.weight_block_size, quant.activation_scheme) == ("fp8", (128, 128), "dynamic")
    assert quant.excluded_modules == ("gate", "e_score_correction_bias", "lm_head")
    assert quant.kv_cache_dtype is None


def test_deepseek_v3_mla_dense_and_shared_experts() -> None:
    model = spec("deepseek-ai__DeepSeek-V3")
    assert model.is_mla
    assert model.mla_head_size == 576
    assert (model.kv_lora_rank, model.q_lora_rank, model.qk_rope_head_dim, model.qk_nope_head_dim,
            model.v_head_dim) == (512, 1536, 64, 128, 128)
    assert (model.intermediate_size, model.moe_intermediate_size, model.expert_ffn_key) == (
        18432, 2048, "moe_intermediate_size")
    assert (model.num_shared_experts, model.shared_expert_intermediate_size) == (1, 2048)
    assert (model.first_k_dense_replace, model.dense_layer_count, model.moe_layer_count) == (3, 3, 58)
    assert model.attention_output_size == 128 * 128
    assert model.num_nextn_predict_layers == 1
    assert model.vocab_size == 129280


def test_kimi_k25_nvfp4_nested_text_config_and_kv_request() -> None:
    model = spec("nvidia__Kimi-K2.5-NVFP4")
    assert (model.model_type, model.text_model_type) == ("kimi_k25", "deepseek_v3")
    assert model.architectures == ("KimiK25ForConditionalGeneration",)
    assert model.is_mla
    assert model.mla_head_size == 576
    assert (model.num_experts, model.num_layers, model.first_k_dense_replace) == (384, 61, 1)
    quant = model.quantization
    assert quant is not None
    assert (quant.method, quant.algo, quant.weight_block_size) == ("modelopt", "NVFP4", None)
    assert quant.kv_cache_dtype == "fp8_e4m3"
    assert quant.kv_cache_source == "config.json quantization_config.kv_cache_scheme (ModelOpt)"
    assert "language_model.model.layers.0.self_attn*" in quant.excluded_modules


def test_llama_unquantized_head_dim_derived() -> None:
    model = spec("meta-llama__Llama-3.1-8B")
    assert model.quantization is None
    assert model.head_dim == 4096 // 32
    assert not model.is_moe
    assert not model.is_mla
    assert model.dense_layer_count == 32
    assert model.describe() == "meta-llama__Llama-3.1-8B (llama, 32 layers, GQA, unquantized)"


def test_kv_lora_rank_outside_vllms_mla_list_is_not_mla() -> None:
    config = public("meta-llama__Llama-3.1-8B") | {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert not model_spec_from_config(config).is_mla


def test_compressed_tensors_block_structure_and_kv_scheme() -> None:
    config = public("meta-llama__Llama-3.1-8B") | {"quantization_config": {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "type": "float", "num_bits": 8, "strategy": "block", "block_structure": [128, 128]}}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True},
    }}
    quant = model_spec_from_config(config).quantization
    assert quant is not None
    assert (quant.method, quant.algo, quant.weight_block_size) == ("compressed-tensors", "float8", (128, 128))
    assert quant.excluded_modules == ("lm_head",)
    assert quant.kv_cache_dtype == "fp8"
    assert quant.kv_cache_source == "config.json quantization_config.kv_cache_scheme (compressed-tensors)"


def test_legacy_hf_quant_config_used_when_config_has_none() -> None:
    legacy = {"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16, "exclude_modules": ["lm_head"]}}
    quant = model_spec_from_config(public("meta-llama__Llama-3.1-8B"), hf_quant_config=legacy).quantization
    assert quant is not None
    assert (quant.method, quant.algo, quant.kv_cache_dtype) == ("modelopt_fp4", "NVFP4", "fp8_e4m3")
    assert quant.kv_cache_source == "hf_quant_config.json quantization.kv_cache_quant_algo (ModelOpt, legacy)"
    assert quant.excluded_modules == ("lm_head",)


@pytest.mark.parametrize(("legacy", "message"), [
    ({"producer": {}}, "hf_quant_config.json: key 'quantization' is missing; expected an object with "
                       "quant_algo and kv_cache_quant_algo"),
    ({"quantization": {"quant_algo": 4}}, "hf_quant_config.json: key 'quantization.quant_algo' is 4; "
                                          "expected a string such as FP8 or NVFP4"),
])
def test_malformed_legacy_quant_config(legacy: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        model_spec_from_config(public("meta-llama__Llama-3.1-8B"), hf_quant_config=legacy)
    assert str(info.value) == message


def _without(config: dict[str, Any], *path: str) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    target = changed
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return changed


def _with(config: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


LLAMA = "meta-llama__Llama-3.1-8B"
MINIMAX = "MiniMaxAI__MiniMax-M2.5"
KIMI = "nvidia__Kimi-K2.5-NVFP4"
DEEPSEEK = "deepseek-ai__DeepSeek-V3"


@pytest.mark.parametrize(("name", "change", "message"), [
    (LLAMA, lambda c: _without(c, "num_hidden_layers"),
     "config.json: key 'num_hidden_layers' is missing; expected a whole number >= 1 (the number of "
     "transformer layers)"),
    (LLAMA, lambda c: _with(c, "4096", "hidden_size"),
     "config.json: key 'hidden_size' is \"4096\"; expected a whole number >= 1 (the model width)"),
    (LLAMA, lambda c: _with(c, 0, "num_attention_heads"),
     "config.json: key 'num_attention_heads' is 0; expected a whole number >= 1 (query heads)"),
    (LLAMA, lambda c: _with(c, True, "vocab_size"),
     "config.json: key 'vocab_size' is true; expected a whole number >= 1 (tokenizer vocabulary size)"),
    (LLAMA, lambda c: _with(c, 3000, "hidden_size"),
     "config.json: key 'head_dim' is missing and hidden_size 3000 is not a multiple of "
     "num_attention_heads 32; expected an explicit head_dim"),
    (LLAMA, lambda c: _with(c, "yes", "tie_word_embeddings"),
     "config.json: key 'tie_word_embeddings' is \"yes\"; expected true or false"),
    (LLAMA, lambda c: _with(c, "llama", "architectures"),
     "config.json: key 'architectures' is \"llama\"; expected a list of class names"),
    (KIMI, lambda c: _without(c, "text_config", "num_hidden_layers"),
     "config.json: key 'text_config.num_hidden_layers' is missing; expected a whole number >= 1 (the "
     "number of transformer layers)"),
    (KIMI, lambda c: _with(c, -1, "text_config", "n_routed_experts"),
     "config.json: key 'text_config.n_routed_experts' is -1; expected a whole number >= 0"),
    (KIMI, lambda c: _with(c, "deepseek", "text_config"),
     "config.json: key 'text_config' is \"deepseek\"; expected an object with the language model's config"),
    (DEEPSEEK, lambda c: _without(c, "moe_intermediate_size"),
     "config.json: the config has 256 experts (n_routed_experts) but key 'moe_intermediate_size' is "
     "missing; expected the expert FFN width"),
    (DEEPSEEK, lambda c: _with(c, [128], "quantization_config", "weight_block_size"),
     "config.json: key 'quantization_config.weight_block_size' is [128]; expected [block_n, block_k], "
     "two whole numbers > 0 (vLLM: the quantization block size of weight must have 2 dimensions)"),
    (DEEPSEEK, lambda c: _without(c, "quantization_config", "quant_method"),
     "config.json: key 'quantization_config.quant_method' is missing; expected a string such as fp8, "
     "compressed-tensors or modelopt"),
    (DEEPSEEK, lambda c: _with(c, "fp8", "quantization_config"),
     "config.json: key 'quantization_config' is \"fp8\"; expected an object"),
    (DEEPSEEK, lambda c: _without(c, "qk_rope_head_dim"),
     "config.json: key 'qk_rope_head_dim' is missing; expected a whole number (MLA models need it "
     "with kv_lora_rank)"),
    (MINIMAX, lambda c: _with(c, "gate", "quantization_config", "modules_to_not_convert"),
     "config.json: key 'quantization_config.modules_to_not_convert' is \"gate\"; expected a list of "
     "module names"),
    (MINIMAX, lambda c: _without(c, "intermediate_size"),
     "config.json: the config has 256 experts (num_local_experts) but key 'intermediate_size' is "
     "missing; expected the expert FFN width (MiniMax-M2 and Mixtral configs keep it there)"),
])
def test_malformed_config_names_file_key_and_expectation(name: str, change: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        model_spec_from_config(change(public(name)))
    assert str(info.value) == message


def test_config_that_is_not_an_object() -> None:
    with pytest.raises(ConfigError, match=r"^config.json: expected a JSON object, got list$"):
        model_spec_from_config([])  # type: ignore[arg-type]


# ---------------------------------------------------------------- directories

def tiny_config() -> dict[str, Any]:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
            "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 512,
            "intermediate_size": 128, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def test_inspect_model_reads_config_and_headers(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "tiny", small_tensors(), shards=2, config=tiny_config())
    model = inspect_model(tmp_path / "tiny")
    weights = model.weights
    assert weights is not None
    assert model.name == "tiny"
    assert weights.total_bytes == sum(t.nbytes for t in small_tensors())
    assert weights.shard_count == 2
    assert weights.complete
    assert weights.unused_bytes == 64 * 128 * 2  # model.layers.2 is past num_hidden_layers=2 (an MTP head)
    assert weights.replicated_bytes == 64 * 2  # input_layernorm
    loaded = weights.total_bytes - weights.unused_bytes
    assert weights.per_gpu_bytes(2) == (loaded - 128) // 2 + 128


def test_inspect_model_over_a_host_is_one_round_trip(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "tiny", small_tensors(), shards=2, config=tiny_config())
    host = LocalHost()
    remote = inspect_model(str(tmp_path / "tiny"), host=host)
    local = inspect_model(tmp_path / "tiny")
    assert host.commands_run == 1
    assert remote.weights == local.weights
    assert remote.source == f"local:{tmp_path / 'tiny'}/config.json"


def test_inspect_model_with_incomplete_weights_lists_problems(tmp_path: Path) -> None:
    names = write_checkpoint(tmp_path / "tiny", small_tensors(), shards=2, config=tiny_config())
    (tmp_path / "tiny" / names[0]).unlink()
    weights = inspect_model(tmp_path / "tiny").weights
    assert weights is not None
    assert not weights.complete
    assert weights.problems == (f"{names[0]}: missing (named in model.safetensors.index.json)",)


def test_config_only_directory_gets_derived_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    weights = inspect_model(tmp_path).weights
    assert weights is not None
    assert not weights.from_headers
    assert weights.provenance().startswith("derived from config.json (bfloat16: 2 bytes per weight)")
    # embed + lm_head 2 x 512 x 64, per layer q/o 2 x 64 x 64, k/v 2 x 32 x 64, MLP 3 x 64 x 128, 2 norms
    params = 2 * 512 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert weights.parameter_count == params
    assert weights.total_bytes == 2 * params


def test_config_and_index_directory_takes_the_index_total(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 300000}, "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}))
    weights = inspect_model(tmp_path).weights
    assert weights is not None
    assert weights.total_bytes == 300000
    assert weights.provenance().startswith("read from model.safetensors.index.json metadata.total_size")


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        inspect_model(tmp_path / "nope")
    assert str(info.value) == f"{tmp_path / 'nope'}: directory not found; expected a model directory with config.json"


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        inspect_model(tmp_path)
    assert str(info.value) == f"{tmp_path}/config.json: missing; expected the model's Hugging Face config"


def test_config_json_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n  "hidden_size": }')
    with pytest.raises(ConfigError) as info:
        inspect_model(tmp_path)
    assert str(info.value) == f"{tmp_path}/config.json: not valid JSON (line 2 column 18: Expecting value)"


def test_malformed_config_names_the_real_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_without(tiny_config(), "vocab_size")))
    with pytest.raises(ConfigError) as info:
        inspect_model(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}/config.json: key 'vocab_size' is missing; ")


def test_hf_quant_config_json_next_to_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    quant = inspect_model(tmp_path).quantization
    assert quant is not None
    assert (quant.method, quant.kv_cache_dtype) == ("modelopt", "fp8_e4m3")


def test_hf_quant_config_json_not_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    (tmp_path / "hf_quant_config.json").write_text("{,}")
    with pytest.raises(ConfigError, match=r"/hf_quant_config.json: not valid JSON \(line 1 column 2: "):
        inspect_model(tmp_path)


def test_unreadable_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").mkdir()  # unreadable even for root
    with pytest.raises(ConfigError) as info:
        inspect_model(tmp_path)
    assert str(info.value) == f"{tmp_path}/config.json: a directory; expected a regular file"


def test_compressed_tensors_groups_not_an_object() -> None:
    config = public(LLAMA) | {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1]}}
    with pytest.raises(ConfigError) as info:
        model_spec_from_config(config)
    assert str(info.value) == ("config.json: key 'quantization_config.config_groups' is not an object; expected "
                               "group name -> scheme")


def test_hf_quant_config_json_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    (tmp_path / "hf_quant_config.json").write_text("[]")
    with pytest.raises(ConfigError) as info:
        inspect_model(tmp_path)
    assert str(info.value) == f"{tmp_path}/hf_quant_config.json: expected a JSON object"
