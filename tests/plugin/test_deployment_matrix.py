"""The ``deployment`` marker, the built-in suite and ``check_deployment`` agree on every layout.

The matrix: every public config of tests/data/configs (17 today, with their
``hf_quant_config.json``) and both example models (examples/models), each at every layout of TP
1-16 with and without EP, DP 1-4, PP 1-2 and each KV-cache dtype of the declaration (2,560
layouts), each with no GPU architecture known, on SM90 and on SM120: 19 x 2,560 x 3 = 145,920
judgements.

Coverage, and why it is split this way:

- **Every combination, through the Python APIs** (:func:`test_every_layout_reaches_the_rules_alike`):
  the deploy file's path (``load_deploy_config`` -> ``Deployment.serve``, ``gpu_arch``, ``gpus``;
  ``inspect_model`` on the model directory) hands ``check_deployment`` the same serve arguments
  and model as a library caller's ``ServeArgs`` and ``model_spec_from_config``; and on each
  verdict the suite's per-rule tests and the whole-layout verdict (the marker's, and
  ``test_vllm_load_rules``') agree: nothing fails where the layout passes, a layout fails with
  the headline of its first failing rule, an undecided layout fails no rule.
- **Through pytester, the marker and the suite themselves**
  (:func:`test_marker_suite_and_check_deployment_agree`): one layout for each distinct outcome
  of the matrix, where an outcome is (model, GPU architecture, the pass/fail/undecided of
  ``test_vllm_load_rules``, ``test_tp_divisibility``, ``test_fp8_block_alignment``,
  ``test_max_model_len``, ``test_mla_kv_backend``, and the rule the layout's verdict names), so
  every way the verdicts differ in kind is run end to end (~150 layouts, ~900 test items), plus
  the layout of issue 17 where the marker and the suite once disagreed (Qwen3.5-35B-A3B at TP=2
  DP=3). Each item's outcome and headline (its ``gpuready.*`` property, and the failure or skip
  message's first line) must equal what ``check_deployment`` says for that layout.

About 50 s on a loaded two-core machine (the matrix ~45 s of it, the pytester run ~6 s); the
FP8 rule's answers for nearby TPs are cached per model, which is what makes the matrix affordable.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuready import check_deployment, model_spec_from_config
from pytest_gpuready.model.backends import KV_CACHE_DTYPES
from pytest_gpuready.model.deploy_config import Deployment, load_deploy_config
from pytest_gpuready.model.rules import DeploymentCheck
from pytest_gpuready.model.serve_args import ServeArgs
from pytest_gpuready.model.spec import ModelSpec, inspect_model
from pytest_gpuready.verdict import Verdict

ROOT = Path(__file__).parent.parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
EXAMPLES = ROOT / "examples" / "models"
ARCHS: tuple[tuple[int, int] | None, ...] = (None, (9, 0), (12, 0))
LAYOUTS = tuple(ServeArgs(tp=tp, ep=ep, dp=dp, pp=pp, kv_cache_dtype=kv) for tp, ep, dp, pp, kv in itertools.product(
    range(1, 17), (False, True), range(1, 5), (1, 2), KV_CACHE_DTYPES))
SUITE: Mapping[str, str | None] = {
    "test_vllm_load_rules": None,  # the whole layout's verdict, as the marker enforces it
    "test_tp_divisibility": "tensor_parallel",
    "test_fp8_block_alignment": "fp8_block_alignment",
    "test_max_model_len": "max_model_len",
    "test_mla_kv_backend": "attention_backend",
}
"""The suite's static tests and the verdict of ``check_deployment`` each reads."""
MARKER = "test_marked"
"""The pytester file's test that carries ``@pytest.mark.deployment(name)``."""
ISSUE_17 = ("Qwen__Qwen3.5-35B-A3B", None, ServeArgs(tp=2, dp=3))


@dataclass(frozen=True)
class Model:
    name: str
    directory: Path
    library: ModelSpec
    """What a library caller builds: ``model_spec_from_config`` of the same files."""


