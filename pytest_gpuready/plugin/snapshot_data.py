"""A :class:`HostSnapshot` as plain JSON data, the form reports carry (through xdist, into the file).

The terminal summary and the plots read this form too, so they show the same thing whether the
snapshot was taken in this process or by an xdist worker.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pytest_gpuready.host.snapshot import HostSnapshot

MAX_SHM_ENTRIES = 200
"""A report lists at most this many /dev/shm entries per host (the rest are counted): a /dev/shm
with thousands of files must not make a report of megabytes."""


def snapshot_to_dict(snapshot: HostSnapshot) -> dict[str, Any]:
    """Every field of the snapshot, JSON-ready (tuples as lists, dict keys as strings)."""
    shm = None
    if snapshot.shm is not None:
        entries = [asdict(entry) for entry in snapshot.shm.entries]
        shm = {
            "entries": entries[:MAX_SHM_ENTRIES],
            "entries_total": len(entries),
            "total_bytes": snapshot.shm.total_bytes,
            "free_bytes": snapshot.shm.free_bytes,
            "can_see_all_processes": snapshot.shm.can_see_all_processes,
        }
    topology = None
    if snapshot.topology is not None:
        topology = {
            "links": [asdict(link) for link in snapshot.topology.links],
            "cpu_affinity": {str(k): v for k, v in snapshot.topology.cpu_affinity.items()},
            "numa_affinity": {str(k): v for k, v in snapshot.topology.numa_affinity.items()},
        }
    return {
        "host": snapshot.host,
        "taken_at": snapshot.taken_at,
        "gpu_reader": snapshot.gpu_reader,
        "gpus": [_gpu(asdict(gpu)) for gpu in snapshot.gpus] if snapshot.gpus is not None else None,
        "processes": [asdict(process) for process in snapshot.processes],
        "shm": shm,
        "topology": topology,
        "vllm_version": snapshot.vllm_version,
        "errors": dict(snapshot.errors),
        "no_gpu_reason": snapshot.no_gpu_reason,
        "probe_duration_s": snapshot.probe_duration_s,
    }


def _gpu(data: dict[str, Any]) -> dict[str, Any]:
    capability = data.get("compute_capability")
    data["compute_capability"] = list(capability) if capability is not None else None
    return data
