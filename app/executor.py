"""The one executor of trials. A campaign kind (repeats, the ladder, the tuner) only proposes
trials and hears their outcomes (``ask`` / ``tell``, as Ray Tune's searchers do); :class:`Executor`
owns everything else: the slots a trial runs in (a bus, engines or a placement on a cluster, a
recorder), the threads of trials side by side, cancel, closing and the retry of a run whose node
was lost. So a change to any of them is made here, once. The model is in docs/architecture.md
("Campaigns").
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from app.bus import Bus
from app.config import RunConfig
from app.events import LogLine
from app.runner import RunResult
from engine_adapters.launcher import EngineProcess

TrialT = TypeVar("TrialT")
OutcomeT = TypeVar("OutcomeT")
OutcomeT_contra = TypeVar("OutcomeT_contra", contravariant=True)


class EngineSource(Protocol):
    """Hands out a ready engine for a configuration (reusing one when engine flags are equal);
    None where the run launches its own engines (a P/D group)."""

    def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> EngineProcess | None: ...


class RunnerLike(Protocol):
    """What a slot needs of ``app.runner.Runner`` (tests pass a stand-in)."""

    def run(self, cancel: threading.Event | None = None) -> RunResult: ...


class RemoteSlot(Protocol):
    """A place on a cluster where one trial at a time runs (``app.fleet``): its runs run there, and
    their events come back to the slot's bus."""

    def runner(self, config: RunConfig, bus: Bus, *, telemetry: bool) -> RunnerLike: ...

    def requeue(self, run: RunResult) -> bool:
        """Whether an interrupted run runs again (its node was lost: once, elsewhere)."""
        ...

    def close(self) -> None: ...


class Fleet(Protocol):
    """Hands out slots on a cluster; trials given one launch nothing on this machine."""

    def new_slot(self) -> RemoteSlot: ...


class Recorder(Protocol):
    """What a slot needs of ``app.recording.RunRecorder``."""

    recorded: list[int]
    store: Any

    def flush(self, timeout_s: float = 10.0) -> None: ...


class Searcher(Protocol[TrialT, OutcomeT_contra]):
    """What a campaign kind gives the executor: ``ask`` the next trial (None: none now; the
    executor asks again after each outcome, and ends when none is asked for and none runs) and
    ``tell`` its outcome. Both are called on the executor's caller's thread, one at a time."""

    def ask(self) -> TrialT | None: ...

    def tell(self, trial: TrialT, outcome: OutcomeT_contra) -> None: ...


@dataclass
class Places:
    """Where a campaign's trials run and how: the owner's bus, recorder and engines (a slot uses
    them when trials run one at a time), and how a slot of its own is made when they run side by
    side (``new_engines`` here, a placement of ``fleet`` on a cluster, or the ``endpoint``)."""

    bus: Bus
    recorder: Recorder | None = None
    engines: EngineSource | None = None
    new_engines: Callable[[], EngineSource] | None = None
    endpoint: str | None = None
    api_key: str | None = None
    fleet: Fleet | None = None
    telemetry: bool = True
    runner_factory: Callable[..., RunnerLike] | None = None
    on_slot_bus: Callable[[Bus], None] | None = None
    """Called with each slot's own bus as it opens, so a face can follow it."""
    launches: int = 0
    """Engines started by the slots of their own that closed."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def shared(self) -> Slot:
        """A slot on the owner's bus, recorder and engines (on a cluster: a placement of its own)."""
        remote = self.fleet.new_slot() if self.fleet is not None and self.endpoint is None else None
        return Slot(self, self.bus, None if remote is not None else self.engines, self.recorder, remote=remote)

    def open(self) -> Slot:
        """A slot of its own: a bus, engines from ``new_engines`` (or a placement of the fleet) and a
        recorder into the owner's store."""
        bus = Bus()
        if self.on_slot_bus is not None:
            self.on_slot_bus(bus)
        recorder: Recorder | None = None
        if self.recorder is not None:
            from app.recording import RunRecorder

            recorder = RunRecorder(bus, self.recorder.store)
        if self.endpoint is not None:
            return Slot(self, bus, None, recorder, own=True)
        if self.fleet is not None:
            return Slot(self, bus, None, recorder, remote=self.fleet.new_slot(), own=True)
        assert self.new_engines is not None, "steps side by side on this machine need new_engines"
        return Slot(self, bus, self.new_engines(), recorder, own=True)


@dataclass
class Ran:
    """One run as a slot ran it: each attempt (a run whose node was lost runs once more,
    elsewhere), the ids they were stored under, and whether the run got the engine the slot's
    previous run used (None: no engine of ours)."""

    runs: list[RunResult] = field(default_factory=list)
    stored_ids: list[int] = field(default_factory=list)
    engine_reused: bool | None = None


