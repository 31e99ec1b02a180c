"""``--speculative-config``, declared once: the deploy file, ``ServeSpec``, extra_args and the planner
carry it, the launch passes it on, and the memory model counts what it adds (or says what it cannot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuready import ConfigError, load_deploy_config, model_spec_from_config
from pytest_gpuready.model.memory import speculative_settings
from pytest_gpuready.model.rules import check_memory
from pytest_gpuready.model.serve_args import ServeArgs, SpeculativeConfig
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.plan.cli import main
from pytest_gpuready.plan.presets import parse_gpus, preset_snapshot
from pytest_gpuready.serve.spec import ServeSpec, build_argv

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
DRAFT = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE: dict[str, object] = {"method": "eagle3", "num_speculative_tokens": 3, "model": DRAFT}


def config_model(name: str, short: str) -> ModelSpec:
    return model_spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=short)


DEEPSEEK = config_model("deepseek-ai__DeepSeek-V3", "DeepSeek-V3")
LLAMA = config_model("meta-llama__Llama-3.1-8B", "Llama-3.1-8B")
H200 = preset_snapshot(*parse_gpus("8xH200"))


def test_one_field_from_a_mapping_json_text_or_extra_args() -> None:
    # a mapping or JSON text is taken as vLLM takes it (ServeArgs parses every field on construction)
    from_mapping = ServeArgs(speculative_config={**EAGLE, "draft_tensor_parallel_size": 1})  # type: ignore[arg-type]
    from_text = ServeArgs(speculative_config=json.dumps({**EAGLE, "draft_tensor_parallel_size": 1}))  # type: ignore[arg-type]
    from_flag = ServeArgs(extra_args=("--speculative-config", json.dumps({**EAGLE, "draft_tensor_parallel_size": 1}),
                                      "--trust-remote-code"))
    assert from_mapping == from_text == ServeArgs(speculative_config=from_flag.speculative_config)
    assert from_flag.extra_args == ("--trust-remote-code",)
    config = from_mapping.speculative_config
    assert config == SpeculativeConfig("eagle3", 3, DRAFT, '{"draft_tensor_parallel_size":1}')
    # the unmodelled keys pass through to vLLM; the record is plain data
    assert from_mapping.argv()[-2:] == ["--speculative-config", json.dumps(
        {**EAGLE, "draft_tensor_parallel_size": 1}, separators=(",", ":"))]
    assert from_mapping.to_record()["speculative_config"] == {**EAGLE, "draft_tensor_parallel_size": 1}
    assert ServeArgs().to_record()["speculative_config"] is None


@pytest.mark.parametrize(("value", "why"), [
    ("eagle", ""),
    ({"method": "eagle", "num_speculative_tokens": 0}, "; its num_speculative_tokens a whole number >= 1"),
    ({"method": ""}, "; its method a non-empty string"),
    ([1], ""),
])
def test_a_bad_config_is_one_line(value: object, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServeArgs(speculative_config=value)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "ServeArgs.speculative_config (--speculative-config): expected a JSON object like {\"method\": \"eagle\", "
        f"\"num_speculative_tokens\": 3, \"model\": \"DRAFT\"}} (vLLM's --speculative-config){why}, got {value!r}")


def test_the_deploy_file_takes_it_under_serve(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("deployments:\n  - name: spec\n    model: m\n    tp: 2\n    serve:\n"
                      "      speculative_config: {method: mtp, num_speculative_tokens: 1}\n")
    deployment = load_deploy_config(deploy).get("spec")
    assert deployment.serve.speculative_config == SpeculativeConfig("mtp", 1)
    assert "--speculative-config" in deployment.serve.argv()
    deploy.write_text("deployments:\n  - name: spec\n    model: m\n    tp: 2\n    serve:\n"
                      "      speculative_config: {method: mtp}\n"
                      "      extra_args: ['--speculative-config', '{\"method\": \"ngram\"}']\n")
    with pytest.raises(ConfigError, match=r"`--speculative-config \{\"method\": \"ngram\"\}` in extra_args and "
                                          r"`serve.speculative_config: .*`: say it once"):
        load_deploy_config(deploy)
    deploy.write_text("deployments:\n  - name: spec\n    model: m\n    tp: 2\n    serve: {speculative_config: 3}\n")
    with pytest.raises(ConfigError, match=r"deployment 'spec': key 'serve.speculative_config': expected a JSON "
                                          r"object like .*, got 3$"):
        load_deploy_config(deploy)


def test_serve_spec_launches_it() -> None:
    spec = ServeSpec("models/llama", args=ServeArgs(tp=2, speculative_config=SpeculativeConfig.parse(EAGLE)))
    argv = build_argv(spec, port=8000)
    at = argv.index("--speculative-config")
    assert json.loads(argv[at + 1]) == EAGLE


def test_mtp_loads_the_checkpoints_next_n_layers_and_keeps_their_kv() -> None:
    """DeepSeek-V3 has one MTP layer (num_nextn_predict_layers): drafting with it loads its weights
    (counted as unused until then) and gives it KV pages: one more 576-wide latent per token."""
    plain = check_memory(DEEPSEEK, ServeArgs(tp=8), H200)
    mtp = check_memory(DEEPSEEK, ServeArgs(tp=8, speculative_config=SpeculativeConfig("mtp", 1)),
                       H200)
    assert plain.ok
    assert mtp.ok
    assert mtp.evidence["kv_bytes_per_token"] - plain.evidence["kv_bytes_per_token"] == 576 * 2
    settings, _, unknown = speculative_settings(DEEPSEEK, SpeculativeConfig("mtp", 1), 8)
    assert settings.draft_layers == 1
    assert settings.draft_weight_bytes > 0
    assert not unknown
    added = mtp.evidence["weights_per_gpu_bytes"] - plain.evidence["weights_per_gpu_bytes"]
    assert added == settings.draft_weight_bytes
    assert any(line.startswith("--speculative-config: mtp: the checkpoint's 1 MTP layer(s)") for line in mtp.details)


def test_a_draft_models_weights_are_not_known_from_the_config_and_the_verdict_says_so() -> None:
    verdict = check_memory(LLAMA, ServeArgs(tp=8, speculative_config=SpeculativeConfig.parse(EAGLE)), H200)
    plain = check_memory(LLAMA, ServeArgs(tp=8), H200)
    assert verdict.ok
    assert verdict.warnings[0] == (
        "speculative decoding (eagle3): the weights of the draft 'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B' are not "
        "counted: the target's config does not size another checkpoint (library callers pass "
        "SpeculativeSettings(draft_weight_bytes=...))")
    # the EAGLE head's one decoder layer keeps KV pages of the target's layout
    assert verdict.evidence["kv_bytes_per_token"] == plain.evidence["kv_bytes_per_token"] * 33 // 32
    ngram = check_memory(LLAMA, ServeArgs(tp=8, speculative_config=SpeculativeConfig("ngram", 4)),
                         H200)
    assert ngram.evidence["kv_bytes_per_token"] == plain.evidence["kv_bytes_per_token"]
    assert not any("speculative" in w for w in ngram.warnings)


def test_the_planner_plans_with_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = tmp_path / "Llama-3.1-8B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())
    assert main(["plan", str(model_dir), "--gpus", "2xH200", "--speculative-config", json.dumps(EAGLE),
                 "--commands"]) == 0
    out = capsys.readouterr().out
    assert "--speculative-config '" + json.dumps(EAGLE, separators=(",", ":")) + "'" in out
    with pytest.raises(SystemExit):
        main(["plan", str(model_dir), "--gpus", "2xH200", "--speculative-config", "eagle"])
    assert "argument --speculative-config: 'eagle': expected a JSON object like" in capsys.readouterr().err


def test_the_report_record_is_plain_json() -> None:
    spec = ServeSpec("models/llama", args=ServeArgs(speculative_config=SpeculativeConfig.parse(EAGLE)))
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["speculative_config"] == data["serve_args"]["speculative_config"] == EAGLE
