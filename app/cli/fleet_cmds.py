"""``--cluster`` for ``run --repeat``, ``ladder`` and ``tune``, and ``tunebench cluster status |
prepare``. Ray is imported only when a cluster is asked for (docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
import sys

from app.bus import Bus
from app.campaign_state import ClusterOptions
from app.cli.argtypes import bounded_int
from app.cli.terminal import safe
from app.config import RunConfig
from app.errors import UserError
from app.fleet.choice import FleetChoice

MAX_PARALLEL = 4096


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """The options every command that runs trials shares."""
    group = parser.add_argument_group("on a Ray cluster (docs/fleet.md)")
    group.add_argument("--cluster", nargs="?", const="auto", metavar="ADDRESS",
                       help="run the trials on a Ray cluster, side by side: auto, HOST:6379 or ray://HOST:10001 "
                            "(without ADDRESS: $RAY_ADDRESS, as Ray reads it)")
    group.add_argument("--parallel", type=bounded_int(1, MAX_PARALLEL), metavar="N",
                       help="at most N trials at once (default: as many as the cluster's free resources hold)")
    group.add_argument("--skip-bad-nodes", action="store_true",
                       help="leave out the nodes that fail the preflight instead of launching nothing")
    group.add_argument("--trial-resource", action="append", default=[], metavar="NAME[=AMOUNT]",
                       help="a custom Ray resource every trial also asks for, to keep trials on the nodes that "
                            "have it (repeatable)")


def cluster_options(args: argparse.Namespace, where: FleetChoice) -> ClusterOptions | None:
    """What a campaign keeps of its cluster options (None: it runs on this machine)."""
    address = where.address or getattr(args, "cluster", None)
    if address is None:
        return None
    return ClusterOptions(address=address, parallel=getattr(args, "parallel", None),
                          skip_bad_nodes=bool(getattr(args, "skip_bad_nodes", False)),
                          trial_resources=list(getattr(args, "trial_resource", None) or []))


def cluster_argv(stored: ClusterOptions | None, args: argparse.Namespace) -> list[str]:
    """The cluster options of a resumed campaign, as :func:`add_cluster_options` reads them: the
    stored ones, each replaced by one given now (``--cluster`` its address, ...)."""
    address = getattr(args, "cluster", None) or (stored.address if stored is not None else None)
    if address is None:
        return []
    parallel = args.parallel if args.parallel is not None else (stored.parallel if stored is not None else None)
    argv = ["--cluster", address] + (["--parallel", str(parallel)] if parallel is not None else [])
    if args.skip_bad_nodes or (stored is not None and stored.skip_bad_nodes):
        argv.append("--skip-bad-nodes")
    for entry in args.trial_resource or (stored.trial_resources if stored is not None else []):
        argv += ["--trial-resource", entry]
    return argv


def _resources(entries: list[str]) -> dict[str, float]:
    out = {}
    for entry in entries:
        name, _, amount = entry.partition("=")
        try:
            value = float(amount) if amount else 1.0
        except ValueError:
            raise UserError(f"--trial-resource {entry}: the amount must be a number") from None
        if not name.strip() or not value > 0 or value != value:
            raise UserError(f"--trial-resource {entry}: give NAME or NAME=AMOUNT with a positive amount")
        out[name.strip()] = value
    return out


def open_fleet(args: argparse.Namespace, config: RunConfig, bus: Bus | None = None) -> FleetChoice:
    """Connects to the cluster when ``--cluster`` was given, checks that every node runs the
    driver's code and passes the preflight, and says how many trials run at once."""
    address = getattr(args, "cluster", None)
    client_nodes = getattr(args, "client_nodes", None)
    if address is None:
        if getattr(args, "parallel", None) is not None:
            raise UserError("--parallel needs --cluster: on one machine, trials run one after another")
        if getattr(args, "skip_bad_nodes", False) or getattr(args, "trial_resource", None):
            raise UserError("--skip-bad-nodes and --trial-resource need --cluster")
        if client_nodes is not None:
            raise UserError("--client-nodes needs --cluster: the client's workers run on the cluster's nodes")
        return FleetChoice()
    extra = _resources(args.trial_resource)
    if client_nodes is not None and not getattr(args, "endpoint", None):
        raise UserError("--client-nodes sends the load to a running server from the cluster's nodes: give "
                        "--endpoint URL")
    if getattr(args, "endpoint", None) and client_nodes is None:
        raise UserError("--cluster runs engines on the cluster's nodes: with --endpoint, give --client-nodes K to "
                        "send the load from K of them")
    from app.fleet.choice import open_fleet as choose

    return choose(address, config, parallel=args.parallel, skip_bad_nodes=args.skip_bad_nodes, extra_resources=extra,
                  client_nodes=client_nodes, report=lambda line: print(f"tunebench: {safe(line)}", file=sys.stderr))


