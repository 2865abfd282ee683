"""Engine metrics: names mapped per engine (vLLM current and old names, SGLang, llama.cpp), rates
from counters, and counter resets that never give a negative or a huge rate."""

from __future__ import annotations

import asyncio
import http.server
import threading
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.telemetry.engine_metrics import (
    EngineScraper,
    MetricMap,
    RateDeriver,
    Scrape,
    ScrapeError,
    histogram_output,
    metrics_url_from,
    support,
)
from engine_adapters import llamacpp, sglang, vllm
from engine_adapters.launcher import free_port

DATA = Path(__file__).resolve().parents[1] / "data"
VLLM_TEXT = (DATA / "vllm-0.32.0-metrics.txt").read_text()


def vllm_text(gen: float, prompt: float, hits: float = 0, queries: float = 0, running: float = 0,
              kv: float = 0.0, start: float = 1.7e9, kv_name: str = "vllm:kv_cache_usage_perc",
              ttft: tuple[float, float] = (0.0, 0)) -> str:
    labels = '{engine="0",model_name="m"}'
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{labels} {running}
vllm:num_requests_waiting{labels} 0.0
# TYPE {kv_name} gauge
{kv_name}{labels} {kv}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{labels} {gen}
vllm:generation_tokens_created{labels} 1.7e9
vllm:prompt_tokens_total{labels} {prompt}
vllm:prefix_cache_hits_total{labels} {hits}
vllm:prefix_cache_queries_total{labels} {queries}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {ttft[1]}
vllm:time_to_first_token_seconds_count{labels} {ttft[1]}
vllm:time_to_first_token_seconds_sum{labels} {ttft[0]}
process_start_time_seconds {start}
"""


def test_real_vllm_page_maps_to_canonical_names() -> None:
    scrape = MetricMap(vllm.METRIC_NAMES).parse(VLLM_TEXT)
    assert scrape.counters["generation_tokens"] == 5120.0  # 16 x 320 streamed before the capture
    assert scrape.gauges == {"requests_running": 0.0, "requests_waiting": 0.0, "kv_cache_usage_ratio": 0.0}
    assert scrape.counters["prefix_cache_queries"] >= scrape.counters["prefix_cache_hits"] >= 0
    assert scrape.histograms["ttft_s"][1] == 16 and scrape.start_time_s is not None
    supported, unsupported = support(vllm.METRIC_NAMES, scrape)
    assert {"generation_tok_per_s", "kv_cache_usage_pct", "prefix_cache_hit_rate_pct", "ttft_mean_ms"} <= set(supported)
    assert "spec_acceptance_rate_pct" in unsupported and "spec_mean_acceptance_length" in unsupported


def test_selection_keeps_only_wanted_samples() -> None:
    mapping = MetricMap(vllm.METRIC_NAMES)
    selected = mapping.select(VLLM_TEXT)
    assert "_bucket" not in selected and "# " not in selected
    assert len(selected) < len(VLLM_TEXT) / 5
    assert mapping.parse(VLLM_TEXT) == mapping.parse(selected)


def test_old_vllm_kv_name_is_read_and_ratio_becomes_percent() -> None:
    scrape = MetricMap(vllm.METRIC_NAMES).parse(vllm_text(0, 0, kv=0.42, kv_name="vllm:gpu_cache_usage_perc"))
    values, _ = RateDeriver().update(scrape, 0.0)
    assert values["kv_cache_usage_pct"] == pytest.approx(42.0)


def test_rates_from_counter_deltas() -> None:
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver()
    first, _ = deriver.update(mapping.parse(vllm_text(1000, 500, hits=0, queries=0, ttft=(1.0, 10))), 10.0)
    assert "generation_tok_per_s" not in first and first["generation_tokens_total"] == 1000
    values, notice = deriver.update(mapping.parse(vllm_text(3000, 900, hits=150, queries=200, running=8, kv=0.25,
                                                           ttft=(1.5, 20))), 12.0)
    assert notice is None
    assert values["generation_tok_per_s"] == 1000.0 and values["prompt_tok_per_s"] == 200.0
    assert values["prefix_cache_hit_rate_pct"] == 75.0
    assert values["ttft_mean_ms"] == pytest.approx(50.0)  # 0.5 s over 10 requests
    assert values["requests_running"] == 8 and values["kv_cache_usage_pct"] == 25.0
    idle, _ = deriver.update(mapping.parse(vllm_text(3000, 900, hits=150, queries=200, ttft=(1.5, 20))), 13.0)
    assert idle["generation_tok_per_s"] == 0.0
    assert "prefix_cache_hit_rate_pct" not in idle and "ttft_mean_ms" not in idle  # nothing to average


def test_counter_reset_gives_no_rate_then_resumes() -> None:
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver()
    deriver.update(mapping.parse(vllm_text(50_000, 9_000)), 0.0)
    values, notice = deriver.update(mapping.parse(vllm_text(120, 30, start=1.8e9)), 1.0)  # engine restarted
    assert notice is not None and "restart" in notice
    assert not any(k.endswith("_per_s") for k in values)
    assert values["generation_tokens_total"] == 120
    values, notice = deriver.update(mapping.parse(vllm_text(520, 30, start=1.8e9)), 2.0)
    assert notice is None and values["generation_tok_per_s"] == 400.0
    assert deriver.resets == 1


def test_restart_is_seen_by_start_time_even_when_new_counters_are_higher() -> None:
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver()
    deriver.update(mapping.parse(vllm_text(100, 10, start=1.0e9)), 0.0)
    values, notice = deriver.update(mapping.parse(vllm_text(90_000, 10, start=1.1e9)), 1.0)
    assert notice is not None and "generation_tok_per_s" not in values


def test_restart_without_start_time_is_seen_by_a_falling_counter() -> None:
    text = vllm_text(5000, 10).replace("process_start_time_seconds 1700000000.0\n", "")
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver()
    deriver.update(mapping.parse(text), 0.0)
    values, notice = deriver.update(mapping.parse(vllm_text(5001, 5).replace("process_start_time_seconds 1700000000.0\n", "")), 1.0)
    assert notice is not None and "generation_tok_per_s" not in values  # prompt counter fell: whole interval dropped


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.25, 5.0), st.booleans(), st.integers(0, 10_000)), min_size=2, max_size=40))
def test_rates_are_never_negative_or_larger_than_what_happened(steps: list[tuple[float, bool, int]]) -> None:
    """Random traffic with random restarts: every rate is the true increment over the interval."""
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver()
    t, total, start = 0.0, 0.0, 1.0e9
    deriver.update(mapping.parse(vllm_text(total, 0, start=start)), t)
    for dt, restart, produced in steps:
        t += dt
        if restart:
            total, start = 0.0, start + 1
        total += produced
        values, notice = deriver.update(mapping.parse(vllm_text(total, 0, start=start)), t)
        rate = values.get("generation_tok_per_s")
        if restart:
            assert rate is None and notice is not None
        else:
            assert rate == pytest.approx(produced / dt)
            assert rate >= 0


def test_label_sets_are_summed_but_fractions_averaged() -> None:
    text = """vllm:num_requests_running{engine="0"} 3
