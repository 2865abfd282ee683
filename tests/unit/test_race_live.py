"""The live race's model: a level's sample request streams its pieces while it runs (the pieces the
store then keeps, at the same times), and a :class:`LiveRace` fed two trials' events grows the
same schedule as they arrive, runs each side's clock, draws a finish line when each request ends
and, after both, is the race the stored samples replay."""

from __future__ import annotations

import asyncio
from typing import Any

from app.bus import Event
from app.config import RunConfig
from app.events import AnyEvent, LevelFinished, RunFinished, RunStarted, SampleStreamed
from app.load.client import ClientOptions, merged_pieces
from app.load.datasets import Conversation, Dataset, Turn
from app.load.executor import LiveStats, StopRule, run_level
from app.load.metrics import LevelSummary
from app.load.patterns import LevelPlan
from app.race import LiveRace, RaceSide, side_tag
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer
from tests.fuzz.hostile import cli


def test_a_sample_streams_its_pieces_before_it_ends_and_they_are_the_stored_ones() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.005)) as server:
        opts = ClientOptions(base_url=server.base_url, model="m")
        ds = Dataset([Conversation(i, [Turn("fake:ok", 8, 5)]) for i in range(3)], True, "test")
        asyncio.run(run_level(LevelPlan(0, "c=1", "closed", concurrency=1), ds, opts, StopRule(),
                              live=LiveStats(None, "r1"), on_sample=lambda s: calls.append(("end", s)),
                              on_sample_piece=lambda p: calls.append(("piece", p))))
    kinds = [kind for kind, _ in calls]
    assert kinds.count("end") == 1 and kinds[-1] == "end" and kinds.count("piece") >= 3
    first = calls[0][1]
    assert first["text"] == [] and "start_wall_s" in first and first["prompt"]  # its start, before any piece
    streamed = merged_pieces([part for kind, part in calls if kind == "piece"])
    stored = calls[-1][1]
    assert streamed["t_ms"] == stored["t_ms"] and streamed["tokens"] == stored["tokens"]
    assert streamed["text"] == stored["text"] and streamed["prompt"] == stored["prompt"]
    assert streamed["start_wall_s"] == stored["start_wall_s"] and sum(stored["tokens"]) == stored["output_tokens"] > 2


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _event(payload: AnyEvent) -> Event:
    return Event(0.0, 0.0, payload)


def _started(run_id: str, name: str, tags: list[str] | None = None) -> Event:
    return _event(RunStarted(run_id=run_id, name=name, tags=tags or [], config=RunConfig(name=name),
                             engine_kind="llamacpp", model="m", started_wall_s=1.9e9))


SAMPLE_A = {"prompt": "Say it", "start_wall_s": 1.9e9 + 1, "text": ["One", " two", " three"],
            "t_ms": [40.0, 50.0, 61.5], "tokens": [1, 1, 1], "output_tokens": 3}
SAMPLE_B = {"prompt": "Say it", "start_wall_s": 1.9e9 + 2, "text": ["One", " two"], "t_ms": [90.0, 140.0],
            "tokens": [1, 1], "output_tokens": 2}


def _part(sample: dict[str, Any], pieces: slice, start: bool) -> dict[str, Any]:
    part = {key: sample[key][pieces] for key in ("text", "t_ms", "tokens")}
    return {"prompt": sample["prompt"], "start_wall_s": sample["start_wall_s"], **part} if start else part


def test_a_live_race_grows_as_pieces_arrive_and_ends_as_the_stored_samples_replay() -> None:
    clock = Clock()
    live = LiveRace("fast", "slow", clock=clock)
    assert live.feed(_started("rb", "slow")) and live.feed(_started("ra", "fast"))  # sides by name, in any order
    assert live.sides["A"].run_id == "ra" and live.sides["B"].run_id == "rb"
    assert live.race().live and not live.race().ended and live.replay() is None
    live.feed(_event(SampleStreamed(run_id="ra", level=0, label="c=1", part=_part(SAMPLE_A, slice(0, 2), True))))
    race = live.race()
    assert race.a.pieces == ("One", " two") and race.a.t_ms == (40.0, 50.0) and not race.a.ended
    assert race.b.pieces == () and live.tokens() == {"A": 2, "B": 0}
    assert race.title().startswith("Live:") and "Replay" not in race.title()
    clock.now_s += 0.005  # A's clock runs on from its last arrival; B's request has not been sent
    a_ms, b_ms = live.clocks_ms()
    assert abs(a_ms - 55.0) < 1e-6 and b_ms == 0.0
    assert not race.a.state_at(55.0).finished  # no finish line before its request ends
    live.feed(_event(SampleStreamed(run_id="rb", level=0, label="c=1", part=_part(SAMPLE_B, slice(0, 1), True))))
    live.feed(_event(SampleStreamed(run_id="ra", level=0, label="c=1", part=SAMPLE_A, ended=True)))
    live.feed(_event(SampleStreamed(run_id="ra", level=1, label="c=4", part=SAMPLE_B, ended=True)))  # a later level
    assert live.race().a.ended and live.race().a.state_at(live.clocks_ms()[0]).finished
    assert [t for t, key, _ in live.race().schedule() if key == "A"] == SAMPLE_A["t_ms"]  # the same schedule
    live.feed(_event(SampleStreamed(run_id="rb", level=0, label="c=1", part=SAMPLE_B, ended=True)))
    assert live.ended and live.clocks_ms() == (61.5, 140.0)
    replay = live.replay()
    assert replay is not None and not replay.live and replay.winner == "A"
    for side, sample, name in ((replay.a, SAMPLE_A, "fast"), (replay.b, SAMPLE_B, "slow")):
        assert side == RaceSide.from_sample(name, None, "c=1", sample, 0.0)  # what the store's sample replays


def test_a_side_whose_sample_request_failed_ends_and_says_why() -> None:
    live = LiveRace("a", "b")
    live.feed(_started("ra", "a"))
    live.feed(_started("rb", "b"))
    live.feed(_event(SampleStreamed(run_id="ra", level=0, label="c=1", part=SAMPLE_A, ended=True)))
    summary = LevelSummary.model_construct()
    assert live.feed(_event(LevelFinished(run_id="rb", index=0, label="c=1", summary=summary)))
    assert live.ended and live.replay() is not None
    race = live.race()
    assert race.b.failed and "B has no sample" in race.verdict()


def test_a_live_races_sides_are_known_by_their_tags_whatever_their_names_and_order() -> None:
    live = LiveRace("same", "same")
    live.feed(_started("rb", "same", [side_tag("B")]))
    live.feed(_started("ra", "same", [side_tag("A")]))
    assert live.sides["A"].run_id == "ra" and live.sides["B"].run_id == "rb"
    live.feed(_event(RunFinished(run_id="rb", status="interrupted", reason="its node was lost", ended_wall_s=1.9e9)))
    assert live.sides["B"].failed and live.ended is False
    assert live.feed(_started("rb2", "same", [side_tag("B")]))  # it runs again elsewhere: the side is its own again
    assert live.sides["B"].run_id == "rb2" and not live.sides["B"].ended and not live.sides["B"].failed


def test_race_live_refuses_a_missing_profile_and_run_options_without_it_in_one_line() -> None:
    said = cli("race", "--live", "no-such-profile", "llamacpp-cpu-demo", "--no-store")
    assert said.code != 0 and "no-such-profile" in said.err and len(said.err.strip().splitlines()) == 1
    for flag in ("--cluster", "--no-store"):
        said = cli("race", "1", "2", flag)
        assert said.code != 0 and flag in said.err and "--live" in said.err and len(said.err.strip().splitlines()) == 1
