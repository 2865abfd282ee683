"""A Ray cluster as tunebench sees it: connecting with Ray's own address forms, what each node
has and runs, and whether the nodes run the driver's code. ``app.fleet`` is the only package that
imports ``ray``; a run without ``--cluster`` never imports it (docs/fleet.md)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import platform
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.errors import UserError

NAMESPACE = "tunebench"
ADDRESS_ENV = "RAY_ADDRESS"
"""Ray's own variable: ``--cluster`` without an address (or ``auto``) reads it, as ``ray.init`` does."""
REACH_TIMEOUT_S = 3.0
"""How long a ``HOST:PORT`` address gets to accept a TCP connection before it is called unreachable."""
NODE_REPORT_TIMEOUT_S = 60.0
_CODE_PACKAGES = ("app", "engine_adapters", "db")


@lru_cache(maxsize=1)
def code_version() -> str:
    """This installation's tunebench: its package version and a digest of its Python sources, so
    a node with other code is told apart even when the version number is the same."""
    try:
        version = importlib.metadata.version("tunebench")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in _CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return f"{version}+{digest.hexdigest()[:10]}"


@dataclass(frozen=True)
class NodeReport:
    """What a node says of itself, from a task that runs there."""

    node_id: str
    hostname: str
    tunebench: str
    python: str
    ray: str
    gpu_models: list[str] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    driver_version: str | None = None
    cpu_model: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hardware(self) -> dict[str, Any]:
        """The node's hardware in the shape a stored run's has (``app.analysis.compare.hardware_model`` reads it)."""
        return {"gpus": [{"name": name} for name in self.gpu_models], "cpu_model": self.cpu_model}


def node_report() -> NodeReport:
    """Runs on a node (a Ray task): its own facts."""
    import ray

    from engine_adapters.hardware import probe_hardware

    hardware = probe_hardware()
    return NodeReport(node_id=ray.get_runtime_context().get_node_id(), hostname=socket.gethostname(),
                      tunebench=code_version(), python=platform.python_version(), ray=ray.__version__,
                      gpu_models=[g.name for g in hardware.gpus], gpu_uuids=[g.uuid for g in hardware.gpus],
                      driver_version=hardware.driver_version, cpu_model=hardware.cpu_model)


@dataclass
class NodeView:
    """One node of the cluster: Ray's view of its resources, and its own report when alive."""

    node_id: str
    address: str
    alive: bool
    total: dict[str, float]
    free: dict[str, float]
    """``total`` less what placement groups hold on the node (:func:`unreserved`)."""
    report: NodeReport | None = None

    @property
    def label(self) -> str:
        """How the CLI and the GUI name the node: its host name and the start of Ray's id (nodes on
        one host, as in a test cluster, differ by the id)."""
        host = self.report.hostname if self.report is not None else self.address
        return f"{host}/{self.node_id[:8]}"

    @property
    def custom_resources(self) -> dict[str, float]:
        return {k: v for k, v in self.total.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")
                and not k.startswith(("node:", "accelerator_type:"))}


