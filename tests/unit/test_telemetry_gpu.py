"""The GPU sampler against a fake at the pynvml boundary (pynvml's own error classes and ctypes
structures): support probed once, units converted, GPM bandwidth, no-GPU state."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pynvml
import pytest

from app.bus import Bus, Event, Item, Sample, Subscription
from app.events import TelemetrySupport
from app.telemetry import TelemetryCollector
from app.telemetry.gpu import GPU_QUANTITIES, GpuSampler, peak_bandwidth, visible_gpus
from engine_adapters.hardware import GpuInfo
from tests.fakes.nvml import FakeGpu, FakeNvml


def _open(fake: FakeNvml, **kwargs: object) -> tuple[GpuSampler, list[dict]]:
    sampler = GpuSampler(fake, cuda_visible_devices=None, **kwargs)  # type: ignore[arg-type]
    return sampler, sampler.open()


def test_fake_raises_the_real_pynvml_errors() -> None:
    fake = FakeNvml([FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"})])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        fake.nvmlDeviceGetNvLinkState(handle, 0)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml(driver_missing=True).nvmlInit()


def test_no_driver_gives_one_no_gpu_report_and_no_samples() -> None:
    fake = FakeNvml(driver_missing=True)
    sampler, reports = _open(fake)
    assert reports == [TelemetrySupport(source="gpu", available=False, state="no NVIDIA GPU",
                                        detail="no NVIDIA GPU: NVML could not start: NVML Shared Library Not Found")]
    assert sampler.sample() == []
    sampler.close()
    assert fake.calls["nvmlShutdown"] == 0  # never initialised, never shut down


def test_hopper_reports_every_quantity_in_canonical_units() -> None:
    gpu = FakeGpu.h200()
    gpu.state.update(memory_used_bytes=100 * 2**30, gpu_util_pct=87, memory_busy_pct=45, power_mw=612_345,
                     sm_clock_mhz=1980, mem_clock_mhz=3201, temperature_c=61, dram_bw_util_pct=80.0,
                     gpm_pcie_tx_mib_per_s=100.0, gpm_pcie_rx_mib_per_s=2048.0)
    gpu.processes = [(os.getpid(), 60 * 2**30), (1, 5 * 2**30)]
    fake = FakeNvml([gpu])
    sampler, reports = _open(fake, engine_pids=lambda: {os.getpid()})
    (report,) = reports
    assert report.source == "gpu0" and report.available and report.unsupported == {}
    assert report.supported == list(GPU_QUANTITIES)
    assert "not bandwidth" in report.labels["memory_busy_pct"]
    time.sleep(0.01)
    ((source, values),) = sampler.sample()
    peak = 6144 / 8 * 3201e6 * 2
    assert source == "gpu0"
    assert values == pytest.approx({
        "memory_used_bytes": 100 * 2**30, "memory_total_bytes": 141 * 2**30, "engine_memory_used_bytes": 60 * 2**30,
        "gpu_util_pct": 87, "memory_busy_pct": 45, "power_w": 612.345, "sm_clock_mhz": 1980, "mem_clock_mhz": 3201,
        "temperature_c": 61, "dram_bw_util_pct": 80.0, "dram_bw_bytes_per_s": 0.8 * peak,
        "pcie_tx_bytes_per_s": 100 * 2**20, "pcie_rx_bytes_per_s": 2048 * 2**20})
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0  # GPM gives PCIe: the 20 ms legacy call is not used
    sampler.close()
    assert not fake.initialised  # init and shutdown balanced (probe_gpus' own pair included)


def test_a_gpm_reading_that_is_not_a_number_is_left_out() -> None:
    """An idle H200 gave NaN for DRAM bandwidth (benchmarks/gpu_check.py on one): no reading, and
    never a NaN in a stored series."""
    gpu = FakeGpu.h200()
    gpu.state.update(dram_bw_util_pct=float("nan"), gpm_pcie_tx_mib_per_s=float("nan"), gpm_pcie_rx_mib_per_s=8.0)
    sampler, _ = _open(FakeNvml([gpu]))
    time.sleep(0.01)
    ((_source, values),) = sampler.sample()
    assert "dram_bw_util_pct" not in values and "dram_bw_bytes_per_s" not in values
    assert "pcie_tx_bytes_per_s" not in values and values["pcie_rx_bytes_per_s"] == 8 * 2**20
    gpu.state.update(dram_bw_util_pct=40.0)  # the next interval's reading is there again
    time.sleep(0.01)
    ((_source, values),) = sampler.sample()
    assert values["dram_bw_util_pct"] == 40.0
    sampler.close()


def test_unsupported_quantities_are_reported_once_and_never_queried_again() -> None:
    gpu = FakeGpu(unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"},
                  no_permission={"nvmlDeviceGetComputeRunningProcesses"})
    fake = FakeNvml([gpu])
    sampler, (report,) = _open(fake, engine_pids=lambda: {123})
    assert report.unsupported["power_w"] == "NVMLError_NotSupported: Not Supported"
    assert report.unsupported["temperature_c"] == "NVMLError_NotSupported: Not Supported"
    assert "NoPermission" in report.unsupported["engine_memory_used_bytes"]
    for _ in range(20):
        time.sleep(0.002)
        ((_, values),) = sampler.sample()
        assert "power_w" not in values and "temperature_c" not in values and "memory_used_bytes" in values
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    assert sampler.errors == 0 and sampler.notices == []
    sampler.close()


def test_pre_hopper_has_no_dram_bandwidth_and_reads_legacy_pcie_at_most_once_a_second() -> None:
    gpu = FakeGpu.a100()
    gpu.state.update(pcie_tx_kb_per_s=1000, pcie_rx_kb_per_s=250_000)
    fake = FakeNvml([gpu])
    sampler, (report,) = _open(fake, pcie_fallback_interval_s=1.0)
    assert "Hopper" in report.unsupported["dram_bw_util_pct"]
    assert "dram_bw_bytes_per_s" in report.unsupported
    assert "pcie_rx_bytes_per_s" in report.supported
    calls_after_probe = fake.calls["nvmlDeviceGetPcieThroughput"]
    readings = [sampler.sample()[0][1] for _ in range(10)]
    assert all(r["pcie_rx_bytes_per_s"] == 250_000 * 1024 and r["pcie_tx_bytes_per_s"] == 1000 * 1024 for r in readings)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] - calls_after_probe <= 2  # 10 ticks in well under a second
    assert fake.calls["nvmlGpmSampleGet"] == 0  # GPM not supported: never sampled
    sampler.close()


def test_gpm_without_pcie_metrics_falls_back_to_legacy_pcie() -> None:
    gpu = FakeGpu(gpm_unsupported_metrics={pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC})
    gpu.state.update(dram_bw_util_pct=25.0, pcie_rx_kb_per_s=4)
    sampler, (report,) = _open(FakeNvml([gpu]))
    assert {"dram_bw_util_pct", "pcie_rx_bytes_per_s"} <= set(report.supported)
    time.sleep(0.005)
    ((_, values),) = sampler.sample()
    assert values["dram_bw_util_pct"] == 25.0 and values["pcie_rx_bytes_per_s"] == 4096
    sampler.close()


def test_a_query_that_breaks_later_is_counted_and_noticed_once() -> None:
    gpu = FakeGpu()
    fake = FakeNvml([gpu])
    sampler, _ = _open(fake)
    gpu.no_permission.add("nvmlDeviceGetUtilizationRates")  # e.g. the GPU fell off the bus
    for _ in range(5):
        time.sleep(0.002)
        ((_, values),) = sampler.sample()
        assert "gpu_util_pct" not in values and "memory_used_bytes" in values
    assert sampler.errors == 5
    assert len(sampler.notices) == 1 and "gpu_util_pct" in sampler.notices[0]
    sampler.close()


def test_peak_bandwidth_is_checked_against_the_spec() -> None:
    h200 = peak_bandwidth(GpuInfo(index=0, name="NVIDIA H200", memory_bus_width_bits=6144, max_memory_clock_mhz=3201))
    assert h200.bytes_per_s == pytest.approx(4.917e12, rel=1e-3) and "within" in h200.note
    h100 = peak_bandwidth(GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_bus_width_bits=5120, max_memory_clock_mhz=2619))
    assert h100.bytes_per_s == pytest.approx(3.35e12, rel=0.01)
    odd = peak_bandwidth(GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_bus_width_bits=5120, max_memory_clock_mhz=1000))
    assert odd.bytes_per_s == 3.35e12 and "using the spec" in odd.note
    unknown = peak_bandwidth(GpuInfo(index=0, name="Some New GPU", memory_bus_width_bits=256, max_memory_clock_mhz=10000))
    assert unknown.bytes_per_s == 256 / 8 * 10000e6 * 2 and unknown.spec_bytes_per_s is None
    blind = peak_bandwidth(GpuInfo(index=0, name="Some New GPU"))
    assert blind.bytes_per_s is None


def test_dram_bytes_unsupported_when_the_peak_is_unknown() -> None:
    gpu = FakeGpu(name="Future GPU", unsupported={"nvmlDeviceGetMemoryBusWidth"})
    gpu.state["dram_bw_util_pct"] = 50.0
    sampler, (report,) = _open(FakeNvml([gpu]))
    assert "dram_bw_util_pct" in report.supported and "dram_bw_bytes_per_s" in report.unsupported
    time.sleep(0.005)
    ((_, values),) = sampler.sample()
    assert values["dram_bw_util_pct"] == 50.0 and "dram_bw_bytes_per_s" not in values
    sampler.close()


def test_cuda_visible_devices_selects_by_index_or_uuid() -> None:
    gpus = [GpuInfo(index=i, name="g", uuid=f"GPU-{i}") for i in range(4)]
    assert [g.index for g in visible_gpus(gpus, None)] == [0, 1, 2, 3]
    assert [g.index for g in visible_gpus(gpus, "2,GPU-0")] == [0, 2]
    assert visible_gpus(gpus, "") == []
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    sampler = GpuSampler(fake, cuda_visible_devices="1")
    assert [r.source for r in sampler.open()] == ["gpu1"]
    sampler.close()


def drain_until(sub: Subscription, done: Callable[[list[Item]], bool], timeout_s: float = 10.0) -> list[Item]:
    """What the collector published until ``done`` holds: its sampler is a thread, which a loaded
    machine may hold back for longer than any fixed sleep."""
    got: list[Item] = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        assert time.monotonic() < deadline, f"not published within {timeout_s} s: {got[-5:]}"
        time.sleep(0.02)
        got += sub.drain()
    return got


def test_collector_publishes_gpu_samples_and_one_support_event_per_gpu() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu.a100()])
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, nvml=fake, gpu_interval_s=0.02, host_interval_s=0)
    collector.start()
    items = drain_until(sub, lambda got: sum(1 for i in got if isinstance(i, Sample) and i.source == "gpu0") >= 5
                        and any(isinstance(i, Sample) and i.source == "gpu1" for i in got))
    collector.stop()
    items += sub.drain()
    support = [i for i in items if isinstance(i, Event) and i.kind == "telemetry_support"]
    assert sorted(e.payload.source for e in support) == ["gpu0", "gpu1"]
    samples = [i for i in items if isinstance(i, Sample)]
    assert {s.source for s in samples} == {"gpu0", "gpu1"}
    gpu0 = [s for s in samples if s.source == "gpu0"]
    assert len(gpu0) >= 5
    assert all(b.t_mono > a.t_mono for a, b in zip(gpu0, gpu0[1:], strict=False))
    assert not fake.initialised and not collector.running


def test_collector_without_gpu_still_samples_the_host() -> None:
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, nvml=FakeNvml(driver_missing=True), host_interval_s=0.05)
    collector.start()
    items = drain_until(sub, lambda got: any(isinstance(i, Sample) and i.source == "host" for i in got))
    collector.stop()
    items += sub.drain()
    gpu_support = collector.support()["gpu"]
    assert gpu_support.state == "no NVIDIA GPU"
    assert sum(1 for i in items if isinstance(i, Event) and i.kind == "telemetry_support" and i.payload.source == "gpu") == 1
    assert any(isinstance(i, Sample) and i.source == "host" for i in items)
    assert not any(isinstance(i, Sample) and i.source.startswith("gpu") for i in items)
