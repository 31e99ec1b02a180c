"""Options with one precedence everywhere: marker > command line > environment > ini > default.

Each :class:`Setting` is declared once, with its flag, env var, ini key, parser and help, and
:func:`add_settings` registers both the option and the ini key from it, so the help text of the
two never drifts. Values are parsed in :func:`resolve_all` at ``pytest_configure``: a bad value
is a one-line :class:`pytest.UsageError` that names where it came from and what was expected,
before any test runs. Markers are applied on top by the fixtures that read them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

T = TypeVar("T")

GROUP_NAME = "gpuready"
GROUP_DESCRIPTION = "GPU readiness preflight for vLLM deploys (pytest-gpuready)"

_RESOLVED_KEY = pytest.StashKey[dict[str, Any]]()


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One user-facing setting and every way to give it."""

    dest: str
    flag: str
    env: str
    ini: str
    help: str
    parse: Callable[[str], T]
    default: T
    metavar: str = "VALUE"
    expected: str = "a valid value"
    is_flag: bool = False
    """A switch (``--flag`` with no value); env and ini take true/false."""
    multiple: bool = False
    """Repeatable on the command line; env and ini give one value per line. ``parse`` gets them
    joined by newlines."""

    def get(self, config: pytest.Config) -> T:
        """The resolved value (resolved once at configure time)."""
        resolved = config.stash.get(_RESOLVED_KEY, None)
        if resolved is None or self.dest not in resolved:
            resolved = resolve_all(config, [self])
        value: T = resolved[self.dest]
        return value

    def parse_from(self, raw: str, source: str) -> T:
        """Parse ``raw`` or raise a UsageError naming ``source`` (e.g. ``--gpu-ids``) and the expectation."""
        try:
            return self.parse(raw)
        except (ValueError, TypeError) as exc:
            reason = str(exc) or self.expected
            raise pytest.UsageError(f"{source} {raw!r}: {reason}") from None


def add_settings(parser: pytest.Parser, settings: Sequence[Setting[Any]]) -> None:
    """Register each setting's command-line option and ini key in the ``gpuready`` group."""
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    for setting in settings:
        # argparse %-formats option help: a literal percent sign (a tolerance of 5%) is written %%
        help_text = f"{setting.help} Env: {setting.env}; ini: {setting.ini}.".replace("%", "%%")
        if setting.is_flag:
            group.addoption(setting.flag, dest=setting.dest, action="store_const", const="true",
                            default=None, help=help_text)
        elif setting.multiple:
            group.addoption(setting.flag, dest=setting.dest, action="append", metavar=setting.metavar,
                            default=None, help=help_text)
        else:
            group.addoption(setting.flag, dest=setting.dest, metavar=setting.metavar, default=None,
                            help=help_text)
        parser.addini(setting.ini, help=setting.help, default=None)


def resolve_all(config: pytest.Config, settings: Sequence[Setting[Any]]) -> dict[str, Any]:
    """Resolve settings with the precedence CLI > env > ini > default and remember them."""
    resolved = config.stash.setdefault(_RESOLVED_KEY, {})
    for setting in settings:
        cli = config.getoption(setting.dest, default=None)
        if cli is not None:
            if isinstance(cli, list):
                for item in cli:  # so an error names the one bad value, not all of them
                    setting.parse_from(item, setting.flag)
                raw = "\n".join(cli)
            else:
                raw = str(cli)
            resolved[setting.dest] = setting.parse_from(raw, setting.flag)
            continue
        env = os.environ.get(setting.env)
        if env is not None and env != "":
            resolved[setting.dest] = setting.parse_from(env, f"${setting.env}")
            continue
        try:
            ini = config.getini(setting.ini)
        except ValueError:
            ini = None
        if ini not in (None, "", []):
            resolved[setting.dest] = setting.parse_from(str(ini), f"ini {setting.ini}")
            continue
        resolved[setting.dest] = setting.default
    return resolved


# Parsers shared by the settings of several modules. Each raises ValueError with the expectation.

def parse_gpu_ids(text: str) -> tuple[int, ...] | None:
    """``0,1,2,3`` or ``all`` -> indexes (None for all)."""
    text = text.strip()
    if text in ("", "all"):
        return None
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError("expected comma-separated GPU indexes like 0,1,2,3, or 'all'")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise ValueError("a GPU index is listed twice")
    return tuple(ids)


def parse_non_negative_int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("expected a whole number >= 0") from None
    if value < 0:
        raise ValueError("expected a whole number >= 0")
    return value


def parse_positive_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number > 0") from None
    if not value > 0:
        raise ValueError("expected a number > 0")
    return value


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def parse_optional_str(text: str) -> str | None:
    return text.strip() or None


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value
    return parse
