"""A stored run against the planner's ceiling: each recorded level's "% of limit", computed from
what the store keeps (the run's configuration and hardware fingerprint) as the HTML report does,
so any old run can be measured against the physics too. ``app.analysis.findings`` is given this
function by the faces (the analysis layer needs nothing of the load generator that ``live``
imports). Across the store's runs, how close each kind of hardware came to the ceiling says how
good the planner is there (``tunebench explain --planner``): derived from the stored runs, as
each run's share is, so every old run counts and nothing is kept twice."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from app.analysis.findings import stored_config
from app.load.metrics import LevelSummary
from app.planner.live import LimitFigures, limit_figures, plan_for_run
from db.records import RunDetail, RunInfo


def level_limits(run: RunDetail) -> tuple[dict[int, LimitFigures], str | None]:
    """(level index -> its output rate against the decode ceiling, why there is none)."""
    if run.imported or not run.config:
        return {}, "no ceiling: an imported run has no tunebench configuration to plan"
    config = stored_config(run)
    if config is None:
        return {}, "no ceiling: the run's configuration is from another tunebench version"
    plan, why = plan_for_run(config, run.hardware)
    if plan is None:
        return {}, why
    out: dict[int, LimitFigures] = {}
    for level in run.levels:
        if not level.summary:
            continue
        try:
            summary = LevelSummary.model_validate(level.summary)
        except ValidationError:
            continue  # a level summary of an older tunebench
        if (figures := limit_figures(plan, summary)) is not None:
            out[level.idx] = figures
    return out, None


@dataclass(frozen=True)
class CeilingCheck:
    """One stored level's measured output rate against the planner's ceiling: how far the run
    is from the physics the planner predicts, on the hardware it ran on."""

    run_id: int
    name: str
    hardware: str
    level: int
    figures: LimitFigures

    @property
    def error_pct(self) -> float | None:
        """The planner's prediction error on this level: (ceiling - measured) / measured, in %
        (+100%: it predicted twice what was measured); None above the ceiling (a bug, not an error)."""
        return prediction_error_pct(self.figures)


def prediction_error_pct(figures: LimitFigures) -> float | None:
    """(predicted - measured) / measured in %, the prediction being the decode ceiling."""
    if figures.fraction is None or figures.measured_tok_per_s <= 0:
        return None
    return 100.0 * (figures.ceiling_tok_per_s - figures.measured_tok_per_s) / figures.measured_tok_per_s


def hardware_label(run: RunInfo) -> str:
    """The hardware a run's ceiling was planned for: its GPU model, or the host's CPU."""
    return run.gpu_model or f"CPU ({run.host or 'unknown host'})"


def ceiling_checks(runs: Iterable[RunDetail]) -> list[CeilingCheck]:
    """Every level of ``runs`` that the planner could plan, against its ceiling."""
    out: list[CeilingCheck] = []
    for run in runs:
        limits, _why = level_limits(run)
        out.extend(CeilingCheck(run.id, run.name, hardware_label(run), idx, figures)
                   for idx, figures in sorted(limits.items()))
    return out


@dataclass(frozen=True)
class PlannerAccuracy:
    """How close the runs on one kind of hardware came to the planner's ceiling: the share of it
    they measured (the planner's error is the rest), over the levels it could check."""

    hardware: str
    levels: int
    median_share: float | None
    lowest_share: float | None
    highest_share: float | None
    above_ceiling: int
    """Levels measured above the ceiling: a bug in the plan (its bandwidth or bytes) or the measurement."""
    median_error_pct: float | None = None
    """The planner's median prediction error over those levels (:attr:`CeilingCheck.error_pct`)."""


def planner_accuracy(checks: Iterable[CeilingCheck]) -> list[PlannerAccuracy]:
    """Per hardware, the measured shares of the ceiling (in the order the hardware first appears)."""
    by_hardware: dict[str, list[CeilingCheck]] = {}
    for check in checks:
        by_hardware.setdefault(check.hardware, []).append(check)
    out = []
    for hardware, found in by_hardware.items():
        shares = sorted(min(c.figures.fraction, 1.0) for c in found if c.figures.fraction is not None)
        errors = [e for c in found if (e := c.error_pct) is not None]
        out.append(PlannerAccuracy(hardware, len(found), statistics.median(shares) if shares else None,
                                   shares[0] if shares else None, shares[-1] if shares else None,
                                   sum(c.figures.fraction is None for c in found),
                                   statistics.median(errors) if errors else None))
    return out
