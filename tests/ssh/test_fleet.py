"""Several GPU hosts in one run, without xdist: per-host test ids, one connection per host, and a
host that is down failing its own tests only.

The "hosts" are the ports of one real loopback sshd (``loopback_fleet``), each replaying its own
stand-in scenario (CI has no GPU); a bound but never listening port is the host that is down.
The /dev/shm test is left out (``-k "not shm"``): every "host" here shares this machine's
/dev/shm, which other tiers write to.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.report_schema import validate
from tests.sshd import STANDIN_SCENARIOS, LoopbackSshd

pytestmark = pytest.mark.ssh

PREFLIGHT = ("--pyargs", "pytest_gpuready.preflight.test_host", "-k", "not shm", "-p", "no:cacheprovider", "-rA")
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED) \S*::(test_\w+(?:\[[^\]]*\])?)")
SCENARIOS = ("h200-idle", "h200-one-process", "rtx8-clean")


def followed_by(result: pytest.RunResult, heading: str, line: str) -> bool:
    """True when a line containing ``heading`` is followed by one starting with ``line``.

    (fnmatch would read the ``[host]`` of a test id as a character class.)
    """
    lines = result.outlines
    return any(heading in lines[i] and lines[i + 1].startswith(line) for i in range(len(lines) - 1))


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each test id's outcome, from the ``-rA`` short summary."""
    found: dict[str, str] = {}
    for line in result.outlines:
        match = _SUMMARY.match(line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


@pytest.fixture(autouse=True)
def _no_host_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("GPUREADY_HOST", "GPUREADY_HOSTS_FILE", "GPUREADY_GPU_IDS", "GPUREADY_SSH_IDENTITY",
                     "GPUREADY_SSH_OPTIONS", "GPUREADY_STANDIN_SCENARIO"):
        monkeypatch.delenv(variable, raising=False)


@contextlib.contextmanager
def fleet_scenarios(fleet: LoopbackSshd) -> Iterator[None]:
    """Each port of the fleet sshd replays its own scenario: idle H200, a held H200, an idle 8-GPU box."""
    with contextlib.ExitStack() as stack:
        for port, scenario in zip(fleet.ports, SCENARIOS, strict=True):
            stack.enter_context(fleet.use_scenario(scenario, port=port))
        yield


@pytest.fixture
def down_port() -> Iterator[int]:
    """A loopback port bound but never listening: a connection to it is refused at once."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        yield unused.getsockname()[1]


def connections_per_host(fleet: LoopbackSshd, before: dict[int, int]) -> dict[int, int]:
    """Connections sshd authenticated per port (per "host") since ``before`` was read."""
    now = fleet.accepted_by_port()
    return {port: now.get(port, 0) - before.get(port, 0) for port in fleet.ports}


def ssh_args(fleet: LoopbackSshd) -> list[str]:
    args = ["--ssh-identity", fleet.identity_file]
    for option in fleet.ssh_options:
        args += ["--ssh-option", option]
    return args


def write_hosts_file(path: Path, fleet: LoopbackSshd, down: int) -> Path:
    lines = ["# the fleet of this test: three ports of the loopback sshd and one that is down", ""]
    lines += [f"{fleet.spec_for(port)}   # {scenario}" for port, scenario in zip(fleet.ports, SCENARIOS, strict=True)]
    lines.append(f"ssh://{fleet.user}@127.0.0.1:{down}")
    path.write_text("\n".join(lines) + "\n")
    return path


def fleet_outcomes(fleet: LoopbackSshd, down_port: int) -> dict[str, str]:
    """What the preflight of :func:`write_hosts_file`'s fleet must give, test id by test id: the held
    H200 fails ``gpus_clean``, the down host errors in both tests, everything else passes."""
    idle, held, eight = (f"127.0.0.1:{port}" for port in fleet.ports)
    down = f"127.0.0.1:{down_port}"
    return {
        f"test_gpus_are_clean[{idle}]": "PASSED", f"test_gpu_topology[{idle}]": "PASSED",
        f"test_gpus_are_clean[{held}]": "FAILED", f"test_gpu_topology[{held}]": "PASSED",
        f"test_gpus_are_clean[{eight}]": "PASSED", f"test_gpu_topology[{eight}]": "PASSED",
        f"test_gpus_are_clean[{down}]": "ERROR", f"test_gpu_topology[{down}]": "ERROR",
    }


def test_each_host_gets_its_own_tests_and_a_down_host_fails_only_its_own(
        pytester: pytest.Pytester, loopback_fleet: LoopbackSshd, down_port: int) -> None:
    fleet = loopback_fleet
    hosts = write_hosts_file(pytester.path / "fleet.txt", fleet, down_port)
    before_by_port = fleet.accepted_by_port()
    with fleet_scenarios(fleet):
        result = pytester.runpytest(*PREFLIGHT, "--gpu-hosts-file", str(hosts), *ssh_args(fleet))
    held = f"127.0.0.1:{fleet.ports[1]}"
    down = f"127.0.0.1:{down_port}"
    assert outcomes(result) == fleet_outcomes(fleet, down_port)
    assert followed_by(result, f" ERROR at setup of test_gpus_are_clean[{down}] ",
                       f"{fleet.user}@{down}: ssh failed: connection refused")
    assert followed_by(result, f" test_gpus_are_clean[{held}] ",
                       f"1 of 1 GPUs on {fleet.user}@{held} are not clean (tolerance 64 MiB)")
    # once per test of the down host, each time with the cause: the connection is tried once
    assert result.stdout.str().count(f"{fleet.user}@{down}: ssh failed: connection refused") >= 2
    assert "Traceback" not in result.stdout.str()
    assert connections_per_host(fleet, before_by_port) == {port: 1 for port in fleet.ports}


def barrier_scenario(directory: Path, arrivals: Path, hosts: int) -> Path:
    """``h200-idle`` whose ``--query-gpu`` answers only once the probes of all ``hosts`` are waiting."""
    directory.mkdir()
    for item in (STANDIN_SCENARIOS / "h200-idle").iterdir():
        (directory / item.name).symlink_to(item)
    (directory / "barrier").write_text(f"{arrivals}\n{hosts}\n{BARRIER_LIMIT_S}\n")
    return directory


BARRIER_LIMIT_S = 120
"""How long a stand-in waits for the other hosts' probes: a bound for a hung run, not a speed target
(probes that run at once meet within a second; one after another, the first one never sees the rest)."""


@pytest.mark.parametrize("header", [[], ["--no-header"]], ids=["header", "no-header"])
def test_the_hosts_are_probed_at_once(pytester: pytest.Pytester, loopback_fleet: LoopbackSshd,
                                      header: list[str]) -> None:
    """Without xdist every host is probed at the start, concurrently, for the header or (without
    one) once the tests are collected: each host's stand-in answers ``--query-gpu`` only once all
    hosts' probes are waiting, so one-after-another probes fail."""
    fleet = loopback_fleet
    arrivals = pytester.path / "arrivals"
    arrivals.mkdir()
    hosts = pytester.path / "fleet.txt"
    hosts.write_text("".join(f"{fleet.spec_for(port)}\n" for port in fleet.ports))
    before_by_port = fleet.accepted_by_port()
    with contextlib.ExitStack() as stack:
        for index, port in enumerate(fleet.ports):
            scenario = barrier_scenario(pytester.path / f"barrier-{index}", arrivals, len(fleet.ports))
            stack.enter_context(fleet.use_scenario(scenario, port=port))
        result = pytester.runpytest(*PREFLIGHT, *header, "--gpu-hosts-file", str(hosts), *ssh_args(fleet),
                                    "--gpu-probe-timeout", str(BARRIER_LIMIT_S * 2))
    assert "never arrived" not in result.stdout.str()
    assert set(outcomes(result).values()) == {"PASSED"}
    assert len(outcomes(result)) == 2 * len(fleet.ports)
    # Two --query-gpu a probe (the listing and the health fields, one round trip): nothing probed twice.
    assert len(list(arrivals.iterdir())) == 2 * len(fleet.ports)
    assert connections_per_host(fleet, before_by_port) == {port: 1 for port in fleet.ports}


def test_repeated_gpu_host_is_the_same_fleet_and_one_host_keeps_plain_ids(
        pytester: pytest.Pytester, loopback_fleet: LoopbackSshd) -> None:
    fleet = loopback_fleet
    first, second = fleet.ports[0], fleet.ports[1]
    with fleet_scenarios(fleet):
        two = pytester.runpytest(*PREFLIGHT, "--gpu-host", fleet.spec_for(first), "--gpu-host",
                                 fleet.spec_for(second), *ssh_args(fleet))
        one = pytester.runpytest(*PREFLIGHT, "--gpu-host", fleet.spec_for(first), *ssh_args(fleet))
    assert set(outcomes(two)) == {f"{test}[127.0.0.1:{port}]" for test in ("test_gpus_are_clean", "test_gpu_topology")
                                  for port in (first, second)}
    assert outcomes(one) == {"test_gpus_are_clean": "PASSED", "test_gpu_topology": "PASSED"}


USER_TESTS = """
import pytest

def test_reads_the_host(gpu_host, gpu_snapshot, record_property):
    assert gpu_snapshot.host == gpu_host.name

@pytest.mark.gpus_clean
def test_marked(request):
    pass

def test_server_factory_per_host(vllm_server, gpu_host):
    assert vllm_server.servers == []

def test_no_host_at_all():
    pass
"""


def test_user_tests_are_parametrized_only_where_they_read_a_host(
        pytester: pytest.Pytester, loopback_fleet: LoopbackSshd) -> None:
    fleet = loopback_fleet
    pytester.makepyfile(test_user=USER_TESTS)
    idle, held = fleet.ports[0], fleet.ports[1]
    with fleet_scenarios(fleet):
        result = pytester.runpytest("-p", "no:cacheprovider", "-rA", "--gpu-host", fleet.spec_for(idle),
                                    "--gpu-host", fleet.spec_for(held), *ssh_args(fleet))
    a, b = f"127.0.0.1:{idle}", f"127.0.0.1:{held}"
    assert outcomes(result) == {
        f"test_reads_the_host[{a}]": "PASSED", f"test_reads_the_host[{b}]": "PASSED",
        f"test_marked[{a}]": "PASSED", f"test_marked[{b}]": "FAILED",  # a measured violation fails
        f"test_server_factory_per_host[{a}]": "PASSED", f"test_server_factory_per_host[{b}]": "PASSED",
        "test_no_host_at_all": "PASSED",
    }


def test_under_xdist_each_host_is_one_worker_and_one_connection(
        pytester: pytest.Pytester, loopback_fleet: LoopbackSshd, down_port: int) -> None:
    pytest.importorskip("xdist")
    fleet = loopback_fleet
    hosts = write_hosts_file(pytester.path / "fleet.txt", fleet, down_port)
    before_by_port = fleet.accepted_by_port()
    report = pytester.path / "report.json"
    with fleet_scenarios(fleet):
        result = pytester.runpytest(*PREFLIGHT, "-n", "3", "--gpu-hosts-file", str(hosts), *ssh_args(fleet),
                                    "--gpuready-report", str(report), "--junitxml", str(pytester.path / "j.xml"))
    idle, held, eight = (f"127.0.0.1:{port}" for port in fleet.ports)
    down = f"127.0.0.1:{down_port}"
    assert outcomes(result) == fleet_outcomes(fleet, down_port)
    result.stdout.fnmatch_lines(["gpuready: 4 hosts: * (each probed when a check first asks)"])
    # the controller probes nothing; each host's tests ran on one worker, over one connection
    assert connections_per_host(fleet, before_by_port) == {port: 1 for port in fleet.ports}
    # the report: written once, by the controller, from what the workers sent with their reports
    document = json.loads(report.read_text())
    validate(document)
    assert len(document["workers"]) == 3
    per_host = document["timings"]["per_host"]
    assert {name: len(totals["workers"]) for name, totals in per_host.items()} == {
        idle: 1, held: 1, eight: 1, down: 1}
    by_name = {host["name"]: host for host in document["hosts"]}
    assert by_name[held]["snapshot"]["gpus"][0]["memory_used_mib"] == 21007
    assert by_name[held]["worker"] == per_host[held]["workers"][0]
    assert by_name[eight]["gpu_count"] == 8
    assert by_name[down]["snapshot"] is None
    assert by_name[down]["error"].endswith("ssh failed: connection refused (is sshd running, is the port right?)")
    [failed] = [v for v in document["verdicts"] if not v["ok"]]
    assert (failed["name"], failed["host"]) == ("gpus_clean", held)
    assert failed["test"].endswith(f"test_gpus_are_clean[{held}]")
    # the JUnit XML of the controller carries each worker's properties
    properties = [p.get("name") for p in ET.parse(pytester.path / "j.xml").iter("property")]
    assert properties.count("gpuready.gpus_clean") == 3
