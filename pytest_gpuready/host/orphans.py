"""Orphaned vLLM engines: found from the probe's process lineage, and stopped only on request.

SIGKILL of vLLM's API server leaves its ``VLLM::EngineCore`` (and, with TP > 1, its
``VLLM::Worker*`` processes) alive, re-parented to pid 1, holding the GPU: 71,824 MiB of an
H200 in the capture ``tests/data/nvidia-smi/h200x1-orphan-enginecore.txt``. An engine is
*orphaned* when, walking up from it through other engine processes, the first process that is
not an engine is not a vLLM API server, or there is none (parent pid 1, or a subreaper such as
``systemd --user``). An engine whose API server is alive is a running server, not an orphan.

The lineage (pid, parent, session, start time, name, command line of the GPU process and its
ancestors) is read in the probe's own round trip (:func:`lineage_script`), so the judgement is
about the processes nvidia-smi named, locally and over ssh. :func:`reap_orphans` (the
``--gpu-reap-orphans`` option) stops orphans that hold GPU memory: SIGTERM, then SIGKILL, and
before each signal the host re-checks that the pid is the same process (start time), still a
vLLM engine, and still orphaned, in the same ``sh`` run as the signal. Nothing else is signalled.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.snapshot import GpuProcess, HostSnapshot, ProcessInfo

LINEAGE_DEPTH = 4
"""The process and three ancestors: API server -> EngineCore -> Worker is the deepest vLLM tree."""

_ENGINE = re.compile(r"^VLLM::(EngineCor|Worker)")
"""vLLM names its engine processes with setproctitle; the kernel's comm keeps 15 bytes
(``VLLM::EngineCor``), the command line and nvidia-smi's process_name the whole name."""


def is_vllm_engine_name(name: str) -> bool:
    return bool(_ENGINE.match(name.strip()))


def _is_engine(info: ProcessInfo) -> bool:
    return is_vllm_engine_name(info.comm) or is_vllm_engine_name(info.cmdline)


def _is_api_server(info: ProcessInfo) -> bool:
    """A process that is not an engine and whose command line names vLLM (``vllm serve``, the api_server module)."""
    return not _is_engine(info) and "vllm" in f"{info.comm} {info.cmdline}".lower()


# ---------------------------------------------------------------- reading the lineage

def lineage_script(pid_source: str) -> str:
    """The probe section: for each pid that ``pid_source`` prints (one per line, first field before a
    comma), its ``/proc/PID/stat`` line and command line and those of up to three ancestors.

    Lines are ``GPU_PID<TAB>PID<TAB>STAT<TAB>CMDLINE`` (tabs and newlines inside replaced by spaces).
    """
    return (
        f"{pid_source} | cut -d, -f1 | while read -r p; do case $p in ''|*[!0-9]*) continue;; esac; "
        f"q=$p; n=0; while [ $n -lt {LINEAGE_DEPTH} ]; do "
        "s=$(tr '\\n\\t' '  ' < /proc/$q/stat 2>/dev/null) || break; [ -n \"$s\" ] || break; "
        "c=$(tr '\\000\\n\\t' '   ' < /proc/$q/cmdline 2>/dev/null); "
        "printf '%s\\t%s\\t%s\\t%s\\n' \"$p\" \"$q\" \"$s\" \"$c\"; "
        "r=${s##*) }; set -- $r; q=$2; case $q in ''|*[!0-9]*|0|1) break;; esac; n=$((n+1)); "
        "done; done; true"
    )


def parse_stat(line: str, cmdline: str = "") -> ProcessInfo | None:
    """A :class:`ProcessInfo` from one ``/proc/PID/stat`` line (the name may hold spaces and parens)."""
    head, sep, tail = line.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    if not sep or not pid_text.strip().isdigit() or len(fields) < 20:
        return None
    try:
        return ProcessInfo(int(pid_text), int(fields[1]), int(fields[3]), int(fields[19]), comm, cmdline.strip())
    except ValueError:
        return None


def parse_lineage(text: str) -> dict[int, tuple[ProcessInfo, ...]]:
    """``GPU pid -> (the process, its parent, ...)`` from :func:`lineage_script`'s output."""
    found: dict[int, list[ProcessInfo]] = {}
    for line in text.splitlines():
        parts = line.split("\t", 3)
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        info = parse_stat(parts[2], parts[3] if len(parts) > 3 else "")
        if info is not None:
            found.setdefault(int(parts[0]), []).append(info)
    return {pid: tuple(chain) for pid, chain in found.items()}


def read_lineage_locally(pids: Iterable[int], proc: str = "/proc") -> str:
    """The same text :func:`lineage_script` prints, read here in Python (after an NVML reading)."""
    lines = []
    for pid in pids:
        current = int(pid)
        for _ in range(LINEAGE_DEPTH):
            try:
                with open(f"{proc}/{current}/stat", "rb") as handle:
                    stat = handle.read().decode(errors="replace")
            except OSError:
                break
            try:
                with open(f"{proc}/{current}/cmdline", "rb") as handle:
                    cmdline = handle.read().decode(errors="replace")
            except OSError:
                cmdline = ""
            clean = stat.replace("\n", " ").replace("\t", " ")
            lines.append(f"{pid}\t{current}\t{clean}\t{cmdline.replace(chr(0), ' ').replace(chr(10), ' ')}")
            info = parse_stat(clean)
            if info is None or info.ppid <= 1:
                break
            current = info.ppid
    return "\n".join(lines)


