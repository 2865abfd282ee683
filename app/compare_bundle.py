"""What a Compare of runs shows beyond the comparison itself (``app.analysis.compare``): the A/B
headlines, each run's cost and its before/after in money, the good-output cost, the TTFT/ITL
distributions, the sweeps and where each run's load started. The GUI's Compare view and the HTML
report both show it, so it is assembled once, here, without Qt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.analysis.compare import Comparison, compare_runs
from app.analysis.findings import Finding
from app.cost.prices import PriceTable, price_table
from app.cost.runs import RunCost
from app.cost.totals import priced_at_goodput
from app.distributions import RunDistributions, Sweep, load_start_offsets, run_distributions, sweeps
from app.headline import Headline, headlines, money_lines
from app.quality.outputs import OutputPair, side_by_side
from app.run_findings import compared_findings
from app.store import RunStore
from engine_adapters.registry import engine_terms_for


@dataclass
class CompareExtras:
    """What a Compare shows beyond the comparison itself, computed in one go (in the GUI, in the
    same worker as the comparison)."""

    headlines: list[Headline] = field(default_factory=list)
    distributions: list[RunDistributions] = field(default_factory=list)
    sweeps: list[Sweep] = field(default_factory=list)
    load_start_s: list[float] = field(default_factory=list)
    """Per run, seconds from the run's start to the start of its load (the engine's start before)."""
    costs: list[RunCost] = field(default_factory=list)
    """Per run, $ per 1M tokens at the throughput the table shows (``app.cost.compared_costs``)."""
    money_lines: list[str] = field(default_factory=list)
    """Per headline, the before/after in money (``app.headline.money_line``)."""
    good_slo_text: str = ""
    """Whose SLO the good-output costs were counted under, or why there are none."""
    findings: list[list[Finding]] = field(default_factory=list)
    """Per run, its own findings (``app.run_findings``; read from the store, so empty without one)."""
    why: list[list[Finding]] = field(default_factory=list)
    """Per headline, why its run differs from the baseline: the ``changed_*`` findings against it."""
    outputs: list[OutputPair] = field(default_factory=list)
    """The baseline's and the first other run's outputs of the same prompts (the quality probe's),
    split at their first divergence (``app.quality.outputs``)."""
    outputs_note: str = ""
    """How to read them, or why there are none."""


def compare_extras(comparison: Comparison, store: RunStore | None = None,
                   prices: PriceTable | None = None) -> CompareExtras:
    """Everything ``comparison`` is shown with, its costs at ``prices`` (default: the shipped
    list); with ``store`` (read it in a worker), also the cost at goodput and the distributions,
    which are counted from the stored requests, and each run's findings, read from its telemetry."""
    costs, lines = money_lines(comparison, prices if prices is not None else price_table())
    good_slo_text = ""
    findings: list[list[Finding]] = []
    why: list[list[Finding]] = []
    if store is not None:
        costs, good_slo_text = priced_at_goodput(store, comparison, costs)
        findings, why = compared_findings(store, comparison)
    distributions = run_distributions(store, comparison) if store is not None else []
    outputs, outputs_note = compared_outputs(comparison)
    return CompareExtras(headlines(comparison), distributions, sweeps(comparison), load_start_offsets(comparison),
                         costs, lines, good_slo_text, findings, why, outputs, outputs_note)


def compared_outputs(comparison: Comparison) -> tuple[list[OutputPair], str]:
    """The A/B of outputs: the baseline against the first other run, on the prompts both probed."""
    base = comparison.baseline
    other = next((i for i in range(len(comparison.runs)) if i != base), None)
    if other is None:
        return [], ""
    labels = comparison.labels()
    runs = comparison.runs
    return side_by_side(runs[base].quality, runs[other].quality, runs[other].config, labels[base], labels[other])


def compare_with_extras(store: RunStore, ids: Sequence[int], baseline: int | None = None,
                        prices: PriceTable | None = None) -> tuple[Comparison, CompareExtras]:
    """The runs ``ids`` compared against ``baseline`` (each engine's features in its own terms)
    and everything the Compare view draws with them (run it in a worker: it reads the store)."""
    comparison = compare_runs(store, ids, baseline, engine_terms_of=engine_terms_for)
    return comparison, compare_extras(comparison, store, prices)
