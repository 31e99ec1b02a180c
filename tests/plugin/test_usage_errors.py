"""First-hour command-line mistakes: one line that says what was meant, exit 4 (plugin/usage.py)."""

from __future__ import annotations

import sys

import pytest

from pytest_gpuready.plugin.usage import check_unknown, needs_xdist, suggestion


@pytest.mark.parametrize("args", [("--gpu-hots", "root@x"), ("--gpu-hots=root@x",)])
def test_a_misspelt_option_names_the_one_meant(pytester: pytest.Pytester, args: tuple[str, ...]) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: unrecognized argument --gpu-hots: did you mean --gpu-host?"])
    assert "unrecognized arguments" not in result.stderr.str()


def test_an_option_nothing_like_ours_keeps_pytests_own_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--colour=yes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --colour=yes*"])
    assert "did you mean" not in result.stderr.str()


def test_an_option_of_the_users_own_is_never_flagged(pytester: pytest.Pytester) -> None:
    """A conftest may declare a name close to ours: it is known by the time the line is checked."""
    pytester.makeconftest("""
        def pytest_addoption(parser):
            parser.addoption("--gpu-hots", default=None)
    """)
    pytester.makepyfile("def test_x(pytestconfig): assert pytestconfig.getoption('gpu_hots') == 'x'")
    result = pytester.runpytest("--gpu-hots", "x")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("args", [("-n", "2"), ("-n2",), ("--dist", "load")])
def test_n_without_xdist_says_to_install_the_fleet_extra(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    # As if pytest-xdist were not installed: not importable, and no plugin autoloaded (pytest would
    # otherwise walk every installed plugin's modules, xdist's among them).
    monkeypatch.setitem(sys.modules, "xdist", None)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "pytest_gpuready.plugin", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (f"ERROR: {args[0]} needs pytest-xdist, which is not installed: pip install 'pytest-gpuready[fleet]'"
            in result.stderr.str())


def test_n_with_xdist_installed_is_xdists() -> None:
    check_unknown(["-n"], xdist_installed=True)  # xdist not loaded (-p no:xdist): pytest's own message


def test_what_counts_as_an_xdist_argument_and_what_is_close() -> None:
    assert needs_xdist(["-n"]) == "-n"
    assert needs_xdist(["--numprocesses=4"]) == "--numprocesses=4"
    assert needs_xdist(["-nauto"]) == "-nauto"
    assert needs_xdist(["-x", "--nope"]) is None
    assert suggestion("--gpu-hosts") == "--gpu-host"
    assert suggestion("--shm-remove-leftover") == "--shm-remove-leftovers"
    assert suggestion("--gpuready-reprot=x.json") == "--gpuready-report"
    assert suggestion("--verbose") is None
    assert suggestion("-x") is None
