"""The race: two measured runs replayed side by side at the pace they measured, one real request
each (the level's sample the store keeps: ``levels.sample``, ``app.load.client.stream_sample``).

Headless and computed: :class:`Race` says what each side shows at any moment of the replay (text
so far, TTFT, tok/s, finished or not), and :func:`frame_times_ms` when each frame of an animation
is taken. The GUI's race view and ``tunebench race --export`` paint the same states
(``app.gui.race_view``). Every piece of text appears at its stored arrival time; nothing is
synthesised: a run stored without a sample cannot race, and says so.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from app.errors import UserError
from app.events import Event, LevelFinished, RunFinished, RunStarted, SampleStreamed
from app.ladder.state import LadderState
from app.load.client import merged_pieces
from db.records import LevelInfo, RunDetail

FPS = 20
"""Frames per second of an exported replay: GIF delays are hundredths of a second, so a frame
lasts a whole number of them (5 at 20 fps); token gaps shorter than a frame share one."""
TIE_MS = 1.0
"""Finishes closer than this are a tie (the stored times are kept to a microsecond)."""

Winner = Literal["A", "B", "tie"]
SIDE_TAG = "race:"
"""A live race's run is tagged with its side (``race:A``): the race knows it by the tag, whatever
the runs' names and whichever starts first."""


def side_tag(key: str) -> str:
    return SIDE_TAG + key


class RaceUnavailable(UserError):
    """A run cannot race: it was stored without a sample request."""


def no_sample(run: RunDetail) -> RaceUnavailable:
    return RaceUnavailable(f"run {run.id} '{run.name}' has no sample request stored (recorded before tunebench "
                           "kept one per level): it cannot be replayed; record it again")


@dataclass(frozen=True)
class SideState:
    """One side at one moment of the replay."""

    text: str
    tokens: int
    ttft_ms: float | None
    """Shown once the first token arrived (it is the stored one then)."""
    tok_per_s: float | None
    """The decode pace so far: the tokens after the first over the time since it arrived."""
    finished: bool
    elapsed_ms: float
    """The replay clock, stopped at this side's finish."""


@dataclass(frozen=True)
class RaceSide:
    """One run's sample request: its pieces of text and their stored arrival times (ms since the
    request was sent)."""

    name: str
    run_id: int | None
    """The run's id in the store (None: a live run, not looked up)."""
    level_label: str
    measured_wall_s: float
    prompt: str
    pieces: tuple[str, ...]
    t_ms: tuple[float, ...]
    tokens: tuple[int, ...]
    ended: bool = True
    """Whether its request ended: a stored one did; a live one once its sample request ends (until
    then, its pieces are those that arrived so far)."""
    failed: str | None = None
    """A live side that ended without a sample: why."""

    @classmethod
    def of(cls, run: RunDetail, level: LevelInfo) -> RaceSide:
        sample = level.sample or {}
        if not sample.get("t_ms"):
            raise no_sample(run)
        return cls.from_sample(run.name, run.id, level.label, sample, run.started_at)

    @classmethod
    def from_sample(cls, name: str, run_id: int | None, level_label: str, sample: dict[str, Any],
                    started_wall_s: float, ended: bool = True) -> RaceSide:
        """A side from a sample as the store keeps it (``app.load.client.stream_sample``), or as
        much of it as has streamed so far (``ended`` False)."""
        return cls(name=name, run_id=run_id, level_label=level_label,
                   measured_wall_s=float(sample.get("start_wall_s") or started_wall_s),
                   prompt=str(sample.get("prompt") or ""), pieces=tuple(str(p) for p in sample.get("text") or ()),
                   t_ms=tuple(float(t) for t in sample.get("t_ms") or ()),
                   tokens=tuple(int(n) for n in sample.get("tokens") or ()), ended=ended)

    @property
    def finish_ms(self) -> float:
        """Its last piece's time: the finish once it ended (before, the latest arrival)."""
        return self.t_ms[-1] if self.t_ms else 0.0

    @property
    def first_ms(self) -> float:
        """When the first token arrived (the stored TTFT)."""
        return next((t for t, n in zip(self.t_ms, self.tokens, strict=True) if n > 0),
                    self.t_ms[0] if self.t_ms else 0.0)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)

    def arrived(self, t_ms: float) -> int:
        """How many pieces have arrived by ``t_ms`` of the replay."""
        return bisect.bisect_right(self.t_ms, t_ms)

    def state_at(self, t_ms: float) -> SideState:
        count = self.arrived(t_ms)
        tokens = sum(self.tokens[:count])
        finished = self.ended and count == len(self.t_ms)
        shown_ms = min(t_ms, self.finish_ms) if finished else t_ms
        first = self.first_ms
        ttft = first if tokens else None
        after_first = tokens - next((n for n in self.tokens if n > 0), 0)
        rate = after_first / ((shown_ms - first) / 1e3) if after_first > 0 and shown_ms > first else None
        return SideState("".join(self.pieces[:count]), tokens, ttft, rate, finished, shown_ms)

    @property
    def measured_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.measured_wall_s))


