"""A P/D group's pools spread over a cluster's nodes. The trial's placement group has a bundle per
pool engine, each on a node of its own (``trial_bundles``). The trial's actor, in the first
bundle, starts the first decode engine, the router and the load client; every other pool engine
starts from an actor of its own in its bundle (:class:`PoolEngineWorker`), on its node's address,
and streams its log, phases and exit back. The actors are the trial actor's children: when it
dies, Ray ends them, and each engine's watchdog stops the engine."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from engine_adapters.base import EngineAdapter
from engine_adapters.config import Features, PdRole
from engine_adapters.launcher import EngineProcess, EngineStartError, ExitCallback, LogCallback, PhaseCallback
from engine_adapters.pd_group import DisaggregatedStartError, PoolMember, PoolSeat, launch_here
from engine_adapters.process_group import STOP_GRACE_S
from engine_adapters.secrets import mask_obj, mask_text

WAIT_SLICE_S = 0.5
"""How often a wait for a remote engine's readiness looks at the run's cancel."""
STOP_ANSWER_S = 30.0
"""Beyond the stop's own grace, how long a remote stop may take before its node is given up on
(its engine's watchdog stops the engine when the actor is killed)."""
EVENTS_MAX = 500
FOLLOW_END_S = 5.0
"""How long a stop waits for a stopped engine's last log lines to arrive."""


def bundle_index(role: PdRole, index: int, features: Features) -> int:
    """Where a pool engine sits in a spread trial's bundles (``trial_bundles``): the first decode
    engine's bundle first, then each prefill engine's, then the other decode engines'."""
    if role == "decode":
        return 0 if index == 0 else features.pool_instances("prefill") + index
    return 1 + index


class PoolEngineWorker:
    """The actor of one pool engine on its node (created through ``ray.remote`` by
    :class:`RayPoolLauncher`)."""

    def __init__(self) -> None:
        self._process: EngineProcess | None = None
        self._events: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._cancel = threading.Event()

    def start(self, seat: PoolSeat, adapter: EngineAdapter) -> dict[str, Any]:
        """Starts the engine on this node's address; where it listens, and its side port."""
        import ray

        host = ray.util.get_node_ip_address()
        seat = replace(seat, engine=seat.engine.model_copy(update={"host": host}))
        events = self._events
        launched = launch_here(
            seat, adapter, lambda line: events.put(("log", line)),
            lambda phase, detail: events.put(("phase", phase, detail)),
            lambda code, diagnosis: events.put(("exit", code, str(diagnosis) if diagnosis is not None else None)))
        process = launched.process
        assert isinstance(process, EngineProcess)
        self._process = process
        return {"base_url": process.base_url, "side_port": launched.side_port, "argv": mask_obj(list(process.argv)),
                "host": host, "node_id": ray.get_runtime_context().get_node_id()}

    def wait_ready(self, timeout_s: float | None) -> str | None:
        """None once the engine answers; else why it did not, in one line."""
        assert self._process is not None
        try:
            self._process.wait_ready(timeout_s, cancel=self._cancel)
        except EngineStartError as exc:
            return mask_text(str(exc.diagnosis or exc))
        return None

    def cancel(self) -> None:
        self._cancel.set()

    def events(self) -> Iterator[list[tuple[Any, ...]]]:
        """The engine's log lines, phases and exit, in batches, until it is stopped."""
        while True:
            first = self._events.get()
            batch: list[tuple[Any, ...]] = []
            item = first
            while item is not None:
                batch.append(item)
                if len(batch) >= EVENTS_MAX:
                    break
                try:
                    item = self._events.get_nowait()
                except queue.Empty:
                    break
            if batch:
                yield batch
            if item is None:
                return

    def stop(self, grace_s: tuple[float, float, float]) -> str:
        text = self._process.stop(grace_s) if self._process is not None else "never started"
        self._events.put(None)
        return text


class RemotePoolEngine:
    """A pool engine on another node, as the group sees it (``PoolEngine``): its URL on that
    node's address; its log, phases and exit as its actor streams them."""

    def __init__(self, actor: Any, started: dict[str, Any], seat: PoolSeat, on_log: LogCallback | None,
                 on_phase: PhaseCallback | None, on_exit: ExitCallback | None) -> None:
        self.actor, self.seat = actor, seat
        self.argv: list[str] = list(started["argv"])
        self.host: str = started["host"]
        self.diagnosis: Any = None
        self._base_url: str = started["base_url"]
        self._on_log, self._on_phase, self._on_exit = on_log, on_phase, on_exit
        self._exited = threading.Event()
        self._stopping = False
        self._follower = threading.Thread(target=self._follow, daemon=True, name=f"pool-{seat.role}-{seat.index}")
        self._follower.start()

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def pid(self) -> int | None:
        """None: its process lives on another node (its actor stops it)."""
        return None

    def is_running(self) -> bool:
        return not self._exited.is_set()

    def _follow(self) -> None:
        import ray

        try:
            for ref in self.actor.events.options(num_returns="streaming").remote():
                for event in ray.get(ref):
                    self._hand(event)
        except Exception as exc:  # the actor or its node is gone
            if not self._stopping and not self._exited.is_set():
                self._ended(None, f"{self.seat.name} on {self.host}: its worker or node was lost "
                                  f"({type(exc).__name__})")

    def _hand(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "log" and self._on_log is not None:
            self._on_log(event[1])
        elif kind == "phase" and self._on_phase is not None:
            self._on_phase(event[1], event[2])
        elif kind == "exit":
            self._ended(event[1], event[2])

    def _ended(self, code: int | None, diagnosis: str | None) -> None:
        self.diagnosis = diagnosis
        self._exited.set()
        if self._on_exit is not None and not self._stopping:
            self._on_exit(code if code is not None else -1, None)

    def wait_ready(self, timeout_s: float | None = None, cancel: threading.Event | None = None) -> None:
        import ray

        ref = self.actor.wait_ready.remote(timeout_s)
        told = False
        while not ray.wait([ref], timeout=WAIT_SLICE_S)[0]:
            if cancel is not None and cancel.is_set() and not told:
                self.actor.cancel.remote()
                told = True
        try:
            error = ray.get(ref)
        except Exception as exc:
            raise EngineStartError(f"its worker on {self.host} was lost ({type(exc).__name__})") from None
        if error is not None:
            raise EngineStartError(error)

    def stop(self, grace_s: tuple[float, float, float] = STOP_GRACE_S) -> str:
        import ray

        self._stopping = True
        try:
            done = str(ray.get(self.actor.stop.remote(grace_s), timeout=sum(grace_s) + STOP_ANSWER_S)) + f" (on {self.host})"
            self._follower.join(FOLLOW_END_S)  # the engine's last lines, before its actor goes
            return done
        except Exception as exc:
            return f"its node did not answer ({type(exc).__name__}): its watchdog stops it"
        finally:
            try:
                ray.kill(self.actor, no_restart=True)
            except Exception:  # gone already
                pass


class RayPoolLauncher:
    """Places a spread P/D group's pool engines in the trial's placement group
    (``engine_adapters.pd_group.PoolLauncher``): the first decode engine here, on this node's
    address, every other one from an actor in its own bundle."""

    def __init__(self, placement: Any, bundles: list[dict[str, float]], features: Features,
                 cancel: threading.Event | None = None) -> None:
        self.placement, self.bundles, self.features = placement, bundles, features
        self.cancel = cancel or threading.Event()
        """The run's: a pool engine whose actor is still being placed stops being waited for."""
        self.actors: list[Any] = []

    def __call__(self, seat: PoolSeat, adapter: EngineAdapter, on_log: LogCallback | None,
                 on_phase: PhaseCallback | None, on_exit: ExitCallback | None) -> PoolMember:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        index = bundle_index(seat.role, seat.index, self.features)
        if index == 0:  # beside the router and the client, on this node's address (the others reach it)
            here = replace(seat, engine=seat.engine.model_copy(update={"host": ray.util.get_node_ip_address()}))
            return launch_here(here, adapter, on_log, on_phase, on_exit, ray.get_runtime_context().get_node_id())
        wanted = self.bundles[index]
        actor: Any = ray.remote(PoolEngineWorker).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=index),
            num_cpus=wanted.get("CPU", 0.0), num_gpus=wanted.get("GPU", 0.0),
            resources={k: v for k, v in wanted.items() if k not in ("CPU", "GPU")},
            max_concurrency=4, max_restarts=0).remote()
        self.actors.append(actor)
        starting = actor.start.remote(seat, adapter)
        deadline = time.monotonic() + seat.engine.startup_timeout_s
        while not ray.wait([starting], timeout=WAIT_SLICE_S)[0]:  # placed when its bundle's node has room
            if self.cancel.is_set():
                raise DisaggregatedStartError(f"{seat.name}: cancelled while its actor was being placed")
            if time.monotonic() > deadline:
                raise DisaggregatedStartError(f"{seat.name}: its bundle of the trial's placement was not placed within "
                                              f"{seat.engine.startup_timeout_s:g} s (a node of the group lost?)")
        try:
            started: dict[str, Any] = ray.get(starting)
        except Exception as exc:
            said = str(exc).strip().splitlines()
            raise DisaggregatedStartError(f"{seat.name} did not start on its node: "
                                          f"{mask_text(said[-1] if said else type(exc).__name__)}") from None
        if on_log is not None:
            on_log(f"[{seat.name}] runs on node {started['host']} (bundle {index} of the trial's placement)")
        return PoolMember(seat.role, seat.index, int(started["side_port"]),
                          RemotePoolEngine(actor, started, seat, on_log, on_phase, on_exit), str(started["node_id"]))

    def close(self) -> None:
        """Ends every pool engine's actor (each engine's watchdog stops what its stop did not)."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self.actors.clear()
