"""The pytest11 entry point (``gpuready``): it only names the plugin modules that do the work.

- :mod:`pytest_gpuready.fixtures_host`: host options, ``gpu_host``, ``gpu_snapshot``,
  ``gpus_clean``, ``shm_clean``, report header and GPU summary table;
- :mod:`pytest_gpuready.fixtures_model`: model options, ``model_spec``, deploy file,
  ``fp8_block_alignment``, ``mla_kv_backend_supported``, ``deployment`` markers;
- :mod:`pytest_gpuready.fixtures_server`: ``vllm_server`` and ``benchmark_serving``.
"""

from __future__ import annotations

pytest_plugins = [
    "pytest_gpuready.fixtures_host",
    "pytest_gpuready.fixtures_model",
    "pytest_gpuready.fixtures_server",
]
