"""Where ``--gpuready-report`` and ``--gpuready-plot`` write, and what they never do to a path.

One test per kind of path a user names: a new file, a report of the last run, a symlink to one,
``-`` and ``/dev/stdout``, a character device (``/dev/null`` and ``/dev/full``, made with mknod in a
fake ``/dev``-like folder), a FIFO with and without a reader, a directory, a read-only folder (a
read-only tmpfs in a private mount namespace), an existing file named as the plot folder, and two
runs writing one report at once. Each asserts the outcome, the one-line message, that the run is
bounded, and that nothing was replaced or left behind. The inner suite touches ``ran`` so a refusal
can be shown to come before any test runs.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.report_schema import validate

SUITE = "def test_ran():\n    open('ran', 'w').close()\n"
RUN_LIMIT_S = 120
"""The inner runs are one trivial test: seconds. The limit only turns a hang (a FIFO open) into a failure."""
IS_ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def _no_report_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("GPUREADY_HOST", "GPUREADY_HOSTS_FILE", "GPUREADY_REPORT", "GPUREADY_JSON", "GPUREADY_PLOT"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A real inner pytest process, killed at :data:`RUN_LIMIT_S` (a blocked write would hang it)."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=RUN_LIMIT_S)


def entries(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def assert_refused_before_any_test(result: pytest.RunResult, pytester: pytest.Pytester, line: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [text for text in result.stderr.lines if text.startswith("ERROR:")]
    assert len(errors) == 1
    assert errors[0] == f"ERROR: {line}"
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert not (pytester.path / "ran").exists()


def test_a_new_report_file_is_written_whole_and_nothing_else_is_left(suite: pytest.Pytester) -> None:
    result = run(suite, "--gpuready-report", "out/report.json")
    result.assert_outcomes(passed=1)
    path = suite.path / "out" / "report.json"
    result.stdout.fnmatch_lines(["gpuready: report written to out/report.json"])
    validate(json.loads(path.read_text()))
    assert entries(path.parent) == ["report.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()


def test_the_last_report_is_replaced_atomically_keeping_its_mode(suite: pytest.Pytester) -> None:
    path = suite.path / "report.json"
    path.write_text('{"old": true}\n')
    path.chmod(0o640)
    before = path.stat().st_ino
    result = run(suite, "--gpuready-report", "report.json")
    result.assert_outcomes(passed=1)
    validate(json.loads(path.read_text()))
    assert path.stat().st_ino != before  # a new file renamed over it, not the old one rewritten in place
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [name for name in entries(suite.path) if name.startswith(".")] == []


def test_a_symlink_to_the_report_stays_a_symlink(suite: pytest.Pytester) -> None:
    (suite.path / "reports").mkdir()
    target = suite.path / "reports" / "latest.json"
    target.write_text("{}\n")
    link = suite.path / "report.json"
    link.symlink_to(target)
    result = run(suite, "--gpuready-report", "report.json")
    result.assert_outcomes(passed=1)
    assert link.is_symlink()
    assert os.readlink(link) == str(target)
    validate(json.loads(target.read_text()))
    assert entries(target.parent) == ["latest.json"]


def _json_in(text: str) -> dict[str, object]:
    """The report inside a run's standard output (pytest's own lines around it)."""
    lines = text.splitlines()
    start = lines.index("{")
    end = len(lines) - lines[::-1].index("}")
    document = json.loads("\n".join(lines[start:end]))
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_dash_and_dev_stdout_write_to_standard_output_and_replace_nothing(suite: pytest.Pytester,
                                                                        name: str) -> None:
    before = os.lstat("/dev/stdout")
    result = run(suite, "--gpuready-report", name)
    result.assert_outcomes(passed=1)
    validate(_json_in(result.stdout.str()))
    result.stdout.fnmatch_lines(["gpuready: report written to standard output"])
    after = os.lstat("/dev/stdout")
    assert stat.S_ISLNK(after.st_mode) == stat.S_ISLNK(before.st_mode)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert not (suite.path / "-").exists()
    assert [n for n in entries(suite.path) if n.startswith(".")] == []


def _device(folder: Path, name: str, minor: int) -> Path:
    """A character device node in a fake /dev-like folder: mem major 1, minor 3 (null) or 7 (full)."""
    if not IS_ROOT:
        pytest.skip("making a device node (mknod) needs root")
    path = folder / name
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


def test_a_null_device_is_written_to_and_stays_a_device(suite: pytest.Pytester, tmp_path: Path) -> None:
    null = _device(tmp_path, "null", 3)
    result = run(suite, "--gpuready-report", str(null))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"gpuready: report written to {null}"])
    assert stat.S_ISCHR(null.stat().st_mode)
    assert null.stat().st_rdev == os.makedev(1, 3)
    assert entries(tmp_path) == ["null"]


def test_a_full_device_is_a_one_line_error_and_stays_a_device(suite: pytest.Pytester, tmp_path: Path) -> None:
    full = _device(tmp_path, "full", 7)
    result = run(suite, "--gpuready-report", str(full))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"gpuready: report not written: {full}: could not be written: No space left on "
                                 "device"])
    assert "report written to" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert stat.S_ISCHR(full.stat().st_mode)
    assert full.stat().st_rdev == os.makedev(1, 7)
    assert entries(tmp_path) == ["full"]


def test_a_fifo_with_a_reader_gets_the_whole_report(suite: pytest.Pytester, tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()  # blocks in open() until the writer opens the FIFO
    result = run(suite, "--gpuready-report", str(fifo))
    reader.join(timeout=RUN_LIMIT_S)
    result.assert_outcomes(passed=1)
    validate(json.loads(received[0]))
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert entries(tmp_path) == ["report.fifo"]


def test_a_fifo_that_nobody_reads_does_not_hang_the_run(suite: pytest.Pytester, tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    result = run(suite, "--gpuready-report", str(fifo))  # killed at RUN_LIMIT_S if the open blocked
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"gpuready: report not written: {fifo}: could not be written: a FIFO that no "
                                 "process is reading"])
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert entries(tmp_path) == ["report.fifo"]


def test_a_directory_is_refused_before_any_test_runs(suite: pytest.Pytester) -> None:
    (suite.path / "reports").mkdir()
    result = run(suite, "--gpuready-report", "reports")
    assert_refused_before_any_test(result, suite, "--gpuready-report reports: is a directory; expected a file path "
                                   "(a new or regular file), - for standard output, a character device or a FIFO")
    assert entries(suite.path / "reports") == []


def test_a_read_only_folder_is_refused_before_any_test_runs(suite: pytest.Pytester, tmp_path: Path) -> None:
    """A read-only tmpfs mounted in a private mount namespace (``unshare -m``): only the inner run sees it."""
    if not IS_ROOT or shutil.which("unshare") is None:
        pytest.skip("a private mount namespace (unshare -m) needs root and util-linux")
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "report.json").write_text("{}\n")  # the last report, under the read-only mount too
    script = (f"mount -t tmpfs -o size=64k none {folder} && echo '{{}}' > {folder}/report.json && "
              f"mount -o remount,ro {folder} && exec {sys.executable} -m pytest -p no:cacheprovider "
              f"--gpuready-report {folder}/report.json")
    result = suite.run("unshare", "-m", "sh", "-c", script, timeout=RUN_LIMIT_S)
    assert_refused_before_any_test(result, suite, f"--gpuready-report {folder}/report.json: cannot create a file in "
                                   f"{folder}: Read-only file system")
    assert entries(folder) == ["report.json"]  # the namespace's mount is gone with it: this is the folder as it was


def test_an_existing_file_named_as_the_plot_folder_is_refused_and_kept(suite: pytest.Pytester) -> None:
    pytest.importorskip("matplotlib")
    notes = suite.path / "notes.txt"
    notes.write_text("my notes\n")
    result = run(suite, "--gpuready-plot", "notes.txt")
    assert_refused_before_any_test(result, suite, "--gpuready-plot notes.txt: is a regular file; expected a folder "
                                   "(new or existing) for the plots")
    assert notes.read_text() == "my notes\n"


def test_two_runs_writing_one_report_at_once_both_succeed(suite: pytest.Pytester) -> None:
    """Two CI jobs on one runner: each renames a whole report of its own; the last one wins."""
    path = suite.path / "report.json"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--gpuready-report", str(path)]
    for _ in range(5):
        runs = [subprocess.Popen(command, cwd=suite.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(2)]
        outputs = [job.communicate(timeout=RUN_LIMIT_S)[0] for job in runs]
        assert [job.returncode for job in runs] == [0, 0], outputs
        assert all(f"gpuready: report written to {path}" in out for out in outputs)
        validate(json.loads(path.read_text()))
        assert [name for name in entries(suite.path) if name.startswith(".")] == []


def _umask() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask in /proc/self/status")