@dataclass
class Slot:
    """Where one trial at a time runs: its bus, engines (or a placement on a cluster) and recorder."""

    places: Places
    bus: Bus
    engines: EngineSource | None
    recorder: Recorder | None
    remote: RemoteSlot | None = None
    own: bool = False
    """Its bus, engines and recorder are its own (closed with it), not the owner's."""
    last_engine: EngineProcess | None = None

    def run(self, config: RunConfig, cancel: threading.Event) -> Ran:
        """One run of ``config`` here, recorded. An engine that cannot start raises
        ``EngineFailed`` or ``UserError``."""
        places, ran = self.places, Ran()
        while True:
            if self.remote is not None:
                runner = self.remote.runner(config, self.bus, telemetry=places.telemetry)
            else:
                engine = None
                if places.endpoint is None and self.engines is not None:
                    try:
                        engine = self.engines.engine_for(config, self.bus, cancel)
                    except BaseException:
                        self.last_engine = None
                        raise
                    ran.engine_reused = engine is not None and engine is self.last_engine
                    self.last_engine = engine
                assert places.runner_factory is not None
                runner = places.runner_factory(config, self.bus, endpoint=places.endpoint, api_key=places.api_key,
                                               engine=engine, telemetry=places.telemetry)
            run = self._recorded(runner, cancel, ran)
            if not (self.remote is not None and run.status == "interrupted" and not cancel.is_set()
                    and len(ran.runs) == 1 and self.remote.requeue(run)):
                return ran
            self.bus.emit(LogLine.note(f"{run.reason}: '{config.name}' runs again elsewhere"))

    def _recorded(self, runner: RunnerLike, cancel: threading.Event, ran: Ran) -> RunResult:
        """One run, with the ids it was stored under, into ``ran``; a run whose data could not all
        be stored is not "completed"."""
        recorder = self.recorder
        known = len(recorder.recorded) if recorder is not None else 0
        run = runner.run(cancel)
        ran.runs.append(run)
        if recorder is not None:
            recorder.flush()
            ran.stored_ids.extend(recorder.recorded[known:])
            check = getattr(recorder, "check_stored", None)
            if check is not None:
                check(run)
        return run

    def close(self) -> None:
        """Its placement released; a slot of its own also closes its engines and recorder (whose
        errors join the owner's, and whose engine launches are counted)."""
        if self.remote is not None:
            self.remote.close()
        if not self.own:
            return
        for part in (self.engines, self.recorder):
            close = getattr(part, "close", None)
            if close is not None:
                close()
        places = self.places
        errors = getattr(places.recorder, "errors", None)
        if isinstance(errors, list) and self.recorder is not None:
            errors.extend(getattr(self.recorder, "errors", []))
        launches = getattr(self.engines, "launches", 0)
        with places._lock:
            places.launches += launches if isinstance(launches, int) else 0


class Executor:
    """Runs the trials a :class:`Searcher` proposes, up to ``max_parallel`` at once, each in a
    slot: one at a time, on the caller's thread in one shared slot (the owner's engines, bus and
    recorder); side by side, each on a thread of its own in a slot of its own. ``fresh_slots``:
    each trial gets a new slot (a tune's configuration: its own engines and bus), else a slot is
    kept for the next trial. An error in a trial stops the asking, and is raised once the trials
    under way have ended; cancel (``run``'s event) stops the asking too, and each trial hears it."""

    def __init__(self, places: Places, *, max_parallel: int = 1, fresh_slots: bool = False,
                 slot: Slot | None = None) -> None:
        self.places = places
        self.max_parallel = max_parallel
        self.fresh_slots = fresh_slots
        self.slot = slot
        """One at a time in this slot, the caller's (kept open: the caller closes it)."""

    def run(self, searcher: Searcher[TrialT, OutcomeT], work: Callable[[TrialT, Slot, threading.Event], OutcomeT],
            cancel: threading.Event) -> None:
        """``work(trial, slot, cancel)`` for each trial ``searcher`` asks for, until it asks for
        none and none runs; each outcome is told to ``searcher`` here, on the caller's thread."""
        ended: queue.Queue[tuple[TrialT, Slot, OutcomeT | None, BaseException | None]] = queue.Queue()
        kept: list[Slot] = [self.slot] if self.slot is not None else []
        running = 0
        error: BaseException | None = None

        def attempt(trial: TrialT, slot: Slot) -> None:
            try:
                ended.put((trial, slot, work(trial, slot, cancel), None))
            except BaseException as exc:
                ended.put((trial, slot, None, exc))

        try:
            while True:
                while error is None and running < self.max_parallel and not cancel.is_set():
                    try:
                        trial = searcher.ask()
                    except BaseException as exc:
                        error = exc
                        break
                    if trial is None:
                        break
                    slot = kept.pop() if kept else self._slot()
                    running += 1
                    if self.max_parallel == 1:
                        attempt(trial, slot)
                    else:
                        threading.Thread(target=attempt, args=(trial, slot), name="trial", daemon=True).start()
                if running == 0:
                    break
                trial, slot, outcome, failure = ended.get()
                running -= 1
                if self.fresh_slots and slot is not self.slot:
                    slot.close()
                else:
                    kept.append(slot)
                if failure is not None:
                    error = error or failure
                    continue
                try:
                    searcher.tell(trial, outcome)  # type: ignore[arg-type]
                except BaseException as exc:
                    error = error or exc
        finally:
            for slot in kept:
                if slot is not self.slot:
                    slot.close()
        if error is not None:
            raise error

    def _slot(self) -> Slot:
        return self.places.shared() if self.max_parallel == 1 else self.places.open()
