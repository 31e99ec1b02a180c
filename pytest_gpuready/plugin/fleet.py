"""Per-host parametrization: every host-bound test runs once per host, with the host in its id.

A test is *host-bound* when its fixture closure holds one of :data:`HOST_BOUND_FIXTURES`
(``gpu_host``, ``gpu_snapshot``, ``gpus_clean``, ``shm_clean``, ``gpu_health``, ``model_spec``, ``deployment``,
``vllm_server``, ``benchmark_serving``, or a fixture of the user's that depends on one), or when it
carries one of :data:`HOST_BOUND_MARKERS`. With several hosts, :func:`pytest_generate_tests`
parametrizes the hidden session-scoped fixture ``_gpuready_host`` (indirect, ids = the hosts'
display names) for exactly those tests: ``test_gpus_are_clean[gpu-box-7]``. With one host
nothing is parametrized, so test ids stay as they were (what pytest-testinfra's users asked
for in pytest-testinfra#232).

``_gpuready_host`` is autouse so that markers and fixtures can find the test's host with
:func:`~pytest_gpuready.plugin.host_session.host_session_of` without every test naming it; it
only hands out a :class:`HostSession` (nothing is contacted). Session scope makes pytest order
the tests host by host, and lets the session-scoped ``gpu_host`` and ``vllm_server`` exist once
per host.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pytest_gpuready.plugin.host_session import HOST_FIXTURE, HostSession, get_host_registry, under_xdist
from pytest_gpuready.plugin.markers import HOST_BOUND_MARKERS

HOST_BOUND_FIXTURES = frozenset({
    "gpu_host", "gpu_snapshot", "gpus_clean", "shm_clean", "gpu_health", "model_spec", "deployment", "vllm_server",
    "benchmark_serving",
})

_HOST_OF_ITEM_KEY = pytest.StashKey[str | None]()


def is_host_bound(fixturenames: Iterable[str], definition: pytest.Item) -> bool:
    """True when a test reads a host: through a host-bound fixture or a host-bound marker."""
    if not HOST_BOUND_FIXTURES.isdisjoint(fixturenames):
        return True
    return any(definition.get_closest_marker(name) is not None for name in HOST_BOUND_MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize host-bound tests per host (trylast: the host comes last in the id)."""
    registry = get_host_registry(metafunc.config)
    if not registry.is_fleet or HOST_FIXTURE not in metafunc.fixturenames:
        return
    if not is_host_bound(metafunc.fixturenames, metafunc.definition):
        return
    names = list(registry)
    metafunc.parametrize(HOST_FIXTURE, names, indirect=True, ids=names, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """In one process, probe every host that a selected test reads, all at once, before the first test.

    Each host's tests would otherwise probe it when the first of them runs, host after host, so a
    fleet would cost the sum of its hosts' network time (ssh's handshake, the probe's round trip)
    instead of its slowest host's. The header does the same when it is shown; this covers
    ``--no-header`` and runs where the header does not probe. Under xdist each worker probes its
    own hosts when their tests run (it does not know them before), and nothing runs for
    ``--collect-only``.
    """
    config = session.config
    registry = get_host_registry(config)
    if not registry.is_fleet or config.option.collectonly or under_xdist(config):
        return
    wanted = {name for name in (host_of_item(item) for item in session.items) if name is not None}
    if len(wanted) > 1:
        registry.snapshot_all(wanted)  # each session caches its snapshot or its error for the tests


def host_of_item(item: pytest.Item) -> str | None:
    """The display name of the host a collected test runs against; None when it reads no host."""
    cached = item.stash.get(_HOST_OF_ITEM_KEY, "")
    if cached != "":
        return cached
    registry = get_host_registry(item.config)
    callspec = getattr(item, "callspec", None)
    name: str | None = None
    if callspec is not None and HOST_FIXTURE in callspec.params:
        name = str(callspec.params[HOST_FIXTURE])
    elif is_host_bound(getattr(item, "fixturenames", ()), item):
        name = registry.first.display_name
    item.stash[_HOST_OF_ITEM_KEY] = name
    return name


@pytest.fixture(scope="session", autouse=True)
def _gpuready_host(request: pytest.FixtureRequest) -> HostSession:
    """The HostSession of this test's host: its parameter with several hosts, else the only one."""
    registry = get_host_registry(request.config)
    name = getattr(request, "param", None)
    return registry[name] if name is not None else registry.first
