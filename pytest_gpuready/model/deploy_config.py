"""The deploy file (``--gpuready-config deploy.yaml``): which model, on which GPUs, with which
TP/EP, KV dtype and serve arguments, and what to expect once it runs.

One file drives the static preflight (this issue) and the launch-and-benchmark tests (which
read ``serve`` and ``expect``). Typos must not pass silently: an unknown key, a wrong type, a
TP that does not match the GPU list is a one-line :class:`ConfigError` naming the file, the
deployment, the key and what was expected, raised at ``pytest_configure`` before any test runs.

Example::

    defaults:
      vllm_version: "0.17.0"
    deployments:
      - name: MiniMax-M2.5-tp4
        model: models/MiniMax-M2.5       # relative paths are relative to this file
        gpus: [0, 1, 2, 3]
        tp: 4
        gpu_arch: sm120
        serve: {max_model_len: 196608, gpu_memory_utilization: 0.9}
        expect:
          weights_per_gpu_gib: {min: 50, max: 58}
          throughput:
            - {concurrency: 1, min_output_tok_s: 80}
            - {concurrency: 256, min_output_tok_s: 2500}
"""

from __future__ import annotations

import collections
import difflib
import errno
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from pytest_gpuready.errors import ConfigError, excerpt
from pytest_gpuready.files import MIB, gc_paused, read_text_bounded
from pytest_gpuready.model import serve_args
from pytest_gpuready.model.backends import parse_gpu_arch
from pytest_gpuready.model.serve_args import ARGS, DEPLOYMENT, SERVE, Layout, ServeArgs, field_for_key, human_int
from pytest_gpuready.model.vllm_version import VllmVersion, parse_vllm_version

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Throughput:
    """A throughput threshold for the launch tests: at ``concurrency`` streams, at least
    ``min_output_tok_s`` output tokens per second (vLLM bench serve's ``output_throughput``)."""

    concurrency: int
    min_output_tok_s: float
    input_len: int | None = None
    output_len: int | None = None
    num_prompts: int | None = None
    max_p99_ttft_ms: float | None = None
    max_p99_tpot_ms: float | None = None


@dataclass(frozen=True)
class Expectations:
    """What the running deployment must show."""

    weights_per_gpu_gib_min: float | None = None
    weights_per_gpu_gib_max: float | None = None
    throughput: tuple[Throughput, ...] = ()

    @property
    def single_stream(self) -> Throughput | None:
        return next((t for t in self.throughput if t.concurrency == 1), None)

    def at_concurrency(self, concurrency: int) -> Throughput | None:
        return next((t for t in self.throughput if t.concurrency == concurrency), None)


