"""Server options and fixtures: ``vllm_server`` (launch or attach) and ``benchmark_serving``.

Loaded by :mod:`pytest_gpuready.plugin` (or ``-p pytest_gpuready.plugin.server_fixtures``).

``vllm_server`` is a session-scoped factory: a launch can take minutes (13 for a 1T-parameter
model), so a server is started once per distinct :class:`ServeSpec` and shared by every test
that asks for the same spec. Asking for a spec whose GPUs overlap a running server's stops that
server first (verified clean), since two servers cannot share GPUs. At the end of the session
every server is stopped and verified; leftovers (processes, GPU memory, /dev/shm files) fail the
teardown of the last test with the evidence. With ``--vllm-url`` nothing is launched or stopped:
the factory attaches to the running server (a systemd unit, as in production). The pool itself
is :mod:`pytest_gpuready.serve.pool`; this module resolves what a test asks for, records the
figures, and turns what the pool raises into outcomes.

Safety net: Ctrl-C, an internal error or the end of the session stops every server this
process started (``pytest_keyboard_interrupt`` / ``pytest_internalerror`` /
``pytest_sessionfinish``), on top of the try/finally in :meth:`VLLMServer.start`.

Measured figures go to the JUnit XML as properties of the test that measured them
(``gpuready.*``) and, with ``--gpuready-json PATH``, into a JSON report.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.errors import ConfigError, GpuReadyError, GpuReadyWarning
from pytest_gpuready.host.clock_events import ClockEventSampler
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.host.xid_watch import XidRecord, XidWatcher
from pytest_gpuready.model.deploy_config import Deployment, Throughput
from pytest_gpuready.plugin import baseline_fixtures as baseline
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.host_session import HOST_REGISTRY_KEY, HostSession
from pytest_gpuready.plugin.model_fixtures import SKIP_NO_DEPLOY_FILE, deploy_config_of
from pytest_gpuready.plugin.options import SERVER_SETTINGS, VLLM_CMD, VLLM_READY_TIMEOUT, VLLM_URL
from pytest_gpuready.plugin.recording import CURRENT_ITEM_KEY, add_report_entry, record
from pytest_gpuready.serve.baseline import check_min_runs
from pytest_gpuready.serve.bench import BenchResult, ServerGoneError, XidDuringBenchmarkError, run_benchmark
from pytest_gpuready.serve.pool import ServerPool
from pytest_gpuready.serve.server import ServerError, TeardownReport, VLLMServer
from pytest_gpuready.serve.spec import DEFAULT_COMMAND, ServeSpec, spec_from_deployment
from pytest_gpuready.serve.thresholds import (
    check_latency,
    check_no_failed_requests,
    check_output_throughput,
    check_weights_per_gpu,
)
from pytest_gpuready.verdict import Verdict

POOL_KEY = pytest.StashKey[dict[str, "ServerPool"]]()
"""This session's server pools, one per host (by display name)."""
XID_UNWATCHED_KEY = pytest.StashKey[set[str]]()
"""Hosts whose Xids could not be watched, already said this session (said once, never an error)."""


def note_xid_watch(config: pytest.Config, xids: XidRecord | None) -> None:
    """Say once per host and session that its Xids are not watched (the kernel log needs root there)."""
    if xids is None or xids.unwatched is None:
        return
    said = config.stash.setdefault(XID_UNWATCHED_KEY, set())
    if xids.host in said:
        return
    said.add(xids.host)
    message = f"{xids.host}: Xid not watched during launches and benchmarks: {xids.unwatched}"
    record(config, "xid_watch", message)
    warnings.warn(message, GpuReadyWarning, stacklevel=2)


# ---------------------------------------------------------------- hooks

def pytest_addoption(parser: pytest.Parser) -> None:
    s.add_settings(parser, SERVER_SETTINGS)


