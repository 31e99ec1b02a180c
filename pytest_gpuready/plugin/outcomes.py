"""Turning Verdicts and probe errors into pytest outcomes, the same way in every fixture and test.

- a failed Verdict fails the test with its message and no traceback (the message is the point);
- an undecided Verdict (``needs`` set: it lacks an input such as the GPU architecture) skips
  with its message, which says what to pass;
- its warnings go to pytest's warnings summary as :class:`GpuReadyWarning`;
- :class:`NoGpuError` skips with its reason (no GPU here and none was asked for);
- any other :class:`GpuReadyError` (unreachable host, broken driver, garbled output) fails with
  its cause: a check that could not measure never passes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import pytest

from pytest_gpuready.errors import GpuReadyError, GpuReadyWarning, NoGpuError
from pytest_gpuready.plugin.recording import record_verdict
from pytest_gpuready.verdict import Verdict

T = TypeVar("T")


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
        pytest.fail(verdict.message, pytrace=False)
    return verdict


def checked(measure: Callable[[], T]) -> T:
    """Run ``measure``; map plugin errors to skip (no GPU) or a clean one-line failure.

    A function rather than a context manager so the reported location is the caller's line, and
    the skip or failure is raised outside the ``except`` block so no exception chain is printed.
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
    pytest.fail(failure, pytrace=False)
