"""GPU health in pytest: the ``gpu_health`` fixture and marker.

Loaded by :mod:`pytest_gpuready.plugin`. The checks are :mod:`pytest_gpuready.host.health_checks`
and read the test's host snapshot, which the probe took in its one round trip; this module only
applies the marker's layout and turns the Verdict into an outcome (fail: measured unhealthy;
error: could not measure; skip: no GPU here and none asked for).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pytest_gpuready.host.health_checks import check_gpu_health
from pytest_gpuready.plugin.host_fixtures import snapshot_for_gpu_checks
from pytest_gpuready.plugin.host_session import host_session_of
from pytest_gpuready.plugin.markers import HEALTH_MARKERS, arguments
from pytest_gpuready.plugin.options import GPU_IDS
from pytest_gpuready.plugin.outcomes import checked, expect
from pytest_gpuready.verdict import Verdict


def pytest_configure(config: pytest.Config) -> None:
    for declared in HEALTH_MARKERS:
        config.addinivalue_line("markers", declared.line)


def _layout(marker: pytest.Mark | None) -> dict[str, Any]:
    __tracebackhide__ = True
    if marker is None:
        return {}
    kwargs = arguments(marker)
    for name in ("tp", "pp", "dp"):
        value = kwargs.get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            pytest.fail(f"@pytest.mark.gpu_health: {name}={value!r}; expected a whole number >= 1", pytrace=False)
    gpus = kwargs.get("gpus")
    if gpus is not None and not (isinstance(gpus, (list, tuple)) and all(isinstance(g, int) for g in gpus)):
        pytest.fail(f"@pytest.mark.gpu_health: gpus={gpus!r}; expected a list of GPU indexes like [0, 1]",
                    pytrace=False)
    return kwargs


def gpu_health_verdict(request: pytest.FixtureRequest, tp: int = 1, pp: int = 1, dp: int = 1,
                       gpus: Sequence[int] | None = None) -> Verdict:
    """:func:`check_gpu_health` of the test's host, failing the test unless healthy."""
    __tracebackhide__ = True
    config = request.config
    session = host_session_of(request)
    selected = gpus if gpus is not None else GPU_IDS.get(config)
    verdict = checked(lambda: check_gpu_health(snapshot_for_gpu_checks(config, session, request.node),
                                               gpus=selected, tp=tp, pp=pp, dp=dp))
    return expect(verdict, request.node, "gpu_health")


@pytest.fixture
def gpu_health(request: pytest.FixtureRequest) -> Verdict:
    """Fail in setup unless the test's host is healthy (the ``gpu_health`` marker's layout, default TP = 1)."""
    __tracebackhide__ = True
    return gpu_health_verdict(request, **_layout(request.node.get_closest_marker("gpu_health")))


@pytest.fixture(autouse=True)
def _gpuready_health_marker(request: pytest.FixtureRequest) -> None:
    """Apply the ``gpu_health`` marker in setup (nothing is probed for unmarked tests)."""
    __tracebackhide__ = True
    marker = request.node.get_closest_marker("gpu_health")
    if marker is not None and "gpu_health" not in request.fixturenames:
        gpu_health_verdict(request, **_layout(marker))
