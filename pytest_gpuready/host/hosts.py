"""Where commands run: the local machine, or a GPU server over the system OpenSSH client.

This is the only module that starts processes for probing. Everything else asks a
:class:`Host` to run a POSIX ``sh`` script and reads its output, so the same parsers and checks
serve ``--gpu-host local`` and ``--gpu-host root@gpu-box-7``.

The system ``ssh`` is used (not a Python SSH library) so that ``~/.ssh/config``, ProxyJump,
agents and known_hosts behave exactly as they do for the engineer at a terminal. One
multiplexed master connection per host (ControlMaster in a private temp dir) makes every
later command a cheap round trip instead of a new TCP + key exchange.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pytest_gpuready.errors import HostError, HostSpecError

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_COMMAND_TIMEOUT_S = 120.0
HANDSHAKE_MARGIN_S = 5.0
"""How long past ConnectTimeout ssh may take to finish its handshake (key exchange and login)
before it is cut as "handshake stalled": ConnectTimeout bounds the TCP connect and the banner,
not a peer that sends its banner and then stalls the key exchange."""

_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_IPV6_RE = re.compile(r"^\[([0-9A-Fa-f:.]+)\]$")
_SSH_OPTION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*[= ]\S.*$")
_CONTROL_SOCKET_NAME = "master"
_MAX_CONTROL_PATH_BYTES = 80  # ssh adds a 17-byte temporary suffix; macOS allows 104 bytes in all
# Options the plugin sets itself: overriding them would break the one multiplexed connection per
# host, or let ssh wait at a password prompt nobody can answer.
_MANAGED_SSH_OPTIONS = frozenset({"batchmode", "controlmaster", "controlpath", "controlpersist"})


@dataclass(frozen=True)
class HostSpec:
    """A parsed ``--gpu-host`` value."""

    kind: str  # "local" or "ssh"
    hostname: str = "localhost"
    user: str | None = None
    port: int | None = None

    @property
    def target(self) -> str:
        """``user@host`` as the ssh client takes it (IPv6 without brackets)."""
        return f"{self.user}@{self.hostname}" if self.user else self.hostname

    def __str__(self) -> str:
        if self.kind == "local":
            return "local"
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        text = f"{self.user}@{host}" if self.user else host
        return f"{text}:{self.port}" if self.port else text


def parse_host_spec(spec: str) -> HostSpec:
    """Parse ``local``, ``host``, ``user@host`` or ``ssh://user@host:port``.

    Anything else, including shell metacharacters or a leading ``-`` that ssh would read as an
    option, is rejected with a one-line :class:`HostSpecError` naming the value.
    """
    text = spec.strip()
    if text == "local":
        return HostSpec("local")
    expected = "expected 'local', 'host', 'user@host' or 'ssh://user@host:port'"
    if not text:
        raise HostSpecError(f"--gpu-host is empty: {expected}")
    if re.search(r"[\s\x00-\x1f\x7f]", text):
        raise HostSpecError(f"--gpu-host {spec!r}: contains whitespace or a control character; {expected}")
    port: int | None = None
    rest = text
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme != "ssh":
            raise HostSpecError(f"--gpu-host {spec!r}: unknown scheme {scheme!r}; {expected}")
        port_match = re.match(r"^(.*?)(?::(\d+))?/?$", rest)
        assert port_match is not None  # the pattern matches any string
        rest, port_text = port_match.group(1), port_match.group(2)
        if port_text is not None:
            port = int(port_text)
            if not 0 < port < 65536:
                raise HostSpecError(f"--gpu-host {spec!r}: port {port} is out of range 1-65535")
    user: str | None = None
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not _USER_RE.fullmatch(user):
            raise HostSpecError(f"--gpu-host {spec!r}: user {user!r} has characters a login name cannot have")
    ipv6 = _IPV6_RE.fullmatch(rest)
    hostname = ipv6.group(1) if ipv6 else rest
    if not ipv6 and not _HOSTNAME_RE.fullmatch(hostname):
        raise HostSpecError(f"--gpu-host {spec!r}: {hostname!r} is not a host name or address; {expected}")
    return HostSpec("ssh", hostname=hostname, user=user, port=port)


@dataclass(frozen=True)
class CommandResult:
    """What a script printed and how it exited."""

    returncode: int
    stdout: str
    stderr: str
    duration_s: float


class CommandTimeout(HostError):
    """A command that ran past its timeout; its whole process group was killed.

    :attr:`stdout` holds what it printed before the cut (a probe reads from it which sections
    finished, to name the one that hung).
    """

    def __init__(self, message: str, stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


@dataclass(frozen=True)
class _Finished:
    returncode: int
    stdout: bytes
    stderr: bytes
    cut: str | None
    """None, or why the process group was killed: ``timeout`` or the early check's reason."""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's whole group (it leads a session of its own, so that is only what
    it started). The process is not yet reaped, so its pid, the group id, cannot have been reused."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_bounded(argv: Sequence[str], stdin: bytes, timeout: float,
                early_cut: Callable[[float], str | None] | None = None) -> _Finished:
    """Run ``argv`` as the leader of a new session and wait at most ``timeout`` seconds.

    On the deadline, on ``early_cut(elapsed)`` returning a reason, or on an exception in this
    thread (KeyboardInterrupt), the *whole process group* is killed, not only the direct child:
    grandchildren (a hung ``nvidia-smi`` under the probe's ``sh``, a ProxyCommand under ``ssh``)
    would otherwise keep running and keep the output pipes open.
    """
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    started = time.monotonic()
    cut: str | None = None
    feed: bytes | None = stdin
    try:
        while True:
            elapsed = time.monotonic() - started
            remaining = timeout - elapsed
            if remaining <= 0:
                cut = "timeout"
                break
            if early_cut is not None:
                cut = early_cut(elapsed)
                if cut is not None:
                    break
            try:
                out, err = proc.communicate(feed, timeout=min(remaining, 0.05) if early_cut else remaining)
                return _Finished(proc.returncode, out, err, None)
            except subprocess.TimeoutExpired:
                feed = None  # communicate() keeps what it has not written yet
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    _kill_group(proc)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # something outside the group holds the pipes
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        out, err = b"", b""
    return _Finished(proc.returncode, out or b"", err or b"", cut)