# ---------------------------------------------------------------- judging

def orphan_reason(process: GpuProcess) -> str | None:
    """Why ``process`` is an orphaned vLLM engine (``parent pid 1``), or None when it is not one or
    when that cannot be proved (no lineage read, an ancestor not read)."""
    me = process.info
    if process.alive is False or me is None:
        return None
    if not (_is_engine(me) or is_vllm_engine_name(process.name)):
        return None
    by_pid = {info.pid: info for info in process.lineage}
    current = me
    through: list[str] = []
    for _ in range(len(process.lineage) + 1):
        if current.ppid in (0, 1):
            if not through:
                return "parent pid 1"
            return f"parent {' -> '.join(through)}, whose parent is pid 1"
        parent = by_pid.get(current.ppid)
        if parent is None or parent.start_ticks > current.start_ticks:
            return None  # not read (deeper than the lineage), or not provably the parent
        if _is_engine(parent):
            through.append(f"pid {parent.pid} ({parent.comm})")
            current = parent
            continue
        if _is_api_server(parent):
            return None
        where = f"parent {' -> '.join(through)}, whose parent" if through else "parent"
        return f"{where} pid {parent.pid} ({parent.label}) is not a vLLM API server"
    return None


def served_by(process: GpuProcess) -> ProcessInfo | None:
    """The live vLLM API server above an engine process, when the lineage shows one."""
    me = process.info
    if me is None or not (_is_engine(me) or is_vllm_engine_name(process.name)):
        return None
    by_pid = {info.pid: info for info in process.lineage}
    current = me
    while True:
        parent = by_pid.get(current.ppid)
        if parent is None:
            return None
        if _is_engine(parent):
            current = parent
            continue
        return parent if _is_api_server(parent) else None


@dataclass(frozen=True)
class Orphan:
    """A GPU-holding vLLM engine whose API server is gone."""

    process: GpuProcess
    reason: str

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def start_ticks(self) -> int:
        return self.process.start_ticks or 0

    def describe(self) -> str:
        """``pid 3504 (VLLM::EngineCore) 71824 MiB on GPU 0``."""
        memory = f" {self.process.used_memory_mib} MiB" if self.process.used_memory_mib is not None else ""
        gpu = f" on GPU {self.process.gpu_index}" if self.process.gpu_index is not None else ""
        return f"pid {self.pid} ({self.process.name}){memory}{gpu}"


def find_orphans(snapshot: HostSnapshot) -> list[Orphan]:
    """The orphaned vLLM engines that hold GPU memory (> 0 MiB reported) in ``snapshot``, one per pid."""
    orphans: dict[int, Orphan] = {}
    for process in snapshot.processes:
        if not process.used_memory_mib or process.start_ticks is None:
            continue
        reason = orphan_reason(process)
        if reason is not None and process.pid not in orphans:
            orphans[process.pid] = Orphan(process, reason)
    return list(orphans.values())


# ---------------------------------------------------------------- reaping

_REAP_FUNCTIONS = r"""
engine_name() { case $1 in VLLM::EngineCor*|VLLM::Worker*) return 0;; esac; return 1; }
orphaned() {
  q=$1; n=0
  while [ $n -lt 8 ]; do
    s=$(tr '\n\t' '  ' < /proc/$q/stat 2>/dev/null) || return 1
    r=${s##*) }; set -- $r; pp=$2
    case $pp in 0|1) return 0;; esac
    pm=$(cat /proc/$pp/comm 2>/dev/null) || return 1
    pc=$(tr '\000\n\t' '   ' < /proc/$pp/cmdline 2>/dev/null)
    if engine_name "$pm" || engine_name "$pc"; then q=$pp; n=$((n+1)); continue; fi
    case "$pm $pc" in *[vV][lL][lL][mM]*) return 1;; esac
    return 0
  done
  return 1
}
alive() {
  s=$(tr '\n\t' '  ' < /proc/$1/stat 2>/dev/null) || return 1
  r=${s##*) }; set -- "$2" $r
  [ "$2" != Z ] && [ "$2" != X ] && [ "${21}" = "$1" ]
}
ours() {
  alive "$1" "$2" || return 1
  m=$(cat /proc/$1/comm 2>/dev/null); c=$(tr '\000\n\t' '   ' < /proc/$1/cmdline 2>/dev/null)
  engine_name "$m" || engine_name "$c" || return 1
  orphaned "$1"
}
send() {
  if ours "$2" "$3"; then
    if kill -s "$1" "$2" 2>/dev/null; then echo "$1 $2"; sent="$sent $2:$3"; else echo "gone $2"; fi
  elif alive "$2" "$3"; then echo "skip $2"
  else echo "gone $2"; fi
}
wait_gone() {
  i=0
  while [ $i -lt $2 ]; do
    left=0
    for t in $1; do p=${t%:*}; st=${t#*:}; if alive "$p" "$st"; then left=1; fi; done
    [ $left = 0 ] && return 0
    sleep 0.1; i=$((i+1))
  done
  return 1
}
"""


