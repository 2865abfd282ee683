"""Telemetry against the real vLLM CPU engine: the token-rate and KV-usage series move with load
and return to idle after it; the engine's process tree shows up in the host series; without a
GPU the GPU source says so once and everything else works."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.bus import Bus, Event, Sample
from app.events import Notice
from app.telemetry import TelemetryCollector
from engine_adapters.hardware import probe_hardware
from engine_adapters.launcher import EngineProcess
from engine_adapters.prometheus import MetricMap
from engine_adapters.vllm import METRIC_NAMES
from tests.e2e.stream_load import CONCURRENCY, MAX_TOKENS, run_load

pytestmark = pytest.mark.e2e

LOAD_S = 8.0  # the shortest load whose middle is sure to hold a scrape: each one ends within its 3 s time-out


def _engine_series(items: list, name: str, t0: float, t1: float) -> list[float]:
    return [s.values[name] for s in items
            if isinstance(s, Sample) and s.source == "engine" and t0 <= s.t_mono <= t1 and name in s.values]


def wait_until_idle(engine: EngineProcess, timeout_s: float = 60.0) -> None:
    """The shared engine is idle: nothing running or waiting, and its token counter still over a
    second. An earlier test's aborted clients may leave it generating for a moment, and this test
    counts every token the engine makes in its window."""
    metrics = MetricMap(METRIC_NAMES)
    deadline = time.monotonic() + timeout_s
    last: tuple[float, float, float] | None = None
    while True:
        scrape = metrics.parse(engine.fetch_metrics_text())
        reading = (scrape.gauges.get("requests_running", 0.0), scrape.gauges.get("requests_waiting", 0.0),
                   scrape.counters.get("generation_tokens", 0.0))
        if reading[:2] == (0.0, 0.0) and reading == last:
            return
        assert time.monotonic() < deadline, f"the shared engine is still busy after {timeout_s} s: {reading}"
        last = reading
        time.sleep(1.0)


def test_engine_series_follow_load_and_return_to_idle(demo_engine: EngineProcess) -> None:
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, metrics_url=demo_engine.base_url, api_key=demo_engine.api_key,
                                   engine_pid=demo_engine.pid, engine_interval_s=0.25, host_interval_s=0.25)
    wait_until_idle(demo_engine)
    collector.start()
    try:
        time.sleep(1.5)
        tokens, idle_end, load_end = run_load(demo_engine.base_url, demo_engine.api_key, LOAD_S)
        time.sleep(4.0)  # the engine's counters can reach their final count a scrape or two late
        after_start = load_end + 1.0
    finally:
        started = time.monotonic()
        collector.stop(timeout_s=10.0)
        stop_s = time.monotonic() - started
    end = time.monotonic()
    items = sub.drain()
    assert tokens >= CONCURRENCY * MAX_TOKENS and tokens % MAX_TOKENS == 0, tokens
    assert not collector.running and stop_s < 3.0, f"stop took {stop_s:.2f} s"  # the scrape time-out is 2 s

    events = [i for i in items if isinstance(i, Event)]
    support = {e.payload.source: e.payload for e in events if e.kind == "telemetry_support"}
    assert support["engine"].available
    for name in ("generation_tok_per_s", "kv_cache_usage_pct", "requests_running", "prefix_cache_hit_rate_pct"):
        assert name in support["engine"].supported, support["engine"]
    assert "spec_acceptance_rate_pct" in support["engine"].unsupported  # no speculative decoding here
    if probe_hardware().has_gpu:
        assert support["gpu0"].available
    else:
        assert support["gpu"].state == "no NVIDIA GPU" and not support["gpu"].available
    assert sum(1 for e in events if e.kind == "telemetry_support") == len(support)  # once per source

    first = min(i.t_mono for i in items if isinstance(i, Sample))
    idle_rate = _engine_series(items, "generation_tok_per_s", first, idle_end)
    # a scrape that ends just after the last token still averages the load: allow a short tail
    load_rate = _engine_series(items, "generation_tok_per_s", idle_end, load_end + 0.5)
    after_rate = _engine_series(items, "generation_tok_per_s", after_start, end)
    load_kv = _engine_series(items, "kv_cache_usage_pct", idle_end, load_end)
    after_kv = _engine_series(items, "kv_cache_usage_pct", after_start, end)
    running = _engine_series(items, "requests_running", idle_end, load_end)
    print(f"\nidle gen {max(idle_rate or [-1]):.0f} tok/s; load ({load_end - idle_end:.1f} s, {tokens} tokens, "
          f"{tokens / (load_end - idle_end):.0f} tok/s mean): "
          f"gen max {max(load_rate or [-1]):.0f} tok/s, KV max {max(load_kv or [-1]):.1f}%, running max "
          f"{max(running or [-1]):.0f}; after: gen max {max(after_rate or [-1]):.0f} tok/s, KV max {max(after_kv or [-1]):.1f}%")
    assert idle_rate and max(idle_rate) == 0.0, idle_rate
    assert load_rate and max(load_rate) > 300, load_rate  # 1,600-4,000 tok/s at 16 streams here
    # Every published rate is its counter's delta over the time between the two scrapes it spans
    # (a scrape too close to the last keeps the older baseline), and the counter agrees with the
    # client: a rate divided by the wrong interval, or a missed token, fails here.
    engine_samples = [s for s in items if isinstance(s, Sample) and s.source == "engine"
                      and "generation_tokens_total" in s.values]
    counted = engine_samples[-1].values["generation_tokens_total"] - engine_samples[0].values["generation_tokens_total"]
    assert counted == tokens, (counted, tokens)
    _assert_rates_are_counter_deltas(engine_samples)
    # A starved vLLM API server (a CPU burner or another engine on these 2 cores) serves /metrics
    # from the same event loop that relays the engine core's outputs, so it answers mostly when it
    # has caught up, often once a round of requests is over: the gauges read mid-load can all be 0
    # and the tokens arrive in bursts. Measured under a burner: 6 mid-load scrapes read 0 running
    # while the token counter moved by 16k. What the collector guarantees holds either way (exact
    # rates, bounded gauges, counted failures, the idle after); its reading of these gauges from
    # real vLLM pages is checked in tests/unit.
    # No spike: over any window of two seconds or more the rate stays within 6x the load's mean
    # (single 0.25 s intervals can run ahead: decode slows as contexts grow, a starved API server
    # updates its counters in bursts, and a scrape's midpoint is off by up to half its latency,
    # which under this load reached a second).
    mean_rate = tokens / (load_end - idle_end)
    for i, first_sample in enumerate(engine_samples):
        later = [s for s in engine_samples[i + 1:] if s.t_mono - first_sample.t_mono >= 2.0]
        if later:
            window = later[0]
            rate = ((window.values["generation_tokens_total"] - first_sample.values["generation_tokens_total"])
                    / (window.t_mono - first_sample.t_mono))
            assert rate < 6 * mean_rate, (rate, mean_rate, first_sample.t_mono - idle_end)
    # Back to idle, judged by the counter rather than the clock (a scrape slowed by the load can
    # read the counter well before its midpoint): every rate whose interval starts from the final
    # count is 0, and the series goes on at idle.
    final = engine_samples[-1].values["generation_tokens_total"]
    idle_again, base = [], engine_samples[0]
    for sample in engine_samples[1:]:
        if "generation_tok_per_s" in sample.values:
            if base.values["generation_tokens_total"] == final:
                idle_again.append(sample.values["generation_tok_per_s"])
            base = sample
    assert len(idle_again) >= 2 and max(idle_again) == 0.0, idle_again
    assert after_rate, "no engine samples after the load"
    assert after_kv and after_kv[-1] == 0.0, after_kv  # the KV cache is freed once the streams end
    stats = collector.stats()["engine"]
    # The gauges mid-load: a scrape lands there (each ends within its 3 s time-out, and the middle
    # of the load is longer), or its failure is counted; the counters and rates above stay exact
    # across such a gap. What the engine said there is bounded by what was in flight.
    mid = (idle_end + 0.5, load_end - 0.5)
    mid_kv = _engine_series(items, "kv_cache_usage_pct", *mid)
    if not mid_kv:
        # None is dated inside it: one failed (and was counted), or one was in flight across it. A
        # scrape slowed by the load is dated at its midpoint, so two in a row can sit either side
        # of a short middle; they are still at most a time-out and an interval apart (with slack).
        dated = sorted(s.t_mono for s in items if isinstance(s, Sample) and s.source == "engine")
        spans = [(a, b) for a, b in zip(dated, dated[1:], strict=False) if a <= mid[0] and b >= mid[1]]
        straddled = bool(spans) and all(b - a <= 3.0 + 0.25 + 1.0 for a, b in spans)
        assert stats["errors"] > 0 or straddled, ("no scrape landed during the load, yet none failed", load_kv,
                                                  stats, spans)
    assert all(0 <= n <= CONCURRENCY for n in running), running
    assert all(0 <= v <= 100 for v in load_kv), load_kv
    every_rate = [v for s in items if isinstance(s, Sample) and s.source == "engine"
                  for k, v in s.values.items() if k.endswith("_per_s")]
    assert min(every_rate) >= 0.0

    host = [s for s in items if isinstance(s, Sample) and s.source == "host"]
    assert host and all(s.values["engine_rss_bytes"] > 50 * 2**20 for s in host if "engine_rss_bytes" in s.values)
    load_cpu = [s.values["engine_cpu_pct"] for s in host if idle_end < s.t_mono <= load_end and "engine_cpu_pct" in s.values]
    assert load_cpu and max(load_cpu) > 50, load_cpu  # the engine works hard under load

    # A scrape that times out while 16 streams share 2 cores is an event the product must handle,
    # not one this test can forbid: each failure is counted, reported once as a notice (not once
    # per tick), recovery is reported, and the series and its exact rates above go on across it.
    notices = [e.payload.message for e in events if isinstance(e.payload, Notice) and e.payload.source == "engine"]
    down = [n for n in notices if "unreachable" in n]
    print(f"engine scrapes: {stats['samples']} samples, {stats['errors']} failed; notices {notices}")
    if stats["errors"]:
        assert 1 <= len(down) <= stats["errors"], (stats, notices)
        assert "reachable again" in notices[-1], notices  # and the last word is that it recovered
    else:
        assert not down, notices
    assert stats["samples"] >= len(engine_samples) > 10


def test_engine_restart_gives_no_negative_or_huge_rates(engine_pool, demo_engine: EngineProcess) -> None:  # type: ignore[no-untyped-def]
    """An engine restart, as the scraper sees it: the same URL starts answering with another real
    engine's /metrics (counters back near zero, a new process start time). A local pass-through
    switches engines between two scrapes; the pages are the real engines' own."""
    from aiohttp import web

    from engine_adapters.config import Features

    other = engine_pool.get(Features(prefix_caching=False))
    run_load(demo_engine.base_url, demo_engine.api_key)  # the first engine's counters run ahead
    target = {"engine": demo_engine}

    async def metrics(_request: web.Request) -> web.Response:
        engine = target["engine"]
        text = await asyncio.to_thread(engine.fetch_metrics_text)
        return web.Response(text=text, content_type="text/plain")

    async def scenario() -> list:  # type: ignore[type-arg]
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        bus = Bus()
        sub = bus.subscribe()
        collector = TelemetryCollector(bus, metrics_url=f"http://127.0.0.1:{port}", engine_interval_s=0.25,
                                       host_interval_s=0, gpu_interval_s=0)
        collector.start()
        try:
            await asyncio.sleep(1.5)
            target["engine"] = other  # "restart": a fresh engine behind the same address
            # the load from its own process: this loop serves the scrapes
            await asyncio.to_thread(run_load, other.base_url, other.api_key, LOAD_S)
            await asyncio.sleep(1.0)
        finally:
            await asyncio.to_thread(collector.stop)
            await runner.cleanup()
        stats.update(collector.stats().get("engine", {}))
        return sub.drain()

    stats: dict[str, int] = {}
    items = asyncio.run(scenario())
    samples = [s for s in items if isinstance(s, Sample) and s.source == "engine" and "generation_tokens_total" in s.values]
    rates = [s.values["generation_tok_per_s"] for s in samples if "generation_tok_per_s" in s.values]
    assert rates and min(rates) >= 0
    # and the second engine's load was seen, unless no scrape got through while it streamed (on a
    # loaded machine), which must then have been counted as failed scrapes
    assert max(rates) > 100 or stats.get("errors", 0) > 0, (rates, stats)
    # Every rate is one engine's own counter delta over the time between its two scrapes, exactly;
    # the scrape that first sees the other engine carries no rate (its counter went back), and
    # the next rates start from it. A rate across the restart (negative, or the old engine's
    # count against the new one's) or divided by the wrong interval fails here, however small.
    # The first engine is idle throughout, so its count never moves: the first other count is the
    # other engine's (whose count may be higher or lower: both served earlier tests).
    totals = [s.values["generation_tokens_total"] for s in samples]
    switch = next(i for i, total in enumerate(totals) if total != totals[0])
    assert switch >= 2 and "generation_tok_per_s" not in samples[switch].values, (switch, totals)
    _assert_rates_are_counter_deltas(samples, restart_at=samples[switch])
    notices = [e.payload.message for e in items if isinstance(e, Event) and isinstance(e.payload, Notice)]
    assert sum(1 for n in notices if "restart" in n.lower() or "went back" in n.lower()) == 1, notices


def _assert_rates_are_counter_deltas(samples: list[Sample], restart_at: Sample | None = None) -> None:
    """Every published rate is its counter's delta over the time since the last rate's scrape; the
    sample where the engine restarted (``restart_at``, carrying no rate) is the next baseline."""
    base = samples[0]
    for sample in samples[1:]:
        if "generation_tok_per_s" in sample.values:
            expected = ((sample.values["generation_tokens_total"] - base.values["generation_tokens_total"])
                        / (sample.t_mono - base.t_mono))
            assert sample.values["generation_tok_per_s"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
            base = sample
        elif sample is restart_at:
            base = sample
