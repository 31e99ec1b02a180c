"""Every layout of a model on a host's GPUs, each judged by the model checks and the memory model.

Pure: a :class:`~pytest_gpuready.model.spec.ModelSpec` (read from a checkpoint or a config-only
directory) and a :class:`~pytest_gpuready.host.snapshot.HostSnapshot` (probed, or built from a
preset) in, :class:`LayoutRow` s out, sorted best first: every check passes, the TP group stays on
one NUMA node, then the most KV tokens.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.backends import MIN_FP8_CAPABILITY, format_arch
from pytest_gpuready.model.checks import (
    GIB,
    check_fp8_block_alignment,
    check_memory_fit,
    check_mla_kv_backend,
    check_tp_divisibility,
    effective_kv_cache_dtype,
)
from pytest_gpuready.model.deploy_config import Deployment, ServeArgs
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.verdict import Verdict

CHECKS = ("tp", "fp8", "mla", "memory")


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int = 1
    ep: bool = False
    kv_cache_dtype: str = "auto"

    def describe(self) -> str:
        text = f"TP={self.tp}" + (f" PP={self.pp}" if self.pp > 1 else "") + (" +EP" if self.ep else "")
        return text + ("" if self.kv_cache_dtype == "auto" else f" kv={self.kv_cache_dtype}")


@dataclass(frozen=True)
class LayoutRow:
    layout: Layout
    gpus: tuple[int, ...]
    verdicts: dict[str, Verdict | None]
    """Each check's verdict; None where it does not apply (MLA backend on a GQA model)."""
    locality: str
    """``NVLink``, ``one NUMA node``, ``crosses NUMA`` or ``unknown``."""
    replicas: int
    """How many copies of this layout the host's GPUs could run (data parallel)."""
    command: str

    @property
    def ok(self) -> bool:
        return all(v is None or v.ok for v in self.verdicts.values())

    @property
    def numa_local(self) -> bool:
        return self.locality in ("NVLink", "one NUMA node")

    def word(self, check: str) -> str:
        verdict = self.verdicts.get(check)
        if verdict is None:
            return "n/a"
        if not verdict.ok:
            return "FAIL"
        return "warn" if verdict.warnings else "ok"

    @property
    def first_failure(self) -> str | None:
        for check in CHECKS:
            verdict = self.verdicts.get(check)
            if verdict is not None and not verdict.ok:
                return f"{check}: {verdict.summary}"
        return None

    def memory_figure(self, key: str) -> float | None:
        verdict = self.verdicts.get("memory")
        value = verdict.evidence.get(key) if verdict is not None else None
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def kv_tokens(self) -> int:
        return int(self.memory_figure("kv_cache_tokens") or 0)


def _sizes(count: int) -> list[int]:
    return [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= count]