def pytest_configure(config: pytest.Config) -> None:
    s.resolve_all(config, SERVER_SETTINGS)
    if config.pluginmanager.get_plugin(_SAFETY_NET_NAME) is None:
        config.pluginmanager.register(_SafetyNet(config), _SAFETY_NET_NAME)


class _SafetyNet:
    """Stops this session's servers on Ctrl-C, an internal error, or the end of the session.

    Scoped to this session's pool (not every server in the process), so a pytest run inside a
    pytest run (pytester) never stops the outer run's servers.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def _stop(self, reason: str) -> None:
        for pool in self.config.stash.get(POOL_KEY, {}).values():
            pool.emergency_stop(reason)

    def pytest_keyboard_interrupt(self) -> None:
        self._stop("Ctrl-C")

    def pytest_internalerror(self) -> None:
        self._stop("pytest internal error")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # trylast: after pytest's own sessionfinish has run the fixture teardowns (which stop and
        # verify the servers), so this only catches what they did not.
        self._stop("end of the pytest session")


_SAFETY_NET_NAME = "gpuready-server-safety-net"


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin(_SAFETY_NET_NAME)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = VLLM_URL.get(config)
    if url is not None:
        return [f"gpuready: attaching to the vLLM server at {url} (--vllm-url; never stopped)"]
    command = (VLLM_CMD.get(config) or DEFAULT_COMMAND)
    return [f"gpuready: vLLM launch command: {command}"] if command != DEFAULT_COMMAND else []


# ---------------------------------------------------------------- progress

def _terminal_writer(config: pytest.Config) -> Callable[[str], None]:
    """Write progress lines to the terminal, on a line of their own, even while output is captured."""

    def write(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capman = config.pluginmanager.get_plugin("capturemanager")
        guard = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
        with guard:
            writer = config.get_terminal_writer()
            if writer.width_of_current_line:  # after a test's progress dot
                writer.line()
            reporter.write_line(f"gpuready: {line}")
            reporter.flush()  # a CI log is a pipe: show progress now, not when the buffer fills

    return write


# ---------------------------------------------------------------- the server pool (serve/pool.py)

def new_pool(config: pytest.Config, log_dir: Path, host_session: HostSession) -> ServerPool:
    """The pool of ``host_session``'s servers, with this session's options, progress and recording."""
    name = host_session.display_name

    def on_start(server: VLLMServer) -> None:
        _record_start(config, server, name)

    def on_stop(server: VLLMServer, report: TeardownReport) -> None:
        if not server.is_attached:
            record(config, "teardown_s", round(report.duration_s, 2))
            add_report_entry(config, "teardowns", {"server": server.describe(), **report.to_dict()}, host=name)

    return ServerPool(host_session.host, log_dir, ready_timeout_s=VLLM_READY_TIMEOUT.get(config),
                      attach_url=VLLM_URL.get(config), snapshot=lambda: host_session.snapshot(refresh=True),
                      invalidate=host_session.invalidate, progress=_terminal_writer(config),
                      on_start=on_start, after_launch=lambda server: note_xid_watch(config, server.launch_xids),
                      on_stop=on_stop)


def resolve_spec(config: pytest.Config, target: ServeSpec | Deployment | str) -> ServeSpec:
    """What a test asked for as a spec: a ServeSpec (with ``--vllm-cmd``), a Deployment, or a deployment's name."""
    command = VLLM_CMD.get(config) or DEFAULT_COMMAND
    if isinstance(target, ServeSpec):
        if target.command == DEFAULT_COMMAND and command != DEFAULT_COMMAND:
            return replace(target, command=command)
        return target
    if isinstance(target, Deployment):
        return spec_from_deployment(target, command=command)
    if isinstance(target, str):
        deploy = deploy_config_of(config)
        if deploy is None:
            pytest.skip(SKIP_NO_DEPLOY_FILE)
        return spec_from_deployment(deploy.get(target), command=command)
    raise ConfigError(f"vllm_server: expected a ServeSpec, a Deployment or a deployment name, got {target!r}")


