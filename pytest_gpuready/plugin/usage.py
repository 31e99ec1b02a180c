"""First-hour command-line mistakes, each answered in one line instead of pytest's bare usage error.

- A misspelt gpuready option (``--gpu-hots root@x``): pytest says ``unrecognized arguments``;
  this says which option was meant (``did you mean --gpu-host?``), from the registry of
  :mod:`pytest_gpuready.plugin.options`.
- ``-n 2`` (or ``--dist``) without pytest-xdist installed: pytest says ``unrecognized arguments:
  -n``; this says to install the ``fleet`` extra.

Both are checked once the initial conftests are loaded (so their options are known too), on the
arguments pytest has not recognised; anything else is left to pytest's own message. An option
of the user's own with a name close to ours is recognised by then, so it is never flagged.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from collections.abc import Generator, Sequence

import pytest

from pytest_gpuready.plugin.options import ALL_SETTINGS

XDIST_OPTIONS = ("--numprocesses", "--dist", "--maxprocesses", "--tx", "--maxschedchunk")
_N_GLUED = re.compile(r"-n(\d+|auto|logical)")
SUGGESTION_CUTOFF = 0.75
"""How alike (difflib's ratio) an unknown option and ours must be to suggest ours: ``--gpu-hots``
and ``--gpu-host`` are 0.9; ``--verbose`` and any of ours are below 0.5."""


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def needs_xdist(unknown: Sequence[str]) -> str | None:
    """The first unknown argument that only pytest-xdist understands (``-n``, ``-n4``, ``--dist``...)."""
    for arg in unknown:
        if arg == "-n" or _N_GLUED.fullmatch(arg) or _flag(arg) in XDIST_OPTIONS:
            return arg
    return None


def suggestion(arg: str) -> str | None:
    """The gpuready option closest to an unknown ``--option`` (None when none is close)."""
    if not arg.startswith("--"):
        return None
    flags = [setting.flag for setting in ALL_SETTINGS]
    close = difflib.get_close_matches(_flag(arg), flags, n=1, cutoff=SUGGESTION_CUTOFF)
    return close[0] if close else None


def check_unknown(unknown: Sequence[str], xdist_installed: bool) -> None:
    """Raise a one-line UsageError for the mistakes of the module docstring; return for anything else."""
    xdist_arg = needs_xdist(unknown)
    if xdist_arg is not None and not xdist_installed:
        raise pytest.UsageError(
            f"{xdist_arg} needs pytest-xdist, which is not installed: pip install 'pytest-gpuready[fleet]' "
            "(hosts in parallel, each host's tests on one worker: docs/fleet.md)")
    for arg in unknown:
        meant = suggestion(arg)
        if meant is not None:
            raise pytest.UsageError(f"unrecognized argument {_flag(arg)}: did you mean {meant}?")


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, None, None]:
    yield  # pytest loads the initial conftests first: their options count as known
    if early_config.known_args_namespace.help or early_config.known_args_namespace.version:
        return  # --help and --version work whatever else is on the line
    _, unknown = parser.parse_known_and_unknown_args(args)
    if unknown:
        check_unknown(unknown, importlib.util.find_spec("xdist") is not None)
