"""One trial is one placement: a placement group sized for the configuration, an actor in it
that starts the engine with the local launcher and drives the client beside it, and a streaming
generator that brings the run's bus items back to the driver in batches. The driver republishes
them on the slot's bus, where the recorder stores them as a local run's (docs/fleet.md)."""

from __future__ import annotations

import gc
import queue
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from app.analysis.compare import NODE_TAG
from app.bus import Bus, Event
from app.campaign import EngineKeeper, RunnerLike
from app.config import RunConfig
from app.errors import EngineFailed, UserError
from app.events import LogLine, RequestDone, RequestsDone, RunFinished, RunStarted
from app.runner import Runner, RunResult
from engine_adapters.config import PdRole
from engine_adapters.runtimes import is_cpu_build

BATCH_INTERVAL_S = 0.1
"""A worker sends what its bus published at least this often (never one remote call per item)."""
MAX_BATCH_ITEMS = 2_000
CANCEL_CHECK_S = 0.2
"""How often the driver's one waiter looks at the trials' cancel events, between Ray's waits."""
NODE_LOST = "node {label} lost"
"""The reason of a run whose node went away: the trial runs again once, elsewhere."""
WORKER_DIED = "the trial's worker on node {label} died"
"""The reason of a run whose actor died on a node that lives on (its engine's watchdog stopped the
engine): the trial runs again once, in a new placement."""
LOST_PREFIXES = (NODE_LOST.split("{")[0], WORKER_DIED.split("{")[0])
CPU_ENGINE_CORES = 1
"""Cores a trial of a CPU engine asks Ray for, beside the client's core."""
CLIENT_CORES = 1
STREAMING_GC_THRESHOLD = 50_000
"""The first generation's threshold of the cyclic collector in a process that streams a run's
records (the driver, a slot's actor). Each record lives a fraction of a second (in a batch, a
bus, a recorder's pending writes): at CPython's default of 700 nearly every one is promoted and
scanned again by the older generations, which doubled the driver's time per record."""
NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node: a placement's label selector keeps trials on the nodes that passed."""


def trial_resources(config: RunConfig) -> dict[str, float]:
    """What one trial of ``config`` asks Ray for on the node of its actor (the first of
    :func:`trial_bundles`): its GPUs (``Features.gpu_count``) and a core for the client; for a
    CPU engine, a core for each engine (both pools of a P/D group) and the client's."""
    return trial_bundles(config)[0]


