"""What a tune produced, as the store keeps it (``db.tune_store``), the bus carries it
(``app.events.CampaignUpdated``) and the CLI, the GUI and the report show it: the engine configurations (candidates), one trial per configuration and load, the
pick under the SLO with the constraint that bound it, and the Pareto front.

Axes of the trade-off (as ``vllm bench sweep plot_pareto`` and AIConfigurator draw it): output
tok/s per GPU (what the hardware yields) against tok/s per user (1000 / mean TPOT in ms: how fast
each user's text streams).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.campaign_state import CampaignStateBase, CampaignStatus

TrialStatus = Literal["pending", "running", "passed", "failed", "infeasible", "error", "skipped", "cancelled",
                      "imported"]
"""passed / failed: measured, met / missed the SLO; infeasible: the engine could not start or died
(with the diagnosis); error: the run failed otherwise; skipped: not run (the SLO already failed at
a lower load, or the budget ran out); cancelled: stopped (rerun on resume); imported: a point from
another tool."""
CandidateStatus = Literal["pending", "pruned", "searching", "done", "infeasible", "cut", "cancelled"]
TuneStatus = CampaignStatus
DONE_TRIALS = frozenset({"passed", "failed", "infeasible", "error"})
"""Trials a resumed tune keeps (the others run again)."""
MEASURED = "measured"


class Trial(BaseModel):
    index: int
    candidate: int
    knobs: dict[str, Any] = Field(default_factory=dict)
    load_kind: str = "concurrency"
    load_value: float | None = None
    status: TrialStatus = "pending"
    reason: str | None = None
    source: str = MEASURED
    label: str = ""
    run_id: int | None = None
    figures: dict[str, float] = Field(default_factory=dict)
    ratios: dict[str, float] = Field(default_factory=dict)
    """SLO metric -> value / limit (above 1: past the limit)."""
    tok_s_per_gpu: float | None = None
    tok_s_per_user: float | None = None
    engine_reused: bool | None = None
    startup_s: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def load_label(self) -> str:
        if self.load_value is None:
            return "-"
        return f"concurrency {self.load_value:g}" if self.load_kind == "concurrency" else f"{self.load_value:g} req/s"

    @property
    def measured(self) -> bool:
        return self.source == MEASURED

    def doc(self) -> dict[str, Any]:
        """The fields the store keeps in the trial's ``doc``."""
        return {"label": self.label, "ratios": self.ratios, "tok_s_per_gpu": self.tok_s_per_gpu,
                "tok_s_per_user": self.tok_s_per_user, "engine_reused": self.engine_reused,
                "startup_s": self.startup_s}

    @classmethod
    def from_stored(cls, row: dict[str, Any]) -> Trial:
        doc = row.get("doc") or {}
        return cls(index=row["index"], candidate=row["candidate"], knobs=row.get("knobs") or {},
                   load_kind=row.get("load_kind") or "concurrency", load_value=row.get("load_value"),
                   status=row.get("status") or "pending", reason=row.get("reason"), source=row.get("source") or MEASURED,
                   run_id=row.get("run_id"), figures={k: float(v) for k, v in (row.get("figures") or {}).items()
                                                      if isinstance(v, int | float)},
                   started_at=row.get("started_at"), finished_at=row.get("finished_at"),
                   label=doc.get("label") or "", ratios=doc.get("ratios") or {}, tok_s_per_gpu=doc.get("tok_s_per_gpu"),
                   tok_s_per_user=doc.get("tok_s_per_user"), engine_reused=doc.get("engine_reused"),
                   startup_s=doc.get("startup_s"))


class Candidate(BaseModel):
    """One engine configuration and its goodput search."""

    index: int
    knobs: dict[str, Any] = Field(default_factory=dict)
    label: str = ""
    status: CandidateStatus = "pending"
    reason: str | None = None
    gpus: int = 1
    best_trial: int | None = None
    """The trial at the highest load that met the SLO."""
    binding: str | None = None
    """What stopped the search: the bound that failed at the next load, or the top of the range."""
    quality: dict[str, Any] | None = None
    """Its quality figures against the tune's reference configuration (``app.quality``, the outputs
    kept left out), measured once, with its first load."""
    quality_excluded: str | None = None
    """The quality bounds it missed: the pick never comes from it."""


