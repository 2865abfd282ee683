"""The A/B headline: one sentence and a few big figures that say what a change did, e.g.
"prefix caching off -> on: TTFT mean (engine) 91.2 -> 19.7 ms, 4.6x faster".

Built from a :class:`app.analysis.compare.Comparison` (figures, verdicts, reliability and the engine-side
stand-ins are the comparison's, so the headline cannot disagree with the table under it) and
shown by the GUI's Compare card, the presentation mode's before/after view and the HTML report.
Pure Python; no Qt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.analysis import metric_catalog as catalog
from app.analysis.compare import Comparison
from app.cost import PriceTable, RunCost, before_after_cost_text, compared_costs
from app.labels import describe_change
from app.labels import engine_defaults as declared_defaults
from app.quality.text import QualityKept, quality_kept

HEADLINE_KEYS: tuple[str, ...] = ("ttft_ms_p50", "output_tok_per_s", "itl_ms_p50")
"""The figures a headline shows, before a flagged client figure gives way to the engine's own."""


@dataclass(frozen=True)
class HeadlineFigure:
    key: str
    """The catalogue key shown (the engine-side stand-in when a run flagged the client's)."""
    name: str
    unit: str
    before: float | None
    after: float | None
    before_text: str
    after_text: str
    factor: str
    """How it moved, in words: ``4.6x faster``, ``1.9x higher``, ``12% slower``."""
    verdict: str
    """``better``, ``worse``, ``same`` (within the noise), ``unreliable`` or ``""``."""
    note: str = ""
    """Why it cannot be trusted, or that the difference is within the noise."""

    @property
    def ratio(self) -> float | None:
        if self.before is None or self.after is None or self.before <= 0 or self.after <= 0:
            return None
        return self.after / self.before

    def values_text(self) -> str:
        """``TTFT mean (engine) 91.2 -> 19.7 ms``."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.name} {self.before_text} \u2192 {self.after_text}{unit}"

    def text(self) -> str:
        """``TTFT mean (engine) 91.2 -> 19.7 ms, 4.6x faster``."""
        return self.values_text() + (f", {self.factor}" if self.factor else "")


@dataclass(frozen=True)
class Headline:
    before_label: str
    after_label: str
    change: str
    """What differs in the configuration: ``prefix caching off -> on`` (empty when nothing does)."""
    figures: list[HeadlineFigure] = field(default_factory=list)
    lead: HeadlineFigure | None = None
    """The figure that moved most (judged better or worse); None when none did."""
    quality: QualityKept | None = None
    """The after run's quality against its reference (``app.quality.text``); None without a probe."""

    def sentence(self) -> str:
        """The one line a presenter reads out."""
        what = self.change or f"{self.before_label} \u2192 {self.after_label}"
        if self.lead is None:
            return f"{what}: no clear difference in the headline figures"
        return f"{what}: {self.lead.text()}"


def factor_words(key: str, before: float | None, after: float | None) -> str:
    """A change as a person says it: a factor for a large change (``4.6x faster``), a percentage
    for a small one (``8% slower``); latency reads faster/slower, other figures higher/lower."""
    if before is None or after is None or not (math.isfinite(before) and math.isfinite(after)):
        return ""
    if before == after:
        return "unchanged"
    m = catalog.metric(key)
    latency = m.unit == "ms" and m.direction == "lower"
    up, down = ("slower", "faster") if latency else ("higher", "lower")
    if before > 0 and after > 0:
        ratio = after / before
        if ratio >= 1.5:
            return f"{ratio:.1f}\u00d7 {up}"
        if ratio <= 1 / 1.5:
            return f"{1 / ratio:.1f}\u00d7 {down}"
    if before == 0:
        return "new"
    pct = 100.0 * (after - before) / abs(before)
    return f"{abs(pct):.0f}% {up if pct > 0 else down}"


