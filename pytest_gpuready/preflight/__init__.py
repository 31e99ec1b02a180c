"""The built-in preflight suite: ``pytest --pyargs pytest_gpuready.preflight [--gpu-host HOST]``.

``test_host.py`` checks the host (GPUs clean, /dev/shm clean and roomy, topology);
``test_deployments.py`` checks each deployment of ``--gpuready-config`` (TP/EP divisibility,
FP8 block alignment, MLA KV-cache backend, memory fit). Every test carries the ``gpuready`` marker.

The top floor: it may import the plugin layer and everything below; nothing imports it.
"""
