"""``gpuready slurm-health``: the preflight on this node, then drain it with the cause or resume it.

One run: take this node's lock (slurmd starts a new health check every interval even while the
last one still runs: measured, 22.05), read the node's state, run the built-in host preflight (and
the deployment checks of a deploy file) as a pytest run bounded by a deadline, read its JSON
report, and act on what it found:

- healthy: resume the node if, and only if, gpuready drained it (its reason starts ``gpuready:``);
- unhealthy: drain it with the first failed invariant as its reason, one line within Slurm's
  limit; never over an operator's drain (that reason stays as the operator wrote it).

The node's state is read again right before acting: in health mode, a node that took a job
while the check ran is left alone (its GPUs are the job's now). As a job's epilog (or prolog) the
node is busy by definition: the check covers the job's GPUs (``SLURM_JOB_GPUS``) and the reason
names the job.

Exit codes, as Slurm reads them: 0 the node is healthy (or was not checked: busy, or a check
already running); 1 the node is unhealthy (drained, or left drained by an operator); 3 the
check could not act (``scontrol`` failed). A prolog or epilog that exits non-zero makes slurmd
drain the node itself ("Epilog error") where gpuready could not; a reason gpuready set first
stays (measured, 22.05).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest_gpuready
from pytest_gpuready.errors import ConfigError
from pytest_gpuready.files import loads_json, read_text_bounded
from pytest_gpuready.host.hosts import run_bounded
from pytest_gpuready.plugin.options import (
    GPU_HOST,
    GPU_IDS,
    GPU_PROBE_TIMEOUT,
    GPU_REAP_ORPHANS,
    GPUREADY_CONFIG,
    GPUREADY_REPORT,
)
from pytest_gpuready.plugin.summary import first_failure
from pytest_gpuready.slurm.node import NodeState, Scontrol, SlurmError, one_line_reason

MODES = ("health", "prolog", "epilog")
HOST_SUITES = ("pytest_gpuready.preflight.test_host", "pytest_gpuready.preflight.test_health")
"""GPUs and /dev/shm clean, topology; the GPU health checks (XID, ECC, retired pages, clocks, ...)."""
DEPLOY_SUITE = "pytest_gpuready.preflight.test_deployments"
DEFAULT_TIMEOUT_S = 50.0
"""slurmd gives a HealthCheckProgram 60 s, then kills it (``health_check poll timeout @ 60000
msec``, measured, 22.05): finish, drain included, before that."""
MAX_REPORT_BYTES = 64 << 20
EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_CANNOT_ACT = 0, 1, 3
_PACKAGE_ROOT = str(Path(pytest_gpuready.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class HealthRequest:
    """What one run checks, and where its report goes."""

    node: str
    report: Path
    mode: str = "health"
    deploy_file: str | None = None
    reap_orphans: bool = False
    gpu_ids: str | None = None
    job_id: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    pytest_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Result:
    """What the run did, in one line, and the exit code for Slurm."""

    exit_code: int
    action: str
    """healthy, resumed, drained, still-drained, operator-drained, busy, job-started, locked, error."""
    message: str
    reason: str | None = None


@dataclass(frozen=True)
class PreflightRun:
    """The preflight's pytest run: its exit status, its report (None if none came), the failure."""

    returncode: int | None
    document: dict[str, Any] | None
    failure: str | None
    output_tail: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    actions: tuple[str, ...] = ()
    """What the run did to the node (engines stopped, /dev/shm files removed), as the plugin said it."""


ACTION_LINES = ("gpuready: stopped ", "gpuready: not stopped ", "gpuready: still running ", "gpuready: removed ")
"""The plugin's lines for what it did to the host (``--gpu-reap-orphans``, ``--shm-remove-leftovers``):
said again in the command's one line, since Slurm keeps nothing of the preflight's output."""


def _actions(stdout: bytes) -> tuple[str, ...]:
    lines = (line.strip() for line in stdout.decode(errors="replace").splitlines())
    return tuple(line.removeprefix("gpuready: ") for line in lines if line.startswith(ACTION_LINES))


def preflight_argv(request: HealthRequest, probe_timeout_s: float) -> list[str]:
    """The pytest command line of the preflight: the package's own suite against this machine,
    with no ini file, conftest or cache of whatever directory it runs in; ``-s``, since what the
    plugin says it did (an engine stopped) is written during a test's setup and capture would keep it."""
    argv = [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", _PACKAGE_ROOT, "--noconftest",
            "-p", "no:cacheprovider", "-q", "-s", "-rfE", "--pyargs", *HOST_SUITES]
    if request.deploy_file:
        argv += [DEPLOY_SUITE, GPUREADY_CONFIG.flag, request.deploy_file]
    argv += [GPU_HOST.flag, "local", GPUREADY_REPORT.flag, str(request.report),
             GPU_PROBE_TIMEOUT.flag, f"{probe_timeout_s:g}"]
    if request.reap_orphans:
        argv.append(GPU_REAP_ORPHANS.flag)
    if request.gpu_ids:
        argv += [GPU_IDS.flag, request.gpu_ids]
    return argv + list(request.pytest_args)


def _tail(data: bytes, lines: int = 3) -> str:
    text = data.decode(errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())


def run_preflight(request: HealthRequest, budget_s: float | None = None) -> PreflightRun:
    """Run the preflight, killed (its whole process group) after ``budget_s`` (default the request's
    timeout). The probe's own deadline, a share of the request's timeout in whole seconds, names
    what hung (``nvidia-smi --query-gpu did not answer within 20 s``) well before that."""
    probe_timeout = float(max(1, min(30, round(request.timeout_s * 0.4))))
    bound = request.timeout_s if budget_s is None else budget_s
    # this run's report goes to a name of its own, then over the node's report once read: the
    # node's report is always a whole one, and an earlier run's is never read as this one's
    fresh = request.report.with_name(f".{request.report.name}.{os.getpid()}.partial")
    with contextlib.suppress(FileNotFoundError):
        fresh.unlink()
    try:
        return _run_preflight(replace(request, report=fresh), probe_timeout, bound, request.report)
    finally:
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()