def _models(root: Path) -> list[Model]:
    found = []
    for config in sorted(CONFIGS.glob("*.json")):
        if config.name.endswith(".hf_quant_config.json"):
            continue
        directory = root / config.stem
        directory.mkdir(parents=True)
        shutil.copy(config, directory / "config.json")
        quant = config.with_name(f"{config.stem}.hf_quant_config.json")
        if quant.exists():
            shutil.copy(quant, directory / "hf_quant_config.json")
        found.append((config.stem, directory))
    found += [(f"example-{d.name}", d) for d in sorted(EXAMPLES.iterdir()) if (d / "config.json").exists()]
    models = []
    for name, directory in found:
        quant_file = directory / "hf_quant_config.json"
        hf_quant = json.loads(quant_file.read_text()) if quant_file.exists() else None
        library = model_spec_from_config(json.loads((directory / "config.json").read_text()), name=directory.name,
                                         hf_quant_config=hf_quant)
        models.append(Model(name, directory, library))
    return models


def _arch_tag(arch: tuple[int, int] | None) -> str:
    return "noarch" if arch is None else f"sm{arch[0]}{arch[1]}"


def _layout_tag(layout: ServeArgs) -> str:
    return f"tp{layout.tp}{'ep' if layout.ep else ''}-dp{layout.dp}-pp{layout.pp}-{layout.kv_cache_dtype}"


def _entry(name: str, model: str, arch: tuple[int, int] | None, layout: ServeArgs) -> dict[str, Any]:
    """A deploy-file deployment for ``layout``, written as a user would (the declaration's keys)."""
    entry: dict[str, Any] = {"name": name, "model": model, "gpus": list(range(layout.total_gpus)), "tp": layout.tp}
    if layout.pp > 1:
        entry["pp"] = layout.pp
    if layout.dp > 1:
        entry["dp"] = layout.dp
    if layout.ep:
        entry["ep"] = True
    if layout.kv_cache_dtype != "auto":
        entry["kv_cache_dtype"] = layout.kv_cache_dtype
    if arch is not None:
        entry["gpu_arch"] = _arch_tag(arch)
    return entry


def _yaml(entries: list[dict[str, Any]]) -> str:
    """A deploy file, one flow mapping a deployment (PyYAML's pure-Python dumper takes ~20 s for 7,680)."""
    return "deployments:\n" + "".join(f"  - {json.dumps(entry)}\n" for entry in entries)


def _kind(verdict: Verdict) -> str:
    return "undecided" if verdict.needs is not None else "pass" if verdict.ok else "fail"


def _outcome(verdict: Verdict) -> tuple[str, str]:
    """What a test shows for a verdict: pass / fail / undecided (a skip), and its headline."""
    return _kind(verdict), verdict.summary


def expected_outcomes(check: DeploymentCheck, verdict: Verdict) -> dict[str, tuple[str, str]]:
    """Each suite test's and the marker's outcome, as ``check_deployment`` has it (``verdict``
    is ``check.verdict()``)."""
    outcomes = {test: _outcome(check.verdicts[rule] if rule else verdict) for test, rule in SUITE.items()}
    outcomes[MARKER] = _outcome(verdict)
    return outcomes


