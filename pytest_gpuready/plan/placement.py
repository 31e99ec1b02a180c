"""Which GPUs a layout takes, and whether the GPUs that talk most stay close together.

vLLM numbers the ranks of one engine ``pp_rank x TP + tp_rank`` and gives DP rank ``r`` the
``r``-th block of TP x PP GPUs of ``CUDA_VISIBLE_DEVICES`` (``get_physical_gpu_ids_for_local_dp_rank``,
``vllm/v1/engine/utils.py``), so the order of the GPU list decides which GPUs form each group.

The groups that carry the traffic of every layer are the TP groups (an all-reduce per layer);
in a MoE model under data parallelism the MoE layers of each pipeline stage also span all DP
engines (their experts are split over TP x DP ranks, ``FusedMoEParallelConfig.make``), so that
TP x DP group is the one that must stay local. Pipeline stages pass only the hidden state.

:func:`place` puts the whole layout on the lowest NUMA node with room for it, else fills the
nodes group by group (the lowest node with room for a whole group, its lowest GPUs first), so a
group crosses nodes only where no node has room for it;
:func:`locality` names the worst link inside any group.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.serve_args import Layout

LOCALITY_ORDER = ("one GPU", "NVLink", "one PCIe switch", "one NUMA node", "unknown", "crosses NUMA")
"""Best first; a layout is as good as its worst group."""
LOCAL = frozenset(LOCALITY_ORDER[:4])
PCIE_SWITCH_LINKS = frozenset({"PIX", "PXB"})
"""``nvidia-smi topo -m``: at most one PCIe bridge, or several without the host bridge."""


def rank_groups(layout: Layout, moe_spans_dp: bool) -> list[list[int]]:
    """The rank positions (indexes into the GPU list) of each group that must stay local."""
    world = layout.world_size
    if moe_spans_dp and layout.dp > 1:
        return [[r * world + s * layout.tp + t for r in range(layout.dp) for t in range(layout.tp)]
                for s in range(layout.pp)]
    return [[r * world + s * layout.tp + t for t in range(layout.tp)]
            for r in range(layout.dp) for s in range(layout.pp)]


def place(snapshot: HostSnapshot, layout: Layout, ids: Sequence[int], moe_spans_dp: bool) -> tuple[int, ...]:
    """The GPUs of ``layout`` in ``CUDA_VISIBLE_DEVICES`` order: each group on one NUMA node
    where one has room for it, the lowest nodes and GPUs first."""
    numa = snapshot.topology.numa_affinity if snapshot.topology else {}
    free: dict[int | None, list[int]] = {}
    for index in sorted(ids):
        free.setdefault(numa.get(index), []).append(index)
    nodes = sorted(free, key=lambda node: (node is None, node or 0))
    whole = next((n for n in nodes if n is not None and len(free[n]) >= layout.total_gpus), None)
    if whole is not None:
        return tuple(free[whole][:layout.total_gpus])
    slots: dict[int, int] = {}
    for group in rank_groups(layout, moe_spans_dp):
        home = next((n for n in nodes if n is not None and len(free[n]) >= len(group)), None)
        for position in group:
            pool = free[home] if home is not None else min(
                (free[n] for n in nodes if free[n]), key=lambda members: members[0])
            slots[position] = pool.pop(0)
    return tuple(slots[p] for p in range(layout.total_gpus))


def _group_locality(snapshot: HostSnapshot, gpus: Sequence[int]) -> str:
    if len(gpus) == 1:
        return "one GPU"
    topology = snapshot.topology
    if topology is None:
        return "unknown"
    links = [topology.link(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    if all(link is not None and link.startswith("NV") for link in links):
        return "NVLink"
    if all(link is not None and (link.startswith("NV") or link in PCIE_SWITCH_LINKS) for link in links):
        return "one PCIe switch"
    nodes = {topology.numa_affinity.get(g) for g in gpus}
    if None in nodes:
        return "unknown"
    return "one NUMA node" if len(nodes) == 1 else "crosses NUMA"


def locality(snapshot: HostSnapshot, layout: Layout, gpus: Sequence[int], moe_spans_dp: bool) -> str:
    """The worst locality of any group of the placed layout (:data:`LOCALITY_ORDER`)."""
    found = [_group_locality(snapshot, [gpus[p] for p in group]) for group in rank_groups(layout, moe_spans_dp)]
    return max(found, key=LOCALITY_ORDER.index)


def gpu_list_text(gpus: Sequence[int]) -> str:
    """``0-3``, ``0-7``, ``0,2,4,6``: ascending runs of three or more shortened, order kept."""
    parts: list[str] = []
    run: list[int] = []
    for index in gpus:
        if run and index == run[-1] + 1:
            run.append(index)
            continue
        parts.extend(_run_text(run))
        run = [index]
    parts.extend(_run_text(run))
    return ",".join(parts)


def _run_text(run: list[int]) -> list[str]:
    if len(run) >= 3:
        return [f"{run[0]}-{run[-1]}"]
    return [str(i) for i in run]
