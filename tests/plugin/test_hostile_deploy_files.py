"""Hostile deploy files and model directories, run as a user runs the plugin (pytester, a subprocess).

Each case is one the issue found ending in an INTERNALERROR, an out-of-memory or a hang. Now each
must end the session with exit 4 (usage error) or a test error, one line naming the file and what
was expected, well within a generous deadline ("finished, not hung"), with no traceback, and with
nothing executed: a sentinel test that would record its run must not have run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
PLUGIN = ("-p", "pytest_gpuready.plugin.model_fixtures", "-p", "no:cacheprovider")
DEADLINE_S = 120
"""Generous: these finish in about a second; the bound only tells "finished" from "hung"."""

MINIMAL = "deployments:\n  - name: tiny\n    model: models/tiny\n    tp: 2\n"
SENTINEL = """
def test_sentinel():
    open("ran.txt", "w").write("ran")
"""


def _bomb(levels: int, width: int = 9) -> str:
    """A billion-laughs document: ``width ** levels`` strings if every alias were copied out."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _inline_bomb(levels: int, width: int = 9) -> str:
    """The same graph as one flow sequence of anchors (it fits under any key)."""
    items = ["&a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for level in range(1, levels + 1):
        items.append(f"&a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "[" + ", ".join(items) + "]"


def run_plugin(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(SENTINEL)
    return pytester.runpytest_subprocess(*PLUGIN, *args, timeout=DEADLINE_S)


def assert_usage_error(pytester: pytest.Pytester, result: pytest.RunResult, message: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert len(errors[0]) < 400  # a bounded excerpt, never an expanded value
    result.stderr.fnmatch_lines([message])
    for stream in (result.stdout.str(), result.stderr.str()):
        assert "Traceback" not in stream
        assert "INTERNALERROR" not in stream
    assert not (pytester.path / "ran.txt").exists()  # nothing was executed


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("deployments:\n  - ? [a, b]\n    : 1\n",
                 "ERROR: --gpuready-config: */deploy.yaml: not valid YAML at line 2, column 7: a list used as a "
                 "mapping key (line 2); keys must be plain values such as strings", id="list-as-key"),
    pytest.param("deployments:\n  - {? {a: 1} : x}\n",
                 "ERROR: --gpuready-config: */deploy.yaml: not valid YAML at line 2, column 8: a dict used as a "
                 "mapping key*", id="mapping-as-key"),
    pytest.param("deployments: " + "[" * 50_000 + "]" * 50_000 + "\n",
                 # libyaml's own flow-depth limit (1000) or ours, whichever its lookahead meets first
                 "ERROR: --gpuready-config: */deploy.yaml: *nest*", id="50000-levels-flow"),
    pytest.param("deployments:\n  " + "- " * 50_000 + "x\n",
                 "ERROR: --gpuready-config: */deploy.yaml: nested more than 100 levels deep at line 2, *",
                 id="50000-levels-block"),
    pytest.param("deployments:\n  - name: tiny\n    model: models/ti\0ny\n    tp: 2\n",
                 "ERROR: --gpuready-config: */deploy.yaml: contains a NUL byte (line 3, byte offset 48); "
                 "expected text", id="nul-byte"),
    pytest.param('deployments:\n  - name: tiny\n    model: "models/ti\\0ny"\n    tp: 2\n',
                 "ERROR: --gpuready-config: */deploy.yaml: deployment 'tiny': key 'model': expected a directory "
                 "path (it holds a NUL byte, which no path can), got 'models/ti\\x00ny'", id="nul-escape"),
    pytest.param(_bomb(9) + "deployments: *a9\n",
                 "ERROR: --gpuready-config: */deploy.yaml: aliases would expand to more than 1,000,000 nodes at "
                 "line *, column * (alias *a*); refusing a billion-laughs file", id="billion-laughs"),
    pytest.param(MINIMAL.replace("tp: 2", "description: " + _inline_bomb(4) + "\n    tp: *a4"),
                 "ERROR: --gpuready-config: */deploy.yaml: deployment 'tiny': key 'tp': expected a whole number "
                 ">= 1, got [[][[][[][[]...], [[]...], *...", id="alias-graph-in-message"),
    pytest.param(MINIMAL.replace("tp: 2", "tp: " + "1" * 5000),
                 "ERROR: --gpuready-config: */deploy.yaml: not valid YAML: Exceeds the limit (4300 digits)*",
                 id="5000-digit-int"),
    pytest.param(MINIMAL.replace("name: tiny", "name: tiny\n    when: 2001-13-45"),
                 "ERROR: --gpuready-config: */deploy.yaml: not valid YAML: month must be in 1..12",
                 id="impossible-date"),
    pytest.param(MINIMAL.replace("name: tiny", "name: tiny\n    " + "k" * 1000 + ": 1"),
                 "ERROR: --gpuready-config: */deploy.yaml: deployment 'tiny': unknown key 'kkkkkkkkkkkkkkkkkkkkk"
                 "kkkkkkkkkkkk*k...'; expected one of: *", id="1000-character-key"),
    pytest.param(MINIMAL.replace("name: tiny", "name: tiny\n    " + "k" * 200_000 + ": 1"),
                 "ERROR: --gpuready-config: */deploy.yaml: not valid YAML at line 3, column 200005: could not "
                 "find expected ':'", id="200k-character-key"),
])
def test_hostile_yaml_is_one_usage_error(pytester: pytest.Pytester, text: str, message: str) -> None:
    (pytester.path / "deploy.yaml").write_text(text)
    result = run_plugin(pytester, "--gpuready-config", "deploy.yaml")
    assert_usage_error(pytester, result, message)


def test_not_utf8_names_the_byte(pytester: pytest.Pytester) -> None:
    (pytester.path / "deploy.yaml").write_bytes(MINIMAL.encode().replace(b"tiny\n", b"tiny\xff\n", 1))
    result = run_plugin(pytester, "--gpuready-config", "deploy.yaml")
    assert_usage_error(pytester, result, "ERROR: --gpuready-config: */deploy.yaml: not UTF-8 text (byte 0xff at "
                                         "line 2, byte offset 27)")


@pytest.fixture
def fifo(pytester: pytest.Pytester) -> Iterator[Path]:
    path = pytester.path / "fifo.yaml"
    os.mkfifo(path)
    yield path
    # should a reader ever block on it, one writer lets it go, so the test suite cannot hang here
    threading.Thread(target=lambda: _unblock(path), daemon=True).start()


def _unblock(path: Path) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


@pytest.mark.parametrize(("kind", "message"), [
    ("fifo", "a FIFO (named pipe); expected a regular file"),
    ("dev-zero", "a character device; expected a regular file"),
    ("loop", "a symlink loop (too many levels of symbolic links)"),
    ("directory", "a directory; expected a regular file"),
])
def test_deploy_file_that_is_not_a_file(pytester: pytest.Pytester, fifo: Path, kind: str, message: str) -> None:
    target = {"fifo": fifo, "dev-zero": pytester.path / "zero.yaml", "loop": pytester.path / "loop.yaml",
              "directory": pytester.path / "dir.yaml"}[kind]
    if kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "loop":
        target.symlink_to(target)
    elif kind == "directory":
        target.mkdir()
    result = run_plugin(pytester, "--gpuready-config", target.name)
    assert_usage_error(pytester, result, f"ERROR: --gpuready-config: */{target.name}: {message}")


def test_model_that_is_a_symlink_loop(pytester: pytest.Pytester) -> None:
    (pytester.path / "models").mkdir()
    loop = pytester.path / "models" / "tiny"
    loop.symlink_to(loop)
    (pytester.path / "deploy.yaml").write_text(MINIMAL)
    result = run_plugin(pytester, "--gpuready-config", "deploy.yaml")
    assert_usage_error(pytester, result, "ERROR: --gpuready-config: */deploy.yaml: deployment 'tiny': key 'model': "
                                         "expected a model directory, not a symlink loop (too many levels of "
                                         "symbolic links), got 'models/tiny'")


def test_a_20_mb_deploy_file_loads(pytester: pytest.Pytester) -> None:
    """Finished, not hung: the C loader reads 20 MB in seconds (timed in benchmarks/bench_deploy_yaml.py)."""
    from benchmarks.bench_deploy_yaml import deploy_text

    (pytester.path / "deploy.yaml").write_text(deploy_text(20_000_000))
    pytester.makepyfile("""
        def test_count(deploy_config):
            assert len(deploy_config.deployments) > 10_000
    """)
    result = pytester.runpytest_subprocess(*PLUGIN, "--gpuready-config", "deploy.yaml", timeout=DEADLINE_S * 3)
    result.assert_outcomes(passed=1)


# ---------------------------------------------------------------- model directories


def _model_dir(pytester: pytest.Pytester, name: str = "tiny") -> Path:
    directory = pytester.path / "models" / name
    directory.mkdir(parents=True)
    return directory


MODEL_TEST = """
import pytest

@pytest.mark.model(path="models/tiny")
def test_model(model_spec):
    open("ran.txt", "w").write("ran")
"""


def run_model_test(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makepyfile(MODEL_TEST)
    return pytester.runpytest_subprocess(*PLUGIN, timeout=DEADLINE_S)


def assert_test_error(pytester: pytest.Pytester, result: pytest.RunResult, message: str) -> None:
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert not (pytester.path / "ran.txt").exists()


@pytest.mark.parametrize(("kind", "message"), [
    ("fifo", "*/models/tiny/config.json: a FIFO (named pipe); expected a regular file"),
    ("dev-zero", "*/models/tiny/config.json: a character device; expected a regular file"),
    ("loop", "*/models/tiny/config.json: a symlink loop (too many levels of symbolic links)"),
    ("deep", "*/models/tiny/config.json: JSON nested too deeply (arrays or objects inside one another more "
             "levels than the decoder allows, about 1000)"),
    ("huge", "*/models/tiny/config.json: 16.0 MiB, over the limit of 16.0 MiB for a config.json"),
    ("nul", "*/models/tiny/config.json: contains a NUL byte (line 1, byte offset 1); expected text"),
    ("latin1", "*/models/tiny/config.json: not UTF-8 text (byte 0xe9 at line 1, byte offset 13)"),
    ("digits", "*/models/tiny/config.json: not valid JSON (Exceeds the limit (4300 digits)*"),
])
def test_hostile_config_json_errors_the_test(pytester: pytest.Pytester, kind: str, message: str) -> None:
    config = _model_dir(pytester) / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    elif kind == "loop":
        config.symlink_to(config)
    elif kind == "deep":
        config.write_text('{"a": ' + "[" * 50_000 + "]" * 50_000 + "}")
    elif kind == "huge":
        with config.open("wb") as handle:
            handle.truncate(16 * 1024 * 1024 + 1)  # sparse: no disk used
    elif kind == "nul":
        config.write_bytes(b"{\0}")
    elif kind == "latin1":
        config.write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    elif kind == "digits":
        config.write_text('{"hidden_size": ' + "7" * 5000 + "}")
    try:
        result = run_model_test(pytester)
    finally:
        if kind == "fifo":
            _unblock(config)
    assert_test_error(pytester, result, message)


def test_model_directory_that_is_a_symlink_loop_errors_the_test(pytester: pytest.Pytester) -> None:
    (pytester.path / "models").mkdir()
    loop = pytester.path / "models" / "tiny"
    loop.symlink_to(loop)
    result = run_model_test(pytester)
    assert_test_error(pytester, result, "*/models/tiny: a symlink loop (too many levels of symbolic links); "
                                        "expected a model directory with config.json")