@dataclass(frozen=True)
class Judged:
    model: Model
    spec: ModelSpec
    deployment: Deployment
    check: DeploymentCheck
    verdict: Verdict
    """``check.verdict()``: the whole layout's, which the marker and ``test_vllm_load_rules`` enforce."""
    outcomes: Mapping[str, tuple[str, str]]
    """:func:`expected_outcomes` of ``check``."""

    @property
    def arch(self) -> tuple[int, int] | None:
        return self.deployment.gpu_arch

    @property
    def outcome_class(self) -> tuple[object, ...]:
        kinds = tuple(kind for kind, _ in self.outcomes.values())
        return (self.model.name, self.arch, kinds, self.verdict.evidence.get("rule", ""))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> list[Judged]:
    """Every (model, GPU architecture, layout), read through the deploy file as the plugin reads it."""
    root = tmp_path_factory.mktemp("matrix")
    models = _models(root / "models")
    deploy = root / "deploy.yaml"
    entries = [_entry(f"{_arch_tag(arch)}-{_layout_tag(layout)}", "m", arch, layout)
               for arch in ARCHS for layout in LAYOUTS]
    deploy.write_text(_yaml(entries))
    deployments = load_deploy_config(deploy).deployments
    judged = []
    for model in models:
        spec = inspect_model(model.directory)  # what the model_spec fixture reads
        for deployment in deployments:
            check = check_deployment(spec, deployment.serve, deployment.gpu_arch, deployment.vllm_version,
                                     visible_gpus=len(deployment.gpus or ()),
                                     allow_long_max_model_len=deployment.allow_long_max_model_len)
            verdict = check.verdict()
            judged.append(Judged(model, spec, deployment, check, verdict, expected_outcomes(check, verdict)))
    return judged


def test_every_layout_reaches_the_rules_alike(matrix: list[Judged]) -> None:
    configs = [c for c in CONFIGS.glob("*.json") if not c.name.endswith(".hf_quant_config.json")]
    examples = [d for d in EXAMPLES.iterdir() if (d / "config.json").exists()]
    assert len(_models_seen(matrix)) == len(configs) + len(examples)
    assert len(matrix) == (len(configs) + len(examples)) * len(ARCHS) * len(LAYOUTS)
    per_model = len(ARCHS) * len(LAYOUTS)
    for index, (arch, layout) in enumerate(itertools.product(ARCHS, LAYOUTS)):
        deployment = matrix[index].deployment  # the deploy file's reading is the same for every model
        assert (deployment.serve, deployment.gpu_arch, deployment.gpus) == (
            layout, arch, tuple(range(layout.total_gpus))), deployment.name
    for first in matrix[::per_model]:
        # the directory the marker and the suite read is the config a library caller hands over
        library, spec = first.model.library, first.spec
        quantization = replace(library.quantization, source=spec.quantization.source,
                               kv_cache_source=spec.quantization.kv_cache_source) if (
            library.quantization and spec.quantization) else library.quantization
        # the rules read neither the name, nor where a file was read from, nor the weights' sizes
        assert replace(library, name=spec.name, source=spec.source, quantization=quantization,
                       weights=spec.weights) == spec, first.model.name
    mismatches = [problem for judged in matrix for problem in _disagreements(judged)]
    assert not mismatches, f"{len(mismatches)} disagreements, e.g. {mismatches[:5]}"


def _models_seen(matrix: list[Judged]) -> set[str]:
    return {judged.model.name for judged in matrix}


def _disagreements(judged: Judged) -> Iterator[str]:
    """What would make the suite's tests contradict the layout's verdict (the marker's)."""
    check, verdict, outcomes = judged.check, judged.verdict, judged.outcomes
    whole, headline = outcomes["test_vllm_load_rules"]
    where = f"{judged.model.name} {_arch_tag(judged.arch)} {judged.deployment.serve.describe()}"
    word = {"pass": "loads", "fail": "fails", "undecided": "undecided"}[whole]
    if check.word != word:
        yield f"{where}: planner word {check.word!r}, verdict {whole}"
    kinds = {test: kind for test, (kind, _) in outcomes.items()}
    if whole == "pass" and set(kinds.values()) != {"pass"}:
        yield f"{where}: the layout passes but {kinds}"
    if whole != "fail" and "fail" in kinds.values():
        yield f"{where}: the layout is {whole} but a suite test fails: {kinds}"
    if whole == "fail":
        rule = verdict.evidence.get("rule")
        first = check.first_failure
        if first is None or first[0] != rule or first[1].summary != headline:
            yield f"{where}: the headline {headline!r} is not the first failing rule's"
        tested = next((test for test, name in SUITE.items() if name == rule), None)
        if tested is not None and outcomes[tested] != (whole, headline):
            yield f"{where}: {tested} shows {outcomes[tested]}, the layout {(whole, headline)}"
    if whole == "undecided":
        rule = verdict.evidence.get("rule")
        tested = next((test for test, name in SUITE.items() if name == rule), None)
        if tested is not None and kinds[tested] != "undecided":
            yield f"{where}: undecided by {rule}, but {tested} is {kinds[tested]}"


