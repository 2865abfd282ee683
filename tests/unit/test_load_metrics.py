"""Figures from request records and engine counters, as docs/metrics.md defines them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.load.aggregate import summarize
from app.load.metrics import (
    RequestRecord,
    SloError,
    Stats,
    client_starved,
    engine_deltas,
    level_notes,
    meets_slo,
    parse_slo,
)
from engine_adapters.prometheus import MetricMap, Scrape
from engine_adapters.vllm import METRIC_NAMES


def rec(i: int, ttft: float, itl: list[float], ok: bool = True, inp: int = 10, **kw: object) -> RequestRecord:
    e2e = ttft + sum(itl)
    out = len(itl) + 1 if ok or itl else 0
    return RequestRecord(level=0, index=i, scheduled_s=0, start_s=0, start_wall_s=0, queue_ms=kw.pop("queue", 0.5),
                         ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e, tpot_ms=(e2e - ttft) / (out - 1) if out > 1 else None,
                         input_tokens=inp, output_tokens=out, ok=ok, **kw)  # type: ignore[arg-type]


@settings(deadline=None)  # timing is no part of the property
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200))
def test_stats_match_numpy_linear_percentiles(values: list[float]) -> None:
    s = Stats.of(values)
    assert s.count == len(values)
    assert s.median == pytest.approx(np.percentile(values, 50))
    assert s.p99 == pytest.approx(np.percentile(values, 99))
    assert s.max == max(values) and s.mean == pytest.approx(np.mean(values))


def test_summary_throughputs_and_latencies() -> None:
    records = [rec(0, 100.0, [10.0] * 9), rec(1, 300.0, [20.0] * 4),
               rec(2, 50.0, [], ok=False, error="HTTP 500: x", error_kind="http"),
               rec(3, 0.0, [], ok=False, error="cancelled", error_kind="cancelled")]
    s = summarize(records, duration_s=2.0, peak_concurrency=3)
    assert (s.requests, s.completed, s.errors, s.cancelled) == (4, 2, 1, 1)
    assert s.error_kinds == {"http": 1} and s.error_examples == ["HTTP 500: x"]
    assert s.output_tokens == 15 and s.output_tok_per_s == pytest.approx(7.5)
    assert s.input_tokens == 20 and s.total_tok_per_s == pytest.approx(17.5)
    assert s.request_throughput_rps == pytest.approx(1.0)
    assert s.ttft_ms.median == pytest.approx(200.0)
    assert s.itl_ms.count == 13 and s.itl_ms.max == 20.0
    assert s.tpot_ms.mean == pytest.approx(15.0)
    assert s.e2e_ms.max == pytest.approx(380.0)
    assert s.queue_ms.count == 3  # cancelled requests never queued for real
    assert s.peak_concurrency == 3 and s.goodput_rps is None


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [rec(0, 100.0, [10.0] * 9), rec(1, 600.0, [10.0] * 9), rec(2, 100.0, [80.0] * 3), rec(3, 10.0, [])]
    s = summarize(records, duration_s=4.0, slo="ttft_ms<=500,tpot_ms<50")
    assert s.good_requests == 2 and s.goodput_rps == pytest.approx(0.5)  # #0 and the 1-token #3 (TPOT 0)
    assert not meets_slo(records[1], parse_slo("ttft_ms<600"))
    assert meets_slo(records[1], parse_slo("ttft_ms<=600"))


@pytest.mark.parametrize("text, message", [("ttft<=5", "unknown"), ("ttft_ms=5", "is not like"), ("", "empty"),
                                           ("ttft_ms<=abc", "is not like")])
def test_bad_slo_strings(text: str, message: str) -> None:
    with pytest.raises(SloError, match=message):
        parse_slo(text)


METRICS_BEFORE = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 6.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{model_name="m"} 3.0
"""
METRICS_AFTER = METRICS_BEFORE.replace("} 100.0", "} 1100.0").replace("} 1000.0", "} 3000.0").replace(
    "hits_total{engine=\"0\",model_name=\"m\"} 200.0", "hits_total{engine=\"0\",model_name=\"m\"} 1700.0").replace(
    "drafts_total{engine=\"0\",model_name=\"m\"} 10.0", "drafts_total{engine=\"0\",model_name=\"m\"} 110.0").replace(
    "draft_tokens_total{engine=\"0\",model_name=\"m\"} 30.0", "draft_tokens_total{engine=\"0\",model_name=\"m\"} 330.0").replace(
    "accepted_tokens_total{engine=\"0\",model_name=\"m\"} 6.0", "accepted_tokens_total{engine=\"0\",model_name=\"m\"} 156.0")


