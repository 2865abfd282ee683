"""Settings and A/B changes in words (app.labels, app.headline) and distributions (app.distributions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.analysis.compare import compare_runs
from app.config import RunConfig
from app.distributions import aligned, cdf
from app.headline import factor_words, headlines
from app.labels import describe_change, features_on, in_field_words, label_for, suggest_run_name, value_text
from app.store import RunStore
from engine_adapters.config import Features


def test_settings_and_values_read_as_a_person_says_them() -> None:
    assert label_for("features.prefix_caching") == "Prefix caching"
    assert label_for("workload.api") == "API" and label_for("workload.num_requests") == "Requests"
    assert value_text("features.prefix_caching", None, True) == "on (engine default)"
    assert value_text("load.duration_s", None) == "no limit"
    assert value_text("load.concurrency", 100000) == "100,000"
    assert in_field_words("load pattern 'poisson' needs rate_rps", ["load.rate_rps"]) == \
        "load pattern 'poisson' needs Rate (req/s)"
    assert describe_change([("features.prefix_caching", [False, True])]) == "prefix caching off \u2192 on"
    assert describe_change([("features.kv_cache_dtype", ["auto", "fp8"])]) == "KV-cache precision auto \u2192 fp8"


def test_a_run_name_is_suggested_from_what_changed() -> None:
    before = RunConfig(features=Features(prefix_caching=False)).model_dump(mode="json")
    now = RunConfig(features=Features(prefix_caching=True)).model_dump(mode="json")
    assert suggest_run_name(now, before, "CPU demo") == "prefix caching on"
    assert suggest_run_name(now, now, "CPU demo") == "CPU demo"
    assert suggest_run_name(now, None, "CPU demo") == "CPU demo"
    assert features_on(Features(prefix_caching=True, kv_cache_dtype="fp8").model_dump()) == [
        "KV-cache precision fp8", "prefix caching on"]


def test_changes_are_factors_when_large_and_percentages_when_small() -> None:
    assert factor_words("engine_ttft_ms_mean", 91.2, 19.7) == "4.6\u00d7 faster"
    assert factor_words("ttft_ms_p50", 100.0, 108.0) == "8% slower"
    assert factor_words("output_tok_per_s", 1000.0, 1900.0) == "1.9\u00d7 higher"
    assert factor_words("output_tok_per_s", 1000.0, 1000.0) == "unchanged"


def test_the_headline_leads_with_the_engines_figure_when_the_client_was_starved(tmp_path: Path) -> None:
    from tests.unit.test_compare_reliability import _store_run

    with RunStore(tmp_path / "r.db") as store:
        off = _store_run(store, "prefix off", prefix=False, client_ttft_ms=121.0, itl_ms=12.0, lag_ms=3.0,
                         engine_ttft_ms=91.2)
        on = _store_run(store, "prefix on", prefix=True, client_ttft_ms=173.0, itl_ms=0.0, lag_ms=900.0,
                        engine_ttft_ms=19.7)
        (headline,) = headlines(compare_runs(store, [off, on], series=False))
    assert headline.sentence() == "prefix caching off \u2192 on: TTFT mean (engine) 91.2 \u2192 19.7 ms, 4.6\u00d7 faster"
    assert all(f.key != "ttft_ms_p50" for f in headline.figures)  # the flagged client figure is not a headline


def test_cdf_and_alignment() -> None:
    dist = cdf(np.array([3.0, 1.0, 2.0, np.nan]))
    assert dist is not None and dist.n == 3 and dist.x[0] == 1.0 and dist.x[-1] == 3.0
    assert cdf(np.array([np.nan])) is None
    shifted = aligned(np.array([0.0, 1.0, 2.0, 3.0]), 2.0, 1.0)
    assert shifted[:2].tolist() == [2.0, 3.0] and np.isnan(shifted[2:]).all()
