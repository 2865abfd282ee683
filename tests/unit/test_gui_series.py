"""Ring buffers, series store and decimation behind the dashboard (no Qt needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.bus import Sample
from app.gui.series import PLOTS, Ring, SeriesStore, nice_ceil, peak_decimate, plots_for


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
