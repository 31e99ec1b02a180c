"""The ``gpuready`` console script (and ``python -m pytest_gpuready``): one word, one command.

``gpuready plan ...`` is the planner (:mod:`pytest_gpuready.plan.cli`, unchanged: the whole
command line goes to it); ``gpuready slurm-health`` the Slurm node check
(:mod:`pytest_gpuready.cli.slurm_health`); ``gpuready report merge`` joins many runs' JSON
reports (:mod:`pytest_gpuready.cli.report`). Each command owns its parser and its exit codes;
this module only picks the command, so each loads only what it needs.

May import every layer below it; nothing imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _plan(argv: Sequence[str]) -> int:
    from pytest_gpuready.plan.cli import main as plan_main

    return plan_main(argv)


def _slurm_health(argv: Sequence[str]) -> int:
    from pytest_gpuready.cli.slurm_health import main as slurm_health_main

    return slurm_health_main(argv)


def _report(argv: Sequence[str]) -> int:
    from pytest_gpuready.cli.report import main as report_main

    return report_main(argv)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "plan": (_plan, "list every TP/PP/DP/EP and KV-dtype layout of a model, best first"),
    "slurm-health": (_slurm_health, "the preflight on this Slurm node: drain it with the cause, or resume it"),
    "report": (_report, "report merge: many runs' --gpuready-report files into one"),
}
"""Each command: what runs it (given the whole argv, the command's word first; imported only
when chosen), and its one-line help."""

EXIT_USAGE = 2


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: gpuready COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "gpuready COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else EXIT_USAGE
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"gpuready: unknown command {args[0]!r}: expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    return entry[0](args)