def _record_start(config: pytest.Config, server: VLLMServer, host_name: str) -> None:
    assert server.ready is not None
    assert server.footprint is not None
    footprint = server.footprint
    record(config, "server", server.describe())
    record(config, "server_url", server.url)
    record(config, "server_startup_s", round(server.ready.startup_s, 1))
    record(config, "hardware", footprint.hardware)
    if footprint.log.weights_gib:
        record(config, "weights_gib_per_rank", "/".join(f"{g:g}" for g in footprint.log.weights_gib))
    if footprint.log.available_kv_cache_gib:
        record(config, "kv_cache_gib", "/".join(f"{g:g}" for g in footprint.log.available_kv_cache_gib))
    if footprint.log.kv_cache_tokens is not None:
        record(config, "kv_cache_tokens", footprint.log.kv_cache_tokens)
    if footprint.log.max_concurrency is not None:
        record(config, "max_concurrency", footprint.log.max_concurrency)
    if footprint.gpu_memory_mib is not None:
        record(config, "gpu_memory_mib", " ".join(f"{i}:{m}" for i, m in sorted(footprint.gpu_memory_mib.items())))
    add_report_entry(config, "servers", host=host_name, entry={
        "spec": server.spec.to_dict(), "url": server.url, "attached": server.is_attached,
        "startup_s": server.ready.startup_s, "vllm_version": server.ready.vllm_version,
        "footprint": footprint.to_dict(),
        "xids": server.launch_xids.to_dict() if server.launch_xids is not None else None,
    })


class ServerFactory:
    """What the ``vllm_server`` fixture returns: call it with a spec, a Deployment or a deployment name."""

    def __init__(self, pool: ServerPool, config: pytest.Config) -> None:
        self._pool = pool
        self._config = config

    def __call__(self, target: ServeSpec | Deployment | str, *, ready_timeout_s: float | None = None) -> VLLMServer:
        """The ready server for ``target``: launched on first use (or attached with --vllm-url), then shared."""
        __tracebackhide__ = True
        failure: str | None = None
        try:
            return self._pool.get(resolve_spec(self._config, target), ready_timeout_s)
        except (ServerError, GpuReadyError) as exc:
            failure = str(exc)
        pytest.fail(failure, pytrace=False)

    def stop(self, target: ServeSpec | Deployment | str | VLLMServer) -> TeardownReport | None:
        """Stop a server now and verify it left nothing (fails the test if it did)."""
        __tracebackhide__ = True
        spec = target.spec if isinstance(target, VLLMServer) else resolve_spec(self._config, target)
        report = self._pool.stop(spec)
        if report is not None and not report.ok:
            pytest.fail(report.message, pytrace=False)
        return report

    @property
    def attaching(self) -> bool:
        """True with ``--vllm-url``: the factory attaches to a running server and launches nothing."""
        return self._pool.attach_url is not None

    @property
    def servers(self) -> list[VLLMServer]:
        return list(self._pool.servers.values())

    def expect_weights_per_gpu(self, server: VLLMServer, min_gib: float | None = None,
                               max_gib: float | None = None) -> Verdict:
        """Fail unless each rank's weights (vLLM's ``Model loading took X GiB``) lie within [min_gib, max_gib]."""
        __tracebackhide__ = True
        config = self._config
        weights = server.footprint.log.weights_gib if server.footprint is not None else ()
        verdict = check_weights_per_gpu(weights, min_gib, max_gib, _context(server))
        record(config, "check.weights_per_gpu", verdict.summary)
        add_report_entry(config, "checks", {"name": "weights_per_gpu", "ok": verdict.ok,
                                            "summary": verdict.summary, "evidence": dict(verdict.evidence)})
        if not verdict.ok:
            pytest.fail(verdict.message, pytrace=False)
        return verdict


