"""Every layout of a model on a host's GPUs, judged by every vLLM load rule and the memory model.

Pure: a :class:`~pytest_gpuready.model.spec.ModelSpec` (read from a checkpoint or a config-only
directory) and a :class:`~pytest_gpuready.host.snapshot.HostSnapshot` (probed, or built from a
preset) in, :class:`LayoutRow` s out, sorted best first: works, then undecided, then fails; the
groups that talk most stay on one NUMA node (or PCIe switch, or NVLink); TP before PP; the most KV
tokens; the fewest GPUs.

Each row is one :class:`~pytest_gpuready.model.serve_args.ServeArgs` (the engine settings given,
with the row's TP, PP, DP, EP and KV dtype) judged by
:func:`~pytest_gpuready.model.rules.check_deployment`, the same call the suite and the markers
make: world size against the visible GPUs, TP divisibility in vLLM's order, EP, the
quantization's minimum capability, FP8 blocks, the attention backend, Marlin's tiles, and memory
fit on the row's GPUs, each verdict kept. The reason a row does not work is the failure vLLM
would raise first (``evidence["vllm_stage"]``, which every rule records). A rule that cannot
decide without the GPU's compute capability leaves the row *undecided*, never working. The row's
command line is :meth:`ServeArgs.argv`, the one the launch uses.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.backends import MIN_FP8_CAPABILITY
from pytest_gpuready.model.checks import GIB, effective_kv_cache_dtype
from pytest_gpuready.model.rules import DeploymentCheck, check_deployment
from pytest_gpuready.model.rules.common import stage_of
from pytest_gpuready.model.rules.marlin import is_fp8_weights
from pytest_gpuready.model.serve_args import Layout, ServeArgs
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.model.vllm_version import VllmVersion
from pytest_gpuready.plan.placement import LOCAL, locality, place
from pytest_gpuready.verdict import Verdict

CHECKS: Mapping[str, str] = {
    "world": "world_size",
    "tp": "tensor_parallel",
    "ep": "expert_parallel",
    "quant": "quantization_capability",
    "fp8": "fp8_block_alignment",
    "attn": "attention_backend",
    "marlin": "marlin_fp8_tiles",
    "memory": "memory",
}
"""Column name -> the rule (``RULES`` key of :mod:`pytest_gpuready.model.rules`), in table order."""

WORKS, UNDECIDED, FAILS = "works", "undecided", "fails"


def applies(check: str, model: ModelSpec, layout: Layout, capability: tuple[int, int] | None) -> bool:
    """Whether the check has anything to judge for this row (``-`` in the table otherwise)."""
    quant = model.quantization
    return {
        "ep": layout.ep,
        "quant": quant is not None,
        "fp8": quant is not None and quant.is_fp8_block,
        "attn": model.is_mla,
        "marlin": is_fp8_weights(model) and (capability is None or capability < MIN_FP8_CAPABILITY),
    }.get(check, True)


@dataclass(frozen=True)
class LayoutRow:
    """One layout on its GPUs, with every check's verdict."""

    args: ServeArgs
    """The row's serve arguments: the engine settings planned for, with this row's layout."""
    gpus: tuple[int, ...]
    """In ``CUDA_VISIBLE_DEVICES`` order: DP rank r takes the r-th TP x PP block."""
    rules: DeploymentCheck
    """Every rule's verdict, memory fit included (``rules.verdicts["memory"]``)."""
    locality: str
    """The worst group's: ``one GPU``, ``NVLink``, ``one PCIe switch``, ``one NUMA node``,
    ``unknown`` or ``crosses NUMA`` (see :mod:`pytest_gpuready.plan.placement`)."""
    command: str
    capability: tuple[int, int] | None
    not_applicable: frozenset[str] = frozenset()
    alike: tuple[Layout, ...] = ()
    """Other layouts whose rows came out identical in every column (folded into this one)."""

    @property
    def layout(self) -> Layout:
        """TP, PP, DP, EP and the KV dtype alone (what the row's name shows, and what folds)."""
        return self.args.layout_only()

    @property
    def memory(self) -> Verdict:
        return self.rules.verdicts["memory"]

    @property
    def verdicts(self) -> dict[str, Verdict]:
        """Each column's verdict (:data:`CHECKS` order)."""
        return {column: self.rules.verdicts[rule] for column, rule in CHECKS.items() if rule in self.rules.verdicts}

    def word(self, check: str) -> str:
        """``ok``, ``warn``, ``FAIL``, ``?`` (undecided) or ``-`` (nothing to judge)."""
        verdict = self.verdicts.get(check)
        if verdict is None:
            return "-"
        if verdict.needs is not None:
            return "?"
        if not verdict.ok:
            return "FAIL"
        if check in self.not_applicable:
            return "-"
        return "warn" if verdict.warnings else "ok"

    @property
    def failures(self) -> list[tuple[str, Verdict]]:
        """Failed (not undecided) verdicts in the order vLLM would meet them."""
        failed = [(c, v) for c, v in self.verdicts.items() if not v.ok and v.needs is None]
        return sorted(failed, key=lambda item: stage_of(item[1]))

    @property
    def pending(self) -> list[tuple[str, Verdict]]:
        return [(c, v) for c, v in self.verdicts.items() if v.needs is not None]

    @property
    def status(self) -> str:
        """``works``, ``undecided`` (nothing failed, something could not be decided) or ``fails``."""
        if self.failures:
            return FAILS
        return UNDECIDED if self.pending else WORKS

    @property
    def ok(self) -> bool:
        return self.status == WORKS

    @property
    def numa_local(self) -> bool:
        return self.locality in LOCAL

    @property
    def first_failure(self) -> str | None:
        """``check: vLLM's words`` for the failure vLLM would raise first."""
        failures = self.failures
        return f"{failures[0][0]}: {failures[0][1].summary}" if failures else None

    @property
    def reason(self) -> str:
        """Why the row does not work: the first failure, else what the undecided checks need."""
        first = self.first_failure
        if first is not None:
            return first
        pending = self.pending
        if not pending:
            return ""
        checks = ", ".join(c for c, _ in pending)
        return f"undecided ({checks}): needs {pending[0][1].needs}"

    def memory_figure(self, key: str) -> float | None:
        value = self.memory.evidence.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens of one engine (what vLLM logs as ``GPU KV cache size``)."""
        return int(self.memory_figure("kv_cache_tokens") or 0)

    @property
    def layouts(self) -> tuple[Layout, ...]:
        return (self.layout, *self.alike)


MAX_PLAN_GPUS = 64
"""The most GPUs one plan spans: the largest single-host layout is 8 x 8, and vLLM over more GPUs is
a multi-node deployment, which the planner does not model. A probed host listing more (a garbled
or hostile nvidia-smi: 10,000 rows) is planned on its first 64, and the plan says so
(:func:`planned_gpus`); the presets (``--gpus``) refuse more."""


def planned_gpus(snapshot: HostSnapshot, gpu_ids: Sequence[int] | None = None) -> tuple[list[int], str | None]:
    """The GPU indexes a plan enumerates layouts over (at most :data:`MAX_PLAN_GPUS`), and a line
    saying what was cut, or None when nothing was."""
    present = sorted(snapshot.require_gpus(), key=lambda g: g.index)
    ids = [g.index for g in present if gpu_ids is None or g.index in gpu_ids]
    if len(ids) <= MAX_PLAN_GPUS:
        return ids, None
    kept = ids[:MAX_PLAN_GPUS]
    return kept, (f"cut: {snapshot.host} lists {len(ids)} GPUs; planned on the first {MAX_PLAN_GPUS} "
                  f"(GPU {kept[0]}-{kept[-1]}); layouts of more than {MAX_PLAN_GPUS} GPUs are "
                  "multi-node and not enumerated")


def _sizes(count: int) -> list[int]:
    """TP / PP sizes worth a row on ``count`` GPUs: the powers of two, and every divisor of the
    count (TP=3 and 6 on six GPUs, 5 and 10 on ten), whose failures (heads, vocab, widths not
    divisible) vLLM raises as it does for any size."""
    return sorted({n for n in (1, 2, 4, 8, 16, 32, 64) if n <= count}
                  | {n for n in range(1, count + 1) if count % n == 0})


def _dp_sizes(count: int) -> list[int]:
    """Powers of two, and every GPU used (DP=3 of TP=2 on six GPUs)."""
    return sorted({*_sizes(count), count}) if count >= 1 else []


def kv_choices(model: ModelSpec, capability: tuple[int, int] | None, version: VllmVersion | None) -> list[str]:
    """``auto``, plus ``fp8`` where the GPU has native FP8, or ``bfloat16`` where ``auto`` means FP8."""
    choices = ["auto"]
    auto_kv = effective_kv_cache_dtype(model, "auto", version)
    if capability is not None and capability >= MIN_FP8_CAPABILITY and not auto_kv.is_fp8:
        choices.append("fp8")
    if auto_kv.is_fp8:
        choices.append("bfloat16")
    return choices


def layouts_for(model: ModelSpec, count: int, capability: tuple[int, int] | None,
                version: VllmVersion | None, kv_cache_dtypes: Sequence[str] | None = None) -> list[Layout]:
    """Every DP x TP x PP <= ``count`` (TP and PP powers of two or divisors of the count), EP where
    the model is MoE and TP x DP > 1, each KV dtype of ``kv_cache_dtypes`` (default :func:`kv_choices`)."""
    kvs = list(kv_cache_dtypes) if kv_cache_dtypes else kv_choices(model, capability, version)
    result = []
    for tp in _sizes(count):
        for pp in _sizes(count // tp):
            if pp > 1 and pp > model.num_layers:
                continue
            for dp in _dp_sizes(count // (tp * pp)):
                for ep in ((False, True) if model.is_moe and tp * dp > 1 else (False,)):
                    for kv in kvs:
                        result.append(Layout(tp=tp, pp=pp, dp=dp, ep=ep, kv_cache_dtype=kv))
    return result


def serve_command(model_path: str, args: ServeArgs, gpus: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES=... vllm serve MODEL`` and :meth:`ServeArgs.argv`: the row's command."""
    visible = f"CUDA_VISIBLE_DEVICES={','.join(str(g) for g in gpus)} "
    return visible + "vllm serve " + shlex.join([model_path, *args.argv()])


