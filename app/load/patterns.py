"""Load patterns: the levels a run goes through and, for open loops, when each request is due.

Arrivals are seeded, so a rerun schedules the same requests at the same offsets. Poisson is
gamma with shape 1; gamma's shape is the burstiness (below 1 burstier, above 1 more regular),
with scale 1 / (rate x burstiness) so the mean rate stays the asked one, as in vllm bench serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, assert_never

import numpy as np

from app.events import LevelStarted
from app.load.delivery import LevelTarget
from app.workload import Arrival, LoadConfig, LoadPattern, arrival_of


@dataclass(frozen=True)
class LevelPlan:
    """One load level: closed (``concurrency``) or open (arrivals at ``rate_rps``)."""

    index: int
    label: str
    mode: Literal["closed", "open"]
    concurrency: int | None = None  # closed: in flight; open: optional cap
    rate_rps: float | None = None
    arrival: Arrival = LoadPattern.POISSON
    burstiness: float = 1.0
    ramp_start_rps: float | None = None
    ramp_up_s: float = 0.0  # closed: the workers start evenly over this long
    speedup: float = 1.0  # trace: the trace's arrivals this many times faster

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrival", arrival_of(self.arrival))  # its name is taken too

    @property
    def target(self) -> LevelTarget:
        """What the level must deliver, to prove it did (``app.load.delivery``)."""
        return LevelTarget(self.mode, self.concurrency, self.rate_rps, self.arrival, self.ramp_up_s)

    def started_event(self, run_id: str, started_wall_s: float, num_requests: int | None) -> LevelStarted:
        """The ``level_started`` event of this level (arrival and burstiness only for an open loop)."""
        return LevelStarted(run_id=run_id, index=self.index, label=self.label, mode=self.mode,
                            concurrency=self.concurrency, rate_rps=self.rate_rps,
                            arrival=self.arrival if self.mode == "open" else None,
                            burstiness=self.burstiness if self.mode == "open" else None,
                            started_wall_s=started_wall_s, num_requests=num_requests)


def _sweep_levels(load: LoadConfig) -> list[LevelPlan]:
    if load.concurrency_sweep:
        return [LevelPlan(i, f"concurrency {int(value)}", "closed", concurrency=int(value), ramp_up_s=load.ramp_up_s)
                for i, value in enumerate(load.levels)]
    arrival: Arrival = LoadPattern.POISSON if load.burstiness == 1.0 else LoadPattern.GAMMA
    return [LevelPlan(i, f"{value:g} req/s", "open", concurrency=load.max_concurrency, rate_rps=value,
                      arrival=arrival, burstiness=load.burstiness)
            for i, value in enumerate(load.levels)]


def plan_levels(load: LoadConfig) -> list[LevelPlan]:
    """The levels ``load`` goes through: each pattern's own (a new pattern needs a case here)."""
    pattern = load.pattern
    match pattern:
        case LoadPattern.CLOSED:
            return [LevelPlan(0, f"concurrency {load.concurrency}", "closed", concurrency=load.concurrency,
                              ramp_up_s=load.ramp_up_s)]
        case LoadPattern.SWEEP:
            return _sweep_levels(load)
        case LoadPattern.TRACE:
            return [LevelPlan(0, f"trace x{load.speedup:g}", "open", concurrency=load.max_concurrency,
                              arrival=pattern, speedup=load.speedup)]
        case LoadPattern.RAMP:
            assert load.rate_rps is not None
            return [LevelPlan(0, f"ramp {load.ramp_start_rps:g}->{load.rate_rps:g} req/s", "open",
                              concurrency=load.max_concurrency, rate_rps=load.rate_rps, arrival=pattern,
                              ramp_start_rps=load.ramp_start_rps)]
        case LoadPattern.CONSTANT | LoadPattern.POISSON | LoadPattern.GAMMA:
            assert load.rate_rps is not None
            arrival: Arrival = pattern
            if arrival == LoadPattern.POISSON and load.burstiness != 1.0:
                arrival = LoadPattern.GAMMA
            return [LevelPlan(0, f"{load.rate_rps:g} req/s {arrival}", "open", concurrency=load.max_concurrency,
                              rate_rps=load.rate_rps, arrival=arrival, burstiness=load.burstiness)]
        case _:
            assert_never(pattern)


def arrival_offsets_s(plan: LevelPlan, n: int, seed: int, trace_s: list[float] | None = None) -> np.ndarray:
    """Send times (seconds from the level start) of ``n`` requests; the first is at 0. A trace's
    are its own (``trace_s``, the dataset's arrivals), ``speedup`` times faster: at most its length."""
    arrival = plan.arrival
    if arrival == LoadPattern.TRACE:
        if trace_s is None:
            raise ValueError("a trace's arrivals need its dataset's arrival times")
        return np.asarray(trace_s[:max(n, 0)], dtype=np.float64) / plan.speedup
    assert plan.rate_rps is not None
    if n <= 0:
        return np.zeros(0)
    rng = np.random.default_rng([seed, plan.index, 2])
    match arrival:
        case LoadPattern.CONSTANT:
            gaps = np.full(n, 1.0 / plan.rate_rps)
        case LoadPattern.RAMP:
            start = plan.ramp_start_rps or plan.rate_rps
            rates = np.linspace(start, plan.rate_rps, n)
            gaps = rng.exponential(1.0 / rates)
        case LoadPattern.POISSON | LoadPattern.GAMMA:
            shape = 1.0 if arrival == LoadPattern.POISSON else plan.burstiness
            gaps = rng.gamma(shape, 1.0 / (plan.rate_rps * shape), size=n)
        case _:
            assert_never(arrival)
    gaps[0] = 0.0
    return np.cumsum(gaps)