@pytest.fixture(scope="session")
def vllm_server(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory,
                _gpuready_host: HostSession) -> Iterator[ServerFactory]:
    """Factory of ready vLLM servers: ``server = vllm_server(ServeSpec(...) | deployment | "name")``.

    Servers are shared for the whole session (one per spec, on the test's host) and stopped, then
    verified clean, at its end (with several hosts: when the tests move on to the next host);
    ``vllm_server.stop(server)`` stops one earlier. With ``--vllm-url`` it attaches.
    """
    pool = new_pool(pytestconfig, tmp_path_factory.mktemp("vllm-logs"), _gpuready_host)
    pytestconfig.stash.setdefault(POOL_KEY, {})[_gpuready_host.display_name] = pool
    yield ServerFactory(pool, pytestconfig)
    reports = pool.stop_all()
    bad = [r for r in reports if not r.ok]
    if bad:
        pytest.fail("\n".join(r.message for r in bad), pytrace=False)


# ---------------------------------------------------------------- benchmarks

def _context(server: VLLMServer) -> str:
    """``MiniMax-M2.5, TP=4, 4x RTX PRO 6000``: what every threshold message ends with."""
    hardware = server.footprint.hardware if server.footprint is not None else "no GPU"
    return f"{server.describe()}, {hardware}"


class ServingBenchmark:
    """A benchmark's result and the threshold assertions on it (each fails the test with the evidence)."""

    def __init__(self, result: BenchResult, server: VLLMServer, config: pytest.Config,
                 comparison: baseline.BenchComparison | None = None) -> None:
        self.result = result
        self.server = server
        self.context = _context(server)
        self._config = config
        self.comparison = comparison
        """The levels against ``--gpuready-baseline`` (None without one)."""

    def _expect(self, verdict: Verdict, name: str) -> Verdict:
        __tracebackhide__ = True
        record(self._config, f"check.{name}", verdict.summary)
        add_report_entry(self._config, "checks", {"name": name, "ok": verdict.ok, "summary": verdict.summary,
                                                  "evidence": dict(verdict.evidence)})
        if not verdict.ok:
            pytest.fail(verdict.message, pytrace=False)
        return verdict

    def _throttle_noted(self, verdict: Verdict, concurrency: int) -> Verdict:
        """A missed threshold at a level the GPUs throttled says so: the cooling was measured, not vLLM."""
        try:
            throttled = self.result.at(concurrency).throttled
        except KeyError:
            return verdict
        if verdict.ok or not throttled:
            return verdict
        reasons = "; ".join(f"GPU {gpu}: {', '.join(names)}" for gpu, names in sorted(throttled.items()))
        return replace(verdict, details=(*verdict.details, f"the level ran throttled ({reasons}): the GPUs slowed "
                                         "themselves, so this measures cooling or power, not the deployment"),
                       evidence={**verdict.evidence, "throttled": {str(g): list(n) for g, n in throttled.items()}})

    def expect_output_throughput(self, concurrency: int, min_tok_s: float) -> Verdict:
        """At least ``min_tok_s`` output tokens/s at ``concurrency`` streams."""
        __tracebackhide__ = True
        verdict = check_output_throughput(self.result, concurrency, min_tok_s, self.context)
        return self._expect(self._throttle_noted(verdict, concurrency), f"output_throughput_c{concurrency}")

    def expect_latency(self, concurrency: int, metric: str, max_ms: float, stat: str = "p99") -> Verdict:
        """``stat`` of ``metric`` (ttft, tpot, itl, e2el) at most ``max_ms`` at ``concurrency`` streams."""
        __tracebackhide__ = True
        verdict = check_latency(self.result, concurrency, metric, max_ms, self.context, stat)
        return self._expect(self._throttle_noted(verdict, concurrency), f"{stat}_{metric}_c{concurrency}")

    def expect_no_regression(self, tolerance: str | float | None = None, *, min_runs: int | None = None,
                             **metrics: str | float) -> list[baseline.LevelComparison]:
        """Every level no worse than its ``--gpuready-baseline`` runs: ``tolerance`` for every metric
        (``"5%"`` or ``0.05``), ``output_tok_s="5%"``, ``ttft_p99="20%"``... per metric; these win over
        ``--gpuready-compare-fail``, whose values win over the default 10%. ``min_runs`` wins over
        ``--gpuready-baseline-min-runs``. Skips without a baseline.
        """
        __tracebackhide__ = True
        bad: str | None = None
        try:
            per_test = baseline.tolerances_of(tolerance, metrics)
            if min_runs is not None:
                check_min_runs(min_runs, f"min_runs {min_runs!r}")
        except ValueError as exc:
            bad = f"expect_no_regression: {exc}"
        if bad is not None:
            pytest.fail(bad, pytrace=False)
        if self.comparison is None:
            pytest.skip("no baseline to compare with: pass --gpuready-baseline PATH")
        return self.comparison.expect(per_test, min_runs)

    def expect_no_failed_requests(self) -> Verdict:
        __tracebackhide__ = True
        return self._expect(check_no_failed_requests(self.result, self.context), "no_failed_requests")

    def expect_thresholds(self, thresholds: Sequence[Throughput]) -> list[Verdict]:
        """Every deploy-file ``expect.throughput`` entry measured here (throughput and p99 latencies)."""
        __tracebackhide__ = True
        verdicts = []
        for threshold in thresholds:
            verdicts.append(self.expect_output_throughput(threshold.concurrency, threshold.min_output_tok_s))
            if threshold.max_p99_ttft_ms is not None:
                verdicts.append(self.expect_latency(threshold.concurrency, "ttft", threshold.max_p99_ttft_ms))
            if threshold.max_p99_tpot_ms is not None:
                verdicts.append(self.expect_latency(threshold.concurrency, "tpot", threshold.max_p99_tpot_ms))
        return verdicts


