"""What a ladder produced: one :class:`StepRow` per planned step and the ladder around them.

The same object travels on the bus (``app.events.CampaignUpdated``: the CLI's live line, the
GUI's staircase), is stored as the ladder's campaign (``app.ladder.stored``) and feeds the HTML
report.
The factors are computed here once (:func:`compute_factors`), so every face shows the same.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.campaign_state import CampaignStateBase, CampaignStatus

StepStatus = Literal["pending", "skipped", "running", "completed", "failed", "cancelled", "interrupted"]
LadderStatus = CampaignStatus
Verification = Literal["verified", "accepted", "not active", "unknown", "none"]
KEPT_STEPS = frozenset({"completed", "skipped"})
"""Steps a resumed ladder keeps while they come before the first step left unfinished."""
TAG = "ladder:"
"""Runs of one ladder share the tag ``ladder:<id>``."""


class SettingChange(BaseModel):
    """One setting a step changed: ``load.concurrency`` 1 -> 16 (not named ``key``: secret-named
    keys are masked wherever a state is stored or written)."""

    setting: str
    label: str
    before: Any = None
    after: Any = None


class StepCheck(BaseModel):
    """A requested feature and whether the engine really ran it (``engine_adapters.base.FeatureCheck``),
    or the ladder's own check of a load change (the batch the engine ran)."""

    feature: str
    requested: str
    status: Literal["verified", "accepted", "not active", "unknown"]
    evidence: str = ""


class StepRow(BaseModel):
    """One step of the staircase: what changed, whether it ran, its figures and factors."""

    index: int
    name: str
    note: str = ""
    change: str = ""
    changes: list[SettingChange] = Field(default_factory=list)
    status: StepStatus = "pending"
    reason: str | None = None
    concurrency: int | None = None
    engine_restart: bool | None = None
    """Planned: the step changes the engine's flags, so the engine is relaunched."""
    engine_reused: bool | None = None
    """What happened: the step ran on the engine the previous step left running."""
    startup_s: float | None = None
    run_ids: list[int] = Field(default_factory=list)
    runs: int = 0
    output_tok_per_s: float | None = None
    output_ci_tok_per_s: float | None = None
    """Half width of the 95% confidence interval (a step repeated twice or more)."""
    total_tok_per_s: float | None = None
    ttft_ms: float | None = None
    ttft_label: str = "TTFT p50"
    itl_ms: float | None = None
    itl_label: str = "ITL p50"
    prefix_cache_hit_rate: float | None = None
    tokens_per_step: float | None = None
    factor_baseline: float | None = None
    factor_previous: float | None = None
    total_factor_baseline: float | None = None
    total_factor_previous: float | None = None
    gpus: int | None = None
    """GPUs the step's configuration uses (``Features.gpu_count``: both pools of a P/D step)."""
    per_gpu_factor_baseline: float | None = None
    """Output tok/s per GPU against the baseline's: a step that adds GPUs gains in total, maybe not per GPU."""
    loss: bool = False
    """Slower than the previous step that ran: shown as a loss, not hidden."""
    ceiling_tok_per_s: float | None = None
    ceiling_batch: float | None = None
    percent_of_limit: float | None = None
    """Output tok/s as a fraction of the decode ceiling (0..1.05); None when above it or unknown."""
    ceiling_note: str | None = None
    """Why there is no percentage (no plan, or a measurement above the physical ceiling: a bug)."""
    checks: list[StepCheck] = Field(default_factory=list)
    verification: Verification = "none"
    built_on: int | None = None
    """Steps side by side: the step (index) this one was built on, whether that one then ran or
    not (one after another, a step is built on the last that ran)."""
    reference_tok_per_s: float | None = None
    reference_label: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    """The step's full configuration (what its launch script is exported from)."""
    quality: dict[str, Any] | None = None
    """Its quality figures against the baseline step (``app.quality``, the outputs kept left out);
    the baseline's own are the control. None where the step ran no probe."""

    @property
    def ran(self) -> bool:
        return self.status == "completed" and self.output_tok_per_s is not None

    @property
    def output_tok_per_s_per_gpu(self) -> float | None:
        return None if self.output_tok_per_s is None or not self.gpus else self.output_tok_per_s / self.gpus


