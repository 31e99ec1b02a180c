"""Under pytest-xdist, every test of one host runs on one worker, and different hosts run at once.

xdist's own ``--dist loadgroup`` groups nothing with pytest 9.2 (pytest-dev/pytest-xdist#1386);
these runs check the plugin's scheduler does, from what the workers really did: each test
appends ``host worker_id`` to a file. The hosts are never contacted (``gpu_host`` connects
lazily and these tests run no command), so they need not exist.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("xdist")  # the `fleet` extra; tox installs it

USER_TESTS = """
import os
import pytest

LOG = os.environ["GPUREADY_TEST_LOG"]

def note(what, worker_id):
    with open(LOG, "a") as log:
        log.write(f"{what} {worker_id}\\n")

@pytest.mark.parametrize("n", range(6))
def test_on_the_host(gpu_host, worker_id, n):
    note(gpu_host.name, worker_id)

@pytest.mark.parametrize("n", range(3))
def test_snapshot_of_the_host(gpu_host, worker_id, n):
    note(gpu_host.name, worker_id)

@pytest.mark.parametrize("n", range(8))
def test_no_host(worker_id, n):
    note("none", worker_id)
"""

GROUPED = """
import os
import pytest

LOG = os.environ["GPUREADY_TEST_LOG"]

@pytest.mark.parametrize("n", range(6))
@pytest.mark.xdist_group(name="db")
def test_db(worker_id, n):
    open(LOG, "a").write(f"db {worker_id}\\n")

@pytest.mark.parametrize("n", range(6))
@pytest.mark.xdist_group(name="cache")
def test_cache(worker_id, n):
    open(LOG, "a").write(f"cache {worker_id}\\n")
"""


SERVERS = """
import os
import pytest

@pytest.mark.parametrize("n", range(4))
def test_would_start_a_server(vllm_server, worker_id, n):  # the factory alone: nothing is launched
    open(os.environ["GPUREADY_TEST_LOG"], "a").write(f"local {worker_id}\\n")
"""


def workers_by_group(log: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        what, worker = line.split()
        found[what].add(worker)
    return dict(found)


@pytest.fixture
def log(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = pytester.path / "ran.log"
    monkeypatch.setenv("GPUREADY_TEST_LOG", str(path))
    for variable in ("GPUREADY_HOST", "GPUREADY_HOSTS_FILE"):
        monkeypatch.delenv(variable, raising=False)
    return path


def test_each_host_on_one_worker_and_the_hosts_in_parallel(pytester: pytest.Pytester, log: Path) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "3", "--gpu-host", "root@gpu-1",
                                "--gpu-host", "root@gpu-2", "--gpu-host", "root@gpu-3")
    result.assert_outcomes(passed=3 * 9 + 8)
    result.stdout.fnmatch_lines(["gpuready: xdist runs each host's tests on one worker (HostGroupScheduling; "
                                 "--dist load)"])
    ran = workers_by_group(log)
    for host in ("root@gpu-1", "root@gpu-2", "root@gpu-3"):
        assert len(ran[host]) == 1, (host, ran)
    assert len(ran["root@gpu-1"] | ran["root@gpu-2"] | ran["root@gpu-3"]) == 3  # three hosts, three workers


def test_one_host_on_one_worker_under_loadgroup(pytester: pytest.Pytester, log: Path) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "--gpu-host", "gpu-1")
    result.assert_outcomes(passed=9 + 8)
    ran = workers_by_group(log)
    assert len(ran["gpu-1"]) == 1, ran


def test_user_xdist_groups_are_honoured_under_loadgroup(pytester: pytest.Pytester, log: Path) -> None:
    """The fix for pytest-dev/pytest-xdist#1386 reaches users' own xdist_group marks too."""
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup")
    result.assert_outcomes(passed=12)
    ran = workers_by_group(log)
    assert len(ran["db"]) == 1
    assert len(ran["cache"]) == 1
    assert ran["db"] != ran["cache"]


def test_the_default_host_is_one_worker_too(pytester: pytest.Pytester, log: Path) -> None:
    """docs/fleet.md: "with one host and -n, that host's tests all run on one worker", for the
    default host (no --gpu-host) as well: two vllm_servers must never share this machine's GPUs."""
    pytester.makepyfile(test_user=USER_TESTS, test_servers=SERVERS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=9 + 8 + 4)
    result.stdout.fnmatch_lines(["gpuready: xdist runs each host's tests on one worker (HostGroupScheduling; "
                                 "--dist load)"])
    ran = workers_by_group(log)
    assert len(ran["local"]) == 1, ran
    assert len(ran["local"] | ran["none"]) == 2, ran  # the tests of no host still spread
