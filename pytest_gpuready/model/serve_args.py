"""The ``vllm serve`` arguments this project models, declared once: :class:`ServeArgs`.

After vLLM's own pattern (``vllm/engine/arg_utils.py``: one ``EngineArgs`` dataclass whose
argparse flags are derived from its fields), every serve argument the checks judge is one field
here, and its metadata (:class:`Arg`) says everything else about it: the vLLM flag (and short
flag), the type and its constraint, the choices, the default, the deploy-file section, and the
vLLM versions that take it. Everything else is derived from these fields and only from them:

- the deploy-file keys and their errors (:mod:`pytest_gpuready.model.deploy_config`), vLLM's own
  spelling (``tensor_parallel_size``) accepted beside the short key (``tp``);
- the command line (:meth:`ServeArgs.argv`): what ``vllm_server`` launches
  (:func:`pytest_gpuready.serve.spec.build_argv`) and what the planner prints (``--commands``);
- the planner's flags (:func:`add_arguments`);
- the memory model's inputs (:mod:`pytest_gpuready.model.memory` reads a :class:`ServeArgs`);
- the load rules' input (``Layout`` is this class: a rule judges the whole serve arguments);
- the report's record of what was judged (:meth:`ServeArgs.to_record`), stable and serialisable.

Flags the project does not model may be given in ``extra_args``; :func:`fold_extra_args` takes the
modelled ones out (so every check sees them) and refuses, in one line, one that contradicts a key
(``--data-parallel-size 2`` in extra_args and ``dp: 1``). The rest pass through untouched, in
order, and the report lists them as not judged.

The layout sizes follow vLLM's ``ParallelConfig`` (``vllm/config/parallel.py``): ``world_size`` is
TP x PP (one engine), each of the DP engines takes that many GPUs, and MoE layers are split by
``FusedMoEParallelConfig.make`` (``vllm/model_executor/layers/fused_moe/config.py``): without
``--enable-expert-parallel`` the MoE TP size is TP x DP; with it, each of TP x DP ranks holds
whole experts (MoE TP size 1, EP size TP x DP).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.model.backends import KV_CACHE_DTYPES

DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
"""``--dtype`` choices (``ModelConfig.dtype``)."""

DEPLOYMENT, SERVE = "deployment", "serve"
"""Where the deploy file puts a field: the deployment's top level, or its ``serve:`` mapping."""
PARALLEL, ENGINE = "parallel", "engine"
"""The two groups: how the model is spread over GPUs, and how each engine runs."""

_HUMAN_INT_RE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")


def human_int(text: str) -> int | None:
    """vLLM's ``human_readable_int``: ``128k`` = 128000, ``128K`` = 131072 (k/m/g x1000, K/M/G x1024)."""
    match = _HUMAN_INT_RE.match(text.strip())
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    value = number * scale
    return int(value) if value == int(value) else None


@dataclass(frozen=True)
class SpeculativeConfig:
    """``--speculative-config``, vLLM's JSON (``SpeculativeConfig``, ``vllm/config/speculative.py``):
    the keys the memory model reads (``method``, ``num_speculative_tokens``, ``model``, the draft),
    and every other key kept as written (``others``, compact JSON), passed through, not judged."""

    method: str | None = None
    num_speculative_tokens: int | None = None
    model: str | None = None
    others: str = ""
    """The remaining keys as sorted compact JSON (``{"prompt_lookup_max": 4}``), or empty."""

    EXPECTED = ('a JSON object like {"method": "eagle", "num_speculative_tokens": 3, "model": "DRAFT"} '
                "(vLLM's --speculative-config)")

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig:
        """From a mapping (a deploy file) or JSON text (a command line); ValueError with
        :attr:`EXPECTED` when it is neither, or a modelled key has the wrong type."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError(cls.EXPECTED) from None
        if not isinstance(value, Mapping) or not value or not all(isinstance(k, str) for k in value):
            raise ValueError(cls.EXPECTED)
        method, tokens, model = value.get("method"), value.get("num_speculative_tokens"), value.get("model")
        if method is not None and (not isinstance(method, str) or not method.strip()):
            raise ValueError(f"{cls.EXPECTED}; its method a non-empty string")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ValueError(f"{cls.EXPECTED}; its num_speculative_tokens a whole number >= 1")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ValueError(f"{cls.EXPECTED}; its model a non-empty string (the draft's path or name)")
        rest = {k: v for k, v in value.items() if k not in ("method", "num_speculative_tokens", "model")}
        try:
            others = json.dumps(rest, sort_keys=True, separators=(",", ":")) if rest else ""
        except (TypeError, ValueError):
            raise ValueError(f"{cls.EXPECTED}; every value JSON") from None
        return cls(method, tokens, model, others)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object vLLM receives: the modelled keys that are set, then the others."""
        data: dict[str, Any] = {k: v for k, v in (("method", self.method),
                                                  ("num_speculative_tokens", self.num_speculative_tokens),
                                                  ("model", self.model)) if v is not None}
        return {**data, **(json.loads(self.others) if self.others else {})}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


