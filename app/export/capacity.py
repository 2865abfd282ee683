"""The ``tunebench capacity`` answer as the replica count of a Kubernetes export: how many pods
the Deployment runs, and the reasoning in a few comment lines, so the manifest says why it asks
for that many GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.cost import (
    DAYS_PER_MONTH,
    DEFAULT_HEADROOM,
    CapacityPlan,
    count_text,
    number_text,
    plan_capacity,
    price_table,
    slo_text,
    usd_text,
)
from app.errors import UserError
from db.records import RunDetail


@dataclass(frozen=True)
class Sizing:
    """What the Deployment is sized for: ``tunebench capacity``'s inputs, same meaning. None
    takes that command's default (30% headroom, p99)."""

    slo: str | None
    """Required: None only so that the one-line refusal of a traffic without an SLO is here."""
    users: int | None = None
    tokens_per_day: float | None = None
    headroom: float | None = None
    percentile: str | None = None
    prices: tuple[str, ...] = ()
    """``NAME=USD_PER_HOUR`` entries over the shipped price list."""
    gpu: str | None = None
    """The GPU, for a run whose record names none."""


def check_prices(sizing: Sizing) -> None:
    """Refuse a bad ``--price`` before the store is opened, as ``tunebench capacity`` does."""

    price_table(sizing.prices)


def plan_for(run: RunDetail, sizing: Sizing) -> CapacityPlan:
    """``app.cost.plan_capacity`` for ``run``, which does all the validation."""

    if sizing.slo is None:
        raise UserError("--users/--tokens-per-day size the replicas at an SLO: pass --slo too, e.g. "
                        "--slo 'ttft_ms<=500'")
    return plan_capacity(run, sizing.slo, price_table(sizing.prices), users=sizing.users,
                         tokens_per_day=sizing.tokens_per_day,
                         headroom=DEFAULT_HEADROOM if sizing.headroom is None else sizing.headroom,
                         percentile=sizing.percentile or "p99", gpu=sizing.gpu)


def pods(plan: CapacityPlan) -> int:
    """Deployment replicas: one pod runs every data-parallel replica the run measured together
    (its GPU limit is TP x PP x DP), so the plan's engine replicas are packed DP to a pod."""
    assert plan.replicas is not None
    return math.ceil(plan.replicas / plan.deployment.data_parallel)


def reasoning(plan: CapacityPlan) -> list[str]:
    """The comment lines above ``replicas:`` (plain text: the template escapes each as a comment)."""

    assert plan.sized_on is not None and plan.price is not None and plan.replicas is not None
    assert plan.units is not None and plan.running is not None
    d, lv = plan.deployment, plan.sized_on.level
    lines = [f"replicas sized by tunebench capacity on run {plan.run_id} ({plan.run_name})",
             f"SLO: {slo_text(plan.slo, plan.percentile)}; sized on level {lv.idx} ({lv.label}), the highest "
             "concurrency that met it"]
    per = [f"{number_text(plan.users_per_replica)} concurrent users"] if plan.users_per_replica is not None else []
    if plan.output_tok_per_s_per_replica is not None:
        per.append(f"{plan.output_tok_per_s_per_replica:,.1f} output tok/s")
    lines.append(f"one replica ({count_text(d.units_per_replica, d.unit)} of {d.device}) at the SLO: {', '.join(per)}")
    traffic = [f"{plan.users:,} concurrent users"] if plan.users is not None else []
    if plan.tokens_per_day is not None:
        traffic.append(f"{plan.tokens_per_day:,.0f} output tokens a day")
    nodes = f" on {count_text(plan.nodes, 'node')} of {d.units_per_node} GPUs" if plan.nodes is not None else ""
    packed = (f"; {pods(plan)} pods of {d.data_parallel} data-parallel replicas "
              f"({count_text(pods(plan) * d.data_parallel * d.units_per_replica, d.unit)} in all)"
              if d.data_parallel > 1 else "")
    lines.append(f"for {' and '.join(traffic)} with {plan.headroom:.0%} headroom: {plan.replicas} replicas = "
                 f"{count_text(plan.units, d.unit)}{nodes}{packed}")
    lines.append(f"running: {usd_text(plan.running.usd_per_day)} a day, {usd_text(plan.running.usd_per_month)} a month "
                 f"({DAYS_PER_MONTH} days) at {plan.price.text()}")
    lines += [f"note: {n}" for n in plan.notes]
    return lines


def size(run: RunDetail, sizing: Sizing) -> tuple[int, list[str]]:
    """The Deployment's replicas and their reasoning; an SLO no level met is refused in one line,
    so nothing is written."""
    plan = plan_for(run, sizing)
    if plan.unreachable is not None:

        raise UserError(f"run {run.id}: the SLO {slo_text(plan.slo, plan.percentile)} is {plan.unreachable}: no k8s "
                        "manifest written")
    return pods(plan), reasoning(plan)
