"""``tunebench capacity RUN --slo SLO --users N [--tokens-per-day T] [--headroom 0.3] [--price
NAME=USD] [--json]``: how many replicas, GPUs and dollars a traffic needs, from a stored run's
measured levels (the arithmetic is ``app.cost``'s; docs/capacity.md has the formulas)."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.argtypes import MAX_COUNT, bounded_float, bounded_int
from app.cli.campaign_cmds import db_parent
from app.cli.store_cmds import open_store
from app.cli.terminal import safe
from app.cost import (
    DAYS_PER_MONTH,
    DEFAULT_HEADROOM,
    PERCENTILES,
    CapacityPlan,
    CostFigure,
    JudgedLevel,
    plan_capacity,
    price_table,
    slo_text,
)
from app.slo import SLO_METRICS

MAX_TOKENS_PER_DAY = 1e18


def _usd(value: float) -> str:
    """Dollars to the cent; a figure under a dollar (a CPU run's cost per million tokens) to
    three significant digits, so it does not read as $0.00."""
    return f"${value:,.2f}" if value >= 1 else f"${value:.3g}"


def _n(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _count(value: float, noun: str) -> str:
    return f"{_n(value)} {noun}{'' if value == 1 else 's'}"


def _cost(figure: CostFigure | None) -> str:
    if figure is None:
        return "-"
    return _usd(figure.usd) if figure.usd is not None else f"- ({figure.reason})"


def _level_line(j: JudgedLevel) -> str:
    lv = j.level
    tok = lv.figures.get("output_tok_per_s")
    measured = (f"{_n(lv.concurrency)} in flight" if lv.concurrency is not None else "concurrency not recorded") + (
        f", {tok:,.1f} output tok/s" if tok is not None else "")
    return f"level {lv.idx} ({lv.label}): {measured}: " + ("meets the SLO" if j.verdict.meets else
                                                           f"misses it ({j.verdict.reason})")


def format_plan(plan: CapacityPlan) -> str:
    d = plan.deployment
    lines = [f"capacity of run {plan.run_id} ({plan.run_name}) at the SLO: {slo_text(plan.slo, plan.percentile)}"]
    lines += [f"  {_level_line(j)}" for j in plan.levels]
    if plan.unreachable is not None:
        lines.append(f"  {plan.unreachable}")
        lines += [f"  note: {n}" for n in plan.notes]
        return "\n".join(lines)
    assert plan.sized_on is not None and plan.price is not None and plan.replicas is not None
    assert plan.units is not None and plan.running is not None
    lv = plan.sized_on.level
    unit = d.unit
    lines.append(f"  sized on level {lv.idx} ({lv.label}), the highest concurrency that met the SLO")
    lines.append(f"  replica: {_count(d.units_per_replica, unit)} of {d.device} ({d.counted})")
    lines.append(f"  price: {plan.price.text()}")
    per_replica = []
    if plan.users_per_replica is not None:
        per_replica.append(f"{_n(plan.users_per_replica)} concurrent users")
    if plan.output_tok_per_s_per_replica is not None:
        per_replica.append(f"{plan.output_tok_per_s_per_replica:,.1f} output tok/s")
    if per_replica:
        lines.append(f"  one replica at the SLO: {', '.join(per_replica)}")
    headroom = f"with {plan.headroom:.0%} headroom"
    if plan.replicas_for_users is not None:
        lines.append(f"  for {plan.users:,} concurrent users {headroom}: {_count(plan.replicas_for_users, 'replica')}")
    if plan.replicas_for_tokens is not None and plan.tokens_per_day is not None:
        lines.append(f"  for {plan.tokens_per_day:,.0f} output tokens a day {headroom}: "
                     f"{_count(plan.replicas_for_tokens, 'replica')}")
    nodes = (f" on {_count(plan.nodes, 'node')} of {d.units_per_node} GPUs" if plan.nodes is not None
             and d.units_per_node is not None else "")
    lines.append(f"  answer: {_count(plan.replicas, 'replica')} = {_count(plan.units, unit)}{nodes}")
    source = plan.price.source
    lines.append(f"  running ({source}): {_n(plan.running.unit_hours_per_day)} {unit}-hours a day = "
                 f"{_usd(plan.running.usd_per_day)} a day, {_usd(plan.running.usd_per_month)} a month "
                 f"({DAYS_PER_MONTH} days)")
    good = f"; good output ({plan.good_output_slo}): " if plan.good_output_slo else "; good output: "
    lines.append(f"  per 1M tokens at level {lv.idx} ({source}): output {_cost(plan.usd_per_million_output)}; "
                 f"total {_cost(plan.usd_per_million_total)}{good}{_cost(plan.usd_per_million_good_output)}")
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def cmd_capacity(args: argparse.Namespace) -> int:
    prices = price_table(args.price or ())  # a bad --price is refused before the store is opened
    with open_store(args) as store:
        run = store.get_run(store.resolve(args.run))
    plan = plan_capacity(run, args.slo, prices, users=args.users, tokens_per_day=args.tokens_per_day,
                         headroom=args.headroom, percentile=args.percentile, gpu=args.gpu)
    if args.json:
        json.dump(plan.to_dict(), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print("\n".join(safe(line) for line in format_plan(plan).splitlines()))
    return 0


def add_sizing_arguments(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The traffic, headroom and price options, shared with ``tunebench export --format k8s`` so
    both commands parse and bound them alike (``--slo`` is each command's own: required here,
    optional there). ``defaults=False`` leaves every option None unless given, so a caller can tell
    an option given from its default (the defaults then apply downstream, the same values)."""
    p.add_argument("--percentile", choices=PERCENTILES, default="p99" if defaults else None,
                   help="each SLO bound holds at this percentile of the level (default p99)")
    p.add_argument("--users", type=bounded_int(1, MAX_COUNT), metavar="N", help="concurrent users to serve")
    p.add_argument("--tokens-per-day", type=bounded_float(0.0, MAX_TOKENS_PER_DAY, exclusive_minimum=True),
                   metavar="T", help="output tokens to generate per day")
    p.add_argument("--headroom", type=bounded_float(0.0, 10.0), default=DEFAULT_HEADROOM if defaults else None,
                   help=f"spare capacity on top, as a fraction (default {DEFAULT_HEADROOM:g}: "
                        f"{DEFAULT_HEADROOM * 100:g} percent)")
    p.add_argument("--price", action="append", metavar="NAME=USD_PER_HOUR",
                   help="your price per GPU-hour, e.g. 'H100=2.49', or per core-hour, 'cpu=0.05' (repeatable; "
                        "default: the shipped list of typical list prices)")
    p.add_argument("--gpu", metavar="NAME", help="the GPU the run used, for a run whose record names none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capacity", parents=[db_parent()],
                       help="replicas, GPUs and cost for a traffic at an SLO, from a stored run's levels")
    p.add_argument("run", metavar="RUN", help="run id, uid (prefix) or name")
    p.add_argument("--slo", required=True, help=f"e.g. 'ttft_ms<=500,tpot_ms<=50' (metrics: {', '.join(SLO_METRICS)})")
    add_sizing_arguments(p)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=cmd_capacity)
