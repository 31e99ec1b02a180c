"""``gpuready report merge FILE... -o OUT``: many JSON reports into one (:mod:`pytest_gpuready.plugin.report_merge`).

Prints the per-host table (GPUs, driver, outcomes, the first failure of each host), each host's
GPU table and the failed invariants, as the terminal summary of one run shows them; writes the
merged report (``-`` for stdout). Exit 0 when every merged run passed, 1 when some did not, 2 on
bad input (a file that is not a report: one line naming it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.plugin.options import GPU_MAX_USED_MIB
from pytest_gpuready.plugin.report_merge import merge_reports, read_report
from pytest_gpuready.plugin.summary import failure_lines, host_rows, host_tables

EXIT_USAGE = 2


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuready report", description="work with --gpuready-report files")
    commands = top.add_subparsers(dest="action", required=True)
    merge = commands.add_parser("merge", help="many runs' reports (one per node, say) into one report",
                                description="Merge --gpuready-report files into one report of the same schema; "
                                            "print the per-host table.")
    merge.add_argument("reports", nargs="+", metavar="REPORT", help="report files (JSON), e.g. reports/*.json")
    merge.add_argument("-o", "--output", metavar="PATH", required=True, help="the merged report ('-': stdout)")
    merge.add_argument(GPU_MAX_USED_MIB.flag, dest="max_used_mib", type=int, default=GPU_MAX_USED_MIB.default,
                       metavar=GPU_MAX_USED_MIB.metavar, help=f"in the GPU tables: {GPU_MAX_USED_MIB.help}")
    return top


def summary_text(document: dict[str, Any], max_used_mib: int) -> str:
    lines = [line.text for line in host_rows(document)]
    for title, rows in host_tables(document.get("hosts") or [], max_used_mib):
        lines += ["", title, *(row.text for row in rows)]
    failures = failure_lines(document.get("hosts") or [], document.get("verdicts") or [])
    if failures:
        lines += ["", "failed invariants:", *(line.text for line in failures)]
    return "\n".join(lines)


def write_json(path: str, document: dict[str, Any]) -> None:
    """The report at ``path``: ``-`` is stdout; a device or FIFO (``/dev/stdout``) is written as a stream;
    a regular file or a new one is written whole (a temporary file beside it, renamed over it)."""
    text = json.dumps(document, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    if target.exists() and not target.is_file():
        with open(target, "w") as stream:  # a device or FIFO: never replaced
            stream.write(text)
        return
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def main(argv: Sequence[str]) -> int:
    """``argv`` starts with the command's word (``report``), as the dispatcher passes it."""
    args = parser().parse_args(list(argv)[1:])
    try:
        documents = [(path, read_report(path)) for path in args.reports]
        merged = merge_reports(documents)
    except ConfigError as exc:
        print(f"gpuready report merge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    output = Path(args.output)
    if args.output != "-" and (output.is_dir() or not output.parent.resolve().is_dir()):
        print(f"gpuready report merge: -o {args.output}: expected a file in an existing folder", file=sys.stderr)
        return EXIT_USAGE
    try:
        write_json(args.output, merged)
    except OSError as exc:
        print(f"gpuready report merge: -o {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    shown = sys.stderr if args.output == "-" else sys.stdout
    print(summary_text(merged, args.max_used_mib), file=shown)
    where = "stdout" if args.output == "-" else args.output
    print(f"\nmerged {len(documents)} reports: {len(merged['hosts'])} hosts, {len(merged['tests'])} tests; "
          f"written to {where}", file=shown)
    return 0 if merged["exit_status"] == 0 else 1
