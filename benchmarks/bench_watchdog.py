"""Benchmark: from SIGKILL of a pytest run to its server's processes gone (and its GPUs clean).

Each repetition runs a real pytest (a subprocess, as a CI job runs it) whose one test asks
``vllm_server`` for a server, waits until the server is loading or ready, kills the pytest
process with SIGKILL (no teardown, no atexit: what a cancelled job or the OOM killer does), and
times until no process of the server's session is left, polled every 10 ms from /proc; where the
machine has GPUs, also until ``check_gpus_clean`` passes on the GPUs the server used.

Servers:

* ``stub``: a ``sh`` tree whose leader and child ignore SIGTERM, as vLLM's EngineCore does while it
  loads: measures the watchdog's SIGTERM grace (5 s) and SIGKILL path, no vLLM needed;
* ``vllm``: a real vLLM (``python -m vllm.entrypoints.openai.api_server`` of this interpreter)
  serving ``--model`` (default: the tiny Llama of tests/tiny_model.py, generated once).

``--where ssh`` runs the same through the loopback sshd (tests/sshd.py): the server and its
watchdog on the "remote" host, the watchdog reading the stdin of an ssh session the killed pytest
held (multiplexed over a ControlMaster that outlives it).

Targets (issue 8): under 10 s locally, under 15 s over ssh.

Run:  python benchmarks/bench_watchdog.py --server stub --where local,ssh --repeat 3 [--write-docs]
      .tox/vllm/bin/python benchmarks/bench_watchdog.py --server vllm --state loading,ready --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.perf_docs import machine, replace_section  # noqa: E402
from pytest_gpuready import LocalHost, check_gpus_clean, snapshot  # noqa: E402
from tests.process_watch import session_pids, wait_for_output  # noqa: E402
from tests.sshd import LoopbackSshd, loopback_sshd  # noqa: E402

SECTION = "## Watchdog: SIGKILL of pytest to the server gone"
STUB = "sh -c 'trap \"\" TERM; sleep 600 & sleep 600 & wait' fake-vllm"
WATCHING = re.compile(r"watchdog pid \d+ on \S+ stops session (\d+) if this process dies first")
READY = re.compile(r"gpuready: vLLM \S+: ready at ")
INNER = """
from pytest_gpuready import ServeArgs, ServeSpec

def test_server(vllm_server):
    vllm_server(ServeSpec(model={model!r}, served_model_name="bench", args=ServeArgs(max_model_len={max_len}),
                          command={command!r}, env={env!r}))