@dataclass(frozen=True)
class Race:
    a: RaceSide
    b: RaceSide
    live: bool = False
    """Two trials running now (:class:`LiveRace`), not a replay of stored runs."""

    @property
    def ended(self) -> bool:
        """Both sides' requests ended (a replay's always did): the verdict is known."""
        return self.a.ended and self.b.ended

    @property
    def duration_ms(self) -> float:
        return max(self.a.finish_ms, self.b.finish_ms)

    @property
    def winner(self) -> Winner:
        gap = self.a.finish_ms - self.b.finish_ms
        return "tie" if abs(gap) < TIE_MS else "A" if gap < 0 else "B"

    def verdict(self) -> str:
        """The finish line's words."""
        failed = [f"{key} has no sample: {side.failed}" for key, side in (("A", self.a), ("B", self.b)) if side.failed]
        if failed:
            return "; ".join(failed)
        if self.winner == "tie":
            return f"Tie: both finished in {self.a.finish_ms / 1e3:.2f} s"
        won, lost = (self.a, self.b) if self.winner == "A" else (self.b, self.a)
        return (f"{self.winner} finished first, {(lost.finish_ms - won.finish_ms) / 1e3:.2f} s ahead "
                f"({lost.finish_ms / won.finish_ms:.2f}x faster)")

    def title(self) -> str:
        """What the race says it is: two trials running now, or a replay of measured runs, with
        their dates."""
        if self.live:
            return (f"Live: two trials running now, one request each as it streams: A sent "
                    f"{_clock_text(self.a.measured_wall_s)}, B sent {_clock_text(self.b.measured_wall_s)}")
        return (f"Replay of measured runs, at their recorded pace: A measured {self.a.measured_text}, "
                f"B measured {self.b.measured_text}")

    def schedule(self) -> list[tuple[float, Literal["A", "B"], int]]:
        """Every piece of both sides in replay order: (its stored time in ms, side, piece index)."""
        items: list[tuple[float, Literal["A", "B"], int]] = [(t, "A", i) for i, t in enumerate(self.a.t_ms)]
        items += [(t, "B", i) for i, t in enumerate(self.b.t_ms)]
        return sorted(items)


def _clock_text(wall_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall_s)) if wall_s > 0 else "(waiting)"


def frame_times_ms(duration_ms: float, fps: int = FPS) -> list[float]:
    """When each frame of an animation of ``duration_ms`` is taken: ceil(duration x fps) frames
    of 1/fps each, frame k showing the replay at the end of its interval (the last one at the
    finish), so the animation lasts the replay to within one frame."""
    count = max(1, math.ceil(duration_ms / 1e3 * fps - 1e-9))
    step_ms = 1e3 / fps
    return [min(duration_ms, (k + 1) * step_ms) for k in range(count)]


def level_with_sample(run: RunDetail, label: str | None = None) -> LevelInfo:
    """The level to race: the one labelled ``label``, else the first with a sample."""
    levels = [lv for lv in run.levels if label is None or lv.label == label]
    if label is not None and not levels:
        raise UserError(f"run {run.id} '{run.name}' has no level '{label}' (its levels: "
                        f"{', '.join(lv.label for lv in run.levels) or 'none'})")
    found = next((lv for lv in levels if lv.sample and lv.sample.get("t_ms")), None)
    if found is None:
        raise no_sample(run)
    return found


def ladder_pair(state: LadderState) -> tuple[int, int] | None:
    """The runs a ladder races: its first step that ran (the baseline) and its final step; None
    before two steps ran."""
    ran = [row for row in state.rows if row.ran and row.run_ids]
    final = state.final_row
    if not ran or final is None or not final.run_ids or final.index == ran[0].index:
        return None
    return ran[0].run_ids[0], final.run_ids[0]


class RunSource(Protocol):
    def get_run(self, ref: int | str) -> RunDetail: ...


def race_of(store: RunSource, ref_a: int | str, ref_b: int | str, level: str | None = None) -> Race:
    """Two stored runs as a race (the same level label on both sides when ``level`` is given;
    otherwise each run's first level with a sample)."""
    sides = []
    for ref in (ref_a, ref_b):
        run = store.get_run(ref)
        sides.append(RaceSide.of(run, level_with_sample(run, level)))
    return Race(sides[0], sides[1])