vllm:num_requests_running{engine="1"} 5
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.6
vllm:generation_tokens_total{engine="0"} 10
vllm:generation_tokens_total{engine="1"} 20
"""
    scrape = MetricMap(vllm.METRIC_NAMES).parse(text)
    assert scrape.gauges["requests_running"] == 8
    assert scrape.gauges["kv_cache_usage_ratio"] == pytest.approx(0.4)
    assert scrape.counters["generation_tokens"] == 30


class _Page(http.server.BaseHTTPRequestHandler):
    pages: dict[int, str] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = self.pages[int(self.server.server_address[1])].encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_pools_pages_are_read_at_once_and_add_up_as_one_engines_label_sets() -> None:
    """A P/D group's decode engines feed the live "engine" series together: tokens and requests
    summed, the KV fraction averaged, a restart of either seen; one page that fails fails the reading."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page) for _ in range(2)]
    for server, page in zip(servers, [vllm_text(10, 100, running=3, kv=0.2, start=1.7e9),
                                      vllm_text(20, 300, running=5, kv=0.6, start=1.8e9)], strict=True):
        _Page.pages[int(server.server_address[1])] = page
        threading.Thread(target=server.serve_forever, daemon=True).start()
    first, second = (f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in servers)

    async def read(scraper: EngineScraper) -> Scrape:
        async with aiohttp.ClientSession() as session:
            return await scraper.fetch(session)

    try:
        scrape = asyncio.run(read(EngineScraper(first, vllm.METRIC_NAMES, timeout_s=30, also=[second])))
        assert scrape.counters["generation_tokens"] == 30 and scrape.counters["prompt_tokens"] == 400
        assert scrape.gauges["requests_running"] == 8 and scrape.gauges["kv_cache_usage_ratio"] == pytest.approx(0.4)
        assert scrape.start_time_s == 1.8e9  # the later start: a restart of either engine moves it
        alone = asyncio.run(read(EngineScraper(first, vllm.METRIC_NAMES, timeout_s=30)))
        assert alone.counters["generation_tokens"] == 10
        gone = f"http://127.0.0.1:{free_port()}/metrics"
        with pytest.raises(ScrapeError, match=gone.replace(".", r"\.")):
            asyncio.run(read(EngineScraper(first, vllm.METRIC_NAMES, timeout_s=30, also=[gone])))
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_sglang_names() -> None:
    text = """# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 1000
sglang:generation_tokens_total{model_name="m"} 4000
sglang:cached_tokens_total{model_name="m"} 250
sglang:token_usage{model_name="m"} 0.28
sglang:num_running_reqs{model_name="m"} 12
sglang:num_queue_reqs{model_name="m"} 3
sglang:gen_throughput{model_name="m"} 1500.5
sglang:spec_accept_length{model_name="m"} 2.5
sglang:time_to_first_token_seconds_sum{model_name="m"} 2.0
sglang:time_to_first_token_seconds_count{model_name="m"} 8
"""
    mapping = MetricMap(sglang.METRIC_NAMES)
    values, _ = RateDeriver().update(mapping.parse(text), 0.0)
    assert values["kv_cache_usage_pct"] == pytest.approx(28.0)
    assert values["requests_running"] == 12 and values["requests_waiting"] == 3
    assert values["generation_tok_per_s"] == 1500.5  # SGLang's own gauge until two scrapes give a rate
    assert values["spec_mean_acceptance_length"] == 2.5
    later = text.replace("} 4000", "} 6000").replace("} 1000", "} 1400").replace("} 250", "} 350")
    deriver = RateDeriver()
    deriver.update(mapping.parse(text), 0.0)
    values, _ = deriver.update(mapping.parse(later), 2.0)
    assert values["generation_tok_per_s"] == 1000.0  # counters win over the gauge
    assert values["prefix_cache_hit_rate_pct"] == 25.0  # 100 cached of 400 new prompt tokens


