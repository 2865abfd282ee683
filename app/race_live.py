"""Two configurations run at once, each in a slot of its own (its own engine here, or a placement on
a Ray cluster), through the campaign machinery's steps side by side (``app.campaign``): what a live
race (``app.race.LiveRace``) follows. ``tunebench race --live A B`` and the tests call it; the
caller's ``follow`` gets each slot's bus as it opens, so a face sees both trials' events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.bus import Bus
from app.campaign import Campaign, CampaignResult, Step
from app.config import RunConfig
from app.executor import Fleet, Recorder, RunnerLike
from app.race import side_tag
from app.runner import Runner

SIDES = 2


@dataclass
class LiveRaceResult:
    """The two runs' outcome: the campaign's, and each side's stored run id (None: not stored)."""

    campaign: CampaignResult
    stored_ids: tuple[int | None, int | None]

    @property
    def completed(self) -> bool:
        return self.campaign.status == "completed" and all(s.status == "completed" for s in self.campaign.steps)

    def reasons(self) -> list[str]:
        return [f"{s.step.name}: {s.reason}" for s in self.campaign.steps if s.status != "completed" and s.reason]


def run_live_race(config_a: RunConfig, config_b: RunConfig, follow: Callable[[Bus], None],
                  cancel: threading.Event | None = None, *, recorder: Recorder | None = None,
                  fleet: Fleet | None = None, telemetry: bool = True,
                  runner_factory: Callable[..., RunnerLike] = Runner, **campaign: Any) -> LiveRaceResult:
    """Runs A and B at once, each on an engine of its own (``fleet``: each a trial on the cluster),
    recorded by ``recorder``'s store; blocks until both ended. Each run is tagged with its side
    (``app.race.side_tag``: a :class:`~app.race.LiveRace` knows it by that). A failing side does not
    stop the other: each is its own race."""
    steps = [Step(config.name, config.model_copy(update={"tags": [*config.tags, side_tag(key)]}))
             for key, config in (("A", config_a), ("B", config_b))]
    outcome = Campaign(steps, Bus(), recorder=recorder, fleet=fleet, telemetry=telemetry, runner_factory=runner_factory,
                       stop_on_failure=False, on_slot_bus=follow, **campaign).run(cancel, max_parallel=SIDES)
    by_index = {s.index: s for s in outcome.steps}
    ids = tuple(by_index[k].stored_ids[0] if k in by_index and by_index[k].stored_ids else None for k in range(SIDES))
    return LiveRaceResult(outcome, (ids[0], ids[1]))
