"""The built-in host preflight over ssh, end to end: pytester runs against the loopback sshd.

The remote ``nvidia-smi`` is the labelled stand-in (CI has no GPU) replaying real captures; the
ssh part is real: the system client, one multiplexed connection, the real sshd. Each test also
checks from sshd's own log that the whole pytest session opened exactly one connection.

The "remote" /dev/shm is this machine's, which other tiers (vLLM) use too, so the /dev/shm check
is held to being measured (passed, or failed naming the host), not to a fixed outcome.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from pytest_gpuready import SSHHost
from pytest_gpuready.host.probe import build_probe_script
from tests.sshd import LoopbackSshd, keygen

pytestmark = pytest.mark.ssh

PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-p", "no:cacheprovider", "-rA")
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) \S*::(test_\w+)")


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each preflight test's outcome, from the ``-rA`` short summary."""
    found: dict[str, str] = {}
    for line in result.outlines:
        match = _SUMMARY_LINE.match(line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def assert_shm_measured(result: pytest.RunResult, sshd: LoopbackSshd) -> None:
    """The /dev/shm check ran against the host: a pass, or a failure that names the host."""
    outcome = outcomes(result)["test_shm_is_clean"]
    assert outcome in ("PASSED", "FAILED")
    if outcome == "FAILED":
        result.stdout.fnmatch_lines([f"*/dev/shm on {sshd.user}@127.0.0.1:{sshd.port}*"])


@pytest.fixture(autouse=True)
def _no_host_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the options a test passes may pick the host: clear the plugin's env settings."""
    for variable in ("GPUREADY_HOST", "GPUREADY_GPU_IDS", "GPUREADY_SSH_IDENTITY", "GPUREADY_SSH_OPTIONS",
                     "GPUREADY_SSH_CONNECT_TIMEOUT", "GPUREADY_GPU_READER", "GPUREADY_STANDIN_SCENARIO"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def sshd(loopback_sshd: LoopbackSshd) -> LoopbackSshd:
    """The session's loopback sshd (a short name: every test here talks to it)."""
    return loopback_sshd


def _run(pytester: pytest.Pytester, sshd: LoopbackSshd, scenario: str, *extra: str) -> tuple[pytest.RunResult, int]:
    before = sshd.accepted_connections()
    with sshd.use_scenario(scenario):
        result = pytester.runpytest(*PREFLIGHT, *sshd.pytest_args(), *extra)
    return result, sshd.accepted_connections() - before


def test_clean_host_passes_over_one_connection(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    result, connections = _run(pytester, sshd, "h200-idle")
    assert outcomes(result) | {"test_shm_is_clean": "-"} == {
        "test_gpus_are_clean": "PASSED", "test_gpu_topology": "PASSED", "test_shm_is_clean": "-"}
    assert_shm_measured(result, sshd)
    result.stdout.fnmatch_lines([
        f"gpuready: host {sshd.user}@127.0.0.1:{sshd.port} via nvidia-smi, driver 580.159.04, "
        "1x NVIDIA H200 (143771 MiB, SM90)*",
    ])
    assert connections == 1


def test_dirty_gpu_fails_naming_gpu_mib_and_pid(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    result, connections = _run(pytester, sshd, "h200-one-process")
    assert outcomes(result)["test_gpus_are_clean"] == "FAILED"
    assert outcomes(result)["test_gpu_topology"] == "PASSED"
    assert_shm_measured(result, sshd)
    result.stdout.fnmatch_lines([
        "*_ test_gpus_are_clean _*",
        f"1 of 1 GPUs on {sshd.user}@127.0.0.1:{sshd.port} are not clean (tolerance 64 MiB)",
        "  GPU 0: 21007 MiB used, held by pid 431 (python3*) 20998 MiB",
    ])
    assert "Traceback" not in result.stdout.str()
    assert connections == 1


def test_loaded_eight_gpu_box_fails_on_the_busy_four(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    result, connections = _run(pytester, sshd, "rtx8-tp4-loaded", "-W", "default")
    assert outcomes(result)["test_gpus_are_clean"] == "FAILED"
    assert outcomes(result)["test_gpu_topology"] == "PASSED"
    result.stdout.fnmatch_lines([
        f"4 of 8 GPUs on {sshd.user}@127.0.0.1:{sshd.port} are not clean (tolerance 64 MiB)",
        "  GPU 0: 96721 MiB used*",
    ])
    assert connections == 1


def test_broken_driver_is_red_with_its_cause(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    result, connections = _run(pytester, sshd, "driver-failed")
    # Nothing measured: red, not green, and an error (could not measure), not a failure.
    assert outcomes(result)["test_gpus_are_clean"] == "ERROR"
    assert outcomes(result)["test_gpu_topology"] == "ERROR"
    assert_shm_measured(result, sshd)
    result.stdout.fnmatch_lines([
        f"{sshd.user}@127.0.0.1:{sshd.port}: GPUs could not be read: nvidia-smi failed (exit 9): "
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver*",
    ])
    assert connections == 1


def test_garbled_output_is_red_never_green(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    result, _ = _run(pytester, sshd, "garbled")
    assert outcomes(result)["test_gpus_are_clean"] in ("FAILED", "ERROR")
    assert outcomes(result)["test_gpu_topology"] in ("FAILED", "ERROR")
    result.stdout.fnmatch_lines([f"*{sshd.user}@127.0.0.1:{sshd.port}: GPUs could not be read*"])


def test_wrong_key_errors_every_check_naming_the_cause(pytester: pytest.Pytester, sshd: LoopbackSshd,
                                                       tmp_path: Path) -> None:
    wrong_key = keygen(tmp_path / "id_wrong", "not-authorized")
    before = sshd.accepted_connections()
    with sshd.use_scenario("h200-idle"):
        result = pytester.runpytest(*PREFLIGHT, "--gpu-host", sshd.spec, "--ssh-identity", str(wrong_key),
                                    *[arg for option in sshd.ssh_options for arg in ("--ssh-option", option)])
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([f"*{sshd.user}@127.0.0.1:{sshd.port}: ssh failed: authentication failed*"])
    assert sshd.accepted_connections() == before


def test_refused_port_errors_every_check(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
        port = unused.getsockname()[1]
        result = pytester.runpytest(*PREFLIGHT, "--gpu-host", f"ssh://{sshd.user}@127.0.0.1:{port}",
                                    "--ssh-identity", sshd.identity_file)
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([f"*{sshd.user}@127.0.0.1:{port}: ssh failed: connection refused*"])


def test_unknown_host_key_errors_and_learns_nothing(pytester: pytest.Pytester, sshd: LoopbackSshd,
                                                    tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with sshd.use_scenario("h200-idle"):
        result = pytester.runpytest(*PREFLIGHT, "--gpu-host", sshd.spec, "--ssh-identity", sshd.identity_file,
                                    "--ssh-option", f"UserKnownHostsFile={empty}",
                                    "--ssh-option", "GlobalKnownHostsFile=/dev/null",
                                    "--ssh-option", "StrictHostKeyChecking=yes")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["*ssh failed: host key verification failed*"])
    assert empty.read_text() == ""


def test_ssh_option_the_plugin_manages_is_refused(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    """A usage error before any test runs: the option parser validates with hosts.validate_ssh_option."""
    before = sshd.accepted_connections()
    result = pytester.runpytest(*PREFLIGHT, *sshd.pytest_args(), "--ssh-option", "BatchMode=no")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "ERROR: --ssh-option 'BatchMode=no': BatchMode is set by pytest-gpuready" in output
    assert " passed" not in output
    assert sshd.accepted_connections() == before


def test_user_test_gets_a_connected_ssh_host(pytester: pytest.Pytester, sshd: LoopbackSshd) -> None:
    pytester.makepyfile("""
        def test_remote(gpu_host, gpu_snapshot, gpus_clean):
            assert not gpu_host.is_local
            assert gpu_host.run("echo $((6 * 7))").stdout == "42\\n"
            assert gpus_clean.ok
            assert gpu_snapshot.require_gpus()[0].name == "NVIDIA H200"

        def test_second_command_reuses_the_connection(gpu_host):
            assert gpu_host.run("printf '%s' \\"it's; \\\\$HOME\\"").stdout == "it's; $HOME"
    """)
    before = sshd.accepted_connections()
    with sshd.use_scenario("h200-idle"):
        result = pytester.runpytest("-p", "no:cacheprovider", *sshd.pytest_args())
    result.assert_outcomes(passed=2)
    assert sshd.accepted_connections() - before == 1


def test_probe_script_runs_to_its_end_in_the_remote_shell(sshd: LoopbackSshd, loopback_host: SSHHost) -> None:
    with sshd.use_scenario("h200-idle"):
        result = loopback_host.run(build_probe_script())
    assert result.stderr == ""
    assert result.returncode == 0
