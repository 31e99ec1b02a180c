"""Worker, run on the GPU host by the Python that has torch: an NCCL all-reduce over a TP group's GPUs.

Not imported by the plugin: :mod:`pytest_gpuready.host.gpu_workers` sends this file's text over
the host's connection and runs it (``python3 nccl_allreduce.py --gpus 0,1 --size-mb 256``), so
torch is imported only in this worker's processes.

One process per GPU (``spawn``), ``torch.distributed`` with the NCCL backend over TCP on
127.0.0.1, as vLLM's own sanity script does (docs/usage/troubleshooting.md, "Incorrect hardware/
driver"). Rank r fills a float32 tensor of ``--size-mb`` MB (256: NVSentinel's
``preflight-nccl-loopback`` ``TEST_SIZE_MB``) with r + 1; after one all-reduce every element
must be n(n+1)/2 (exact in float32), else the sum is wrong. Then warm-up and timed all-reduces
of the same tensor (zeroed, so it stays exact): the bus bandwidth as nccl-tests defines it for
all-reduce, ``busbw = algbw x 2(n-1)/n`` with ``algbw = bytes / time``
(NVIDIA/nccl-tests doc/PERFORMANCE.md). A group that does not finish within ``--timeout`` is a
hang: every rank is killed and the hang reported.

Output: ``@@gpuready {json}`` lines, read by :func:`pytest_gpuready.host.gpu_workers.parse_worker_output`.
"""

import argparse
import importlib
import json
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any


def emit(**fields: Any) -> None:
    sys.stdout.write("@@gpuready " + json.dumps(fields) + "\n")
    sys.stdout.flush()


def rank_main(rank: int, world: int, port: int, size_bytes: int, iters: int, timeout_s: float, result: Any) -> None:
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        tensor = torch.full((size_bytes // 4,), float(rank + 1), dtype=torch.float32, device=f"cuda:{rank}")
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        expected = world * (world + 1) / 2
        wrong = int((tensor != expected).sum().item())
        tensor.zero_()
        for _ in range(5):  # warm-up: NCCL builds its rings and channels on the first calls
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / iters
        wrong += int((tensor != 0).sum().item())
        if rank == 0:
            nccl = torch.cuda.nccl.version()
            result.put({"wrong_elements": wrong, "seconds_per_op": seconds,
                        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)})
        elif wrong:
            result.put({"rank": rank, "wrong_elements": wrong})
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", required=True, help="physical GPU indexes, comma-separated")
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole group")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    try:
        torch = importlib.import_module("torch")
        multiprocessing = importlib.import_module("torch.multiprocessing")
    except ImportError as exc:
        emit(kind="error", error=f"{sys.executable} cannot import torch ({exc})")
        return 3
    emit(kind="versions", torch=str(torch.__version__), cuda=str(torch.version.cuda), python=sys.executable)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    world = len(gpus)
    size_bytes = args.size_mb * 1000 * 1000
    procs = [ctx.Process(target=rank_main, args=(r, world, port, size_bytes, args.iters, args.timeout, result),
                         daemon=True) for r in range(world)]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    deadline = started + args.timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for rank in hung:
        procs[rank].kill()
        procs[rank].join(5)
    facts: dict[str, Any] = {}
    while not result.empty():
        item = result.get_nowait()
        if "rank" in item:
            facts["wrong_elements"] = facts.get("wrong_elements", 0) + item["wrong_elements"]
        else:
            item["wrong_elements"] += facts.get("wrong_elements", 0)
            facts.update(item)
    seconds = facts.get("seconds_per_op")
    algbw = size_bytes / seconds / 1e9 if seconds else None
    exit_codes = [proc.exitcode for proc in procs]
    emit(kind="allreduce", gpus=gpus, bytes=size_bytes, iters=args.iters, hang=bool(hung), hung_ranks=hung,
         exit_codes=exit_codes, wrong_elements=facts.get("wrong_elements"), seconds_per_op=seconds,
         algbw_gbps=algbw, busbw_gbps=algbw * 2 * (world - 1) / world if algbw else None,
         nccl=facts.get("nccl"), wall_s=round(time.monotonic() - started, 3))
    emit(kind="done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
