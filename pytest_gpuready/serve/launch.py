"""Starting a server as the leader of a new session, on this machine or on an ssh host.

A new session is what makes teardown exact: every process vLLM spawns (EngineCore, workers,
the resource tracker) inherits the session id, so :mod:`~pytest_gpuready.serve.processes`
finds them all by that id and never by name. The leader's pid and its start time (field 22
of ``/proc/PID/stat``) together name the session: a recycled pid has a later start time.

Locally the leader is a :class:`subprocess.Popen` child (so its exit code is exact). On an ssh
host it is ``setsid nohup sh -c ...`` in a private directory that also holds the log and,
once the command ends, its exit code.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from pytest_gpuready.host.hosts import Host
from pytest_gpuready.serve import processes
from pytest_gpuready.serve.log_reader import LogReader
from pytest_gpuready.serve.server_errors import ServerExitedError
from pytest_gpuready.serve.spec import shell_command


class LaunchedProcess(Protocol):
    """The leader of a launched server's session, however it was started."""

    pid: int
    start_ticks: int
    """Start time of the leader in clock ticks since boot (0 when it could not be read)."""
    log_path: str

    def exit_code(self) -> int | None:
        """The leader's exit code once it has exited (-1: killed, no code); None while it runs."""
        ...

    def reap(self) -> None:
        """Collect the leader's exit status if it is our child, so it does not linger as a zombie."""
        ...

    def log_reader(self) -> LogReader:
        """A reader of the server's log, on the host where it is written."""
        ...


class LocalProcess:
    """A server started here with :class:`subprocess.Popen` in a new session."""

    def __init__(self, popen: subprocess.Popen[bytes], start_ticks: int, log_path: str) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.start_ticks = start_ticks
        self.log_path = log_path

    def exit_code(self) -> int | None:
        code: int | None = self.popen.poll()
        return code

    def reap(self) -> None:
        self.popen.poll()

    def log_reader(self) -> LogReader:
        return LogReader(self.log_path)


class RemoteProcess:
    """A server started on an ssh host by ``setsid nohup``, with its log in a private directory there."""

    def __init__(self, host: Host, pid: int, start_ticks: int, remote_dir: str) -> None:
        self.host = host
        self.pid = pid
        self.start_ticks = start_ticks
        self.remote_dir = remote_dir
        self.log_path = f"{remote_dir}/vllm.log"

    def exit_code(self) -> int | None:
        code_file = shlex.quote(f"{self.remote_dir}/exit_code")
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

    def reap(self) -> None:
        """Nothing to do: the remote leader is not our child."""

    def log_reader(self) -> LogReader:
        return LogReader(self.log_path, self.host)


def launch_local(argv: Sequence[str], env: Mapping[str, str], host: Host, log_dir: Path | None,
                 port: int, name: str) -> LocalProcess:
    """Start ``argv`` here as a session leader, its output appended to ``LOG_DIR/vllm-PORT.log``."""
    directory = log_dir or Path(tempfile.mkdtemp(prefix="gpuready-vllm-"))
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"vllm-{port}.log"
    full_env = {**os.environ, **env}
    with log_path.open("ab") as log_file:
        try:
            popen = subprocess.Popen(
                list(argv), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, start_new_session=True,
            )
        except OSError as exc:
            raise ServerExitedError(f"{name}: cannot run {argv[0]!r}: {exc} "
                                    f"(set the launch command: --vllm-cmd / ServeSpec.command)") from exc
    ticks = processes.process_start_time(host, popen.pid)
    return LocalProcess(popen, ticks if ticks is not None else 0, str(log_path))


def describe_exit(code: int) -> str:
    """How a leader ended, for messages: ``killed by SIGKILL``, ``exited with code 1``.

    Locally a signal death reads as a negative code (Popen); on an ssh host the wrapper sh records
    128 + N when the command died of signal N, and -1 when the wrapper itself was killed.
    """
    if code == -1:
        return "killed by a signal (no exit code)"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if code > 128 and _signal_name(code - 128).startswith("SIG"):
        return f"exited with code {code} (killed by {_signal_name(code - 128)})"
    return f"exited with code {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_REMOTE_WRAPPER = 'd=$1; shift; echo $$ > "$d/pid"; "$@"; echo $? > "$d/exit_code"'


def remote_launch_script(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The sh script that starts the server detached on the host and prints ``PID START_TICKS DIR``."""
    command = shell_command(list(argv), env)
    return (
        'd=$(mktemp -d "${TMPDIR:-/tmp}/gpuready-vllm.XXXXXX") || exit 1\n'
        f"setsid nohup sh -c '{_REMOTE_WRAPPER}' gpuready-vllm \"$d\" {command} "
        '> "$d/vllm.log" 2>&1 < /dev/null &\n'
        'i=0; while [ ! -s "$d/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n'
        'pid=$(cat "$d/pid" 2>/dev/null) || exit 2\n'
        '{ read -r line < "/proc/$pid/stat"; } 2>/dev/null || { echo "$pid 0 $d"; exit 0; }\n'
        'rest=${line##*) }; set -- $rest\n'
        'echo "$pid ${20} $d"\n'
    )


def launch_remote(argv: Sequence[str], env: Mapping[str, str], host: Host) -> RemoteProcess:
    """Start ``argv`` on ``host`` as a detached session leader, in one round trip."""
    result = host.run(remote_launch_script(argv, env), timeout=60)
    fields = result.stdout.split()
    if result.returncode != 0 or len(fields) != 3 or not fields[0].isdigit():
        raise ServerExitedError(f"{host.name}: could not start the server "
                                f"(exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
    return RemoteProcess(host, int(fields[0]), int(fields[1]), fields[2])


__all__ = ["LaunchedProcess", "LocalProcess", "RemoteProcess", "describe_exit", "launch_local", "launch_remote"]
