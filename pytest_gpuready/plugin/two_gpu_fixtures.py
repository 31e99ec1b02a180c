"""Two-GPU checks in pytest: the opt-in ``gpu_p2p`` and ``nccl_allreduce`` markers and fixtures.

Loaded by :mod:`pytest_gpuready.plugin`. The checks are :mod:`pytest_gpuready.host.gpu_workers`:
a worker script run on the test's host by the Python that has torch (``--gpu-worker-python``),
judged here from what it printed; this module only picks the TP group and turns the Verdict into
an outcome (fail: measured broken or hung; error: could not run, no torch; skip: fewer than two
GPUs). Both take seconds to a minute, so nothing runs unless a test asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pytest_gpuready.host.gpu_workers import DEFAULT_SIZE_MB, check_nccl_allreduce, check_p2p_functional
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.host_fixtures import snapshot_for_gpu_checks
from pytest_gpuready.plugin.host_session import host_session_of
from pytest_gpuready.plugin.markers import TWO_GPU_MARKERS, arguments
from pytest_gpuready.plugin.options import GPU_IDS, GPU_WORKER_PYTHON, TWO_GPU_SETTINGS
from pytest_gpuready.plugin.outcomes import checked, expect
from pytest_gpuready.verdict import Verdict


def pytest_addoption(parser: pytest.Parser) -> None:
    s.add_settings(parser, TWO_GPU_SETTINGS)


def pytest_configure(config: pytest.Config) -> None:
    s.resolve_all(config, TWO_GPU_SETTINGS)
    for declared in TWO_GPU_MARKERS:
        config.addinivalue_line("markers", declared.line)


def _arguments(name: str, marker: pytest.Mark | None) -> dict[str, Any]:
    __tracebackhide__ = True
    if marker is None:
        return {}
    kwargs = arguments(marker)
    tp = kwargs.get("tp", 2)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 2:
        pytest.fail(f"@pytest.mark.{name}: tp={tp!r}; expected a whole number >= 2", pytrace=False)
    gpus = kwargs.get("gpus")
    if gpus is not None and not (isinstance(gpus, (list, tuple)) and len(gpus) >= 2
                                 and all(isinstance(g, int) for g in gpus)):
        pytest.fail(f"@pytest.mark.{name}: gpus={gpus!r}; expected two GPU indexes or more, like [0, 1]",
                    pytrace=False)
    for key in ("timeout", "size_mb", "min_busbw_gbps"):
        value = kwargs.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0):
            pytest.fail(f"@pytest.mark.{name}: {key}={value!r}; expected a number > 0", pytrace=False)
    return kwargs


def _group(request: pytest.FixtureRequest, tp: int, gpus: Sequence[int] | None) -> tuple[list[int], Any]:
    """The TP group: the marker's GPUs, else the first ``tp`` of ``--gpu-ids`` (or of all the host has)."""
    __tracebackhide__ = True
    session = host_session_of(request)
    snap = checked(lambda: snapshot_for_gpu_checks(request.config, session, request.node))
    if gpus is not None:
        return list(gpus), snap
    selected = GPU_IDS.get(request.config)
    present = [g.index for g in checked(snap.require_gpus) if selected is None or g.index in selected]
    if len(present) < tp:
        pytest.skip(f"{snap.host}: a TP={tp} group needs {tp} GPUs; {len(present)} selected here")
    return present[:tp], snap


def gpu_p2p_verdict(request: pytest.FixtureRequest, tp: int = 2, gpus: Sequence[int] | None = None,
                    timeout: float = 60.0) -> Verdict:
    __tracebackhide__ = True
    group, _ = _group(request, tp, gpus)
    host = host_session_of(request).host
    verdict = checked(lambda: check_p2p_functional(host, group, python=GPU_WORKER_PYTHON.get(request.config),
                                                   timeout_s=float(timeout)))
    return expect(verdict, request.node, "gpu_p2p")


def nccl_allreduce_verdict(request: pytest.FixtureRequest, tp: int = 2, gpus: Sequence[int] | None = None,
                           size_mb: int = DEFAULT_SIZE_MB, timeout: float = 120.0,
                           min_busbw_gbps: float | None = None) -> Verdict:
    __tracebackhide__ = True
    group, snap = _group(request, tp, gpus)
    host = host_session_of(request).host
    verdict = checked(lambda: check_nccl_allreduce(
        host, group, snap.require_topology(), python=GPU_WORKER_PYTHON.get(request.config), size_mb=int(size_mb),
        timeout_s=float(timeout), min_busbw_gbps=min_busbw_gbps))
    return expect(verdict, request.node, "nccl_allreduce")


@pytest.fixture
def gpu_p2p(request: pytest.FixtureRequest) -> Verdict:
    """Fail in setup unless P2P over CUDA IPC works for the TP group (the ``gpu_p2p`` marker's, default TP=2)."""
    __tracebackhide__ = True
    return gpu_p2p_verdict(request, **_arguments("gpu_p2p", request.node.get_closest_marker("gpu_p2p")))


@pytest.fixture
def nccl_allreduce(request: pytest.FixtureRequest) -> Verdict:
    """Fail in setup unless an NCCL all-reduce over the TP group is fast and right (the marker's, default TP=2)."""
    __tracebackhide__ = True
    marker = request.node.get_closest_marker("nccl_allreduce")
    return nccl_allreduce_verdict(request, **_arguments("nccl_allreduce", marker))


@pytest.fixture(autouse=True)
def _gpuready_two_gpu_markers(request: pytest.FixtureRequest) -> None:
    """Apply the ``gpu_p2p`` / ``nccl_allreduce`` markers in setup (nothing runs for unmarked tests)."""
    __tracebackhide__ = True
    for name, apply in (("gpu_p2p", gpu_p2p_verdict), ("nccl_allreduce", nccl_allreduce_verdict)):
        marker = request.node.get_closest_marker(name)
        if marker is not None and name not in request.fixturenames:
            apply(request, **_arguments(name, marker))
