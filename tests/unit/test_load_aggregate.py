"""A level's figures built one record at a time in bounded memory: exact below the limit, within
0.05% past it, and the same as summarizing the records as a list."""

from __future__ import annotations

import numpy as np
import pytest

from app.load.aggregate import BINS_PER_OCTAVE, Distribution, LevelAccumulator, summarize
from app.load.metrics import RequestRecord, Stats


def rec(i: int, ok: bool = True, itl: list[float] | None = None, error_kind: str | None = None) -> RequestRecord:
    itl = [5.0 + (i % 7)] * 9 if itl is None else itl
    return RequestRecord(level=0, index=i, scheduled_s=0.0, start_s=0.0, start_wall_s=0.0, queue_ms=0.5 * i,
                         ttft_ms=100.0 + i if ok else None, itl_ms=itl if ok else [], tpot_ms=6.0 + i % 3 if ok else None,
                         e2e_ms=150.0 + 2 * i if ok else 40.0, output_tokens=10 if ok else 2, expected_output_tokens=10,
                         input_tokens_counted=32, ok=ok, error=None if ok else f"HTTP 500 #{i % 2}",
                         error_kind=None if ok else (error_kind or "http"))


def test_accumulator_equals_a_summary_of_the_list() -> None:
    records = [rec(i, ok=i % 5 != 0) for i in range(200)] + [rec(999, ok=False, error_kind="cancelled")]
    acc = LevelAccumulator("ttft_ms<=250,tpot_ms<8")
    for r in records:
        acc.add(r)
    got = acc.summary(2.0, peak_concurrency=4)
    # the list, summarized the old way (every value in float64)
    done = [r for r in records if r.ok]
    assert (got.requests, got.completed, got.errors, got.cancelled) == (201, 160, 40, 1)
    assert got.error_kinds == {"http": 40} and got.error_examples == ["HTTP 500 #0", "HTTP 500 #1"]
    assert got.output_tokens == sum(r.output_tokens for r in records)
    assert got.good_requests == sum(1 for r in done if r.ttft_ms is not None and r.ttft_ms <= 250 and (r.tpot_ms or 0) < 8)
    for name, values in (("ttft_ms", [r.ttft_ms for r in done]), ("e2e_ms", [r.e2e_ms for r in done]),
                         ("itl_ms", [x for r in done for x in r.itl_ms]),
                         ("queue_ms", [r.queue_ms for r in records if r.error_kind != "cancelled"])):
        want, have = Stats.of(values), getattr(got, name)
        assert have.count == want.count
        for stat in ("mean", "median", "p90", "p99", "max", "min", "std"):
            assert getattr(have, stat) == pytest.approx(getattr(want, stat), rel=1e-6), (name, stat)
    assert summarize(records, 2.0, slo="ttft_ms<=250,tpot_ms<8", peak_concurrency=4) == got


def test_distribution_is_exact_below_its_limit_and_close_past_it() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=2.0, sigma=1.0, size=50_000).astype(np.float32)
    values[:300] = 0.0  # tokens of a first chunk have an ITL of 0
    exact = Distribution(exact_limit=10**6)
    folded = Distribution(exact_limit=10_000)
    for part in np.array_split(values, 97):
        exact.extend(part)
        folded.extend(part)
    assert exact.exact and not folded.exact and folded.values().size == 0  # past the limit: no values kept
    want = Stats.of(values)
    have = exact.stats()
    for stat in ("count", "mean", "median", "p90", "p95", "p99", "max", "min", "std"):
        assert getattr(have, stat) == pytest.approx(getattr(want, stat), rel=1e-6), stat
    got = folded.stats()
    assert got.count == want.count and got.min == want.min and got.max == want.max
    assert got.mean == pytest.approx(want.mean, rel=1e-9) and got.std == pytest.approx(want.std, rel=1e-6)
    half_bin = 2 ** (0.5 / BINS_PER_OCTAVE) - 1  # a bin's centre is this far from its edges, relatively
    for stat in ("median", "p90", "p95", "p99"):
        assert getattr(got, stat) == pytest.approx(getattr(want, stat), rel=2 * half_bin + 1e-6), stat


def test_memory_stops_growing_at_the_limit() -> None:
    d = Distribution(exact_limit=200_000)
    chunk = np.full(10_000, 3.5, dtype=np.float32)
    for _ in range(20):
        d.extend(chunk)
    held_at_limit = sum(c.nbytes for c in d._chunks)
    for _ in range(200):  # 2 million more values
        d.extend(chunk)
    assert d.count == 2_200_000 and not d._chunks and len(d._bins or {}) == 1
    assert held_at_limit <= 4 * (200_000 + 65_536) and d.stats().median == pytest.approx(3.5, rel=1e-3)
