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
from dataclasses import dataclass
from typing import Literal, Protocol

from app.errors import UserError
from app.ladder.state import LadderState
from db.records import LevelInfo, RunDetail

FPS = 20
"""Frames per second of an exported replay: GIF delays are hundredths of a second, so a frame
lasts a whole number of them (5 at 20 fps); token gaps shorter than a frame share one."""
TIE_MS = 1.0
"""Finishes closer than this are a tie (the stored times are kept to a microsecond)."""

Winner = Literal["A", "B", "tie"]


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
    run_id: int
    level_label: str
    measured_wall_s: float
    prompt: str
    pieces: tuple[str, ...]
    t_ms: tuple[float, ...]
    tokens: tuple[int, ...]

    @classmethod
    def of(cls, run: RunDetail, level: LevelInfo) -> RaceSide:
        sample = level.sample or {}
        t_ms = tuple(float(t) for t in sample.get("t_ms") or ())
        if not t_ms:
            raise no_sample(run)
        return cls(name=run.name, run_id=run.id, level_label=level.label,
                   measured_wall_s=float(sample.get("start_wall_s") or run.started_at),
                   prompt=str(sample.get("prompt") or ""), pieces=tuple(str(p) for p in sample.get("text") or ()),
                   t_ms=t_ms, tokens=tuple(int(n) for n in sample.get("tokens") or ()))

    @property
    def finish_ms(self) -> float:
        return self.t_ms[-1]

    @property
    def first_ms(self) -> float:
        """When the first token arrived (the stored TTFT)."""
        return next((t for t, n in zip(self.t_ms, self.tokens, strict=True) if n > 0), self.t_ms[0])

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)

    def arrived(self, t_ms: float) -> int:
        """How many pieces have arrived by ``t_ms`` of the replay."""
        return bisect.bisect_right(self.t_ms, t_ms)

    def state_at(self, t_ms: float) -> SideState:
        count = self.arrived(t_ms)
        tokens = sum(self.tokens[:count])
        finished = count == len(self.t_ms)
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

    @property
    def duration_ms(self) -> float:
        return max(self.a.finish_ms, self.b.finish_ms)

    @property
    def winner(self) -> Winner:
        gap = self.a.finish_ms - self.b.finish_ms
        return "tie" if abs(gap) < TIE_MS else "A" if gap < 0 else "B"

    def verdict(self) -> str:
        """The finish line's words."""
        if self.winner == "tie":
            return f"Tie: both finished in {self.a.finish_ms / 1e3:.2f} s"
        won, lost = (self.a, self.b) if self.winner == "A" else (self.b, self.a)
        return (f"{self.winner} finished first, {(lost.finish_ms - won.finish_ms) / 1e3:.2f} s ahead "
                f"({lost.finish_ms / won.finish_ms:.2f}x faster)")

    def title(self) -> str:
        """What the replay says it is: measured runs, with their dates."""
        return (f"Replay of measured runs, at their recorded pace: A measured {self.a.measured_text}, "
                f"B measured {self.b.measured_text}")

    def schedule(self) -> list[tuple[float, Literal["A", "B"], int]]:
        """Every piece of both sides in replay order: (its stored time in ms, side, piece index)."""
        items: list[tuple[float, Literal["A", "B"], int]] = [(t, "A", i) for i, t in enumerate(self.a.t_ms)]
        items += [(t, "B", i) for i, t in enumerate(self.b.t_ms)]
        return sorted(items)


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

