"""The plan as text: one line per layout, then why each one that does not work fails (in vLLM's
words), then the ``vllm serve`` commands of the best ones (or of every row, ``--commands``)."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_gpuready.model.serve_args import Layout
from pytest_gpuready.model.spec import ModelSpec
from pytest_gpuready.plan.placement import gpu_list_text
from pytest_gpuready.plan.planner import CHECKS, WORKS, LayoutRow, figures

LEGEND = ("checks: ok, warn (passes with a warning), FAIL, ? (undecided: needs the GPU's compute "
          "capability), - (nothing to judge); KV tokens and conc. per engine")
BEST = 3


def layout_label(row: LayoutRow) -> str:
    """The row's layout; ``TP=4±EP`` when the EP twin came out identical, ``KV auto/fp8`` when the
    KV dtypes did."""
    layouts = row.layouts
    eps = {layout.ep for layout in layouts}
    kvs = sorted({layout.kv_cache_dtype for layout in layouts}, key=lambda kv: (kv != "auto", kv))
    base = row.layout
    text = Layout(tp=base.tp, pp=base.pp, dp=base.dp, ep=eps == {True}).describe()
    if eps == {True, False}:
        text = text.replace(f"TP={base.tp}", f"TP={base.tp}±EP", 1)
    if kvs != ["auto"]:
        text += " KV " + "/".join(kvs)
    return text


def _width(texts: Sequence[str], minimum: int) -> int:
    return max([minimum, *(len(t) for t in texts)])


def format_table(rows: Sequence[LayoutRow], model: ModelSpec, host: str, rule_note: str, *,
                 all_commands: bool = False) -> str:
    """The plan as text (see the module doc)."""
    labels = [layout_label(r) for r in rows]
    gpus = [gpu_list_text(r.gpus) for r in rows]
    layout_w, gpus_w = _width(labels, 6), _width(gpus, 4)
    check_w = {c: max(4, len(c)) for c in CHECKS}
    header = (f"{'#':>2}  {'layout':<{layout_w}} {'GPUs':<{gpus_w}} {'verdict':<9} "
              + " ".join(f"{c:<{check_w[c]}}" for c in CHECKS)
              + f" {'weights/GPU':>11} {'KV/GPU':>8} {'KV tokens':>11} {'conc.':>7}  locality")
    lines = [f"plan: {model.describe()} on {host}", rule_note, LEGEND, header]
    for number, (row, label, where) in enumerate(zip(rows, labels, gpus, strict=True), 1):
        weights, kv, tokens, concurrency = figures(row)
        lines.append(f"{number:>2}  {label:<{layout_w}} {where:<{gpus_w}} {row.status:<9} "
                     + " ".join(f"{row.word(c):<{check_w[c]}}" for c in CHECKS)
                     + f" {weights:>11} {kv:>8} {tokens:>11} {concurrency:>7}  {row.locality}")
    failing = [(n, r, label) for n, (r, label) in enumerate(zip(rows, labels, strict=True), 1) if not r.ok]
    if failing:
        lines += ["", "does not work (the failure vLLM would raise first, in its words):"]
        lines += [f"{n:>2}  {label}: {r.reason}" for n, r, label in failing]
    working = [(n, r) for n, r in enumerate(rows, 1) if r.status == WORKS]
    if all_commands:
        lines += ["", "vllm serve, every row:"]
        lines += [f"{n:>2}  {r.command}" for n, r in enumerate(rows, 1)]
    elif working:
        lines += ["", f"the best {min(BEST, len(working))} that work (--commands for every row):"]
        lines += [f"{n:>2}  {r.command}" for n, r in working[:BEST]]
    if not working:
        undecided = sum(1 for r in rows if r.status != WORKS and not r.failures)
        lines += ["", "no layout is known to work" + (
            f"; {undecided} undecided: pass --gpu-arch SM (e.g. sm90) or --gpus NAME" if undecided else "")]
    return "\n".join(lines)
