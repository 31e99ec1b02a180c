"""Benchmark: the host preflight over ssh, this plugin against the manual way, in one run.

Both ways gather the same facts from a real OpenSSH server on 127.0.0.1 (tests/sshd.py) whose
remote PATH holds the labelled stand-in ``nvidia-smi`` replaying a real 8-GPU capture:

* **plugin**: ``probe.snapshot(connect(spec, ...))`` then ``close()``, the whole preflight of one
  pytest session: one multiplexed ssh connection, one round trip.
* **manual**: what engineers type today, one fresh ``ssh host <query>`` per question:
  nvidia-smi --query-gpu, nvidia-smi --query-compute-apps, nvidia-smi topo -m, the /dev/shm
  listing, df of /dev/shm and the vLLM version (the same commands the probe runs, so the remote
  work is the same or less).

For each way it reports the median wall time over N repetitions and the ssh connections sshd
accepted per preflight (counted from sshd's log, not inferred), then the ratio.

Loopback has almost no network latency, and this kernel has no ``netem`` to inject some, so an
optional second figure routes ssh through a small delaying TCP relay written here (each chunk
held back RTT/2 in each direction): a modelled RTT, labelled as such, never a measured WAN.

Run:  python benchmarks/bench_preflight_ssh.py [--repeat 7] [--rtt-ms 2,30,80] [--write-docs]

``--health`` measures the plugin alone, without and with the GPU health sections
(``snapshot(host, health=True)``, what the built-in preflight takes), on the H200 scenario whose
stand-in answers every health field: the ssh connections (sshd's log) and the commands run over
the connection (``host.commands_run``, one per round trip) per preflight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.perf_docs import machine, replace_section  # noqa: E402
from pytest_gpuready import connect, snapshot  # noqa: E402
from pytest_gpuready.host import gpus as gpu_readers  # noqa: E402
from pytest_gpuready.host.probe import VLLM_VERSION_SCRIPT, build_probe_script  # noqa: E402
from pytest_gpuready.host.shm import SHM_DF_SCRIPT, SHM_LIST_SCRIPT  # noqa: E402
from tests.sshd import LoopbackSshd, loopback_sshd  # noqa: E402

SCENARIO = "rtx8-tp4-loaded"
DOCS = REPO / "docs" / "performance.md"
SECTION = "## Preflight over ssh"
COMMAND = "python benchmarks/bench_preflight_ssh.py --repeat 7 --rtt-ms 2,30,80 --write-docs"

MANUAL_QUERIES: tuple[str, ...] = (
    "nvidia-smi --query-gpu=" + ",".join(gpu_readers.QUERY_GPU_FIELDS) + " --format=csv,noheader,nounits",
    "nvidia-smi --query-compute-apps=" + ",".join(gpu_readers.QUERY_APPS_FIELDS)
    + " --format=csv,noheader,nounits",
    "nvidia-smi topo -m",
    SHM_LIST_SCRIPT,
    SHM_DF_SCRIPT,
    VLLM_VERSION_SCRIPT,
)
"""The questions an engineer asks before a deploy, each as its own ``ssh host ...``."""


@dataclass(frozen=True)
class Sample:
    wall_s: float
    connections: int


@dataclass(frozen=True)
class Figures:
    way: str
    samples: tuple[Sample, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(s.wall_s for s in self.samples)

    @property
    def spread(self) -> str:
        walls = sorted(s.wall_s for s in self.samples)
        return f"{walls[0]:.3f}-{walls[-1]:.3f}"

    @property
    def connections(self) -> str:
        counts = sorted({s.connections for s in self.samples})
        return "/".join(str(c) for c in counts)


def plugin_preflight(server: LoopbackSshd, spec: str, options: tuple[str, ...]) -> None:
    """The plugin's way: connect, one snapshot, close (what one pytest session does)."""
    host = connect(spec, identity_file=server.identity_file, ssh_options=options)
    try:
        snap = snapshot(host)
    finally:
        host.close()
    if snap.errors or not snap.gpus or snap.shm is None or snap.topology is None:
        raise SystemExit(f"the plugin's probe did not measure everything: {snap.errors}")


def manual_preflight(server: LoopbackSshd, port: int, options: tuple[str, ...]) -> None:
    """The manual way: one fresh ``ssh host <query>`` per question, no multiplexing."""
    argv = server.ssh_argv(port, tuple(o for o in options if o not in server.ssh_options))
    for query in MANUAL_QUERIES:
        proc = subprocess.run([*argv, query], capture_output=True, text=True, check=False)
        answered = bool(proc.stdout.strip()) or "--query-gpu" not in query
        if proc.returncode != 0 or not answered:
            raise SystemExit(f"manual query failed (exit {proc.returncode}): {query}\n{proc.stderr}")


