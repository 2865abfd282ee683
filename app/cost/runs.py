"""The cost of one run at a throughput: what a million tokens cost at the figure Compare, a tune,
a ladder or the live view shows for it, priced on the GPUs (or cores) its stored run used; a run
that cannot be priced says why instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app.analysis.compare import Comparison
from app.cost.arithmetic import CostFigure, usd_per_million_tokens
from app.cost.deployment import run_config, run_deployment
from app.cost.goodput import no_share_reason
from app.cost.prices import Price, PriceTable, Unit
from app.errors import UserError
from app.recording import run_columns
from app.slo import Slo, SloError, parse_slo
from db.records import RunDetail

if TYPE_CHECKING:
    from app.events import RunStarted


@dataclass(frozen=True)
class RunCost:
    """What a million tokens cost at one compared run's measured throughput (the figure Compare
    shows for it), or why that cannot be said: a compare shows every run, priced or not."""

    run_id: int
    output: CostFigure
    total: CostFigure
    price: Price | None = None
    units: float | None = None
    """GPUs (or cores) the measured throughput came from."""
    unit: Unit | None = None
    device: str | None = None
    note: str | None = None
    """Why the figure deserves caution (its throughput is flagged unreliable)."""
    good_output: CostFigure | None = None
    """$ per 1M output tokens of the requests that met ``good_slo`` (None: no SLO was asked)."""
    good_slo: str | None = None

    @property
    def reason(self) -> str | None:
        """Why there is no $ per 1M output tokens (None: there is one)."""
        return self.output.reason if self.output.usd is None else None

    def price_text(self, with_source: bool = True) -> str:
        """``4 GPUs x 2.49 $/GPU-h (default price, as of 2026-12)``; without the source where the
        table says it once."""
        if self.price is None or self.units is None:
            return "-"
        count = f"{self.units:g} {self.unit}{'s' if self.units != 1 else ''}"
        price = self.price.text() if with_source else f"{self.price.usd_per_hour:,.2f} $/{self.unit}-h"
        return f"{count} x {price}"

    def to_dict(self) -> dict[str, Any]:
        """The ``cost`` object of a run in ``compare --json`` (None where not known)."""
        return {"usd_per_1m_output_tokens": self.output.usd, "usd_per_1m_total_tokens": self.total.usd,
                "price_usd_per_hour": None if self.price is None else self.price.usd_per_hour,
                "price_source": None if self.price is None else self.price.source,
                "units": self.units, "unit": self.unit, "reason": self.reason, "note": self.note,
                "usd_per_1m_good_output_tokens": None if self.good_output is None else self.good_output.usd,
                "good_output_reason": None if self.good_output is None else self.good_output.reason,
                "good_slo": self.good_slo}


def _no_cost_reason(exc: UserError) -> str:
    """The one line ``run_deployment`` or the price list refused with, in a compare's words
    (compare has no ``--gpu``: a GPU-less run stays unpriced there)."""
    text = str(exc)
    if "records no GPU" in text:
        return "the run records no GPU (an engine on another machine?)"
    return re.sub(r"^run \d+ ", "the run ", text)


def run_cost(run: RunDetail, prices: PriceTable, output_tok_per_s: float | None,
             total_tok_per_s: float | None, *, unreliable: str | None = None) -> RunCost:
    """$ per 1M output and total tokens of ``run`` at the given throughput (GPUs measured x price
    / tokens per hour, ``usd_per_million_tokens``); never raises for a run that cannot be priced
    (imported, no GPU recorded, a GPU without a price): the figures say why instead."""
    try:
        deployment = run_deployment(run)
        own = prices.for_run(run)
        price = own.gpu(deployment.device) if deployment.kind == "gpu" else own.cpu()
    except UserError as exc:
        why = CostFigure(None, _no_cost_reason(exc))
        return RunCost(run.id, why, why)
    units = deployment.units_measured
    note = f"from a throughput flagged unreliable: {unreliable}" if unreliable else None
    return RunCost(run.id, usd_per_million_tokens(units, price.usd_per_hour, output_tok_per_s),
                   usd_per_million_tokens(units, price.usd_per_hour, total_tok_per_s), price, units,
                   deployment.unit, deployment.device, note)


def started_run(started: RunStarted) -> RunDetail:
    """The run ``started`` announces, as the recorder will store it (``app.recording.run_columns``):
    a running run's cost is counted from the same configuration, hardware and environment as the
    stored run's, so the two can only differ by the throughput they are priced at."""
    return RunDetail(id=0, uid=started.run_id, status="running", started_at=started.started_wall_s,
                     **run_columns(started))


def live_cost_basis(started: RunStarted, prices: PriceTable) -> RunCost:
    """What a running run is priced on: its GPUs (or cores) and their price, from its
    ``RunStarted`` (no throughput yet: ``live_cost`` adds it); why not, where it cannot be priced."""
    return run_cost(started_run(started), prices, None, None)


