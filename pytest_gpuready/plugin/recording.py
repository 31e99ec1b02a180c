"""What a test measured, recorded where it is measured and carried on the test's own report.

Everything the JSON report holds is recorded in the process that runs the test (an xdist worker,
or the only process), on the running item:

- :func:`record` adds a JUnit property ``gpuready.NAME`` (``item.user_properties``, which pytest's
  junitxml writes for every ``junit_family`` without the warning that the ``record_property``
  fixture raises under xunit2, and which xdist carries to the controller with the report);
- :func:`add_report_entry` and :func:`record_verdict` add an entry to a report section
  (``verdicts``, ``servers``, ``teardowns``, ``benchmarks``, ``checks``, ``deployments``), tagged with the test's
  nodeid and host.

After each phase (setup, call, teardown), :func:`pytest_runtest_makereport` moves what that
phase recorded onto the :class:`pytest.TestReport` as the attribute ``gpuready``: plain JSON data
(the entries, the test's host, the worker, and the snapshot of every host that was probed
again since the last report). pytest's report serialization keeps extra attributes, so under
xdist the payload reaches the controller inside the report itself; the controller's
:mod:`pytest_gpuready.plugin.report_collector` assembles the document. Nothing relies on
``record_testsuite_property``, which xdist does not carry.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from typing import Any

import pytest

from pytest_gpuready.plugin.fleet import host_of_item
from pytest_gpuready.plugin.host_session import HOST_REGISTRY_KEY, HostSession
from pytest_gpuready.plugin.snapshot_data import snapshot_to_dict
from pytest_gpuready.verdict import Verdict

PAYLOAD_ATTRIBUTE = "gpuready"
"""The attribute of a TestReport that carries the payload (see the module docstring)."""
SECTIONS = ("verdicts", "servers", "teardowns", "benchmarks", "checks", "deployments")

CURRENT_ITEM_KEY = pytest.StashKey[pytest.Item | None]()
_ENTRIES_KEY = pytest.StashKey[list[tuple[str, dict[str, Any]]]]()
_SENT_KEY = pytest.StashKey[dict[str, int]]()
"""Per host, the ``snapshots_taken`` count last sent: a host's state goes out only when it changed."""


def plain(value: Any) -> Any:
    """``value`` as JSON data (tuples become lists, unknown objects their ``str``): what a report
    may carry through xdist and into the JSON file."""
    return json.loads(json.dumps(value, default=str))


def pytest_configure(config: pytest.Config) -> None:
    config.stash[CURRENT_ITEM_KEY] = None
    config.stash[_SENT_KEY] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    """Remember the running test so session-scoped fixtures (servers) record their figures on it."""
    item.config.stash[CURRENT_ITEM_KEY] = item


def record(config: pytest.Config, name: str, value: object) -> None:
    """A JUnit property ``gpuready.NAME`` on the test that is running."""
    item = config.stash.get(CURRENT_ITEM_KEY, None)
    if item is not None:
        item.user_properties.append((f"gpuready.{name}", value))


def add_report_entry(config: pytest.Config, section: str, entry: Mapping[str, Any], *,
                     host: str | None = None) -> dict[str, Any] | None:
    """Add an entry to a section of the JSON report, tagged with the running test and its host.

    ``host`` names the host when it is not the running test's (a server of host A stopped while
    pytest moves on to host B's tests). Returns the stored entry (None outside a test): what is
    added to it before the phase's report is made goes out with it (a baseline comparison that
    the test asserts later).
    """
    item = config.stash.get(CURRENT_ITEM_KEY, None)
    if item is None:
        return None
    tagged = {"test": item.nodeid, "host": host if host is not None else host_of_item(item), **entry}
    stored: dict[str, Any] = plain(tagged)
    item.stash.setdefault(_ENTRIES_KEY, []).append((section, stored))
    return stored


def deployment_of_item(item: pytest.Item) -> str | None:
    """The deployment a test checks: the preflight's ``deployment`` parameter, else its
    ``@pytest.mark.deployment(name)``; None for a test of no deployment."""
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get("deployment") if callspec is not None else None
    if isinstance(param, str):
        return param
    marker = item.get_closest_marker("deployment")
    if marker is not None:
        name = marker.args[0] if marker.args else marker.kwargs.get("name")
        return str(name) if name is not None else None
    return None


def record_verdict(item: pytest.Item, name: str, verdict: Verdict) -> None:
    """A check's Verdict: its summary as JUnit property ``gpuready.NAME``, all of it in the report."""
    item.user_properties.append((f"gpuready.{name}", verdict.summary))
    entry = {"test": item.nodeid, "host": host_of_item(item), "deployment": deployment_of_item(item),
             "name": name, "ok": verdict.ok, "needs": verdict.needs,
             "summary": verdict.summary, "details": list(verdict.details), "warnings": list(verdict.warnings),
             "evidence": dict(verdict.evidence), "rule_set": verdict.rule_set}
    item.stash.setdefault(_ENTRIES_KEY, []).append(("verdicts", plain(entry)))


def host_state(session: HostSession, worker: str | None) -> dict[str, Any]:
    """What the report says of a host: its last snapshot (or why there is none)."""
    latest = session.latest
    error = session.last_error
    return {
        "name": session.display_name,
        "spec": str(session.spec),
        "snapshot": snapshot_to_dict(latest) if latest is not None and error is None else None,
        "error": str(error) if error is not None else None,
        "snapshots_taken": session.snapshots_taken,
        "worker": worker,
    }


def _changed_hosts(config: pytest.Config, worker: str | None) -> list[dict[str, Any]]:
    registry = config.stash.get(HOST_REGISTRY_KEY, None)
    sent = config.stash.get(_SENT_KEY, {})
    changed = []
    for session in (registry or {}).values():
        if session.snapshots_taken != sent.get(session.display_name, 0):
            sent[session.display_name] = session.snapshots_taken
            changed.append(host_state(session, worker))
    return changed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    workerinput: dict[str, Any] | None = getattr(item.config, "workerinput", None)
    worker = str(workerinput["workerid"]) if workerinput and "workerid" in workerinput else None
    entries = item.stash.get(_ENTRIES_KEY, [])
    item.stash[_ENTRIES_KEY] = []
    setattr(report, PAYLOAD_ATTRIBUTE, {
        "host": host_of_item(item),
        "worker": worker,
        "entries": [[section, entry] for section, entry in entries],
        "hosts": _changed_hosts(item.config, worker),
    })
    return report
