"""The terminal summary: one GPU table per host, then one line per failed invariant.

Rendered from the report's data (serialized snapshots and verdicts), so it reads the same with
and without xdist. Every line fits ``width`` columns (at most 100): a GPU's memory is drawn as a
bar, long names and process lists are cut with ``...``. :func:`host_tables` marks each row dirty
or not; the caller paints dirty rows red (``--color=yes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_WIDTH = 100
BAR_WIDTH = 20


@dataclass(frozen=True)
class Line:
    """A line of the summary and whether it shows something dirty (painted red)."""

    text: str
    dirty: bool = False


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, ending in ``...`` when cut."""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def bar(used: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#####...............]``: the used share of ``total`` (a share of 1% or more shows at least one ``#``)."""
    if total <= 0:
        return "[" + "?" * width + "]"
    share = min(used, total) / total
    filled = round(width * share)
    if filled == 0 and share >= 0.01:
        filled = 1
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _processes(processes: Sequence[Mapping[str, Any]], room: int) -> str:
    """The processes on a GPU in ``room`` columns: whole entries, then ``+N more`` for the rest."""
    parts = []
    for process in processes:
        mib = process.get("used_memory_mib")
        gone = " (gone)" if process.get("alive") is False else ""
        parts.append(f"{process.get('pid')} {process.get('name')} {mib if mib is not None else '?'} MiB{gone}")
    if not parts:
        return "-"
    for shown in range(len(parts), 0, -1):
        text = ", ".join(parts[:shown]) + (f", +{len(parts) - shown} more" if shown < len(parts) else "")
        if len(text) <= room:
            return text
    return fit(parts[0], room)


def gpu_rows(snapshot: Mapping[str, Any], max_used_mib: int, width: int = MAX_WIDTH) -> list[Line]:
    """The table of one snapshot: ``GPU  Name  Used / Total MiB  [bar]  Processes``."""
    gpus: Sequence[Mapping[str, Any]] = snapshot.get("gpus") or []
    if not gpus:
        return []
    processes: Sequence[Mapping[str, Any]] = snapshot.get("processes") or []
    name_width = min(30, max(len("Name"), *(len(str(g.get("name", ""))) for g in gpus)))
    numbers = [f"{g.get('memory_used_mib')} / {g.get('memory_total_mib')}" for g in gpus]
    number_width = max(len("Used / Total MiB"), *(len(n) for n in numbers))
    head = (f"{'GPU':<3}  {'Name':<{name_width}}  {'Used / Total MiB':>{number_width}}  "
            f"{'Memory':<{BAR_WIDTH + 2}}  Processes")
    lines = [Line(fit(head, width))]
    for gpu, number in zip(gpus, numbers, strict=True):
        index = gpu.get("index")
        on_gpu = [p for p in processes if p.get("gpu_index") == index]
        used = int(gpu.get("memory_used_mib") or 0)
        dirty = bool(on_gpu) or used > max_used_mib
        row = (f"{index!s:<3}  {fit(str(gpu.get('name', '')), name_width):<{name_width}}  {number:>{number_width}}  "
               f"{bar(used, int(gpu.get('memory_total_mib') or 0))}  ")
        lines.append(Line(fit(row + _processes(on_gpu, width - len(row)), width), dirty))
    return lines


def host_title(host: Mapping[str, Any]) -> str:
    snapshot = host.get("snapshot") or {}
    parts = [f"gpuready: GPUs on {host.get('name')}"]
    if host.get("driver_versions"):
        parts.append(f"driver {', '.join(host['driver_versions'])}")
    if snapshot.get("vllm_version"):
        parts.append(f"vLLM {snapshot['vllm_version']}")
    return ", ".join(parts) + " (last snapshot)"


def host_tables(hosts: Iterable[Mapping[str, Any]], max_used_mib: int,
                width: int = MAX_WIDTH) -> list[tuple[str, list[Line]]]:
    """(title, lines) for every host with GPUs in its last snapshot."""
    tables = []
    for host in hosts:
        snapshot = host.get("snapshot")
        if not snapshot or not snapshot.get("gpus"):
            continue
        tables.append((host_title(host), gpu_rows(snapshot, max_used_mib, width)))
    return tables


def failure_lines(hosts: Iterable[Mapping[str, Any]], verdicts: Iterable[Mapping[str, Any]],
                  width: int = MAX_WIDTH) -> list[Line]:
    """One line per host that could not be measured at all, then one per failed invariant of each
    deployment: ``host  deployment  check: headline (+N more)``.

    The headline is the verdict's summary (what failed, in vLLM's words where it has them); ``+N``
    counts the lines of evidence the test's failure message holds beyond it. The headline is cut
    to make room, never the count. A check of no deployment (the host checks, a marker on a test)
    leaves the deployment out; the same failure in several such tests of one host is said once.
    Undecided verdicts (their tests skipped, saying what to pass) are not failures.
    """
    lines = []
    for host_entry in hosts:
        error = str(host_entry.get("error") or "")
        if error:
            error = error.removeprefix(f"{host_entry.get('spec')}: ")
            lines.append(Line(fit(f"{host_entry.get('name')}  not measured: {error}", width), True))
    seen: set[tuple[Any, ...]] = set()
    for verdict in verdicts:
        if verdict.get("ok") or verdict.get("needs"):
            continue
        deployment = verdict.get("deployment")
        summary = str(verdict.get("summary") or "").strip()
        key = (verdict.get("host"), deployment, verdict.get("name"), None if deployment else summary)
        if key in seen:
            continue
        seen.add(key)
        details = [str(d).strip() for d in verdict.get("details") or [] if str(d).strip()]
        more = f" (+{len(details)} more)" if details else ""
        prefix = f"{verdict.get('host') or '-'}  " + (f"{deployment}  " if deployment else "")
        head = fit(f"{prefix}{verdict.get('name')}: ", max(0, width - len(more) - 20))
        lines.append(Line(head + fit(summary.splitlines()[0] if summary else "-",
                                     max(3, width - len(head) - len(more))) + more, True))
    return lines


_BAD_OUTCOMES = ("failed", "error")


def _first_line(text: object) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def first_failure(hosts: Iterable[Mapping[str, Any]], tests: Iterable[Mapping[str, Any]],
                  verdicts: Iterable[Mapping[str, Any]]) -> str | None:
    """One line naming the first thing wrong in a report's data, or None when all was measured and held.

    In the order an operator reads them: a host that could not be probed; a host with no GPU (a GPU
    node whose driver fell off the bus reads so); the first failed invariant (its first piece of
    evidence, as :func:`failure_lines` shows it); a test that failed or errored without a verdict
    (could not measure); no test at all.
    """
    for host in hosts:
        if host.get("error"):
            return f"not measured: {_first_line(host['error'])}"
        snapshot = host.get("snapshot") or {}
        if snapshot.get("no_gpu_reason"):
            return f"no GPU: {_first_line(snapshot['no_gpu_reason'])}"
    for verdict in verdicts:
        if verdict.get("ok"):
            continue
        details = [str(d).strip() for d in verdict.get("details") or [] if str(d).strip()]
        evidence = details[0] if details else _first_line(verdict.get("summary"))
        more = f" (+{len(details) - 1} more)" if len(details) > 1 else ""
        return f"{verdict.get('name')}: {evidence}{more}"
    ran = list(tests)
    for test in ran:
        if test.get("outcome") in _BAD_OUTCOMES:
            name = str(test.get("nodeid", "")).rsplit("::", 1)[-1]
            what = "could not measure" if test["outcome"] == "error" else "failed"
            return f"{name} {what}: {_first_line(test.get('message') or 'no message')}"
    return None if ran else "no test ran"


def host_rows(document: Mapping[str, Any], width: int = MAX_WIDTH) -> list[Line]:
    """The per-host table of a (merged) report: GPUs, driver, test outcomes (ok, fail, err, skip), the
    first failure (:func:`first_failure`, cut to the line's width; :func:`failure_lines` has more)."""
    hosts: Sequence[Mapping[str, Any]] = document.get("hosts") or []
    tests: Sequence[Mapping[str, Any]] = document.get("tests") or []
    verdicts: Sequence[Mapping[str, Any]] = document.get("verdicts") or []
    names = [str(h.get("name")) for h in hosts]
    name_width = min(30, max([len("host"), *(len(n) for n in names)]))
    head = f"{'host':<{name_width}}  GPUs  {'driver':<12}  tests    ok  fail   err  skip  first failure"
    lines = [Line(fit(head, width))]
    for host, name in zip(hosts, names, strict=True):
        own = [t for t in tests if t.get("host") == name]
        counts = {o: sum(1 for t in own if t.get("outcome") == o) for o in ("passed", "failed", "error", "skipped")}
        failure = first_failure([host], own, [v for v in verdicts if v.get("host") == name])
        gpus = host.get("gpu_count")
        driver = ", ".join(host.get("driver_versions") or []) or "-"
        row = (f"{fit(name, name_width):<{name_width}}  {gpus if gpus is not None else '-':>4}  {fit(driver, 12):<12}  "
               f"{len(own):>5}  {counts['passed']:>4}  {counts['failed']:>4}  {counts['error']:>4}  "
               f"{counts['skipped']:>4}  ")
        lines.append(Line(fit(row + (failure or "-"), width), failure is not None))
    return lines