@dataclass(frozen=True)
class Arg:
    """What the project knows of one ``vllm serve`` argument (the metadata of a :class:`ServeArgs` field)."""

    flag: str
    """vLLM's flag, e.g. ``--tensor-parallel-size``; its ``EngineArgs`` name is :attr:`vllm_name`."""
    kind: str
    """``int`` (>= 1), ``length`` (>= 1, or like ``128k``), ``fraction`` (0 < x <= 1), ``bool``,
    ``choice`` (one of :attr:`choices`), ``name`` (a non-empty string) or ``json`` (a
    :class:`SpeculativeConfig`, vLLM's JSON)."""
    section: str
    """:data:`DEPLOYMENT` or :data:`SERVE`: where the deploy file has it."""
    group: str
    """:data:`PARALLEL` or :data:`ENGINE`."""
    help: str
    versions: str
    """The vLLM releases that take the flag, as read in their ``arg_utils.py`` (the rule sets cover 0.11-0.33)."""
    short: str | None = None
    choices: tuple[str, ...] = ()
    choice_versions: Mapping[str, str] = field(default_factory=dict)
    """Choices only some releases take, and which."""
    always: bool = False
    """Passed on every command line, even at its default: vLLM's own default moved between releases
    (0.9, then 0.92 for ``--gpu-memory-utilization``), and the memory model judged this value."""

    @property
    def vllm_name(self) -> str:
        """``tensor_parallel_size``: the ``EngineArgs`` field, and the deploy-file key vLLM users write."""
        return self.flag[2:].replace("-", "_")

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag, self.short) if self.short else (self.flag,)

    @property
    def expected(self) -> str:
        """What a value must be, in the words every error about it uses."""
        return {
            "int": "a whole number >= 1",
            "length": "a whole number >= 1 (or like 128k)",
            "fraction": "a number > 0 and <= 1",
            "bool": "true or false",
            "choice": f"one of {', '.join(self.choices)}",
            "name": "a non-empty string",
            "json": SpeculativeConfig.EXPECTED,
        }[self.kind]

    def parse(self, value: Any, *, text: bool = False) -> Any:
        """``value`` checked (and, with ``text``, converted from a command-line word); ValueError
        with :attr:`expected` when it is not one."""
        if text and isinstance(value, str):
            value = self._from_text(value)
        if self.kind in ("int", "length"):
            if isinstance(value, str) and self.kind == "length":
                parsed = human_int(value)
                value = parsed if parsed is not None else value
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(self.expected)
            return value
        if self.kind == "fraction":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(self.expected)
            return float(value)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(self.expected)
            return value
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise ValueError(self.expected)
            return value
        if self.kind == "json":
            return SpeculativeConfig.parse(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(self.expected)
        return value

    def _from_text(self, word: str) -> Any:
        if self.kind == "int" and word.strip().isdigit():
            return int(word)
        if self.kind == "fraction":
            try:
                return float(word)
            except ValueError:
                return word
        if self.kind == "bool" and word.lower() in ("true", "false"):
            return word.lower() == "true"
        return word

    def words(self, value: Any) -> list[str]:
        """This argument on a command line: ``--enforce-eager``, ``--max-model-len 4096``."""
        if self.kind == "bool":
            return [self.flag] if value else [f"--no-{self.flag[2:]}"]
        if isinstance(value, SpeculativeConfig):
            return [self.flag, value.to_json()]
        return [self.flag, f"{value:g}" if isinstance(value, float) else str(value)]


def _arg(default: Any, **meta: Any) -> Any:
    return field(default=default, metadata={"arg": Arg(**meta)})


_ALL = "0.11-0.33"


@dataclass(frozen=True)
class ServeArgs:
    """The serve arguments of one deployment, each field one ``vllm serve`` flag (its metadata an
    :class:`Arg`); ``extra_args`` are the flags the project does not model, passed through, not judged.

    Defaults are vLLM's, so a field at its default is left off the command line (except the
    :attr:`Arg.always` ones). Validated on construction: a bad value is a :class:`ConfigError`
    naming the field and what was expected.
    """

    # ------------------------------------------------------------ parallel layout
    tp: int = _arg(1, flag="--tensor-parallel-size", short="-tp", kind="int", section=DEPLOYMENT,
                   group=PARALLEL, versions=_ALL, help="GPUs each layer is split over (tensor parallel).")
    pp: int = _arg(1, flag="--pipeline-parallel-size", short="-pp", kind="int", section=DEPLOYMENT,
                   group=PARALLEL, versions=_ALL, help="Pipeline stages: one engine uses tp x pp GPUs.")
    dp: int = _arg(1, flag="--data-parallel-size", short="-dp", kind="int", section=DEPLOYMENT,
                   group=PARALLEL, versions=_ALL,
                   help="Data-parallel engines of tp x pp GPUs each; a MoE model's experts span tp x dp ranks.")
    ep: bool = _arg(False, flag="--enable-expert-parallel", short="-ep", kind="bool", section=DEPLOYMENT,
                    group=PARALLEL, versions=_ALL,
                    help="Expert parallelism: each of tp x dp ranks holds whole experts.")
    # ------------------------------------------------------------ engine settings
    kv_cache_dtype: str = _arg(
        "auto", flag="--kv-cache-dtype", kind="choice", choices=KV_CACHE_DTYPES, section=DEPLOYMENT,
        group=ENGINE, versions=_ALL, choice_versions={"float16": "0.33", "nvfp4": "0.33", "nvfp4_ds_mla": "0.33"},
        help="KV-cache dtype; auto resolves through the checkpoint (a ModelOpt kv_cache_scheme means fp8).")
    dtype: str = _arg("auto", flag="--dtype", kind="choice", choices=DTYPES, section=SERVE, group=ENGINE,
                      versions=_ALL, help="Activation and weight dtype; float32 doubles 16-bit weights.")
    quantization: str | None = _arg(
        None, flag="--quantization", kind="name", section=SERVE, group=ENGINE, versions=_ALL,
        help="Quantization method, e.g. fp8 (online FP8 of a 16-bit checkpoint).")
    max_model_len: int | None = _arg(None, flag="--max-model-len", kind="length", section=SERVE, group=ENGINE,
                                     versions=_ALL, help="Context length (default: the config's).")
    max_num_seqs: int | None = _arg(None, flag="--max-num-seqs", kind="int", section=SERVE, group=ENGINE,
                                    versions=_ALL, help="Requests batched at once (default: vLLM's per GPU).")
    max_num_batched_tokens: int | None = _arg(
        None, flag="--max-num-batched-tokens", kind="length", section=SERVE, group=ENGINE, versions=_ALL,
        help="Tokens per scheduler step: the profile run's forward pass (default: vLLM's per GPU).")
    gpu_memory_utilization: float = _arg(
        0.9, flag="--gpu-memory-utilization", kind="fraction", section=SERVE, group=ENGINE, versions=_ALL,
        always=True, help="Fraction of each GPU's memory vLLM may use.")
    enforce_eager: bool = _arg(False, flag="--enforce-eager", kind="bool", section=SERVE, group=ENGINE,
                               versions=_ALL, help="No CUDA graphs and no torch.compile.")
    speculative_config: SpeculativeConfig | None = _arg(  # noqa: RUF009 (a field(), like every other)
        None, flag="--speculative-config", kind="json", section=SERVE, group=ENGINE, versions=_ALL,
        help='Speculative decoding, vLLM\'s JSON: {"method": ..., "num_speculative_tokens": N, "model": DRAFT}.')
    # ------------------------------------------------------------ not modelled
    extra_args: tuple[str, ...] = ()
    """Flags the project does not model, in order; passed through untouched and reported as not judged."""

    def __post_init__(self) -> None:
        if isinstance(self.extra_args, str):
            raise ConfigError(f"ServeArgs.extra_args: expected a list of arguments (not one string), "
                              f"got {self.extra_args!r}")
        for name, arg in ARGS.items():
            value = getattr(self, name)
            if value is None and _default(name) is None:
                continue
            try:
                object.__setattr__(self, name, arg.parse(value))
            except ValueError as exc:
                raise ConfigError(f"ServeArgs.{name} ({arg.flag}): expected {exc}, got {value!r}") from None
        extra = tuple(str(a) for a in self.extra_args)
        modelled, rest = split_extra_args(extra)
        if modelled:
            given = {name: getattr(self, name) for name in ARGS if getattr(self, name) != _default(name)}
            folded = fold_extra_args(given, extra, where="ServeArgs")
            for name in ARGS:
                object.__setattr__(self, name, getattr(folded, name))
        object.__setattr__(self, "extra_args", rest)

    # ------------------------------------------------------------ the layout's sizes
    @property
    def world_size(self) -> int:
        """GPUs of one engine: TP x PP (``ParallelConfig.world_size``)."""
        return self.tp * self.pp

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole deployment: DP engines of TP x PP each."""
        return self.tp * self.pp * self.dp

    @property
    def moe_tp_size(self) -> int:
        """How many ways each expert's FFN is split: 1 with EP, else TP x DP."""
        return 1 if self.ep else self.tp * self.dp

    @property
    def ep_size(self) -> int:
        """How many ranks the experts are spread over: TP x DP with EP, else 1."""
        return self.tp * self.dp if self.ep else 1

    def describe(self) -> str:
        """``TP=8+EP``, ``TP=4 PP=2``, ``DP=2 TP=4+EP KV fp8`` (the layout, as a planner row shows it)."""
        parts = []
        if self.dp > 1:
            parts.append(f"DP={self.dp}")
        parts.append(f"TP={self.tp}" + ("+EP" if self.ep else ""))
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.kv_cache_dtype != "auto":
            parts.append(f"KV {self.kv_cache_dtype}")
        return " ".join(parts)

    def layout_only(self) -> ServeArgs:
        """The parallel layout and KV dtype alone (engine settings at their defaults)."""
        return ServeArgs(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep, kv_cache_dtype=self.kv_cache_dtype)

    def with_layout(self, layout: ServeArgs) -> ServeArgs:
        """These engine settings with ``layout``'s TP, PP, DP, EP and KV dtype."""
        return replace(self, tp=layout.tp, pp=layout.pp, dp=layout.dp, ep=layout.ep,
                       kv_cache_dtype=layout.kv_cache_dtype)

    # ------------------------------------------------------------ what derives from the fields
    def argv(self) -> list[str]:
        """The ``vllm serve`` flags after the model: every field off its default (and the
        :attr:`Arg.always` ones), in declaration order, then ``extra_args`` untouched. The one
        place a command line is built: the launch and the planner both call it."""
        words: list[str] = []
        for name, arg in ARGS.items():
            value = getattr(self, name)
            if arg.always or value != _default(name):
                words += arg.words(value)
        return words + list(self.extra_args)

    def to_record(self) -> dict[str, Any]:
        """Plain, stable data: every field by name (vLLM's defaults included) and the flags not
        judged. What the report records as judged, and a key a benchmark baseline can compare."""
        record: dict[str, Any] = {name: _plain(getattr(self, name)) for name in ARGS}
        record["not_judged"] = list(self.extra_args)
        return record

    def deploy_entry(self) -> dict[str, Any]:
        """The fields off their defaults (and the always ones) as deploy-file keys:
        ``{"deployment": {...}, "serve": {...}}`` (what ``--write-deploy`` writes)."""
        entry: dict[str, dict[str, Any]] = {DEPLOYMENT: {}, SERVE: {}}
        for name, arg in ARGS.items():
            value = getattr(self, name)
            if arg.always or value != _default(name):
                entry[arg.section][name] = _plain(value)
        if self.extra_args:
            entry[SERVE]["extra_args"] = list(self.extra_args)
        return entry


def _plain(value: Any) -> Any:
    """A field's value as plain data (a :class:`SpeculativeConfig` as its JSON object)."""
    return value.to_dict() if isinstance(value, SpeculativeConfig) else value


Layout = ServeArgs
"""What the load rules judge: the serve arguments (the name the rules' signatures use)."""

ARGS: Mapping[str, Arg] = {f.name: f.metadata["arg"] for f in fields(ServeArgs) if "arg" in f.metadata}
"""Every modelled serve argument by field name (= deploy-file key), in declaration order."""
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ServeArgs) if "arg" in f.metadata}
_BY_FLAG: dict[str, str] = {flag: name for name, arg in ARGS.items() for flag in arg.flags}
_BY_NEGATED: dict[str, str] = {f"--no-{arg.flag[2:]}": name for name, arg in ARGS.items() if arg.kind == "bool"}