def _run_preflight(request: HealthRequest, probe_timeout: float, bound: float, final: Path) -> PreflightRun:
    started = time.monotonic()
    done = run_bounded(preflight_argv(request, probe_timeout), b"", bound)
    timings = {"preflight_s": round(time.monotonic() - started, 3)}
    tail = _tail(done.stdout + done.stderr)
    if done.cut is not None:
        return PreflightRun(None, None, f"the preflight did not finish within {bound:.0f} s and was "
                            f"killed (last output: {tail or 'none'})", tail, timings)
    try:
        document = loads_json(read_text_bounded(request.report, MAX_REPORT_BYTES, "report"), str(request.report))
    except ConfigError as exc:
        return PreflightRun(done.returncode, None, f"the preflight wrote no report (pytest exit "
                            f"{done.returncode}: {tail or exc})", tail, timings)
    if not isinstance(document, dict):
        return PreflightRun(done.returncode, None, f"{request.report}: not a report (a JSON object)", tail, timings)
    os.replace(request.report, final)
    failure = first_failure(document.get("hosts") or [], document.get("tests") or [],
                            document.get("verdicts") or [])
    if failure is None and done.returncode != 0:
        failure = f"the preflight exited {done.returncode} ({tail or 'no output'})"
    return PreflightRun(done.returncode, document, failure, tail, timings, _actions(done.stdout))


@contextlib.contextmanager
def node_lock(report: Path, wait_s: float) -> Iterator[bool]:
    """This (node, mode)'s lock beside its report; yields False when another run holds it past ``wait_s``."""
    report.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(report.with_name(f".{report.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.1)
        yield True
    finally:
        os.close(fd)


def _reason_prefix(request: HealthRequest) -> str:
    if request.mode == "epilog":
        return f"after job {request.job_id}: " if request.job_id else "after a job: "
    if request.mode == "prolog":
        return f"before job {request.job_id}: " if request.job_id else "before a job: "
    return ""


def check_node(request: HealthRequest, scontrol: Scontrol) -> Result:
    """One health check of this node, and the drain or resume it calls for."""
    started = time.monotonic()
    # a health check that finds one running gives up at once (the next interval comes); a job's
    # prolog or epilog waits for it, within its own deadline
    wait = 0.0 if request.mode == "health" else request.timeout_s / 2
    with node_lock(request.report, wait) as locked:
        if not locked:
            return Result(EXIT_HEALTHY, "locked", f"node {request.node}: a {request.mode} check is already "
                          "running; not checked again")
        try:
            return _check_locked(request, scontrol, started)
        except SlurmError as exc:
            return Result(EXIT_CANNOT_ACT, "error", f"node {request.node}: {exc}")


def _check_locked(request: HealthRequest, scontrol: Scontrol, started: float) -> Result:
    node = request.node
    before = scontrol.show(node)
    if request.mode == "health" and before.busy:
        return Result(EXIT_HEALTHY, "busy", f"node {node}: {before.state.lower()}, its GPUs are a job's: not checked")
    remaining = request.timeout_s - (time.monotonic() - started)
    run = run_preflight(request, max(1.0, remaining - 5.0))  # 5 s left for scontrol
    now = scontrol.show(node)  # again, right before acting on it
    done = "".join(f"; {action}" for action in run.actions)
    if run.failure is None:
        if now.drained_by_gpuready:
            scontrol.resume(node)
            return Result(EXIT_HEALTHY, "resumed", f"node {node}: healthy; resumed (gpuready had drained it: "
                          f"{now.reason}){done}")
        return Result(EXIT_HEALTHY, "healthy", f"node {node}: healthy{done}")
    reason = one_line_reason(_reason_prefix(request) + run.failure)
    result = _drain(request, scontrol, before, now, reason)
    return replace(result, message=result.message + done)


def _drain(request: HealthRequest, scontrol: Scontrol, before: NodeState, now: NodeState, reason: str) -> Result:
    node = request.node
    if request.mode == "health" and now.busy and not before.busy:
        return Result(EXIT_HEALTHY, "job-started", f"node {node}: a job started during the check; not drained "
                      f"(found: {reason})", reason)
    if now.drained and not now.drained_by_gpuready:
        return Result(EXIT_UNHEALTHY, "operator-drained", f"node {node}: {reason}; left drained as the operator "
                      f"set it ({now.reason})", reason)
    if now.drained_by_gpuready and now.reason == reason:
        return Result(EXIT_UNHEALTHY, "still-drained", f"node {node}: still drained: {reason}", reason)
    scontrol.drain(node, reason)
    return Result(EXIT_UNHEALTHY, "drained", f"node {node}: drained: {reason}", reason)


def expand_report_path(template: str, node: str, mode: str) -> Path:
    """``--report`` with ``{node}`` and ``{mode}`` filled in."""
    try:
        return Path(os.path.expanduser(template.format(node=node, mode=mode)))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"--report {template!r}: only {{node}} and {{mode}} may be filled in ({exc})") from None


def job_gpus(environ: Mapping[str, str]) -> str | None:
    """The job's GPUs, as Slurm gives a prolog or epilog them (``SLURM_JOB_GPUS=0,1``)."""
    value = environ.get("SLURM_JOB_GPUS", "").strip()
    return value or None
