"""Load patterns and the level executor, against a local fake server."""

from __future__ import annotations

import asyncio
import json
import threading
import tomllib
from collections.abc import Iterator
from typing import Any, get_args

import numpy as np
import pytest
import tomli_w
from pydantic import ValidationError

from app.bus import Bus, Event, Sample
from app.events import Progress
from app.load.client import ClientOptions
from app.load.datasets import Conversation, Dataset, Turn
from app.load.executor import LiveStats, StopRule, run_level
from app.load.patterns import LevelPlan, arrival_offsets_s, plan_levels
from app.workload import Arrival, LoadConfig, LoadPattern, arrival_of
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.005)) as srv:
        yield srv


def dataset(n: int, prompt: str = "fake:ok", out: int = 8, turns: int = 1) -> Dataset:
    return Dataset([Conversation(i, [Turn(prompt, out, 3) for _ in range(turns)]) for i in range(n)], True, "test")


def run(plan: LevelPlan, ds: Dataset, server: FakeOpenAIServer, rule: StopRule | None = None,
        cancel: threading.Event | None = None, bus: Bus | None = None, keep_text: bool = False,
        live: LiveStats | None = None):  # type: ignore[no-untyped-def]
    opts = ClientOptions(base_url=server.base_url, model="m", keep_text=keep_text)
    return asyncio.run(run_level(plan, ds, opts, rule or StopRule(), live=live or LiveStats(bus, "r1"), cancel=cancel))


def test_plans() -> None:
    assert [p.concurrency for p in plan_levels(LoadConfig(pattern="sweep", levels=[1, 4, 16]))] == [1, 4, 16]
    rates = plan_levels(LoadConfig(pattern="sweep", sweep_of="rate", levels=[2, 8], burstiness=0.5))
    assert [(p.mode, p.rate_rps, p.arrival) for p in rates] == [("open", 2, "gamma"), ("open", 8, "gamma")]
    (p,) = plan_levels(LoadConfig(pattern="poisson", rate_rps=5, max_concurrency=3))
    assert (p.mode, p.arrival, p.concurrency) == ("open", "poisson", 3)
    (r,) = plan_levels(LoadConfig(pattern="ramp", rate_rps=10, ramp_start_rps=1))
    assert r.arrival == "ramp" and r.ramp_start_rps == 1


def _valid(pattern: LoadPattern) -> dict[str, Any]:
    """A load of ``pattern`` with what it needs, as a profile file holds it."""
    return {"pattern": pattern.value, **({"rate_rps": 2.0} if pattern.takes_rate else {}),
            **({"levels": [1.0, 2.0]} if pattern.takes_levels else {})}


def test_a_pattern_is_stored_as_its_name_and_read_back_as_itself() -> None:
    for pattern in LoadPattern:
        load = LoadConfig.model_validate(_valid(pattern))
        assert load.pattern is pattern
        dumped = load.model_dump(mode="json", exclude_none=True)  # as a profile file holds it
        assert type(dumped["pattern"]) is str and dumped["pattern"] == pattern.value
        assert LoadConfig.model_validate(tomllib.loads(tomli_w.dumps(dumped))).pattern is pattern
        assert LoadConfig.model_validate_json(json.dumps(dumped)).pattern is pattern
    copied = LoadConfig().model_copy(update={"pattern": "sweep", "levels": [1.0]})  # pydantic validates no update
    assert copied.pattern is LoadPattern.SWEEP and copied.pattern.takes_levels
    with pytest.raises(ValidationError, match="Input should be 'closed'"):
        LoadConfig.model_validate({"pattern": "Closed"})
    with pytest.raises(ValidationError):
        LoadConfig.model_validate({"pattern": 1})


def test_the_settings_a_pattern_reads_are_load_settings_and_only_some_patterns_read_each() -> None:
    every = set.union(*(set(p.settings) for p in LoadPattern))
    assert every <= set(LoadConfig.model_fields)
    assert all(any(setting not in p.settings for p in LoadPattern) for setting in every)
    assert {p for p in LoadPattern if p.takes_rate} == {p for p in LoadPattern
                                                         if "needs rate_rps" in _refusal({"pattern": p.value})}


