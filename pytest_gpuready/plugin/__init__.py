"""The pytest layer, and the pytest11 entry point (``gpuready``): it only names the modules that do the work.

- :mod:`pytest_gpuready.plugin.usage`: a misspelt option or ``-n`` without xdist, in one line;
- :mod:`pytest_gpuready.plugin.fleet`: per-host parametrization of host-bound tests (the hidden
  ``_gpuready_host`` fixture);
- :mod:`pytest_gpuready.plugin.xdist_groups`: the xdist hooks (registered only when xdist is
  installed), which run each host's tests on one worker;
- :mod:`pytest_gpuready.plugin.recording`: JUnit properties and report entries of the running
  test, carried on its TestReport (so through xdist);
- :mod:`pytest_gpuready.plugin.outcomes`: Verdict -> pass / fail / skip / error, and the hooks that
  keep a measured violation FAILED and a could-not-measure ERROR in every phase;
- :mod:`pytest_gpuready.plugin.host_fixtures`: host options, ``gpu_host``, ``gpu_snapshot``,
  ``gpus_clean``, ``shm_clean``, the report header;
- :mod:`pytest_gpuready.plugin.health_fixtures`: the ``gpu_health`` fixture and marker;
- :mod:`pytest_gpuready.plugin.two_gpu_fixtures`: the opt-in ``gpu_p2p`` and ``nccl_allreduce``
  fixtures and markers (a worker on the GPU host, ``--gpu-worker-python``);
- :mod:`pytest_gpuready.plugin.model_fixtures`: model options, ``model_spec``, deploy file,
  ``fp8_block_alignment``, ``mla_kv_backend_supported``, ``deployment`` markers;
- :mod:`pytest_gpuready.plugin.baseline_fixtures`: ``--gpuready-baseline`` and the comparison of
  ``benchmark_serving``'s levels with the stored ones (the file, the table, the export);
- :mod:`pytest_gpuready.plugin.server_fixtures`: ``vllm_server`` and ``benchmark_serving``;
- :mod:`pytest_gpuready.plugin.report_collector`: ``--gpuready-report``, ``--gpuready-plot``, the
  terminal summary; it runs where every test report arrives (the xdist controller).

Beside them: ``options`` (every option, declared once), ``markers`` (every marker, declared once as
a Python signature), ``settings`` (how an option is given and read, with its precedence), ``host_session`` (one
connection and snapshot cache per host, and the registry of hosts), ``outcomes`` (Verdict ->
pass / fail / skip / error), ``report`` (the header line), ``summary`` (per-host tables, failed
invariants), ``report_document`` and ``report.schema.json`` (the JSON report and its schema),
``snapshot_data`` (a snapshot as JSON data), ``plots`` (matplotlib, lazily), ``xdist_scheduler``.

May import: every layer below (``serve``, ``model``, ``host``, the ground floor) and pytest.
Nothing below imports this package.
"""

from __future__ import annotations

# In import order: a module listed here must not be imported by one listed before it (pytest marks
# each for assertion rewriting as it imports it, and warns about one already imported).
pytest_plugins = [
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
