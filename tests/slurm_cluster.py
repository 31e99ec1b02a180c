"""A real one-node Slurm cluster for the slurm tier: Debian's munged, slurmctld and slurmd.

Everything is private to one temporary directory: a generated munge key and socket, a
``slurm.conf`` with its own ports (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
no accounting), the state, spool and log folders. The node is this machine under its short
hostname at 127.0.0.1; nothing outside the directory is read or written, and clients find the
cluster only through ``SLURM_CONF`` (:meth:`SlurmCluster.env`). The daemons run in the foreground
as children of the test session and are stopped by pid at the end.

/dev/shm is this machine's, shared with the other tiers: the checks count only files named for
this cluster as leftovers (:func:`shm_pattern`, ``--shm-leak-pattern``), so another run's files
never drain the test node, and a test's own leftover does.

The health check and the epilog are wrapper scripts in the directory, as a site writes them
(Slurm passes a ``HealthCheckProgram`` no arguments and no environment): each runs
``python -m pytest_gpuready slurm-health`` with the labelled stand-in ``nvidia-smi``
(``tests/standin/``, real captured output: CI has no GPU) first on PATH and the scenario named by
a file the tests rewrite. Each is inert until its ``*.enabled`` file exists, logs one line per run
(start time, exit code, what it printed) to ``health.log`` / ``epilog.log``, and keeps its pid in
``running/`` while it runs, so the teardown waits for the last one before stopping slurmd.

Readiness and every later state are polled with a deadline (:func:`wait_for`); no fixed sleeps.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tests.sshd import STANDIN_BIN, STANDIN_SCENARIOS, _free_ports

DAEMONS = ("munged", "slurmctld", "slurmd")
INSTALL = "apt-get install -y slurmctld slurmd munge slurm-client"
HEALTH_CHECK_INTERVAL_S = 3
READY_TIMEOUT_S = 60.0
T = TypeVar("T")


class SlurmUnavailable(RuntimeError):
    """No Slurm or munge here, or not root: the tier cannot run (CI installs it and runs as root)."""


def find_daemons() -> dict[str, str]:
    """The daemons' and clients' paths, or :class:`SlurmUnavailable` naming what is missing."""
    found: dict[str, str] = {}
    missing = []
    for name in (*DAEMONS, "scontrol", "sinfo", "srun"):
        path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}")
                                           if os.access(p, os.X_OK)), None)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if missing:
        raise SlurmUnavailable(f"{', '.join(missing)} not found (looked on PATH, /usr/sbin, /usr/bin): "
                               f"install them with `{INSTALL}` to run the slurm tier")
    if os.geteuid() != 0:
        raise SlurmUnavailable("the slurm tier runs slurmd, which must run as root: run the tests as root")
    return found


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.2) -> T:
    """``probe()`` until it returns something not None (or not False); fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


@dataclass(frozen=True)
class CheckRun:
    """One logged run of a wrapper: when it started, its exit code, what it printed."""

    started: float
    ended: float
    returncode: int
    output: str