"""


@dataclass(frozen=True)
class Run:
    server: str
    where: str
    state: str
    processes: int
    gone_s: float
    gpus_clean_s: float | None


def bench_failed(message: str) -> NoReturn:
    raise RuntimeError(message)


def gpus_present() -> bool:
    snap = snapshot(LocalHost(), gpus_expected=False)
    return bool(snap.gpus) and snap.no_gpu_reason is None


def one_run(workdir: Path, *, server: str, where: str, state: str, command: str, model: str, max_len: int,
            sshd: LoopbackSshd | None, gpus: bool) -> Run:
    env = {} if server == "stub" else {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    (workdir / "test_inner.py").write_text(INNER.format(model=model, max_len=max_len, command=command, env=env))
    out = workdir / "stdout.txt"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "--vllm-ready-timeout", "1800",
            str(workdir / "test_inner.py")]
    if sshd is not None:
        args[5:5] = sshd.pytest_args()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUREADY_")}
    with out.open("wb") as stdout:
        proc = subprocess.Popen(args, cwd=workdir, stdout=stdout, stderr=subprocess.STDOUT, env=child_env)
    try:
        sid = int(wait_for_output(proc, out, WATCHING, 1800, fail=bench_failed).group(1))
        if state == "ready":
            wait_for_output(proc, out, READY, 1800, fail=bench_failed)
        else:
            deadline = time.monotonic() + 600
            while len(session_pids(sid)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        members = len(session_pids(sid))
        killed = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gone_s: float | None = None
        clean_s: float | None = None
        deadline = killed + 120
        while time.monotonic() < deadline and (gone_s is None or (gpus and clean_s is None)):
            now = time.monotonic() - killed
            if gone_s is None and not session_pids(sid):
                gone_s = now
            if gpus and clean_s is None and gone_s is not None and check_gpus_clean(
                    snapshot(LocalHost(), reader="nvml" if where == "local" else "nvidia-smi")).ok:
                clean_s = time.monotonic() - killed
            time.sleep(0.01)
        if gone_s is None:
            raise RuntimeError(f"session {sid} still has processes 120 s after SIGKILL of pytest: {session_pids(sid)}")
        return Run(server, where, state, members, gone_s, clean_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def maybe_sshd(wanted: bool) -> Iterator[LoopbackSshd | None]:
    if not wanted:
        yield None
        return
    with loopback_sshd() as server:
        yield server


def tiny_model() -> str:
    from tests.tiny_model import write_tiny_llama

    target = Path(tempfile.gettempdir()) / "gpuready-bench-tiny-llama"
    if not (target / "model.safetensors").exists():
        write_tiny_llama(target)
    return str(target)


def summarize(runs: list[Run]) -> list[str]:
    rows = ["| server | where | killed while | processes | gone after SIGKILL (median / max) | GPUs clean after |",
            "|---|---|---|---|---|---|"]
    keys = sorted({(r.server, r.where, r.state) for r in runs})
    for key in keys:
        group = [r for r in runs if (r.server, r.where, r.state) == key]
        gone = [r.gone_s for r in group]
        clean = [r.gpus_clean_s for r in group if r.gpus_clean_s is not None]
        clean_text = f"{statistics.median(clean):.2f} s" if clean else "no GPU here"
        rows.append(f"| {key[0]} | {key[1]} | {key[2]} | {group[0].processes} | "
                    f"{statistics.median(gone):.2f} / {max(gone):.2f} s (n={len(group)}) | {clean_text} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="stub", help="stub, vllm or stub,vllm")
    parser.add_argument("--where", default="local", help="local, ssh or local,ssh")
    parser.add_argument("--state", default="loading", help="loading, ready or loading,ready (ready: vllm only)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", help="model directory for --server vllm (default: the generated tiny Llama)")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--vllm-args", default="", help="extra launch flags, e.g. '--enforce-eager'")
    parser.add_argument("--json", help="also write the runs as JSON here")
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite {SECTION!r} in docs/performance.md")
    args = parser.parse_args()
    servers = args.server.split(",")
    wheres = args.where.split(",")
    states = args.state.split(",")
    if not set(servers) <= {"stub", "vllm"} or not set(wheres) <= {"local", "ssh"} or not set(states) <= {
            "loading", "ready"}:
        parser.error("--server takes stub/vllm, --where local/ssh, --state loading/ready")
    gpus = gpus_present()
    runs: list[Run] = []
    with maybe_sshd("ssh" in wheres) as sshd:
        for server in servers:
            command = STUB if server == "stub" else " ".join(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", args.vllm_args]).strip()
            model = "/m" if server == "stub" else (args.model or tiny_model())
            for where in wheres:
                for state in states:
                    if server == "stub" and state == "ready":
                        continue  # the stub never becomes ready
                    for _ in range(args.repeat):
                        with tempfile.TemporaryDirectory(prefix="gpuready-bench-watchdog-") as tmp:
                            run = one_run(Path(tmp), server=server, where=where, state=state, command=command,
                                          model=model, max_len=args.max_model_len,
                                          sshd=sshd if where == "ssh" else None, gpus=gpus)
                        runs.append(run)
                        print(json.dumps(asdict(run)), flush=True)
    table = summarize(runs)
    print("\n".join(table))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
    if args.write_docs:
        cmd = " ".join(["python", "benchmarks/bench_watchdog.py", *sys.argv[1:]]).replace(" --write-docs", "")
        body = "\n".join([
            SECTION, "",
            "From `kill -9` of a pytest run whose `vllm_server` started a server to the last process of the server's",
            "session gone (polled every 10 ms from /proc), the watchdog doing the stopping (SIGTERM, 5 s grace,",
            "SIGKILL). Targets: under 10 s locally, under 15 s over ssh. The `stub` server ignores SIGTERM like a",
            "loading EngineCore, so its figure is the grace plus the SIGKILL path; a ready vLLM stops on SIGTERM.",
            "",
            f"Measured {time.strftime('%Y-%m-%d')}. Machine: {machine()}. Command: `{cmd}`, with",
            "`.tox/vllm/bin/python` (vllm-cpu 0.32, the tiny Llama of tests/tiny_model.py). On a GPU, with the",
            "time until the GPU reads clean: scripts/gpu-lifecycle.sh, figures in docs/gpu-validation.md.",
            "", *table, "",
        ])
        replace_section(SECTION, body)


if __name__ == "__main__":
    main()
