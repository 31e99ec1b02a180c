"""Two-GPU checks that need CUDA itself: the functional P2P check and the NCCL all-reduce check.

Why a worker: only a data path proves P2P (``cudaDeviceCanAccessPeer`` says yes on the PCIe boxes
where ACS or an IOMMU make TP hang, gpu-health-anchors.md B6), and only NCCL proves NCCL. Both
need torch and the GPUs, which live on the GPU host, in its Python (often a venv's, hence
``python``). So the plugin imports no torch: it sends a worker script (``host/workers/``) over the
host's connection in one command (``cat > tmp/worker.py; timeout -s KILL ... python worker.py``),
reads the ``@@gpuready {json}`` lines the worker prints, and judges them here.

Three deadlines, innermost first: the worker's own per pair / per group (it kills its processes
and reports a hang, naming them), GNU ``timeout -s KILL`` a little later (it signals its whole
process group, the worker's spawned ranks included), and the host command's timeout (the local
process group, or the ssh command). A worker that ends without its ``done`` line was killed.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.hosts import CommandTimeout, Host
from pytest_gpuready.host.snapshot import Topology
from pytest_gpuready.verdict import Verdict

WORKERS = Path(__file__).resolve().parent / "workers"
MARK = "@@gpuready "
OUTER_GRACE_S = 15.0
"""How long after the worker's own deadline ``timeout -s KILL`` ends it (spawn and CUDA init included)."""

NVLINK_BUSBW_MIN_GBPS = 150.0
PCIE_BUSBW_MIN_GBPS = 15.0
"""NVSentinel ``preflight-nccl-loopback``: all-reduce of 256 MB over the node's GPUs fails below
``BW_THRESHOLD_GBPS`` 150 ("NVLink ... 150+ GB/s; set to approx 15 GB/s for PCIe"),
NVIDIA/NVSentinel docs/configuration/preflight.md at 231a207e (gpu-health-anchors.md N2)."""
DEFAULT_SIZE_MB = 256


@dataclass(frozen=True)
class WorkerRun:
    """What a worker printed: its ``@@gpuready`` facts, whether it reached its end, its exit."""

    facts: tuple[dict[str, Any], ...]
    finished: bool
    returncode: int | None
    stderr: str
    timed_out: bool = False

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [fact for fact in self.facts if fact.get("kind") == kind]


def parse_worker_output(stdout: str) -> tuple[tuple[dict[str, Any], ...], bool]:
    """The worker's ``@@gpuready {json}`` lines (other output ignored) and whether ``done`` came."""
    facts: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if not line.startswith(MARK):
            continue
        try:
            fact = json.loads(line[len(MARK):])
        except json.JSONDecodeError:
            raise ProbeError(f"worker output line is not JSON: {line[:120]!r}") from None
        if not isinstance(fact, dict):
            raise ProbeError(f"worker output line is not a JSON object: {line[:120]!r}")
        facts.append(fact)
    return tuple(facts), any(fact.get("kind") == "done" for fact in facts)


def worker_command(name: str, args: Sequence[str], python: str, timeout_s: float,
                   grace_s: float = OUTER_GRACE_S) -> str:
    """One shell command: the script from stdin into a private directory, run under a hard kill, removed."""
    outer = max(1, round(timeout_s + grace_s))
    run = f"{python} \"$d/{name}\" {' '.join(shlex.quote(a) for a in args)}"
    return ('d=$(mktemp -d "${TMPDIR:-/tmp}/gpuready-worker.XXXXXX") || exit 97; '
            f'cat > "$d/{name}"; '
            f"if command -v timeout >/dev/null 2>&1; then timeout -s KILL {outer} {run}; else {run}; fi; "
            'rc=$?; rm -rf "$d"; exit $rc')


def run_worker(host: Host, name: str, args: Sequence[str], *, python: str, timeout_s: float,
               grace_s: float = OUTER_GRACE_S) -> WorkerRun:
    """Run worker ``name`` (a file of ``host/workers``) on ``host``; never longer than its deadlines."""
    script = (WORKERS / name).read_bytes()
    try:
        result = host.run(worker_command(name, args, python, timeout_s, grace_s), stdin=script,
                          timeout=timeout_s + 2 * grace_s)
    except CommandTimeout as exc:
        facts, finished = parse_worker_output(exc.stdout)
        return WorkerRun(facts, finished, None, exc.stderr, timed_out=True)
    facts, finished = parse_worker_output(result.stdout)
    return WorkerRun(facts, finished, result.returncode, result.stderr)


