"""The race view live and slowed, without an engine: fed two trials' events from another thread
through a bus subscription (drained by its QTimer), it says it is live, grows both sides and, once
both requests ended, replays the race as measured; a replay slowed x10 walks the same stored
times at a tenth of the pace, and at x1 every token still shows at its stored time."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from PySide6.QtCore import Qt

from app.bus import Bus
from app.config import RunConfig
from app.events import RunStarted, SampleStreamed
from app.gui.race_view import RaceView, render_frame
from app.race import LiveRace, Race, RaceSide

pytestmark = pytest.mark.gui

SAMPLE: dict[str, Any] = {"prompt": "Count", "start_wall_s": 1.9e9, "text": [f" {k}" for k in range(6)],
          "t_ms": [20.0, 30.0, 40.0, 50.0, 60.0, 70.0], "tokens": [1] * 6}


def _piece(k: int) -> dict[str, object]:
    part = {"text": SAMPLE["text"][k:k + 1], "t_ms": SAMPLE["t_ms"][k:k + 1], "tokens": [1]}
    return {"prompt": SAMPLE["prompt"], "start_wall_s": SAMPLE["start_wall_s"], **part} if k == 0 else part


def test_the_view_follows_two_trials_live_then_replays_them_as_measured(qtbot) -> None:  # type: ignore[no-untyped-def]
    bus = Bus()
    view = RaceView()
    qtbot.addWidget(view)
    view.resize(1024, 600)
    view.follow_live(LiveRace("one", "two"), bus.subscribe())
    assert view.is_live and "LIVE" in view.live_label.text() and not view.replay_button.isEnabled()
    half = threading.Event()

    def trials() -> None:  # the runs' threads publish; the view's timer drains
        for key in ("one", "two"):
            bus.emit(RunStarted(run_id=key, name=key, config=RunConfig(name=key), engine_kind="llamacpp", model="m",
                                started_wall_s=1.9e9))
        for k in range(3):
            for key in ("one", "two"):
                bus.emit(SampleStreamed(run_id=key, level=0, label="c=1", part=_piece(k)))
        half.set()

    threading.Thread(target=trials).start()
    qtbot.waitUntil(lambda: half.is_set() and view.race is not None and len(view.race.a.pieces) == 3
                    and len(view.race.b.pieces) == 3, timeout=10_000)
    race = view.race
    assert race is not None and race.live and not race.ended and race.title().startswith("Live:")
    render_frame(race, 0.0)  # a moment of a live race paints (no finish line yet)
    for key in ("one", "two"):
        bus.emit(SampleStreamed(run_id=key, level=0, label="c=1", part=SAMPLE, ended=True))
    qtbot.waitUntil(lambda: view.replay_button.isEnabled(), timeout=10_000)
    assert view.finished and view.race is not None and view.race.ended and view.race.winner == "tie"
    qtbot.mouseClick(view.replay_button, Qt.MouseButton.LeftButton)  # the race as measured, from its start
    assert not view.is_live and view.race is not None and not view.race.live
    assert view.race.a == RaceSide.from_sample("one", None, "c=1", SAMPLE, 0.0)
    qtbot.waitUntil(lambda: view.finished, timeout=10_000)


def test_the_presentations_race_is_live_while_a_campaign_runs_two_trials_side_by_side(make_window, qtbot) -> None:  # type: ignore[no-untyped-def]
    """As a ladder on a cluster does: the campaign's worker hands each slot's bus to the window
    (``follow_slot``); R in presentation mode then races its two trials live."""
    window = make_window()
    buses = {key: Bus() for key in ("one", "two")}
    release = threading.Event()

    def work() -> None:
        for key, bus in buses.items():
            window.follow_slot(bus)
            bus.emit(RunStarted(run_id=key, name=key, config=RunConfig(name=key), engine_kind="llamacpp", model="m",
                                started_wall_s=1.9e9))
            bus.emit(SampleStreamed(run_id=key, level=0, label="c=1", part=_piece(0)))
        release.wait(30)
        for key, bus in buses.items():
            bus.emit(SampleStreamed(run_id=key, level=0, label="c=1", part=SAMPLE, ended=True))

    window.start_campaign(work, lambda _result: window.run_ended(), lambda _message: window.run_ended(),
                          threading.Event(), "side-by-side", "Two trials side by side\u2026", window)
    qtbot.waitUntil(lambda: window.slots_followed == 2, timeout=10_000)
    window.race_compared()
    view = window.presentation.race
    assert window.presenting and window.presentation.page == "race" and view.is_live
    qtbot.waitUntil(lambda: view.race is not None and len(view.race.a.pieces) == len(view.race.b.pieces) == 1,
                    timeout=10_000)
    assert view.race is not None and {view.race.a.name, view.race.b.name} == {"one", "two"} and not view.finished
    release.set()
    qtbot.waitUntil(lambda: view.finished, timeout=10_000)
    qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    assert view.race is not None and view.race.ended and view.replay_button.isEnabled()
    assert window.slots_followed == 0 and window.side_by_side is not view._events  # the next campaign's are raced


def test_a_replay_slowed_x10_walks_the_stored_times_at_a_tenth_of_the_pace(qtbot) -> None:  # type: ignore[no-untyped-def]
    side = RaceSide.from_sample("one", 1, "c=1", SAMPLE, 0.0)
    race = Race(side, side)
    view = RaceView()
    qtbot.addWidget(view)
    view.set_race(race)
    labels = [view.speed_box.itemText(k) for k in range(view.speed_box.count())]
    assert "slowed \u00d710" in labels
    view.stop()
    view.speed_box.setCurrentIndex(labels.index("slowed \u00d710"))
    start = view._started
    assert view.replay_ms(start + 0.5) == pytest.approx(view._from_ms + 50.0)  # half a second shows 50 ms
    assert view.race is race and race.schedule() == Race(side, side).schedule()  # the stored times, unchanged
    view.hold(35.0)
    assert view.canvas.status is not None and "slowed \u00d710" in view.canvas.status
    view.speed_box.setCurrentIndex(0)  # measured pace: every piece at its stored time, within 1 ms
    assert view.canvas.status is None
    for t_ms, _key, i in race.schedule():
        assert side.arrived(t_ms - 1.0) <= i < side.arrived(t_ms)
