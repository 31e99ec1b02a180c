"""Model inspection and the deployment preflight over a real OpenSSH server on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_gpuready import SSHHost, inspect_model
from tests.checkpoints import minimax_m2_tensors, small_tensors, write_checkpoint
from tests.sshd import LoopbackSshd

pytestmark = pytest.mark.ssh

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
TINY = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 512, "intermediate_size": 128}


def test_inspect_model_over_ssh_is_one_round_trip(tmp_path: Path, loopback_host: SSHHost) -> None:
    names = write_checkpoint(tmp_path / "it's a model", small_tensors(), shards=3, config=TINY)
    shard = tmp_path / "it's a model" / names[1]
    os.truncate(shard, shard.stat().st_size - 16)
    before = loopback_host.commands_run
    remote = inspect_model(str(tmp_path / "it's a model"), host=loopback_host)
    assert loopback_host.commands_run - before == 1
    local = inspect_model(tmp_path / "it's a model")
    assert remote.weights == local.weights
    assert remote.weights is not None
    assert remote.weights.problems[0].startswith(f"{names[1]}: file is ")
    assert remote.source.startswith(f"{loopback_host.name}:{tmp_path}/it's a model/")


def test_missing_model_directory_on_the_host(tmp_path: Path, loopback_host: SSHHost) -> None:
    from pytest_gpuready.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        inspect_model(str(tmp_path / "nope"), host=loopback_host)
    assert str(info.value) == (f"{loopback_host.name}:{tmp_path / 'nope'}: directory not found; expected a model "
                               "directory with config.json")


def test_deployment_preflight_over_ssh_opens_one_connection(pytester: pytest.Pytester,
                                                            loopback_sshd: LoopbackSshd) -> None:
    config = json.loads((CONFIGS / "MiniMaxAI__MiniMax-M2.5.json").read_text())
    write_checkpoint(pytester.path / "MiniMax-M2.5", minimax_m2_tensors(), shards=119, config=config)
    (pytester.path / "deploy.yaml").write_text(
        "deployments:\n  - name: tp4\n    model: MiniMax-M2.5\n    gpus: [0, 1, 2, 3]\n"
        "    serve: {max_model_len: 196608}\n")
    before = loopback_sshd.accepted_connections()
    with loopback_sshd.use_scenario("rtx8-clean"):
        result = pytester.runpytest("-p", "pytest_gpuready.plugin.model_fixtures", "-p", "no:cacheprovider",
                                    "--pyargs", "pytest_gpuready.preflight.test_deployments",
                                    "--gpuready-config", "deploy.yaml", *loopback_sshd.pytest_args(), "-v")
    result.assert_outcomes(passed=7, skipped=1)
    result.stdout.fnmatch_lines_random([
        "*test_memory_fit[[]tp4[]] PASSED*",
        "*test_fp8_block_alignment[[]tp4[]] PASSED*",
    ])
    assert loopback_sshd.accepted_connections() - before == 1
