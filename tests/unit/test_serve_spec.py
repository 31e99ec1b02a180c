"""ServeSpec -> argv / env, validation messages, and the deploy-file mapping."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pytest_gpuready import ConfigError, ServeSpec, load_deploy_config
from pytest_gpuready.model.serve_args import ServeArgs
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
    assert build_argv(ServeSpec(model="/models/MiniMax-M2.5")) == [
        "vllm", "serve", "/models/MiniMax-M2.5", "--gpu-memory-utilization", "0.9"]


def test_every_field_becomes_its_flag_in_order() -> None:
    spec = ServeSpec(
        model="/m", served_model_name="minimax", gpus=(4, 5, 6, 7),
        args=ServeArgs(tp=4, ep=True, max_num_seqs=256, max_model_len=196608, gpu_memory_utilization=0.85,
                       kv_cache_dtype="fp8", extra_args=("--trust-remote-code",)),
        port=8011, bind_address="0.0.0.0",
    )
    assert build_argv(spec) == [
        "vllm", "serve", "/m", "--served-model-name", "minimax", "--host", "0.0.0.0", "--port", "8011",
        "--tensor-parallel-size", "4", "--enable-expert-parallel", "--kv-cache-dtype", "fp8",
        "--max-model-len", "196608", "--max-num-seqs", "256", "--gpu-memory-utilization", "0.85",
        "--trust-remote-code",
    ]


def test_port_and_bind_address_given_at_start_override_the_spec() -> None:
    argv = build_argv(ServeSpec(model="/m", port=8000), port=41234, bind_address="127.0.0.1")
    assert argv[3:7] == ["--host", "127.0.0.1", "--port", "41234"]


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
    env = build_env(ServeSpec(model="/m", gpus=(2, 3), args=ServeArgs(tp=2), env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    assert env == {"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "2,3", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_no_gpus_leaves_cuda_visible_devices_unset() -> None:
    assert "CUDA_VISIBLE_DEVICES" not in build_env(ServeSpec(model="/m"))


def test_shell_command_quotes_everything_for_a_remote_shell() -> None:
    command = shell_command(["vllm", "serve", "/m; rm -rf /"], {"A": "x y"})
    assert shlex.split(command) == ["env", "A=x y", "vllm", "serve", "/m; rm -rf /"]


def test_spec_is_frozen_hashable_and_normalises_lists() -> None:
    a = ServeSpec(model="/m", gpus=[0, 1], args=ServeArgs(tp=2, extra_args=["--x"]))  # type: ignore[arg-type]
    b = ServeSpec(model="/m", gpus=(0, 1), args=ServeArgs(tp=2, extra_args=("--x",)))
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    with pytest.raises(AttributeError):
        a.model = "/other"  # type: ignore[misc]


def test_describe_names_model_tp_and_ep() -> None:
    assert ServeSpec(model="/m", label="MiniMax-M2.5", args=ServeArgs(tp=4)).describe() == "MiniMax-M2.5, TP=4"
    assert ServeSpec(model="/m", served_model_name="k2", args=ServeArgs(ep=True)).describe() == "k2, TP=1, EP"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": ""}, "ServeSpec.model: expected a model path or Hugging Face id, got ''"),
    ({"args": {"tp": 0}}, "ServeArgs.tp (--tensor-parallel-size): expected a whole number >= 1, got 0"),
    ({"args": {"tp": True}}, "ServeArgs.tp (--tensor-parallel-size): expected a whole number >= 1, got True"),
    ({"gpus": (0, 1), "args": {"tp": 4}}, "ServeSpec.gpus: TP=4 needs at least 4 GPUs, got 2 ([0, 1])"),
    ({"gpus": (0, 1, 2, 3), "args": {"tp": 2, "dp": 3}},
     "ServeSpec.gpus: DP=3 TP=2 needs at least 6 GPUs, got 4 ([0, 1, 2, 3])"),
    ({"gpus": (0, 0)}, "ServeSpec.gpus: expected each GPU index once, got (0, 0)"),
    ({"gpus": "0,1"}, "ServeSpec.gpus: expected a list of GPU indexes like [0, 1, 2, 3], got '0,1'"),
    ({"gpus": (-1,)}, "ServeSpec.gpus: expected GPU indexes >= 0, got (-1,)"),
    ({"gpus": ()}, "ServeSpec.gpus: expected at least one GPU index, or None for all GPUs, got ()"),
    ({"args": {"max_num_seqs": 0}}, "ServeArgs.max_num_seqs (--max-num-seqs): expected a whole number >= 1, got 0"),
    ({"args": {"max_model_len": "128x"}},
     "ServeArgs.max_model_len (--max-model-len): expected a whole number >= 1 (or like 128k), got '128x'"),
    ({"args": {"gpu_memory_utilization": 1.5}},
     "ServeArgs.gpu_memory_utilization (--gpu-memory-utilization): expected a number > 0 and <= 1, got 1.5"),
    ({"args": {"kv_cache_dtype": "fp8 e4m3"}},
     "ServeArgs.kv_cache_dtype (--kv-cache-dtype): expected one of auto, bfloat16, float16, fp8, fp8_e4m3, "
     "fp8_e5m2, fp8_inc, fp8_ds_mla, nvfp4, nvfp4_ds_mla, got 'fp8 e4m3'"),
    ({"port": 70000}, "ServeSpec.port: expected a TCP port 1-65535, or None to pick a free one, got 70000"),
    ({"bind_address": "0.0.0.0; reboot"},
     "ServeSpec.bind_address: expected an address like 127.0.0.1 or 0.0.0.0, got '0.0.0.0; reboot'"),
    ({"env": {"BAD-NAME": "1"}}, "ServeSpec.env: expected variable names like VLLM_CPU_KVCACHE_SPACE, got 'BAD-NAME'"),
    ({"env": {"A": 1}}, "ServeSpec.env['A']: expected a string value, got 1"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpus": (0,)},
     "ServeSpec.env: CUDA_VISIBLE_DEVICES is set from ServeSpec.gpus; give one, not both"),
    ({"args": {"extra_args": "--trust-remote-code"}},
     "ServeArgs.extra_args: expected a list of arguments (not one string), got '--trust-remote-code'"),
    ({"args": {"extra_args": ("--port=8000",)}},
     "ServeSpec.args.extra_args: --port is set by ServeSpec.port; set that field instead"),
    ({"args": {"tp": 2, "extra_args": ("-tp", "4")}},
     "ServeArgs: `-tp 4` in extra_args and `tp: 2`: say it once"),
    ({"command": ""}, "ServeSpec.command: expected a launch command like 'vllm serve', got ''"),
    ({"command": "vllm 'serve"},
     "ServeSpec.command: expected a shell-like command line (No closing quotation), got \"vllm 'serve\""),
])
def test_bad_fields_are_named_with_what_was_expected(kwargs: dict[str, object], message: str) -> None:
    kwargs.setdefault("model", "/m")
    fields = kwargs.pop("args", {})

    def build() -> ServeSpec:
        return ServeSpec(**kwargs, args=ServeArgs(**fields))  # type: ignore[arg-type]

    with pytest.raises(ConfigError) as excinfo:
        build()
    assert str(excinfo.value) == message


def test_spec_from_the_example_deploy_file() -> None:
    deploy = load_deploy_config(EXAMPLES / "deploy.yaml")
    spec = spec_from_deployment(deploy.get("MiniMax-M2.5-tp4"), command="vllm serve")
    assert spec.model == str((EXAMPLES / "models" / "MiniMax-M2.5").resolve())
    assert spec.gpus == (0, 1, 2, 3)
    assert spec.args.tp == 4
    assert spec.describe() == "MiniMax-M2.5, TP=4"
    assert build_argv(spec)[3:] == [
        "--tensor-parallel-size", "4", "--max-model-len", "196608", "--max-num-seqs", "256",
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


def test_the_launched_server_is_the_deployment_the_checks_judged(tmp_path: Path) -> None:
    """Issue 17's measurement: PP, DP, dtype, quantization, eager mode and the batch size used to
    be dropped between the deploy file and the launch."""
    (tmp_path / "deploy.yaml").write_text("""\
deployments:
  - name: full
    model: /models/m
    tp: 2
    pp: 2
    dp: 2
    kv_cache_dtype: fp8
    serve: {dtype: float16, quantization: fp8, enforce_eager: true, max_num_batched_tokens: 8192,
            max_model_len: 4096}
""")
    deployment = load_deploy_config(tmp_path / "deploy.yaml").get("full")
    argv = build_argv(spec_from_deployment(deployment))
    assert argv[3:] == deployment.serve.argv() == [
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--data-parallel-size", "2",
        "--kv-cache-dtype", "fp8", "--dtype", "float16", "--quantization", "fp8", "--max-model-len", "4096",
        "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.9", "--enforce-eager"]
