"""--gpu-host given several times and --gpu-hosts-file: usage errors before anything is contacted,
and collection ids per host (``--collect-only`` probes nothing, so these hosts need not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest

USER_TESTS = """
import pytest

def test_snapshot(gpu_snapshot):
    pass

@pytest.mark.shm_clean
def test_marked():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_host_and_own_params(gpu_host, n):
    pass

def test_plain():
    pass
"""


@pytest.fixture(autouse=True)
def _no_host_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("GPUREADY_HOST", "GPUREADY_HOSTS_FILE"):
        monkeypatch.delenv(variable, raising=False)


def test_help_lists_the_fleet_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--gpu-host=HOST*", "*--gpu-hosts-file=FILE*",
                                 "*File of GPU hosts, one host spec a line*"])


def test_bad_line_of_the_hosts_file_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    hosts = pytester.path / "fleet.txt"
    hosts.write_text("# fleet\nroot@gpu-box-7\nroot@gpu box 8\n")
    result = pytester.runpytest("--gpu-hosts-file", str(hosts))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"ERROR: --gpu-hosts-file {hosts} line 3: 'root@gpu box 8': contains whitespace or a control character*",
    ])


def test_missing_hosts_file_and_a_host_given_twice_are_usage_errors(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gpu-hosts-file", "nowhere.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-hosts-file */nowhere.txt: hosts file not found"])
    hosts = pytester.path / "fleet.txt"
    hosts.write_text("gpu-2\ngpu-1\n")
    result = pytester.runpytest("--gpu-host", "gpu-1", "--gpu-hosts-file", str(hosts))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-host: host gpu-1 is given twice*"])


def test_env_var_gives_one_host_a_line_and_a_bad_one_is_named(pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_HOST", "gpu-1\ngpu;2\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: $GPUREADY_HOST 'gpu-1\\ngpu;2\\n': 'gpu;2': 'gpu;2' is not a host name*"])


def test_host_bound_tests_are_collected_once_per_host(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    hosts = pytester.path / "fleet.txt"
    hosts.write_text("root@gpu-box-8\n")
    result = pytester.runpytest("--collect-only", "-q", "--gpu-host", "root@gpu-box-7", "--gpu-hosts-file",
                                str(hosts))
    assert sorted(line for line in result.outlines if "::" in line) == sorted([
        "test_user.py::test_snapshot[gpu-box-7]", "test_user.py::test_snapshot[gpu-box-8]",
        "test_user.py::test_marked[gpu-box-7]", "test_user.py::test_marked[gpu-box-8]",
        "test_user.py::test_host_and_own_params[1-gpu-box-7]", "test_user.py::test_host_and_own_params[1-gpu-box-8]",
        "test_user.py::test_host_and_own_params[2-gpu-box-7]", "test_user.py::test_host_and_own_params[2-gpu-box-8]",
        "test_user.py::test_plain",
    ])


def test_one_host_keeps_the_ids_as_they_were(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("--collect-only", "-q", "--gpu-host", "root@gpu-box-7")
    assert sorted(line for line in result.outlines if "::" in line) == sorted([
        "test_user.py::test_snapshot", "test_user.py::test_marked", "test_user.py::test_host_and_own_params[1]",
        "test_user.py::test_host_and_own_params[2]", "test_user.py::test_plain",
    ])


def test_the_preflight_deployments_run_per_host(pytester: pytest.Pytester) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    result = pytester.runpytest("--collect-only", "-q", "--pyargs", "pytest_gpuready.preflight",
                                "--gpu-host", "gpu-1", "--gpu-host", "gpu-2",
                                "--gpuready-config", str(examples / "deploy.yaml"))
    ids = [line.split("::", 1)[1] for line in result.outlines if "::" in line]
    assert "test_fp8_block_alignment[MiniMax-M2.5-tp8-gpu-2]" in ids
    assert "test_gpus_are_clean[gpu-1]" in ids
    assert "test_gpus_visible[MiniMax-M2.5-tp8-gpu-1]" in ids
    # test_deployments.py: 8 per deployment of 5; test_host.py: 3; test_health.py: 6 host-wide, 4 per deployment
    assert len(ids) == 2 * (8 * 5 + 3 + 6 + 4 * 5)
