"""The opt-in two-GPU markers end to end with pytester: the stand-in nvidia-smi for the host
(captured 8-GPU PCIe box, one H200), the labelled stand-in worker Python replaying the worker's
output (tests/standin/workers/README.md), ``--gpu-worker-python`` naming it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parents[1] / "standin" / "workers"
ARGS = ("-p", "no:cacheprovider", "--gpu-worker-python", str(WORKERS / "python"))

TESTS = """
import pytest

@pytest.mark.nccl_allreduce(tp=2)
def test_allreduce():
    pass

@pytest.mark.gpu_p2p(gpus=[2, 3], timeout=30)
def test_p2p():
    pass

def test_fixture(nccl_allreduce):
    assert nccl_allreduce.evidence["fabric"] == "PCIe"
"""


def test_markers_pass_on_a_pcie_box_and_say_the_fabric(
    pytester: pytest.Pytester, standin: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    standin("rtx8-clean")
    monkeypatch.setenv("GPUREADY_STANDIN_WORKER", str(WORKERS / "nccl-pcie.txt"))
    pytester.makepyfile(test_two=TESTS.split("@pytest.mark.gpu_p2p")[0]
                        + "def test_fixture(nccl_allreduce):\n    assert nccl_allreduce.evidence['fabric'] == 'PCIe'\n")
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=2)


def test_a_wrong_sum_and_a_broken_pair_fail(
    pytester: pytest.Pytester, standin: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    standin("rtx8-clean")
    monkeypatch.setenv("GPUREADY_STANDIN_WORKER", str(WORKERS / "nccl-wrong-sum.txt"))
    pytester.makepyfile(test_two=TESTS.split("@pytest.mark.gpu_p2p")[0])
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*local: NCCL all-reduce of 256 MB over GPUs 0,1 (PCIe): wrong sum in 50 elements*"])
    monkeypatch.setenv("GPUREADY_STANDIN_WORKER", str(WORKERS / "p2p-corrupt.txt"))
    pytester.makepyfile(test_two="import pytest\n\n@pytest.mark.gpu_p2p(gpus=[0, 1])\ndef test_p2p():\n    pass\n")
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*local: P2P over CUDA IPC failed for GPUs 0,1*",
                                 "*GPU 0 <-> GPU 1: bytes came back wrong (read True, write False)*"])


def test_one_gpu_skips_and_bad_marker_arguments_are_one_line(
    pytester: pytest.Pytester, standin: Callable[[str], Path],
) -> None:
    standin("h200-idle")
    pytester.makepyfile(test_two="import pytest\n\n@pytest.mark.nccl_allreduce(tp=2)\ndef test_a():\n    pass\n\n"
                                 "@pytest.mark.gpu_p2p(tp=1)\ndef test_b():\n    pass\n")
    result = pytester.runpytest(*ARGS, "-rs")
    result.assert_outcomes(skipped=1, errors=1)
    result.stdout.fnmatch_lines(["@pytest.mark.gpu_p2p: tp=1; expected a whole number >= 2",
                                 "SKIPPED * local: a TP=2 group needs 2 GPUs; 1 selected here"])
    assert "Traceback" not in result.stdout.str()


def test_gpu_ids_selects_the_free_gpu_while_the_other_is_held(
    pytester: pytest.Pytester, standin: Callable[[str], Path],
) -> None:
    standin("h200x2-one-held")
    pytester.makepyfile(test_clean="def test_clean(gpus_clean):\n    pass\n")
    free = pytester.runpytest("-p", "no:cacheprovider", "--gpu-ids", "0")
    free.assert_outcomes(passed=1)
    held = pytester.runpytest("-p", "no:cacheprovider", "--gpu-ids", "1")
    held.assert_outcomes(failed=1)
    held.stdout.fnmatch_lines(["*GPU 1*pid 431*"])