@runtime_checkable
class Host(Protocol):
    """A machine that runs POSIX ``sh`` scripts for the probes."""

    @property
    def name(self) -> str:
        """How the host is named in messages: ``local`` or ``user@host[:port]``."""
        ...

    @property
    def is_local(self) -> bool: ...

    @property
    def address(self) -> str:
        """The address a client uses to reach a service listening on this host (HTTP)."""
        ...

    def run(
        self, script: str, *, timeout: float = DEFAULT_COMMAND_TIMEOUT_S, stdin: bytes | None = None
    ) -> CommandResult:
        """Run ``script`` with ``sh -c``; raise :class:`HostError` if the host cannot run it at all."""
        ...

    def close(self) -> None: ...


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


class LocalHost:
    """This machine: scripts run in a local ``sh``."""

    name = "local"
    is_local = True
    address = "127.0.0.1"

    def __init__(self) -> None:
        self.commands_run = 0

    def run(
        self, script: str, *, timeout: float = DEFAULT_COMMAND_TIMEOUT_S, stdin: bytes | None = None
    ) -> CommandResult:
        self.commands_run += 1
        started = time.monotonic()
        done = run_bounded(["sh", "-c", script], stdin if stdin is not None else b"", timeout)
        if done.cut is not None:
            raise CommandTimeout(f"local: command timed out after {timeout:g} s",
                                 _decode(done.stdout), _decode(done.stderr))
        return CommandResult(done.returncode, _decode(done.stdout), _decode(done.stderr),
                             time.monotonic() - started)

    def close(self) -> None:
        """Nothing to close for the local machine."""

    def __repr__(self) -> str:
        return "LocalHost()"


_SSH_FAILURES: tuple[tuple[str, str], ...] = (
    ("connection refused", "connection refused (is sshd running, is the port right?)"),
    ("permission denied", "authentication failed (BatchMode is on: no password prompt; check the key or agent)"),
    ("could not resolve hostname", "unknown host (name does not resolve)"),
    ("name or service not known", "unknown host (name does not resolve)"),
    ("connection timed out", "connection timed out (host down, a firewall dropping packets, or no ssh answer)"),
    ("operation timed out", "connection timed out (host down, a firewall dropping packets, or no ssh answer)"),
    ("host key verification failed",
     "host key verification failed (the host is not in known_hosts or its key changed)"),
    ("no route to host", "no route to host"),
    ("network is unreachable", "network is unreachable"),
    ("kex_exchange_identification",
     "connection closed before the ssh handshake (a ProxyJump/ProxyCommand hop failed, or sshd dropped it:"
     " MaxStartups, AllowUsers, a firewall)"),
    # the same failure when ssh's own banner write loses the race with the hop's exit
    ("banner exchange",
     "connection closed before the ssh handshake (a ProxyJump/ProxyCommand hop failed, or sshd dropped it:"
     " MaxStartups, AllowUsers, a firewall)"),
    ("connection closed by", "connection closed by the remote side"),
    ("connection reset", "connection reset by the remote side"),
)


