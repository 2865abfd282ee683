"""One reader of Prometheus text: the live collector, a level's engine figures and the feature
checks read the same two pages the same way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.load.metrics import engine_deltas
from app.telemetry.engine_metrics import RateDeriver
from engine_adapters import prometheus, vllm
from engine_adapters.prometheus import MetricMap, Scrape, metric_total


def page(gen: float, queries: float, hits: float, drafts: float, draft_tokens: float, accepted: float,
         ttft_sum_s: float, ttft_count: float) -> str:
    labels = '{engine="0",model_name="m"}'
    return (f"vllm:generation_tokens_total{labels} {gen}\n"
            f"vllm:prefix_cache_queries_total{labels} {queries}\n"
            f"vllm:prefix_cache_hits_total{labels} {hits}\n"
            f"vllm:spec_decode_num_drafts_total{labels} {drafts}\n"
            f"vllm:spec_decode_num_draft_tokens_total{labels} {draft_tokens}\n"
            f"vllm:spec_decode_num_accepted_tokens_total{labels} {accepted}\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {ttft_count}\n'
            f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {ttft_count}\n'
            f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {ttft_sum_s}\n')


def test_live_and_level_figures_agree_on_the_same_interval() -> None:
    mapping = MetricMap(vllm.METRIC_NAMES)
    before = mapping.parse(page(100, 1000, 200, 10, 30, 6, 1.0, 10))
    after = mapping.parse(page(1100, 3000, 1700, 110, 330, 156, 3.0, 30))
    level = engine_deltas(before, after)
    deriver = RateDeriver()
    deriver.update(before, 0.0)
    live, _ = deriver.update(after, 2.0)
    assert level.prefix_cache_hit_rate == pytest.approx(0.75) and live["prefix_cache_hit_rate_pct"] == pytest.approx(75.0)
    assert level.spec_acceptance_rate == pytest.approx(0.5) and live["spec_acceptance_rate_pct"] == pytest.approx(50.0)
    assert level.spec_mean_acceptance_length == live["spec_mean_acceptance_length"] == pytest.approx(2.5)
    assert level.engine_ttft_ms_mean == live["ttft_mean_ms"] == pytest.approx(100.0)
    assert level.generation_tokens == 1000 and live["generation_tok_per_s"] == pytest.approx(500.0)


def test_a_counter_the_engine_creates_late_counts_from_zero() -> None:
    """vLLM creates its speculative counters with the first draft: the level still gets them."""
    before = Scrape(counters={"generation_tokens": 10.0})
    after = Scrape(counters={"generation_tokens": 50.0, "spec_decode_drafts": 4.0, "spec_decode_accepted_tokens": 6.0})
    interval = prometheus.delta(before, after)
    assert interval.counters == {"generation_tokens": 40.0, "spec_decode_drafts": 4.0, "spec_decode_accepted_tokens": 6.0}
    assert prometheus.interval_figures(interval) == {"spec_mean_acceptance_length": 2.5}


def test_figures_without_a_moving_denominator_are_unknown_not_zero() -> None:
    same = Scrape(counters={"prefix_cache_queries": 5.0, "prefix_cache_hits": 1.0}, histograms={"ttft_s": (1.0, 4.0)})
    assert prometheus.interval_figures(prometheus.delta(same, same)) == {}


def test_metric_total_sums_label_sets_and_answers_unknown_for_garbage() -> None:
    text = 'x_total{a="1"} 2\nx_total{a="2"} 3.5\nx_total_created{a="1"} 17\n'
    assert metric_total(text, "x_total") == 5.5
    assert metric_total(text, "y_total") is None
    assert metric_total("x_total{ 12", "x_total") is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e9), min_size=6, max_size=6), st.lists(st.floats(0, 1e9), min_size=6, max_size=6))
def test_interval_ratios_are_bounded_fractions(a: list[float], b: list[float]) -> None:
    names = ("prefix_cache_queries", "prefix_cache_hits", "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
             "spec_decode_drafts", "generation_tokens")
    old, new = Scrape(counters=dict(zip(names, a, strict=True))), Scrape(counters=dict(zip(names, b, strict=True)))
    if prometheus.restarted(old, new):
        return  # the collector drops such an interval; a level's figures come from one engine life
    figures = prometheus.interval_figures(prometheus.delta(old, new))
    for key in ("prefix_cache_hit_ratio", "spec_acceptance_ratio"):
        assert 0.0 <= figures.get(key, 0.0) <= 1.0
    assert figures.get("spec_mean_acceptance_length", 1.0) >= 1.0