BenchmarkServing = Callable[..., ServingBenchmark]


def _snapshot_for_baseline(session: HostSession | None) -> HostSnapshot | None:
    """The host's last snapshot (its GPUs key the baseline and pick the clock-event reader), probed if
    there is none yet; None when the host cannot be probed (the key then says ``no GPU``)."""
    if session is None:
        return None
    if session.latest is not None:
        return session.latest
    try:
        return session.snapshot()
    except GpuReadyError:
        return None


def _session_of(config: pytest.Config, server: VLLMServer) -> HostSession | None:
    """The host session whose pool handed out ``server`` (its snapshot keys a baseline)."""
    registry = config.stash.get(HOST_REGISTRY_KEY, None)
    for name, pool in config.stash.get(POOL_KEY, {}).items():
        if registry is not None and name in registry and any(kept is server for kept in pool.servers.values()):
            return registry[name]
    return None


@pytest.fixture
def benchmark_serving(pytestconfig: pytest.Config) -> BenchmarkServing:
    """Run :func:`run_benchmark` against a server: ``bench = benchmark_serving(server, concurrency=[1, 64])``.

    Returns a :class:`ServingBenchmark` with ``expect_output_throughput`` / ``expect_latency`` /
    ``expect_thresholds`` / ``expect_no_regression``; the figures are recorded as JUnit properties
    and in the JSON report. ``rounds`` measures each level that many times (default 7 with
    ``--gpuready-baseline``, whose comparison is asserted at the end of the test, else 1).
    Failed requests fail the test unless ``allow_failed_requests=True``.
    """

    def run(server: VLLMServer, concurrency: Sequence[int] | int = (1, 8, 64), *,
            allow_failed_requests: bool = False, rounds: int | None = None, **kwargs: Any) -> ServingBenchmark:
        __tracebackhide__ = True
        failure: str | None = None
        alive = None if server.is_attached else server.is_alive
        state = baseline.state_of(pytestconfig)
        host = server.host
        session = _session_of(pytestconfig, server)
        snapshot = _snapshot_for_baseline(session) if state.active else None
        try:
            gpus = server.spec.gpus
            kwargs.setdefault("clock_events", lambda: ClockEventSampler(server.host, gpus=gpus))
            watchers: list[XidWatcher] = []

            def xid_watch() -> XidWatcher:
                watchers.append(XidWatcher(server.host, gpus=gpus))
                return watchers[-1]

            kwargs.setdefault("xid_watch", xid_watch)
            try:
                result = run_benchmark(server.url, server.model_name, concurrency, alive=alive,
                                       rounds=baseline.rounds_for(pytestconfig, rounds), **kwargs)
            finally:
                note_xid_watch(pytestconfig, watchers[0].record if watchers else None)
        except XidDuringBenchmarkError as exc:
            failure = f"benchmark of {_context(server)}: {exc}"
        except ServerGoneError as exc:
            detail = f"{exc.sent} requests sent ({exc.failed} failed), then no more"
            if exc.xids is not None and exc.xids.seen:
                detail = f"{exc.xids.failure('the benchmark')}; {detail}"
            died = server.died_error("during the benchmark", detail)
            for pool in pytestconfig.stash.get(POOL_KEY, {}).values():
                if any(kept is server for kept in pool.servers.values()):
                    pool.mark_dead(server.spec, died.summary)
            failure = str(died)
        except (GpuReadyError, ValueError) as exc:
            failure = f"benchmark of {_context(server)} could not measure: {exc}"
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        for level in result.levels:
            prefix = f"bench.c{level.concurrency}"
            record(pytestconfig, f"{prefix}.output_tok_s", round(level.output_throughput, 2))
            record(pytestconfig, f"{prefix}.total_tok_s", round(level.total_token_throughput, 2))
            record(pytestconfig, f"{prefix}.req_s", round(level.request_throughput, 3))
            record(pytestconfig, f"{prefix}.mean_ttft_ms", round(level.ttft.mean_ms, 2))
            record(pytestconfig, f"{prefix}.p99_ttft_ms", round(level.ttft.p99_ms, 2))
            record(pytestconfig, f"{prefix}.mean_tpot_ms", round(level.tpot.mean_ms, 3))
            record(pytestconfig, f"{prefix}.failed", level.failed)
            if level.clock_events is not None:
                record(pytestconfig, f"{prefix}.clock_events", level.clock_events.describe())
                for gpu, link in level.clock_events.link_shortfalls.items():
                    message = (f"{server.host.name} GPU {gpu}: {link} at concurrency {level.concurrency}: the link "
                               "ran narrower or slower than it may (a narrower slot, a riser, a degraded link)")
                    record(pytestconfig, f"{prefix}.pcie.gpu{gpu}", link)
                    warnings.warn(message, GpuReadyWarning, stacklevel=2)
        entry = add_report_entry(pytestconfig, "benchmarks", {"server": server.describe(),
                                                              "context": _context(server), **result.to_dict()})
        write = _terminal_writer(pytestconfig)
        for line in result.table().splitlines():
            write(line)
        comparison = None
        if state.active:
            occurrence = baseline.next_occurrence(pytestconfig, server.describe())
            item = pytestconfig.stash.get(CURRENT_ITEM_KEY, None)
            levels = baseline.measured_levels(
                result, item.nodeid if item is not None else "", server.describe(), occurrence, server.spec,
                snapshot, host, server.ready.vllm_version if server.ready is not None else None)
            comparison = baseline.BenchComparison(pytestconfig, server.describe(), levels,
                                                  baseline.on_gpu(snapshot, server.spec), entry)
            baseline.start_comparison(pytestconfig, comparison)
        measured = ServingBenchmark(result, server, pytestconfig, comparison)
        if not allow_failed_requests:
            measured.expect_no_failed_requests()
        return measured

    return run


__all__ = [
    "SERVER_SETTINGS",
    "VLLM_CMD",
    "VLLM_READY_TIMEOUT",
    "VLLM_URL",
    "BenchmarkServing",
    "ServerFactory",
    "ServerPool",
    "ServingBenchmark",
    "add_report_entry",
    "record",
]
