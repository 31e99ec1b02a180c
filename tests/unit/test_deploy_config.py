"""The deploy file: the shipped example parses; every malformed input is one line naming file, deployment, key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuready import ConfigError, Deployment, load_deploy_config, parse_vllm_version

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "deploy.yaml"

MINIMAL = """\
deployments:
  - name: tiny
    model: models/tiny
    tp: 2
"""


def test_shipped_example() -> None:
    config = load_deploy_config(EXAMPLE)
    assert config.names == ("MiniMax-M2.5-tp4", "MiniMax-M2.5-tp8", "MiniMax-M2.5-tp8-ep", "Kimi-K2.5-NVFP4-tp8",
                            "Kimi-K2.5-NVFP4-tp8-bf16kv")
    tp4 = config.get("MiniMax-M2.5-tp4")
    assert (tp4.tp, tp4.gpus, tp4.ep, tp4.gpu_arch) == (4, (0, 1, 2, 3), False, (12, 0))
    assert tp4.vllm_version == parse_vllm_version("0.17.0")
    assert tp4.model_path == str((EXAMPLE.parent / "models" / "MiniMax-M2.5").resolve())
    assert (EXAMPLE.parent / "models" / "MiniMax-M2.5" / "config.json").is_file()
    assert tp4.serve.max_model_len == 196608
    assert tp4.serve.gpu_memory_utilization == 0.9
    single = tp4.expect.single_stream
    assert single is not None
    assert single.min_output_tok_s == 80
    at_256 = tp4.expect.at_concurrency(256)
    assert at_256 is not None
    assert at_256.min_output_tok_s == 2500
    assert (tp4.expect.weights_per_gpu_gib_min, tp4.expect.weights_per_gpu_gib_max) == (50, 57)
    assert config.get("MiniMax-M2.5-tp8-ep").ep is True
    assert config.get("Kimi-K2.5-NVFP4-tp8-bf16kv").kv_cache_dtype == "bfloat16"
    assert tp4.serve.argv() == ["--tensor-parallel-size", "4", "--max-model-len", "196608", "--max-num-seqs",
                                "256", "--gpu-memory-utilization", "0.9", "--trust-remote-code"]
    assert tp4.serve.extra_args == ("--trust-remote-code",)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str) -> Deployment:
    return load_deploy_config(write(tmp_path, text)).deployments[0]


def test_minimal_defaults(tmp_path: Path) -> None:
    deployment = load(tmp_path, MINIMAL)
    assert (deployment.tp, deployment.gpus) == (2, None)
    assert (deployment.kv_cache_dtype, deployment.vllm_version) == ("auto", None)
    assert deployment.model_path == str(tmp_path / "models" / "tiny")
    assert deployment.serve.argv() == ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9"]


def test_tp_from_the_gpu_list_and_defaults_merge(tmp_path: Path) -> None:
    deployment = load(tmp_path, """\
defaults:
  vllm_version: "0.29.0"
  serve: {gpu_memory_utilization: 0.85, env: {NCCL_P2P_DISABLE: 1}}
deployments:
  - name: a
    model: /models/a
    gpus: "4,5"
    serve: {max_model_len: 32k}
