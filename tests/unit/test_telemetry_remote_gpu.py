"""GPU telemetry from a DCGM exporter: the same ``gpu<i>`` samples, names and units as local NVML."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bus import Bus
from app.events import Notice, TelemetrySupport
from app.telemetry import TelemetryCollector
from app.telemetry.gpu import GPU_QUANTITIES
from app.telemetry.remote_gpu import RemoteGpuError, parse_dcgm, read_gpus
from engine_adapters.gpu_specs import spec_peak_bandwidth
from tests.fakes.fixed_reply import fixed_reply_server
from tests.fuzz.hostile import closed_port

PAGE = (Path(__file__).resolve().parents[1] / "data" / "dcgm" / "dcgm-exporter-h100x2.txt").read_text()
MIB = 1024 * 1024


def test_an_exporter_page_becomes_one_reading_per_gpu_in_local_units() -> None:
    busy, idle = parse_dcgm(PAGE)
    assert (busy.source, busy.index, busy.host, busy.name) == ("gpu0", "0", "gpu-node-a", "NVIDIA H100 80GB HBM3")
    assert idle.source == "gpu1" and idle.values["gpu_util_pct"] == 0
    v = busy.values
    assert set(v) <= set(GPU_QUANTITIES)
    assert v["memory_used_bytes"] == 74420 * MIB and v["memory_total_bytes"] == (74420 + 6113 + 582) * MIB
    assert v["dram_bw_util_pct"] == pytest.approx(71.2)  # a ratio of cycles, as a percentage
    peak = spec_peak_bandwidth("NVIDIA H100 80GB HBM3")
    assert peak is not None and v["dram_bw_bytes_per_s"] == pytest.approx(0.712 * peak)
    assert v["memory_busy_pct"] == 61 and v["power_w"] == pytest.approx(512.337)
    assert v["pcie_tx_bytes_per_s"] == 18_432_000 and v["sm_clock_mhz"] == 1980 and v["temperature_c"] == 52


def test_two_nodes_number_their_gpus_apart_and_an_unknown_model_has_no_byte_rate() -> None:
    other = PAGE.replace('Hostname="gpu-node-a"', 'Hostname="gpu-node-b"').replace(
        "NVIDIA H100 80GB HBM3", "NVIDIA Future GPU")
    gpus = parse_dcgm(PAGE + other.replace("# HELP", "# help").replace("# TYPE", "# type"))
    assert [(g.source, g.host, g.index) for g in gpus] == [
        ("gpu0", "gpu-node-a", "0"), ("gpu1", "gpu-node-a", "1"), ("gpu2", "gpu-node-b", "0"), ("gpu3", "gpu-node-b", "1")]
    assert "dram_bw_util_pct" in gpus[2].values and "dram_bw_bytes_per_s" not in gpus[2].values


@pytest.fixture
def exporter() -> Iterator[str]:
    with fixed_reply_server(PAGE.encode(), "text/plain; version=0.0.4") as url:
        yield f"{url}/metrics"


def test_the_collector_publishes_remote_gpus_like_local_ones(exporter: str) -> None:
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, gpu_metrics_url=exporter, host_interval_s=0)
    collector.start()
    seen: dict[str, dict[str, float]] = {}
    support: dict[str, TelemetrySupport] = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and not ({"gpu0", "gpu1"} <= set(seen) and len(support) == 2):
            for item in sub.drain(timeout_s=0.2):
                payload = getattr(item, "payload", None)
                if isinstance(payload, TelemetrySupport):
                    support[payload.source] = payload
                elif getattr(item, "source", "").startswith("gpu"):
                    seen[item.source] = item.values
    finally:
        collector.stop()
    assert seen["gpu0"]["gpu_util_pct"] == 97 and seen["gpu1"]["gpu_util_pct"] == 0
    assert support["gpu0"].available and "remote: gpu-node-a GPU 0" in support["gpu0"].detail
    assert support["gpu0"].name == "NVIDIA H100 80GB HBM3" and "dram_bw_bytes_per_s" in support["gpu0"].supported
    assert collector.stats().get("gpu", {}).get("errors", 0) == 0 and collector.stats()["gpu0"]["samples"] >= 1


def test_an_unreachable_exporter_is_a_notice_and_a_count_never_a_crash() -> None:
    port = closed_port()
    url = f"http://user:hunter2@127.0.0.1:{port}/metrics"
    with pytest.raises(RemoteGpuError, match="127.0.0.1") as err:
        read_gpus(url, timeout_s=1.0)
    assert "hunter2" not in str(err.value)
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, gpu_metrics_url=url, host_interval_s=0)
    collector.start()
    notices: list[str] = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and not notices:
            for item in sub.drain(timeout_s=0.2):
                if isinstance(getattr(item, "payload", None), Notice):
                    notices.append(item.payload.message)
    finally:
        collector.stop()
    assert notices and notices[0].startswith("remote GPU metrics unreachable, retrying") and "hunter2" not in notices[0]
    assert collector.stats()["gpu"]["errors"] >= 1


SMI_PAGE = (Path(__file__).resolve().parents[1] / "data" / "nvidia_gpu_exporter" / "nvidia-gpu-exporter-l40sx2.txt").read_text()


def test_an_nvidia_gpu_exporter_page_reads_the_same_way() -> None:
    """The exporter hosts without DCGM run beside node-exporter: ratios, bytes and hertz become
    the same quantities; the GPU's name and index come from its info metric."""
    busy, idle = parse_dcgm(SMI_PAGE)
    assert (busy.source, busy.index, busy.name, busy.exporter) == ("gpu0", "0", "NVIDIA L40S", "nvidia_gpu_exporter")
    assert idle.index == "1" and idle.values["gpu_util_pct"] == 0
    v = busy.values
    assert set(v) <= set(GPU_QUANTITIES)
    assert v["gpu_util_pct"] == pytest.approx(88.0) and v["memory_busy_pct"] == pytest.approx(47.0)
    assert v["memory_used_bytes"] == 4.3486543872e10 and v["memory_total_bytes"] == 4.8305799168e10
    assert v["sm_clock_mhz"] == pytest.approx(2520.0) and v["mem_clock_mhz"] == pytest.approx(9001.0)
    assert v["power_w"] == pytest.approx(291.4) and v["temperature_c"] == 61
    assert "dram_bw_util_pct" not in v  # nvidia-smi has no bandwidth figure: said so, never made up
