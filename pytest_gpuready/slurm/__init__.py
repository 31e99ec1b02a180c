"""Run where GPU clusters run: the preflight as a Slurm node health check, prolog or epilog.

``node`` reads this node's state and drains or resumes it through ``scontrol``; ``health`` runs
the built-in preflight on the node (a bounded pytest run writing its JSON report) and decides.
The command line is ``gpuready slurm-health`` (:mod:`pytest_gpuready.cli.slurm_health`).

May import: ``plugin`` (the option declarations and the report's summary), ``host`` and the ground
floor. Never ``preflight`` (it runs that suite by name, in its own process) or ``cli``.
"""
