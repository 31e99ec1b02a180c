"""Clock-event reasons: the mask as the H200 reported it idle and under load, and the sampler."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_gpuready.errors import ProbeError
from pytest_gpuready.host.clock_events import (
    ClockEventSampler,
    ClockSample,
    LinkReading,
    parse_clock_events,
    parse_clock_sample,
    parse_mask,
    reason_names,
    throttling_reasons,
)
from pytest_gpuready.host.hosts import LocalHost
from tests.conftest import DATA

HEALTH = DATA / "nvidia-smi" / "h200-health"


def field(name: str, state: str = "idle") -> str:
    for line in (HEALTH / f"all-fields-{state}.tsv").read_text().splitlines():
        key, _, value = line.partition("\t")
        if key == name:
            return value
    raise KeyError(name)


def test_the_h200_idle_and_under_a_matmul() -> None:
    idle = parse_mask(field("clocks_event_reasons.active"))
    load = parse_mask(field("clocks_event_reasons.active", "load"))
    assert (idle, load) == (0x1, 0x4)
    assert reason_names(0x1) == ("gpu_idle",)
    assert reason_names(0x4) == ("sw_power_cap",)
    assert throttling_reasons(0x4) == ()  # the power cap is recorded, never judged
    assert parse_mask(field("clocks_event_reasons.supported")) == 0x1FF


def test_throttling_bits_and_unknown_bits() -> None:
    assert throttling_reasons(0x8 | 0x40 | 0x4) == ("hw_slowdown", "hw_thermal_slowdown")
    assert reason_names(0x1000) == ("0x1000",)


def test_not_supported_and_garbage() -> None:
    assert parse_mask("[N/A]") is None
    assert parse_mask("[Not Supported]") is None
    with pytest.raises(ProbeError, match="expected a bit mask"):
        parse_mask("Active")


def test_rows_of_one_call() -> None:
    text = f"0, {field('clocks_event_reasons.active', 'load')}\n1, [N/A]\n"
    assert parse_clock_events(text, "gpu-box") == {0: 0x4, 1: None}
    with pytest.raises(ProbeError, match=r"gpu-box: .*unexpected line"):
        parse_clock_events("garbled\n", "gpu-box")


def test_the_sampler_ors_every_sample_and_names_throttled_gpus() -> None:
    readings: Iterator[dict[int, int | None]] = iter([{0: 0x1, 1: 0x1}, {0: 0x4, 1: 0x48}, {0: 0x4, 1: 0x4}])
    took_two = threading.Event()
    last: dict[int, int | None] = {0: 0x4, 1: 0x4}

    def reader() -> dict[int, int | None]:
        try:
            value = next(readings)
        except StopIteration:
            took_two.set()
            return last
        return value

    sampler = ClockEventSampler(reader=reader, interval_s=0.01).start()
    assert took_two.wait(10)
    record = sampler.stop()
    assert record.seen == {0: 0x5, 1: 0x4D}
    assert record.throttled == {1: ("hw_slowdown", "hw_thermal_slowdown")}
    assert "GPU 1: gpu_idle, sw_power_cap, hw_slowdown, hw_thermal_slowdown (throttled)" in record.describe()
    assert record.to_dict()["throttled"] == {"1": ["hw_slowdown", "hw_thermal_slowdown"]}


def test_a_failed_sample_is_kept_not_raised() -> None:
    def reader() -> dict[int, int | None]:
        raise ProbeError("gpu-box: reading clock-event reasons failed (exit 9): driver gone")

    with ClockEventSampler(reader=reader, interval_s=0.01) as sampler:
        pass
    record = sampler.record
    assert record is not None
    assert not record.measured
    assert "not measured: gpu-box: reading clock-event reasons failed" in record.describe()


def test_a_benchmark_level_records_what_its_sampler_saw() -> None:
    from pytest_gpuready.serve.bench import LevelResult, latency_stats

    stats = latency_stats([0.1])
    sampler = ClockEventSampler(reader=lambda: {0: 0x4 | 0x40}, interval_s=10).start()
    level = LevelResult(1, 1, 0, 1.0, 10, 10, 1.0, 10.0, 20.0, 10.0, stats, stats, stats, stats,
                        clock_events=sampler.stop())
    assert level.throttled == {0: ("hw_thermal_slowdown",)}
    assert level.to_dict()["clock_events"]["reasons"]["0"]["names"] == ["sw_power_cap", "hw_thermal_slowdown"]


def _load_row(index: int, **changed: str) -> str:
    names = ("clocks_event_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max",
             "pcie.link.width.current", "pcie.link.width.max")
    return ", ".join([str(index), *(changed.get(n.replace(".", "_"), field(n, "load")) for n in names)])


def test_one_call_reads_the_mask_and_the_pcie_link() -> None:
    sample = parse_clock_sample(_load_row(0) + "\n" + _load_row(1, pcie_link_width_current="8") + "\n")
    assert sample.masks == {0: 0x4, 1: 0x4}
    assert sample.links == {0: LinkReading(5, 5, 16, 16), 1: LinkReading(5, 5, 8, 16)}
    legacy = parse_clock_sample("0, 0x0000000000000001\n")  # a driver that answered the mask alone
    assert (legacy.masks, legacy.links) == ({0: 0x1}, {})
    with pytest.raises(ProbeError, match="unexpected line"):
        parse_clock_sample("0, 0x1, 5\n", "gpu-box")


def test_a_link_below_its_maximum_for_the_whole_level_is_a_shortfall() -> None:
    idle = LinkReading(1, 5, 16, 16)  # the level's first sample, before the load ramps up: not judged alone
    full = LinkReading(5, 5, 16, 16)
    narrow = LinkReading(5, 5, 8, 16)  # a card seated in a x8 slot, or a degraded link
    samples: Iterator[ClockSample] = iter([ClockSample({0: 0x1, 1: 0x1}, {0: idle, 1: narrow}),
                                           ClockSample({0: 0x4, 1: 0x4}, {0: full, 1: narrow})])
    took = threading.Event()

    def reader() -> ClockSample:
        try:
            return next(samples)
        except StopIteration:
            took.set()
            return ClockSample({0: 0x4, 1: 0x4}, {0: full, 1: narrow})

    sampler = ClockEventSampler(reader=reader, interval_s=0.01).start()
    assert took.wait(10)
    record = sampler.stop()
    assert record.link_shortfalls == {1: "PCIe gen 5 x8 at best under load (max gen 5 x16)"}
    pcie = record.to_dict()["pcie"]
    assert (pcie["0"]["short"], pcie["1"]["short"], pcie["1"]["width"]) == (False, True, 8)


def test_masks_alone_keep_working_for_readers_that_return_them() -> None:
    record = ClockEventSampler(reader=lambda: {0: 0x4}, interval_s=10).start().stop()
    assert (record.link_shortfalls, "pcie" in record.to_dict()) == ({}, False)


def test_over_a_host_one_nvidia_smi_call_reads_both(standin: Callable[[str], Path], tmp_path: Path) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML answers here: the local sampler reads NVML, not the stand-in nvidia-smi")
    except pynvml.NVMLError:
        pass
    scenario = tmp_path / "h200-narrow"
    shutil.copytree(standin("h200-idle"), scenario)
    tsv = scenario / "all-fields.tsv"
    tsv.write_text(tsv.read_text().replace("pcie.link.width.current\t16", "pcie.link.width.current\t8"))
    standin(str(scenario))
    record = ClockEventSampler(LocalHost(), interval_s=10).start().stop()
    assert record.measured, record.errors
    assert record.link_shortfalls == {0: "PCIe gen 5 x8 at best under load (max gen 5 x16)"}