def _split_ssh_option(option: str) -> tuple[str, str]:
    match = re.match(r"^([A-Za-z][A-Za-z0-9]*)\s*[= ]\s*(.*)$", option)
    assert match is not None  # validate_ssh_option ran first
    return match.group(1), match.group(2).strip()


def validate_ssh_option(option: str) -> None:
    """Raise :class:`HostSpecError` for an ``--ssh-option`` value that is not ``Key=Value``, or that
    sets an option the plugin manages (BatchMode, ControlMaster, ControlPath, ControlPersist).

    Public so option parsing can turn a bad value into a usage error before any test runs.
    """
    if not _SSH_OPTION_RE.match(option) or "\n" in option or "\r" in option:
        raise HostSpecError(f"--ssh-option {option!r}: expected 'Key=Value', as ssh -o takes it")
    key, _ = _split_ssh_option(option)
    if key.lower() in _MANAGED_SSH_OPTIONS:
        raise HostSpecError(
            f"--ssh-option {option!r}: {key} is set by pytest-gpuready (BatchMode=yes and one "
            "multiplexed connection per host) and cannot be overridden"
        )


def explain_ssh_failure(stderr: str) -> str:
    """Turn the ssh client's stderr (exit 255) into a short cause."""
    lowered = stderr.lower()
    for needle, cause in _SSH_FAILURES:
        if needle in lowered:
            return cause
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "ssh failed with no message"


