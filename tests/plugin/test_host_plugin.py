"""The plugin end to end, with pytester, on the local machine and the labelled stand-in nvidia-smi."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

Standin = Callable[[str], Path]

PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm")
"""The host preflight minus its /dev/shm test, whose outcome depends on this machine's real /dev/shm
(tests/unit/test_shm.py and the shm marker test below cover it with files they create)."""


def test_help_lists_the_option_group(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "*GPU readiness preflight for vLLM deploys (pytest-gpuready)*",
        "*--gpu-host=HOST*GPU host to check: local (default), host, user@host or*",
        "*--gpu-ids=0,1,2,3*",
        "*--shm-remove-leftovers*",
        "*gpu_host (string)*",
    ])


def test_markers_are_listed_with_signatures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines([
        "@pytest.mark.gpuready: a GPU-readiness preflight check*",
        "@pytest.mark.gpus_clean(*, gpus=None, max_used_mib=None): fail before the test runs unless*",
        "@pytest.mark.shm_clean(*, min_free_mib=None): fail before the test runs if /dev/shm holds*",
    ])


def test_preflight_passes_on_an_idle_h200(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "gpuready: host local via nvidia-smi, driver 580.159.04, 1x NVIDIA H200 (143771 MiB, SM90), vLLM *",
    ])
    result.assert_outcomes(passed=2)


def test_preflight_names_the_process_holding_a_gpu(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-one-process")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_gpus_are_clean _*",
        "1 of 1 GPUs on local are not clean (tolerance 64 MiB)",
        "  GPU 0: 21007 MiB used, held by pid 431 (python3*) 20998 MiB",
        "*gpuready: GPUs on local, driver 580.159.04 (last snapshot)*",
        "GPU  Name         Used / Total MiB  Memory                  Processes",
        "0    NVIDIA H200    21007 / 143771  [[]###.................]  431 python3 20998 MiB*",
    ])
    assert "Traceback" not in result.stdout.str()


def test_preflight_on_the_loaded_eight_gpu_box(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("rtx8-tp4-loaded")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider", "-W", "default")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["4 of 8 GPUs on local are not clean (tolerance 64 MiB)", "  GPU 0: 96721 MiB used*"])
    result.stdout.fnmatch_lines(["*GpuReadyWarning: GPUs 0,1,2,3,4,5,6,7 are not all NVLink-connected (SYS links)*"])


def test_preflight_on_free_gpus_of_the_loaded_box(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("rtx8-tp4-loaded")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider", "--gpu-ids", "4,5,6,7")
    result.assert_outcomes(passed=2)


def test_broken_driver_errors_with_its_cause(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("driver-failed")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)  # could not measure: an error, never a failure
    result.stdout.fnmatch_lines([
        "local: GPUs could not be read: nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver*",
    ])


def test_no_gpu_and_no_host_skips_gpu_checks_saying_what_to_pass(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("GPUREADY_HOST", raising=False)
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([
        "SKIPPED * no NVIDIA GPU on this machine (nvidia-smi is not installed or not on PATH*); "
        "pass --gpu-host HOST (or set GPUREADY_HOST) to check a GPU server",
    ])


def test_naming_a_gpu_less_local_host_is_an_error_not_a_skip(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider", "--gpu-host", "local")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["local: GPUs could not be read: nvidia-smi is not installed or not on PATH*"])


def test_unreachable_host_errors_and_is_probed_once(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider", "--gpu-host", "ssh://root@127.0.0.1:1")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*root@127.0.0.1:1: ssh failed: connection refused*"])
    assert "During handling" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--gpu-host", "gpu;reboot"), {}, "ERROR: --gpu-host 'gpu;reboot': *not a host name*"),
        (("--gpu-host", "gpu; rm -rf /"), {}, "ERROR: --gpu-host 'gpu; rm -rf /': contains whitespace*"),
        (("--gpu-host=-oProxyCommand=x",), {}, "ERROR: --gpu-host '-oProxyCommand=x': *"),
        (("--gpu-ids", "0,x"), {}, "ERROR: --gpu-ids '0,x': expected comma-separated GPU indexes like 0,1,2,3*"),
        ((), {"GPUREADY_GPU_MAX_USED_MIB": "-5"},
         "ERROR: $GPUREADY_GPU_MAX_USED_MIB '-5': expected a whole number >= 0"),
        (("--gpu-reader", "magic"), {}, "ERROR: --gpu-reader 'magic': expected one of auto, nvml, nvidia-smi"),
        (("--ssh-option", "NoEquals"), {}, "ERROR: --ssh-option 'NoEquals': expected 'Key=Value', as ssh -o takes it"),
        (("--ssh-option", "ControlPath=/tmp/x"), {},
         "ERROR: --ssh-option 'ControlPath=/tmp/x': ControlPath is set by pytest-gpuready*"),
        (("--gpu-host", "ssh://h:99999"), {}, "ERROR: --gpu-host 'ssh://h:99999': port 99999 is out of range*"),
    ],
)
def test_bad_options_are_one_line_usage_errors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                               args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()


def test_bad_ini_value_names_the_ini_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpu_ids = one\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ini gpu_ids 'one': expected comma-separated GPU indexes*"])


def test_precedence_cli_over_env_over_ini(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\ngpu_ids = 0\ngpu_max_used_mib = 7\n")
    pytester.makepyfile("""
        from pytest_gpuready.plugin.options import GPU_IDS, GPU_MAX_USED_MIB

        def test_resolved(pytestconfig):
            print("ids", GPU_IDS.get(pytestconfig), "max", GPU_MAX_USED_MIB.get(pytestconfig))
    """)
    monkeypatch.setenv("GPUREADY_GPU_IDS", "1")
    result = pytester.runpytest("-s")
    result.stdout.fnmatch_lines(["*ids (1,) max 7*"])  # env beats ini; ini beats default
    result = pytester.runpytest("-s", "--gpu-ids", "2,3")
    result.stdout.fnmatch_lines(["*ids (2, 3) max 7*"])  # CLI beats env


def test_marker_fails_before_the_body_with_evidence(pytester: pytest.Pytester, standin: Standin) -> None:
    """A measured violation in setup is FAILED (not ERROR), and the test's body never runs."""
    standin("rtx8-tp4-loaded")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpus_clean(gpus=[0, 1, 2, 3])
        def test_deploy_on_first_four():
            open("body-ran", "w").close()

        @pytest.mark.gpus_clean(gpus=[4, 5, 6, 7], max_used_mib=8)
        def test_deploy_on_last_four():
            pass

        def test_unmarked_needs_no_probe():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_deploy_on_first_four _*",
        "4 of 4 GPUs on local are not clean (tolerance 64 MiB)",
        "  GPU 3: 96721 MiB used*",
    ])
    result.stdout.fnmatch_lines(["FAILED *::test_deploy_on_first_four*"])
    assert "All traceback entries are hidden" not in result.stdout.str()
    assert not (pytester.path / "body-ran").exists()


