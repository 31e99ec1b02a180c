"""``gpuready slurm-health``: the command line of the Slurm node check (:mod:`pytest_gpuready.slurm.health`).

Slurm starts it with an empty environment (a ``HealthCheckProgram``) or with the job's
``SLURM_*`` variables (``Prolog``, ``Epilog``): so every input is an option, the node's name falls
back to ``SLURMD_NODENAME`` (which slurmd sets in both), and a missing ``PATH`` is the system's.
Options of the pytest plugin keep their plugin names and help (``--gpuready-config``,
``--gpu-ids``, ``--gpu-reap-orphans``); anything after ``--`` goes to pytest as it is. Bad
input: one line and exit 2. One line on stdout says what was done (docs/slurm.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.plugin.model_fixtures import GPUREADY_CONFIG
from pytest_gpuready.plugin.options import GPU_IDS, GPU_REAP_ORPHANS
from pytest_gpuready.slurm.health import (
    DEFAULT_TIMEOUT_S,
    EXIT_CANNOT_ACT,
    HealthRequest,
    check_node,
    expand_report_path,
    job_gpus,
)
from pytest_gpuready.slurm.node import Scontrol

DEFAULT_REPORT = "/var/log/gpuready/{node}-{mode}.json"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXIT_USAGE = 2


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds between 1 and 3600, like 50")
    return value


def parser() -> argparse.ArgumentParser:
    cmd = argparse.ArgumentParser(
        prog="gpuready slurm-health",
        description="Run the host preflight (and a deploy file's checks) on this Slurm node; drain the node "
                    "with the first failed invariant as its reason, or resume it if gpuready drained it. "
                    "Exit 0 healthy, 1 unhealthy, 2 bad option, 3 could not act (scontrol failed).",
        epilog="Arguments after -- go to pytest unchanged, e.g. -- --gpu-max-used-mib 512.")
    mode = cmd.add_mutually_exclusive_group()
    mode.add_argument("--epilog", action="store_const", dest="mode", const="epilog",
                      help="run as the job's Epilog: check the job's GPUs (SLURM_JOB_GPUS) and /dev/shm after it; "
                           "exit 1 when dirty, so Slurm knows")
    mode.add_argument("--prolog", action="store_const", dest="mode", const="prolog",
                      help="run as the job's Prolog: exit 1 on a dirty node, so Slurm requeues the job")
    cmd.add_argument("--node", metavar="NAME",
                     help="this node's Slurm name (default: $SLURMD_NODENAME, else the short hostname)")
    cmd.add_argument(GPUREADY_CONFIG.flag, dest="deploy", metavar=GPUREADY_CONFIG.metavar,
                     help=f"also run the deployment checks: {GPUREADY_CONFIG.help}")
    cmd.add_argument(GPU_IDS.flag, dest="gpu_ids", metavar=GPU_IDS.metavar,
                     help=f"{GPU_IDS.help} In a prolog or epilog the default is the job's ($SLURM_JOB_GPUS).")
    cmd.add_argument(GPU_REAP_ORPHANS.flag, dest="reap", action="store_true", help=GPU_REAP_ORPHANS.help)
    cmd.add_argument("--report", metavar="PATH", default=DEFAULT_REPORT,
                     help=f"the node's JSON report; {{node}} and {{mode}} are filled in (default {DEFAULT_REPORT})")
    cmd.add_argument("--timeout", metavar="SECONDS", type=_seconds, default=DEFAULT_TIMEOUT_S,
                     help=f"the whole run's bound, drain included (default {DEFAULT_TIMEOUT_S:g}: slurmd kills a "
                          "health check at 60 s)")
    cmd.add_argument("--slurm-conf", metavar="FILE",
                     help="slurm.conf for scontrol (default $SLURM_CONF; a health check's environment is empty)")
    cmd.add_argument("--scontrol", metavar="PATH", default="scontrol", help="the scontrol binary (default: on PATH)")
    return cmd


def main(argv: Sequence[str]) -> int:
    """``argv`` starts with the command's word (``slurm-health``), as the dispatcher passes it."""
    own, extra = list(argv)[1:], []
    if "--" in own:
        own, extra = own[: own.index("--")], own[own.index("--") + 1:]
    args = parser().parse_args(own)
    os.environ.setdefault("PATH", SYSTEM_PATH)
    if args.slurm_conf:
        os.environ["SLURM_CONF"] = args.slurm_conf
    mode = args.mode or "health"
    node = args.node or os.environ.get("SLURMD_NODENAME") or platform.node().split(".")[0]
    try:
        report = expand_report_path(args.report, node, mode)
    except ConfigError as exc:
        print(f"gpuready slurm-health: {exc}", file=sys.stderr)
        return EXIT_USAGE
    gpu_ids = args.gpu_ids or (job_gpus(os.environ) if mode != "health" else None)
    request = HealthRequest(node=node, report=report, mode=mode, deploy_file=args.deploy, reap_orphans=args.reap,
                            gpu_ids=gpu_ids, job_id=os.environ.get("SLURM_JOB_ID"), timeout_s=args.timeout,
                            pytest_args=tuple(extra))
    try:
        result = check_node(request, Scontrol(binary=args.scontrol))
    except OSError as exc:
        print(f"gpuready slurm-health: node {node}: {report}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_CANNOT_ACT
    stream = sys.stdout if result.exit_code != EXIT_CANNOT_ACT else sys.stderr
    print(f"gpuready slurm-health: {result.message}", file=stream)
    return result.exit_code
