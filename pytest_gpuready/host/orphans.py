"""Orphaned vLLM engines: found from the probe's process lineage, and stopped only on request.

SIGKILL of vLLM's API server leaves its ``VLLM::EngineCore`` (and, with TP > 1, its
``VLLM::Worker*`` processes) alive, re-parented to pid 1, holding the GPU: 71,824 MiB of an
H200 in the capture ``tests/data/nvidia-smi/h200x1-orphan-enginecore.txt``. An engine is
*orphaned* only when the process that started it is gone: walking up from it through other
engine processes, the first process that is not an engine is pid 1 or a subreaper (``systemd
--user``, a container's init) that did not start it (:func:`judge`). A live parent of any kind is
a running job, never an orphan: a vLLM API server, and just as much a ``python batch_infer.py``
using vLLM's offline ``LLM(...)``, whose engine is its own child.

The lineage (pid, parent, session, start time, name, command line of the GPU process, its
ancestors and pid 1) is read in the probe's own round trip (:func:`lineage_script`), so the
judgement is about the processes nvidia-smi named, locally and over ssh. :func:`reap_orphans` (the
``--gpu-reap-orphans`` option) stops orphans that hold GPU memory: SIGTERM, then SIGKILL, and
before each signal the host re-checks, by the same rule, that the pid is the same process (start
time), still a vLLM engine, and still orphaned, in the same ``sh`` run as the signal. Nothing else
is signalled.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_gpuready.host.hosts import Host
from pytest_gpuready.host.snapshot import GpuProcess, HostSnapshot, ProcessInfo

LINEAGE_DEPTH = 4
"""The process and three ancestors: API server -> EngineCore -> Worker is the deepest vLLM tree, and
an orphaned Worker's chain (Worker -> EngineCore -> pid 1 or a subreaper) fits with its reaper."""

_ENGINE = re.compile(r"^VLLM::(EngineCor|Worker)")
"""vLLM names its engine processes with setproctitle; the kernel's comm keeps 15 bytes
(``VLLM::EngineCor``), the command line and nvidia-smi's process_name the whole name."""


def is_vllm_engine_name(name: str) -> bool:
    return bool(_ENGINE.match(name.strip()))


def _is_engine(info: ProcessInfo) -> bool:
    return is_vllm_engine_name(info.comm) or is_vllm_engine_name(info.cmdline)


def _is_api_server(info: ProcessInfo) -> bool:
    """A process running vLLM's server: ``vllm serve`` (kernel name ``vllm``) or an ``vllm.entrypoints`` module.

    Only for naming an engine's owner; whether an engine is orphaned never depends on it.
    """
    if _is_engine(info):
        return False
    words = info.cmdline.split()
    serve = any(os.path.basename(word) == "vllm" and rest == "serve" for word, rest in itertools.pairwise(words))
    return info.comm.strip() == "vllm" or serve or any(word.startswith("vllm.entrypoints") for word in words)


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
        "r=${s##*) }; set -- $r; q=$2; case $q in ''|*[!0-9]*|0) break;; esac; n=$((n+1)); "
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
            if info is None or info.ppid <= 0:
                break  # pid 1 is read too: whether it is an init or the engine's owner is part of the proof
            current = info.ppid
    return "\n".join(lines)


# ---------------------------------------------------------------- judging

REAPER_NAMES = frozenset({
    "systemd", "init", "tini", "docker-init", "dumb-init", "catatonit", "s6-svscan", "runit",
    "containerd-shim", "conmon",
})
"""Kernel names (``/proc/PID/comm``, 15 bytes) of inits and subreapers: programs that adopt other
processes' orphans and never start a vLLM engine themselves (vLLM's engines are started by a Python
process through multiprocessing). ``systemd`` is pid 1 and ``systemd --user``; ``tini`` /
``docker-init`` / ``dumb-init`` / ``catatonit`` a container's init; ``containerd-shim`` and
``conmon`` the subreapers above a container."""


def _reaper_by_name(info: ProcessInfo) -> bool:
    return info.comm.strip() in REAPER_NAMES


@dataclass(frozen=True)
class Judgement:
    """What the lineage proves about one GPU process: orphaned (and why), or held by a live owner."""

    reason: str | None = None
    """Why it is an orphaned vLLM engine (``parent pid 1``); None when it is not, or not provably."""
    owner: ProcessInfo | None = None
    """The live process that started the engine (the first ancestor that is not an engine), when
    the engine is not orphaned: a vLLM API server, or a script using ``LLM(...)``."""


def judge(process: GpuProcess) -> Judgement:
    """Whether ``process`` is an orphaned vLLM engine, or whose it is.

    Going up from the engine through other engine processes (EngineCore above its Workers), the
    first process that is not an engine is its owner. The engine is orphaned only when that
    process is a reaper that did not start it: pid 1 or a subreaper named in :data:`REAPER_NAMES`
    (they never start engines), or pid 1 of another name (a container's entry point, this host's
    init) outside the engine's session (an engine stays in the session of the process that
    started it: a ``python batch_infer.py`` that is pid 1 of its container shares its session
    with its engine, so it is an owner, not a reaper). A live parent of any other kind is a running
    job. What cannot be read or proved (no lineage, an ancestor not read, a parent in another PID
    namespace, a parent younger than its child) is neither orphaned nor owned.
    """
    me = process.info
    if process.alive is False or me is None:
        return Judgement()
    if not (_is_engine(me) or is_vllm_engine_name(process.name)):
        return Judgement()
    by_pid = {info.pid: info for info in process.lineage}
    current = me
    through: list[str] = []
    for _ in range(len(process.lineage) + 1):
        if current.ppid <= 0:
            return Judgement()  # pid 1 itself, or a parent outside this PID namespace: cannot tell
        parent = by_pid.get(current.ppid)
        if parent is None or parent.start_ticks > current.start_ticks:
            return Judgement()  # not read (deeper than the lineage), or not provably the parent
        if _is_engine(parent):
            through.append(f"pid {parent.pid} ({parent.comm})")
            current = parent
            continue
        known = _reaper_by_name(parent)
        if parent.pid != 1 and not known:
            return Judgement(owner=parent)
        if not known and parent.session_id == current.session_id:
            return Judgement(owner=parent)  # pid 1 in the engine's own session: it may have started it
        what = "pid 1" if parent.pid == 1 else f"the subreaper pid {parent.pid} ({parent.label})"
        if not through:
            return Judgement(reason=f"parent {what}")
        return Judgement(reason=f"parent {' -> '.join(through)}, whose parent is {what}")
    return Judgement()