def test_llamacpp_names_old_and_new() -> None:
    old = """llamacpp:prompt_tokens_total 10
llamacpp:tokens_predicted_total 20
llamacpp:kv_cache_usage_ratio 0.5
llamacpp:requests_processing 1
llamacpp:requests_deferred 2
llamacpp:tokens_drafted_total 40
llamacpp:tokens_drafted_accepted_total 30
"""
    new = """llamacpp:prompt_tokens_total 10
llamacpp:tokens_predicted_total 20
llamacpp:n_decode_total 30
llamacpp:spec_decode_num_draft_tokens_total 0
llamacpp:spec_decode_num_accepted_tokens_total 0
llamacpp:requests_processing 0
"""
    mapping = MetricMap(llamacpp.METRIC_NAMES)
    old_scrape, new_scrape = mapping.parse(old), mapping.parse(new)
    assert old_scrape.gauges["kv_cache_usage_ratio"] == 0.5 and old_scrape.gauges["requests_waiting"] == 2
    assert old_scrape.counters["spec_decode_accepted_tokens"] == 30
    assert "kv_cache_usage_ratio" not in new_scrape.gauges and new_scrape.counters["decode_steps"] == 30
    _, unsupported = support(mapping.names, new_scrape)
    assert "kv_cache_usage_pct" in unsupported