def live_cost(basis: RunCost, output_tok_per_s: float | None) -> CostFigure:
    """$ per 1M output tokens at a live output throughput on ``basis`` (``live_cost_basis``)."""
    if basis.price is None or basis.units is None:
        return CostFigure(None, basis.output.reason)
    return usd_per_million_tokens(basis.units, basis.price.usd_per_hour, output_tok_per_s)


def with_good_output(cost: RunCost, tokens: tuple[float, float] | None, slo: str, bounds: list[Slo]) -> RunCost:
    """``cost`` with its $ per 1M good output tokens under ``slo``: the cost per output token
    over the share of output tokens (``good_tokens``: good, all) that met the SLO, so that it can
    never disagree with the cost beside it."""
    if cost.output.usd is None:
        figure = CostFigure(None, cost.output.reason)
    elif tokens is None or tokens[1] <= 0:
        figure = CostFigure(None, no_share_reason(bounds))
    elif tokens[0] <= 0:
        figure = CostFigure(None, "no request met the SLO")
    else:
        figure = CostFigure(cost.output.usd * tokens[1] / tokens[0])
    return replace(cost, good_output=figure, good_slo=slo)


def good_slo_of(costs: Iterable[RunCost]) -> str | None:
    """The SLO that costs' good output was counted under (``step_costs``), None when none was."""
    return next((c.good_slo for c in costs if c.good_slo), None)


def comparison_costs(runs: Iterable[RunDetail], output_tok_per_s: Iterable[float | None],
                     total_tok_per_s: Iterable[float | None], prices: PriceTable,
                     unreliable: Iterable[str | None] | None = None) -> list[RunCost]:
    """``run_cost`` of each compared run at the throughput the comparison shows for its column
    (a repeat set's mean), so the cost cannot disagree with the table above it."""
    runs, outs, totals = list(runs), list(output_tok_per_s), list(total_tok_per_s)
    flags = list(unreliable) if unreliable is not None else [None] * len(runs)
    return [run_cost(r, prices, o, t, unreliable=u) for r, o, t, u in zip(runs, outs, totals, flags, strict=True)]


def compared_costs(comparison: Comparison, prices: PriceTable) -> list[RunCost]:
    """``comparison_costs`` of every column of a compare: each at the output and total tok/s the
    comparison shows for it, flagged where the comparison flags that throughput."""
    k = len(comparison.runs)

    def row(key: str) -> tuple[list[float | None], list[str | None]]:
        m = comparison.metric(key)
        return (list(m.values), list(m.unreliable)) if m is not None else ([None] * k, [None] * k)

    (output, flags), (total, _flags) = row("output_tok_per_s"), row("total_tok_per_s")
    return comparison_costs(comparison.runs, output, total, prices, flags)


YOUR_SLO = "your SLO"
"""Whose SLO good output was counted under when the user gave one (``--slo``)."""


def step_slo_whose(asked: str | None = None) -> str:
    """Whose SLO a ladder's good output is counted under (``step_costs``): the one asked, else
    the one its steps were measured under."""
    return YOUR_SLO if asked else "the steps' SLO"


def comparison_slo(runs: Iterable[RunDetail], asked: str | None) -> tuple[str | None, str]:
    """The SLO a compare prices good output under, and whose it is: the one asked (``--slo``),
    else the one every compared run was measured under (``load.slo``); (None, why) when neither,
    since good output under different SLOs is no comparison."""
    if asked:
        try:
            parse_slo(asked)
        except SloError as exc:
            raise UserError(f"--slo: {exc}") from None
        return asked, YOUR_SLO
    own = set()
    for run in runs:
        try:
            own.add(run_config(run).load.slo)
        except UserError:
            own.add(None)
    if len(own) == 1 and (slo := own.pop()):
        return slo, "the runs' SLO"
    return None, ("the runs were measured under different SLOs or none" if len(own) > 1
                  else "the runs were measured without an SLO")


def cost_factor(base: RunCost, other: RunCost) -> float | None:
    """Baseline cost / this cost per 1M output tokens: above 1, this run is cheaper."""
    if base.output.usd is None or other.output.usd is None or other.output.usd <= 0:
        return None
    return base.output.usd / other.output.usd


def unused_prices(prices: PriceTable, costs: Iterable[RunCost]) -> list[str]:
    """Your ``--price`` names that priced none of the runs (a typo shows up here)."""
    used = [c.price for c in costs if c.price is not None and c.price.yours and not c.price.from_profile]
    names = [k for k in prices.your_gpu_hour_usd if not any(p.unit == "GPU" and p.key == k for p in used)]
    if prices.your_cpu_core_hour_usd is not None and not any(p.unit == "core" for p in used):
        names.append("cpu")
    return names


def throughput_per_unit_factor(base: RunCost, other: RunCost, base_tok_per_s: float | None,
                               other_tok_per_s: float | None) -> float | None:
    """Output tok/s per GPU (or core) of ``other`` over the baseline's: the throughput factor a
    price applies to, fair across runs on different numbers of GPUs."""
    if not (base.units and other.units and base_tok_per_s and other_tok_per_s) or base_tok_per_s <= 0:
        return None
    return (other_tok_per_s / other.units) / (base_tok_per_s / base.units)
