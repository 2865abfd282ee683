"""The metric catalogue: every figure any face shows is defined there once, with a direction;
reliability rules; the headline switch to engine-side figures; changes said as factors."""

from __future__ import annotations

import pytest

from app.analysis import metric_catalog as catalog
from app.analysis.summary import RequestArrays, level_summary_figures, summarize_requests
from app.load.aggregate import summarize
from app.load.metrics import EngineDeltas, LevelSummary, RequestRecord, Stats, client_starved


def _records() -> list[RequestRecord]:
    out = []
    for i in range(6):
        ok = i != 5
        out.append(RequestRecord(level=0, index=i, scheduled_s=0.1 * i, start_s=0.1 * i, start_wall_s=1e9 + 0.1 * i,
                                 queue_ms=0.5, ttft_ms=20.0 + i if ok else None, itl_ms=[5.0 + i] * 3 if ok else [],
                                 tpot_ms=5.0 + i if ok else None, e2e_ms=35.0 + 4 * i if ok else None,
                                 input_tokens=10, output_tokens=4 if ok else 0, ok=ok,
                                 error=None if ok else "HTTP 500", error_kind=None if ok else "http"))
    return out


def test_every_figure_computed_anywhere_is_in_the_catalogue() -> None:
    """A figure the store or the runner computes but the catalogue does not know would be shown
    under its column name, with no direction: the catalogue must know them all."""
    recs = _records()
    arrays = RequestArrays.from_columns(
        level=[0] * len(recs), start_wall=[r.start_wall_s for r in recs], ttft_ms=[r.ttft_ms for r in recs],
        e2e_ms=[r.e2e_ms for r in recs], input_tokens=[r.input_tokens for r in recs],
        output_tokens=[r.output_tokens for r in recs], ok=[r.ok for r in recs], errors=[r.error for r in recs],
        itl_ms=[r.itl_ms for r in recs], queue_ms=[r.queue_ms for r in recs])
    store_keys = set(summarize_requests(arrays, 1.0))
    engine = EngineDeltas(generation_tokens=20, prompt_tokens=60, prefix_cache_queries=60, prefix_cache_hits=30,
                          prefix_cache_hit_rate=0.5, spec_acceptance_rate=0.5, spec_mean_acceptance_length=2.0,
                          engine_ttft_ms_mean=10, engine_itl_ms_mean=4, engine_e2e_ms_mean=30, engine_queue_ms_mean=1,
                          engine_tokens_per_step_mean=3, preemptions=0, requests_finished=5)
    level = summarize(recs, 1.0, slo="ttft_ms<=500", engine=engine, client_lag_ms=[1.0, 2.0])
    runner_keys = set(level.figures())
    unknown = sorted((store_keys | runner_keys) - set(catalog.BY_KEY) - catalog.NOT_SHOWN)
    assert unknown == []
    assert {"engine_ttft_ms_mean", "engine_output_tok_per_s", "prefix_cache_hit_rate", "goodput_rps"} <= runner_keys


def test_runner_and_store_summaries_agree_on_the_same_records() -> None:
    """One definition: the runner's LevelSummary (streaming) and the store's summary of the same
    records give the same figures under the same keys."""
    recs = _records()
    level = summarize(recs, 0.75)
    arrays = RequestArrays.from_columns(
        level=[0] * len(recs), start_wall=[r.start_wall_s for r in recs], ttft_ms=[r.ttft_ms for r in recs],
        e2e_ms=[r.e2e_ms for r in recs], input_tokens=[r.input_tokens for r in recs],
        output_tokens=[r.output_tokens for r in recs], ok=[r.ok for r in recs], errors=[r.error for r in recs],
        itl_ms=[r.itl_ms for r in recs])
    store = summarize_requests(arrays, 0.75)
    runner = level.figures()
    for key in ("output_tok_per_s", "total_tok_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
                "tpot_ms_mean", "e2e_ms_p90", "requests_total", "requests_failed"):
        assert runner[key] == pytest.approx(store[key], rel=1e-6), key
    assert store["requests_failed"] == 1 and store["error_rate_pct"] == pytest.approx(100 / 6)


