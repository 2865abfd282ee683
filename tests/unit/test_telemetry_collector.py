"""The collector against a local Prometheus endpoint (aiohttp) and real processes: rates on the
bus, auth, failures counted not raised, a hung endpoint that cannot hold up stop(), counter
resets across a simulated restart, and the engine process tree in the host series."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from app.bus import Bus, Event, Sample
from app.telemetry import TelemetryCollector

KEY = "sekret"


@dataclass
class FakeEngine:
    """/metrics whose generation counter grows at ``tok_per_s`` from ``base``."""

    tok_per_s: float = 500.0
    base: float = 10_000.0
    started: float = 0.0
    start_time_s: float = 1.7e9
    delay_s: float = 0.0

    def text(self) -> str:
        gen = self.base + self.tok_per_s * (time.monotonic() - self.started)
        return (f'vllm:num_requests_running{{engine="0"}} 4\nvllm:kv_cache_usage_perc{{engine="0"}} 0.5\n'
                f'vllm:generation_tokens_total{{engine="0"}} {gen}\nvllm:prompt_tokens_total{{engine="0"}} 7\n'
                f"process_start_time_seconds {self.start_time_s}\n")

    def restart(self) -> None:
        self.base, self.started, self.start_time_s = 0.0, time.monotonic(), self.start_time_s + 100


@pytest.fixture
def server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(started=time.monotonic())

    async def metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.Response(status=401, text="unauthorised")
        waited = 0.0
        while waited < engine.delay_s:  # a hung engine; teardown releases it by zeroing delay_s
            await asyncio.sleep(0.05)
            waited += 0.05
        return web.Response(text=engine.text(), content_type="text/plain")

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", engine
    engine.delay_s = 0.0
    time.sleep(0.1)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def run_for(seconds: float, make: Callable[[Bus], TelemetryCollector]) -> tuple[list, TelemetryCollector, float]:
    bus = Bus()
    sub = bus.subscribe()
    collector = make(bus)
    started = time.monotonic()
    collector.start()
    assert time.monotonic() - started < 0.1  # start never blocks
    time.sleep(seconds)
    started = time.monotonic()
    collector.stop()
    return sub.drain(), collector, time.monotonic() - started


def engine_samples(items: list) -> list[Sample]:
    return [i for i in items if isinstance(i, Sample) and i.source == "engine"]


def notices(items: list) -> list[str]:
    return [i.payload["message"] for i in items if isinstance(i, Event) and i.kind == "notice"]


def test_engine_rates_arrive_on_the_bus(server: tuple[str, FakeEngine]) -> None:
    url, _engine = server
    items, collector, stop_s = run_for(1.3, lambda bus: TelemetryCollector(
        bus, metrics_url=url, api_key=KEY, engine_interval_s=0.1, gpu_interval_s=0, host_interval_s=0))
    samples = engine_samples(items)
    rates = [s.values["generation_tok_per_s"] for s in samples if "generation_tok_per_s" in s.values]
    assert len(rates) >= 5
    assert sum(rates) / len(rates) == pytest.approx(500.0, rel=0.25)
    assert samples[-1].values["kv_cache_usage_pct"] == 50.0 and samples[-1].values["requests_running"] == 4
    support = [i.payload for i in items if isinstance(i, Event) and i.kind == "telemetry_support"]
    assert len(support) == 1 and support[0]["source"] == "engine" and "generation_tok_per_s" in support[0]["supported"]
    assert collector.stats()["engine"]["errors"] == 0 and stop_s < 1.0


def test_wrong_key_is_a_counted_error_with_one_notice(server: tuple[str, FakeEngine]) -> None:
    url, _ = server
    items, collector, _ = run_for(0.8, lambda bus: TelemetryCollector(
        bus, metrics_url=url, api_key="wrong", engine_interval_s=0.1, gpu_interval_s=0, host_interval_s=0))
    assert engine_samples(items) == []
    assert collector.stats()["engine"]["errors"] >= 4
    assert "HTTP 401" in collector.stats()["engine"]["last_error"]
    assert len(notices(items)) == 1 and "unreachable" in notices(items)[0]
    assert "engine" not in collector.support()


def test_unreachable_endpoint_never_raises_and_stops_promptly() -> None:
    items, collector, stop_s = run_for(0.6, lambda bus: TelemetryCollector(
        bus, metrics_url="http://127.0.0.1:9", engine_interval_s=0.1, gpu_interval_s=0, host_interval_s=0))
    assert collector.stats()["engine"]["errors"] >= 3 and len(notices(items)) == 1
    assert stop_s < 1.0 and not collector.running


def test_a_hung_endpoint_cannot_hold_up_stop(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    engine.delay_s = 30.0
    items, collector, stop_s = run_for(0.5, lambda bus: TelemetryCollector(
        bus, metrics_url=url, api_key=KEY, engine_interval_s=0.1, gpu_interval_s=0, host_interval_s=0,
        scrape_timeout_s=20.0))
    assert stop_s < 1.0 and not collector.running
    assert engine_samples(items) == []


def test_engine_restart_gives_one_notice_and_no_bad_rate(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, metrics_url=url, api_key=KEY, engine_interval_s=0.1,
                                   gpu_interval_s=0, host_interval_s=0)
    collector.start()
    time.sleep(0.6)
    engine.restart()
    time.sleep(0.8)
    collector.stop()
    items = sub.drain()
    rates = [s.values["generation_tok_per_s"] for s in engine_samples(items) if "generation_tok_per_s" in s.values]
    assert rates and all(0 <= r < 1000 for r in rates), rates  # true rate 500 tok/s, before and after
    assert sum(1 for n in notices(items) if "restarted" in n) == 1
    assert collector.stats()["engine"]["counter_resets"] == 1


def test_host_series_follow_the_engine_process_tree() -> None:
    busy = "import subprocess, sys, time\n" \
           "child = subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 * 2**20); import time; time.sleep(30)'])\n" \
           "end = time.time() + 30\n" \
           "while time.time() < end: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", busy])
    try:
        import psutil

        deadline = time.monotonic() + 20  # let it start its child and touch its 64 MiB, even on a loaded machine
        while time.monotonic() < deadline:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            if len(tree) > 1 and sum(p.memory_info().rss for p in tree) > 80 * 2**20:
                break
            time.sleep(0.1)
        items, collector, _ = run_for(1.5, lambda bus: TelemetryCollector(
            bus, engine_pid=proc.pid, host_interval_s=0.25, gpu_interval_s=0))
    finally:
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
    host = [i for i in items if isinstance(i, Sample) and i.source == "host"]
    assert len(host) >= 4
    assert all(0 <= s.values["cpu_pct"] <= 100 and s.values["memory_used_bytes"] <= s.values["memory_total_bytes"]
               for s in host)
    assert min(s.values["engine_rss_bytes"] for s in host) > 64 * 2**20  # the child's 64 MiB counts
    assert max(s.values["engine_cpu_pct"] for s in host[1:]) > 25  # the busy loop (shared 2-core machine)
    assert collector.support()["host"]["unsupported"] == {}


def test_host_without_engine_says_engine_quantities_are_unsupported() -> None:
    items, collector, _ = run_for(0.3, lambda bus: TelemetryCollector(bus, host_interval_s=0.1, gpu_interval_s=0))
    host = [i for i in items if isinstance(i, Sample) and i.source == "host"]
    assert host and all("engine_rss_bytes" not in s.values for s in host)
    assert set(collector.support()["host"]["unsupported"]) == {"engine_rss_bytes", "engine_cpu_pct"}