def _pick_gpus(snapshot: HostSnapshot, world: int, ids: Sequence[int]) -> tuple[int, ...]:
    """The lowest GPUs that stay on one NUMA node when ``world`` fits on one, else the lowest."""
    numa = snapshot.topology.numa_affinity if snapshot.topology else {}
    nodes: dict[int | None, list[int]] = {}
    for index in ids:
        nodes.setdefault(numa.get(index), []).append(index)
    for node, members in sorted(nodes.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        if node is not None and len(members) >= world:
            return tuple(members[:world])
    return tuple(list(ids)[:world])


def locality(snapshot: HostSnapshot, gpus: Sequence[int]) -> str:
    topology = snapshot.topology
    if topology is None or len(gpus) < 2:
        return "one GPU" if len(gpus) == 1 else "unknown"
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    links = [topology.link(a, b) for a, b in pairs]
    if links and all(link is not None and link.startswith("NV") for link in links):
        return "NVLink"
    nodes = {topology.numa_affinity.get(g) for g in gpus}
    if None in nodes:
        return "unknown"
    return "one NUMA node" if len(nodes) == 1 else "crosses NUMA"


def serve_command(model_path: str, layout: Layout, serve: ServeArgs, gpus: Sequence[int]) -> str:
    deployment = Deployment(name="plan", model=model_path, model_path=model_path, tp=layout.tp, pp=layout.pp,
                            gpus=tuple(gpus), ep=layout.ep, kv_cache_dtype=layout.kv_cache_dtype, serve=serve)
    visible = f"CUDA_VISIBLE_DEVICES={','.join(str(g) for g in gpus)} "
    return visible + "vllm serve " + shlex.join(deployment.vllm_args())


def layouts_for(model: ModelSpec, count: int, capability: tuple[int, int] | None,
                version: VllmVersion | None) -> list[Layout]:
    kv_choices = ["auto"]
    auto_kv = effective_kv_cache_dtype(model, "auto", version)
    if capability is not None and capability >= MIN_FP8_CAPABILITY and not auto_kv.is_fp8:
        kv_choices.append("fp8")
    if auto_kv.is_fp8:
        kv_choices.append("bfloat16")
    result = []
    for tp in _sizes(count):
        for pp in _sizes(count // tp):
            if pp > 1 and pp > model.num_layers:
                continue
            for ep in ((False, True) if model.is_moe and tp * pp > 1 else (False,)):
                for kv in kv_choices:
                    result.append(Layout(tp, pp, ep, kv))
    return result


def plan_layouts(
    model: ModelSpec,
    snapshot: HostSnapshot,
    *,
    model_path: str,
    vllm_version: VllmVersion | None = None,
    serve: ServeArgs | None = None,
    gpu_ids: Sequence[int] | None = None,
    allow_long_max_model_len: bool = False,
) -> list[LayoutRow]:
    """Judge every layout of ``model`` on the snapshot's GPUs and sort them best first."""
    serve = serve or ServeArgs()
    present = sorted(snapshot.require_gpus(), key=lambda g: g.index)
    ids = [g.index for g in present if gpu_ids is None or g.index in gpu_ids]
    capability = present[0].compute_capability if present else None
    arch = format_arch(capability) if capability else None
    rows = []
    for layout in layouts_for(model, len(ids), capability, vllm_version):
        world = layout.tp * layout.pp
        gpus = _pick_gpus(snapshot, world, ids)
        verdicts: dict[str, Verdict | None] = {
            "tp": check_tp_divisibility(model, layout.tp, ep=layout.ep),
            "fp8": check_fp8_block_alignment(model, layout.tp, layout.ep, vllm_version,
                                             compute_capability=capability),
            "mla": (check_mla_kv_backend(model, arch, layout.kv_cache_dtype, vllm_version)
                    if model.is_mla and arch else None),
            "memory": check_memory_fit(
                model, snapshot, layout.tp, gpus=gpus, gpu_memory_utilization=serve.gpu_memory_utilization,
                max_model_len=serve.max_model_len, max_num_seqs=serve.max_num_seqs,
                kv_cache_dtype=layout.kv_cache_dtype, vllm_version=vllm_version,
                pipeline_parallel_size=layout.pp, ep=layout.ep, dtype=serve.dtype,
                quantization=serve.quantization, enforce_eager=serve.enforce_eager,
                max_num_batched_tokens=serve.max_num_batched_tokens,
                allow_long_max_model_len=allow_long_max_model_len),
        }
        rows.append(LayoutRow(layout, gpus, verdicts, locality(snapshot, gpus), len(ids) // world,
                              serve_command(model_path, layout, serve, gpus)))
    # Best first: works, NUMA-local, TP before PP (pipeline bubbles), most KV tokens.
    rows.sort(key=lambda r: (not r.ok, not r.numa_local, r.layout.pp > 1, -r.kv_tokens, r.layout.tp * r.layout.pp))
    return rows


def format_table(rows: Sequence[LayoutRow], model: ModelSpec, host: str, rule_note: str) -> str:
    """The plan as text: one line per layout, then each layout's first failure and command."""
    header = (f"{'#':>2}  {'layout':<20} {'GPUs':<16} {'tp':<4} {'fp8':<4} {'mla':<4} {'mem':<4} "
              f"{'weights/GPU':>11} {'KV/GPU':>8} {'KV tokens':>11} {'conc.':>6}  {'locality':<14} dp")
    lines = [f"plan: {model.describe()} on {host}", rule_note, header]
    for number, row in enumerate(rows, 1):
        weights = row.memory_figure("weights_per_gpu_bytes")
        kv = row.memory_figure("kv_cache_bytes")
        concurrency = row.memory_figure("max_concurrency")
        gpus = ",".join(str(g) for g in row.gpus)
        lines.append(
            f"{number:>2}  {row.layout.describe():<20} {gpus:<16} {row.word('tp'):<4} {row.word('fp8'):<4} "
            f"{row.word('mla'):<4} {row.word('memory'):<4} "
            f"{(f'{weights / GIB:.1f} GiB' if weights is not None else '-'):>11} "
            f"{(f'{kv / GIB:.1f} GiB' if kv is not None else '-'):>8} "
            f"{(f'{row.kv_tokens:,}' if row.kv_tokens else '-'):>11} "
            f"{(f'{concurrency:.2f}x' if concurrency else '-'):>6}  {row.locality:<14} {row.replicas}")
    lines += ["", "does not work (first failure, in vLLM's words):"]
    for number, row in enumerate(rows, 1):
        if row.first_failure:
            lines.append(f"{number:>2}  {row.layout.describe()}: {row.first_failure}")
    working = [(n, r) for n, r in enumerate(rows, 1) if r.ok]
    lines += ["", f"the best {min(3, len(working))} that work:" if working else "no layout works"]
    for number, row in working[:3]:
        lines.append(f"{number:>2}  {row.command}")
    return "\n".join(lines)
