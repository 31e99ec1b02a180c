"""nvidia-smi CSV parsing on real captured outputs."""

from __future__ import annotations

import pytest

from pytest_gpuready import ProbeError
from pytest_gpuready.host.gpus import (
    QUERY_GPU_FIELDS,
    explain_nvidia_smi_failure,
    parse_query_compute_apps,
    parse_query_gpu,
    split_csv_rows,
)
from tests.conftest import captured

H200_UUID = "GPU-f2fae499-8acc-9d1b-c9d7-1eddd5be03b4"


def test_idle_h200_full_row() -> None:
    (gpu,) = parse_query_gpu(captured("h200x1-idle.txt"), QUERY_GPU_FIELDS, "h")
    assert gpu.index == 0
    assert gpu.uuid == H200_UUID
    assert gpu.name == "NVIDIA H200"
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.memory_reserved_mib) == (0, 143771, 616)
    assert gpu.power_draw_w == pytest.approx(121.88)
    assert gpu.compute_capability == (9, 0)
    assert gpu.sm == "SM90"
    assert gpu.driver_version == "580.159.04"
    assert gpu.memory_free_mib == 143771 - 616


def test_rows_with_units_as_engineers_query_them() -> None:
    """The RTX PRO 6000 captures were taken without ``nounits``: ``96721 MiB``, ``84.30 W``."""
    gpus = parse_query_gpu(
        captured("rtxpro6000x8-minimax-tp4-loaded.txt"), ("index", "memory.used", "memory.total", "power.draw")
    )
    assert [g.memory_used_mib for g in gpus] == [96721] * 4 + [3] * 4
    assert {g.memory_total_mib for g in gpus} == {97887}
    assert gpus[0].power_draw_w == pytest.approx(84.30)


def test_compute_apps_joined_to_gpu_by_uuid() -> None:
    gpus = parse_query_gpu(captured("h200x1-idle.txt"))
    apps_text = captured("h200x1-one-process.txt").splitlines()[0]
    (process,) = parse_query_compute_apps(apps_text, gpus)
    assert (process.pid, process.name, process.used_memory_mib, process.gpu_index) == (431, "python3", 20998, 0)


def test_process_name_with_comma_space_is_kept_whole() -> None:
    gpus = parse_query_gpu(captured("h200x1-idle.txt"))
    text = f"77, python3 -c import a, b, 512, {H200_UUID}"
    (process,) = parse_query_compute_apps(text, gpus)
    assert process.name == "python3 -c import a, b"
    assert process.used_memory_mib == 512


def test_na_memory_is_an_error_naming_gpu_and_field() -> None:
    text = captured("h200x1-idle.txt").replace(", 0, 143771,", ", [N/A], 143771,")
    with pytest.raises(ProbeError, match=r"^box: GPU 0: memory.used reads \[N/A\]; it cannot be judged$"):
        parse_query_gpu(text, host="box")


def test_not_supported_optional_fields_become_none() -> None:
    text = captured("h200x1-idle.txt").replace("121.88", "[Not Supported]").replace(", 616,", ", [N/A],")
    (gpu,) = parse_query_gpu(text)
    assert gpu.power_draw_w is None
    assert gpu.memory_reserved_mib is None


def test_truncated_row_is_an_error_with_the_line() -> None:
    text = captured("h200x1-idle.txt")[:70]
    with pytest.raises(ProbeError, match=r"line 1 has 4 fields, expected 10"):
        parse_query_gpu(text, host="box")


def test_non_numeric_memory_is_an_error() -> None:
    text = captured("h200x1-idle.txt").replace(", 0, 143771,", ", lots, 143771,")
    with pytest.raises(ProbeError, match=r"memory.used is 'lots', expected a number"):
        parse_query_gpu(text)


def test_empty_output_is_an_error() -> None:
    with pytest.raises(ProbeError, match="listed no GPUs"):
        parse_query_gpu("\n")


def test_unavailable_process_memory_is_none() -> None:
    gpus = parse_query_gpu(captured("h200x1-idle.txt"))
    (process,) = parse_query_compute_apps(f"9, python3, [N/A], {H200_UUID}", gpus)
    assert process.used_memory_mib is None


def test_split_csv_requires_the_asked_columns() -> None:
    with pytest.raises(ProbeError, match="expected 2"):
        split_csv_rows("1, 2, 3", ("a", "b"), "what")


@pytest.mark.parametrize(
    ("output", "code", "expected"),
    [
        ("sh: 1: nvidia-smi: not found", 127, "nvidia-smi is not installed or not on PATH"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            9,
            "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate",
        ),
        ("", 4, "nvidia-smi failed (exit 4): no output"),
    ],
)
def test_nvidia_smi_failures_are_explained(output: str, code: int, expected: str) -> None:
    assert explain_nvidia_smi_failure(output, code).startswith(expected)


def test_gpu_name_with_separator_keeps_every_number_in_its_field() -> None:
    """The issue's misread: a comma in the GPU name shifted memory.total into memory.used."""
    text = captured("h200x1-idle.txt").replace("NVIDIA H200", "NVIDIA H200, rev. A, 141GB")
    (gpu,) = parse_query_gpu(text, host="box")
    assert gpu.name == "NVIDIA H200, rev. A, 141GB"
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.memory_reserved_mib) == (0, 143771, 616)
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.driver_version == "580.159.04"


def test_process_name_with_separators_anywhere() -> None:
    gpus = parse_query_gpu(captured("h200x1-idle.txt"))
    for name in ("a, b", ", starts", "ends, ", "x, 512, y", "/opt/serving, v2/bin/python3, 7"):
        (process,) = parse_query_compute_apps(f"77, {name}, 512, {H200_UUID}", gpus)
        assert process.name == name.strip()
        assert (process.pid, process.used_memory_mib, process.gpu_index) == (77, 512, 0)


def test_row_with_extra_cells_and_no_free_text_field_is_an_error() -> None:
    with pytest.raises(ProbeError, match=r"^box: nvidia-smi --query-gpu: line 1 has 5 fields, expected 3 "
                                         r"\(index,memory.used,memory.total\)"):
        parse_query_gpu("0, 1, 2, 3, 4", ("index", "memory.used", "memory.total"), "box")


def test_a_shifted_number_is_an_error_not_a_misread() -> None:
    """A row with one cell too few where a free-text field sits: the numbers do not fit their fields."""
    row = f"0, {H200_UUID}, NVIDIA H200, 00000000:00:06.0, 0, 143771, 616, 121.88, 9.0, 580.159.04, extra"
    text = row.replace("00000000:00:06.0, 0, ", "00000000:00:06.0, ")
    with pytest.raises(ProbeError, match=r"line 1: compute_cap is '580.159.04', expected a compute capability "
                                         r"like 9.0; the row does not fit the 10 fields asked"):
        parse_query_gpu(text, host="box")


def test_compute_apps_row_that_does_not_fit_is_an_error_not_a_traceback() -> None:
    gpus = parse_query_gpu(captured("h200x1-idle.txt"))
    with pytest.raises(ProbeError, match=r"line 1: pid is 'python3', expected a number"):
        parse_query_compute_apps(f"python3, 431, 512, {H200_UUID}", gpus, host="box")
    with pytest.raises(ProbeError, match=r"line 1 has 2 fields, expected 4"):
        parse_query_compute_apps("431, python3", gpus, host="box")
