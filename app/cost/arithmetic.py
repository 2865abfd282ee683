"""The arithmetic of capacity and cost: what a million tokens cost on so many GPUs (or cores)
at a measured throughput, and how many replicas and nodes a traffic needs (the formulas are
in ``docs/capacity.md``). Plain numbers in, numbers out: nothing here reads a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.errors import UserError

TOKENS_PER_MILLION = 1_000_000
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86_400
HOURS_PER_DAY = 24
DAYS_PER_MONTH = 30
"""A month, for the monthly figures: 30 days, stated wherever the figure is shown."""


@dataclass(frozen=True)
class CostFigure:
    """A cost in USD, or None and why it could not be computed."""

    usd: float | None
    reason: str | None = None


def usd_per_million_tokens(units: float, usd_per_unit_hour: float, tok_per_s: float | None) -> CostFigure:
    """What a million tokens cost on ``units`` GPUs (or cores) producing ``tok_per_s`` together:
    ``units * usd_per_unit_hour / (tok_per_s * 3600) * 1e6``."""
    if tok_per_s is None or not math.isfinite(tok_per_s):
        return CostFigure(None, "no throughput was measured")
    if tok_per_s <= 0:
        return CostFigure(None, "the measured throughput is zero")
    if not units > 0 or not (math.isfinite(usd_per_unit_hour) and usd_per_unit_hour > 0):
        return CostFigure(None, "no GPUs or cores, or no price")
    return CostFigure(units * usd_per_unit_hour / (tok_per_s * SECONDS_PER_HOUR) * TOKENS_PER_MILLION)


def good_output_tok_per_s(goodput_rps: float | None, output_tok_per_s: float | None,
                          requests_per_s: float | None) -> float | None:
    """Output tokens per second of the requests that met the SLO: goodput (req/s) x the mean
    output tokens of a completed request (the level records no goodput token rate, so good
    requests are taken to be as long as the average completed one)."""
    if goodput_rps is None or output_tok_per_s is None or not requests_per_s or requests_per_s <= 0:
        return None
    return goodput_rps * output_tok_per_s / requests_per_s


def _ceil(x: float) -> int:
    """Round up, ignoring float noise (50 users x 1.1 = 55.00000000000001 is 55 replicas, not 56)."""
    return math.ceil(round(x, 9))


def check_headroom(headroom: float) -> float:
    if not (math.isfinite(headroom) and 0 <= headroom <= 10):
        raise UserError(f"the headroom must be a fraction from 0 to 10 (0.3 = 30% spare), got {headroom:g}")
    return headroom


def replicas_for_users(users: int, users_per_replica: float, headroom: float) -> int:
    """``ceil(users * (1 + headroom) / users_per_replica)``."""
    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise UserError(f"the number of users must be a whole number of at least 1, got {users}")
    if not users_per_replica > 0:
        raise ValueError(f"users per replica must be positive, got {users_per_replica}")
    return _ceil(users * (1 + check_headroom(headroom)) / users_per_replica)


def replicas_for_tokens_per_day(tokens_per_day: float, output_tok_per_s_per_replica: float, headroom: float) -> int:
    """``ceil(tokens_per_day / 86400 * (1 + headroom) / output_tok_per_s_per_replica)``."""
    if not (math.isfinite(tokens_per_day) and tokens_per_day > 0):
        raise UserError(f"the output tokens per day must be a number above 0, got {tokens_per_day:g}")
    if not output_tok_per_s_per_replica > 0:
        raise ValueError(f"output tok/s per replica must be positive, got {output_tok_per_s_per_replica}")
    return _ceil(tokens_per_day / SECONDS_PER_DAY * (1 + check_headroom(headroom)) / output_tok_per_s_per_replica)


def nodes_for(gpus: int, gpus_per_node: int | None) -> int | None:
    """``ceil(gpus / gpus_per_node)``; None when the GPUs per node are not known."""
    return _ceil(gpus / gpus_per_node) if gpus_per_node and gpus_per_node > 0 else None


@dataclass(frozen=True)
class RunningCost:
    """What ``units`` GPUs (or cores) cost to keep running."""

    unit_hours_per_day: float
    usd_per_day: float
    usd_per_month: float
    """30 days (``DAYS_PER_MONTH``)."""


def running_cost(units: float, usd_per_unit_hour: float) -> RunningCost:
    hours = units * HOURS_PER_DAY
    per_day = hours * usd_per_unit_hour
    return RunningCost(hours, per_day, per_day * DAYS_PER_MONTH)
