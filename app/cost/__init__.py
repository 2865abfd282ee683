"""Capacity and cost from measured runs: what a million tokens cost at a measured throughput, and
how many replicas, GPUs and dollars a given traffic needs at an SLO.

Everything here is arithmetic on what a stored run measured; nothing is modelled. The formulas,
where prices come from and the extrapolation rule are in ``docs/capacity.md``. One module per
concern: ``prices`` (the shipped list and the user's), ``arithmetic`` (tokens, replicas, nodes,
dollars), ``deployment`` (what a stored run ran on and measured), ``goodput`` (the requests that
met an SLO, re-counted), ``capacity`` (``tunebench capacity``), ``runs`` (one run's cost at a
throughput), ``totals`` (costs read from the store) and ``text`` (all of it in words). This
package only names what its callers import; it holds no code of its own.
"""

from app.cost.arithmetic import (
    DAYS_PER_MONTH,
    SECONDS_PER_HOUR,
    TOKENS_PER_MILLION,
    CostFigure,
    usd_per_million_tokens,
)
from app.cost.capacity import DEFAULT_HEADROOM, PERCENTILES, CapacityPlan, plan_capacity
from app.cost.deployment import run_deployment
from app.cost.goodput import recount_good
from app.cost.prices import PriceTable, default_prices, parse_price, price_table
from app.cost.runs import (
    RunCost,
    compared_costs,
    comparison_slo,
    cost_factor,
    good_slo_of,
    live_cost,
    live_cost_basis,
    run_cost,
    step_slo_whose,
    unused_prices,
)
from app.cost.text import (
    COST_COLUMNS,
    before_after_cost_text,
    capacity_text,
    cost_factor_text,
    cost_rows,
    count_text,
    number_text,
    slo_text,
    sources_text,
    usd_text,
)
from app.cost.totals import compared_good_costs, priced_at_goodput, step_costs, trial_costs

__all__ = [
    "COST_COLUMNS",
    "CapacityPlan",
    "CostFigure",
    "DAYS_PER_MONTH",
    "DEFAULT_HEADROOM",
    "PERCENTILES",
    "PriceTable",
    "RunCost",
    "SECONDS_PER_HOUR",
    "TOKENS_PER_MILLION",
    "before_after_cost_text",
    "capacity_text",
    "compared_costs",
    "compared_good_costs",
    "comparison_slo",
    "cost_factor",
    "cost_factor_text",
    "cost_rows",
    "count_text",
    "default_prices",
    "good_slo_of",
    "live_cost",
    "live_cost_basis",
    "number_text",
    "parse_price",
    "plan_capacity",
    "price_table",
    "priced_at_goodput",
    "recount_good",
    "run_cost",
    "run_deployment",
    "slo_text",
    "sources_text",
    "step_costs",
    "step_slo_whose",
    "trial_costs",
    "unused_prices",
    "usd_per_million_tokens",
    "usd_text",
]
