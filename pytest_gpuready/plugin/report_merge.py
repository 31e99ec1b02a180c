"""Many runs' JSON reports (``--gpuready-report``) merged into one document of the same schema.

``srun -N 16 ...`` runs the preflight once per node, each writing its own report; the merge is
the one report of the fleet. Each report's hosts, tests and entries are kept as they are, with
one exception: a run on the node itself calls its host ``local``, so in the merge that host takes
the name of the machine that wrote the report (``environment.hostname``, else the file's name).
A host in several reports keeps its latest snapshot. The totals are recomputed: ``created`` is the
earliest start, ``session_s`` spans from it to the last report's end, ``tests_s`` and the per-host
figures are sums, ``exit_status`` is the worst of the inputs. ``merged_from`` lists the inputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.files import loads_json, read_text_bounded
from pytest_gpuready.plugin.recording import SECTIONS
from pytest_gpuready.plugin.report_document import SCHEMA_ID, SCHEMA_VERSION, plugin_version

MAX_REPORT_BYTES = 64 << 20
"""One node's report is kilobytes (its /dev/shm list is capped at 200 entries); 64 MiB bounds a
file that is not one."""

LOCAL_HOST = "local"
_EXIT_SEVERITY = (3, 4, 2, 1, 5)
"""pytest's exit codes, worst first: internal error, usage error, interrupted, tests failed, no
tests collected. The merge's exit status is the worst among its inputs (0 only when all are 0)."""


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One report file, or a one-line :class:`ConfigError` naming it and what was expected."""
    shown = os.fspath(path)
    document = loads_json(read_text_bounded(path, MAX_REPORT_BYTES, "report"), shown)
    if not isinstance(document, dict) or document.get("$schema") != SCHEMA_ID:
        raise ConfigError(f"{shown}: not a pytest-gpuready report (expected a JSON object with "
                          f"\"$schema\": \"{SCHEMA_ID}\", as --gpuready-report writes)")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{shown}: report schema_version {document.get('schema_version')!r}; this "
                          f"pytest-gpuready reads version {SCHEMA_VERSION}")
    for key in ("hosts", "tests", *SECTIONS):
        if not isinstance(document.get(key, []), list):
            raise ConfigError(f"{shown}: {key!r} is not a list")
    return document


def _origin(document: Mapping[str, Any], path: str) -> str:
    hostname = (document.get("environment") or {}).get("hostname")
    return str(hostname) if hostname else Path(path).name.removesuffix(".json")


def _renamed(value: Any, local_name: str) -> Any:
    return local_name if value == LOCAL_HOST else value


def _timestamp(created: str) -> float:
    try:
        return datetime.fromisoformat(created).timestamp()
    except (TypeError, ValueError):
        return 0.0


def worst_exit_status(statuses: Sequence[int | None]) -> int | None:
    """0 when every input passed; else the worst (see :data:`_EXIT_SEVERITY`); None when none is known."""
    known = [s for s in statuses if s is not None]
    if not known:
        return None
    bad = [s for s in known if s != 0]
    if not bad:
        return 0
    return min(bad, key=lambda s: _EXIT_SEVERITY.index(s) if s in _EXIT_SEVERITY else -1)


def merge_reports(documents: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """One report from ``(path, document)`` pairs (documents as :func:`read_report` returns them)."""
    if not documents:
        raise ConfigError("report merge: no reports given")
    hosts: dict[str, dict[str, Any]] = {}
    tests: list[dict[str, Any]] = []
    sections: dict[str, list[dict[str, Any]]] = {section: [] for section in SECTIONS}
    per_host: dict[str, dict[str, Any]] = {}
    workers: set[str] = set()
    merged_from = []
    starts, ends, tests_s = [], [], 0.0
    for path, document in documents:
        local = _origin(document, path)
        for host in document.get("hosts") or []:
            _add_host(hosts, _host_renamed(host, local))
        for test in document.get("tests") or []:
            tests.append({**test, "host": _renamed(test.get("host"), local)})
        for section in SECTIONS:
            for entry in document.get(section) or []:
                sections[section].append({**entry, "host": _renamed(entry.get("host"), local)})
        timings = document.get("timings") or {}
        for name, totals in (timings.get("per_host") or {}).items():
            merged = per_host.setdefault(_renamed(name, local), {"tests": 0, "duration_s": 0.0, "workers": []})
            merged["tests"] += int(totals.get("tests") or 0)
            merged["duration_s"] = round(merged["duration_s"] + float(totals.get("duration_s") or 0.0), 6)
            merged["workers"] += [w for w in totals.get("workers") or [] if w not in merged["workers"]]
        workers.update(str(w) for w in document.get("workers") or [])
        start = _timestamp(str(document.get("created")))
        starts.append(start)
        ends.append(start + float(timings.get("session_s") or 0.0))
        tests_s += float(timings.get("tests_s") or 0.0)
        merged_from.append({"path": path, "hostname": local, "created": document.get("created"),
                            "exit_status": document.get("exit_status"),
                            "environment": dict(document.get("environment") or {})})
    first = min(range(len(documents)), key=lambda i: starts[i])
    environment = {key: value for key, value in (documents[0][1].get("environment") or {}).items()
                   if key in ("python", "pytest", "pytest_xdist")}
    return {
        "$schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "plugin": {"name": "pytest-gpuready", "version": plugin_version()},
        "environment": environment,
        "created": documents[first][1].get("created"),
        "exit_status": worst_exit_status([d.get("exit_status") for _, d in documents]),
        "workers": sorted(workers),
        "timings": {"session_s": round(max(0.0, max(ends) - min(starts)), 6), "tests_s": round(tests_s, 6),
                    "per_host": per_host},
        "hosts": list(hosts.values()),
        "tests": tests,
        **sections,
        "merged_from": merged_from,
    }


def _host_renamed(host: Mapping[str, Any], local: str) -> dict[str, Any]:
    renamed = {**host, "name": _renamed(host.get("name"), local)}
    snapshot = host.get("snapshot")
    if isinstance(snapshot, Mapping):
        renamed["snapshot"] = {**snapshot, "host": _renamed(snapshot.get("host"), local)}
    return renamed


def _add_host(hosts: dict[str, dict[str, Any]], host: dict[str, Any]) -> None:
    """Keep a host's entry with the latest snapshot (a host checked by several runs)."""
    name = str(host.get("name"))
    known = hosts.get(name)
    if known is None or _taken_at(host) >= _taken_at(known):
        hosts[name] = host


def _taken_at(host: Mapping[str, Any]) -> float:
    snapshot = host.get("snapshot") or {}
    return float(snapshot.get("taken_at") or 0.0)