class Confirmation(BaseModel):
    """The pick run again ``n`` times (repeats): mean and 95% CI per figure, and whether every
    rerun met the SLO."""

    n: int
    run_ids: list[int] = Field(default_factory=list)
    meets_slo: list[bool] = Field(default_factory=list)
    figures: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """figure -> ``Aggregate.to_dict()`` (mean, half_width, n, ...)."""
    reason: str | None = None


class Pick(BaseModel):
    candidate: int
    trial: int
    knobs: dict[str, Any] = Field(default_factory=dict)
    label: str = ""
    load_label: str = ""
    run_id: int | None = None
    tok_s_per_gpu: float | None = None
    tok_s_per_user: float | None = None
    binding: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    """The configuration the pick ran with (masked): what is exported."""
    confirmation: Confirmation | None = None


class TuneState(CampaignStateBase):
    """A whole tune: its space, candidates, trials and pick."""

    campaign: Literal["tune"] = "tune"
    tune_id: str
    slo: str = ""
    percentile: str = "p99"
    strategy: str = "grid"
    elapsed_s: float = 0.0
    """Wall time spent tuning, over every session of the tune (a resume adds to it)."""
    budget_candidates: int | None = None
    budget_s: float | None = None
    repeats: int = 0
    space: dict[str, Any] = Field(default_factory=dict)
    base_config: dict[str, Any] = Field(default_factory=dict)
    candidates: list[Candidate] = Field(default_factory=list)
    trials: list[Trial] = Field(default_factory=list)
    pick: Pick | None = None
    quality: dict[str, Any] = Field(default_factory=dict)
    """How quality weighed on the pick: ``bounds`` (the SLO's quality part), ``reference`` (the
    candidate measured against itself), ``excluded`` (labels of the candidates its bounds
    excluded), ``blind`` (why the pick is made on speed alone, where precision changes), and
    ``pick_without_quality`` (the label speed alone would have picked, where it differs)."""
    notes: list[str] = Field(default_factory=list)

    @property
    def campaign_id(self) -> str:
        return self.tune_id

    @property
    def measured(self) -> list[Trial]:
        return [t for t in self.trials if t.measured]

    @property
    def imported(self) -> list[Trial]:
        return [t for t in self.trials if not t.measured]

    def trial(self, candidate: int, load_value: float) -> Trial | None:
        return next((t for t in self.trials if t.measured and t.candidate == candidate
                     and t.load_value is not None and math.isclose(t.load_value, load_value)), None)

    def doc(self) -> dict[str, Any]:
        """What the ``tunes`` row keeps in ``doc`` (the trials have their own rows)."""
        return self.model_dump(mode="json", exclude={"trials", "tune_id", "name", "profile", "status", "reason",
                                                     "strategy", "slo", "revision"})


# --- the trade-off ---------------------------------------------------------------------------------

def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher x and higher y are
    better), ordered by x: the upper-right envelope."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front: list[int] = []
    best_y = -math.inf
    for i in order:
        x, y = points[i]
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        if y > best_y:
            front.append(i)
            best_y = y
    return sorted(front, key=lambda i: points[i][0])


def chart_points(trials: Sequence[Trial]) -> list[tuple[float, float]]:
    """(tok/s per user, tok/s per GPU) of each trial that has both."""
    return [(t.tok_s_per_user, t.tok_s_per_gpu) for t in trials
            if t.tok_s_per_user is not None and t.tok_s_per_gpu is not None]


def slo_frontier(trials: Sequence[Trial]) -> list[Trial]:
    """The Pareto front of the measured trials that met the SLO, by tok/s per user."""
    meeting = [t for t in trials if t.measured and t.status == "passed" and t.tok_s_per_user is not None
               and t.tok_s_per_gpu is not None]
    points = chart_points(meeting)
    return [meeting[i] for i in pareto_front(points)]


def tpot_floor(slo: str) -> float | None:
    """The tok/s per user a TPOT bound implies (1000 / limit): the SLO's line on the chart."""
    from app.slo import parse_run_slo

    limits = [limit for metric, _op, limit in parse_run_slo(slo).requests if metric == "tpot_ms" and limit > 0]
    return 1000.0 / min(limits) if limits else None
