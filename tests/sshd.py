"""A real OpenSSH server on 127.0.0.1 for the ssh test tier and the ssh benchmark.

The ssh tier must exercise the system ``ssh`` client against a real ``sshd`` (house rule: real
parts, not mocks), so this module starts Debian's ``openssh-server`` as the current user on a
free loopback port with everything private to one temp dir: a generated host key and client key,
``authorized_keys``, a config (no PAM, ``StrictModes no``, no pid file) and a log file. The log
is how tests and the benchmark count the ssh connections a run opened: sshd writes one
``Accepted publickey`` line per authenticated connection, however many sessions are multiplexed
over it.

The remote environment is hermetic: ``HOME`` is an empty directory of its own, so the login
shell reads no profile of the machine's user and ``PATH`` stays as configured, with the labelled
stand-in ``nvidia-smi`` (``tests/standin/bin/``) first. ``GPUREADY_STANDIN_SCENARIO_FILE`` names
a file whose first line is the stand-in's scenario directory, so a test switches scenario by
rewriting that file (:meth:`LoopbackSshd.use_scenario`) instead of restarting sshd.

A fleet: ``loopback_sshd(ports=N)`` listens on N loopback ports, and a ``Match LocalPort`` block
gives each port its own scenario file, so each port is a "host" with its own stand-in GPUs
(``LoopbackSshd.spec_for(port)``, ``use_scenario(scenario, port=port)``).

Readiness is the TCP port answering, polled; there are no fixed sleeps.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
STANDIN_BIN = TESTS_DIR / "standin" / "bin"
STANDIN_SCENARIOS = TESTS_DIR / "standin" / "scenarios"
SCENARIO_FILE_ENV = "GPUREADY_STANDIN_SCENARIO_FILE"
_SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
_PRIVSEP_DIR = Path("/run/sshd")
_READY_TIMEOUT_S = 15.0


class SshdUnavailable(RuntimeError):
    """No ``sshd`` binary on this machine: the ssh tier skips with this reason (CI installs it)."""


def find_sshd() -> str:
    """Return the path of the OpenSSH server binary, or raise :class:`SshdUnavailable`."""
    found = shutil.which("sshd")
    if found:
        return found
    for candidate in _SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise SshdUnavailable(
        "sshd not found (looked on PATH and in /usr/sbin): "
        "install it with `apt-get install -y openssh-server` to run the ssh tier"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _free_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct free loopback ports (held open together while picking, so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return tuple(int(sock.getsockname()[1]) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log_path: Path,
                  timeout_s: float = _READY_TIMEOUT_S) -> None:
    """Poll until ``port`` accepts TCP connections; fail early, with sshd's log, if sshd exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with status {proc.returncode} before listening on "
                               f"127.0.0.1:{port}; its log:\n{_read(log_path)}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port} within {timeout_s:g} s; "
                               f"its log:\n{_read(log_path)}")
        time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def keygen(path: Path, comment: str) -> Path:
    """Generate an unencrypted ed25519 key pair at ``path`` (and ``path.pub``)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    return path


@dataclass(frozen=True)
class LoopbackSshd:
    """A running loopback sshd and everything a client needs to reach it."""

    port: int
    user: str
    identity_file: str
    known_hosts: str
    log_path: str
    ssh_options: tuple[str, ...]
    scenario_file: str
    host_public_key: str
    ports: tuple[int, ...] = ()
    """Every port sshd listens on (the first is ``port``); each has its own scenario file."""

    @property
    def spec(self) -> str:
        """The ``--gpu-host`` value for this server."""
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def spec_for(self, port: int) -> str:
        """The ``--gpu-host`` value for one of the ports (one "host" of a fleet)."""
        return f"ssh://{self.user}@127.0.0.1:{port}"

    def scenario_file_for(self, port: int | None) -> str:
        """The scenario file the stand-in reads for connections to ``port`` (None: the first port)."""
        if port is None or port == self.port:
            return self.scenario_file
        if port not in self.ports:
            raise ValueError(f"sshd does not listen on port {port} (ports: {self.ports})")
        return f"{self.scenario_file}-{port}"

    def accepted_connections(self) -> int:
        """How many ssh connections sshd has authenticated since it started (one log line each)."""
        return _read(Path(self.log_path)).count("Accepted publickey")

    def accepted_by_port(self) -> dict[int, int]:
        """Authenticated connections per server port: which "host" of a fleet each one went to.

        Needs ``LogLevel VERBOSE`` (``extra_config``), whose ``Connection from C port P on S port Q``
        lines say which port a client connection came in on; without it this is empty.
        """
        port_of_client: dict[int, int] = {}
        counts: dict[int, int] = {}
        for line in _read(Path(self.log_path)).splitlines():
            words = line.split()
            if line.startswith("Connection from ") and len(words) >= 9 and words[5] == "on":
                port_of_client[int(words[4])] = int(words[8])
            elif line.startswith("Accepted publickey for ") and "port" in words:
                client = int(words[words.index("port") + 1])
                if client in port_of_client:
                    server = port_of_client[client]
                    counts[server] = counts.get(server, 0) + 1
        return counts

    def pytest_args(self) -> list[str]:
        """Command-line options that point the plugin at this server."""
        args = ["--gpu-host", self.spec, "--ssh-identity", self.identity_file]
        for option in self.ssh_options:
            args += ["--ssh-option", option]
        return args

    def ssh_argv(self, port: int | None = None, extra_options: tuple[str, ...] = ()) -> list[str]:
        """A plain ``ssh`` argv up to the target: a fresh connection each time, no multiplexing.

        ``port`` dials another port (a relay in front of this server) instead of sshd's own.
        """
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-p", str(port or self.port), "-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        for option in (*self.ssh_options, *extra_options):
            argv += ["-o", option]
        return [*argv, f"{self.user}@127.0.0.1"]

    def scenario(self, port: int | None = None) -> str:
        """The stand-in scenario directory the remote ``nvidia-smi`` replays now ('' if none)."""
        lines = _read(Path(self.scenario_file_for(port))).splitlines()
        return lines[0].strip() if lines else ""

    @contextlib.contextmanager
    def use_scenario(self, scenario_dir: str | os.PathLike[str], port: int | None = None) -> Iterator[None]:
        """Point the remote stand-in ``nvidia-smi`` at ``scenario_dir`` for the ``with`` block.

        A bare name is taken from ``tests/standin/scenarios/``. Without a scenario file the
        stand-in exits 2 saying it has no scenario, so nothing is replayed by accident.
        ``port`` picks which port's "host" gets it (default the first port).
        """
        path = Path(scenario_dir)
        if not path.is_absolute() and not path.exists():
            path = STANDIN_SCENARIOS / path
        if not path.is_dir():
            raise FileNotFoundError(f"stand-in scenario {os.fspath(scenario_dir)!r}: no such directory")
        pointer = Path(self.scenario_file_for(port))
        previous = self.scenario(port)
        pointer.write_text(f"{path}\n")
        try:
            yield
        finally:
            if previous:
                pointer.write_text(f"{previous}\n")
            else:
                pointer.unlink(missing_ok=True)


def _sshd_config(ports: tuple[int, ...], host_key: Path, authorized_keys: Path, remote_path: str,
                 remote_home: Path, scenario_file: Path, extra_config: tuple[str, ...]) -> str:
    per_port = []
    for other in ports[1:]:  # a Match block replaces SetEnv's whole list, so it repeats every variable
        per_port += [f"Match LocalPort {other}",
                     f"    SetEnv PATH={remote_path} HOME={remote_home} {SCENARIO_FILE_ENV}={scenario_file}-{other}"]
    return "\n".join([
        *extra_config,  # first: sshd keeps the first value it reads for a keyword
        *(f"Port {port}" for port in ports),
        "ListenAddress 127.0.0.1",
        f"HostKey {host_key}",
        "PidFile none",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        f"AuthorizedKeysFile {authorized_keys}",
        "LogLevel INFO",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        f"SetEnv PATH={remote_path} HOME={remote_home} {SCENARIO_FILE_ENV}={scenario_file}",
        *per_port,
        "",
    ])


def _ensure_privsep_dir() -> None:
    """sshd refuses to start without its privilege separation directory (/run/sshd)."""
    if _PRIVSEP_DIR.is_dir():
        return
    try:
        _PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
    except OSError as exc:
        raise RuntimeError(f"sshd needs {_PRIVSEP_DIR} to exist and it cannot be created: {exc}") from exc


@contextlib.contextmanager
def loopback_sshd(extra_path: tuple[str, ...] = (str(STANDIN_BIN),),
                  extra_config: tuple[str, ...] = (), ports: int = 1) -> Iterator[LoopbackSshd]:
    """Start sshd on free loopback ports for the ``with`` block; stop it and remove its files after.

    ``extra_path`` goes in front of the remote ``PATH`` (by default the stand-in ``nvidia-smi``);
    ``extra_config`` lines (e.g. ``MaxSessions 1``) override this module's sshd settings;
    ``ports`` is how many ports it listens on (each a "host" with its own scenario).
    Raises :class:`SshdUnavailable` when there is no sshd binary.
    """
    sshd = find_sshd()
    _ensure_privsep_dir()
    user = pwd.getpwuid(os.getuid()).pw_name
    workdir = Path(tempfile.mkdtemp(prefix="gpuready-sshd-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        host_key = keygen(workdir / "ssh_host_ed25519_key", "gpuready-loopback-host")
        client_key = keygen(workdir / "id_ed25519", "gpuready-loopback-client")
        authorized_keys = workdir / "authorized_keys"
        shutil.copyfile(f"{client_key}.pub", authorized_keys)
        scenario_file = workdir / "standin-scenario"  # written by LoopbackSshd.use_scenario
        remote_path = ":".join([*extra_path, "/usr/local/bin", "/usr/bin", "/bin"])
        remote_home = workdir / "home"  # an empty HOME: no shell profile rewrites PATH remotely
        remote_home.mkdir()
        log_path = workdir / "sshd.log"
        config = workdir / "sshd_config"
        host_public_key = " ".join(Path(f"{host_key}.pub").read_text().split()[:2])
        for attempt in range(3):  # another process may take the free port before sshd binds it
            chosen = _free_ports(ports)
            port = chosen[0]
            config.write_text(_sshd_config(chosen, host_key, authorized_keys, remote_path,
                                           remote_home, scenario_file, extra_config))
            check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
            if check.returncode != 0:
                raise RuntimeError(f"sshd rejected its config {config}: {check.stderr.strip()}")
            log_path.write_text("")
            proc = subprocess.Popen([sshd, "-D", "-e", "-E", str(log_path), "-f", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                for each in chosen:
                    wait_for_port(each, proc, log_path)
                break
            except RuntimeError:
                if proc.poll() is None or "Address already in use" not in _read(log_path) or attempt == 2:
                    raise
        known_hosts = workdir / "known_hosts"
        known_hosts.write_text("".join(f"[127.0.0.1]:{each} {host_public_key}\n" for each in chosen))
        yield LoopbackSshd(
            port=port,
            user=user,
            identity_file=str(client_key),
            known_hosts=str(known_hosts),
            log_path=str(log_path),
            ssh_options=(f"UserKnownHostsFile={known_hosts}", "StrictHostKeyChecking=yes"),
            scenario_file=str(scenario_file),
            host_public_key=host_public_key,
            ports=chosen,
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
