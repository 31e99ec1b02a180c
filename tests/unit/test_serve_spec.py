"""ServeSpec -> argv / env, validation messages, and the deploy-file mapping."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pytest_gpuready import ConfigError, ServeSpec, load_deploy_config
from pytest_gpuready.serve.spec import (
    API_SERVER_MODULE_COMMAND,
    build_argv,
    build_env,
    command_words,
    shell_command,
    spec_from_deployment,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_minimal_spec_is_vllm_serve_with_positional_model() -> None:
    assert build_argv(ServeSpec(model="/models/MiniMax-M2.5")) == ["vllm", "serve", "/models/MiniMax-M2.5"]


def test_every_field_becomes_its_flag_in_order() -> None:
    spec = ServeSpec(
        model="/m", served_model_name="minimax", gpus=(4, 5, 6, 7), tensor_parallel_size=4,
        enable_expert_parallel=True, max_num_seqs=256, max_model_len=196608,
        gpu_memory_utilization=0.9, kv_cache_dtype="fp8", extra_args=("--trust-remote-code",),
        port=8011, bind_address="0.0.0.0",
    )
    assert build_argv(spec) == [
        "vllm", "serve", "/m", "--served-model-name", "minimax", "--tensor-parallel-size", "4",
        "--enable-expert-parallel", "--max-num-seqs", "256", "--max-model-len", "196608",
        "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "fp8", "--host", "0.0.0.0",
        "--port", "8011", "--trust-remote-code",
    ]


def test_port_and_bind_address_given_at_start_override_the_spec() -> None:
    argv = build_argv(ServeSpec(model="/m", port=8000), port=41234, bind_address="127.0.0.1")
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "41234"]


def test_module_command_takes_the_model_as_an_option() -> None:
    spec = ServeSpec(model="/tiny", command=f"/venv/bin/python {API_SERVER_MODULE_COMMAND[len('python '):]}")
    assert command_words(spec) == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                                   "--model", "/tiny"]


def test_model_placeholder_puts_the_model_exactly_there() -> None:
    spec = ServeSpec(model="/tiny", command="docker exec box vllm serve {model} --trust-remote-code")
    assert command_words(spec) == ["docker", "exec", "box", "vllm", "serve", "/tiny", "--trust-remote-code"]


def test_model_path_with_spaces_stays_one_argument() -> None:
    spec = ServeSpec(model="/data/my models/tiny")
    assert build_argv(spec)[2] == "/data/my models/tiny"


def test_env_sets_cuda_visible_devices_from_gpus_and_adds_spec_env() -> None:
    env = build_env(ServeSpec(model="/m", gpus=(2, 3), tensor_parallel_size=2, env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    assert env == {"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "2,3", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_no_gpus_leaves_cuda_visible_devices_unset() -> None:
    assert "CUDA_VISIBLE_DEVICES" not in build_env(ServeSpec(model="/m"))


def test_shell_command_quotes_everything_for_a_remote_shell() -> None:
    command = shell_command(["vllm", "serve", "/m; rm -rf /"], {"A": "x y"})
    assert shlex.split(command) == ["env", "A=x y", "vllm", "serve", "/m; rm -rf /"]


def test_spec_is_frozen_hashable_and_normalises_lists() -> None:
    a = ServeSpec(model="/m", gpus=[0, 1], tensor_parallel_size=2, extra_args=["--x"])  # type: ignore[arg-type]
    b = ServeSpec(model="/m", gpus=(0, 1), tensor_parallel_size=2, extra_args=("--x",))
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    with pytest.raises(AttributeError):
        a.model = "/other"  # type: ignore[misc]


def test_describe_names_model_tp_and_ep() -> None:
    assert ServeSpec(model="/m", label="MiniMax-M2.5", tensor_parallel_size=4).describe() == "MiniMax-M2.5, TP=4"
    assert ServeSpec(model="/m", served_model_name="k2", enable_expert_parallel=True).describe() == "k2, TP=1, EP"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": ""}, "ServeSpec.model: expected a model path or Hugging Face id, got ''"),
    ({"tensor_parallel_size": 0}, "ServeSpec.tensor_parallel_size: expected a whole number >= 1, got 0"),
    ({"tensor_parallel_size": True}, "ServeSpec.tensor_parallel_size: expected a whole number >= 1, got True"),
    ({"gpus": (0, 1), "tensor_parallel_size": 4},
     "ServeSpec.gpus: tensor_parallel_size=4 needs at least 4 GPUs, got 2 ([0, 1])"),
    ({"gpus": (0, 0)}, "ServeSpec.gpus: expected each GPU index once, got (0, 0)"),
    ({"gpus": "0,1"}, "ServeSpec.gpus: expected a list of GPU indexes like [0, 1, 2, 3], got '0,1'"),
    ({"gpus": (-1,)}, "ServeSpec.gpus: expected GPU indexes >= 0, got (-1,)"),
    ({"gpus": ()}, "ServeSpec.gpus: expected at least one GPU index, or None for all GPUs, got ()"),
    ({"max_num_seqs": 0}, "ServeSpec.max_num_seqs: expected a whole number >= 1 or None, got 0"),
    ({"max_model_len": "128k"}, "ServeSpec.max_model_len: expected a whole number >= 1 or None, got '128k'"),
    ({"gpu_memory_utilization": 1.5},
     "ServeSpec.gpu_memory_utilization: expected a fraction in (0, 1] like 0.9, got 1.5"),
    ({"kv_cache_dtype": "fp8 e4m3"},
     "ServeSpec.kv_cache_dtype: expected a vLLM KV cache dtype such as auto, fp8, fp8_e4m3, got 'fp8 e4m3'"),
    ({"port": 70000}, "ServeSpec.port: expected a TCP port 1-65535, or None to pick a free one, got 70000"),
    ({"bind_address": "0.0.0.0; reboot"},
     "ServeSpec.bind_address: expected an address like 127.0.0.1 or 0.0.0.0, got '0.0.0.0; reboot'"),
    ({"env": {"BAD-NAME": "1"}}, "ServeSpec.env: expected variable names like VLLM_CPU_KVCACHE_SPACE, got 'BAD-NAME'"),
    ({"env": {"A": 1}}, "ServeSpec.env['A']: expected a string value, got 1"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpus": (0,)},
     "ServeSpec.env: CUDA_VISIBLE_DEVICES is set from ServeSpec.gpus; give one, not both"),
    ({"extra_args": "--trust-remote-code"},
     "ServeSpec.extra_args: expected a list of arguments (not one string), got '--trust-remote-code'"),
    ({"extra_args": ("--port=8000",)}, "ServeSpec.extra_args: --port is set by ServeSpec.port; set that field instead"),
    ({"extra_args": ("-tp", "4")},
     "ServeSpec.extra_args: -tp is set by ServeSpec.tensor_parallel_size; set that field instead"),
    ({"command": ""}, "ServeSpec.command: expected a launch command like 'vllm serve', got ''"),
    ({"command": "vllm 'serve"},
     "ServeSpec.command: expected a shell-like command line (No closing quotation), got \"vllm 'serve\""),
])
def test_bad_fields_are_named_with_what_was_expected(kwargs: dict[str, object], message: str) -> None:
    kwargs.setdefault("model", "/m")
    with pytest.raises(ConfigError) as excinfo:
        ServeSpec(**kwargs)  # type: ignore[arg-type]
    assert str(excinfo.value) == message


def test_spec_from_the_example_deploy_file() -> None:
    deploy = load_deploy_config(EXAMPLES / "deploy.yaml")
    spec = spec_from_deployment(deploy.get("MiniMax-M2.5-tp4"), command="vllm serve")
    assert spec.model == str((EXAMPLES / "models" / "MiniMax-M2.5").resolve())
    assert spec.gpus == (0, 1, 2, 3)
    assert spec.tensor_parallel_size == 4
    assert spec.describe() == "MiniMax-M2.5, TP=4"
    assert build_argv(spec)[3:] == [
        "--tensor-parallel-size", "4", "--max-num-seqs", "256", "--max-model-len", "196608",
        "--gpu-memory-utilization", "0.9", "--trust-remote-code",
    ]
    assert build_env(spec)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_deployment_kv_dtype_auto_is_left_to_vllm_and_others_are_passed() -> None:
    deploy = load_deploy_config(EXAMPLES / "deploy.yaml")
    auto = spec_from_deployment(deploy.get("Kimi-K2.5-NVFP4-tp8"))
    bf16 = spec_from_deployment(deploy.get("Kimi-K2.5-NVFP4-tp8-bf16kv"))
    assert "--kv-cache-dtype" not in build_argv(auto)
    assert build_argv(bf16)[build_argv(bf16).index("--kv-cache-dtype") + 1] == "bfloat16"
    ep = spec_from_deployment(deploy.get("MiniMax-M2.5-tp8-ep"))
    assert "--enable-expert-parallel" in build_argv(ep)
    assert ep.describe() == "MiniMax-M2.5, TP=8, EP"
