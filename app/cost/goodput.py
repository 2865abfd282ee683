"""Good output re-counted request by request: which stored requests completed and met an SLO
(the runner's goodput rule), so a cost can be given under an SLO the run was not measured under.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.analysis.summary import RequestArrays
from app.slo import Slo

RECOUNTABLE = ("ttft_ms", "tpot_ms", "e2e_ms")
"""SLO metrics a stored request carries (queueing is kept only in the level's summary)."""


@dataclass(frozen=True)
class GoodCount:
    """A level's requests that met an SLO, counted one by one from the stored requests."""

    requests: int
    output_tokens: int
    output_tok_per_s: float


def _good_mask(requests: RequestArrays, bounds: list[Slo]) -> np.ndarray | None:
    """Which stored requests completed and met every bound, by the runner's goodput rule
    (``app.load.metrics.meets_slo``: TPOT = (E2E - TTFT) / (output tokens - 1), 0 for a one-token
    output); None when a bound is on a figure the stored requests lack (queueing)."""
    if any(metric not in RECOUNTABLE for metric, _op, _limit in bounds):
        return None
    out = requests.output_tokens.astype(float)
    ttft, e2e = requests.ttft_ms.astype(float), requests.e2e_ms.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), 0.0)
    values = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}
    good = requests.ok.astype(bool)
    for metric, op, limit in bounds:
        v = values[metric]
        with np.errstate(invalid="ignore"):
            good &= (v <= limit) if op == "<=" else (v < limit)  # NaN (no value) meets nothing
    return good


def recount_good(requests: RequestArrays, idx: int, bounds: list[Slo], duration_s: float | None) -> GoodCount | None:
    """The requests of level ``idx`` that completed and met every bound (``_good_mask``), and
    their output tokens per second of the level; None when a bound is on a figure the stored
    requests lack, or the level has no duration or no stored request."""
    mask = _good_mask(requests, bounds)
    if mask is None or not duration_s or duration_s <= 0:
        return None
    in_level = requests.level == idx
    if not in_level.any():
        return None
    good = mask & in_level
    tokens = int(np.nansum(requests.output_tokens.astype(float)[good]))
    return GoodCount(int(good.sum()), tokens, tokens / duration_s)


def good_tokens(requests: RequestArrays, bounds: list[Slo], level: int | None = None) -> tuple[float, float] | None:
    """Output tokens of the completed requests that met every bound, and of all completed ones
    (of one level, or of the whole run); None where a bound is on queueing (not stored per request)."""
    mask = _good_mask(requests, bounds)
    if mask is None:
        return None
    ok = requests.ok.astype(bool)
    if level is not None:
        ok &= requests.level == level
    out = requests.output_tokens.astype(float)
    return float(np.nansum(out[mask & ok])), float(np.nansum(out[ok]))


def no_share_reason(bounds: list[Slo]) -> str:
    """Why no good-output share could be counted under ``bounds``."""
    if any(metric not in RECOUNTABLE for metric, _op, _limit in bounds):
        return "queue_ms is not stored per request, so good output cannot be re-counted under this SLO"
    return "no completed request is stored"
