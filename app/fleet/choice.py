"""Where a campaign's trials run, chosen once for the CLI and the GUI alike: connect to the
cluster, refuse nodes whose code differs from the driver's, run the preflight on every node that
could host a trial, and say how many trials run at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.config import RunConfig
from app.errors import UserError


@dataclass
class FleetChoice:
    """Where a command's trials run: ``fleet`` None is this machine."""

    fleet: Any = None
    parallel: int = 1
    client_nodes: int | None = None
    """Load from this many nodes (``run --endpoint URL --client-nodes K``)."""
    address: str | None = None
    """The cluster's address as connected (None: this machine)."""
    hosts: list[Any] = field(default_factory=list)
    """The nodes that passed the preflight (``app.fleet.cluster.NodeView``)."""

    def clients(self) -> Any:
        """The run's client pool factory: one worker per node of the cluster (None: processes here)."""
        if not self.client_nodes:
            return None
        from app.fleet.clients import RayClientPool

        nodes = self.client_nodes
        return lambda _workers, on_note=None: RayClientPool(nodes, on_note=on_note)


def same_hardware(hosts: list[Any]) -> tuple[list[Any], str | None]:
    """The nodes a campaign's trials use: all of them when they have one hardware model (GPU
    models, or the CPU without a GPU), else those of the model most of them have, so that its
    repeats and steps compare fairly; and the line that says so (None: nothing left out)."""
    from app.analysis.compare import hardware_model

    groups: dict[str, list[Any]] = {}
    for view in hosts:
        model = hardware_model(view.report.hardware()) if view.report is not None else "unknown hardware"
        groups.setdefault(model, []).append(view)
    if len(groups) < 2:
        return list(hosts), None
    model, chosen = max(groups.items(), key=lambda group: len(group[1]))  # a tie: the model seen first
    others = "; ".join(f"{len(views)} with {name}" for name, views in groups.items() if name != model)
    return chosen, (f"the nodes that can host trials differ in hardware: trials run on the {len(chosen)} with "
                    f"{model}, so that their runs compare fairly (left out: {others}; --trial-resource picks "
                    "nodes by hand)")


def open_fleet(address: str, config: RunConfig, *, parallel: int | None = None, skip_bad_nodes: bool = False,
               extra_resources: dict[str, float] | None = None, client_nodes: int | None = None,
               report: Callable[[str], None] = lambda line: None) -> FleetChoice:
    """Connects to the cluster at ``address`` (Ray's forms; ``auto`` and ``RAY_ADDRESS`` as Ray
    reads them), checks that every node runs the driver's code and passes the preflight. Each
    problem is one ``report`` line; a refusal is a :class:`UserError`."""
    from app.fleet import cluster

    used = cluster.connect(address)
    views = cluster.nodes()
    wrong = cluster.mismatches(views)
    for line in wrong:
        report(line)
    if wrong:
        raise UserError(f"{len(wrong)} node(s) of the cluster at {used} do not run the driver's tunebench, Python or "
                        "Ray (tunebench cluster status shows them)")
    if client_nodes is not None:
        alive = sum(1 for v in views if v.alive)
        if client_nodes > alive:
            raise UserError(f"--client-nodes {client_nodes}: the cluster at {used} has {alive} live node(s)")
        report(f"cluster at {used}: the load client runs on {client_nodes} node(s)")
        return FleetChoice(client_nodes=client_nodes, address=used)
    from app.fleet.preflight import checked_hosts
    from app.fleet.trial import RayFleet, smallest, trial_bundles

    extra = dict(extra_resources or {})
    bundles = [{**bundle, **extra} for bundle in trial_bundles(config)]
    wanted = smallest(bundles)  # a node that can hold any bundle of the trial is checked
    hosts, mixed = same_hardware(checked_hosts(config, wanted, skip_bad_nodes, report))
    if mixed:
        report(mixed)
    only = [v.node_id for v in hosts] if skip_bad_nodes or mixed else []
    fleet = RayFleet(extra, only_nodes=only)
    if len(bundles) > 1:  # a spread P/D group larger than the cluster: refused before anything starts
        fleet.check_fits(bundles)
    at_once = parallel or fleet.default_parallel(config)
    report(f"cluster at {used}: {len(hosts)} node(s) can host trials; up to {at_once} at once")
    return FleetChoice(fleet, at_once, address=used, hosts=list(hosts))