def cmd_cluster_status(args: argparse.Namespace) -> int:
    from app.fleet import cluster

    used = cluster.connect(args.cluster)
    views = cluster.nodes()
    wrong = cluster.mismatches(views)
    if args.json:
        print(json.dumps({"address": used, "driver": cluster.code_version(), "mismatches": wrong,
                          "nodes": [{"node_id": v.node_id, "label": v.label, "alive": v.alive, "total": v.total,
                                     "free": v.free, "report": v.report.to_dict() if v.report else None}
                                    for v in views]}, indent=2))
        return 0 if not wrong else 2
    print(f"cluster at {used}; this driver runs tunebench {cluster.code_version()}")
    print("  (free: what no placement group holds there; tunebench runs every trial and load client in one)")
    for v in views:
        if not v.alive:
            print(f"  {v.label}  dead")
            continue
        gpus_total, gpus_free = v.total.get("GPU", 0.0), v.free.get("GPU", v.total.get("GPU", 0.0))
        models = ", ".join(sorted(set(v.report.gpu_models))) if v.report and v.report.gpu_models else "no GPU"
        version = v.report.tunebench if v.report else "did not report"
        custom = ", ".join(f"{k}={n:g}" for k, n in sorted(v.custom_resources.items()))
        print(safe(f"  {v.label}  {v.address}  CPUs {v.free.get('CPU', 0.0):g}/{v.total.get('CPU', 0.0):g} free  "
                   f"GPUs {gpus_free:g}/{gpus_total:g} free ({models})  tunebench {version}"
                   + (f"  [{custom}]" if custom else "")))
    for line in wrong:
        print(safe(f"mismatch: {line}"))
    return 0 if not wrong else 2


def cmd_cluster_prepare(args: argparse.Namespace) -> int:
    """Installs the managed runtime and the demo model on every live node, through Ray tasks."""
    from app.fleet import cluster

    used = cluster.connect(args.cluster)
    print(f"preparing the nodes of the cluster at {used}: runtime {args.runtime}"
          + ("" if args.no_demo_model else ", demo model"))
    failed = 0
    for label, ok, lines in cluster.prepare_nodes(args.runtime, not args.no_demo_model):
        failed += not ok
        print(safe(f"  {label}: " + ("" if ok else "failed: ") + "; ".join(lines)))
    return 0 if not failed else 3


def register(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("cluster", help="a Ray cluster's nodes, GPUs and tunebench versions; prepare its nodes")
    commands = group.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    status = commands.add_parser("status", help="nodes, GPUs (free and busy), tunebench version per node, mismatches")
    status.add_argument("cluster", nargs="?", metavar="ADDRESS", help="auto, HOST:6379 or ray://HOST:10001 "
                                                                      "(default: $RAY_ADDRESS, else auto)")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=cmd_cluster_status)
    prepare = commands.add_parser("prepare", help="install the managed engine runtime and the demo model on every node")
    prepare.add_argument("cluster", nargs="?", metavar="ADDRESS", help="as for status")
    prepare.add_argument("--runtime", default="llamacpp-cpu", help="managed runtime to install (default: llamacpp-cpu)")
    prepare.add_argument("--no-demo-model", action="store_true", help="do not make the demo model")
    prepare.set_defaults(handler=cmd_cluster_prepare)