def _capability_of(snapshot: HostSnapshot, gpus: Sequence[int],
                   override: tuple[int, int] | None) -> tuple[int, int] | None:
    """The lowest compute capability among the row's GPUs; None when any is unknown."""
    if override is not None:
        return override
    found = [snapshot.gpu(i).compute_capability for i in gpus]
    if any(c is None for c in found):
        return None
    return min(c for c in found if c is not None)


def judge(model: ModelSpec, snapshot: HostSnapshot, args: ServeArgs, ids: Sequence[int], *, model_path: str,
          vllm_version: VllmVersion | None, capability: tuple[int, int] | None = None,
          allow_long_max_model_len: bool = False) -> LayoutRow:
    """One row: place the layout, run every rule (memory fit included) on its GPUs."""
    moe_spans_dp = model.is_moe
    gpus = place(snapshot, args, ids, moe_spans_dp)
    cap = _capability_of(snapshot, gpus, capability)
    rules = check_deployment(model, args, cap, vllm_version, visible_gpus=len(ids), snapshot=snapshot, gpus=gpus,
                             allow_long_max_model_len=allow_long_max_model_len)
    not_applicable = frozenset(c for c in CHECKS if not applies(c, model, args, cap))
    return LayoutRow(args, gpus, rules, locality(snapshot, args, gpus, moe_spans_dp),
                     serve_command(model_path, args, gpus), cap, not_applicable)