def _not_run(run: WorkerRun, what: str, host: str, timeout_s: float) -> ProbeError | None:
    """A worker that could not measure (no torch, a crash, no output): the check errors with the cause."""
    errors = run.of_kind("error")
    if errors:
        return ProbeError(f"{host}: {what} could not run: {errors[0].get('error')}")
    if run.finished:
        return None
    tail = " ".join(run.stderr.split())[-300:]
    if run.timed_out or run.returncode in (137, -9):
        return None  # a hang: judged by the caller from what was printed before the kill
    return ProbeError(f"{host}: {what} ended without its result (exit {run.returncode}): {tail or 'no output'}")


def check_p2p_functional(host: Host, gpus: Sequence[int], *, python: str = "python3",
                         timeout_s: float = 60.0, grace_s: float = OUTER_GRACE_S) -> Verdict:
    """A CUDA IPC peer read and write per pair of ``gpus`` in two processes each, with a deadline.

    Fails on a pair whose bytes came back wrong, whose processes failed, or that hung (P2P broken:
    vLLM's TP would hang or corrupt; set ``iommu=pt`` / disable ACS, or ``NCCL_P2P_DISABLE=1``).
    Errors when it could not run (no torch on the host, fewer than two GPUs).
    """
    group = list(gpus)
    if len(group) < 2:
        raise ProbeError(f"{host.name}: the P2P check needs two GPUs or more, got {group}")
    pairs = list(combinations(group, 2))
    run = run_worker(host, "p2p_ipc.py", ["--gpus", ",".join(map(str, group)), "--timeout", f"{timeout_s:g}"],
                     python=python, timeout_s=timeout_s * len(pairs), grace_s=grace_s)
    problem = _not_run(run, "the P2P check", host.name, timeout_s)
    if problem is not None:
        raise problem
    results = {tuple(fact["gpus"]): fact for fact in run.of_kind("pair")}
    details: list[str] = []
    for a, b in pairs:
        fact = results.get((a, b))
        if fact is None:
            details.append(f"GPU {a} <-> GPU {b}: no result: the worker was killed after "
                           f"{timeout_s * len(pairs) + grace_s:g} s (a hang)")
        elif fact.get("hang"):
            details.append(f"GPU {a} <-> GPU {b}: hung: {fact.get('error')}")
        elif fact.get("error"):
            details.append(f"GPU {a} <-> GPU {b}: {fact.get('error')}")
        elif fact.get("read_ok") is not True or fact.get("write_ok") is not True:
            details.append(f"GPU {a} <-> GPU {b}: bytes came back wrong (read {fact.get('read_ok')}, "
                           f"write {fact.get('write_ok')})")
    evidence = {"host": host.name, "gpus": group, "pairs": [results.get(p) for p in pairs],
                "versions": next(iter(run.of_kind("versions")), None)}
    if details:
        return Verdict.failed(f"{host.name}: P2P over CUDA IPC failed for GPUs {','.join(map(str, group))}",
                              details=(*details, "tensor parallelism over these GPUs may hang or corrupt data; "
                                       "check ACS and the IOMMU (iommu=pt), or run vLLM with NCCL_P2P_DISABLE=1"),
                              evidence=evidence)
    seconds = ", ".join(f"{a}<->{b} {results[(a, b)].get('seconds')} s" for a, b in pairs)
    return Verdict.passed(f"{host.name}: P2P over CUDA IPC works for GPUs {','.join(map(str, group))} ({seconds})",
                          evidence=evidence)


