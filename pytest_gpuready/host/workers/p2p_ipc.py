"""Worker, run on the GPU host by the Python that has torch: a CUDA IPC write and read-back per GPU pair.

Not imported by the plugin: :mod:`pytest_gpuready.host.gpu_workers` sends this file's text over
the host's connection and runs it as a script (``python3 p2p_ipc.py --gpus 0,1 --timeout 60``),
so torch is imported only here, in the worker's own processes, never by pytest.

What it does, per pair (a, b) of the given GPUs, in two fresh processes (``spawn``), as vLLM's
``gpu_p2p_access_check`` does with cudart (vllm/distributed/device_communicators/
custom_all_reduce_utils.py ``can_actually_p2p``): ``cudaDeviceCanAccessPeer`` is "a capability
lookup, not a data-path test" (vllm-project/vllm#51513), and ACS or an IOMMU in translated mode
break the data path while the capability says yes (gpu-health-anchors.md B6).

* the producer fills a buffer on GPU a with 1s and shares it by CUDA IPC (torch's CUDA tensor
  sharing: ``cudaIpcGetMemHandle``);
* the consumer, on GPU b, opens it (``cudaIpcOpenMemHandle``), copies it into GPU b's memory
  (a peer read) and checks every byte, then writes 2s from GPU b into the shared buffer (a
  peer write);
* the producer checks every byte of its buffer reads 2.

Each pair has a deadline; a pair that does not finish in time is a hang: both processes are
killed and the pair is reported hung. Output: one line per fact, ``@@gpuready {json}``, read by
:func:`pytest_gpuready.host.gpu_workers.parse_worker_output`.
"""

import argparse
import importlib
import itertools
import json
import os
import sys
import time
from typing import Any

SIZE_BYTES = 4 * 1024 * 1024


def emit(**fields: Any) -> None:
    sys.stdout.write("@@gpuready " + json.dumps(fields) + "\n")
    sys.stdout.flush()


def producer(device: int, queue: Any, done: Any, result: Any) -> None:
    torch = importlib.import_module("torch")
    torch.cuda.set_device(device)
    buffer = torch.ones(SIZE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")
    torch.cuda.synchronize()
    queue.put(buffer)  # a CUDA tensor crosses processes as a CUDA IPC handle
    if not done.wait(3600):
        return
    torch.cuda.synchronize()
    result.put(("write_ok", bool(torch.all(buffer == 2).item())))


def consumer(device: int, queue: Any, done: Any, result: Any) -> None:
    torch = importlib.import_module("torch")
    torch.cuda.set_device(device)
    try:
        shared = queue.get(timeout=3600)  # opened here: cudaIpcOpenMemHandle
        local = torch.empty(SIZE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")
        local.copy_(shared)  # peer read: GPU a's memory into GPU b's
        torch.cuda.synchronize()
        result.put(("read_ok", bool(torch.all(local == 1).item())))
        shared.copy_(torch.full((SIZE_BYTES,), 2, dtype=torch.uint8, device=f"cuda:{device}"))  # peer write
        torch.cuda.synchronize()
    except Exception as exc:  # the pair's failure, reported, never a traceback on the plugin's side
        result.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        done.set()


def check_pair(ctx: Any, a: int, b: int, timeout_s: float) -> dict[str, Any]:
    queue, done, result = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=producer, args=(a, queue, done, result), daemon=True),
             ctx.Process(target=consumer, args=(b, queue, done, result), daemon=True)]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    deadline = started + timeout_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [proc for proc in procs if proc.is_alive()]
    for proc in hung:
        proc.kill()
        proc.join(5)
    facts: dict[str, Any] = {}
    while not result.empty():
        key, value = result.get_nowait()
        facts[key] = value
    out: dict[str, Any] = {"kind": "pair", "gpus": [a, b], "seconds": round(time.monotonic() - started, 3),
                           "read_ok": facts.get("read_ok"), "write_ok": facts.get("write_ok"),
                           "error": facts.get("error"), "hang": bool(hung)}
    if hung:
        out["error"] = (f"no answer within {timeout_s:g} s "
                        f"({'producer' if procs[0] in hung else ''}{' and ' if len(hung) == 2 else ''}"
                        f"{'consumer' if procs[1] in hung else ''} killed)")
    for proc in procs:
        if not hung and proc.exitcode not in (0, None) and out["error"] is None:
            out["error"] = f"a worker process exited with code {proc.exitcode}"
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", required=True, help="physical GPU indexes, comma-separated")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per pair")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indexes as nvidia-smi's
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    try:
        torch = importlib.import_module("torch")
        multiprocessing = importlib.import_module("torch.multiprocessing")
    except ImportError as exc:
        emit(kind="error", error=f"{sys.executable} cannot import torch ({exc})")
        return 3
    emit(kind="versions", torch=str(torch.__version__), cuda=str(torch.version.cuda), python=sys.executable)
    ctx = multiprocessing.get_context("spawn")
    for i, j in itertools.combinations(range(len(gpus)), 2):
        pair = check_pair(ctx, i, j, args.timeout)
        pair["gpus"] = [gpus[i], gpus[j]]
        emit(**pair)
    emit(kind="done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