def _default(name: str) -> Any:
    return _DEFAULTS[name]


def field_for_key(key: str) -> str | None:
    """The field a deploy-file key names: the field itself (``tp``) or vLLM's name (``tensor_parallel_size``)."""
    if key in ARGS:
        return key
    return next((name for name, arg in ARGS.items() if arg.vllm_name == key), None)


def keys(section: str) -> tuple[str, ...]:
    """The deploy-file keys of ``section`` (:data:`DEPLOYMENT` or :data:`SERVE`): the field names;
    vLLM's names for them (:attr:`Arg.vllm_name`) are accepted too."""
    return tuple(name for name, arg in ARGS.items() if arg.section == section)


# ---------------------------------------------------------------- extra_args

def split_extra_args(extra: Sequence[str]) -> tuple[list[tuple[str, str, Any]], tuple[str, ...]]:
    """The modelled flags of ``extra`` as ``(field, as written, value text or bool)``, and the rest
    untouched. ``--flag value``, ``--flag=value``, short flags and ``--no-`` for switches."""
    modelled: list[tuple[str, str, Any]] = []
    rest: list[str] = []
    index = 0
    while index < len(extra):
        word = extra[index]
        flag, has_value, inline = word.partition("=")
        name = _BY_FLAG.get(flag)
        negated = _BY_NEGATED.get(flag)
        if negated is not None and not has_value:
            modelled.append((negated, word, False))
        elif name is not None and ARGS[name].kind == "bool":
            modelled.append((name, word, inline if has_value else True))
        elif name is not None:
            if has_value:
                modelled.append((name, word, inline))
            elif index + 1 < len(extra):
                modelled.append((name, f"{word} {extra[index + 1]}", extra[index + 1]))
                index += 1
            else:
                raise ConfigError(f"extra_args: {word} needs a value ({ARGS[name].expected})")
        else:
            rest.append(word)
        index += 1
    return modelled, tuple(rest)