def group_fabric(topology: Topology, gpus: Sequence[int]) -> str:
    """``NVLink`` when every pair of the group is NVLink-connected (``NV#`` in ``topo -m``), else ``PCIe``."""
    links = [topology.link(a, b) for a, b in combinations(gpus, 2)]
    if any(link is None for link in links):
        missing = [f"GPU{a}-GPU{b}" for (a, b), link in zip(combinations(gpus, 2), links, strict=True) if link is None]
        raise ProbeError(f"the topology lacks links {', '.join(missing)}: cannot tell NVLink from PCIe")
    return "NVLink" if all(link is not None and link.startswith("NV") for link in links) else "PCIe"


def busbw_threshold(fabric: str) -> float:
    return NVLINK_BUSBW_MIN_GBPS if fabric == "NVLink" else PCIE_BUSBW_MIN_GBPS


def check_nccl_allreduce(host: Host, gpus: Sequence[int], topology: Topology, *, python: str = "python3",
                         size_mb: int = DEFAULT_SIZE_MB, timeout_s: float = 120.0,
                         min_busbw_gbps: float | None = None, grace_s: float = OUTER_GRACE_S) -> Verdict:
    """An NCCL all-reduce of ``size_mb`` MB over ``gpus``: a hang or a wrong sum fails, and so does a
    bus bandwidth below the threshold of the group's measured fabric (NVLink 150, PCIe 15 GB/s)."""
    group = list(gpus)
    if len(group) < 2:
        raise ProbeError(f"{host.name}: the NCCL all-reduce check needs two GPUs or more, got {group}")
    fabric = group_fabric(topology, group)
    threshold = min_busbw_gbps if min_busbw_gbps is not None else busbw_threshold(fabric)
    run = run_worker(host, "nccl_allreduce.py", ["--gpus", ",".join(map(str, group)), "--size-mb", str(size_mb),
                                                  "--timeout", f"{timeout_s:g}"], python=python, timeout_s=timeout_s,
                     grace_s=grace_s)
    problem = _not_run(run, "the NCCL all-reduce check", host.name, timeout_s)
    if problem is not None:
        raise problem
    facts = run.of_kind("allreduce")
    name = f"{host.name}: NCCL all-reduce of {size_mb} MB over GPUs {','.join(map(str, group))} ({fabric})"
    evidence: dict[str, Any] = {"host": host.name, "gpus": group, "fabric": fabric, "threshold_gbps": threshold,
                                "result": facts[0] if facts else None,
                                "versions": next(iter(run.of_kind("versions")), None)}
    if not facts:
        return Verdict.failed(f"{name}: hung: no result within {timeout_s + grace_s:g} s, the worker was killed",
                              evidence=evidence)
    fact = facts[0]
    if fact.get("hang"):
        return Verdict.failed(f"{name}: hung: ranks {fact.get('hung_ranks')} did not finish within {timeout_s:g} s "
                              "and were killed", details=("a TP group over these GPUs would hang the same way; "
                                                          "try NCCL_P2P_DISABLE=1 to tell P2P from the rest",),
                              evidence=evidence)
    wrong = fact.get("wrong_elements")
    if wrong is None or any(code not in (0, None) for code in fact.get("exit_codes") or ()):
        raise ProbeError(f"{name}: a rank failed (exit codes {fact.get('exit_codes')}): {run.stderr.strip()[-300:]}")
    if wrong:
        return Verdict.failed(f"{name}: wrong sum in {wrong} elements", evidence=evidence)
    busbw = fact.get("busbw_gbps")
    if not isinstance(busbw, (int, float)):
        raise ProbeError(f"{name}: no bus bandwidth in the worker's result")
    summary = f"{name}: bus bandwidth {busbw:.1f} GB/s (threshold {threshold:g} GB/s for {fabric})"
    if busbw < threshold:
        return Verdict.failed(summary, details=(f"below the {fabric} threshold (NVSentinel's preflight-nccl-loopback "
                                                "defaults)",), evidence=evidence)
    return Verdict.passed(summary, evidence=evidence)


__all__ = [
    "NVLINK_BUSBW_MIN_GBPS",
    "PCIE_BUSBW_MIN_GBPS",
    "WorkerRun",
    "busbw_threshold",
    "check_nccl_allreduce",
    "check_p2p_functional",
    "group_fabric",
    "parse_worker_output",
    "run_worker",
    "worker_command",
]