""")
    assert deployment.tp == 2
    assert deployment.gpus == (4, 5)
    assert deployment.model_path == "/models/a"
    assert not deployment.model_is_relative
    assert deployment.serve.gpu_memory_utilization == 0.85
    assert deployment.serve.max_model_len == 32000
    assert deployment.env == {"NCCL_P2P_DISABLE": "1"}
    assert str(deployment.vllm_version) == "0.29.0"


def test_data_parallel_engines_take_tp_x_pp_x_dp_gpus(tmp_path: Path) -> None:
    eight = "    dp: 2\n    pp: 2\n    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n"
    deployment = load(tmp_path, MINIMAL.replace("    tp: 2\n", eight))
    assert (deployment.tp, deployment.pp, deployment.dp) == (2, 2, 2)
    assert deployment.serve.argv()[:6] == ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
                                           "--data-parallel-size", "2"]


def test_human_readable_max_model_len(tmp_path: Path) -> None:
    deployment = load(tmp_path, MINIMAL.replace("tp: 2", "tp: 2\n    serve: {max_model_len: 128K}"))
    assert deployment.serve.max_model_len == 131072


@pytest.mark.parametrize(("text", "message"), [
    (MINIMAL.replace("tp: 2", "tensor_parallel: 2"),
     "deployment 'tiny': unknown key 'tensor_parallel' (did you mean 'tensor_parallel_size'?); expected one of: "
     "name, description, model, gpus, tp, pp, "
     "dp, ep, kv_cache_dtype, gpu_arch, vllm_version, serve, expect"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    kv_cache_dtyp: fp8"),
     "deployment 'tiny': unknown key 'kv_cache_dtyp' (did you mean 'kv_cache_dtype'?); expected one of: "),
    (MINIMAL.replace("tp: 2", "tp: eight"),
     "deployment 'tiny': key 'tp': expected a whole number >= 1, got 'eight'"),
    (MINIMAL.replace("tp: 2", "tp: 0"), "deployment 'tiny': key 'tp': expected a whole number >= 1, got 0"),
    (MINIMAL.replace("    tp: 2\n", ""),
     "deployment 'tiny': key 'tp' is missing; expected a whole number >= 1 (the tensor-parallel size), or a gpus list"),
    (MINIMAL.replace("    model: models/tiny\n", ""),
     "deployment 'tiny': key 'model' is missing; expected the model directory (here, or on the GPU host)"),
    ("deployments:\n  - model: models/tiny\n    tp: 2\n",
     "deployment '#1': key 'name' is missing; expected a name like MiniMax-M2.5-tp4"),
    (MINIMAL.replace("name: tiny", "name: tiny model"),
     "deployment 'tiny model': key 'name': expected letters, digits, '.', '_' or '-' (it becomes the test id), "
     "got 'tiny model'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    gpus: [0, 1, 2]"),
     "deployment 'tiny': key 'gpus': expected exactly tp=2 GPU indexes, got [0, 1, 2]"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    dp: 2\n    gpus: [0, 1]"),
     "deployment 'tiny': key 'gpus': expected exactly tp x dp = 4 GPU indexes, got [0, 1]"),
    (MINIMAL.replace("    tp: 2\n", "    dp: 2\n    gpus: [0, 1, 2]\n"),
     "deployment 'tiny': key 'gpus': expected a multiple of dp=2 GPU indexes, got [0, 1, 2]"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    dp: 0"), "deployment 'tiny': key 'dp': expected a whole number >= 1, got 0"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    gpus: [0, 0]"),
     "deployment 'tiny': key 'gpus': expected each GPU index once, got [0, 0]"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    gpus: [a, b]"),
     "deployment 'tiny': key 'gpus': expected a list of GPU indexes like [0, 1, 2, 3], got ['a', 'b']"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    ep: yes please"),
     "deployment 'tiny': key 'ep': expected true or false, got 'yes please'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    kv_cache_dtype: fp4"),
     "deployment 'tiny': key 'kv_cache_dtype': expected one of auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, "
     "fp8_inc, fp8_ds_mla, nvfp4, nvfp4_ds_mla, got 'fp4'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    gpu_arch: hopper"),
     "deployment 'tiny': key 'gpu_arch': expected sm90, sm100, sm120 or a compute capability like '12.0', "
     "got 'hopper'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    vllm_version: 0.10"),
     "deployment 'tiny': key 'vllm_version': expected a quoted version string like \"0.17.0\" (YAML reads an "
     "unquoted 0.10 as the number 0.1), got 0.1"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    vllm_version: latest"),
     "deployment 'tiny': key 'vllm_version': expected a version like \"0.17.0\", got 'latest'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    serve: {gpu_memory_utilization: 1.2}"),
     "deployment 'tiny': key 'serve.gpu_memory_utilization': expected a number > 0 and <= 1, got 1.2"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    serve: {max_model_len: lots}"),
     "deployment 'tiny': key 'serve.max_model_len': expected a whole number >= 1 (or like 128k), got 'lots'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    serve: {max_num_seq: 8}"),
     "deployment 'tiny': unknown key 'serve.max_num_seq' (did you mean 'max_num_seqs'?); expected one of: "),
    (MINIMAL.replace("tp: 2", "tp: 2\n    serve: {extra_args: --trust-remote-code}"),
     "deployment 'tiny': key 'serve.extra_args': expected a list of strings like ['--trust-remote-code'], "
     "got '--trust-remote-code'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    serve: {env: {A: [1]}}"),
     "deployment 'tiny': key 'serve.env.A': expected a string value, got [1]"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    serve: fast"),
     "deployment 'tiny': key 'serve': expected a mapping of keys to values, got 'fast'"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {throughput: [{concurrency: 1}]}"),
     "deployment 'tiny': key 'expect.throughput[0].min_output_tok_s' is missing; expected a number"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {throughput: [{concurrency: 1, min_output_tok_s: 80, "
                              "min_tok_s: 3}]}"),
     "deployment 'tiny': unknown key 'expect.throughput[0].min_tok_s' (did you mean 'min_output_tok_s'?); "),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {throughput: [{concurrency: 0, min_output_tok_s: 80}]}"),
     "deployment 'tiny': key 'expect.throughput[0].concurrency': expected a whole number >= 1, got 0"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {throughput: [{concurrency: 1, min_output_tok_s: 1}, "
                              "{concurrency: 1, min_output_tok_s: 2}]}"),
     "deployment 'tiny': key 'expect.throughput': expected one threshold per concurrency, got [1, 1]"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {weights_per_gpu_gib: {min: 60, max: 50}}"),
     "deployment 'tiny': key 'expect.weights_per_gpu_gib': expected min <= max, got {'min': 60, 'max': 50}"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {weights_per_gpu_gib: 55}"),
     "deployment 'tiny': key 'expect.weights_per_gpu_gib': expected {min: GiB, max: GiB} or [min, max], got 55"),
    (MINIMAL + "  - name: tiny\n    model: x\n    tp: 1\n",
     "deployment name 'tiny' is used twice; expected unique names"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    description: [a]"),
     "deployment 'tiny': key 'description': expected a string, got ['a']"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {throughput: {concurrency: 1}}"),
     "deployment 'tiny': key 'expect.throughput': expected a list of {concurrency, min_output_tok_s} thresholds, "
     "got {'concurrency': 1}"),
    (MINIMAL.replace("tp: 2", "tp: 2\n    expect: {throughput: [80]}"),
     "deployment 'tiny': key 'expect.throughput[0]': expected a mapping like {concurrency: 1, min_output_tok_s: "
     "80}, got 80"),
    ("deployments: []\n", "key 'deployments': expected a non-empty list of deployments, got []"),
    ("defaults: {}\n", "key 'deployments' is missing; expected a list of deployments"),
    ("- a\n- b\n", "key 'deployments': expected a mapping with a 'deployments' list at the top, got ['a', 'b']"),
    ("deployment:\n  - name: a\n", "unknown key 'deployment' (did you mean 'deployments'?); expected one of: "
                                   "defaults, deployments"),
    ("defaults: {name: x}\ndeployments: []\n", "unknown key 'defaults.name'; expected one of: description, "),
    ("deployments:\n  - just-a-string\n",
     "deployment '#1': key 'deployments[0]': expected a mapping with name, model and tp, got 'just-a-string'"),
    ("deployments:\n  - name: a\n    name: b\n", "not valid YAML at line 3, column 5: duplicate key 'name' (line 3)"),
    # libyaml's wording (the C loader); the pure-Python one says "expected the node content"
    ("deployments: [\n", "not valid YAML at line 2, column 1: did not find expected node content"),
])
def test_malformed_deploy_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_deploy_config(path)
    text_of_error = str(info.value)
    assert "\n" not in text_of_error
    assert text_of_error.startswith(f"{path}: {message}")


def test_missing_deploy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"deploy.yaml: deploy file not found$"):
        load_deploy_config(tmp_path / "deploy.yaml")


def test_unknown_deployment_name(tmp_path: Path) -> None:
    config = load_deploy_config(write(tmp_path, MINIMAL))
    with pytest.raises(ConfigError) as info:
        config.get("huge")
    assert str(info.value) == f"{tmp_path / 'deploy.yaml'}: no deployment named 'huge'; the file has tiny"


def test_deploy_file_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"deploy.yaml: a directory; expected a regular file$"):
        load_deploy_config(tmp_path / "deploy.yaml")