def orphan_reason(process: GpuProcess) -> str | None:
    """Why ``process`` is an orphaned vLLM engine (``parent pid 1``), or None (see :func:`judge`)."""
    return judge(process).reason


def owner_of(process: GpuProcess) -> ProcessInfo | None:
    """The live process that started the engine ``process`` (see :func:`judge`), or None."""
    return judge(process).owner


def served_by(process: GpuProcess) -> ProcessInfo | None:
    """The live vLLM API server above an engine process, when the lineage shows one."""
    owner = owner_of(process)
    return owner if owner is not None and _is_api_server(owner) else None


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


@dataclass(frozen=True)
class RunningEngine:
    """A GPU-holding vLLM engine whose owner is alive (a server, or a job using ``LLM(...)``): never signalled."""

    process: GpuProcess
    owner: ProcessInfo

    def describe(self) -> str:
        """``pid 4 (VLLM::EngineCore) of pid 3 (python batch_infer.py) 71824 MiB on GPU 0``."""
        memory = f" {self.process.used_memory_mib} MiB" if self.process.used_memory_mib is not None else ""
        gpu = f" on GPU {self.process.gpu_index}" if self.process.gpu_index is not None else ""
        return f"pid {self.process.pid} ({self.process.name}) of pid {self.owner.pid} ({self.owner.label}){memory}{gpu}"


def find_running_engines(snapshot: HostSnapshot) -> list[RunningEngine]:
    """The vLLM engines holding GPU memory in ``snapshot`` whose owner is alive, one per pid."""
    found: dict[int, RunningEngine] = {}
    for process in snapshot.processes:
        if not process.used_memory_mib or process.pid in found:
            continue
        owner = owner_of(process)
        if owner is not None:
            found[process.pid] = RunningEngine(process, owner)
    return list(found.values())


def spared_line(host: str, engines: Sequence[RunningEngine]) -> str | None:
    """What ``--gpu-reap-orphans`` says of the engines it leaves alone because a live job holds them."""
    if not engines:
        return None
    return (f"not stopped on {host}, vLLM engines of a running job (their owner is alive): "
            + ", ".join(e.describe() for e in engines))


# ---------------------------------------------------------------- reaping

_REAP_FUNCTIONS = r"""
engine_name() { case $1 in VLLM::EngineCor*|VLLM::Worker*) return 0;; esac; return 1; }
orphaned() {
  q=$1; n=0
  while [ $n -lt 8 ]; do
    s=$(tr '\n\t' '  ' < /proc/$q/stat 2>/dev/null) || return 1
    r=${s##*) }; set -- $r; pp=$2; qsid=$4; qst=${20}
    case $pp in ''|*[!0-9]*|0) return 1;; esac
    ps=$(tr '\n\t' '  ' < /proc/$pp/stat 2>/dev/null) || return 1
    r=${ps##*) }; set -- $r; psid=$4; pst=${20}
    [ "$pst" -le "$qst" ] || return 1
    pm=$(cat /proc/$pp/comm 2>/dev/null) || return 1
    pc=$(tr '\000\n\t' '   ' < /proc/$pp/cmdline 2>/dev/null)
    if engine_name "$pm" || engine_name "$pc"; then q=$pp; n=$((n+1)); continue; fi
    reaper_name "$pm" && return 0
    [ "$pp" = 1 ] && [ "$psid" != "$qsid" ] && return 0
    return 1
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


def _reaper_name_function() -> str:
    """The shell twin of :func:`_reaper_by_name`, from the same :data:`REAPER_NAMES`."""
    names = "|".join(sorted(REAPER_NAMES))
    return f"reaper_name() {{ case $1 in {names}) return 0;; esac; return 1; }}\n"


def reap_script(targets: Sequence[tuple[int, int]], grace_s: float, kill_wait_s: float) -> str:
    """SIGTERM, a grace, SIGKILL for each ``(pid, start_ticks)``, each signal preceded by the re-check.

    Prints ``TERM PID`` / ``KILL PID`` (signalled), ``skip PID`` (alive, but no longer provably an
    orphaned engine: not signalled), ``gone PID``, and at the end ``left PID`` for survivors.
    """
    pairs = " ".join(f"{int(pid)}:{int(start)}" for pid, start in targets)
    grace_steps = max(1, round(grace_s * 10))
    kill_steps = max(1, round(kill_wait_s * 10))
    return (
        _reaper_name_function()
        + _REAP_FUNCTIONS
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
    "REAPER_NAMES",
    "Judgement",
    "Orphan",
    "ReapReport",
    "RunningEngine",
    "find_orphans",
    "find_running_engines",
    "is_vllm_engine_name",
    "judge",
    "kill_hint",
    "lineage_script",
    "orphan_reason",
    "owner_of",
    "parse_lineage",
    "parse_reap_output",
    "parse_stat",
    "read_lineage_locally",
    "reap_orphans",
    "reap_script",
    "served_by",
    "spared_line",
]