def trial_bundles(config: RunConfig) -> list[dict[str, float]]:
    """What one trial asks Ray for, bundle by bundle: one bundle on one node; a P/D group whose
    pools are spread, a bundle per pool engine, each on a node of its own (the first decode
    engine's with the client's core; ``app.fleet.pools.bundle_index`` names them)."""
    features, cpu = config.features, is_cpu_build(config.engine.runtime)
    if not features.disaggregation.spread:
        if cpu:
            return [{"CPU": float(CPU_ENGINE_CORES * features.engine_count + CLIENT_CORES)}]
        return [{"GPU": float(features.gpu_count), "CPU": float(CLIENT_CORES)}]

    def engine(role: PdRole) -> dict[str, float]:
        if cpu:
            return {"CPU": float(CPU_ENGINE_CORES)}
        return {"GPU": float(features.pool_gpu_count(role) // features.pool_instances(role))}

    first = engine("decode")
    first["CPU"] = first.get("CPU", 0.0) + CLIENT_CORES
    return [first, *(engine("prefill") for _ in range(features.pool_instances("prefill"))),
            *(engine("decode") for _ in range(features.pool_instances("decode") - 1))]


@dataclass(frozen=True)
class Placed:
    """Where a slot's trial runs, as the driver and the stored run name it."""

    node_id: str
    hostname: str
    gpu_ids: list[str]

    @property
    def label(self) -> str:
        return f"{self.hostname}/{self.node_id[:8]}"

    def record(self) -> dict[str, Any]:
        return {"ray_node_id": self.node_id, "hostname": self.hostname, "label": self.label,
                "gpu_ids": list(self.gpu_ids)}


def spare_the_collector() -> None:
    """Raises this process's first-generation threshold to ``STREAMING_GC_THRESHOLD`` (never lowers it)."""
    first, *older = gc.get_threshold()
    if 0 < first < STREAMING_GC_THRESHOLD:
        gc.set_threshold(STREAMING_GC_THRESHOLD, *older)


class TrialWorker:
    """The actor of one slot's trials on its node (created through ``ray.remote`` by
    :class:`RaySlot`). It keeps its engine between runs whose engine flags are equal, as a local
    campaign does; when the actor dies, the engine's watchdog stops the engine."""

    def __init__(self) -> None:
        self._keeper = EngineKeeper()
        self._cancel = threading.Event()
        spare_the_collector()

    def where(self) -> Placed:
        import ray

        context = ray.get_runtime_context()
        return Placed(node_id=context.get_node_id(), hostname=socket.gethostname(),
                      gpu_ids=[str(g) for g in ray.get_gpu_ids()])

    def cancel(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        self._keeper.close()

    def run(self, config: RunConfig, telemetry: bool, node: dict[str, Any],
            batch_interval_s: float = BATCH_INTERVAL_S, max_batch: int = MAX_BATCH_ITEMS,
            placement: Any = None) -> Iterator[Any]:
        """Yields lists of bus items as the run publishes them, then the ``RunResult`` (or a str:
        why the engine did not start). ``placement``: the trial's placement group, when a P/D
        group's pools are spread over its bundles."""

        def work(bus: Bus, cancel: threading.Event) -> RunResult | str:
            try:
                engine = self._keeper.engine_for(config, bus, cancel)
            except (EngineFailed, UserError) as exc:
                return "cancelled" if cancel.is_set() else f"engine: {exc}"
            if placement is None:
                return Runner(config, bus, engine=engine, telemetry=telemetry, node=node).run(cancel)
            from app.fleet.pools import RayPoolLauncher

            pools = RayPoolLauncher(placement, trial_bundles(config), config.features, cancel)
            try:
                return Runner(config, bus, engine=engine, telemetry=telemetry, node=node,
                              pool_launcher=pools).run(cancel)
            finally:
                pools.close()

        yield from self._stream(work, batch_interval_s, max_batch)

    def _stream(self, work: Callable[[Bus, threading.Event], RunResult | str], batch_interval_s: float,
                max_batch: int) -> Iterator[Any]:
        """Runs ``work(bus, cancel)`` in a thread and yields what it publishes on ``bus`` in batches
        while it runs, then its outcome (an exception it raised is raised here). A subclass whose
        engine is a stand-in streams its run through this too."""
        cancel = self._cancel = threading.Event()
        bus = Bus()
        mailbox = bus.subscribe(maxlen=10_000_000)
        outcome: queue.Queue[RunResult | str | BaseException] = queue.Queue()

        def target() -> None:
            try:
                outcome.put(work(bus, cancel))
            except BaseException as exc:
                outcome.put(exc)

        thread = threading.Thread(target=target, name="trial-run", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(batch_interval_s)  # what one interval published goes in one batch (not one per item)
            while batch := mailbox.drain(max_batch):
                yield as_rows(batch)
        while batch := mailbox.drain(max_batch):
            yield as_rows(batch)
        result = outcome.get()
        if isinstance(result, BaseException):
            raise result
        yield result


def as_rows(batch: list[Any]) -> list[Any]:
    """A batch as it crosses to the driver: each run of consecutive ``RequestDone`` events of one
    run becomes one ``RequestsDone`` (rows of values), the rest goes as it is, in order."""
    out: list[Any] = []
    pending: list[RequestDone] = []
    first: Event | None = None

    def flush() -> None:
        if first is not None and pending:
            out.append(Event(first.t_mono, first.t_wall, RequestsDone.of(pending[0].run_id,
                                                                        [done.record for done in pending])))
            pending.clear()

    for item in batch:
        payload = item.payload if isinstance(item, Event) else None
        if isinstance(payload, RequestDone):
            if pending and pending[0].run_id != payload.run_id:
                flush()
            if not pending:
                first = item
            pending.append(payload)
            continue
        flush()
        out.append(item)
    flush()
    return out


def _node_alive(node_id: str) -> bool:
    """Whether Ray still counts the node alive (its actor may have died alone)."""
    import ray

    try:
        return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
    except Exception:  # the cluster cannot say: the node is taken for lost
        return False


@dataclass
class _Raised:
    error: BaseException


_END = object()
"""What a follower's queue gets last: the stream ended, or the wait was given up (cancelled)."""


@dataclass
class _Watch:
    cancel: threading.Event
    on_cancel: Callable[[], bool]
    """Called once when ``cancel`` is set: True stops the waiting (nothing more will come)."""
    out: queue.Queue[Any]
    stream: bool
    cancel_heard: bool = False


class Waiter:
    """The driver's one thread for every trial on the cluster: one ``ray.wait`` over every pending
    placement and every run's stream, handing each follower what arrived and forwarding each
    trial's cancel. A trial's own thread (the executor's) only blocks on its queue: no thread and
    no poll per trial. The thread runs while something is followed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[Any, _Watch] = {}
        self._thread: threading.Thread | None = None

    def follow(self, waitable: Any, cancel: threading.Event, on_cancel: Callable[[], bool]) -> Generator[Any, None, None]:
        """What ``waitable`` brings as it arrives: an ``ObjectRef``'s value (once), or each item of a
        streaming generator; an error Ray raises for one is raised here. It ends with the stream, or
        when ``on_cancel`` (called once ``cancel`` is set) says to stop."""
        import ray

        watch = _Watch(cancel, on_cancel, queue.Queue(), stream=not isinstance(waitable, ray.ObjectRef))
        with self._lock:
            self._watches[waitable] = watch
            if self._thread is None:
                self._thread = threading.Thread(target=self._wait, name="fleet-waiter", daemon=True)
                self._thread.start()
        try:
            while (item := watch.out.get()) is not _END:
                if isinstance(item, _Raised):
                    raise item.error
                yield item
        finally:
            with self._lock:
                self._watches.pop(waitable, None)

    def ready(self, ref: Any, cancel: threading.Event) -> bool:
        """Whether ``ref`` (a placement group's ``ready()``) became ready before ``cancel`` was set."""
        followed = self.follow(ref, cancel, lambda: True)
        try:
            return next(followed, _END) is not _END
        finally:
            followed.close()

    def _wait(self) -> None:
        import ray

        while True:
            with self._lock:
                if not self._watches:
                    self._thread = None
                    return
                watches = dict(self._watches)
            for waitable, watch in watches.items():
                if watch.cancel.is_set() and not watch.cancel_heard:
                    watch.cancel_heard = True
                    if watch.on_cancel():
                        self._end(waitable, _END)
            waitables = [w for w in watches if w in self._watches]
            try:
                ready, _ = ray.wait(waitables, num_returns=1, timeout=CANCEL_CHECK_S) if waitables else ([], [])
                if ready:  # every one ready now, in one call
                    ready, _ = ray.wait(waitables, num_returns=len(waitables), timeout=0)
            except Exception as exc:  # the cluster went away: every follower hears it
                with self._lock:
                    for watch in self._watches.values():
                        watch.out.put(_Raised(exc))
                    self._watches.clear()
                    self._thread = None
                return
            for waitable in ready:
                self._hand_over(waitable, watches[waitable])

    def _hand_over(self, waitable: Any, watch: _Watch) -> None:
        """The next value of a ready ``waitable`` to its follower."""
        import ray

        try:
            ref = next(waitable) if watch.stream else waitable
            watch.out.put(ray.get(ref))
        except StopIteration:
            self._end(waitable, _END)
            return
        except Exception as exc:
            self._end(waitable, _Raised(exc))
            return
        if not watch.stream:
            self._end(waitable, _END)

    def _end(self, waitable: Any, last: Any) -> None:
        with self._lock:
            watch = self._watches.pop(waitable, None)
        if watch is not None:
            watch.out.put(last)
            if last is not _END:
                watch.out.put(_END)


class RemoteRun:
    """A run on the slot's actor, seen from the driver: it republishes the streamed items on the
    driver's bus and returns the run's result. A lost node ends it ``interrupted``."""

    def __init__(self, slot: RaySlot, config: RunConfig, bus: Bus, telemetry: bool) -> None:
        self.slot, self.config, self.bus, self.telemetry = slot, config, bus, telemetry

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        import ray

        cancel = cancel or threading.Event()
        spare_the_collector()
        actor, placed = self.slot.place(self.config, cancel)
        config = self.config.model_copy(update={"tags": [*self.config.tags, NODE_TAG + placed.label]})
        self.bus.emit(LogLine.note(f"'{config.name}' runs on node {placed.label}"
                                   + (f" (GPUs {', '.join(placed.gpu_ids)})" if placed.gpu_ids else "")))
        spread = self.slot.spread_placement  # passed only when there is one: a worker class may not take it
        stream = actor.run.options(num_returns="streaming").remote(
            config, self.telemetry, placed.record(), **({"placement": spread} if spread is not None else {}))

        def forward_cancel() -> bool:
            try:
                actor.cancel.remote()
            except Exception:  # the actor is gone already: nothing to cancel
                pass
            return False  # the run ends cancelled: its stream goes on to its result

        run_id: str | None = None
        try:
            for part in self.slot.fleet.waiter.follow(stream, cancel, forward_cancel):
                if isinstance(part, list):
                    for item in part:
                        if isinstance(item, Event) and isinstance(item.payload, RunStarted):
                            run_id = item.payload.run_id
                        self.bus.publish(item)
                    continue
                if isinstance(part, str):
                    raise (UserError("cancelled") if part == "cancelled" else EngineFailed(part.removeprefix("engine: ")))
                return part
        except ray.exceptions.RayActorError:
            self.slot.lost(actor)
            gone = NODE_LOST if not _node_alive(placed.node_id) else WORKER_DIED
            return self._interrupted(config, run_id, gone.format(label=placed.label))
        raise UserError(f"the trial on node {placed.label} ended without a result")

    def _interrupted(self, config: RunConfig, run_id: str | None, reason: str) -> RunResult:
        """The run's end as the driver saw it: stored ``interrupted`` (when it had started), and a
        result saying why."""
        ended = time.time()
        if run_id is not None:
            self.bus.emit(RunFinished(run_id=run_id, status="interrupted", reason=reason, ended_wall_s=ended))
        return RunResult(run_id=run_id or "", name=config.name, config=config, status="interrupted", reason=reason,
                         started_wall_s=ended, ended_wall_s=ended)


class RaySlot:
    """One slot of a campaign on the cluster: a placement group and its actor, made for the
    configuration that runs (again when the next one needs other resources) and released on
    :meth:`close`. Ray queues a placement group until a node has room: no scheduler of ours."""

    def __init__(self, fleet: RayFleet) -> None:
        self.fleet = fleet
        self._group: Any = None
        self._actor: Any = None
        self._placed: Placed | None = None
        self._resources: list[dict[str, float]] | None = None
        self._spread = False
        self._requeued: set[str] = set()

    def runner(self, config: RunConfig, bus: Bus, *, telemetry: bool) -> RunnerLike:
        return RemoteRun(self, config, bus, telemetry)

    def place(self, config: RunConfig, cancel: threading.Event) -> tuple[Any, Placed]:
        """The actor for ``config``: the current one when its resources fit, else a new placement."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = [{**bundle, **self.fleet.extra_resources} for bundle in trial_bundles(config)]
        wanted = bundles[0]
        if self._actor is not None and self._resources == bundles and self._placed is not None and self._intact():
            return self._actor, self._placed
        self.close()
        self.fleet.check_fits(bundles)
        only = self.fleet.only_nodes
        group = placement_group(bundles, strategy="STRICT_SPREAD" if len(bundles) > 1 else "STRICT_PACK",
                                bundle_label_selector=[{NODE_ID_LABEL: f"in({','.join(only)})"}] * len(bundles)
                                if only else None)
        self._group = group
        self._spread = len(bundles) > 1
        if not self.fleet.waiter.ready(group.ready(), cancel):
            self.close()
            raise UserError("cancelled")
        gpus = wanted.get("GPU", 0.0)
        worker: Any = ray.remote(self.fleet.worker).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
            num_cpus=wanted.get("CPU", 0.0), num_gpus=gpus,
            resources={k: v for k, v in wanted.items() if k not in ("CPU", "GPU")},
            max_concurrency=2, max_restarts=0)
        actor: Any = worker.remote()
        try:
            placed: Placed = ray.get(actor.where.remote())
        except ray.exceptions.RayActorError as exc:
            self.close()
            raise UserError(f"the trial's worker did not start: {str(exc).splitlines()[0]}") from None
        self._actor, self._placed, self._resources = actor, placed, bundles
        return actor, placed

    def _intact(self) -> bool:
        """Whether every bundle of the slot's placement group is still placed: a spread group that
        lost a pool engine's node waits for Ray to place that bundle again, which under
        STRICT_SPREAD may never happen, so the next trial gets a new group."""
        if not self._spread:
            return True  # a lost node ends the trial's actor, and its run asks for a new placement
        from ray.util.placement_group import placement_group_table

        try:
            return bool(placement_group_table(self._group).get("state") == "CREATED")
        except Exception:  # the cluster cannot say: place again
            return False

    @property
    def spread_placement(self) -> Any:
        """The placement group whose bundles a spread P/D group's pool engines take; None otherwise."""
        return self._group if self._spread else None

    def lost(self, actor: Any) -> None:
        if actor is self._actor:
            self._actor, self._placed = None, None
            self.close()

    def requeue(self, run: RunResult) -> bool:
        """A run whose node was lost runs again once (its placement goes: Ray places the next one
        on a node that is alive)."""
        key = run.config.name + "|" + ",".join(t for t in run.config.tags if not t.startswith(NODE_TAG))
        if not (run.reason or "").startswith(LOST_PREFIXES) or key in self._requeued:
            return False
        self._requeued.add(key)
        self.close()
        return True

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        actor, group = self._actor, self._group
        self._actor, self._group, self._placed, self._resources, self._spread = None, None, None, None, False
        if actor is not None:
            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # gone with its node, or stuck: killing it stops the engine (watchdog)
                pass
            try:
                ray.kill(actor)
            except Exception:
                pass
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:
                pass


class RayFleet:
    """Slots on a connected cluster (``app.fleet.cluster.connect`` first)."""

    def __init__(self, extra_resources: dict[str, float] | None = None, only_nodes: list[str] | None = None,
                 worker: type[TrialWorker] | None = None) -> None:
        self.worker = worker or TrialWorker
        """The actor class of each slot (a benchmark passes one whose engine only sleeps)."""
        self.extra_resources = dict(extra_resources or {})
        """Resources every trial also asks for (a custom resource keeps trials on chosen nodes)."""
        self.only_nodes = list(only_nodes or [])
        """Ray node ids trials may use (those that passed the preflight); empty: any."""
        self.waiter = Waiter()
        """The one thread that waits for every placement and stream of its trials."""

    def new_slot(self) -> RaySlot:
        return RaySlot(self)

    def check_fits(self, bundles: list[dict[str, float]]) -> None:
        """A trial the live nodes could never hold is refused in one line, instead of waiting
        forever: one bundle on one node, or each of a spread trial's bundles on a node of its own."""
        from app.fleet.cluster import nodes

        live = [v for v in nodes(reports=False) if v.alive and (not self.only_nodes or v.node_id in self.only_nodes)]
        plural = "s" if len(live) != 1 else ""
        if len(bundles) == 1:
            if any(fits(v.total, bundles[0]) for v in live):
                return
            raise UserError(f"no node of the cluster can hold a trial that needs {need_text(bundles[0])} on one node "
                            f"({len(live)} live node{plural})")
        if spread_fits([v.total for v in live], bundles):
            return
        raise UserError(f"the P/D group's {len(bundles)} pool engines each need a node of their own "
                        f"({'; '.join(need_text(b) for b in bundles)}), and the cluster's {len(live)} live "
                        f"node{plural} cannot hold them so: shrink the pools, or set disaggregation.placement = "
                        "'together'")

    def default_parallel(self, config: RunConfig) -> int:
        """How many trials of ``config`` the cluster's free resources hold at once (at least 1)."""
        from app.fleet.cluster import nodes

        bundles = [{**bundle, **self.extra_resources} for bundle in trial_bundles(config)]
        return trials_at_once(nodes(reports=False), bundles, self.only_nodes)


def fits(total: dict[str, float], wanted: dict[str, float]) -> bool:
    return all(total.get(k, 0.0) >= amount for k, amount in wanted.items())


def smallest(bundles: list[dict[str, float]]) -> dict[str, float]:
    """What every bundle asks for at least, resource by resource: a node that cannot hold this
    holds no bundle of the trial."""
    return {k: min(b.get(k, 0.0) for b in bundles) for k in {k for b in bundles for k in b}}


def need_text(wanted: dict[str, float]) -> str:
    return ", ".join(f"{k} {amount:g}" for k, amount in sorted(wanted.items()))


def spread_fits(totals: list[dict[str, float]], bundles: list[dict[str, float]]) -> bool:
    """Whether each bundle can have a node of its own among ``totals`` (a matching: every bundle
    tries every node not yet taken)."""
    taken: dict[int, int] = {}  # node -> bundle

    def place(bundle: int, seen: set[int]) -> bool:
        for node, total in enumerate(totals):
            if node in seen or not fits(total, bundles[bundle]):
                continue
            seen.add(node)
            if node not in taken or place(taken[node], seen):
                taken[node] = bundle
                return True
        return False

    return len(bundles) <= len(totals) and all(place(b, set()) for b in range(len(bundles)))


def trials_at_once(views: list[Any], bundles: list[dict[str, float]], only_nodes: list[str] | None = None) -> int:
    """How many trials needing ``bundles`` (``trial_bundles``) the free resources of the live
    ``views`` (``app.fleet.cluster.NodeView``) hold at once, at least 1: the default of
    ``--parallel`` and of the GUI's "trials at once". A spread trial takes a node per bundle."""
    live = [v for v in views if v.alive and (not only_nodes or v.node_id in only_nodes)]
    if len(bundles) > 1:
        return max(1, sum(1 for v in live if fits(v.free, bundles[-1])) // len(bundles))
    total = 0
    for view in live:
        held = [int(view.free.get(k, view.total.get(k, 0.0)) // amount) for k, amount in bundles[0].items() if amount > 0]
        total += min(held) if held else 0
    return max(1, total)
