"""Turning Verdicts and probe errors into pytest outcomes, the same way in every fixture and test.

The rule (README, "What pass, fail, skip and error mean"): a check that measured a violation
**fails**; a check that could not measure **errors**; neither ever passes.

- a failed Verdict fails the test with its message and no traceback (the message is the point);
  raised in setup (a marker, the ``gpus_clean`` fixture), the failure is held and raised when the
  test is called, so a measured violation reads FAILED, not ERROR, while the setup after it (a
  server to launch) still does not run;
- an undecided Verdict (``needs`` set: it lacks an input such as the GPU architecture) skips
  with its message, which says what to pass;
- its warnings go to pytest's warnings summary as :class:`GpuReadyWarning`;
- :class:`NoGpuError` skips with its reason (no GPU here and none was asked for);
- any other :class:`GpuReadyError` (unreachable host, broken driver, garbled output) is a
  could-not-measure: ERROR, whether it happens in setup or inside the test's body.

Either way the plugin's one-line cause is the whole message: pytest's "All traceback entries are
hidden" line under it is dropped.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pytest_gpuready.errors import GpuReadyError, GpuReadyWarning, NoGpuError
from pytest_gpuready.plugin.recording import record_verdict
from pytest_gpuready.verdict import Verdict

T = TypeVar("T")

UNMEASURED_ATTRIBUTE = "gpuready_unmeasured"
"""Set on a call-phase TestReport whose failure is a could-not-measure (counted as an error);
a plain attribute, so xdist carries it to the controller with the report."""

_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


class MeasuredViolation(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A check measured and its invariant does not hold: the test fails."""


class CouldNotMeasure(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """A check could not measure (host unreachable, driver not answering): the test errors."""


_HELD_KEY = pytest.StashKey[MeasuredViolation]()


def expect(verdict: Verdict, node: pytest.Item | None = None, name: str | None = None) -> Verdict:
    """Fail the current test unless ``verdict`` is ok; show its warnings; return it.

    With ``node`` and ``name`` the summary is also recorded as a JUnit property ``gpuready.NAME``,
    and the whole Verdict (details, evidence, warnings) in the JSON report.
    """
    __tracebackhide__ = True
    if node is not None and name is not None:
        record_verdict(node, name, verdict)
    for text in verdict.warnings:
        warnings.warn(GpuReadyWarning(text), stacklevel=2)
    if verdict.needs is not None:
        pytest.skip(verdict.message)
    if not verdict.ok:
        raise MeasuredViolation(verdict.message, pytrace=False)
    return verdict


def could_not_measure(message: str) -> None:
    """End the test as an ERROR: ``message`` says what could not be measured and why."""
    __tracebackhide__ = True
    raise CouldNotMeasure(message, pytrace=False)


def checked(measure: Callable[[], T]) -> T:
    """Run ``measure``; map plugin errors to skip (no GPU) or a clean one-line error.

    A function rather than a context manager so the reported location is the caller's line, and
    the skip or error is raised outside the ``except`` block so no exception chain is printed.
    """
    __tracebackhide__ = True
    skip_reason: str | None = None
    try:
        return measure()
    except NoGpuError as exc:
        skip_reason = str(exc)
    except GpuReadyError as exc:
        failure = str(exc)
    if skip_reason is not None:
        pytest.skip(skip_reason)
    could_not_measure(failure)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- hooks

@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Hold a measured violation raised in setup; the test fails with it when called."""
    try:
        yield
    except MeasuredViolation as exc:
        item.stash[_HELD_KEY] = exc


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Fail the test with the violation its setup measured, before its body runs."""
    held = item.stash.get(_HELD_KEY, None)
    if held is not None:
        del item.stash[_HELD_KEY]
        raise held


def _raised_by_plugin(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    return any(str(entry.path).startswith(_PACKAGE_DIR) for entry in excinfo.traceback)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    excinfo = call.excinfo
    if excinfo is None or not isinstance(excinfo.value, pytest.fail.Exception):
        return report
    if call.when == "call" and isinstance(excinfo.value, CouldNotMeasure):
        setattr(report, UNMEASURED_ATTRIBUTE, True)
    if not excinfo.value.pytrace and _raised_by_plugin(excinfo):
        # the message is complete: drop pytest's "All traceback entries are hidden" line under it,
        # and let the short summary quote the cause rather than the exception's class
        for reprtraceback, reprcrash, _ in getattr(report.longrepr, "chain", ()):
            reprtraceback.extraline = None
            if reprcrash is not None:
                reprcrash.message = str(excinfo.value.msg).split("\n", 1)[0]
    return report


def counts_as_error(report: pytest.TestReport | pytest.CollectReport) -> bool:
    """A failed report pytest would call FAILED that is a could-not-measure (an ERROR)."""
    return bool(report.failed and getattr(report, UNMEASURED_ATTRIBUTE, False))


def pytest_report_teststatus(report: pytest.TestReport | pytest.CollectReport,
                             config: pytest.Config) -> tuple[str, str, str] | None:
    if counts_as_error(report):
        return "error", "E", "ERROR"
    return None