def timed(server: LoopbackSshd, run: Callable[[], None]) -> Sample:
    before = server.accepted_connections()
    started = time.perf_counter()
    run()
    wall = time.perf_counter() - started
    return Sample(wall, server.accepted_connections() - before)


def measure(server: LoopbackSshd, repeat: int, plugin: Callable[[], None],
            manual: Callable[[], None]) -> tuple[Figures, Figures]:
    """Alternate the two ways, so that load from other processes on the machine hits both alike."""
    plugin()  # warm the page cache and the remote's python and shell, so no way pays a cold start
    manual()
    samples: dict[str, list[Sample]] = {"plugin": [], "manual": []}
    for _ in range(repeat):
        samples["plugin"].append(timed(server, plugin))
        samples["manual"].append(timed(server, manual))
    return Figures("plugin", tuple(samples["plugin"])), Figures("manual", tuple(samples["manual"]))


class DelayRelay:
    """A TCP relay on 127.0.0.1 that holds every chunk back ``rtt/2`` in each direction.

    It models propagation delay only (no bandwidth limit, no loss): a stand-in for the network
    between an engineer and a GPU server, because this kernel cannot run ``netem``.
    """

    def __init__(self, target_port: int, rtt_s: float) -> None:
        self.target_port = target_port
        self.one_way_s = rtt_s / 2
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> DelayRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def delayed_writer() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(delayed_writer())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.one_way_s, data))
                if not data:
                    break
            await sender
        except (ConnectionError, OSError):
            sender.cancel()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        writers = [client_writer]
        try:
            await asyncio.sleep(self.one_way_s * 2)  # the TCP handshake costs one round trip
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            writers.append(server_writer)
            await asyncio.gather(self._pipe(client_reader, server_writer),
                                 self._pipe(server_reader, client_writer), return_exceptions=True)
        except asyncio.CancelledError:
            pass  # the relay is shutting down; a connection still open (a leftover master) just ends
        finally:
            for writer in writers:
                writer.close()


@contextlib.contextmanager
def route(server: LoopbackSshd, rtt_ms: float) -> Iterator[tuple[int, tuple[str, ...]]]:
    """The port to dial and extra ssh options: sshd itself, or the delaying relay in front of it."""
    if rtt_ms <= 0:
        yield server.port, server.ssh_options
        return
    with DelayRelay(server.port, rtt_ms / 1000) as relay:
        # the relay listens on another port: tell ssh which known_hosts entry is this host's key
        yield relay.port, (*server.ssh_options, f"HostKeyAlias=[127.0.0.1]:{server.port}")


@dataclass(frozen=True)
class Breakdown:
    """Where the loopback time goes, measured: a fresh connection, and the probe on an open one."""

    fresh_connection_s: float
    mux_session_s: float
    probe_on_open_connection_s: float
    probe_stderr: str


def breakdown(server: LoopbackSshd, repeat: int) -> Breakdown:
    fresh = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([*server.ssh_argv(), "true"], capture_output=True, check=True)
        fresh.append(time.perf_counter() - started)
    host = connect(server.spec, identity_file=server.identity_file, ssh_options=server.ssh_options)
    try:
        host.run("true")
        mux = [host.run("true").duration_s for _ in range(repeat)]
        runs = [host.run(build_probe_script()) for _ in range(repeat)]
    finally:
        host.close()
    return Breakdown(statistics.median(fresh), statistics.median(mux),
                     statistics.median(r.duration_s for r in runs), runs[-1].stderr.strip())


def run_case(server: LoopbackSshd, rtt_ms: float, repeat: int) -> tuple[Figures, Figures]:
    with route(server, rtt_ms) as (port, options):
        spec = f"ssh://{server.user}@127.0.0.1:{port}"
        return measure(server, repeat, lambda: plugin_preflight(server, spec, options),
                       lambda: manual_preflight(server, port, options))


