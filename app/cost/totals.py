"""Costs read from the store: every trial of a tune, every step of a ladder and every column of a
compare, with the good output of their stored requests pooled as their throughput is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from app.analysis.compare import Comparison
from app.cost.goodput import good_tokens
from app.cost.prices import PriceTable
from app.cost.runs import RunCost, comparison_slo, run_cost, with_good_output
from app.slo import Slo, SloError, parse_run_slo, parse_slo
from db.errors import StoreError

if TYPE_CHECKING:
    from app.ladder.state import LadderState
    from app.store import RunStore
    from app.tuner.state import TuneState


def trial_costs(store: RunStore, state: TuneState, prices: PriceTable) -> dict[int, RunCost]:
    """Each measured trial with a stored run: $ per 1M output and total tokens at the trial's
    throughput, and per 1M good output tokens under the tune's SLO (its requests re-counted one
    by one). A trial whose run was deleted is left out."""
    try:
        bounds = parse_run_slo(state.slo).requests if state.slo else []  # a tune's quality bounds aside
    except SloError:
        bounds = []
    out: dict[int, RunCost] = {}
    for t in state.trials:
        if not t.measured or t.run_id is None or t.status in ("pending", "running"):
            continue
        try:
            run = store.get_run(t.run_id)
            requests = store.requests(t.run_id) if bounds else None
        except StoreError:
            continue
        cost = run_cost(run, prices, t.figures.get("output_tok_per_s"), t.figures.get("total_tok_per_s"))
        if bounds and requests is not None:
            level = run.levels[0].idx if run.levels else None
            cost = with_good_output(cost, good_tokens(requests, bounds, level), state.slo, bounds)
        out[t.index] = cost
    return out


def step_costs(store: RunStore, state: LadderState, prices: PriceTable, slo: str | None = None) -> dict[int, RunCost]:
    """Each ladder step that ran: $ per 1M tokens at the step's throughput (the staircase's
    figure, a repeated step's mean), priced on the GPUs (or cores) of its stored run; and per 1M
    good output tokens under ``slo`` (default: the SLO every step was measured under, the
    profile's ``load.slo``), the share pooled over a repeated step's runs, as its throughput is."""
    rows = [r for r in state.rows if r.run_ids and r.output_tok_per_s is not None]
    runs = {r.index: store.get_run(r.run_ids[0]) for r in rows}
    good_slo, _whose = comparison_slo(runs.values(), slo)
    bounds = parse_slo(good_slo) if good_slo is not None else []
    out: dict[int, RunCost] = {}
    for r in rows:
        cost = run_cost(runs[r.index], prices, r.output_tok_per_s, r.total_tok_per_s)
        if good_slo is not None:
            cost = with_good_output(cost, pooled_good_tokens(store, r.run_ids, bounds), good_slo, bounds)
        out[r.index] = cost
    return out


def compared_good_costs(store: RunStore, comparison: Comparison, costs: list[RunCost], slo: str) -> list[RunCost]:
    """``costs`` (``compared_costs``) with each column's $ per 1M good output tokens under ``slo``:
    the share of output that met it is pooled over the column's runs (a repeat set's members),
    as the column's throughput is."""
    bounds = parse_slo(slo)
    return [with_good_output(cost, pooled_good_tokens(store, members, bounds), slo, bounds)
            for cost, members in zip(costs, comparison.members, strict=True)]


def pooled_good_tokens(store: RunStore, run_ids: Iterable[int], bounds: list[Slo]) -> tuple[float, float] | None:
    """``good_tokens`` (good, all) summed over runs measured as one (a repeat set, a repeated
    step); None when any of them cannot be counted under ``bounds``."""
    counted = [good_tokens(store.requests(run_id), bounds) for run_id in run_ids]
    if not counted or any(c is None for c in counted):
        return None
    return sum(c[0] for c in counted if c), sum(c[1] for c in counted if c)


def priced_at_goodput(store: RunStore, comparison: Comparison, costs: list[RunCost],
                      asked: str | None = None) -> tuple[list[RunCost], str]:
    """``costs`` with their good-output cost under ``asked`` or the runs' shared SLO
    (``comparison_slo``), and the sentence that says whose SLO it was, or why there is none."""
    slo, whose = comparison_slo(comparison.runs, asked)
    if slo is None:
        return costs, f"No good-output cost: {whose}."
    return compared_good_costs(store, comparison, costs, slo), f"Good output: the requests that met {whose} '{slo}'."