def test_directions_and_changes_read_as_a_person_says_them() -> None:
    assert catalog.metric("output_tok_per_s").direction == "higher"
    assert catalog.metric("ttft_ms_p50").direction == "lower"
    assert catalog.metric("startup_s").direction == "neutral"  # machine caches, not the configuration
    assert catalog.metric("ttft_ms_p50").name == "TTFT p50" and catalog.metric("ttft_ms_p50").unit == "ms"
    assert catalog.change_text("output_tok_per_s", 1000.0, 1900.0) == "\u00d71.90"
    assert catalog.change_text("ttft_ms_p50", 100.0, 36.0) == "-64%"
    assert catalog.verdict("output_tok_per_s", +900.0) == "better"
    assert catalog.verdict("ttft_ms_p50", +5.0) == "worse"
    assert catalog.verdict("startup_s", -30.0) == ""
    level = catalog.metric("L1.ttft_ms_p50")
    assert level.name == "TTFT p50 [L1]" and level.engine_alternative == "L1.engine_ttft_ms_mean"
    assert catalog.metric("p99_ttft_ms").direction == "neutral"  # an imported tool's own figure: shown, never judged


def test_starved_client_flags_its_timed_figures_not_counts() -> None:
    figures = {"client_lag_ms_p99": 900.0, "itl_ms_p50": 0.0, "ttft_ms_p50": 173.0, "e2e_ms_p50": 400.0,
               "tpot_ms_mean": 3.0, "itl_ms_mean": 4.0, "requests_total": 16.0, "output_tok_per_s": 900.0,
               "engine_ttft_ms_mean": 19.7, "tokens_match_engine": 1.0}
    flags = catalog.unreliable_figures(figures)
    assert set(flags) == {"ttft_ms_p50", "e2e_ms_p50", "tpot_ms_mean", "itl_ms_p50", "itl_ms_mean"}
    assert "starved" in flags["ttft_ms_p50"] and "900 ms" in flags["ttft_ms_p50"]
    calm = dict(figures, client_lag_ms_p99=2.0, itl_ms_p50=8.0)
    assert catalog.unreliable_figures(calm) == {}


def test_itl_p50_of_zero_is_bunched_tokens_even_without_starvation() -> None:
    flags = catalog.unreliable_figures({"client_lag_ms_p99": 1.0, "itl_ms_p50": 0.0, "itl_ms_p99": 12.0,
                                        "itl_ms_mean": 4.0, "ttft_ms_p50": 50.0, "output_tokens_total": 64.0})
    assert set(flags) == {"itl_ms_p50", "itl_ms_p99"} and "bunched" in flags["itl_ms_p50"]


def test_token_count_mismatch_flags_throughput() -> None:
    flags = catalog.unreliable_figures({"output_tok_per_s": 10.0, "tokens_match_engine": 0.0})
    assert "token counts differ" in flags["output_tok_per_s"]


def test_headline_switches_to_the_engine_figure_before_the_flagged_one() -> None:
    available = ["output_tok_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "engine_ttft_ms_mean",
                 "engine_itl_ms_mean"]
    assert catalog.headline_keys(available, ()) == ["output_tok_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50"]
    switched = catalog.headline_keys(available, {"ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50"})
    assert switched == ["output_tok_per_s", "engine_ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99",
                        "engine_itl_ms_mean", "itl_ms_p50"]


def test_client_starved_is_one_rule_for_the_level_summary_and_the_catalogue() -> None:
    s = LevelSummary(client_lag_ms=Stats(p99=40.0), itl_ms=Stats(median=20.0))
    assert client_starved(s) and catalog.client_starved(40.0, 20.0)
    assert not client_starved(LevelSummary(client_lag_ms=Stats(p99=4.0), itl_ms=Stats(median=0.0)))
    assert client_starved(LevelSummary(client_lag_ms=Stats(p99=6.0), itl_ms=Stats(median=None)))
    assert s.unreliable() and "starved" in next(iter(s.unreliable().values()))


def test_level_summary_figures_reads_the_stored_shape() -> None:
    s = summarize(_records(), 1.0, engine=EngineDeltas(generation_tokens=20.0, engine_ttft_ms_mean=9.0),
                  client_lag_ms=[1.0, 3.0])
    figs = level_summary_figures(s.model_dump(mode="json"))
    assert figs["ttft_ms_p50"] == s.ttft_ms.median and figs["requests_per_s"] == s.request_throughput_rps
    assert figs["engine_output_tok_per_s"] == pytest.approx(20.0) and figs["engine_ttft_ms_mean"] == 9.0
    assert figs["client_lag_ms_p99"] == s.client_lag_ms.p99