def _refusal(data: dict[str, Any]) -> str:
    try:
        LoadConfig.model_validate(data)
    except ValidationError as exc:
        return str(exc)
    return ""


def test_the_arrival_patterns_are_the_open_loop_ones_and_each_plans_its_own_level() -> None:
    open_loop = {p for p in LoadPattern if p.loop == "open"}
    assert set(get_args(Arrival)) == open_loop
    for pattern in LoadPattern:
        if pattern in open_loop:
            assert arrival_of(pattern.value) is pattern
        else:
            with pytest.raises(ValueError, match="no pattern of arrivals"):
                arrival_of(pattern.value)
    for pattern in open_loop - {LoadPattern.TRACE}:  # a trace's arrivals need a trace workload's times
        (level,) = plan_levels(LoadConfig.model_validate({**_valid(pattern), "burstiness": 1.0}))
        assert (level.mode, level.arrival) == ("open", pattern)
        assert len(arrival_offsets_s(level, 5, seed=0)) == 5


def test_arrivals_are_seeded_and_have_the_asked_rate_and_burstiness() -> None:
    poisson = LevelPlan(0, "p", "open", rate_rps=20.0, arrival="poisson")
    a, b = arrival_offsets_s(poisson, 4000, seed=3), arrival_offsets_s(poisson, 4000, seed=3)
    assert np.array_equal(a, b) and a[0] == 0
    gaps = np.diff(a)
    assert np.mean(gaps) == pytest.approx(1 / 20, rel=0.06)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.1)  # exponential: CV 1
    bursty = np.diff(arrival_offsets_s(LevelPlan(0, "g", "open", rate_rps=20.0, arrival="gamma", burstiness=0.25),
                                       4000, seed=3))
    assert np.mean(bursty) == pytest.approx(1 / 20, rel=0.1)
    assert np.std(bursty) / np.mean(bursty) == pytest.approx(2.0, rel=0.15)  # gamma shape k: CV 1/sqrt(k)
    constant = np.diff(arrival_offsets_s(LevelPlan(0, "c", "open", rate_rps=4.0, arrival="constant"), 10, seed=0))
    assert np.allclose(constant, 0.25)
    ramp = np.diff(arrival_offsets_s(LevelPlan(0, "r", "open", rate_rps=50.0, arrival="ramp", ramp_start_rps=2.0),
                                     2000, seed=0))
    assert np.mean(ramp[:200]) > 5 * np.mean(ramp[-200:])


def test_closed_loop_keeps_concurrency_in_flight(server: FakeOpenAIServer) -> None:
    out = run(LevelPlan(0, "c4", "closed", concurrency=4), dataset(20), server)
    assert len(out.records) == 20 and all(r.ok for r in out.records)
    assert out.peak_concurrency == 4 and out.stop_reason == "completed"
    assert out.client_lag_ms.size and min(out.client_lag_ms) >= 0
    assert sorted(r.index for r in out.records) == list(range(20))
    assert max(r.queue_ms for r in out.records) < 500  # a free slot is used at once (slack: shared CPU)


def test_open_loop_sends_on_schedule(server: FakeOpenAIServer) -> None:
    plan = LevelPlan(0, "const", "open", rate_rps=40.0, arrival="constant")
    out = run(plan, dataset(12), server)
    assert len(out.records) == 12 and all(r.ok for r in out.records)
    scheduled = sorted(r.scheduled_s for r in out.records)
    assert np.allclose(np.diff(scheduled), 0.025, atol=1e-6)
    lags_s = [r.start_s - r.scheduled_s for r in out.records]
    # sent when due: typically within milliseconds; one wake-up held back on a loaded machine is not a schedule bug
    assert min(lags_s) >= 0 and float(np.median(lags_s)) < 0.05 and max(lags_s) < 1.0, lags_s
    assert out.duration_s >= 11 * 0.025


def test_client_side_queue_is_measured_apart_from_ttft(server: FakeOpenAIServer) -> None:
    # 20 req/s offered, one at a time allowed, each ~40 ms on the server: requests wait in the client.
    plan = LevelPlan(0, "capped", "open", concurrency=1, rate_rps=100.0, arrival="constant")
    out = run(plan, dataset(8, "fake:slow", out=8), server)
    by_start = sorted(out.records, key=lambda r: r.scheduled_s)
    last = by_start[-1]
    assert last.queue_ms > 100  # waited behind the others
    assert last.ttft_ms is not None and last.ttft_ms < last.queue_ms / 2  # TTFT excludes the wait
    assert out.peak_concurrency == 1


