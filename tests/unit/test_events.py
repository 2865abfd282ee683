"""The bus contract (app.events): each kind defined once, filtered by type, stored as JSON that
reads back into the same event."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError

from app.bus import Bus, Sample
from app.config import RunConfig
from app.events import (
    EVENT_TYPES,
    AnyEvent,
    EngineReady,
    EventPayload,
    LevelStarted,
    LogLine,
    PhaseChanged,
    Progress,
    RunFinished,
    RunStarted,
)
from engine_adapters.base import FeatureCheck


def test_every_kind_is_defined_once_and_listed() -> None:
    kinds = [t.kind for t in EVENT_TYPES]
    assert len(kinds) == len(set(kinds))
    assert set(typing.get_args(AnyEvent)) == set(EVENT_TYPES)
    assert {c for c in EventPayload.__subclasses__()} == set(EVENT_TYPES)
    assert not {"level", "run_status"} & set(kinds)  # never emitted: not defined


def test_subscriptions_filter_by_type() -> None:
    bus = Bus()
    phases = bus.subscribe(kinds=(PhaseChanged,))
    samples = bus.subscribe(kinds=(Sample,), sources=("host",))
    everything = bus.subscribe()
    bus.emit(LogLine(line="INFO hello"))
    bus.emit(PhaseChanged(phase="loading weights", detail="Loading safetensors"))
    bus.sample("host", {"cpu_pct": 5.0})
    bus.sample("gpu0", {"gpu_util_pct": 5.0})
    assert [e.kind for e in phases.drain()] == ["phase"]  # type: ignore[union-attr]
    assert [s.source for s in samples.drain()] == ["host"]  # type: ignore[union-attr]
    assert len(everything.drain()) == 4


def test_a_misspelt_or_missing_field_is_refused() -> None:
    with pytest.raises(ValidationError):
        LogLine(text="x")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        RunFinished(run_id="r", status="done", ended_wall_s=1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("event", [
    RunStarted(run_id="r", name="n", config=RunConfig(), engine_kind="vllm", model="m", started_wall_s=1.0),
    EngineReady(run_id="r", base_url="http://127.0.0.1:1", startup_s=2.0, kv_cache={"kv_cache_tokens": 10.0},
                feature_checks=[FeatureCheck("prefix_caching", "True", "verified", "hits")]),
    LevelStarted(run_id="r", index=0, label="c=2", mode="closed", concurrency=2, started_wall_s=1.0),
    Progress(run_id="r", level=0, requests_done=3, errors=1, requests_in_flight=2, output_tokens=9, elapsed_s=1.5,
             output_tok_per_s=6.0, ttft_ms_p50=12.0),
    RunFinished(run_id="r", status="completed", ended_wall_s=2.0, summary={"levels": []}),
], ids=lambda e: e.kind)
def test_the_stored_json_reads_back_as_the_same_event(event: EventPayload) -> None:
    assert type(event).model_validate(event.to_json()) == event


def test_progress_is_the_client_series() -> None:
    p = Progress(run_id="r", level=0, requests_done=3, errors=1, requests_in_flight=2, output_tokens=9,
                 elapsed_s=1.5, output_tok_per_s=6.0, ttft_ms_p50=12.0)
    sample = p.sample(5.0, 6.0)
    assert (sample.source, sample.t_mono, sample.t_wall) == ("client", 5.0, 6.0)
    assert sample.values == {"output_tok_per_s": 6.0, "requests_done": 3.0, "errors": 1.0,
                             "requests_in_flight": 2.0, "ttft_ms_p50": 12.0}
