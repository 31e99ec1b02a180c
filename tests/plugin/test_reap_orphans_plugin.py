"""``--gpu-reap-orphans`` end to end with pytester: the built-in preflight, a real orphaned stand-in
engine (a real process named ``VLLM::EngineCore``, re-parented to pid 1) and the labelled stand-in
nvidia-smi listing its pid in the captured H200 row (``h200-orphan-enginecore``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engines import job_engine, orphaned_engine, served_engine

Standin = Callable[[str], Path]
PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "gpus", "-p", "no:cacheprovider")


def test_without_the_option_the_orphan_is_named_and_left_alone(
    pytester: pytest.Pytester, standin: Standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("h200-orphan-enginecore")
    with orphaned_engine() as engine:
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        result = pytester.runpytest(*PREFLIGHT)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([
            f"  GPU 0: 71832 MiB used, held by pid {engine.pid} (VLLM::EngineCore, an orphaned vLLM engine: its API "
            f"server is gone, parent pid 1) 71824 MiB; stop it with: kill {engine.pid}",
        ])
        assert engine.alive()


def test_with_the_option_the_orphan_is_stopped_and_the_gpu_reads_clean(
    pytester: pytest.Pytester, standin: Standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("h200-orphan-enginecore")
    with orphaned_engine(ignore_term=True) as engine:
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        result = pytester.runpytest(*PREFLIGHT, "--gpu-reap-orphans", "--junitxml=junit.xml")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([
            f"gpuready: stopped orphaned vLLM engines on local: pid {engine.pid} (VLLM::EngineCore) 71824 MiB "
            "on GPU 0 (needed SIGKILL)",
        ])
        assert not engine.alive()
        junit = (pytester.path / "junit.xml").read_text()
        assert f'name="gpuready.orphans_stopped" value="{engine.pid}:71824"' in junit


def test_the_env_var_turns_it_on_and_a_served_engine_is_never_touched(
    pytester: pytest.Pytester, standin: Standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("h200-orphan-enginecore")
    monkeypatch.setenv("GPUREADY_GPU_REAP_ORPHANS", "1")
    with served_engine() as engine:
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        result = pytester.runpytest(*PREFLIGHT)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([
            f"  GPU 0: 71832 MiB used, held by pid {engine.pid} (VLLM::EngineCore, a vLLM engine of the running "
            "server pid *) 71824 MiB",
        ])
        assert "stopped orphaned" not in result.stdout.str()
        assert engine.alive()


def test_a_running_jobs_engine_is_left_alone_and_its_owner_named(
    pytester: pytest.Pytester, standin: Standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine of a live ``python batch_infer.py`` (vLLM's ``LLM(...)``) is a running job: with the
    option on, nothing is signalled, the GPU check fails naming who holds the GPU, and the reaper says once
    (for two GPU checks) what it left running."""
    standin("h200-orphan-enginecore")
    pytester.makepyfile(test_two="""
        import pytest
        @pytest.mark.gpus_clean
        def test_a(): pass
        @pytest.mark.gpus_clean
        def test_b(): pass
    """)
    with job_engine(pytester.path) as engine:
        assert engine.api_server is not None
        owner = engine.api_server.pid
        monkeypatch.setenv("GPUREADY_STANDIN_PIDS", f"3504={engine.pid}")
        result = pytester.runpytest("--gpu-reap-orphans", "-p", "no:cacheprovider", "test_two.py")
        result.assert_outcomes(failed=2)  # a measured violation fails, in setup too
        held = (f"pid {engine.pid} (VLLM::EngineCore) of pid {owner} (*python batch_infer.py VLLM::EngineCore 0 300 0)"
                " 71824 MiB")
        result.stdout.fnmatch_lines([f"  GPU 0: 71832 MiB used, held by {held}"])
        said = [line for line in result.stdout.lines if line.startswith("gpuready: not stopped")]
        assert len(said) == 1
        assert fnmatch.fnmatch(said[0], "gpuready: not stopped on local, vLLM engines of a running job (their owner "
                               f"is alive): {held} on GPU 0")
        assert "stopped orphaned" not in result.stdout.str()
        assert engine.alive()
        assert engine.api_server.poll() is None


def test_an_orphaned_engine_that_holds_no_gpu_memory_is_never_touched(
    pytester: pytest.Pytester, standin: Standin
) -> None:
    """An orphaned ``VLLM::EngineCore`` that the driver does not list (it holds no GPU memory: a
    CPU-only engine, or one that has already released its context) is not the reaper's business."""
    standin("h200-idle")
    with orphaned_engine() as engine:
        result = pytester.runpytest(*PREFLIGHT, "--gpu-reap-orphans")
        result.assert_outcomes(passed=1)
        assert "stopped orphaned" not in result.stdout.str()
        assert engine.alive()


def test_a_bad_env_value_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_GPU_REAP_ORPHANS", "perhaps")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: $GPUREADY_GPU_REAP_ORPHANS 'perhaps': *"])
