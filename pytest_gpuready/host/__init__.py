"""Where commands run and what a probe sees there.

Holds host specs and connections (:mod:`~pytest_gpuready.host.hosts`: ``LocalHost``,
``SSHHost``), the one-round-trip probe and the frozen ``HostSnapshot`` it returns, the
nvidia-smi / NVML / ``topo -m`` / ``/dev/shm`` readers, and the host checks (GPUs clean,
``/dev/shm`` clean, topology).

May import: the ground floor (``errors``, ``verdict``), the standard library, nvidia-ml-py.
Never ``model``, ``serve``, ``plugin`` or pytest: a host knows nothing of models or servers.
"""
