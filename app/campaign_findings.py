"""Campaigns explain themselves with the runs' findings (``app.run_findings``): each ladder step's
factor with why its run differs from the step before (the ``changed_*`` mechanisms) and what its
own run raised, and a tune's pick with its findings and why each rejected trial failed (the
tuner's own reason, with the warnings of the trial's run). Read from the store, as the runs'
findings are, so every stored campaign can be explained."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.analysis.findings import Finding
from app.ladder.state import LadderState
from app.run_findings import first_sentence, own, stored_findings, why_lines
from app.store import RunStore
from app.tuner.state import TuneState
from db.errors import StoreError

REJECTED = ("failed", "infeasible", "error")
"""Trial statuses that rejected a configuration at a load (a missed SLO, no fit, a failed run)."""


@dataclass(frozen=True)
class Explained:
    """One campaign item (a ladder step, the pick, a rejected trial): what it is, its figure,
    the run it rests on and its findings."""

    title: str
    figure: str
    run_id: int | None
    why: list[str] = field(default_factory=list)
    """Why it differs from the item before (a ladder step against the previous one)."""
    warnings: list[Finding] = field(default_factory=list)
    reason: str | None = None


def _findings(store: RunStore, run_id: int | None, reference: int | None = None) -> list[Finding]:
    """The run's findings; none when the campaign names a run the store no longer has."""
    if run_id is None:
        return []
    try:
        return stored_findings(store, run_id, reference)
    except StoreError:
        return []


def _warnings(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in own(findings) if f.severity == "warning"]


def _factor(value: float | None, against: str) -> str:
    return f"x{value:.2f} {against}" if value is not None else ""


def explain_ladder(store: RunStore, state: LadderState) -> list[Explained]:
    """Each step that ran: its factor over the previous step that ran, why (its run against that
    step's run) and its own run's warnings; a step that did not run, with its reason."""
    out: list[Explained] = []
    previous_run: int | None = None
    for row in state.rows:
        title = f"step {row.index + 1} {row.name}" + (f" ({row.change})" if row.change else "")
        if not row.ran or not row.run_ids:
            out.append(Explained(title, row.status, None, reason=row.reason))
            continue
        run_id = row.run_ids[0]
        findings = _findings(store, run_id, previous_run)
        figure = ", ".join(part for part in (
            f"{row.output_tok_per_s:,.0f} tok/s" if row.output_tok_per_s is not None else "",
            _factor(row.factor_previous, "over the previous step") if previous_run is not None else "baseline",
        ) if part)
        out.append(Explained(title, figure, run_id, [text for text, _f in why_lines(findings)], _warnings(findings),
                             row.reason))
        previous_run = run_id
    return out


def explain_tune(store: RunStore, state: TuneState) -> tuple[Explained | None, list[Explained]]:
    """The pick with its run's findings, and every rejected trial with the tuner's reason and the
    warnings of its run (what the engine and the client saw when it failed)."""
    pick: Explained | None = None
    if state.pick is not None:
        figure = f"{state.pick.tok_s_per_gpu:,.0f} tok/s per GPU" if state.pick.tok_s_per_gpu is not None else ""
        findings = _findings(store, state.pick.run_id)
        reason = f"the best that met the SLO; what bound it: {state.pick.binding}" if state.pick.binding else None
        pick = Explained(f"pick: {state.pick.label} at {state.pick.load_label}", figure, state.pick.run_id,
                         warnings=_warnings(findings), reason=reason)
    rejected: list[Explained] = []
    for trial in state.measured:
        if trial.status not in REJECTED:
            continue
        findings = _findings(store, trial.run_id)
        rejected.append(Explained(f"trial {trial.index} {trial.label} at {trial.load_label}", trial.status,
                                  trial.run_id, warnings=_warnings(findings), reason=trial.reason))
    return pick, rejected


def explained_lines(item: Explained) -> list[str]:
    """One campaign item as text: its title and figure, the tuner's or ladder's reason, why it
    differs from the step before, and the first sentence of each of its run's warnings."""
    lines = [f"{item.title}: {item.figure}" + (f" (run {item.run_id})" if item.run_id is not None else "")]
    lines += [f"  {item.reason}"] if item.reason else []
    lines += [f"  {text}" if i == 0 else f"    -> {text}" for i, text in enumerate(item.why)]
    lines += [f"  [warning] {f.rule}: {first_sentence(f.explanation)}" for f in item.warnings]
    return lines


def ladder_lines(store: RunStore, state: LadderState) -> list[str]:
    """A ladder explained as ``tunebench explain --ladder`` prints it and its tab shows it."""
    lines = [f"ladder {state.ladder_id} ({state.name}): each step's factor and why"]
    for item in explain_ladder(store, state):
        lines += explained_lines(item)
    return lines


def tune_lines(store: RunStore, state: TuneState) -> list[str]:
    """A tune explained as ``tunebench explain --tune`` prints it and its tab shows it."""
    pick, rejected = explain_tune(store, state)
    lines = [f"tune {state.tune_id} ({state.name}): its pick, and why each rejected trial failed"]
    for item in ([pick] if pick is not None else []) + rejected:
        lines += explained_lines(item)
    return lines
