"""``tunebench capacity RUN --slo SLO --users N [--tokens-per-day T] [--headroom 0.3] [--price
NAME=USD] [--json]``: how many replicas, GPUs and dollars a traffic needs, from a stored run's
measured levels (the arithmetic is ``app.cost``'s; docs/capacity.md has the formulas)."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.argtypes import add_sizing_arguments, bounded_int, db_parent
from app.cli.store_cmds import open_store
from app.cli.terminal import safe
from app.cost import capacity_text, plan_capacity, price_table
from app.slo import SLO_METRICS


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
