"""The JSON report (``--gpuready-report``): assembled from the payloads of the test reports.

:class:`ReportData` is filled by the process that sees every test report (the xdist controller,
or the only process) and turned into one document by :meth:`ReportData.document`. Its shape is
the JSON Schema shipped beside this module, ``report.schema.json`` (:data:`SCHEMA_PATH`,
documented in docs/report.md); the tests validate every report they write against it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_gpuready.plugin.recording import SECTIONS

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")
SCHEMA_ID = "urn:pytest-gpuready:report:1"
SCHEMA_VERSION = 1
MAX_MESSAGE_CHARS = 4000
"""A failure's text in the report is cut here: the JUnit XML and the terminal have all of it."""


def plugin_version() -> str:
    try:
        return metadata.version("pytest-gpuready")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class TestRecord:
    """One test as the reports of its phases describe it."""

    nodeid: str
    host: str | None = None
    worker: str | None = None
    outcome: str = "passed"
    durations: dict[str, float] = field(default_factory=dict)
    message: str | None = None

    def add_phase(self, when: str, outcome: str, duration: float, message: str | None, xfail: bool) -> None:
        """Fold one phase into the test's outcome the way pytest's summary counts it: a failed setup
        or teardown is an error (unless the test itself failed), a skip in setup or call a skip."""
        self.durations[when] = round(duration, 6)
        if outcome == "passed":
            if xfail and when == "call":
                self.outcome = "xpassed"
        elif outcome == "skipped":
            if self.outcome == "passed":
                self.outcome = "xfailed" if xfail else "skipped"
                self.message = message
        else:
            if when == "call":
                self.outcome = "failed"
            elif self.outcome != "failed":
                self.outcome = "error"
            if self.message is None or self.outcome in ("skipped", "xfailed"):
                self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"nodeid": self.nodeid, "host": self.host, "worker": self.worker, "outcome": self.outcome,
                "durations": dict(self.durations), "message": self.message}


@dataclass
class ReportData:
    """Everything the report needs, gathered as the test reports arrive."""

    hosts: dict[str, dict[str, Any]]
    """Each host by display name: ``{"name", "spec"}`` at first, then its last state from a worker."""
    started: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    tests: dict[str, TestRecord] = field(default_factory=dict)
    sections: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {s: [] for s in SECTIONS})
    workers: set[str] = field(default_factory=set)

    def add(self, nodeid: str, when: str, outcome: str, duration: float, message: str | None, xfail: bool,
            payload: dict[str, Any] | None) -> None:
        """Take one phase's test report (and the payload the recording module attached to it)."""
        test = self.tests.setdefault(nodeid, TestRecord(nodeid))
        if payload is not None:
            test.host = payload.get("host") or test.host
            test.worker = payload.get("worker") or test.worker
            if test.worker:
                self.workers.add(test.worker)
            for section, entry in payload.get("entries") or []:
                self.sections.setdefault(str(section), []).append(entry)
            for state in payload.get("hosts") or []:
                self.add_host_state(state)
        cut = message[:MAX_MESSAGE_CHARS] if message is not None else None
        test.add_phase(when, outcome, duration, cut, xfail)

    def add_host_state(self, state: dict[str, Any]) -> None:
        """Keep a host's latest state: a snapshot taken later wins (workers may probe the same host)."""
        name = str(state.get("name"))
        known = self.hosts.setdefault(name, {"name": name, "spec": state.get("spec")})
        previous = known.get("snapshot") or {}
        incoming = state.get("snapshot") or {}
        if incoming and previous and incoming.get("taken_at", 0) < previous.get("taken_at", 0):
            return
        known.update(state)

    def failed_verdicts(self) -> list[dict[str, Any]]:
        """Verdicts that measured a violation (an undecided one, whose test skipped, is none)."""
        return [v for v in self.sections.get("verdicts", []) if not v.get("ok") and not v.get("needs")]

    def document(self, exit_status: int | None = None) -> dict[str, Any]:
        """The report, as the schema describes it."""
        hosts = [host_entry(state) for state in self.hosts.values()]
        per_host: dict[str, dict[str, Any]] = {}
        for test in self.tests.values():
            if test.host is None:
                continue
            totals = per_host.setdefault(test.host, {"tests": 0, "duration_s": 0.0, "workers": []})
            totals["tests"] += 1
            totals["duration_s"] = round(totals["duration_s"] + sum(test.durations.values()), 6)
            if test.worker and test.worker not in totals["workers"]:
                totals["workers"].append(test.worker)
        return {
            "$schema": SCHEMA_ID,
            "schema_version": SCHEMA_VERSION,
            "plugin": {"name": "pytest-gpuready", "version": plugin_version()},
            "environment": {"python": platform.python_version(), "pytest": _version("pytest"),
                            "pytest_xdist": _version("pytest-xdist"), "hostname": platform.node()},
            "created": datetime.fromtimestamp(self.started, tz=timezone.utc).isoformat(),
            "exit_status": exit_status,
            "workers": sorted(self.workers),
            "timings": {
                "session_s": round(time.monotonic() - self.started_monotonic, 6),
                "tests_s": round(sum(sum(t.durations.values()) for t in self.tests.values()), 6),
                "per_host": per_host,
            },
            "hosts": hosts,
            "tests": [test.to_dict() for test in self.tests.values()],
            **{section: list(self.sections.get(section, [])) for section in SECTIONS},
        }


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def host_entry(state: dict[str, Any]) -> dict[str, Any]:
    """A host's entry of the report, from what is known of it (its last state from a worker)."""
    snapshot = state.get("snapshot")
    gpus = (snapshot or {}).get("gpus") or []
    drivers = sorted({g["driver_version"] for g in gpus if g.get("driver_version")})
    return {
        "name": state.get("name"),
        "spec": state.get("spec"),
        "probed": "snapshots_taken" in state,
        "error": state.get("error"),
        "worker": state.get("worker"),
        "vllm_version": (snapshot or {}).get("vllm_version"),
        "driver_versions": drivers,
        "gpu_reader": (snapshot or {}).get("gpu_reader"),
        "gpu_count": len(gpus) if snapshot is not None and snapshot.get("gpus") is not None else None,
        "snapshot": snapshot,
    }
