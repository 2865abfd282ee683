"""The one executor of trials without an engine: trials side by side really run at once, each in a
slot of its own that is closed at the end; ask and tell run on the caller's thread only; a tune's
kind of trial gets a fresh slot each time; an error in one trial stops the asking and is raised
once the others have ended; cancel stops the asking."""

from __future__ import annotations

import threading

import pytest

from app.bus import Bus
from app.executor import Executor, Places, Slot


class Engines:
    """An engine source that only counts how it is closed."""

    made: list[Engines] = []

    def __init__(self) -> None:
        self.closed = 0
        self.launches = 1
        Engines.made.append(self)

    def engine_for(self, config: object, bus: Bus, cancel: threading.Event) -> object:
        raise AssertionError("no engine is asked for here")

    def close(self) -> None:
        self.closed += 1


class Numbers:
    """A searcher of ``n`` numbered trials that records on which thread it was asked and told."""

    def __init__(self, n: int, cancel: threading.Event | None = None, cancel_after: int | None = None) -> None:
        self.left = list(range(n))
        self.threads: set[int] = set()
        self.told: dict[int, object] = {}
        self.cancel, self.cancel_after = cancel, cancel_after

    def ask(self) -> int | None:
        self.threads.add(threading.get_ident())
        return self.left.pop(0) if self.left else None

    def tell(self, trial: int, outcome: object) -> None:
        self.threads.add(threading.get_ident())
        self.told[trial] = outcome
        if self.cancel is not None and len(self.told) == self.cancel_after:
            self.cancel.set()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    Engines.made = []


def places(buses: list[Bus] | None = None) -> Places:
    return Places(Bus(), new_engines=Engines, on_slot_bus=(buses.append if buses is not None else None))


def test_trials_side_by_side_run_at_once_each_in_a_slot_of_its_own_closed_at_the_end() -> None:
    together = threading.Barrier(2, timeout=30)
    buses: list[Bus] = []
    ran_in: dict[int, Slot] = {}

    def work(trial: int, slot: Slot, cancel: threading.Event) -> str:
        if trial < 2:
            together.wait()  # the first two trials only finish if they run at the same time
        ran_in[trial] = slot
        return f"done {trial}"

    searcher = Numbers(5)
    Executor(places(buses), max_parallel=2).run(searcher, work, threading.Event())
    assert not together.broken
    assert searcher.told == {i: f"done {i}" for i in range(5)}
    assert searcher.threads == {threading.get_ident()}  # asked and told here, one at a time
    assert len(buses) == len(Engines.made) == 2  # two slots, kept between trials
    slots = {id(s): s for s in ran_in.values()}
    assert len(slots) == 2 and all(s.own for s in slots.values())
    assert [e.closed for e in Engines.made] == [1, 1]


def test_fresh_slots_give_each_trial_its_own_slot_closed_after_it() -> None:
    seen: list[Slot] = []

    def work(trial: int, slot: Slot, cancel: threading.Event) -> None:
        assert slot.engines is not None and slot.engines.closed == 0  # type: ignore[attr-defined]
        seen.append(slot)

    p = places()
    Executor(p, max_parallel=2, fresh_slots=True).run(Numbers(3), work, threading.Event())
    assert len({id(s) for s in seen}) == len(Engines.made) == 3
    assert [e.closed for e in Engines.made] == [1, 1, 1] and p.launches == 3  # launches join the owner's


def test_one_at_a_time_runs_on_the_callers_thread_in_the_owners_slot() -> None:
    owner = Engines()
    p = Places(Bus(), engines=owner, new_engines=Engines)
    threads: set[int] = set()

    def work(trial: int, slot: Slot, cancel: threading.Event) -> None:
        threads.add(threading.get_ident())
        assert slot.engines is owner and slot.bus is p.bus and not slot.own

    Executor(p).run(Numbers(3), work, threading.Event())
    assert threads == {threading.get_ident()}
    assert owner.closed == 0 and Engines.made == [owner]  # the owner's engines are the owner's to close


def test_an_error_stops_the_asking_and_is_raised_once_the_others_ended() -> None:
    failing: list[threading.Thread] = []
    first_arrived = threading.Event()
    other_ended = threading.Event()

    def work(trial: int, slot: Slot, cancel: threading.Event) -> None:
        if trial == 0:
            failing.append(threading.current_thread())
            first_arrived.set()
            raise RuntimeError("trial 0 failed")
        assert first_arrived.wait(30)
        failing[0].join(30)  # trial 0's error reached the executor before this trial ends
        other_ended.set()

    searcher = Numbers(10)
    with pytest.raises(RuntimeError, match="trial 0 failed"):
        Executor(places(), max_parallel=2).run(searcher, work, threading.Event())
    assert other_ended.is_set()  # raised only after the trial under way had ended
    assert len(searcher.left) == 8  # no trial was asked for after the error
    assert all(e.closed == 1 for e in Engines.made)


def test_cancel_stops_the_asking() -> None:
    cancel = threading.Event()
    searcher = Numbers(10, cancel=cancel, cancel_after=2)
    Executor(places()).run(searcher, lambda trial, slot, cancel: trial, cancel)
    assert sorted(searcher.told) == [0, 1] and len(searcher.left) == 8
