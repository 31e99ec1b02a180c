"""``python -m pytest_gpuready plan ...``: the planner's command line (see pytest_gpuready.plan.cli)."""

from pytest_gpuready.plan.cli import main

raise SystemExit(main())