def _slice(matrix: list[Judged]) -> list[Judged]:
    """One layout per distinct outcome (first in matrix order), and the layout of issue 17."""
    chosen: dict[tuple[object, ...], Judged] = {}
    for judged in matrix:
        chosen.setdefault(judged.outcome_class, judged)
        if (judged.model.name, judged.arch, judged.deployment.serve) == ISSUE_17:
            chosen[("issue 17",)] = judged
    return list(chosen.values())


def _reported(reports: Sequence[pytest.TestReport]) -> dict[tuple[str, str], tuple[str, str]]:
    """Per (test function, deployment): the outcome and headline the run showed."""
    seen: dict[tuple[str, str], list[pytest.TestReport]] = {}
    for report in reports:
        function, _, param = report.nodeid.rpartition("::")[2].partition("[")
        seen.setdefault((function, param.rstrip("]")), []).append(report)
    shown = {}
    for key, item_reports in seen.items():
        # each phase's report carries the item's properties so far: the last one has them all
        properties = [value for name, value in item_reports[-1].user_properties if str(name).startswith("gpuready.")]
        headline = str(properties[0]) if len(properties) == 1 else f"properties: {properties!r}"
        failed = [r for r in item_reports if r.failed]
        skipped = [r for r in item_reports if r.skipped]
        if failed:
            kind, message = "fail", failed[0].longreprtext
        elif skipped:
            longrepr = skipped[0].longrepr
            kind = "undecided"
            message = str(longrepr[2]).removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
        else:
            kind, message = "pass", headline
        first_line = message.splitlines()[0] if message else ""
        shown[key] = (kind, headline if first_line == headline else f"{headline} / shown: {first_line}")
    return shown


def test_marker_suite_and_check_deployment_agree(pytester: pytest.Pytester, matrix: list[Judged],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUREADY_HOST", "GPUREADY_MODEL", "GPUREADY_CONFIG", "GPUREADY_VLLM_VERSION",
                 "GPUREADY_GPU_ARCH", "GPUREADY_STANDIN_SCENARIO"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no GPU here: the architecture only from the deployment
    chosen = _slice(matrix)
    assert len(chosen) > 100
    entries, expected = [], {}
    for index, judged in enumerate(chosen):
        name = f"{index:03d}-{_arch_tag(judged.arch)}-{_layout_tag(judged.deployment.serve)}"
        entries.append(_entry(name, str(judged.model.directory), judged.arch, judged.deployment.serve))
        for test, outcome in judged.outcomes.items():
            expected[(test, name)] = outcome
    (pytester.path / "deploy.yaml").write_text(_yaml(entries))
    names = [entry["name"] for entry in entries]
    pytester.makepyfile(test_marker=f"""
        import pytest

        @pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.deployment(n), id=n) for n in {names!r}])
        def {MARKER}(name):
            pass
    """)
    recorder = pytester.inline_run(
        "test_marker.py", "--pyargs", "pytest_gpuready.preflight.test_deployments", "-p", "no:cacheprovider",
        "--gpuready-config", "deploy.yaml", "-k", "not memory_fit and not model_files and not weights_footprint",
        "-W", "ignore::pytest_gpuready.errors.GpuReadyWarning")
    shown = _reported(recorder.getreports("pytest_runtest_logreport"))
    assert set(shown) == set(expected), sorted(set(shown) ^ set(expected))[:5]
    differ = {key: (expected[key], shown[key]) for key in expected if shown[key] != expected[key]}
    assert not differ, f"{len(differ)} of {len(expected)} differ, e.g. {list(differ.items())[:3]}"
    kinds = {kind for kind, _ in expected.values()}
    assert kinds == {"pass", "fail", "undecided"}