@dataclass
class _Streaming:
    """One side of a live race, as its trial's events arrive."""

    name: str
    run_id: str | None = None
    """The runner's id of its run (``RunStarted``): None until its run started."""
    level: int | None = None
    """The level whose sample races: the first that streams one."""
    label: str = ""
    sample: dict[str, Any] = field(default_factory=lambda: {"text": [], "t_ms": [], "tokens": []})
    ended: bool = False
    failed: str | None = None
    """Why it has no sample (its request failed, its run ended first)."""
    anchor: tuple[float, float] | None = None
    """(local monotonic s, its latest piece's t_ms) when its last part arrived: its clock runs from there."""

    def side(self) -> RaceSide:
        return replace(RaceSide.from_sample(self.name, None, self.label, self.sample, 0.0, ended=self.ended),
                       failed=self.failed)


LIVE_RACE_KINDS = (RunStarted, SampleStreamed, LevelFinished, RunFinished)
"""The events a live race is fed (a bus subscription's ``kinds``)."""


class LiveRace:
    """Two trials running at once, raced on their sample requests as they stream (their
    ``SampleStreamed`` events): :meth:`feed` takes either trial's events (from any thread's drain,
    one at a time), :meth:`race` is the race so far (a :class:`Race` marked live whose sides hold
    the pieces that arrived, at their measured times: the same schedule, growing) and
    :meth:`clocks_ms` how far each side's clock has run. A side's finish line is its request's end,
    and from then it is the sample as the store keeps it: after both, :meth:`replay` is the race
    :func:`race_of` gives from the store."""

    def __init__(self, name_a: str, name_b: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.sides = {"A": _Streaming(name_a), "B": _Streaming(name_b)}
        self.clock = clock

    @property
    def ended(self) -> bool:
        return all(s.ended for s in self.sides.values())

    def tokens(self) -> dict[str, int]:
        """Tokens arrived so far, per side."""
        return {key: sum(s.sample["tokens"]) for key, s in self.sides.items()}

    def _of(self, run_id: str) -> _Streaming | None:
        return next((s for s in self.sides.values() if s.run_id == run_id), None)

    def feed(self, event: Event) -> bool:
        """One event of either trial; whether it changed the race."""
        p = event.payload
        if isinstance(p, RunStarted):
            tagged = [k for k in self.sides if side_tag(k) in p.tags]
            free = [k for k, s in self.sides.items() if s.run_id is None]
            # a run started again (its node was lost) takes its unfinished side over
            again = [k for k, s in self.sides.items() if not s.ended and s.name == p.name]
            key = next(iter(tagged), None) or next((k for k in free if self.sides[k].name == p.name),
                                                   free[0] if free else next(iter(again), None))
            if key is None or (self.sides[key].ended and not self.sides[key].failed):
                return False
            self.sides[key] = _Streaming(p.name or self.sides[key].name, run_id=p.run_id)
            return True
        run_id = getattr(p, "run_id", None)
        side = self._of(run_id) if isinstance(run_id, str) else None
        if side is None or side.ended:
            return False
        if isinstance(p, SampleStreamed):
            if side.level is not None and p.level != side.level:
                return False
            side.level, side.label = p.level, p.label
            if p.ended:  # the sample as stored replaces its pieces
                side.sample, side.ended = dict(p.part), True
            else:
                side.sample = merged_pieces([side.sample, p.part])
            t_ms = side.sample["t_ms"]
            side.anchor = (self.clock(), float(t_ms[-1]) if t_ms else 0.0)
            return True
        if isinstance(p, LevelFinished) and (side.level is None or p.index == side.level):
            side.failed, side.ended = f"no sample request of level {p.label} succeeded", True
            return True
        if isinstance(p, RunFinished):
            side.failed, side.ended = f"its run {p.status} first" + (f": {p.reason}" if p.reason else ""), True
            return True
        return False

    def race(self) -> Race:
        """The race so far, marked live."""
        return Race(self.sides["A"].side(), self.sides["B"].side(), live=True)

    def replay(self) -> Race | None:
        """Once both requests ended, the race as a replay of the measured runs; None before."""
        return replace(self.race(), live=False) if self.ended else None

    def clocks_ms(self) -> tuple[float, float]:
        """Each side's clock, in ms since its request was sent: stopped at its finish; running
        from its last arrival otherwise (0 before its request was sent)."""
        now = self.clock()

        def clock(s: _Streaming) -> float:
            latest = float(s.sample["t_ms"][-1]) if s.sample["t_ms"] else 0.0
            if s.ended or s.anchor is None:
                return latest
            mono, t_ms = s.anchor
            return max(latest, t_ms + (now - mono) * 1e3)

        return clock(self.sides["A"]), clock(self.sides["B"])
