"""A cluster's status as a face shows it before a campaign: each node's resources, code and
mismatches, how many nodes could host a trial of the configuration and how many trials would run
at once. The GUI's Cluster box shows it (``tunebench cluster status`` prints the same facts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.config import RunConfig


@dataclass(frozen=True)
class NodeRow:
    """One node, in the words of a status table."""

    label: str
    alive: bool
    cpus_free: float
    cpus_total: float
    gpus_free: float
    gpus_total: float
    gpu_models: list[str] = field(default_factory=list)
    tunebench: str | None = None
    """The node's tunebench (version and source digest); None: it did not report."""
    can_host: bool = False
    """It has the resources a trial of the configuration asks for."""
    mismatches: list[str] = field(default_factory=list)
    """Why the node's code differs from the driver's (empty: it matches)."""

    @property
    def cpus_text(self) -> str:
        return f"{self.cpus_free:g}/{self.cpus_total:g}"

    @property
    def gpus_text(self) -> str:
        models = ", ".join(sorted(set(self.gpu_models)))
        return f"{self.gpus_free:g}/{self.gpus_total:g}" + (f" {models}" if models else "")


@dataclass(frozen=True)
class ClusterStatus:
    """What a check of the cluster found, for one configuration."""

    address: str
    driver: str
    """The driver's tunebench (version and source digest)."""
    nodes: list[NodeRow]
    trials_at_once: int
    """What the cluster's free resources hold at once: "trials at once" when left on auto."""

    @property
    def hosts(self) -> int:
        return sum(1 for n in self.nodes if n.can_host and not n.mismatches)

    @property
    def mismatches(self) -> list[str]:
        return [line for n in self.nodes for line in n.mismatches]

    def line(self, parallel: int | None = None) -> str:
        """The status in one line: "3 nodes, 2 can host trials; up to 2 at once"."""
        alive = sum(1 for n in self.nodes if n.alive)
        dead = len(self.nodes) - alive  # nodes Ray still lists after they went away
        text = (f"{alive} node{'s' if alive != 1 else ''}" + (f" ({dead} dead)" if dead else "")
                + f", {self.hosts} can host trials")
        if self.mismatches:
            bad = sum(1 for n in self.nodes if n.mismatches)
            return text + (f"; {bad} node{' runs' if bad == 1 else 's run'} other code than this workbench: "
                           "a run there is refused")
        if not self.hosts:
            return text + ": nothing can run"
        at_once = min(parallel, self.trials_at_once) if parallel else self.trials_at_once
        return text + f"; up to {at_once} at once"


def check_cluster(address: str, config: RunConfig) -> ClusterStatus:
    """Connects to the cluster at ``address`` and reads its nodes (blocking: a worker's call).
    An unreachable cluster is a one-line ``UserError``."""
    from app.fleet import cluster
    from app.fleet.preflight import can_host
    from app.fleet.trial import trial_bundles, trials_at_once

    used = cluster.connect(address)
    views = cluster.nodes()
    wrong = cluster.mismatches(views)
    bundles = trial_bundles(config)
    wanted = bundles[0]
    rows = [NodeRow(label=v.label, alive=v.alive, cpus_free=v.free.get("CPU", 0.0), cpus_total=v.total.get("CPU", 0.0),
                    gpus_free=v.free.get("GPU", v.total.get("GPU", 0.0)), gpus_total=v.total.get("GPU", 0.0),
                    gpu_models=list(v.report.gpu_models) if v.report else [],
                    tunebench=v.report.tunebench if v.report else None, can_host=can_host(v, wanted),
                    mismatches=[line for line in wrong if line.startswith(f"node {v.label}:")])
            for v in views]
    return ClusterStatus(address=used, driver=cluster.code_version(), nodes=rows,
                         trials_at_once=trials_at_once(views, bundles))
