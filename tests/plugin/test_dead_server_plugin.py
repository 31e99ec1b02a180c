"""The pool never hands out a dead server: a server killed between tests fails later requests at once,
with how it died, and its teardown says it had died. pytester runs, a real process killed with
SIGKILL; the server is the labelled stand-in for vLLM's readiness routes (tests/standin/vllm_routes.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROUTES = f"{sys.executable} {Path(__file__).resolve().parents[1] / 'standin' / 'vllm_routes.py'}"

TESTS = """
import os, signal, time
from pytest_gpuready import ServeSpec

SPEC = ServeSpec(model="/m", served_model_name="m")

def test_kill_it(vllm_server):
    server = vllm_server(SPEC)
    os.killpg(server.pid, signal.SIGKILL)  # the crash, between two tests
    deadline = time.monotonic() + 60
    while server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.is_alive()

def test_asks_again(vllm_server):
    vllm_server(SPEC)

def test_and_again(vllm_server):
    vllm_server(SPEC)
"""


def test_a_dead_server_is_not_handed_out_and_its_teardown_says_it_died(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dead=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--vllm-cmd", ROUTES, f"--gpuready-json={report}")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_asks_again _*",
        "vLLM m: the server died after it was ready (killed by SIGKILL): not handing it out again",
        "*_ test_and_again _*",
        "vLLM m: the server died after it was ready (killed by SIGKILL): not handing it out again",
        "(this server died earlier in the session)",
    ])
    result.stdout.fnmatch_lines([
        "gpuready: m: teardown clean in * s: the server had died before the stop (killed by SIGKILL); "
        "0 processes stopped, /dev/shm clean",
    ])
    assert "Traceback" not in result.stdout.str()
    (teardown,) = json.loads(report.read_text())["teardowns"]
    assert (teardown["died"], teardown["exit_code"], teardown["stopped"]) == ("killed by SIGKILL", -9, [])


OVERLAPPING = """
from pytest_gpuready import ServeSpec

FIRST = ServeSpec(model="/m", served_model_name="first", gpus=(0, 1))
SECOND = ServeSpec(model="/m", served_model_name="second", gpus=(1, 2))

def test_first(vllm_server):
    assert vllm_server(FIRST).is_alive()

def test_second_stops_the_first_it_overlaps(vllm_server):
    (first,) = vllm_server.servers  # the spec as launched: with --vllm-cmd's command
    second = vllm_server(SECOND)
    assert second.is_alive() and not first.running  # stopped by the pool (is_alive: "ended by itself")
    assert [s.spec.served_model_name for s in vllm_server.servers if s.running] == ["second"]
"""


def test_a_server_on_overlapping_gpus_stops_the_running_one_first(pytester: pytest.Pytester) -> None:
    """serve/pool.py: two servers never share a GPU; the one in the way is stopped, verified, and recorded."""
    pytester.makepyfile(test_overlap=OVERLAPPING)
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--vllm-cmd", ROUTES, f"--gpuready-report={report}")
    result.assert_outcomes(passed=2)
    document = json.loads(report.read_text())
    first = next(t for t in document["teardowns"] if t["server"] == "first, TP=1")
    assert first["test"] == "test_overlap.py::test_second_stops_the_first_it_overlaps"  # stopped then, not at the end
    assert (first["ok"], first["exit_code"]) == (True, -15)
    assert all(t["ok"] for t in document["teardowns"])
    assert [s["spec"]["served_model_name"] for s in document["servers"]] == ["first", "second"]


STOPPED_EARLY = """
from pytest_gpuready import ServeSpec

BY_FIXTURE = ServeSpec(model="/m", served_model_name="by-fixture")
BY_ITSELF = ServeSpec(model="/m", served_model_name="by-itself")

def test_stops_it_through_the_fixture(vllm_server):
    assert vllm_server.stop(vllm_server(BY_FIXTURE)).ok

def test_stops_it_itself(vllm_server):
    server = vllm_server(BY_ITSELF)
    first = server.stop()
    assert first.ok and server.stop() is first

def test_later(vllm_server):
    assert not any(s.running for s in vllm_server.servers)

def test_asks_for_the_one_it_stopped_again(vllm_server):
    assert vllm_server(BY_ITSELF).running  # a new server: the one stopped is recorded as it is replaced
"""


def test_a_server_stopped_early_has_its_teardown_recorded_once(pytester: pytest.Pytester) -> None:
    """The session's end stops every server of the pool: one stopped already is not recorded again."""
    pytester.makepyfile(test_early=STOPPED_EARLY)
    report = pytester.path / "report.json"
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", "--vllm-cmd", ROUTES, f"--gpuready-report={report}",
                                f"--junitxml={junit}")
    result.assert_outcomes(passed=4)
    teardowns = json.loads(report.read_text())["teardowns"]
    assert [(t["server"], t["test"]) for t in teardowns] == [
        ("by-fixture, TP=1", "test_early.py::test_stops_it_through_the_fixture"),
        ("by-itself, TP=1", "test_early.py::test_asks_for_the_one_it_stopped_again"),  # as it was replaced
        ("by-itself, TP=1", "test_early.py::test_asks_for_the_one_it_stopped_again"),  # the new one, at the end
    ]
    assert teardowns[1]["stopped"] != teardowns[2]["stopped"]  # two servers (their pids), each once
    assert all(t["ok"] for t in teardowns)
    assert junit.read_text().count('name="gpuready.teardown_s"') == 3
