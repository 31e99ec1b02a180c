"""Launching, measuring and stopping a vLLM server.

Holds ``ServeSpec`` (a deployment -> ``vllm serve`` argv and env), ``VLLMServer`` and its
collaborators (launch, readiness, footprint, teardown; the session's processes; the log),
the startup-log parser, the serving benchmark and its load generator, and the thresholds a
benchmark is held to.

May import: ``model``, ``host`` and the ground floor, plus requests. Never ``plugin`` or pytest:
a library caller can run a server without a pytest session.
"""
