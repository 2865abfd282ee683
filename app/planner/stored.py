"""A stored run against the planner's ceiling: each recorded level's "% of limit", computed from
what the store keeps (the run's configuration and hardware fingerprint) as the HTML report does,
so any old run can be measured against the physics too. ``app.analysis.findings`` is given this
function by the faces (the analysis layer needs nothing of the load generator that ``live``
imports)."""

from __future__ import annotations

from pydantic import ValidationError

from app.analysis.findings import stored_config
from app.load.metrics import LevelSummary
from app.planner.live import LimitFigures, limit_figures, plan_for_run
from db.records import RunDetail


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