def cluster_address(address: str | None) -> str:
    """The address to connect to: the one given, else ``RAY_ADDRESS``, else ``auto`` (Ray's forms:
    ``auto``, ``HOST:PORT``, ``ray://HOST:PORT``)."""
    chosen = (address or "").strip() or os.environ.get(ADDRESS_ENV, "").strip() or "auto"
    if chosen == "auto" and os.environ.get(ADDRESS_ENV, "").strip():
        chosen = os.environ[ADDRESS_ENV].strip()
    return chosen


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` that accepts no TCP connection is refused in one
    line now, not after Ray's own minute of retries."""
    target = address.removeprefix("ray://")
    if address == "auto" or ":" not in target:
        return
    host, _, port_text = target.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise UserError(f"cluster address '{address}': the port must be a number (Ray's forms: auto, HOST:PORT, "
                        "ray://HOST:PORT)") from None
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


def connect(address: str | None) -> str:
    """Connect this process to the cluster (once; a second call with the same address is a no-op).
    Returns the address used. Every failure is one line (a UserError)."""
    try:
        import ray
    except ImportError:
        raise UserError("--cluster needs Ray, which is not installed here: pip install 'tunebench[fleet]' "
                        "(make installs it)") from None

    chosen = cluster_address(address)
    if ray.is_initialized():
        current = _connected_address()
        if chosen == "auto" or current is None or chosen == current:
            return chosen
    # A new address (the GUI's box checks one cluster, then another) must answer before the
    # connection in use is dropped: an unreachable one leaves it as it was.
    _check_reachable(chosen)
    if ray.is_initialized():
        disconnect()
    try:
        ray.init(address=chosen, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot connect to the Ray cluster at {chosen}: {first}") from None
    _CONNECTED["address"] = chosen
    return chosen


_CONNECTED: dict[str, str] = {}
"""The address this process connected to through :func:`connect`."""


def _connected_address() -> str | None:
    """The address of the connection in use: the one :func:`connect` made, else the cluster's own
    (a connection made elsewhere, as a test's); None when Ray cannot say (a client connection)."""
    import ray

    if "address" in _CONNECTED:
        return _CONNECTED["address"]
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return None


def disconnect() -> None:
    import ray

    _CONNECTED.clear()
    if ray.is_initialized():
        ray.shutdown()


def nodes(reports: bool = True) -> list[NodeView]:
    """Every node Ray knows (dead ones too), with each live node's report when ``reports``."""
    import ray
    from ray.util import placement_group_table
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    listed = ray.nodes()
    total_by_node = {n["NodeID"]: {k: float(v) for k, v in (n.get("Resources") or {}).items()} for n in listed}
    free_by_node = unreserved(total_by_node, placement_group_table().values())
    views = [NodeView(node_id=n["NodeID"], address=n.get("NodeManagerAddress", ""), alive=bool(n.get("Alive")),
                      total=total_by_node[n["NodeID"]], free=free_by_node[n["NodeID"]])
             for n in listed]
    if reports:
        remote = ray.remote(num_cpus=0)(node_report)
        pending = {v.node_id: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(v.node_id, soft=False))
                   .remote() for v in views if v.alive}
        for view in views:
            ref = pending.get(view.node_id)
            if ref is None:
                continue
            try:
                view.report = ray.get(ref, timeout=NODE_REPORT_TIMEOUT_S)
            except Exception:  # a node that dies or cannot run the task has no report; status says so
                view.report = None
    return sorted(views, key=lambda v: (not v.alive, v.address, v.node_id))


RESERVING_STATES = frozenset({"PREPARED", "CREATED", "RESCHEDULING"})
"""The states of a placement group whose placed bundles hold their node's resources (a pending one
holds none yet, a removed one none any more)."""


def unreserved(total_by_node: dict[str, dict[str, float]],
               groups: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each node's resources less what placement groups hold there, from Ray's public calls only
    (``ray.nodes`` and ``ray.util.placement_group_table``: Ray's per-node availability is private).
    Every trial and load client of a fleet runs in a placement group, so this is what a new one can
    still get; a task or actor outside any placement group (another job's) is not counted."""
    free = {node_id: dict(total) for node_id, total in total_by_node.items()}
    for group in groups:
        if group.get("state") not in RESERVING_STATES:
            continue
        placed = group.get("bundles_to_node_id") or {}
        for index, bundle in (group.get("bundles") or {}).items():
            node_free = free.get(str(placed.get(index, "")))
            if node_free is None:  # not placed yet, or on a node Ray no longer lists
                continue
            for resource, amount in bundle.items():
                if resource in node_free:
                    node_free[resource] = max(0.0, node_free[resource] - float(amount))
    return free


def mismatches(views: list[NodeView], driver: str | None = None) -> list[str]:
    """One line per live node whose tunebench, Python or Ray differs from the driver's."""
    import ray

    driver = driver or code_version()
    here_python = platform.python_version()
    lines = []
    for view in views:
        if not view.alive:
            continue
        report = view.report
        if report is None:
            lines.append(f"node {view.label}: did not report (is tunebench installed there?)")
            continue
        if report.tunebench != driver:
            lines.append(f"node {view.label}: tunebench {report.tunebench}, the driver runs {driver}")
        if report.python.rsplit(".", 1)[0] != here_python.rsplit(".", 1)[0]:
            lines.append(f"node {view.label}: Python {report.python}, the driver runs {here_python}")
        if report.ray != ray.__version__:
            lines.append(f"node {view.label}: Ray {report.ray}, the driver runs {ray.__version__}")
    return lines


def _prepare_node(runtime: str, demo_model: bool) -> list[str]:
    """Runs on a node: the managed runtime and the demo model, as ``make engine`` makes them."""
    from engine_adapters.runtimes import ensure_demo_model, install_managed

    quiet: list[str] = []
    done = [f"{runtime} at {install_managed(runtime, log=quiet.append)}"]
    if demo_model:
        done.append(f"demo model at {ensure_demo_model(log=quiet.append)}")
    return done


def prepare_nodes(runtime: str, demo_model: bool) -> list[tuple[str, bool, list[str]]]:
    """(node, whether it worked, what it did or why not) for every live node, prepared at once."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    views = [v for v in nodes() if v.alive]
    task = ray.remote(num_cpus=0)(_prepare_node)
    pending = [(v, task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(v.node_id, soft=False))
                .remote(runtime, demo_model)) for v in views]
    out = []
    for view, ref in pending:
        try:
            lines: list[str] = ray.get(ref)
            out.append((view.label, True, lines))
        except Exception as exc:
            text = str(exc).strip()
            out.append((view.label, False, [text.splitlines()[-1] if text else type(exc).__name__]))
    return out
