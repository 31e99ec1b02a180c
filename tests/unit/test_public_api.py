"""The public API the issues promise is importable from the package root, with the promised defaults."""

from __future__ import annotations

import inspect

import pytest_gpuready


def test_promised_names_are_exported() -> None:
    promised = {
        "connect", "Host", "HostSnapshot", "GpuInfo", "GpuProcess", "ShmEntry", "Verdict",
        "check_gpus_clean", "check_shm_clean", "inspect_model", "ModelSpec", "check_fp8_block_alignment",
        "check_tp_divisibility", "check_mla_kv_backend", "kv_cache_bytes_per_token", "check_memory_fit",
        "check_topology",
    }
    assert promised <= set(pytest_gpuready.__all__)
    for name in pytest_gpuready.__all__:
        assert hasattr(pytest_gpuready, name), name


def test_check_gpus_clean_defaults() -> None:
    parameters = inspect.signature(pytest_gpuready.check_gpus_clean).parameters
    assert parameters["gpus"].default is None
    assert parameters["max_used_mib"].default == 64


def test_verdict_fields() -> None:
    verdict = pytest_gpuready.Verdict.failed("2 of 8 GPUs are not clean", details=("GPU 0: 1 MiB",),
                                             evidence={"gpus": [0]})
    assert not verdict
    assert (verdict.ok, verdict.summary, dict(verdict.evidence)) == (False, "2 of 8 GPUs are not clean", {"gpus": [0]})
    assert verdict.message == "2 of 8 GPUs are not clean\n  GPU 0: 1 MiB"


def test_every_lazy_export_is_in_all() -> None:
    assert set(pytest_gpuready._EXPORTS) == set(pytest_gpuready.__all__) - {"__version__"}


def test_fixture_annotation_types_are_exported() -> None:
    """What users annotate their fixtures and tests with comes from the root, not from module paths."""
    wanted = {"ServerFactory", "BenchmarkServing", "ServingBenchmark", "VLLMServer", "ServeSpec", "Footprint",
              "TeardownReport", "ReadyInfo", "HostSnapshot", "Host", "Verdict", "Deployment", "DeployConfig"}
    assert wanted <= set(pytest_gpuready.__all__)
    assert pytest_gpuready.ServerFactory.__module__ == "pytest_gpuready.plugin.server_fixtures"


def test_entry_point_is_the_plugin_package() -> None:
    """The pytest11 entry point ``gpuready`` names ``pytest_gpuready.plugin``, which only lists the fixture modules."""
    from importlib.metadata import entry_points

    points = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert points.get("gpuready") == "pytest_gpuready.plugin"
    import pytest_gpuready.plugin as plugin

    assert plugin.pytest_plugins == [
        "pytest_gpuready.plugin.usage",
        "pytest_gpuready.plugin.fleet",
        "pytest_gpuready.plugin.xdist_groups",
        "pytest_gpuready.plugin.recording",
        "pytest_gpuready.plugin.outcomes",
        "pytest_gpuready.plugin.host_fixtures",
        "pytest_gpuready.plugin.health_fixtures",
        "pytest_gpuready.plugin.two_gpu_fixtures",
        "pytest_gpuready.plugin.model_fixtures",
        "pytest_gpuready.plugin.baseline_fixtures",
        "pytest_gpuready.plugin.server_fixtures",
        "pytest_gpuready.plugin.report_collector",
    ]


def test_each_layer_says_what_it_holds_and_may_touch() -> None:
    import importlib

    for layer in ("host", "model", "serve", "plugin", "preflight"):
        doc = importlib.import_module(f"pytest_gpuready.{layer}").__doc__ or ""
        assert len(doc.splitlines()) >= 3, layer
    for layer in ("host", "model", "serve", "plugin"):
        doc = importlib.import_module(f"pytest_gpuready.{layer}").__doc__ or ""
        assert "May import" in doc, layer
