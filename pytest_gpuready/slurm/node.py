"""This Slurm node's state, and the two changes gpuready makes to it: drain with a reason, resume.

Everything goes through ``scontrol`` (the client every Slurm site has), each call bounded by
:func:`~pytest_gpuready.host.hosts.run_bounded`. Slurm runs a ``HealthCheckProgram`` with an empty
environment, where ``scontrol`` finds no configuration (``Could not establish a configuration
source``) unless ``SLURM_CONF`` is set: :class:`Scontrol` takes the file explicitly and says so
in its error.

A drain's reason starts with :data:`REASON_PREFIX`; that prefix is how a later run tells a node
gpuready drained (which it may resume) from one an operator drained (which it never touches).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_gpuready.errors import GpuReadyError
from pytest_gpuready.host.hosts import run_bounded

REASON_PREFIX = "gpuready:"
"""Every reason gpuready sets starts so; a drain without it is an operator's."""

MAX_REASON_BYTES = 255
"""slurmdbd keeps a node's reason in its event table as ``tinytext`` (255 bytes); slurmctld 22.05
itself took a 70,000-character reason here, so the database's column is the limit that holds."""

BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
"""Base states and flags of a node that runs (or is finishing) a job: its GPUs are the job's."""

_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*)$")
_STAMP = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")


class SlurmError(GpuReadyError):
    """``scontrol`` could not be run, or refused: the node's state is unknown or unchanged."""


@dataclass(frozen=True)
class NodeState:
    """A node as ``scontrol show node -o`` describes it."""

    name: str
    state: str
    """The base state: IDLE, ALLOCATED, MIXED, DOWN, ..."""
    flags: frozenset[str] = field(default_factory=frozenset)
    """DRAIN, COMPLETING, NOT_RESPONDING, ... (the ``+`` parts of ``State=``)."""
    reason: str | None = None
    """The reason as set, without Slurm's ``[user@time]`` stamp."""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("DRAIN", "DRAINED", "DRAINING")

    @property
    def drained_by_gpuready(self) -> bool:
        return self.drained and (self.reason or "").startswith(REASON_PREFIX)

    @property
    def busy(self) -> bool:
        """A job runs on the node (or is completing): its GPUs are in use on purpose."""
        return self.state in BUSY_STATES or bool(self.flags & BUSY_STATES)


def parse_node(name: str, text: str) -> NodeState:
    """The :class:`NodeState` of one ``scontrol show node -o NAME`` line.

    ``Reason=`` is the line's last field (22.05); its value runs to the end, less the stamp.
    """
    line = text.strip().splitlines()[0] if text.strip() else ""
    state = _STATE.search(line)
    if not line.startswith("NodeName=") or state is None:
        raise SlurmError(f"scontrol show node {name}: expected 'NodeName=... State=...', got {line[:120]!r}")
    base, *flags = state.group(1).upper().split("+")
    reason = _REASON.search(line)
    text_reason = _STAMP.sub("", reason.group(1)).strip() if reason else None
    if text_reason in ("", "(null)"):
        text_reason = None
    return NodeState(name, base.rstrip("*~#!%$@^-"), frozenset(flags), text_reason)


def one_line_reason(text: str, limit: int = MAX_REASON_BYTES) -> str:
    """``gpuready: <text>`` on one line, at most ``limit`` bytes of UTF-8, cut with ``...``."""
    words = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    reason = words if words.startswith(REASON_PREFIX) else f"{REASON_PREFIX} {words}"
    data = reason.encode()
    if len(data) <= limit:
        return reason
    return data[: limit - 3].decode(errors="ignore").rstrip() + "..."


@dataclass(frozen=True)
class Scontrol:
    """``scontrol``, each call bounded. It reads ``SLURM_CONF`` from the environment, as Slurm's own
    commands do; the command line sets it from ``--slurm-conf`` before the first call."""

    binary: str = "scontrol"
    timeout_s: float = 10.0

    def _run(self, *args: str) -> str:
        argv = [self.binary, *args]
        shown = " ".join(argv[:3])
        try:
            done = run_bounded(argv, b"", self.timeout_s)
        except OSError as exc:
            raise SlurmError(f"{self.binary}: cannot run it: {exc.strerror or exc}") from None
        if done.cut is not None:
            raise SlurmError(f"{shown}: no answer within {self.timeout_s:g} s")
        if done.returncode != 0:
            err = " ".join(done.stderr.decode(errors="replace").split())[:300] or f"exit {done.returncode}"
            if "configuration source" in err:
                err += ("; set SLURM_CONF or pass --slurm-conf FILE (Slurm runs a health check with an "
                        "empty environment)")
            raise SlurmError(f"{shown}: {err}")
        return done.stdout.decode(errors="replace")

    def show(self, node: str) -> NodeState:
        return parse_node(node, self._run("show", "node", "-o", node))

    def drain(self, node: str, reason: str) -> None:
        self._run("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self._run("update", f"NodeName={node}", "State=RESUME")