def fold_extra_args(given: Mapping[str, Any], extra: Sequence[str], *, where: str = "deployment",
                    spelled: Mapping[str, str] | None = None) -> ServeArgs:
    """:class:`ServeArgs` from the keys ``given`` and ``extra``: a modelled flag in ``extra`` is
    taken as that field's value, unless a key gives it another (then one :class:`ConfigError`:
    say it once); unmodelled flags stay in ``extra_args``. ``spelled`` names each key as written."""
    modelled, rest = split_extra_args(extra)
    values = dict(given)
    seen: dict[str, tuple[str, Any]] = {}
    for name, written, raw in modelled:
        arg = ARGS[name]
        try:
            value = arg.parse(raw, text=True)
        except ValueError as exc:
            raise ConfigError(f"{where}: `{written}` in extra_args: expected {exc}") from None
        if name in seen and seen[name][1] != value:
            raise ConfigError(f"{where}: `{seen[name][0]}` and `{written}` in extra_args: say it once")
        seen[name] = (written, value)
        if name in given and given[name] != value:
            key = (spelled or {}).get(name, name)
            shown = str(given[name]).lower() if isinstance(given[name], bool) else given[name]
            raise ConfigError(f"{where}: `{written}` in extra_args and `{key}: {shown}`: say it once")
        values[name] = value
    return ServeArgs(**values, extra_args=rest)


