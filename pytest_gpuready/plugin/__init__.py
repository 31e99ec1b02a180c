"""The pytest layer, and the pytest11 entry point (``gpuready``): it only names the modules that do the work.

- :mod:`pytest_gpuready.plugin.host_fixtures`: host options, ``gpu_host``, ``gpu_snapshot``,
  ``gpus_clean``, ``shm_clean``, report header and GPU summary table;
- :mod:`pytest_gpuready.plugin.model_fixtures`: model options, ``model_spec``, deploy file,
  ``fp8_block_alignment``, ``mla_kv_backend_supported``, ``deployment`` markers;
- :mod:`pytest_gpuready.plugin.server_fixtures`: ``vllm_server`` and ``benchmark_serving``.

Beside them: ``settings`` (every option once, with its precedence), ``host_session`` (one
connection and snapshot cache per session), ``outcomes`` (Verdict -> pass / fail / skip /
error) and ``report`` (header and summary table).

May import: every layer below (``serve``, ``model``, ``host``, the ground floor) and pytest.
Nothing below imports this package.
"""

from __future__ import annotations

pytest_plugins = [
    "pytest_gpuready.plugin.host_fixtures",
    "pytest_gpuready.plugin.fleet",
    "pytest_gpuready.plugin.model_fixtures",
    "pytest_gpuready.plugin.server_fixtures",
]
