"""Task accuracy as lm-evaluation-harness reports it, stored with a run and compared with its noise.

A run's figures live in its stored summary under :data:`SUMMARY_KEY` (a :class:`TaskEval`), so
``runs show --json`` carries them and a run recorded before this existed simply has none. Two
runs' accuracies differ beyond noise when ``|a - b| > 1.96 * sqrt(se_a^2 + se_b^2)``: the two-sided
95% bound for the difference of two independent means, from the standard errors lm-eval reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

SUMMARY_KEY = "task_eval"
"""Where a run's stored summary keeps its :class:`TaskEval`."""
Z_95 = 1.96
"""Two-sided 95% normal quantile: the noise bound of a difference of two means."""


class TaskAccuracy(BaseModel):
    """One metric of one task, as lm-eval reports it (``exact_match,<filter>`` and
    ``exact_match_stderr,<filter>`` in its results)."""

    task: str
    metric: str
    filter: str = "none"
    value: float
    stderr: float | None = None
    """lm-eval's standard error of the mean; None where it reports none ("N/A")."""
    samples: int
    """Documents scored (after ``--limit``)."""
    wall_s: float
    """Wall time of the whole lm-eval run this figure came from."""

    def text(self) -> str:
        err = f" ± {self.stderr:.3f}" if self.stderr is not None else ""
        return f"{self.task} {self.metric}{'' if self.filter == 'none' else f' ({self.filter})'} " \
               f"{self.value:.3f}{err} ({self.samples} samples)"


class TaskEval(BaseModel):
    """What one run's lm-eval pass produced: the figures, and what could not be measured (one line
    each); the speed figures of the run stand either way."""

    tool: str = ""
    """``lm-eval 0.4.13``."""
    tasks: list[str] = Field(default_factory=list)
    limit: int | None = None
    results: list[TaskAccuracy] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    wall_s: float | None = None


def stored_task_eval(summary: Mapping[str, Any] | None) -> TaskEval | None:
    """A stored run's :class:`TaskEval`, or None (none measured, or an unreadable entry)."""
    raw = (summary or {}).get(SUMMARY_KEY)
    if not isinstance(raw, Mapping):
        return None
    try:
        return TaskEval.model_validate(raw)
    except ValidationError:
        return None


Verdict = Literal["baseline", "beyond noise", "within noise", "no error given", "not measured"]


def noise_bound(se_a: float, se_b: float) -> float:
    """The largest difference two accuracies with these standard errors show by chance (95%)."""
    return Z_95 * math.sqrt(se_a**2 + se_b**2)


def difference_verdict(a: TaskAccuracy | None, b: TaskAccuracy | None) -> Verdict:
    """Whether ``b`` differs from the baseline ``a`` beyond noise."""
    if a is None or b is None:
        return "not measured"
    if a.stderr is None or b.stderr is None:
        return "no error given"
    return "beyond noise" if abs(b.value - a.value) > noise_bound(a.stderr, b.stderr) else "within noise"


class AccuracyRow(BaseModel):
    """One task metric across compared runs: each run's figure and its verdict against the baseline."""

    task: str
    metric: str
    filter: str
    values: list[TaskAccuracy | None]
    verdicts: list[Verdict]
    differences: list[float | None]
    """Each run's value less the baseline's."""
    noise_bounds: list[float | None]


def compare_task_accuracy(summaries: Sequence[Mapping[str, Any] | None], baseline: int) -> list[AccuracyRow]:
    """Per task metric any run measured, each run's figure against the baseline's: the rows
    ``compare`` shows; empty when no run measured task accuracy."""
    evals = [stored_task_eval(s) for s in summaries]
    keys: list[tuple[str, str, str]] = []
    for found in evals:
        for acc in found.results if found is not None else []:
            if (acc.task, acc.metric, acc.filter) not in keys:
                keys.append((acc.task, acc.metric, acc.filter))
    rows = []
    for key in keys:
        values = [next((a for a in (e.results if e else []) if (a.task, a.metric, a.filter) == key), None)
                  for e in evals]
        base = values[baseline]
        verdicts: list[Verdict] = []
        differences: list[float | None] = []
        bounds: list[float | None] = []
        for i, value in enumerate(values):
            verdicts.append("baseline" if i == baseline else difference_verdict(base, value))
            if base is None or value is None:
                differences.append(None)
                bounds.append(None)
                continue
            differences.append(value.value - base.value)
            bounds.append(noise_bound(base.stderr, value.stderr)
                          if base.stderr is not None and value.stderr is not None else None)
        rows.append(AccuracyRow(task=key[0], metric=key[1], filter=key[2], values=values, verdicts=verdicts,
                                differences=differences, noise_bounds=bounds))
    return rows


def comparison_lines(rows: Sequence[AccuracyRow], labels: Sequence[str]) -> list[str]:
    """``compare``'s text for the rows: one line per run and task metric, with its verdict."""
    lines: list[str] = []
    for row in rows:
        name = f"{row.task} {row.metric}" + ("" if row.filter == "none" else f" ({row.filter})")
        lines.append(f"{name}:")
        for label, value, verdict, diff, bound in zip(labels, row.values, row.verdicts, row.differences,
                                                      row.noise_bounds, strict=True):
            if value is None:
                lines.append(f"  {label}: not measured")
                continue
            err = f" ± {value.stderr:.3f}" if value.stderr is not None else ""
            said = f"{value.value:.3f}{err} ({value.samples} samples)"
            if verdict != "baseline" and diff is not None:
                noise = f", noise ±{bound:.3f}" if bound is not None else ""
                said += f", {diff:+.3f} against the baseline: {verdict}{noise}"
            lines.append(f"  {label}: {said}")
    return lines