def test_marker_with_a_typo_is_reported(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpus_clean(gpu=[0])
        def test_x():
            pass

        @pytest.mark.gpus_clean(gpus="0")
        def test_y():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([
        "@pytest.mark.gpus_clean: unexpected argument gpu; expected keyword arguments gpus=, max_used_mib=",
        "@pytest.mark.gpus_clean: gpus='0'; expected a list of GPU indexes like [0, 1]",
    ])


def test_fixtures_compose_in_user_tests(pytester: pytest.Pytester, standin: Standin) -> None:
    standin("h200-idle")
    pytester.makepyfile("""
        def test_uses_fixtures(gpus_clean, gpu_snapshot, gpu_host):
            assert gpus_clean.ok
            assert gpu_snapshot.require_gpus()[0].name == "NVIDIA H200"
            assert gpu_host.name == "local"
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--junitxml=report.xml")
    result.assert_outcomes(passed=1)
    junit = (pytester.path / "report.xml").read_text()
    assert 'name="gpuready.gpus_clean" value="1 GPUs on local are clean' in junit


@pytest.fixture
def leftover() -> Iterator[Path]:
    path = Path("/dev/shm") / f"psm_gpureadytest_{uuid.uuid4().hex[:8]}"
    path.write_bytes(b"\0" * 4096)
    yield path
    path.unlink(missing_ok=True)


def test_shm_marker_reports_and_optionally_removes_leftovers(pytester: pytest.Pytester, standin: Standin,
                                                             leftover: Path) -> None:
    standin("h200-idle")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.shm_clean(min_free_mib=0)
        def test_x():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"  /dev/shm/{leftover.name}: 0.0 MiB, owner *"])
    assert leftover.exists()  # nothing is deleted unless asked
    import os

    if os.geteuid() != 0:
        pytest.skip("removal needs root: only root can see every process's open files")
    # only this test's file may be judged and removed: other runs on this machine leave theirs meanwhile
    result = pytester.runpytest("-p", "no:cacheprovider", "--shm-remove-leftovers",
                                "--shm-leak-pattern", leftover.name)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"gpuready: removed from /dev/shm on local: /dev/shm/{leftover.name}"])
    assert not leftover.exists()


def test_shm_removal_keeps_a_held_file_whatever_its_name(pytester: pytest.Pytester, standin: Standin) -> None:
    """The issue's case: ``vllm cache X`` held open by a live process was removed, because the
    open-file listing cut the path at the first space. Now it is kept and a free twin is removed."""
    import os
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("removal needs root: only root can see every process's open files")
    standin("h200-idle")
    tag = uuid.uuid4().hex[:8]
    held = Path(f"/dev/shm/vllm cache X-{tag}")
    free = Path(f"/dev/shm/vllm cache\nfree '{tag}'")
    for path in (held, free):
        path.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1], 'rb'); "
                               "print('open', flush=True); sys.stdin.read()", str(held)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        pytester.makepyfile("""
            import pytest

            @pytest.mark.shm_clean(min_free_mib=0)
            def test_x():
                pass
        """)
        pytester.makeini("[pytest]\nfilterwarnings = ignore::pytest_gpuready.errors.GpuReadyWarning\n")
        result = pytester.runpytest("-p", "no:cacheprovider", "--shm-remove-leftovers",
                                    "--shm-leak-pattern", f"*{tag}*")  # never another run's files
        # the name is shown on one line, its newline escaped
        removed_line = f"gpuready: removed from /dev/shm on local: \"/dev/shm/vllm cache\\nfree '{tag}'\""
        result.stdout.fnmatch_lines([removed_line])
        assert f"vllm cache X-{tag}" not in result.stdout.str()
        assert held.exists()  # a live process holds it: never removed
        assert not free.exists()
        assert "Traceback" not in result.stdout.str()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
        assert holder.stdout is not None
        holder.stdout.close()
        for path in (held, free):
            path.unlink(missing_ok=True)


def test_names_holding_commas_keep_every_number_in_place(pytester: pytest.Pytester, standin: Standin) -> None:
    """The issue's misread: a comma in a name shifted columns ('143771 MiB used', or a ValueError
    traceback for the process row). Anchored from both ends, every number lands in its field."""
    standin("comma-names")
    result = pytester.runpytest(*PREFLIGHT, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "gpuready: host local via nvidia-smi, driver 580.159.04, 1x NVIDIA H200, rev. A (143771 MiB, SM90)*",
        "  GPU 0: 21007 MiB used, held by pid 431 (/opt/serving, v2/bin/python3*) 20998 MiB",
    ])
    assert "143771 MiB used" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


@pytest.mark.parametrize(("value", "message"), [
    ("/dev/shm/psm_*", "ERROR: --shm-leak-pattern '/dev/shm/psm_*': '/dev/shm/psm_*' is not a file name pattern "
                       "(no '/'): /dev/shm names are matched, not paths"),
    (" ", "ERROR: --shm-leak-pattern ' ': expected at least one file name pattern like 'psm_*'"),
])
def test_bad_leak_pattern_is_a_usage_error(pytester: pytest.Pytester, value: str, message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", "--shm-leak-pattern", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message.replace("[", "[[]")])
