"""``--gpuready-plot DIR``: PNGs a person reads at a glance, drawn from the JSON report's document.

- ``throughput.png``: output tokens/s (log axis, each required minimum drawn) and mean TTFT (p99
  dashed) against concurrency, one line per deployment and host; with ``--gpuready-baseline``, the
  baseline's rounds as a band behind the current points (its lowest to highest round, its median
  dotted) on the throughput side;
- ``gpu-memory.png``: each GPU's memory, stacked: weights, KV cache, other, free (GiB). A GPU a
  server of the run used gets vLLM's own split (``Model loading took X GiB``, ``Available KV cache
  memory``; other = what the driver showed used beyond those); any other GPU of a probed host
  shows used and free from its last snapshot.

matplotlib is the ``plot`` extra, imported here only (the Agg backend: no display needed). Each
function returns the files it wrote; a plot with nothing to show is not written.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpuready.outputs import check_output, write_output

MIB_PER_GIB = 1024


NOTHING_TO_PLOT = ("nothing to plot: the run ran no benchmark_serving, started no server and probed no "
                   "host's GPUs")
"""What ``--gpuready-plot`` says when :func:`save_plots` wrote nothing."""


def save_plots(document: Mapping[str, Any], directory: Path) -> list[Path]:
    """Write every plot the document has data for into ``directory``; return their paths.

    ``directory`` was judged by :func:`~pytest_gpuready.outputs.check_output_folder` at configure
    time; each PNG is written whole or not at all (:func:`save_figure`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in (plot_throughput, plot_gpu_memory):
        path = plot(document, directory)
        if path is not None:
            written.append(path)
    return written


def save_figure(fig: Any, path: Path) -> None:
    """Render ``fig`` to PNG in memory, then write it as every plugin output is written
    (:mod:`pytest_gpuready.outputs`: a unique temporary file renamed over a new or regular file)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    write_output(check_output(str(path), what="plot"), buffer.getvalue())


def require_matplotlib() -> None:
    """Raise ImportError unless the ``plot`` extra is installed (asked before any test runs)."""
    import matplotlib  # noqa: F401


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def baseline_band(benchmarks: Sequence[Mapping[str, Any]]) -> dict[int, tuple[float, float, float]]:
    """Concurrency -> (lowest, median, highest) output tok/s over the baseline's rounds."""
    band: dict[int, tuple[float, float, float]] = {}
    for bench in benchmarks:
        for level in (bench.get("comparison") or {}).get("levels") or []:
            rounds = sorted((level.get("baseline_samples") or {}).get("output_tok_s") or [])
            if rounds:
                middle = rounds[len(rounds) // 2] if len(rounds) % 2 else (rounds[len(rounds) // 2 - 1] +
                                                                           rounds[len(rounds) // 2]) / 2
                band[int(level["concurrency"])] = (float(rounds[0]), float(middle), float(rounds[-1]))
    return band


@dataclass(frozen=True)
class Threshold:
    """A ``min_output_tok_s`` a test required of a series at one concurrency, and whether it held."""

    label: str
    concurrency: int
    min_tok_s: float
    ok: bool


def throughput_thresholds(document: Mapping[str, Any]) -> list[Threshold]:
    """Every output-throughput threshold of the run (``checks`` entries), on the series of the
    benchmark its test ran (matched by test and host)."""
    label_of = {(b.get("test"), b.get("host")): f"{b.get('server')} @ {b.get('host') or 'local'}"
                for b in document.get("benchmarks") or []}
    found = []
    for check in document.get("checks") or []:
        evidence = check.get("evidence") or {}
        label = label_of.get((check.get("test"), check.get("host")))
        if label is None or "min_output_tok_s" not in evidence or "concurrency" not in evidence:
            continue
        found.append(Threshold(label, int(evidence["concurrency"]), float(evidence["min_output_tok_s"]),
                               bool(check.get("ok"))))
    return found


def plot_throughput(document: Mapping[str, Any], directory: Path) -> Path | None:
    """``throughput.png`` in ``directory`` (see :func:`throughput_figure`); None with no benchmark."""
    fig = throughput_figure(document)
    if fig is None:
        return None
    path = directory / "throughput.png"
    save_figure(fig, path)
    _pyplot().close(fig)
    return path


def throughput_figure(document: Mapping[str, Any]) -> Any:
    """Output tok/s and TTFT against concurrency, a line per (deployment, host); None without data.

    Throughput is on a log axis (a failing 77 tok/s point next to 19,333 must not sit on zero), and
    each required ``min_output_tok_s`` is drawn where it applies: a bar in the series' colour,
    a red cross through it where the measurement fell short. With a baseline comparison, the
    baseline's rounds are a band behind the series (lowest to highest round, the median dotted).
    """
    series: dict[str, list[Mapping[str, Any]]] = {}
    benches: dict[str, list[Mapping[str, Any]]] = {}
    for bench in document.get("benchmarks") or []:
        label = f"{bench.get('server')} @ {bench.get('host') or 'local'}"
        series.setdefault(label, []).extend(bench.get("levels") or [])
        benches.setdefault(label, []).append(bench)
    if not series:
        return None
    thresholds = throughput_thresholds(document)
    plt = _pyplot()
    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100, constrained_layout=True)
    levels_seen: set[int] = set()
    for index, (label, levels) in enumerate(sorted(series.items())):
        points = sorted(levels, key=lambda level: int(level["max_concurrency"]))
        x = [int(p["max_concurrency"]) for p in points]
        levels_seen.update(x)
        colour = f"C{index % 10}"
        band = baseline_band(benches[label])
        if band:
            shown = sorted(band)
            tput.fill_between(shown, [band[c][0] for c in shown], [band[c][2] for c in shown], color=colour,
                              alpha=0.18, linewidth=0, label=f"{label}, baseline rounds")
            tput.plot(shown, [band[c][1] for c in shown], linestyle=":", color=colour,
                      label=f"{label}, baseline median")
        tput.plot(x, [float(p["output_throughput"]) for p in points], marker="o", color=colour, label=label)
        required = [th for th in thresholds if th.label == label]
        if required:
            tput.scatter([th.concurrency for th in required], [th.min_tok_s for th in required], marker="_",
                         s=500, linewidths=2.5, color=colour, zorder=3, label=f"{label}, required min")
            missed = [th for th in required if not th.ok]
            if missed:
                tput.scatter([th.concurrency for th in missed], [th.min_tok_s for th in missed], marker="x",
                             s=80, color="red", zorder=4, label=f"{label}, below the required min")
        ttft.plot(x, [float(p["mean_ttft_ms"]) for p in points], marker="o", color=colour, label=f"{label}, mean")
        if all("p99_ttft_ms" in p for p in points):
            ttft.plot(x, [float(p["p99_ttft_ms"]) for p in points], marker="x", linestyle="--", color=colour,
                      label=f"{label}, p99")
    ticks = sorted(levels_seen)
    for axes, title, ylabel in ((tput, "Output throughput", "output tokens/s"),
                                (ttft, "Time to first token", "TTFT (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [str(t) for t in ticks])
        axes.minorticks_off()
        axes.set_xlabel("concurrency (requests in flight)")
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        if axes is tput:
            axes.set_yscale("log")
        else:
            axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
    tokens = sorted({(b.get("prompt_tokens"), b.get("output_tokens")) for b in document.get("benchmarks") or []})
    workload = "; ".join(f"{p} prompt + {o} output tokens" for p, o in tokens)
    fig.suptitle(f"Serving benchmark ({workload})")
    return fig


@dataclass(frozen=True)
class GpuBar:
    """One bar of the memory plot: a GPU of a host, in MiB per category."""

    host: str
    gpu: str
    group: str
    """The bars of one group stand together: a server's GPUs, or the other GPUs of a host."""
    weights: float
    kv_cache: float
    other: float
    free: float


def _server_bars(server: Mapping[str, Any]) -> list[GpuBar]:
    footprint = server.get("footprint") or {}
    used: Mapping[str, int] = footprint.get("gpu_memory_mib") or {}
    totals: Mapping[str, int] = footprint.get("gpu_total_mib") or {}
    if not used:
        return []
    log = footprint.get("log") or {}
    weights: Sequence[float] = log.get("weights_gib") or []
    kv: Sequence[float] = log.get("available_kv_cache_gib") or []
    spec = server.get("spec") or {}
    name = str(spec.get("served_model_name") or spec.get("model") or "server")
    host = str(server.get("host") or "local")
    bars = []
    for rank, index in enumerate(sorted(used, key=int)):
        w = float(weights[min(rank, len(weights) - 1)]) * MIB_PER_GIB if weights else 0.0
        k = float(kv[min(rank, len(kv) - 1)]) * MIB_PER_GIB if kv else 0.0
        shown = float(used[index])
        total = float(totals.get(index, shown))
        bars.append(GpuBar(host, str(index), f"{host}\n{name}", w, k, max(0.0, shown - w - k),
                           max(0.0, total - max(shown, w + k))))
    return bars


def _snapshot_bars(host: Mapping[str, Any], taken: set[tuple[str, str]]) -> list[GpuBar]:
    snapshot = host.get("snapshot") or {}
    name = str(host.get("name"))
    bars = []
    for gpu in snapshot.get("gpus") or []:
        if (name, str(gpu.get("index"))) in taken:
            continue
        used = float(gpu.get("memory_used_mib") or 0)
        total = float(gpu.get("memory_total_mib") or 0)
        bars.append(GpuBar(name, str(gpu.get("index")), name, 0.0, 0.0, used, max(0.0, total - used)))
    return bars


def memory_bars(document: Mapping[str, Any]) -> list[GpuBar]:
    """The bars of the memory plot: servers' GPUs with vLLM's split, then other probed GPUs."""
    bars: list[GpuBar] = []
    taken: set[tuple[str, str]] = set()
    for server in document.get("servers") or []:
        bars += _server_bars(server)
        for index in (server.get("footprint") or {}).get("gpu_memory_mib") or {}:
            taken.add((str(server.get("host") or "local"), str(index)))
    for host in document.get("hosts") or []:
        bars += _snapshot_bars(host, taken)
    return bars


_CATEGORIES = (("weights", "weights (vLLM: Model loading took)"), ("kv_cache", "KV cache (vLLM: Available KV cache)"),
               ("other", "other used (CUDA context, activations, other processes)"), ("free", "free"))
_COLOUR_OF = {"weights": "#4c72b0", "kv_cache": "#55a868", "other": "#c44e52", "free": "#dddddd"}


def plot_gpu_memory(document: Mapping[str, Any], directory: Path) -> Path | None:
    """Stacked bars per GPU, grouped by server and host: weights, KV cache, other, free (GiB)."""
    bars = memory_bars(document)
    if not bars:
        return None
    plt = _pyplot()
    from matplotlib.transforms import blended_transform_factory

    positions: list[float] = []
    groups: list[tuple[str, float, float]] = []  # label, first x, last x
    x = 0.0
    for index, item in enumerate(bars):
        if index and item.group != bars[index - 1].group:
            x += 0.8  # a gap between groups
        positions.append(x)
        if groups and groups[-1][0] == item.group and index and bars[index - 1].group == item.group:
            groups[-1] = (item.group, groups[-1][1], x)
        else:
            groups.append((item.group, x, x))
        x += 1.0
    width = max(10.0, min(26.0, 0.75 * x + 6.5))  # the legend takes about 4 inches on the right
    fig, axes = plt.subplots(figsize=(width, 5.6), dpi=100, constrained_layout=True)
    bottom = [0.0] * len(bars)
    for key, label in _CATEGORIES:
        gib = [getattr(b, key) / MIB_PER_GIB for b in bars]
        axes.bar(positions, gib, width=0.8, bottom=bottom, color=_COLOUR_OF[key], edgecolor="#555555",
                 linewidth=0.5, label=label)
        bottom = [b + g for b, g in zip(bottom, gib, strict=True)]
    axes.set_xticks(positions, [f"GPU {b.gpu}" for b in bars], fontsize="small")
    below = blended_transform_factory(axes.transData, axes.transAxes)
    for label, first, last in groups:
        axes.text((first + last) / 2, -0.07, label, transform=below, ha="center", va="top", fontsize="small")
    lines_below = max(label.count("\n") + 1 for label, _, _ in groups)
    axes.set_xlim(-0.7, x - 0.3)
    axes.set_xlabel("GPU, by host (and server)", labelpad=8 + 12 * lines_below)
    axes.set_ylabel("GPU memory (GiB)")
    axes.set_title("GPU memory per GPU (stacked): weights, KV cache, other, free")
    axes.grid(True, axis="y", alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    path = directory / "gpu-memory.png"
    save_figure(fig, path)
    plt.close(fig)
    return path