def table(rows: list[tuple[str, Figures, Figures]], repeat: int) -> str:
    lines = [
        "| network | way | ssh connections per preflight | median wall s | min-max s | manual / plugin |",
        "|---|---|---|---|---|---|",
    ]
    for label, plugin, manual in rows:
        ratio = manual.median_s / plugin.median_s
        lines.append(f"| {label} | plugin: `snapshot(connect(spec))` | {plugin.connections} | "
                     f"{plugin.median_s:.3f} | {plugin.spread} | |")
        lines.append(f"| {label} | manual: one `ssh host ...` per query ({len(MANUAL_QUERIES)}) | "
                     f"{manual.connections} | {manual.median_s:.3f} | {manual.spread} | **{ratio:.1f}x** |")
    lines.append("")
    lines.append(f"Medians of {repeat} repetitions of each way, the two ways alternating, after one warm-up "
                 "each; connections counted from sshd's `Accepted publickey` log lines.")
    return "\n".join(lines)


def target_line(rows: list[tuple[str, Figures, Figures]]) -> str:
    """The issue's targets, each with whether these figures meet it."""
    one_connection = all(plugin.connections == "1" for _, plugin, _ in rows)
    met = [label for label, plugin, manual in rows if manual.median_s / plugin.median_s >= 5]
    speed = (f"met at {', '.join(met)}" if met else "not met in any row")
    if met and len(met) < len(rows):
        speed += f"; not at {', '.join(label for label, *_ in rows if label not in met)}"
    return (f"Targets: one ssh connection per host per preflight: {'met' if one_connection else 'NOT met'} "
            f"(the manual way: {rows[0][2].connections}). At least 5x less wall time than the manual way: "
            f"{speed}.")


def _rtts(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected milliseconds, comma-separated") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: a round-trip time cannot be negative")
    return tuple(v for v in values if v > 0)


HEALTH_SCENARIO = "h200-one-process"
HEALTH_SECTION = "## Preflight over ssh with GPU health"
HEALTH_COMMAND = "python benchmarks/bench_preflight_ssh.py --health --repeat 7 --rtt-ms 30 --write-docs"


def health_preflight(spec: str, server: LoopbackSshd, options: tuple[str, ...], health: bool,
                     trips: list[int]) -> None:
    host = connect(spec, identity_file=server.identity_file, ssh_options=options)
    try:
        snap = snapshot(host, health=health)
    finally:
        host.close()
    if snap.errors or not snap.gpus or (health and snap.health is None):
        raise SystemExit(f"the plugin's probe did not measure everything: {snap.errors}")
    trips.append(int(getattr(host, "commands_run", -1)))  # SSHHost counts the commands it ran