def _steady_first(comparison: Comparison, key: str, base: int, column: int) -> str:
    """The figure's steady-window twin (``catalog.STEADY_OF``) when both runs have it: a headline
    compares what the engine did at its target load, not the ramp-up and drain (its name says so)."""
    twin = catalog.STEADY_OF.get(key)
    row = comparison.metric(twin) if twin else None
    if twin and row is not None and row.values[base] is not None and row.values[column] is not None:
        return twin
    return key


def headline(comparison: Comparison, column: int, *, keys: Sequence[str] = HEADLINE_KEYS,
             engine_defaults: Mapping[str, Any] | None = None) -> Headline:
    """The headline of column ``column`` against the comparison's baseline."""
    base = comparison.baseline
    labels = comparison.labels()
    figures: list[HeadlineFigure] = []
    for key in dict.fromkeys(comparison.reliable_key(_steady_first(comparison, k, base, column)) for k in keys):
        row = comparison.metric(key)
        if row is None:
            continue
        m = row.metric
        before, after = row.values[base], row.values[column]
        verdict = row.verdict(column)
        note = ""
        if verdict == "unreliable":
            note = row.note(column)
        elif verdict == "same":
            note = "no significant difference (within the noise of the repeats)"
        figures.append(HeadlineFigure(key, m.name, m.unit, before, after, m.format(before), m.format(after),
                                      factor_words(key, before, after), verdict, note))
    judged = [f for f in figures if f.verdict in ("better", "worse") and f.ratio is not None]
    lead = max(judged, key=lambda f: abs(math.log(f.ratio or 1.0)), default=None)
    if engine_defaults is None:
        kind = comparison.runs[base].engine_kind or "vllm"
        engine_defaults = declared_defaults(kind)
    change = describe_change(comparison.config_diff, base, column, engine_defaults=engine_defaults)
    return Headline(labels[base], labels[column], change, figures, lead, compared_quality(comparison, column))


def compared_quality(comparison: Comparison, column: int) -> QualityKept | None:
    """Column ``column``'s quality in words; its reference named as the comparison names it when
    the reference is one of the compared runs (``#12 fp16``)."""
    run = comparison.runs[column]
    reference_id = ((run.quality or {}).get("reference") or {}).get("run_id")
    named = {r.id: label for r, label in zip(comparison.runs, comparison.labels(), strict=True)}
    return quality_kept(run.quality, named.get(reference_id) if reference_id is not None else None)


def headlines(comparison: Comparison, *, engine_defaults: Mapping[str, Any] | None = None) -> list[Headline]:
    """One headline per compared column against the baseline (none for a single run)."""
    return [headline(comparison, i, engine_defaults=engine_defaults)
            for i in range(len(comparison.runs)) if i != comparison.baseline]


def money_line(comparison: Comparison, column: int, costs: Sequence[RunCost]) -> str:
    """Column ``column`` against the baseline in money (``app.cost.before_after_cost_text``),
    labelled with what differs in their configuration, or the runs' names when nothing does;
    ``costs`` are ``compared_costs`` of the comparison, so the line uses the throughput the table
    shows."""
    base = comparison.baseline
    labels = comparison.labels()
    change = headline(comparison, column).change or f"{labels[base]} \u2192 {labels[column]}"
    row = comparison.metric("output_tok_per_s")
    tok_per_s = list(row.values) if row is not None else [None] * len(comparison.runs)
    kept = compared_quality(comparison, column)
    return before_after_cost_text(change, costs[base], costs[column], tok_per_s[base], tok_per_s[column],
                                  quality=kept.short if kept is not None else "")


def money_lines(comparison: Comparison, prices: PriceTable) -> tuple[list[RunCost], list[str]]:
    """Every compared run's cost, and one ``money_line`` per column other than the baseline (in
    the order of ``headlines``)."""
    costs = compared_costs(comparison, prices)
    return costs, [money_line(comparison, i, costs) for i in range(len(comparison.runs)) if i != comparison.baseline]