@dataclass(frozen=True)
class Deployment:
    """One named way to serve one model: where, on which GPUs, with which serve arguments.

    ``serve`` holds every ``vllm serve`` argument the checks judge (the declaration,
    :class:`~pytest_gpuready.model.serve_args.ServeArgs`): the layout keys of the file's top level
    (``tp``, ``pp``, ``dp``, ``ep``, ``kv_cache_dtype``), its ``serve:`` keys, and the modelled flags
    of ``serve.extra_args``; ``serve.extra_args`` keeps the unmodelled ones. ``tp``, ``pp``, ... are
    read from it, never stored twice.
    """

    name: str
    model: str
    """The model directory as written in the file."""
    model_path: str
    """Where to read it: relative paths resolved against the deploy file's directory."""
    serve: ServeArgs = field(default_factory=ServeArgs)
    gpus: tuple[int, ...] | None = None
    """Host GPU indexes, all tp x pp x dp of them (``CUDA_VISIBLE_DEVICES`` order)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """``serve.env``: environment variables of the server."""
    gpu_arch: tuple[int, int] | None = None
    vllm_version: VllmVersion | None = None
    expect: Expectations = field(default_factory=Expectations)
    description: str | None = None
    source: str = ""

    @property
    def model_is_relative(self) -> bool:
        return not os.path.isabs(os.path.expanduser(self.model))

    @property
    def layout(self) -> Layout:
        """What every load rule judges: the serve arguments (``Layout`` is ``ServeArgs``)."""
        return self.serve

    @property
    def tp(self) -> int:
        return self.serve.tp

    @property
    def pp(self) -> int:
        return self.serve.pp

    @property
    def dp(self) -> int:
        return self.serve.dp

    @property
    def ep(self) -> bool:
        return self.serve.ep

    @property
    def kv_cache_dtype(self) -> str:
        return self.serve.kv_cache_dtype

    @property
    def allow_long_max_model_len(self) -> bool:
        """``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` in the server's environment (``serve.env``)."""
        return self.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")


@dataclass(frozen=True)
class DeployConfig:
    """A parsed deploy file."""

    path: str
    deployments: tuple[Deployment, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.deployments)

    def get(self, name: str) -> Deployment:
        for deployment in self.deployments:
            if deployment.name == name:
                return deployment
        raise ConfigError(f"{self.path}: no deployment named {name!r}; the file has "
                          f"{', '.join(self.names) or 'none'}")


# ---------------------------------------------------------------- loading

MAX_DEPLOY_FILE_BYTES = 64 * MIB
"""A deploy file is a few KiB; 64 MiB leaves room for generated fleets and stops ``/dev/zero``."""
MAX_NESTING = 100
"""Deepest nesting of mappings and sequences accepted. A deploy file needs 6; libyaml's C composer
recurses in C and crashes the interpreter (SIGSEGV) at about 25,000 levels, so depth is counted on
the parser's event stream before anything is composed."""
MAX_ALIAS_EXPANSION = 1_000_000
"""Nodes that aliases may add if each were copied out (a billion-laughs file adds 9**9)."""

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml: the pure-Python loader, ~4x slower
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class _UniqueKeyLoader(_SafeLoader):
    """The safe loader (libyaml's C parser where PyYAML has it) that refuses duplicate keys
    (PyYAML keeps the last one silently) and keys that cannot be dict keys (a list, a mapping)."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # ``<<: *defaults``: merged keys may be overridden
            continue
        key = loader.construct_object(key_node)
        mark = key_node.start_mark
        try:
            duplicate = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} used as a mapping key (line {mark.line + 1}); "
                "keys must be plain values such as strings", mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {excerpt(key)} (line {mark.line + 1})", mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

def _check_structure(text: str, file: str) -> None:
    """Refuse nesting deeper than :data:`MAX_NESTING` and aliases that expand past
    :data:`MAX_ALIAS_EXPANSION` nodes, reading libyaml's events (flat, never recursive) before
    the composer, which recurses, sees the document."""
    starts = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
    ends = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
    track = "&" in text  # no anchor, no alias: skip the subtree sizes
    depth = 0
    sizes: list[int] = [0]
    anchor_stack: list[str | None] = []
    anchors: dict[str, int] = {}
    expansion = 0
    events: Iterable[Any] = yaml.parse(text, Loader=_UniqueKeyLoader)  # NodeEvents: anchor, start_mark
    for event in events:
        kind = event.__class__
        if kind in starts:
            depth += 1
            if depth > MAX_NESTING:
                raise ConfigError(f"{file}: nested more than {MAX_NESTING} levels deep{_at(event.start_mark)}; "
                                  "a deploy file needs about 6")
            if track:
                sizes.append(1)
                anchor_stack.append(event.anchor)
        elif kind in ends:
            depth -= 1
            if track:
                size = sizes.pop()
                anchor = anchor_stack.pop()
                if anchor is not None:
                    anchors[anchor] = size
                sizes[-1] += size
        elif track and kind is yaml.ScalarEvent:
            sizes[-1] += 1
            if event.anchor is not None:
                anchors[event.anchor] = 1
        elif kind is yaml.AliasEvent:
            added = anchors.get(event.anchor, 1)
            sizes[-1] += added
            expansion += added
            if expansion > MAX_ALIAS_EXPANSION:
                raise ConfigError(f"{file}: aliases would expand to more than {MAX_ALIAS_EXPANSION:,} "
                                  f"nodes{_at(event.start_mark)} (alias *{excerpt(event.anchor)[1:-1]}); "
                                  "refusing a billion-laughs file")


def _at(mark: Any) -> str:
    """`` at line L, column C`` for a YAML mark, or nothing when there is none."""
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _yaml_error(file: str, exc: yaml.YAMLError) -> ConfigError:
    where = _at(getattr(exc, "problem_mark", None))
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unknown error"])[0]
    return ConfigError(f"{file}: not valid YAML{where}: {' '.join(str(problem).split())[:200]}")


def _read_yaml(path: Path, file: str) -> Any:
    text = read_text_bounded(path, MAX_DEPLOY_FILE_BYTES, "deploy file", where=file)
    try:
        _check_structure(text, file)
        with gc_paused():
            return yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        raise _yaml_error(file, exc) from None
    except RecursionError:  # the pure-Python composer, when libyaml is absent
        raise ConfigError(f"{file}: nested too deeply for the YAML loader") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar's constructor: int digits, dates
        raise ConfigError(f"{file}: not valid YAML: {' '.join(str(exc).split())[:200]}") from None


class _Ctx:
    """Where a value sits, for error messages: file, deployment, key path."""

    def __init__(self, file: str, deployment: str | None = None) -> None:
        self.file = file
        self.deployment = deployment

    def error(self, key: str, expected: str, got: Any = None, *, missing: bool = False) -> ConfigError:
        where = f"{self.file}: deployment {excerpt(self.deployment)}: " if self.deployment else f"{self.file}: "
        if missing:
            return ConfigError(f"{where}key '{key}' is missing; expected {expected}")
        return ConfigError(f"{where}key '{key}': expected {expected}, got {excerpt(got)}")

    def check_keys(self, section: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        """Refuse a key not in ``allowed``; vLLM's spelling of a serve argument of this section
        (``tensor_parallel_size`` for ``tp``) is accepted, and suggested for near misses."""
        home = SERVE if section.endswith("serve.") else DEPLOYMENT
        aliases = {arg.vllm_name: name for name, arg in ARGS.items() if arg.section == home and name in allowed}
        for key in data:
            if key in allowed or key in aliases:
                continue
            text = str(key) if isinstance(key, str) else excerpt(key)
            close = difflib.get_close_matches(text, (*allowed, *aliases), n=1) if len(text) < 100 else []
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            misplaced = field_for_key(text)
            if misplaced is not None:
                hint = (f" (did you mean 'serve.{misplaced}'?)" if ARGS[misplaced].section == SERVE
                        else f" (did you mean the top-level key '{misplaced}'?)")
            where = f"{self.file}: deployment {excerpt(self.deployment)}: " if self.deployment else f"{self.file}: "
            shown = text if len(text) <= 80 else text[:60] + "..."
            shown = shown if shown.isprintable() else ascii(shown)[1:-1]
            raise ConfigError(f"{where}unknown key '{section}{shown}'{hint}; expected one of: "
                              f"{', '.join(allowed)}")

    def mapping(self, key: str, value: Any) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(key, "a mapping of keys to values", value)
        return value

    def int(self, key: str, value: Any, minimum: int = 1, human: bool = False) -> int:
        if isinstance(value, str) and human:
            parsed = human_int(value)
            if parsed is not None and parsed >= minimum:
                return parsed
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            suffix = " (or like 128k)" if human else ""
            raise self.error(key, f"a whole number >= {minimum}{suffix}", value)
        return value

    def number(self, key: str, value: Any, *, above: float = 0.0, at_most: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > above \
                or (at_most is not None and value > at_most):
            bound = f" and <= {at_most:g}" if at_most is not None else ""
            raise self.error(key, f"a number > {above:g}{bound}", value)
        return float(value)

    def bool(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def str(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, "a non-empty string", value)
        return value


DEPLOYMENT_KEYS = ("name", "description", "model", "gpus", *serve_args.keys(DEPLOYMENT), "gpu_arch",
                   "vllm_version", "serve", "expect")
"""A deployment's keys: its own, and the serve arguments the declaration puts at the top level
(each also under vLLM's name, e.g. ``tensor_parallel_size``)."""
SERVE_KEYS = (*serve_args.keys(SERVE), "extra_args", "env")
"""``serve:`` keys: the declaration's (and vLLM's names for them), ``extra_args`` and ``env``."""
EXPECT_KEYS = ("weights_per_gpu_gib", "throughput")
THROUGHPUT_KEYS = ("concurrency", "min_output_tok_s", "input_len", "output_len", "num_prompts",
                   "max_p99_ttft_ms", "max_p99_tpot_ms")
TOP_KEYS = ("defaults", "deployments")


def _merge(defaults: Mapping[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in item.items():
        if key in ("serve", "expect") and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _gpus(ctx: _Ctx, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    items: Any = value
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
        if not all(part.isdigit() for part in items):
            raise ctx.error("gpus", "a list of GPU indexes like [0, 1, 2, 3]", value)
        items = [int(part) for part in items]
    if isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    if not isinstance(items, list) or not items or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise ctx.error("gpus", "a list of GPU indexes like [0, 1, 2, 3]", value)
    if len(set(items)) != len(items):
        raise ctx.error("gpus", "each GPU index once", value)
    return tuple(items)


def _env(ctx: _Ctx, raw: Mapping[str, Any]) -> dict[str, str]:
    env = ctx.mapping("serve.env", raw.get("env"))
    bad = [k for k, v in env.items() if not isinstance(k, str) or isinstance(v, (dict, list)) or v is None]
    if bad:
        raise ctx.error(f"serve.env.{bad[0]}", "a string value", env[bad[0]])
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}


def _serve_args(ctx: _Ctx, top: Mapping[str, Any], serve: Mapping[str, Any]) -> tuple[ServeArgs, set[str]]:
    """The declaration's fields from the deployment's keys (its own spelling or vLLM's) and the
    modelled flags of ``serve.extra_args``; also which fields were given at all."""
    given: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, arg in ARGS.items():
        section, prefix = (top, "") if arg.section == DEPLOYMENT else (serve, "serve.")
        found = [key for key in dict.fromkeys((name, arg.vllm_name)) if section.get(key) is not None]
        if len(found) > 1:
            raise ctx.error(f"{prefix}{found[1]}", f"one of '{prefix}{found[0]}' and '{prefix}{found[1]}' "
                            f"(both are {arg.flag})", section[found[1]])
        if not found:
            continue
        key = found[0]
        try:
            given[name] = arg.parse(section[key])
        except ValueError as exc:
            raise ctx.error(f"{prefix}{key}", str(exc), section[key]) from None
        spelled[name] = f"{prefix}{key}"
    extra = serve.get("extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise ctx.error("serve.extra_args", "a list of strings like ['--trust-remote-code']", extra)
    where = f"{ctx.file}: deployment {excerpt(ctx.deployment)}"
    folded = serve_args.fold_extra_args(given, extra, where=where, spelled=spelled)
    from_extra = {name for name, _, _ in serve_args.split_extra_args(extra)[0]}
    return folded, set(given) | from_extra


def _throughput(ctx: _Ctx, index: int, raw: Any) -> Throughput:
    key = f"expect.throughput[{index}]"
    if not isinstance(raw, Mapping):
        raise ctx.error(key, "a mapping like {concurrency: 1, min_output_tok_s: 80}", raw)
    ctx.check_keys(f"{key}.", raw, THROUGHPUT_KEYS)
    for required in ("concurrency", "min_output_tok_s"):
        if raw.get(required) is None:
            raise ctx.error(f"{key}.{required}", "a number", missing=True)

    def optional_int(name: str) -> int | None:
        return ctx.int(f"{key}.{name}", raw[name]) if raw.get(name) is not None else None

    def optional_number(name: str) -> float | None:
        return ctx.number(f"{key}.{name}", raw[name]) if raw.get(name) is not None else None

    return Throughput(
        concurrency=ctx.int(f"{key}.concurrency", raw["concurrency"]),
        min_output_tok_s=ctx.number(f"{key}.min_output_tok_s", raw["min_output_tok_s"]),
        input_len=optional_int("input_len"), output_len=optional_int("output_len"),
        num_prompts=optional_int("num_prompts"),
        max_p99_ttft_ms=optional_number("max_p99_ttft_ms"),
        max_p99_tpot_ms=optional_number("max_p99_tpot_ms"),
    )


def _expect(ctx: _Ctx, raw: Mapping[str, Any]) -> Expectations:
    ctx.check_keys("expect.", raw, EXPECT_KEYS)
    low = high = None
    bounds = raw.get("weights_per_gpu_gib")
    if bounds is not None:
        if isinstance(bounds, list) and len(bounds) == 2:
            bounds = {"min": bounds[0], "max": bounds[1]}
        if not isinstance(bounds, Mapping) or not bounds or set(bounds) - {"min", "max"}:
            raise ctx.error("expect.weights_per_gpu_gib", "{min: GiB, max: GiB} or [min, max]", bounds)
        low = ctx.number("expect.weights_per_gpu_gib.min", bounds["min"]) if "min" in bounds else None
        high = ctx.number("expect.weights_per_gpu_gib.max", bounds["max"]) if "max" in bounds else None
        if low is not None and high is not None and low > high:
            raise ctx.error("expect.weights_per_gpu_gib", "min <= max", bounds)
    items = raw.get("throughput") or []
    if not isinstance(items, list):
        raise ctx.error("expect.throughput", "a list of {concurrency, min_output_tok_s} thresholds", items)
    throughput = tuple(_throughput(ctx, i, item) for i, item in enumerate(items))
    seen = [t.concurrency for t in throughput]
    if len(set(seen)) != len(seen):
        raise ctx.error("expect.throughput", "one threshold per concurrency", seen)
    return Expectations(low, high, throughput)


def _refuse_symlink_loop(ctx: _Ctx, model: str, model_path: str) -> None:
    """A ``model:`` that is a symlink loop on this machine can be read nowhere: say so now.

    Only a loop: a path missing here may well exist on the GPU host, where it is read.
    """
    try:
        os.stat(model_path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ctx.error("model", "a model directory, not a symlink loop (too many levels of "
                            "symbolic links)", model) from None


def _deployment(file: str, base_dir: Path, position: int, raw: Any,
                defaults: Mapping[str, Any]) -> Deployment:
    label = f"#{position}"
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
        label = raw["name"]
    ctx = _Ctx(file, label)
    if not isinstance(raw, Mapping):
        raise ctx.error(f"deployments[{position - 1}]", "a mapping with name, model and tp", raw)
    ctx.check_keys("", raw, DEPLOYMENT_KEYS)
    data = _merge(defaults, raw)
    name = data.get("name")
    if name is None:
        raise ctx.error("name", "a name like MiniMax-M2.5-tp4", missing=True)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ctx.error("name", "letters, digits, '.', '_' or '-' (it becomes the test id)", name)
    if data.get("model") is None:
        raise ctx.error("model", "the model directory (here, or on the GPU host)", missing=True)
    model = ctx.str("model", data["model"])
    if "\0" in model:
        raise ctx.error("model", "a directory path (it holds a NUL byte, which no path can)", model)
    expanded = os.path.expanduser(model)
    # realpath, not Path.resolve(): on a symlink loop resolve() raises RuntimeError (Python < 3.13)
    model_path = expanded if os.path.isabs(expanded) else os.path.realpath(base_dir / expanded)
    _refuse_symlink_loop(ctx, model, model_path)
    gpus = _gpus(ctx, data.get("gpus"))
    serve_raw = ctx.mapping("serve", data.get("serve"))
    ctx.check_keys("serve.", serve_raw, SERVE_KEYS)
    args, given = _serve_args(ctx, data, serve_raw)
    pp, dp = args.pp, args.dp
    if "tp" not in given:
        if gpus is None:
            raise ctx.error("tp", "a whole number >= 1 (the tensor-parallel size), or a gpus list",
                            missing=True)
        if len(gpus) % (pp * dp):
            what = " x ".join(f"{k}={v}" for k, v in (("pp", pp), ("dp", dp)) if v > 1)
            raise ctx.error("gpus", f"a multiple of {what} GPU indexes", list(gpus))
        args = replace(args, tp=len(gpus) // (pp * dp))
    tp = args.tp
    if gpus is not None and len(gpus) != args.total_gpus:
        sizes = " x ".join(f"{k}" for k, v in (("tp", tp), ("pp", pp), ("dp", dp)) if k == "tp" or v > 1)
        expected = (f"exactly tp={tp} GPU indexes" if pp * dp == 1
                    else f"exactly {sizes} = {tp * pp * dp} GPU indexes")
        raise ctx.error("gpus", expected, list(gpus))
    arch = None
    if data.get("gpu_arch") is not None:
        try:
            arch = parse_gpu_arch(str(data["gpu_arch"]))
        except ValueError:
            raise ctx.error("gpu_arch", "sm90, sm100, sm120 or a compute capability like '12.0'",
                            data["gpu_arch"]) from None
    version = None
    if data.get("vllm_version") is not None:
        raw_version = data["vllm_version"]
        if not isinstance(raw_version, str):
            raise ctx.error("vllm_version", "a quoted version string like \"0.17.0\" (YAML reads "
                            "an unquoted 0.10 as the number 0.1)", raw_version)
        try:
            version = parse_vllm_version(raw_version)
        except ValueError:
            raise ctx.error("vllm_version", "a version like \"0.17.0\"", raw_version) from None
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise ctx.error("description", "a string", description)
    return Deployment(
        name=name, model=model, model_path=model_path, serve=args, gpus=gpus, env=_env(ctx, serve_raw),
        gpu_arch=arch, vllm_version=version, expect=_expect(ctx, ctx.mapping("expect", data.get("expect"))),
        description=description, source=file,
    )


def load_deploy_config(path: str | os.PathLike[str]) -> DeployConfig:
    """Parse and validate a deploy file; raise :class:`ConfigError` with a one-line message."""
    file_path = Path(path)
    file = str(path)
    data = _read_yaml(file_path, file)
    ctx = _Ctx(file)
    if not isinstance(data, Mapping):
        raise ctx.error("deployments", "a mapping with a 'deployments' list at the top", data)
    ctx.check_keys("", data, TOP_KEYS)
    defaults = ctx.mapping("defaults", data.get("defaults"))
    ctx.check_keys("defaults.", defaults, tuple(k for k in DEPLOYMENT_KEYS if k != "name"))
    items = data.get("deployments")
    if items is None:
        raise ctx.error("deployments", "a list of deployments", missing=True)
    if not isinstance(items, list) or not items:
        raise ctx.error("deployments", "a non-empty list of deployments", items)
    base_dir = Path(os.path.realpath(file_path)).parent
    deployments = tuple(_deployment(file, base_dir, i + 1, item, defaults) for i, item in enumerate(items))
    names = [d.name for d in deployments]
    duplicates = sorted(name for name, count in collections.Counter(names).items() if count > 1)
    if duplicates:
        raise ConfigError(f"{file}: deployment name {excerpt(duplicates[0])} is used twice; expected unique names")
    return DeployConfig(file, deployments)
