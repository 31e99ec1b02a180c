"""Report options and the process that writes the reports: the JSON report, the plots, the summary.

``--gpuready-report PATH`` writes the JSON document of :mod:`pytest_gpuready.plugin.report_document`;
``--gpuready-json PATH`` is its deprecated old name (same document); ``--gpuready-plot DIR`` saves
PNGs (the ``plot`` extra, matplotlib, imported only then). All three, and the terminal summary,
come from the process that sees every test report: the xdist controller (a config without
``workerinput``), or the only process without xdist. Workers only record
(:mod:`pytest_gpuready.plugin.recording`); their payloads arrive inside the test reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuready.outputs import Output, OutputRefused, check_output, check_output_folder, write_output, written_to
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.host_session import HOST_REGISTRY_KEY
from pytest_gpuready.plugin.options import (
    GPU_MAX_USED_MIB,
    GPUREADY_JSON,
    GPUREADY_PLOT,
    GPUREADY_REPORT,
    REPORT_SETTINGS,
)
from pytest_gpuready.plugin.outcomes import counts_as_error
from pytest_gpuready.plugin.plots import NOTHING_TO_PLOT, require_matplotlib, save_plots
from pytest_gpuready.plugin.recording import PAYLOAD_ATTRIBUTE, host_state
from pytest_gpuready.plugin.report_document import ReportData, host_entry
from pytest_gpuready.plugin.summary import MAX_WIDTH, failure_lines, host_tables


def is_worker(config: pytest.Config) -> bool:
    """True in an xdist worker: it records, and leaves every report to the controller."""
    return hasattr(config, "workerinput")


def _report_option(config: pytest.Config) -> str:
    return "--gpuready-report" if GPUREADY_REPORT.get(config) else "--gpuready-json"


def check_outputs(config: pytest.Config) -> tuple[Output | None, Path | None]:
    """The report's and the plots' destinations, judged before any test runs (see
    :mod:`pytest_gpuready.outputs`); a path that cannot be written is a usage error naming it."""
    base = Path(config.invocation_params.dir)
    raw = GPUREADY_REPORT.get(config) or GPUREADY_JSON.get(config)
    plot_dir = GPUREADY_PLOT.get(config)
    try:
        report = check_output(raw, base, what="report") if raw else None
    except OutputRefused as exc:
        raise pytest.UsageError(f"{_report_option(config)} {exc}") from None
    try:
        plots = check_output_folder(plot_dir, base, what="plots") if plot_dir else None
    except OutputRefused as exc:
        raise pytest.UsageError(f"--gpuready-plot {exc}") from None
    return report, plots


def pytest_addoption(parser: pytest.Parser) -> None:
    s.add_settings(parser, REPORT_SETTINGS)


def pytest_configure(config: pytest.Config) -> None:
    resolved = s.resolve_all(config, REPORT_SETTINGS)
    new, old = resolved["gpuready_report"], resolved["gpuready_json"]
    if new is not None and old is not None and new != old:
        raise pytest.UsageError(f"--gpuready-json {old!r} and --gpuready-report {new!r} name two files for one "
                                "report; give --gpuready-report alone")
    if resolved["gpuready_plot"] is not None and not is_worker(config):
        try:
            require_matplotlib()  # the plot extra, checked before any test runs
        except ImportError:
            raise pytest.UsageError(
                "--gpuready-plot needs matplotlib: pip install 'pytest-gpuready[plot]'") from None
    if is_worker(config):
        return
    report, plots = check_outputs(config)
    registry = config.stash.get(HOST_REGISTRY_KEY, None)
    hosts = {name: {"name": name, "spec": str(session.spec)} for name, session in (registry or {}).items()}
    if config.pluginmanager.get_plugin(_NAME) is None:
        collector = ReportCollector(config, ReportData(hosts=hosts), report, plots)
        if old is not None and new is None:
            # A line of the summary, not a DeprecationWarning: a project's `filterwarnings = error`
            # (this repository's own) turns a config-time warning into an INTERNALERROR.
            collector.notices.append(DEPRECATED_JSON)
        config.pluginmanager.register(collector, _NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin(_NAME)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)


_NAME = "gpuready-report-collector"
DEPRECATED_JSON = ("gpuready: DeprecationWarning: --gpuready-json is deprecated: use --gpuready-report PATH "
                   "(the same document)")


class ReportCollector:
    """Gathers every test report's payload and writes the reports at the end of the session.

    A plugin object per session (not module-level hooks), because ``pytest_runtest_logreport``
    is not given the config, and a pytest run inside a pytest run (pytester) has two.
    """

    def __init__(self, config: pytest.Config, data: ReportData, report: Output | None = None,
                 plots: Path | None = None) -> None:
        self.config = config
        self.data = data
        self.report = report
        self.plots = plots
        self.written: list[tuple[str, bool]] = []
        """Lines for the terminal summary: (text, whether it is an error)."""
        self.notices: list[str] = []
        """Lines said at the end of the run, before the tables (deprecations)."""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        message: str | None = None
        if report.outcome in ("failed", "skipped"):
            longrepr = report.longrepr
            message = (str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3
                       else report.longreprtext)
        payload = getattr(report, PAYLOAD_ATTRIBUTE, None)
        # a could-not-measure in the test's body is an error, as in the terminal (plugin.outcomes)
        when = "setup" if counts_as_error(report) else report.when or "call"
        self.data.add(report.nodeid, when, report.outcome, float(report.duration or 0.0),
                      message, hasattr(report, "wasxfail"), payload if isinstance(payload, dict) else None)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = self.config
        # Hosts this process probed itself (the header, without xdist) count even when no test
        # report carried them (every test deselected, or a collection error).
        for host in (config.stash.get(HOST_REGISTRY_KEY, None) or {}).values():
            if host.snapshots_taken and "snapshots_taken" not in self.data.hosts.get(host.display_name, {}):
                self.data.add_host_state(host_state(host, None))
        document = self.data.document(int(exitstatus))
        if self.report is not None:
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if self.report.kind == "stdout" and reporter is not None:
                reporter.ensure_newline()  # after the progress line ("test_x.py .  [100%]"), not on it
            try:
                write_output(self.report, json.dumps(document, indent=2) + "\n")
                self.written.append((f"gpuready: report written to {written_to(self.report)}", False))
            except OutputRefused as exc:
                self.written.append((f"gpuready: report not written: {exc}", True))
        if self.plots is not None:
            try:
                saved_plots = save_plots(document, self.plots)
            except OutputRefused as exc:
                self.written.append((f"gpuready: plot not written: {exc}", True))
            else:
                for saved in saved_plots:
                    self.written.append((f"gpuready: plot {saved}", False))
                if not saved_plots:
                    self.written.append((f"gpuready: no plot written to {self.plots}: {NOTHING_TO_PLOT}", False))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        config = self.config
        # the lines fit 100 columns whatever the terminal (CI logs are read in browsers); the
        # separators follow the terminal, up to 100
        rule = min(MAX_WIDTH, config.get_terminal_writer().fullwidth)
        for notice in self.notices:
            terminalreporter.write_line(notice, yellow=True)
        hosts = [host_entry(state) for state in self.data.hosts.values()]
        for title, lines in host_tables(hosts, GPU_MAX_USED_MIB.get(config), MAX_WIDTH):
            terminalreporter.write_sep("=", title, fullwidth=rule)
            for line in lines:
                terminalreporter.write_line(line.text, red=line.dirty)
        failures = failure_lines(hosts, self.data.failed_verdicts(), MAX_WIDTH)
        if failures:
            terminalreporter.write_sep("=", "gpuready: failed invariants", fullwidth=rule)
            for line in failures:
                terminalreporter.write_line(line.text, red=True)
        for written, failed in self.written:
            terminalreporter.write_line(written, red=failed)