@dataclass
class SlurmCluster:
    root: Path
    node: str
    binaries: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def shm_pattern(self) -> str:
        return shm_pattern(self.root)

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment pointed at the cluster (and given ``extra``)."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *argv: str, timeout: float = 60.0, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env(**extra),
                              check=False)

    def scontrol(self, *args: str) -> str:
        done = self.run(self.binaries["scontrol"], *args)
        assert done.returncode == 0, f"scontrol {' '.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def state(self) -> tuple[str, str]:
        """``(state, reason)`` as ``sinfo -R``'s columns show them: ``drained``, ``idle``...; the reason."""
        done = self.run(self.binaries["sinfo"], "-h", "-N", "-n", self.node, "-o", "%T|%E")
        assert done.returncode == 0, f"sinfo: {done.stderr.strip()}"
        state, _, reason = done.stdout.strip().splitlines()[0].partition("|")
        # a trailing * is "not responding": a ping slurmctld missed on a loaded machine, which the
        # next ping clears; the state (idle, drained, ...) is the part these tests read
        return state.rstrip("*"), ("" if reason == "none" else reason)

    def reasons(self) -> str:
        """``sinfo -R`` as an operator reads it (reasons in full)."""
        return self.run(self.binaries["sinfo"], "-R", "-h", "-o", "%E|%N").stdout

    def use_scenario(self, scenario: str | Path) -> None:
        path = scenario if isinstance(scenario, Path) else STANDIN_SCENARIOS / scenario
        assert path.is_dir(), path
        (self.root / "scenario").write_text(f"{path}\n")

    def set_args(self, wrapper: str, *args: str) -> None:
        """Options the wrapper adds to its command line from its next run on."""
        (self.root / f"{wrapper}.args").write_text(" ".join(args))

    def enable(self, wrapper: str, on: bool = True) -> None:
        flag = self.root / f"{wrapper}.enabled"
        if on:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def runs(self, wrapper: str, since: float = 0.0) -> list[CheckRun]:
        """The wrapper's logged runs that started after ``since`` (``time.time()``)."""
        log = self.root / f"{wrapper}.log"
        found = []
        for line in log.read_text().splitlines() if log.exists() else []:
            started, ended, code, output = [*line.split(" ", 3), ""][:4]
            if float(started) > since:
                found.append(CheckRun(float(started), float(ended), int(code), output.strip()))
        return found

    def wait_for_checks(self, since: float, count: int, timeout: float = 90.0) -> list[CheckRun]:
        """``count`` health checks that started after ``since`` and checked (not skipped as already running)."""
        def done() -> list[CheckRun] | None:
            checked = [r for r in self.runs("health", since) if "already running" not in r.output]
            return checked if len(checked) >= count else None
        return wait_for(f"{count} health checks of {self.node} after t={since:.1f}", done, timeout)

    def resume(self) -> None:
        """Back to idle, whoever drained it (the tests' own cleanup), once no check runs any more.

        RESUME is said again while the node is drained: an epilog that exits 1 after its drain was
        resumed makes slurmctld drain the node once more (``Epilog error``)."""
        _wait_running_wrappers(self.root)
        seen: list[tuple[str, str]] = []

        def idle() -> bool:
            seen.append(self.state())
            if "drain" in seen[-1][0]:
                self.scontrol("update", f"NodeName={self.node}", "State=RESUME")
                return False
            return seen[-1][0] == "idle"
        try:
            wait_for(f"{self.node} idle", idle, READY_TIMEOUT_S, every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {seen[-1:]}") from None


def shm_pattern(root: Path) -> str:
    """What counts as a /dev/shm leftover for this cluster's checks: its own names only. /dev/shm is
    this machine's, shared with the other tiers (and other runs), whose files are not this test's."""
    return f"{root.name}-*"


def _wrapper(root: Path, name: str, args: str) -> Path:
    """A wrapper script as a site writes it for Slurm (see the module docstring); a test adds
    options for one run of it in ``NAME.args``."""
    path = root / f"{name}.sh"
    path.write_text(f"""#!/bin/sh
# {name} for the test cluster: pytest-gpuready's Slurm check with the stand-in nvidia-smi (tests only).
[ -f {root}/{name}.enabled ] || exit 0
start=$(date +%s.%N)
echo $$ > {root}/running/{name}.$$
out=$(PATH={STANDIN_BIN}:/usr/sbin:/usr/bin:/sbin:/bin GPUREADY_STANDIN_SCENARIO_FILE={root}/scenario \\
      {sys.executable} -m pytest_gpuready slurm-health {args} $(cat {root}/{name}.args 2>/dev/null) \\
      --slurm-conf {root}/slurm.conf --report {root}/reports/{{node}}-{{mode}}.json \\
      -- --shm-leak-pattern '{shm_pattern(root)}' 2>&1)
rc=$?
printf '%s %s %s %s\\n' "$start" "$(date +%s.%N)" "$rc" "$(echo "$out" | tr '\\n' ' ')" >> {root}/{name}.log
rm -f {root}/running/{name}.$$
exit $rc
""")
    path.chmod(0o755)
    return path


def _config(root: Path, node: str, ports: tuple[int, ...]) -> str:
    return f"""# a one-node test cluster (tests/slurm_cluster.py); everything under {root}
ClusterName=gpureadytest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
HealthCheckProgram={root}/health.sh
HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}
HealthCheckNodeState=ANY
Epilog={root}/epilog.sh
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for name in reversed(list(processes)):
        proc = processes[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_running_wrappers(root: Path) -> None:
    running = root / "running"
    with contextlib.suppress(AssertionError):
        wait_for("the last health check or epilog to finish", lambda: not any(running.iterdir()), 70.0)


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd on a private configuration; stop them (by pid) on exit."""
    binaries = find_daemons()
    node = platform.node().split(".")[0]
    root = Path(tempfile.mkdtemp(prefix="gpuready-slurm-"))
    root.chmod(0o755)  # munged wants every folder above its socket searchable
    for folder in ("munge", "state", "spool", "log", "reports", "running"):
        (root / folder).mkdir()
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (root / "slurm.conf").write_text(_config(root, node, _free_ports(2)))
    _wrapper(root, "health", "")
    _wrapper(root, "epilog", "--epilog")
    (root / "scenario").write_text(f"{STANDIN_SCENARIOS / 'h200-idle'}\n")
    cluster = SlurmCluster(root, node, binaries, {})
    env = cluster.env()
    try:
        with open(root / "log" / "daemons.out", "ab") as out:
            cluster.processes["munged"] = subprocess.Popen(
                [binaries["munged"], "-F", "--force", "--num-threads=4", f"--socket={root}/munge/munge.socket",
                 f"--key-file={key}", f"--log-file={root}/munge/munged.log", f"--pid-file={root}/munge/munged.pid",
                 f"--seed-file={root}/munge/munged.seed"], stdout=out, stderr=out, env=env)
            wait_for("munged's socket", lambda: (root / "munge" / "munge.socket").exists(), READY_TIMEOUT_S)
            for daemon in ("slurmctld", "slurmd"):
                cluster.processes[daemon] = subprocess.Popen([binaries[daemon], "-D", "-f", str(cluster.conf)],
                                                             stdout=out, stderr=out, env=env)
        wait_for(f"{node} idle in sinfo (logs in {root}/log)", lambda: _idle(cluster), READY_TIMEOUT_S)
        yield cluster
    finally:
        for wrapper in ("health", "epilog"):
            cluster.enable(wrapper, False)
        _wait_running_wrappers(root)
        _stop(cluster.processes)
        if all(p.returncode is not None for p in cluster.processes.values()):
            shutil.rmtree(root, ignore_errors=True)


def _idle(cluster: SlurmCluster) -> bool:
    for name, proc in cluster.processes.items():
        if proc.poll() is not None:
            log = (cluster.root / "log" / "daemons.out").read_text(errors="replace")[-2000:]
            raise AssertionError(f"{name} exited with {proc.returncode} while starting: {log}")
    done = cluster.run(cluster.binaries["sinfo"], "-h", "-N", "-n", cluster.node, "-o", "%T", timeout=20)
    return done.returncode == 0 and done.stdout.strip() == "idle"
