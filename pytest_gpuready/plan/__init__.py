"""Plan a deployment before the download: every DP/TP/PP/EP and KV-dtype layout on a host's GPUs
(or on named GPU presets), with every vLLM load rule's verdict, the memory per GPU, the locality
of the groups that talk most, and the ``vllm serve`` command, best first.

``planner`` is pure (:func:`~pytest_gpuready.plan.planner.plan_layouts` over a ``ModelSpec`` and a
``HostSnapshot``); ``placement`` picks each layout's GPUs and names their locality; ``table`` prints
the plan; ``cli`` is the thin ``python -m pytest_gpuready plan`` / ``gpuready plan`` shell.

May import: ``model``, ``host`` and the ground floor. Never ``serve``, ``plugin`` or pytest.
"""