def health_main(repeat: int, rtts: tuple[float, ...], write_docs: bool) -> int:
    lines = ["| network | snapshot | ssh connections per preflight | commands (round trips) per preflight "
             "| median wall s | min-max s |", "|---|---|---|---|---|---|"]
    with loopback_sshd() as server, server.use_scenario(HEALTH_SCENARIO):
        for rtt_ms in (0.0, *rtts):
            label = "loopback (measured)" if rtt_ms == 0 else f"{rtt_ms:g} ms RTT (modelled by a delaying relay)"
            with route(server, rtt_ms) as (port, options):
                spec = f"ssh://{server.user}@127.0.0.1:{port}"
                trips: dict[bool, list[int]] = {False: [], True: []}
                plain, health = measure(server, repeat,
                                        functools.partial(health_preflight, spec, server, options, False, trips[False]),
                                        functools.partial(health_preflight, spec, server, options, True, trips[True]))
            for name, figures, key in (("`snapshot(host)`", plain, False),
                                       ("`snapshot(host, health=True)`", health, True)):
                counted = "/".join(str(c) for c in sorted(set(trips[key])))
                lines.append(f"| {label} | {name} | {figures.connections} | {counted} | "
                             f"{figures.median_s:.3f} | {figures.spread} |")
    one = all(row.split("|")[3].strip() == "1" and row.split("|")[4].strip() == "1" for row in lines[2:])
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[0]
    body = "\n".join([
        HEALTH_SECTION,
        "",
        "The plugin's probe over a real OpenSSH server on 127.0.0.1 without and with the GPU health "
        "sections (the health `--query-gpu`, the plain `nvidia-smi` header, `dmesg`, IOMMU/ACS; what "
        f"`pytest --pyargs pytest_gpuready.preflight` takes), on the stand-in `{HEALTH_SCENARIO}` scenario "
        "(the H200's captured answers to all 214 fields). Commands are counted on the client "
        "(`SSHHost.commands_run`: each is one round trip over the open connection), connections "
        "from sshd's log.",
        "",
        f"Command: `{HEALTH_COMMAND}`  ",
        f"Machine: {machine()}; load average {load} at the end (shared machine: wall times inflated alike).",
        "",
        *lines,
        "",
        f"Medians of {repeat} repetitions, the two alternating, after one warm-up each.",
        "",
        "Target: the probe with health still one ssh connection and one round trip per host: "
        + ("met." if one else "NOT met."),
    ])
    print(body)
    if write_docs:
        replace_section(HEALTH_SECTION, body)
        print(f"\nwrote {DOCS.relative_to(REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=7, help="repetitions per way (median reported)")
    parser.add_argument("--rtt-ms", type=_rtts, default=(2.0, 30.0, 80.0),
                        help="modelled round-trip times in ms after the loopback figure, comma-separated "
                             "(default 2,30,80; 0 for loopback only)")
    parser.add_argument("--write-docs", action="store_true", help=f"update '{SECTION}' in docs/performance.md")
    parser.add_argument("--health", action="store_true",
                        help="the plugin without and with the GPU health sections (connections, round trips)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.health:
        return health_main(args.repeat, args.rtt_ms, args.write_docs)
    rows: list[tuple[str, Figures, Figures]] = []
    with loopback_sshd() as server, server.use_scenario(SCENARIO):
        rows.append(("loopback (measured)", *run_case(server, 0, args.repeat)))
        parts = breakdown(server, args.repeat)
        round_trips: list[float] = []  # round trips per fresh connection, from the manual way's slope
        for rtt_ms in args.rtt_ms:
            plugin, manual = run_case(server, rtt_ms, args.repeat)
            rows.append((f"{rtt_ms:g} ms RTT (modelled by a delaying relay)", plugin, manual))
            extra_s = (manual.median_s - rows[0][2].median_s) / len(MANUAL_QUERIES)
            round_trips.append(extra_s / (rtt_ms / 1000))
    distance = (f"each fresh connection costs about {statistics.median(round_trips):.1f} round trips "
                "(from the manual rows' slope)" if round_trips else "each fresh connection costs several round trips")
    body = "\n".join([
        SECTION,
        "",
        "The host preflight against a real OpenSSH server on 127.0.0.1 (Debian openssh-server, the "
        "stand-in `nvidia-smi` replaying the 8-GPU `rtx8-tp4-loaded` capture on the remote PATH), "
        "two ways in one run: this plugin (`probe.snapshot(connect(spec))`, one round trip over one "
        "multiplexed connection, then `close()`) and the manual way (one fresh "
        "`ssh host <query>` per question: nvidia-smi --query-gpu, --query-compute-apps, topo -m, "
        "the /dev/shm listing, df /dev/shm, the vLLM version).",
        "",
        f"Command: `{COMMAND}`  ",
        f"Machine: {machine()}.",
        "",
        table(rows, args.repeat),
        "",
        f"Reading it (loopback, medians): a fresh ssh connection running `true` takes "
        f"{parts.fresh_connection_s:.3f} s here (TCP, key exchange, auth, session, login shell), a "
        f"session on an open multiplexed connection {parts.mux_session_s:.3f} s, and the probe script "
        f"on an open connection {parts.probe_on_open_connection_s:.3f} s (the stand-in nvidia-smi is a "
        "Python script, about 25 ms a call; a real one took 22 ms on an H200; the probe's sections run "
        "concurrently, but the ssh client, sshd and the probed 'host' all share this machine's cores). "
        "The manual way pays the "
        "connection six times, the plugin once, plus its probe's remote work, so on loopback the ratio "
        f"is bounded by that work; with distance {distance}, paid six times by the manual way and "
        "once by the plugin, so the ratio climbs toward 6. This sshd is lean (no PAM, no "
        "motd, an empty HOME so the login shell reads no profile); a GPU server's PAM session setup "
        "and a shell profile running `conda init` add their cost to each of the manual way's "
        "connections and once to the plugin's. The RTT rows are modelled, not measured: this "
        "kernel has no `netem`, so a relay in the benchmark holds each chunk back RTT/2 per "
        "direction (propagation only, no bandwidth limit).",
    ])
    body += "\n\n" + target_line(rows)
    if parts.probe_stderr:
        body += ("\n\nCaveat: the probe script did not run to its end in the remote shell "
                 f"(`{parts.probe_stderr.splitlines()[-1]}`), so its last sections (the vLLM version) "
                 "were not run and the plugin's figures leave out that work (a python3 start, about 20 ms).")
    print(body)
    if args.write_docs:
        replace_section(SECTION, body)
        print(f"\nwrote {DOCS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