def test_engine_deltas_from_prometheus_text() -> None:
    before = MetricMap(METRIC_NAMES).parse(METRICS_BEFORE)
    after = MetricMap(METRIC_NAMES).parse(METRICS_AFTER)
    d = engine_deltas(before, after)
    assert d.generation_tokens == 1000
    assert d.prefix_cache_hit_rate == pytest.approx(1500 / 2000)
    assert d.spec_acceptance_rate == pytest.approx(150 / 300)
    assert d.spec_mean_acceptance_length == pytest.approx(1 + 150 / 100)
    assert d.preemptions is None  # not exposed: unknown, not zero
    records = [rec(i, 1.0, [1.0] * 99) for i in range(10)]
    assert summarize(records, 1.0, engine=d).tokens_match_engine is True
    assert summarize(records[:9], 1.0, engine=d).tokens_match_engine is False


def test_engine_latency_means_from_histogram_deltas() -> None:
    def text(total: float, count: float) -> str:
        return ("# TYPE vllm:inter_token_latency_seconds histogram\n"
                f'vllm:inter_token_latency_seconds_bucket{{le="+Inf",model_name="m"}} {count}\n'
                f'vllm:inter_token_latency_seconds_count{{model_name="m"}} {count}\n'
                f'vllm:inter_token_latency_seconds_sum{{model_name="m"}} {total}\n')

    before = MetricMap(METRIC_NAMES).parse(text(1.0, 100))
    after = MetricMap(METRIC_NAMES).parse(text(1.5, 200))
    d = engine_deltas(before, after)
    assert d.engine_itl_ms_mean == pytest.approx(5.0)  # 0.5 s over 100 gaps
    assert d.engine_ttft_ms_mean is None


def test_garbage_metrics_text_gives_no_counters() -> None:
    assert MetricMap(METRIC_NAMES).parse("this is { not prometheus") == Scrape()
    with pytest.raises(ValueError):  # a wanted name with a broken value: unreadable, never a made-up zero
        MetricMap(METRIC_NAMES).parse("vllm:generation_tokens_total{ 12")


def test_flat_columns() -> None:
    flat = summarize([rec(0, 100.0, [10.0] * 3)], 1.0, slo="ttft_ms<=500").flat()
    assert flat["ttft_ms_p99"] == pytest.approx(100.0) and flat["itl_count"] == 3
    assert flat["itl_ms_p50"] == flat["itl_ms_median"] == pytest.approx(10.0)
    assert flat["goodput_rps"] == pytest.approx(1.0) and "engine_prefix_cache_hit_rate" in flat
    assert all(not isinstance(v, (dict, list)) for v in flat.values())


def test_level_notes_name_a_starved_client_and_the_engine_side_figures() -> None:
    """The caveats every face shows beside a level: a client whose loop woke later than the token
    gaps it measures is named, with the engine's own figures to trust instead."""
    records = [rec(i, 100.0, [0.1] * 9) for i in range(4)]  # tokens bunched: ~0 ITL
    engine = engine_deltas(
        Scrape(counters={"generation_tokens": 0.0}, histograms={"tokens_per_step": (0.0, 0.0), "itl_s": (0.0, 0.0)}),
        Scrape(counters={"generation_tokens": 40.0}, histograms={"tokens_per_step": (48.0, 12.0), "itl_s": (0.108, 36.0)}))
    starved = summarize(records, duration_s=1.0, engine=engine, client_lag_ms=[2.0] * 50 + [80.0] * 5)
    calm = summarize(records, duration_s=1.0, engine=engine, client_lag_ms=[0.5] * 55)
    assert client_starved(starved) and not client_starved(calm)
    notes = level_notes(starved)
    assert any(n.startswith("client starved of CPU (loop lag p99 80 ms") for n in notes), notes
    assert "engine-side means: TTFT -, ITL 3.00" in notes
    assert "engine batch: 4.0 tokens per step" in notes
    assert "client tokens 40 vs engine 40: equal" in notes
    assert not any("starved" in n for n in level_notes(calm))