def sort_key(row: LayoutRow) -> tuple[int, bool, bool, int, int]:
    """Works, then undecided, then fails; local groups; TP before PP (pipeline bubbles); most KV
    tokens; fewest GPUs."""
    status = (WORKS, UNDECIDED, FAILS).index(row.status)
    return (status, not row.numa_local, row.layout.pp > 1, -row.kv_tokens, row.layout.total_gpus)


def figures(row: LayoutRow) -> tuple[str, str, str, str]:
    """The memory cells as the table shows them: weights and KV cache per GPU, KV tokens, concurrency."""
    weights = row.memory_figure("weights_per_gpu_bytes")
    kv = row.memory_figure("kv_cache_bytes")
    concurrency = row.memory_figure("max_concurrency")
    return (f"{weights / GIB:.1f} GiB" if weights is not None else "-",
            f"{kv / GIB:.1f} GiB" if kv is not None else "-",
            f"{row.kv_tokens:,}" if row.kv_tokens else "-",
            f"{concurrency:.2f}x" if concurrency else "-")


def fingerprint(row: LayoutRow) -> tuple[object, ...]:
    """Everything a table row shows except the layout itself: rows with equal fingerprints (and
    the same TP, PP and DP) are folded into one. ``-`` counts as ``ok`` (an EP twin differs only
    in that the EP rule has something to judge)."""
    words = tuple("ok" if row.word(c) == "-" else row.word(c) for c in CHECKS)
    reason = row.reason
    for name in (row.layout.describe(), Layout(tp=row.layout.tp, pp=row.layout.pp, dp=row.layout.dp).describe()):
        reason = reason.replace(name, "<layout>")
    return (words, figures(row), row.gpus, row.locality, reason)