def test_duration_stops_sending(server: FakeOpenAIServer) -> None:
    out = run(LevelPlan(0, "c2", "closed", concurrency=2), dataset(3, "fake:slow", out=10), server,
              StopRule(duration_s=0.4))
    assert out.stop_reason == "duration reached"
    assert all(r.start_s < 0.4 for r in out.records) and len(out.records) >= 4  # cycles the 3 conversations


def test_error_budget_stops_the_level(server: FakeOpenAIServer) -> None:
    out = run(LevelPlan(0, "c2", "closed", concurrency=2), dataset(50, "fake:http_500"), server,
              StopRule(max_error_fraction=0.5))
    assert out.stop_reason.startswith("error budget exceeded") and "HTTP 500" in out.stop_reason
    assert 5 <= len(out.records) < 10


class _CancelMidStream(LiveStats):
    """Cancels when a request gets its first token after two requests completed: the cancel
    then lands mid-level, with finished requests and one that is streaming (30 tokens, ~150 ms
    to go), whatever the machine's speed -- unlike a timer armed before the level starts."""

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__(None)
        self.cancel = cancel

    def on_first(self, ttft_ms: float) -> None:
        super().on_first(ttft_ms)
        if self.done >= 2:
            self.cancel.set()


def test_cancel_keeps_partial_results(server: FakeOpenAIServer) -> None:
    cancel = threading.Event()
    out = run(LevelPlan(0, "c3", "closed", concurrency=3), dataset(100, "fake:slow", out=30), server, cancel=cancel,
              live=_CancelMidStream(cancel))
    assert out.stop_reason == "cancelled"
    done = [r for r in out.records if r.ok]
    cut = [r for r in out.records if r.error_kind == "cancelled"]
    assert len(done) >= 2 and cut and len(out.records) < 100
    # What streamed before the cancel is kept; a request cut before its first chunk has none.
    assert all(r.output_tokens > 0 for r in cut if r.ttft_ms is not None)
    assert all(r.output_tokens == 0 for r in cut if r.ttft_ms is None)
    assert any(r.output_tokens > 0 for r in cut)


def test_multi_turn_resends_history(server: FakeOpenAIServer) -> None:
    out = run(LevelPlan(0, "c2", "closed", concurrency=2), dataset(3, "hello", out=4, turns=3), server, keep_text=True)
    assert len(out.records) == 9 and all(r.ok for r in out.records)
    assert sorted((r.conversation, r.turn) for r in out.records) == [(c, t) for c in range(3) for t in range(3)]


def test_live_progress_is_one_event_that_is_also_the_client_series(server: FakeOpenAIServer) -> None:
    bus = Bus()
    sub = bus.subscribe()
    run(LevelPlan(0, "c2", "closed", concurrency=2), dataset(16, "fake:slow", out=20), server, bus=bus)
    items = sub.drain()
    progress = [i.payload for i in items if isinstance(i, Event) and isinstance(i.payload, Progress)]
    assert not [i for i in items if isinstance(i, Sample)]  # published once: no second "client" sample
    assert len(progress) >= 2
    last = progress[-1]
    assert last.requests_done == 16 and last.errors == 0 and last.run_id == "r1"
    series = last.sample(0.0, 0.0)
    assert series.source == "client" and series.values["requests_done"] == 16 and series.values["errors"] == 0
    assert {"output_tok_per_s", "requests_in_flight", "ttft_ms_p50", "itl_ms_p50"} <= set(series.values)
    assert any(p.output_tok_per_s > 0 for p in progress)


def test_a_level_cancelled_before_it_starts_sends_nothing(server: FakeOpenAIServer) -> None:
    cancel = threading.Event()
    cancel.set()
    before = server.requests
    out = run(LevelPlan(0, "c3", "closed", concurrency=3), dataset(10), server, cancel=cancel)
    assert out.stop_reason == "cancelled" and out.records == [] and server.requests == before