def reap_script(targets: Sequence[tuple[int, int]], grace_s: float, kill_wait_s: float) -> str:
    """SIGTERM, a grace, SIGKILL for each ``(pid, start_ticks)``, each signal preceded by the re-check.

    Prints ``TERM PID`` / ``KILL PID`` (signalled), ``skip PID`` (alive, but no longer provably an
    orphaned engine: not signalled), ``gone PID``, and at the end ``left PID`` for survivors.
    """
    pairs = " ".join(f"{int(pid)}:{int(start)}" for pid, start in targets)
    grace_steps = max(1, round(grace_s * 10))
    kill_steps = max(1, round(kill_wait_s * 10))
    return (
        _REAP_FUNCTIONS
        + f"targets={shlex.quote(pairs)}\n"
        + 'sent=""; for t in $targets; do send TERM "${t%:*}" "${t#*:}"; done\n'
        + 'termed=$sent\n'
        + f'if ! wait_gone "$termed" {grace_steps}; then\n'
        + '  for t in $termed; do p=${t%:*}; st=${t#*:}; alive "$p" "$st" && send KILL "$p" "$st"; done\n'
        + f'  wait_gone "$termed" {kill_steps}\n'
        + "fi\n"
        + 'for t in $termed; do p=${t%:*}; st=${t#*:}; alive "$p" "$st" && echo "left $p"; done\n'
        + "exit 0\n"
    )


@dataclass(frozen=True)
class ReapReport:
    """What :func:`reap_orphans` did, per orphan."""

    host: str
    stopped: tuple[Orphan, ...] = ()
    needed_kill: tuple[int, ...] = ()
    skipped: tuple[Orphan, ...] = ()
    """Alive, but not provably an orphaned engine when re-checked: not signalled."""
    left: tuple[Orphan, ...] = ()
    """Still running after SIGKILL."""

    @property
    def acted(self) -> bool:
        return bool(self.stopped or self.skipped or self.left)

    def lines(self) -> list[str]:
        out = []
        if self.stopped:
            out.append(f"stopped orphaned vLLM engines on {self.host}: "
                       + ", ".join(o.describe() + (" (needed SIGKILL)" if o.pid in self.needed_kill else "")
                                   for o in self.stopped))
        if self.skipped:
            out.append(f"not stopped on {self.host} (no longer provably orphaned when re-checked): "
                       + ", ".join(o.describe() for o in self.skipped))
        if self.left:
            out.append(f"still running on {self.host} after SIGKILL: " + ", ".join(o.describe() for o in self.left))
        return out


def parse_reap_output(host: str, orphans: Sequence[Orphan], stdout: str) -> ReapReport:
    by_pid = {o.pid: o for o in orphans}
    events: dict[int, set[str]] = {}
    for line in stdout.splitlines():
        verb, _, pid = line.strip().partition(" ")
        if pid.isdigit() and int(pid) in by_pid:
            events.setdefault(int(pid), set()).add(verb)
    stopped, skipped, left, killed = [], [], [], []
    for orphan in orphans:
        seen = events.get(orphan.pid, set())
        if "left" in seen:
            left.append(orphan)
        elif "TERM" in seen or "KILL" in seen:
            stopped.append(orphan)
        elif "skip" in seen:
            skipped.append(orphan)
        if "KILL" in seen:
            killed.append(orphan.pid)
    return ReapReport(host, tuple(stopped), tuple(killed), tuple(skipped), tuple(left))


def reap_orphans(host: Host, orphans: Sequence[Orphan], *, grace_s: float = 10.0,
                 kill_wait_s: float = 10.0) -> ReapReport:
    """Stop ``orphans`` (from :func:`find_orphans`) on ``host`` in one round trip; see the module docstring."""
    if not orphans:
        return ReapReport(host.name)
    script = reap_script([(o.pid, o.start_ticks) for o in orphans], grace_s, kill_wait_s)
    result = host.run(script, timeout=grace_s + kill_wait_s + 60)
    return parse_reap_output(host.name, orphans, result.stdout)


def kill_hint(orphans: Sequence[Orphan]) -> str:
    pids = " ".join(str(o.pid) for o in orphans)
    return f"stop it with: kill {pids}" if len(orphans) == 1 else f"stop them with: kill {pids}"


__all__ = [
    "LINEAGE_DEPTH",
    "Orphan",
    "ReapReport",
    "find_orphans",
    "is_vllm_engine_name",
    "kill_hint",
    "lineage_script",
    "orphan_reason",
    "parse_lineage",
    "parse_reap_output",
    "parse_stat",
    "read_lineage_locally",
    "reap_orphans",
    "reap_script",
    "served_by",
]