def collapse(rows: Sequence[LayoutRow]) -> list[LayoutRow]:
    """Fold rows that differ only in EP or KV dtype but are identical in every column into the
    first of them (in sort order), which lists the others in ``alike``."""
    kept: list[LayoutRow] = []
    index: dict[tuple[object, ...], int] = {}
    for row in rows:
        key = (row.layout.tp, row.layout.pp, row.layout.dp, fingerprint(row))
        if key in index:
            first = kept[index[key]]
            kept[index[key]] = replace(first, alike=(*first.alike, row.layout),
                                       not_applicable=first.not_applicable & row.not_applicable)
            continue
        index[key] = len(kept)
        kept.append(row)
    return kept


def plan_layouts(
    model: ModelSpec,
    snapshot: HostSnapshot,
    *,
    model_path: str,
    vllm_version: VllmVersion | None = None,
    serve: ServeArgs | None = None,
    gpu_ids: Sequence[int] | None = None,
    capability: tuple[int, int] | None = None,
    allow_long_max_model_len: bool = False,
    fold: bool = True,
    kv_cache_dtypes: Sequence[str] | None = None,
) -> list[LayoutRow]:
    """Judge every layout of ``model`` on the snapshot's GPUs (at most :data:`MAX_PLAN_GPUS` of them,
    see :func:`planned_gpus`), best first: each row ``serve``'s engine settings with the row's
    layout; ``kv_cache_dtypes`` restricts the KV dtypes tried; ``capability`` overrides what the
    probe reports; ``fold=False`` keeps identical rows apart."""
    serve = serve or ServeArgs()
    ids, _ = planned_gpus(snapshot, gpu_ids)
    layout_capability = _capability_of(snapshot, ids, capability) if ids else capability
    rows = [judge(model, snapshot, serve.with_layout(layout), ids, model_path=model_path, vllm_version=vllm_version,
                  capability=capability, allow_long_max_model_len=allow_long_max_model_len)
            for layout in layouts_for(model, len(ids), layout_capability, vllm_version, kv_cache_dtypes)]
    rows.sort(key=sort_key)
    return collapse(rows) if fold else rows
