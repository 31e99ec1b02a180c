"""Exceptions that carry a cause an engineer can act on.

Every error names the host (or file) and what went wrong, in one line, because these
messages end up as the only line a CI log shows for a red preflight.
"""

from __future__ import annotations

import reprlib
from typing import Any


class GpuReadyError(Exception):
    """Base class for every error the plugin raises on purpose."""


class HostError(GpuReadyError):
    """A host could not be reached or a command could not be run on it (ssh refused, auth, timeout)."""


class HostSpecError(GpuReadyError, ValueError):
    """A host spec (``--gpu-host``) that is not ``local``, ``host``, ``user@host`` or ``ssh://user@host:port``."""


class ProbeError(GpuReadyError):
    """The host answered, but a measurement could not be taken (driver gone, ``[N/A]``, garbled output).

    A check that meets a ProbeError errors; it never passes, because nothing was measured.
    """


class NoGpuError(GpuReadyError):
    """The local machine has no NVIDIA GPU and no ``--gpu-host`` was given: GPU checks skip, with this reason."""


class ConfigError(GpuReadyError, ValueError):
    """A deploy file, model config or option value that is malformed; the message names file, key and expectation."""


class GpuReadyWarning(UserWarning):
    """A check passed, but with a finding the engineer should see (thin headroom, a re-gridded block).

    Shown with :func:`warnings.warn` so it lands in pytest's warnings summary without failing
    the test; ``-W error::pytest_gpuready.errors.GpuReadyWarning`` turns these into failures.
    """


class _Excerpt(reprlib.Repr):
    """reprlib's bounded repr, with mappings in their own order (reprlib sorts the keys)."""

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                 for k, v in list(x.items())[:self.maxdict]]
        return "{" + ", ".join(items) + (", ..." if len(x) > self.maxdict else "") + "}"


_EXCERPT = _Excerpt()
_EXCERPT.maxlevel, _EXCERPT.maxlist, _EXCERPT.maxdict = 3, 6, 6
_EXCERPT.maxstring, _EXCERPT.maxother, _EXCERPT.maxlong = 80, 80, 40
_MAX_EXCERPT = 160


def excerpt(value: Any) -> str:
    """A bounded ``repr`` of a bad value for a one-line message: at most 160 characters, three
    levels and six items deep, so a YAML alias graph is never expanded and a megabyte string
    never quoted whole."""
    text = _EXCERPT.repr(value)
    return text if len(text) <= _MAX_EXCERPT else text[:_MAX_EXCERPT - 3] + "..."
