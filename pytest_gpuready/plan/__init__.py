"""Plan a deployment before the download: every TP/PP/EP and KV-dtype layout on a host's GPUs
(or on named GPU presets), with each model check's verdict, the memory per GPU, and the
``vllm serve`` command, best first.

``plan`` is pure (:func:`~pytest_gpuready.plan.planner.plan_layouts` over a ``ModelSpec`` and a
``HostSnapshot``); ``cli`` is the thin ``python -m pytest_gpuready plan`` / ``gpuready plan`` shell.

May import: ``model``, ``host`` and the ground floor. Never ``serve``, ``plugin`` or pytest.
"""
