"""Repeats: Student-t confidence intervals, Welch's test, and Compare treating a set of repeats as
one column whose difference from the baseline is "no significant difference" inside the noise."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.analysis.compare import CAMPAIGN_TAG, REPEAT_TAG, compare_runs
from app.analysis.stats import aggregate, one_sample_p, significant, t_quantile, welch_p
from app.store import RunStore


@pytest.mark.parametrize("df, expected", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)])
def test_student_t_quantiles_match_the_table(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_confidence_interval_and_welch_against_known_values() -> None:
    agg = aggregate([10.0, 12.0, 11.0, 13.0])
    assert agg is not None and agg.mean == 11.5 and agg.std == pytest.approx(math.sqrt(5 / 3))
    assert agg.half_width == pytest.approx(3.182446 * math.sqrt(5 / 3) / 2, rel=1e-5)
    assert aggregate([5.0]) is not None and aggregate([5.0]).ci_low is None  # type: ignore[union-attr]
    assert aggregate([]) is None
    # SciPy: ttest_ind([1, 2, 3], [4, 5, 6], equal_var=False) -> p = 0.02131
    assert welch_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.02131, abs=1e-4)
    assert significant([1, 2, 3], [4, 5, 6]) is True
    assert significant([10, 11, 12], [10.5, 11.5, 12.2]) is False
    assert welch_p([1.0], [2.0]) is None  # no repeats on either side: no noise estimate, no test
    # one side a single run: the set's CI of the mean contains it exactly when p >= 0.05
    xs = [10.0, 12.0, 11.0, 13.0]
    assert agg.ci_high is not None
    assert (one_sample_p(xs, agg.ci_high + 1e-6) or 1) < 0.05 < (one_sample_p(xs, agg.ci_high - 1e-6) or 0)


def _run(store: RunStore, name: str, tok_s: float, ttft_ms: float, tags: list[str]) -> int:
    run_id = store.create_run(name=name, tags=tags, started_at=1.9e9, t0_mono=0.0, config={"name": name})
    n = 10
    duration_s = n * 16 / tok_s
    store.write_batch(run_id, requests=[{"level": 0, "start_wall": 1.9e9 + i * duration_s / n, "ttft_ms": ttft_ms,
                                         "e2e_ms": ttft_ms + 150.0, "output_tokens": 16, "itl_ms": [10.0] * 15}
                                        for i in range(n)])
    store.start_level(run_id, 0, "c4", {}, 1.9e9)
    store.finish_level(run_id, 0, {"duration_s": duration_s}, 1.9e9 + duration_s)
    store.finish_run(run_id, "completed", None, {}, 1.9e9 + duration_s)
    return run_id


def _set(store: RunStore, name: str, tok_s: list[float], ttft_ms: list[float]) -> list[int]:
    tag = f"{REPEAT_TAG}{name}"
    return [_run(store, f"{name} (repeat {i + 1}/{len(tok_s)})", t, f, [tag, f"{CAMPAIGN_TAG}{name}"])
            for i, (t, f) in enumerate(zip(tok_s, ttft_ms, strict=True))]


def test_compare_takes_a_repeat_set_as_one_column_with_its_noise(tmp_path: Path) -> None:
    with RunStore(tmp_path / "r.db") as store:
        # throughput: +10% on average but within a noise of +-30% (as on 2-core machines); TTFT: clearly lower
        base = _set(store, "base", [1000.0, 1400.0, 700.0], [100.0, 101.0, 99.0])
        new = _set(store, "new", [1500.0, 800.0, 1010.0], [60.0, 61.0, 59.0])
        c = compare_runs(store, [base[1], new[0]], series=False)
    assert c.members == [base, new] and c.labels()[0].endswith("base (mean of 3)")
    tok = c.metric("output_tok_per_s")
    assert tok is not None and tok.n == [3, 3] and tok.ci[0] is not None
    assert tok.values[0] == pytest.approx(sum([1000.0, 1400.0, 700.0]) / 3, rel=1e-6)
    assert tok.verdict(1) == "same" and "no significant difference" in tok.note(1)
    ttft = c.metric("ttft_ms_p50")
    assert ttft is not None and ttft.verdict(1) == "better" and ttft.significant[1] is True
    assert "\u00b1" in ttft.value_text(0)


def test_two_runs_of_one_set_are_compared_as_runs(tmp_path: Path) -> None:
    with RunStore(tmp_path / "r.db") as store:
        ids = _set(store, "s", [1000.0, 1200.0], [50.0, 40.0])
        c = compare_runs(store, ids, series=False)
    assert c.members == [[ids[0]], [ids[1]]]
    ttft = c.metric("ttft_ms_p50")
    assert ttft is not None and ttft.verdict(1) == "better" and ttft.significant[1] is None
