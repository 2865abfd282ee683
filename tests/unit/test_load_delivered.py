"""Proof of the load delivered and the steady window (``app.load.delivery``) on request times
made here: what a closed loop could hold, a loop that fell behind, a ramp of rates, tokens inside a
window. The same end to end through ``tunebench run`` against the fake server, in real time, is in
test_load_delivered_e2e."""

from __future__ import annotations

import numpy as np
import pytest

from app.load.delivery import LevelTarget, LevelTimes, delivered, steady_window
from app.load.metrics import RequestRecord


def _record(i: int, start_s: float, e2e_ms: float, *, tokens: int = 4, scheduled_s: float | None = None,
            cap_wait_ms: float = 0.0) -> RequestRecord:
    scheduled = start_s if scheduled_s is None else scheduled_s
    itl = [e2e_ms / tokens] * (tokens - 1)
    return RequestRecord(level=0, index=i, scheduled_s=scheduled, start_s=start_s, start_wall_s=start_s,
                         queue_ms=(start_s - scheduled) * 1e3, ttft_ms=e2e_ms / tokens, itl_ms=itl,
                         e2e_ms=e2e_ms, output_tokens=tokens, ok=True, cap_wait_ms=cap_wait_ms)


def test_a_closed_loop_with_fewer_requests_than_streams_is_judged_on_what_it_could_hold() -> None:
    """Three requests at concurrency 8: three in flight is all the level could deliver."""
    times = LevelTimes()
    for i in range(3):
        times.add(_record(i, 0.001 * i, 1000.0))
    got = delivered(times, LevelTarget("closed", concurrency=8), planned_requests=3)
    assert got.intended_concurrency == 3 and not got.fell_behind


def test_a_closed_loop_that_could_not_keep_its_streams_busy_fell_behind() -> None:
    """Four streams asked, but each waited as long between requests as a request took."""
    times = LevelTimes()
    for k in range(4):
        for j in range(10):
            times.add(_record(10 * k + j, 0.2 * j + 0.01 * k, 100.0))
    got = delivered(times, LevelTarget("closed", concurrency=4), planned_requests=40)
    assert got.achieved_concurrency == pytest.approx(2.0, rel=0.1)
    assert got.fell_behind and got.reason == "the client fell behind: it kept 2.0 requests in flight of the 4 asked"


def test_a_ramp_of_rates_has_no_steady_window_and_says_why() -> None:
    times = LevelTimes()
    for i in range(20):
        times.add(_record(i, 0.1 * i, 50.0))
    window, why = steady_window(times, LevelTarget("open", rate_rps=10.0, arrival="ramp"), 2.0)
    assert window is None and why == "a ramp of arrival rates has no steady state"


def test_tokens_inside_a_window_are_counted_by_when_they_arrived() -> None:
    """One request's 100 tokens, one every 10 ms from 1 s: 50 of them fall in [1.0, 1.5)."""
    times = LevelTimes()
    times.add(_record(0, 0.99, 1000.0, tokens=100))  # TTFT 10 ms: the first token at 1.0 s
    assert times.tokens_between(0.0, 5.0) == pytest.approx(100)
    assert times.tokens_between(1.0, 1.495) == pytest.approx(50, abs=1)
    assert np.isclose(times.tokens_between(3.0, 4.0), 0.0)
