"""``tunebench monitor``: bad input is one line, a live engine shows up, and the text view."""

from __future__ import annotations

import re

import pytest

from app.cli import main
from app.events import TelemetrySupport
from app.telemetry.view import engine_line, gpu_line, render
from tests.unit.test_telemetry_collector import KEY, FakeEngine, server  # noqa: F401 - fixture


def test_bad_endpoint_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--endpoint", "localhost:8000", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an http(s) URL" in err


def test_missing_engine_pid_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--engine-pid", "999999999", "--duration", "1"]) == 2
    assert "no process 999999999" in capsys.readouterr().err


def test_monitor_shows_a_live_engine(server: tuple[str, FakeEngine], capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    url, _ = server
    assert main(["monitor", "--endpoint", url, "--api-key", KEY, "--duration", "1.6", "--interval", "0.3"]) == 0
    out = capsys.readouterr().out
    assert f"{url}/metrics" in out
    assert "KV 50.0%" in out and "running 4" in out
    # The fake's counter grows at exactly 500 tok/s; each shown rate is a counter delta over the
    # time between two scrapes, whose midpoints a loaded machine can misplace: the median stays
    # near 500, and a rate off by 2x (a wrong interval) or in the wrong unit cannot.
    rates = sorted(int(m) for m in re.findall(r"\bgen (\d+) tok/s", out))
    assert rates, out
    assert 333 <= rates[len(rates) // 2] <= 750, rates
    assert "host" in out and "CPU" in out


def test_gpu_line_labels_memory_busy_apart_from_bandwidth() -> None:
    line = gpu_line("gpu0", {"gpu_util_pct": 87, "memory_busy_pct": 45, "memory_used_bytes": 120 * 2**30,
                             "memory_total_bytes": 140 * 2**30, "engine_memory_used_bytes": 100 * 2**30,
                             "dram_bw_bytes_per_s": 3.9e12, "dram_bw_util_pct": 80, "power_w": 612.4,
                             "temperature_c": 61}, TelemetrySupport(source="gpu0", available=True, name="NVIDIA H200"))
    assert line.startswith("gpu0  NVIDIA H200")
    for part in ("util  87%", "mem-busy  45%", "mem 120.0/140.0 GiB (engine 100.0)", "DRAM 3.90 TB/s (80%)",
                 "612 W", "61 C"):
        assert part in line, part
    assert "PCIe" not in gpu_line("gpu0", {}, None)  # unsupported quantities are left out


def test_render_states() -> None:
    lines = render({}, {"gpu": TelemetrySupport(source="gpu", available=False, detail="no NVIDIA GPU: driver missing")},
                   {}, None)
    assert lines[0] == "gpu   no NVIDIA GPU: driver missing" and "none" in lines[-1]
    lines = render({}, {}, {"engine": {"errors": 3, "last_error": "HTTP 500"}}, "http://x/metrics")
    assert "waiting for http://x/metrics" in lines[-1] and "scrape errors 3: HTTP 500" in lines[-1]
    a100 = TelemetrySupport(source="gpu0", available=True, name="A100",
                            unsupported={"dram_bw_util_pct": "GPM not supported"})
    lines = render({"gpu0": {"gpu_util_pct": 5}}, {"gpu0": a100}, {}, None)
    assert lines[0].startswith("gpu0  A100") and lines[1] == "      (not on this GPU: dram_bw_util_pct)"
    assert engine_line({"generation_tok_per_s": 1830.4, "kv_cache_usage_pct": 34.0}) == "engine  KV 34.0%  gen 1830 tok/s"
