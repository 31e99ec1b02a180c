"""``python -m pytest_gpuready COMMAND ...``: the ``gpuready`` command line (see pytest_gpuready.cli)."""

from pytest_gpuready.cli import main

raise SystemExit(main())
