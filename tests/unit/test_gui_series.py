"""Ring buffers, series store and decimation behind the dashboard (no Qt needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bus import Sample
from app.gui.series import PLOTS, Decimator, Ring, SeriesStore, nice_ceil, peak_decimate, plots_for


@settings(deadline=None)  # timing is no part of these properties
@given(capacity=st.integers(1, 50), values=st.lists(st.floats(-1e6, 1e6), max_size=200))
def test_ring_view_is_the_newest_points_in_order(capacity: int, values: list[float]) -> None:
    ring = Ring(capacity)
    for i, v in enumerate(values):
        ring.append(float(i), v)
    t, v = ring.view()
    expected = values[-capacity:] if values else []
    assert list(v) == expected
    assert list(t) == [float(i) for i in range(len(values))][-capacity:] if values else list(t) == []
    assert len(ring) == len(expected)


def test_ring_view_does_not_copy() -> None:
    ring = Ring(8)
    for i in range(13):
        ring.append(i, i)
    t, v = ring.view()
    assert not t.flags.owndata and not v.flags.owndata  # slices of the preallocated buffers
    assert v.tolist() == [5, 6, 7, 8, 9, 10, 11, 12]


@settings(deadline=None)
@given(capacity=st.integers(1, 40), chunks=st.lists(st.integers(0, 60), max_size=6))
def test_ring_extend_matches_appends(capacity: int, chunks: list[int]) -> None:
    a, b = Ring(capacity), Ring(capacity)
    n = 0
    for size in chunks:
        t = np.arange(n, n + size, dtype=float)
        a.extend(t, t * 2)
        for x in t:
            b.append(x, x * 2)
        n += size
    assert a.view()[0].tolist() == b.view()[0].tolist()
    assert a.view()[1].tolist() == b.view()[1].tolist()


def test_store_ingests_samples_on_a_run_relative_axis() -> None:
    store = SeriesStore(capacity=100)
    store.ingest([Sample("engine", 100.0, 0.0, {"kv_cache_usage_pct": 10.0, "bad": "x"}),  # type: ignore[dict-item]
                  Sample("client", 100.5, 0.0, {"output_tok_per_s": 300.0})])
    store.ingest([Sample("engine", 101.0, 0.0, {"kv_cache_usage_pct": 20.0}),
                  Sample("gpu1", 101.0, 0.0, {"gpu_util_pct": 5.0}), Sample("gpu0", 101.0, 0.0, {"gpu_util_pct": 7.0})])
    t, v = store.series[("engine", "kv_cache_usage_pct")].view()
    assert t.tolist() == [0.0, 1.0] and v.tolist() == [10.0, 20.0]
    assert ("engine", "bad") not in store.series
    assert store.last("client", "output_tok_per_s") == 300.0
    assert store.gpu_sources() == ["gpu0", "gpu1"]


def test_peak_decimation_keeps_spikes_and_bounds_points() -> None:
    t = np.arange(36_000, dtype=float)
    v = np.zeros_like(t)
    v[12_345] = 99.0
    v[30_000] = -5.0
    dt, dv = peak_decimate(t, v, 1000)
    assert len(dt) <= 1000 + 2
    assert dv.max() == 99.0 and dv.min() == -5.0
    assert np.all(np.diff(dt) >= 0)
    small_t, small_v = peak_decimate(t[:10], v[:10], 1000)
    assert len(small_t) == 10 and small_v.tolist() == v[:10].tolist()


@pytest.mark.parametrize(("value", "expected"), [(0.0, 1.0), (0.9, 1.0), (1.1, 1.2), (13, 15), (101, 120), (999, 1000),
                                                 (2001, 2500)])
def test_nice_ceil_is_at_least_the_value_and_round(value: float, expected: float) -> None:
    assert nice_ceil(value) == pytest.approx(expected)


def test_layout_without_gpu_has_host_plots_and_with_gpu_has_gpu_plots() -> None:
    no_gpu = {p.key for p in plots_for(False)}
    gpu = {p.key for p in plots_for(True)}
    assert {"host_memory", "cpu", "tokens", "kv", "requests", "latency"} <= no_gpu
    assert not no_gpu & {"gpu_memory", "bandwidth", "gpu_util"}
    assert {"gpu_memory", "bandwidth", "gpu_util", "tokens", "latency"} <= gpu
    assert len({p.key for p in PLOTS}) == len(PLOTS)


def _reference(t: np.ndarray, v: np.ndarray, start: int, ds: int) -> tuple[list[float], list[float]]:
    """Straightforward peak decimation on absolute block boundaries, for checking Decimator."""
    k0, k1 = -(-start // ds), (start + len(t)) // ds
    head, tail = k0 * ds - start, k1 * ds - start
    out_t, out_v = list(t[:head]), list(v[:head])
    for k in range(k0, k1):
        a = k * ds - start
        block = v[a:a + ds]
        out_t += [t[a], t[a]]
        out_v += [block.min(), block.max()]
    return out_t + list(t[tail:]), out_v + list(v[tail:])


@settings(deadline=None)
@given(capacity=st.integers(8, 300), steps=st.lists(st.integers(1, 90), min_size=1, max_size=12),
       max_points=st.integers(4, 40))
def test_incremental_decimation_equals_decimating_from_scratch(capacity: int, steps: list[int], max_points: int) -> None:
    ring, dec = Ring(capacity), Decimator()
    rng = np.random.default_rng(len(steps))
    for size in steps:
        t = np.arange(ring.total, ring.total + size, dtype=float)
        ring.extend(t, rng.normal(size=size))
        got_t, got_v = dec(ring, max_points)
        t_all, v_all = ring.view()
        want = len(t_all) // max(max_points // 2, 1)
        if want < 2 or dec.ds == 0:
            assert got_t.tolist() == t_all.tolist()
            continue
        ref_t, ref_v = _reference(t_all, v_all, ring.total - len(t_all), dec.ds)
        if -(-(ring.total - len(t_all)) // dec.ds) >= ring.total // dec.ds:
            ref_t, ref_v = t_all.tolist(), v_all.tolist()
        assert got_t.tolist() == ref_t
        assert got_v.tolist() == ref_v


def test_decimation_of_an_hour_is_bounded_and_keeps_extremes() -> None:
    ring, dec = Ring(36_000), Decimator()
    values = np.sin(np.arange(40_000) / 500.0)
    values[39_000] = 7.0
    ring.extend(np.arange(40_000, dtype=float), values)
    t, v = dec(ring, 1000)
    assert len(t) <= 1000 + 2 * dec.ds
    assert v.max() == 7.0 and t[0] == 4000.0
