"""Host-level options, fixtures and markers: ``gpu_host``, ``gpu_snapshot``, ``gpus_clean``, ``shm_clean``.

Loaded by :mod:`pytest_gpuready.plugin`. The checks themselves live in
:mod:`pytest_gpuready.host.checks`; this module only resolves settings, owns the session's
:class:`HostRegistry` (one :class:`HostSession` per host), and turns Verdicts into test outcomes.
Each fixture works on its test's host (:func:`host_session_of`); with several hosts the tests
are parametrized per host by :mod:`pytest_gpuready.plugin.fleet`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.errors import HostSpecError
from pytest_gpuready.host.checks import check_gpus_clean, check_shm_clean
from pytest_gpuready.host.host_list import display_names, merge_hosts, read_hosts_file
from pytest_gpuready.host.hosts import Host, HostSpec
from pytest_gpuready.host.orphans import find_running_engines, spared_line
from pytest_gpuready.host.recovery import reap_orphans_and_reprobe, remove_shm_leftovers_and_recheck
from pytest_gpuready.host.shm import shm_display_name
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.host_session import (
    HOST_REGISTRY_KEY,
    HostRegistry,
    HostSession,
    get_host_registry,
    host_session_of,
    under_xdist,
)
from pytest_gpuready.plugin.markers import HOST_MARKERS, arguments
from pytest_gpuready.plugin.options import (
    GPU_IDS,
    GPU_MAX_USED_MIB,
    GPU_REAP_ORPHANS,
    HOST_SETTINGS,
    SHM_LEAK_PATTERNS,
    SHM_MIN_FREE_MIB,
    SHM_REMOVE_LEFTOVERS,
)
from pytest_gpuready.plugin.outcomes import checked, expect
from pytest_gpuready.plugin.report import header_lines
from pytest_gpuready.verdict import Verdict


def pytest_addoption(parser: pytest.Parser) -> None:
    s.add_settings(parser, HOST_SETTINGS)


def _hosts_from(resolved: dict[str, Any], config: pytest.Config) -> tuple[tuple[HostSpec, ...], bool]:
    """The hosts given (``--gpu-host`` then ``--gpu-hosts-file``) and whether any was named at all."""
    given: tuple[HostSpec, ...] = resolved["gpu_host"] or ()
    path = resolved["gpu_hosts_file"]
    from_file: tuple[HostSpec, ...] = ()
    if path is not None:
        full = Path(config.invocation_params.dir, os.path.expanduser(path))
        try:
            from_file = read_hosts_file(str(full))
        except HostSpecError as exc:
            raise pytest.UsageError(f"--gpu-hosts-file {exc}") from None
    try:
        specs = merge_hosts(given, from_file)
        display_names(specs)
    except HostSpecError as exc:
        raise pytest.UsageError(f"--gpu-host: {exc}") from None
    if not specs:
        return (HostSpec("local"),), False
    return specs, True


def pytest_configure(config: pytest.Config) -> None:
    for declared in HOST_MARKERS:
        config.addinivalue_line("markers", declared.line)
    resolved = s.resolve_all(config, HOST_SETTINGS)
    specs, named = _hosts_from(resolved, config)
    if resolved["gpu_reader"] == "nvml" and any(spec.kind == "ssh" for spec in specs):
        raise pytest.UsageError(
            "--gpu-reader nvml reads this machine only; a remote --gpu-host needs auto or nvidia-smi"
        )
    config.stash[HOST_REGISTRY_KEY] = HostRegistry([
        HostSession(
            spec=spec,
            named_explicitly=named,
            reader=resolved["gpu_reader"],
            identity_file=resolved["ssh_identity"],
            ssh_options=resolved["ssh_options"],
            connect_timeout=resolved["ssh_connect_timeout"],
            probe_timeout=resolved["gpu_probe_timeout"],
            name=name,
        )
        for spec, name in zip(specs, display_names(specs), strict=True)
    ])


def pytest_unconfigure(config: pytest.Config) -> None:
    registry = config.stash.get(HOST_REGISTRY_KEY, None)
    if registry is not None:
        registry.close()


def _wants_probe_at_start(config: pytest.Config) -> bool:
    """Probe for the header only when the user aims at GPUs: a named host or the built-in preflight.

    Never under xdist: each worker probes the hosts whose tests it runs, when they run; probing
    every host for a header (the controller's, or each worker's, which nobody sees) would cost
    each host more connections and serialize the fleet.
    """
    if config.option.collectonly or under_xdist(config):
        return False
    session = get_host_registry(config).first
    return session.named_explicitly or any("pytest_gpuready" in str(arg) for arg in config.args)


def pytest_report_header(config: pytest.Config) -> list[str]:
    registry = get_host_registry(config)
    if not _wants_probe_at_start(config):
        if registry.is_fleet:
            return [f"gpuready: {len(registry)} hosts: {', '.join(registry)} (each probed when a check first asks)"]
        return [f"gpuready: host {registry.first.spec} (probed when a check first asks)"]
    lines = []
    for session, outcome in registry.snapshot_all():  # every host at once: a fleet waits for its slowest
        if isinstance(outcome, Exception):  # the header must never abort the session; the checks report it
            cause = str(outcome)
            named = cause if cause.startswith(f"{session.spec}: ") else f"{session.spec}: {cause}"
            lines.append(f"gpuready: host {named}")
            continue
        try:
            lines += header_lines(outcome)
        except Exception as exc:
            lines.append(f"gpuready: host {session.spec}: {exc}")
    return lines


@pytest.fixture(scope="session")
def gpu_host(_gpuready_host: HostSession) -> Host:
    """The connected GPU host of this test (``--gpu-host``; default the local machine)."""
    return checked(lambda: _gpuready_host.host)


def _say(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\ngpuready: {line}")
        reporter.flush()


_SPARED_SAID = pytest.StashKey[set[tuple[str, int, "int | None"]]]()
"""The running engines the reaper has already said it leaves alone (host, pid, start time): said once a run."""


def snapshot_for_gpu_checks(config: pytest.Config, session: HostSession, node: pytest.Item | None = None,
                            ) -> HostSnapshot:
    """The host's snapshot; with ``--gpu-reap-orphans``, taken after orphaned vLLM engines were stopped.

    The reaping and the re-probe until the driver lets go are :mod:`pytest_gpuready.host.recovery`'s
    (it signals only what :func:`~pytest_gpuready.host.orphans.find_orphans` proves orphaned: the
    process that started it is gone); this prints and records what was stopped, and says once which
    GPU-holding engines were left alone because their owner is alive.
    """
    snap = session.snapshot()
    if not GPU_REAP_ORPHANS.get(config):
        return snap
    said = config.stash.setdefault(_SPARED_SAID, set())
    running = [e for e in find_running_engines(snap)
               if (session.host.name, e.process.pid, e.process.start_ticks) not in said]
    line = spared_line(session.host.name, running)
    if line is not None:
        said.update((session.host.name, e.process.pid, e.process.start_ticks) for e in running)
        _say(config, line)
    report, snap = reap_orphans_and_reprobe(session.host, snap, lambda: session.snapshot(refresh=True))
    if report is None:
        return snap
    for line in report.lines():
        _say(config, line)
    if node is not None and report.stopped:
        node.user_properties.append(("gpuready.orphans_stopped", " ".join(
            f"{o.pid}:{o.process.used_memory_mib}" for o in report.stopped)))
    return snap


@pytest.fixture
def gpu_snapshot(_gpuready_host: HostSession, request: pytest.FixtureRequest) -> HostSnapshot:
    """What the test's host looks like now: GPUs, processes, /dev/shm, topology, vLLM version.

    Taken once and reused until something marks it stale (the vLLM server fixtures do). With
    ``--gpu-reap-orphans`` orphaned vLLM engines are stopped first.
    """
    return checked(lambda: snapshot_for_gpu_checks(request.config, _gpuready_host, request.node))


def _gpus_clean(request: pytest.FixtureRequest, gpus: Sequence[int] | None, max_used_mib: int | None) -> Verdict:
    __tracebackhide__ = True
    config = request.config
    session = host_session_of(request)
    verdict = checked(lambda: check_gpus_clean(
        snapshot_for_gpu_checks(config, session, request.node),
        gpus=gpus if gpus is not None else GPU_IDS.get(config),
        max_used_mib=max_used_mib if max_used_mib is not None else GPU_MAX_USED_MIB.get(config),
    ))
    return expect(verdict, request.node, "gpus_clean")


def _shm_clean(request: pytest.FixtureRequest, min_free_mib: int | None) -> Verdict:
    __tracebackhide__ = True
    config = request.config
    session = host_session_of(request)
    minimum = min_free_mib if min_free_mib is not None else SHM_MIN_FREE_MIB.get(config)
    patterns = SHM_LEAK_PATTERNS.get(config)
    verdict = checked(lambda: check_shm_clean(session.snapshot(), min_free_mib=minimum, patterns=patterns))
    if not verdict.ok and SHM_REMOVE_LEFTOVERS.get(config):
        cleanup = checked(lambda: remove_shm_leftovers_and_recheck(
            session.host, session.snapshot(), lambda: session.snapshot(refresh=True), min_free_mib=minimum,
            patterns=patterns))
        if cleanup.removed:
            shown = ", ".join(shm_display_name(name) for name in cleanup.removed)
            request.node.user_properties.append(("gpuready.shm_removed", shown))
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"\ngpuready: removed from /dev/shm on {session.host.name}: {shown}")
        verdict = cleanup.verdict
    return expect(verdict, request.node, "shm_clean")


@pytest.fixture
def gpus_clean(request: pytest.FixtureRequest) -> Verdict:
    """Fail the test (before its body) unless the selected GPUs (``--gpu-ids``, default all) are clean;
    returns the Verdict."""
    __tracebackhide__ = True
    return _gpus_clean(request, None, None)


@pytest.fixture
def shm_clean(request: pytest.FixtureRequest) -> Verdict:
    """Fail the test (before its body) if /dev/shm holds leftovers or too little free space; returns the Verdict."""
    __tracebackhide__ = True
    return _shm_clean(request, None)


@pytest.fixture(autouse=True)
def _gpuready_host_markers(request: pytest.FixtureRequest) -> None:
    """Apply ``gpus_clean`` / ``shm_clean`` markers in setup (nothing is probed for unmarked tests)."""
    __tracebackhide__ = True
    marker = request.node.get_closest_marker("gpus_clean")
    if marker is not None:
        kwargs = arguments(marker)
        gpus = kwargs.get("gpus")
        if gpus is not None and not (isinstance(gpus, (list, tuple)) and all(isinstance(g, int) for g in gpus)):
            pytest.fail(f"@pytest.mark.gpus_clean: gpus={gpus!r}; expected a list of GPU indexes like [0, 1]",
                        pytrace=False)
        _gpus_clean(request, gpus, kwargs.get("max_used_mib"))
    marker = request.node.get_closest_marker("shm_clean")
    if marker is not None:
        _shm_clean(request, arguments(marker).get("min_free_mib"))