def test_malformed_text_raises_value_error() -> None:
    with pytest.raises(ValueError):
        MetricMap(vllm.METRIC_NAMES).parse('vllm:num_requests_running{engine="0" 3\n')


def test_histogram_output_names() -> None:
    assert histogram_output("ttft_s") == "ttft_mean_ms" and histogram_output("e2e_s") == "e2e_mean_ms"
    assert histogram_output("tokens_per_step") == "tokens_per_step_mean"  # a count, not a time


def _step_page(step_tokens: float, steps: float) -> str:
    return vllm_text(0, 0) + (f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {steps}\n'
                              f'vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {step_tokens}\n')


def test_tokens_per_step_is_a_plain_mean_live_and_per_level() -> None:
    """The real page: 16 streams ran 5,312 tokens in 322 steps. Live and per-level figures come
    from the same histogram, unscaled (tokens, not milliseconds)."""
    from app.load.metrics import engine_deltas

    scrape = MetricMap(vllm.METRIC_NAMES).parse(VLLM_TEXT)
    assert scrape.histograms["tokens_per_step"] == (5312.0, 322.0)
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver()
    deriver.update(mapping.parse(_step_page(100, 50)), 0.0)
    values, _ = deriver.update(mapping.parse(_step_page(100 + 16 * 30, 80)), 1.0)
    assert values["tokens_per_step_mean"] == pytest.approx(16.0)
    names = vllm.METRIC_NAMES
    before = MetricMap(names).parse(_step_page(100, 50))
    after = MetricMap(names).parse(_step_page(100 + 16 * 30 + 64, 81))
    assert engine_deltas(before, after).engine_tokens_per_step_mean == pytest.approx((16 * 30 + 64) / 31)
    assert engine_deltas(before, before).engine_tokens_per_step_mean is None  # no step: unknown, not 0


def test_metrics_url_from_endpoint() -> None:
    assert metrics_url_from("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url_from("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url_from("https://h:1/custom/metrics") == "https://h:1/custom/metrics"
    for bad in ("127.0.0.1:8000", "ftp://x/", "http://", ""):
        with pytest.raises(ValueError):
            metrics_url_from(bad)


def test_scrape_equality_is_by_value() -> None:
    assert Scrape(gauges={"a": 1.0}) == Scrape(gauges={"a": 1.0})


def test_a_scrape_too_close_to_the_last_keeps_the_older_baseline() -> None:
    mapping, deriver = MetricMap(vllm.METRIC_NAMES), RateDeriver(min_interval_s=0.5)
    deriver.update(mapping.parse(vllm_text(0, 0)), 0.0)
    close, _ = deriver.update(mapping.parse(vllm_text(100, 0)), 0.1)
    assert "generation_tok_per_s" not in close and close["generation_tokens_total"] == 100
    later, _ = deriver.update(mapping.parse(vllm_text(1000, 0)), 1.0)
    assert later["generation_tok_per_s"] == 1000.0  # over the whole second, not the last 0.9 s


def test_every_headline_quantity_can_be_produced_from_vllm_names() -> None:
    from app.telemetry import ENGINE_QUANTITIES
    from app.telemetry.engine_metrics import DERIVED_FROM_COUNTERS, gauge_output

    producible = {gauge_output(g)[0] for g in vllm.METRIC_NAMES.gauges} | {
        name for name, needs in DERIVED_FROM_COUNTERS.items() if all(c in vllm.METRIC_NAMES.counters for c in needs)}
    assert set(ENGINE_QUANTITIES) <= producible
