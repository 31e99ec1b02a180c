"""Host-level options, fixtures and markers: ``gpu_host``, ``gpu_snapshot``, ``gpus_clean``, ``shm_clean``.

Loaded by :mod:`pytest_gpuready.plugin`. The checks themselves live in
:mod:`pytest_gpuready.host.checks`; this module only resolves settings, owns the session's
:class:`HostRegistry` (one :class:`HostSession` per host), and turns Verdicts into test outcomes.
Each fixture works on its test's host (:func:`host_session_of`); with several hosts the tests
are parametrized per host by :mod:`pytest_gpuready.plugin.fleet`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.errors import HostSpecError
from pytest_gpuready.host.checks import (
    DEFAULT_MAX_USED_MIB,
    DEFAULT_SHM_MIN_FREE_MIB,
    check_gpus_clean,
    check_shm_clean,
)
from pytest_gpuready.host.host_list import display_names, merge_hosts, read_hosts_file
from pytest_gpuready.host.hosts import Host, HostSpec, parse_host_spec, validate_ssh_option
from pytest_gpuready.host.orphans import find_orphans, find_running_engines, reap_orphans, spared_line
from pytest_gpuready.host.probe import DEFAULT_PROBE_TIMEOUT_S, READERS
from pytest_gpuready.host.shm import LEAK_PATTERNS, remove_leftovers, shm_display_name
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
from pytest_gpuready.plugin.outcomes import checked, expect
from pytest_gpuready.plugin.report import header_lines
from pytest_gpuready.verdict import Verdict


def _parse_hosts(text: str) -> tuple[HostSpec, ...]:
    """One host spec, or several (a repeated ``--gpu-host``; env and ini: one a line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("expected 'local', 'host', 'user@host' or 'ssh://user@host:port'")
    specs = []
    for line in lines:
        try:
            specs.append(parse_host_spec(line))
        except HostSpecError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise ValueError(reason if len(lines) == 1 else f"{line.strip()!r}: {reason}") from None
    try:
        return merge_hosts(specs)
    except HostSpecError as exc:
        raise ValueError(str(exc)) from None


def _parse_ssh_options(text: str) -> tuple[str, ...]:
    options = tuple(line.strip() for line in text.splitlines() if line.strip())
    for option in options:
        try:
            validate_ssh_option(option)
        except HostSpecError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
    return options


GPU_HOST: s.Setting[tuple[HostSpec, ...] | None] = s.Setting(
    "gpu_host", "--gpu-host", "GPUREADY_HOST", "gpu_host",
    "GPU host to check: local (default), host, user@host or ssh://user@host:port. Repeat it for "
    "several hosts (env/ini: one a line); host-bound tests then run once per host.",
    _parse_hosts, None, metavar="HOST", multiple=True,
)
GPU_HOSTS_FILE = s.Setting(
    "gpu_hosts_file", "--gpu-hosts-file", "GPUREADY_HOSTS_FILE", "gpu_hosts_file",
    "File of GPU hosts, one host spec a line (# comments, blank lines allowed); added after --gpu-host.",
    s.parse_optional_str, None, metavar="FILE",
)
GPU_IDS = s.Setting(
    "gpu_ids", "--gpu-ids", "GPUREADY_GPU_IDS", "gpu_ids",
    "GPUs to check, by index (default: all).", s.parse_gpu_ids, None, metavar="0,1,2,3",
)
GPU_MAX_USED_MIB = s.Setting(
    "gpu_max_used_mib", "--gpu-max-used-mib", "GPUREADY_GPU_MAX_USED_MIB", "gpu_max_used_mib",
    f"Memory a GPU may show used and still count as clean (default {DEFAULT_MAX_USED_MIB}).",
    s.parse_non_negative_int, DEFAULT_MAX_USED_MIB, metavar="MIB",
)
GPU_READER = s.Setting(
    "gpu_reader", "--gpu-reader", "GPUREADY_GPU_READER", "gpu_reader",
    "How to read local GPUs: auto (NVML, else nvidia-smi), nvml or nvidia-smi. Remote hosts always use nvidia-smi.",
    s.parse_choice(*READERS), "auto", metavar="READER",
)
SSH_IDENTITY = s.Setting(
    "ssh_identity", "--ssh-identity", "GPUREADY_SSH_IDENTITY", "ssh_identity",
    "Identity (private key) file for ssh, as ssh -i.", s.parse_optional_str, None, metavar="PATH",
)
SSH_OPTIONS: s.Setting[tuple[str, ...]] = s.Setting(
    "ssh_options", "--ssh-option", "GPUREADY_SSH_OPTIONS", "ssh_options",
    "Extra ssh option as Key=Value, as ssh -o (repeatable; env/ini: one per line).",
    _parse_ssh_options, (), metavar="KEY=VALUE", multiple=True,
)
SSH_CONNECT_TIMEOUT = s.Setting(
    "ssh_connect_timeout", "--ssh-connect-timeout", "GPUREADY_SSH_CONNECT_TIMEOUT", "ssh_connect_timeout",
    "Seconds to wait for an ssh connection (default 10).", s.parse_positive_float, 10.0, metavar="SECONDS",
)
GPU_PROBE_TIMEOUT = s.Setting(
    "gpu_probe_timeout", "--gpu-probe-timeout", "GPUREADY_GPU_PROBE_TIMEOUT", "gpu_probe_timeout",
    f"Seconds each part of a host probe (an nvidia-smi query, the /dev/shm listing) may take; one that "
    f"has not answered is killed with what it started, on the host too, and named in the error "
    f"(default {DEFAULT_PROBE_TIMEOUT_S:g}).",
    s.parse_positive_float, DEFAULT_PROBE_TIMEOUT_S, metavar="SECONDS",
)
SHM_MIN_FREE_MIB = s.Setting(
    "shm_min_free_mib", "--shm-min-free-mib", "GPUREADY_SHM_MIN_FREE_MIB", "shm_min_free_mib",
    f"Free space /dev/shm must have (default {DEFAULT_SHM_MIN_FREE_MIB}).",
    s.parse_non_negative_int, DEFAULT_SHM_MIN_FREE_MIB, metavar="MIB",
)
def _parse_leak_patterns(text: str) -> tuple[str, ...]:
    patterns = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not patterns:
        raise ValueError("expected at least one file name pattern like 'psm_*'")
    bad = next((p for p in patterns if "/" in p or "\0" in p), None)
    if bad is not None:
        raise ValueError(f"{bad!r} is not a file name pattern (no '/'): /dev/shm names are matched, not paths")
    return patterns


SHM_LEAK_PATTERNS: s.Setting[tuple[str, ...]] = s.Setting(
    "shm_leak_patterns", "--shm-leak-pattern", "GPUREADY_SHM_LEAK_PATTERNS", "shm_leak_patterns",
    f"/dev/shm names that count as leftovers when no process holds them (repeatable; env/ini one a line; "
    f"default {', '.join(LEAK_PATTERNS)}). Narrowing them narrows what --shm-remove-leftovers may remove.",
    _parse_leak_patterns, LEAK_PATTERNS, metavar="GLOB", multiple=True,
)
SHM_REMOVE_LEFTOVERS = s.Setting(
    "shm_remove_leftovers", "--shm-remove-leftovers", "GPUREADY_SHM_REMOVE_LEFTOVERS", "shm_remove_leftovers",
    "Remove /dev/shm leftovers that no live process holds, and say what was removed (default: remove nothing).",
    s.parse_bool, False, is_flag=True,
)

GPU_REAP_ORPHANS = s.Setting(
    "gpu_reap_orphans", "--gpu-reap-orphans", "GPUREADY_GPU_REAP_ORPHANS", "gpu_reap_orphans",
    "Before the GPU checks, stop orphaned vLLM engines (VLLM::EngineCore / VLLM::Worker whose owner is gone: "
    "parent pid 1 or a subreaper; an engine with a live parent is a running job, never signalled) that hold "
    "GPU memory: SIGTERM, then SIGKILL, each re-checked on the host right before; says what it stopped and "
    "what it left running (default: stop nothing).",
    s.parse_bool, False, is_flag=True,
)

HOST_SETTINGS: tuple[s.Setting[Any], ...] = (
    GPU_HOST, GPU_HOSTS_FILE, GPU_IDS, GPU_MAX_USED_MIB, GPU_READER, SSH_IDENTITY, SSH_OPTIONS, SSH_CONNECT_TIMEOUT,
    GPU_PROBE_TIMEOUT, SHM_MIN_FREE_MIB, SHM_LEAK_PATTERNS, SHM_REMOVE_LEFTOVERS, GPU_REAP_ORPHANS,
)

REAP_RELEASE_TIMEOUT_S = 60.0

_SPARED_SAID = pytest.StashKey[set[tuple[str, int, "int | None"]]]()
"""The running engines the reaper has already said it leaves alone (host, pid, start time): said once a run."""
"""How long the driver may take to release a stopped engine's memory before the check reads the GPU."""

MARKERS = (
    "gpuready: a GPU-readiness preflight check (select the whole preflight with -m gpuready)",
    "gpus_clean(gpus=None, max_used_mib=64): fail before the test runs unless the GPUs (by index; default "
    "--gpu-ids or all) hold no compute process and at most max_used_mib MiB",
    "shm_clean(min_free_mib=1024): fail before the test runs if /dev/shm holds vLLM/NCCL/multiprocessing leftovers "
    "(psm_*, sem.mp-*, sem.loky-*, nccl-*, *vllm*) or has less than min_free_mib MiB free",
)

_MARKER_ARGS: dict[str, tuple[str, ...]] = {
    "gpus_clean": ("gpus", "max_used_mib"),
    "shm_clean": ("min_free_mib",),
}


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
    for line in MARKERS:
        config.addinivalue_line("markers", line)
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


def snapshot_for_gpu_checks(config: pytest.Config, session: HostSession, node: pytest.Item | None = None,
                            ) -> HostSnapshot:
    """The host's snapshot; with ``--gpu-reap-orphans``, taken after orphaned vLLM engines were stopped.

    The reaper signals only what :func:`~pytest_gpuready.host.orphans.find_orphans` proves orphaned
    (the process that started it is gone), re-checking each on the host right before each signal,
    and says once which GPU-holding engines it leaves alone because their owner is alive; then the
    host is probed again (polling until the stopped pids have left the GPU listing) and what was
    stopped is printed and recorded.
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
    orphans = find_orphans(snap)
    if not orphans:
        return snap
    report = reap_orphans(session.host, orphans)
    for line in report.lines():
        _say(config, line)
    if node is not None and report.stopped:
        node.user_properties.append(("gpuready.orphans_stopped", " ".join(
            f"{o.pid}:{o.process.used_memory_mib}" for o in report.stopped)))
    stopped = {o.pid for o in report.stopped}
    deadline = time.monotonic() + REAP_RELEASE_TIMEOUT_S
    while True:
        snap = session.snapshot(refresh=True)
        if not {p.pid for p in snap.processes} & stopped or time.monotonic() >= deadline:
            return snap
        time.sleep(0.25)


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
        removed = checked(lambda: remove_leftovers(session.host, session.snapshot().require_shm(), patterns))
        if removed:
            request.node.user_properties.append(
                ("gpuready.shm_removed", ", ".join(shm_display_name(name) for name in removed)))
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                shown = ", ".join(shm_display_name(name) for name in removed)
                reporter.write_line(f"\ngpuready: removed from /dev/shm on {session.host.name}: {shown}")
        verdict = checked(lambda: check_shm_clean(session.snapshot(refresh=True), min_free_mib=minimum,
                                                  patterns=patterns))
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


def _marker_kwargs(marker: pytest.Mark) -> dict[str, Any]:
    __tracebackhide__ = True
    allowed = _MARKER_ARGS[marker.name]
    unknown = sorted(set(marker.kwargs) - set(allowed))
    if marker.args or unknown:
        given = unknown or [repr(a) for a in marker.args]
        pytest.fail(
            f"@pytest.mark.{marker.name}: unexpected argument {', '.join(given)}; "
            f"expected keyword arguments {', '.join(a + '=' for a in allowed)}",
            pytrace=False,
        )
    return dict(marker.kwargs)


@pytest.fixture(autouse=True)
def _gpuready_host_markers(request: pytest.FixtureRequest) -> None:
    """Apply ``gpus_clean`` / ``shm_clean`` markers in setup (nothing is probed for unmarked tests)."""
    __tracebackhide__ = True
    marker = request.node.get_closest_marker("gpus_clean")
    if marker is not None:
        kwargs = _marker_kwargs(marker)
        gpus = kwargs.get("gpus")
        if gpus is not None and not (isinstance(gpus, (list, tuple)) and all(isinstance(g, int) for g in gpus)):
            pytest.fail(f"@pytest.mark.gpus_clean: gpus={gpus!r}; expected a list of GPU indexes like [0, 1]",
                        pytrace=False)
        _gpus_clean(request, gpus, kwargs.get("max_used_mib"))
    marker = request.node.get_closest_marker("shm_clean")
    if marker is not None:
        _shm_clean(request, _marker_kwargs(marker).get("min_free_mib"))
