"""``tunebench capacity RUN --slo SLO --users N [--tokens-per-day T] [--headroom 0.3] [--price
NAME=USD] [--json]``: how many replicas, GPUs and dollars a traffic needs, from a stored run's
measured levels (the arithmetic is ``app.cost``'s; docs/capacity.md has the formulas)."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.argtypes import MAX_COUNT, add_price_argument, bounded_float, bounded_int, db_parent
from app.cli.store_cmds import open_store
from app.cli.terminal import safe
from app.cost import (
    DEFAULT_HEADROOM,
    PERCENTILES,
    capacity_text,
    plan_capacity,
    price_table,
)
from app.slo import SLO_METRICS

MAX_TOKENS_PER_DAY = 1e18


def cmd_capacity(args: argparse.Namespace) -> int:
    prices = price_table(args.price or ())  # a bad --price is refused before the store is opened
    with open_store(args) as store:
        run = store.get_run(store.resolve(args.run))
        requests = store.requests(run.id) if run.n_requests else None  # the good output, re-counted at --slo
    plan = plan_capacity(run, args.slo, prices, users=args.users, tokens_per_day=args.tokens_per_day,
                         headroom=args.headroom, percentile=args.percentile, gpu=args.gpu,
                         gpus_per_replica=args.gpus_per_replica, requests=requests)
    if args.json:
        json.dump(plan.to_dict(), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print("\n".join(safe(line) for line in capacity_text(plan).splitlines()))
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
    add_price_argument(p)
    p.add_argument("--gpu", metavar="NAME", help="the GPU the run used, for a run whose record names none")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capacity", parents=[db_parent()],
                       help="replicas, GPUs and cost for a traffic at an SLO, from a stored run's levels")
    p.add_argument("run", metavar="RUN", help="run id, uid (prefix) or name")
    p.add_argument("--slo", required=True, help=f"e.g. 'ttft_ms<=500,tpot_ms<=50' (metrics: {', '.join(SLO_METRICS)})")
    add_sizing_arguments(p)
    p.add_argument("--gpus-per-replica", type=bounded_int(1, 1024), metavar="N",
                   help="for a run imported from another tool, which records no parallelism: the GPUs one engine "
                        "replica ran on (TP x PP)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=cmd_capacity)
