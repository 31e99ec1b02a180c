"""How an option is given and read: one precedence everywhere, marker > command line > environment > ini > default.

A :class:`Setting` carries every way to give one option (its flag, environment variable and ini
key), its parser and its help. The settings themselves are declared in one module,
:mod:`pytest_gpuready.plugin.options`, each with :func:`setting` from one name, from which the
flag, the variable and the ini key are derived. :func:`add_settings` registers the option and the
ini key from it, so the help of the two never drifts; values are parsed in :func:`resolve_all` at
``pytest_configure``: a bad value is a one-line :class:`pytest.UsageError` that names where it came
from and what was expected, before any test runs. Markers are applied on top by the fixtures that
read them. The parsers every option uses are here too, below.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

from pytest_gpuready.errors import HostSpecError
from pytest_gpuready.host.host_list import merge_hosts
from pytest_gpuready.host.hosts import HostSpec, parse_host_spec, validate_ssh_option

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
    shown_default: str | None = None
    """The default as the docs' option tables show it (None: derived from ``default``)."""
    note: str = ""
    """Said after the flag in the docs' option tables, e.g. ``(the `plot` extra)``."""

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


    @property
    def default_text(self) -> str:
        """The default as a person reads it: ``shown_default``, else none / off / the value."""
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None or self.default == ():
            return "none"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)

    def doc_cells(self) -> tuple[str, str, str, str]:
        """The row of this setting in the docs' option tables: option, env, ini, default (Markdown)."""
        shown = self.flag if self.is_flag else f"{self.flag} {self.metavar}"
        option = f"`{shown}`".replace("|", "\\|")
        if self.multiple:
            option += " (repeatable)"
        if self.note:
            option += f" {self.note}"
        each = " (one a line)" if self.multiple else ""
        return option, f"`{self.env}`{each}", f"`{self.ini}`{each}", self.default_text


ENV_PREFIX = "GPUREADY_"


def setting(name: str, parse: Callable[[str], T], default: T, help: str, *, metavar: str = "VALUE",
            is_flag: bool = False, multiple: bool = False, shown_default: str | None = None, note: str = "",
            flag: str | None = None, env: str | None = None) -> Setting[T]:
    """Declare a setting from one name: ``gpu_ids`` is ``--gpu-ids``, ``$GPUREADY_GPU_IDS`` and ini ``gpu_ids``.

    The rules: the ini key and the option's ``dest`` are ``name``; the flag is ``--`` and the name
    with dashes, singular for a repeatable option (``ssh_options`` is given as ``--ssh-option``,
    once per value); the environment variable is ``GPUREADY_`` and the name in capitals, with no
    second prefix for a name that starts with ``gpuready_`` (``GPUREADY_CONFIG``). ``flag`` and
    ``env`` override a rule only to keep a name users already set (``GPUREADY_HOST``).
    """
    if flag is None:
        stem = name[:-1] if multiple and name.endswith("s") else name
        flag = "--" + stem.replace("_", "-")
    if env is None:
        upper = name.upper()
        env = upper if upper.startswith(ENV_PREFIX) else ENV_PREFIX + upper
    return Setting(name, flag, env, name, help, parse, default, metavar=metavar, is_flag=is_flag,
                   multiple=multiple, shown_default=shown_default, note=note)


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


def parse_hosts(text: str) -> tuple[HostSpec, ...]:
    """One host spec, or several (a repeated ``--gpu-host``; env and ini: one a line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("expected 'local', 'host', 'user@host' or 'ssh://user@host:port'")
    specs = []
    for line in lines:
        try:
            specs.append(parse_host_spec(line))
        except HostSpecError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise ValueError(reason if len(lines) == 1 else f"{line.strip()!r}: {reason}") from None
    try:
        return merge_hosts(specs)
    except HostSpecError as exc:
        raise ValueError(str(exc)) from None


def parse_ssh_options(text: str) -> tuple[str, ...]:
    options = tuple(line.strip() for line in text.splitlines() if line.strip())
    for option in options:
        try:
            validate_ssh_option(option)
        except HostSpecError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
    return options


def parse_leak_patterns(text: str) -> tuple[str, ...]:
    patterns = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not patterns:
        raise ValueError("expected at least one file name pattern like 'psm_*'")
    bad = next((p for p in patterns if "/" in p or "\0" in p), None)
    if bad is not None:
        raise ValueError(f"{bad!r} is not a file name pattern (no '/'): /dev/shm names are matched, not paths")
    return patterns


def parse_url(text: str) -> str | None:
    url = text.strip()
    if not url:
        return None
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
        raise ValueError("expected the server's base URL like http://10.0.0.7:8000")
    return url.rstrip("/")


def _command_line(text: str, expected: str) -> str:
    """``text`` if the shell would read it as a non-empty command (quotes closed), else ``expected``."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"expected {expected} ({exc})") from None
    if not words:
        raise ValueError(f"expected {expected}")
    return text.strip()


def parse_command(text: str) -> str:
    return _command_line(text, "a command line like 'vllm serve'")


def parse_python(text: str) -> str:
    return _command_line(text, "a Python command like /opt/vllm/bin/python")


def expecting(parse: Callable[[str], T], expected: str) -> Callable[[str], T]:
    """``parse``, with any ValueError's message replaced by ``expected``."""
    def parse_or_explain(text: str) -> T:
        try:
            return parse(text)
        except ValueError:
            raise ValueError(expected) from None
    return parse_or_explain