# ---------------------------------------------------------------- command-line flags (the planner)

def add_arguments(parser: argparse._ActionsContainer, group: str = ENGINE) -> None:
    """One argparse option per field of ``group``, each from its declaration (flag, type, choices)."""
    for name, arg in ARGS.items():
        if arg.group != group:
            continue
        if arg.kind == "bool":
            parser.add_argument(arg.flag, dest=name, action="store_true", help=arg.help)
            continue
        default = _default(name)
        shown = f" (default {default:g})" if isinstance(default, float) else ""
        metavar = "JSON" if arg.kind == "json" else name.upper() if not arg.choices else None
        parser.add_argument(arg.flag, dest=name, metavar=metavar,
                            type=_argparse_type(arg), choices=arg.choices or None, default=None,
                            help=arg.help + shown)


def _argparse_type(arg: Arg) -> Any:
    def convert(text: str) -> Any:
        try:
            return arg.parse(text, text=True)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {exc}") from None
    convert.__name__ = arg.kind
    return convert


def from_namespace(namespace: argparse.Namespace, group: str = ENGINE) -> dict[str, Any]:
    """The fields of ``group`` that the command line gave (what :func:`add_arguments` declared)."""
    given = {}
    for name, arg in ARGS.items():
        if arg.group != group:
            continue
        value = getattr(namespace, name, None)
        if value is not None and not (arg.kind == "bool" and value is False):
            given[name] = value
    return given


__all__ = ["ARGS", "DTYPES", "Arg", "Layout", "ServeArgs", "SpeculativeConfig", "add_arguments", "field_for_key",
           "fold_extra_args", "from_namespace", "human_int", "keys", "split_extra_args"]