class LadderState(CampaignStateBase):
    """A whole ladder: its rows, where it ran, and how it ended."""

    campaign: Literal["ladder"] = "ladder"
    ladder_id: str
    name: str
    started_wall_s: float
    workload: str = ""
    """The one workload every step runs, in words (said on screen)."""
    model: str = ""
    engine_version: str | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)
    unfair: str | None = None
    """Why the steps are not a fair comparison (their runs ran on different hardware: a cluster's
    nodes), or None."""
    planned_for: str = ""
    """The hardware the ceilings are planned for."""
    reference: str | None = None
    """Where the reference figures come from (the seeds' table), when they apply here."""
    spec: dict[str, Any] = Field(default_factory=dict)
    """The ladder's steps as asked (``app.ladder.spec.LadderSpec``): what a resume rebuilds them from."""
    base_config: dict[str, Any] = Field(default_factory=dict)
    """The configuration the first step changes (masked): what a resume starts from."""
    rows: list[StepRow] = Field(default_factory=list)
    replaced_run_ids: list[int] = Field(default_factory=list)
    """Runs of steps a resume ran again: kept in the store, no longer the staircase's."""
    writer_pid: int | None = None
    writer_create_time: float | None = None

    @property
    def campaign_id(self) -> str:
        return self.ladder_id

    @property
    def completed_rows(self) -> list[StepRow]:
        return [r for r in self.rows if r.ran]

    @property
    def run_ids(self) -> list[int]:
        return [i for r in self.rows for i in r.run_ids]

    @property
    def final_row(self) -> StepRow | None:
        """The last step that ran (what "export the winner" exports)."""
        done = self.completed_rows
        return done[-1] if done else None


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or not (math.isfinite(value) and math.isfinite(base)) or base <= 0:
        return None
    return value / base


def compute_factors(rows: list[StepRow]) -> None:
    """Factors against the baseline (the first step that ran) and the previous step that ran, for
    output and total tok/s; a factor below 1 against the previous step is a loss. A step built on
    one that did not run (steps side by side) has no factor against a previous step: its change
    against the last step that ran is more than its own."""
    baseline: StepRow | None = None
    previous: StepRow | None = None
    for row in rows:
        row.factor_baseline = row.factor_previous = row.total_factor_baseline = row.total_factor_previous = None
        row.per_gpu_factor_baseline = None
        row.loss = False
        if not row.ran:
            continue
        if baseline is None:
            baseline = row
        row.factor_baseline = _ratio(row.output_tok_per_s, baseline.output_tok_per_s)
        row.total_factor_baseline = _ratio(row.total_tok_per_s, baseline.total_tok_per_s)
        row.per_gpu_factor_baseline = _ratio(row.output_tok_per_s_per_gpu, baseline.output_tok_per_s_per_gpu)
        if row.built_on is not None and not (0 <= row.built_on < len(rows) and rows[row.built_on].ran):
            previous = row
            continue
        if previous is not None:
            row.factor_previous = _ratio(row.output_tok_per_s, previous.output_tok_per_s)
            row.total_factor_previous = _ratio(row.total_tok_per_s, previous.total_tok_per_s)
            row.loss = row.factor_previous is not None and row.factor_previous < 1.0
        previous = row


def factor_text(factor: float | None) -> str:
    """``x3.10``; empty when unknown."""
    return "" if factor is None else f"\u00d7{factor:.2f}"


def limit_text(row: StepRow) -> str:
    """``23% of limit``, ``above the ceiling: a bug`` or ``-``."""
    if row.percent_of_limit is not None:
        return f"{100 * min(row.percent_of_limit, 1.0):.0f}% of limit" if row.percent_of_limit <= 1.0 \
            else "~100% of limit"
    if row.ceiling_note and row.ceiling_tok_per_s:
        return "above the ceiling: a bug"
    return "-"


def verification_of(checks: list[StepCheck]) -> Verification:
    """The step's verdict over its checks: the worst of them (not active < unknown < accepted < verified)."""
    if not checks:
        return "none"
    order: dict[str, int] = {"not active": 0, "unknown": 1, "accepted": 2, "verified": 3}
    worst = min(checks, key=lambda c: order[c.status])
    return worst.status