@dataclass
class SSHHost:
    """A remote machine reached with the system ``ssh`` client over one multiplexed connection.

    The first command opens a master connection (ControlMaster=auto) whose socket lives in a
    private temporary directory; later commands reuse it. :meth:`close` stops the master.
    """

    spec: HostSpec
    identity_file: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    ssh_binary: str = "ssh"
    is_local: bool = field(default=False, init=False)
    commands_run: int = field(default=0, init=False)
    _control_dir: str | None = field(default=None, init=False, repr=False)
    _address: str | None = field(default=None, init=False, repr=False)
    _cleanup: weakref.finalize[[str, str, str], SSHHost] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for option in self.ssh_options:
            validate_ssh_option(option)
            key, value = _split_ssh_option(option)
            if key.lower() == "connecttimeout":
                # ssh keeps the first value it reads and the user's -o options go first, so this
                # is the timeout ssh applies: the subprocess deadline must follow it.
                if not value.isdigit() or int(value) < 1:
                    raise HostSpecError(f"--ssh-option {option!r}: ConnectTimeout takes whole seconds >= 1")
                self.connect_timeout = float(value)
        if shutil.which(self.ssh_binary) is None:
            raise HostError(f"{self.spec}: the ssh client {self.ssh_binary!r} is not on PATH (install openssh-client)")

    @property
    def name(self) -> str:
        return str(self.spec)

    @property
    def address(self) -> str:
        """The host name ssh really connects to, as ``ssh -G`` resolves it (no connection is made).

        An ``~/.ssh/config`` alias (``Host gpu7`` / ``HostName 10.1.230.174``) or a ``-o HostName=``
        option names a host that HTTP clients cannot resolve; this returns what ssh would dial.
        Falls back to the spec's host name when ``ssh -G`` is not available (OpenSSH < 6.8).
        """
        if self._address is None:
            argv = [self.ssh_binary, "-G"]
            for option in self.ssh_options:
                argv += ["-o", option]
            if self.spec.port:
                argv += ["-p", str(self.spec.port)]
            argv.append(self.spec.target)
            resolved = self.spec.hostname
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
                for line in proc.stdout.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "hostname" and value.strip() and proc.returncode == 0:
                        resolved = value.strip()
                        break
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._address = resolved
        return self._address

    @property
    def control_dir(self) -> str | None:
        """The private directory holding the master connection's socket (None until first used)."""
        return self._control_dir

    def _control_path(self) -> str:
        """The master's socket: a short fixed name, since the directory belongs to this host alone.

        A unix socket path must fit in 104 (macOS) or 108 (Linux) bytes; ssh's ``%C`` hash alone is
        40, and a macOS ``$TMPDIR`` is about 50, so a long temp dir falls back to ``/tmp``.
        """
        if self._control_dir is None:
            control_dir = tempfile.mkdtemp(prefix="gpuready-ssh-")
            if len(control_dir) + len(_CONTROL_SOCKET_NAME) + 1 > _MAX_CONTROL_PATH_BYTES and os.path.isdir("/tmp"):
                os.rmdir(control_dir)
                control_dir = tempfile.mkdtemp(prefix="gpuready-ssh-", dir="/tmp")
            self._control_dir = control_dir
            # Also when close() is never called (a host dropped, an interrupted session): at garbage
            # collection or interpreter exit the master is stopped and the directory removed.
            self._cleanup = weakref.finalize(self, _stop_master, self.ssh_binary, control_dir, self.spec.target)
        return f"{self._control_dir}/{_CONTROL_SOCKET_NAME}"

    def ssh_argv(self) -> list[str]:
        """The ssh client's argv up to and including the target (no remote command)."""
        # The user's -o options come first: ssh keeps the first value it obtains for each
        # keyword, so they override the defaults below (except the managed ones, rejected above).
        argv = [self.ssh_binary]
        for option in self.ssh_options:
            argv += ["-o", option]
        argv += [
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self._control_path()}",
            "-o", "ControlPersist=600",
            "-o", "ServerAliveInterval=15",
        ]
        if self.spec.port:
            argv += ["-p", str(self.spec.port)]
        if self.identity_file:
            argv += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        argv.append(self.spec.target)
        return argv

    def run(
        self, script: str, *, timeout: float = DEFAULT_COMMAND_TIMEOUT_S, stdin: bytes | None = None
    ) -> CommandResult:
        self.commands_run += 1
        argv = [*self.ssh_argv(), "--", "sh -c " + shlex.quote(script)]
        started = time.monotonic()
        control = self._control_path()
        handshake_limit = self.connect_timeout + HANDSHAKE_MARGIN_S

        def handshake_stalled(elapsed: float) -> str | None:
            # The master's socket appears once ssh has connected, exchanged keys and logged in.
            if elapsed > handshake_limit and not os.path.exists(control):
                return "handshake"
            return None

        watch = None if _master_alive(control) else handshake_stalled
        done = run_bounded(argv, stdin if stdin is not None else b"", timeout + self.connect_timeout, watch)
        stderr = _decode(done.stderr)
        if done.cut == "handshake":
            raise HostError(
                f"{self.name}: ssh failed: handshake stalled (connected, but the key exchange and login did "
                f"not finish within {handshake_limit:g} s: an overloaded or wedged sshd, a middlebox holding "
                "the connection, or not an ssh server)")
        if done.cut is not None:
            raise CommandTimeout(f"{self.name}: command timed out after {timeout:g} s", _decode(done.stdout), stderr)
        if done.returncode == 255:
            raise HostError(f"{self.name}: ssh failed: {explain_ssh_failure(stderr)}")
        return CommandResult(done.returncode, _decode(done.stdout), stderr, time.monotonic() - started)

    def close(self) -> None:
        """Stop the master connection and remove its socket directory."""
        if self._cleanup is not None:
            self._cleanup()  # runs once; a later close() or garbage collection does nothing
        self._cleanup = None
        self._control_dir = None


def _master_alive(socket_path: str) -> bool:
    """True when a master listens on ``socket_path``. A stale socket (its master was killed) is
    removed, so that ssh makes a new master there rather than running without one; the directory
    is this host's own, so nothing else's socket can be removed."""
    if not os.path.exists(socket_path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1)
        probe.connect(socket_path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
        return False
    finally:
        probe.close()


def _stop_master(ssh_binary: str, control_dir: str, target: str) -> None:
    """Ask the master listening in ``control_dir`` to exit (if one does), then remove the directory."""
    socket_path = f"{control_dir}/{_CONTROL_SOCKET_NAME}"
    # On failure the directory still goes; an orphaned master exits after ControlPersist.
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if os.path.exists(socket_path):
            subprocess.run([ssh_binary, "-o", f"ControlPath={socket_path}", "-O", "exit", target],
                           capture_output=True, timeout=10, check=False)
    shutil.rmtree(control_dir, ignore_errors=True)


def connect(
    spec: str | HostSpec,
    *,
    identity_file: str | None = None,
    ssh_options: tuple[str, ...] = (),
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> Host:
    """Return a :class:`Host` for a spec. Nothing is contacted until the first :meth:`Host.run`."""
    parsed = parse_host_spec(spec) if isinstance(spec, str) else spec
    if parsed.kind == "local":
        return LocalHost()
    return SSHHost(parsed, identity_file=identity_file, ssh_options=ssh_options,
                   connect_timeout=connect_timeout)
