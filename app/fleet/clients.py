"""Load from many hosts: the run's client workers as Ray actors, one per node of a placement group
spread over K nodes. Each level is split as it is between local worker processes
(``app.load.procs.split_plan``), each worker times with its own monotonic clock, the level starts
at a barrier (every worker armed, then all told to go), and the records merge into one level on
the driver. The run notes how far apart the hosts started (docs/fleet.md)."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from app.errors import UserError
from app.load.procs import ClientPool, ClientProcessError, Job, done_message, run_job

SEND_EVERY_S = 0.1
CLIENT_CPUS = 1.0


class ClientWorker:
    """One client worker on its node (a Ray actor): armed with its share of a level, then run as a
    streaming generator of the same messages a local client process sends."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._job: Job | None = None
        self._cancel = threading.Event()

    def where(self) -> tuple[int, str, str]:
        import ray

        return os.getpid(), socket.gethostname(), ray.get_runtime_context().get_node_id()

    def arm(self, job: Job) -> None:
        self._job, self._cancel = job, threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def go(self) -> Iterator[list[tuple[str, int, Any]]]:
        job = self._job
        if job is None:
            raise RuntimeError("go before arm")
        mailbox: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        mailbox.put(("started", self.k, time.time()))

        def work() -> None:
            try:
                mailbox.put(done_message(self.k, run_job(self.k, job, mailbox, self._cancel)))
            except BaseException as exc:
                mailbox.put(("crashed", self.k, f"{type(exc).__name__}: {exc}"))

        thread = threading.Thread(target=work, name=f"client-{self.k}", daemon=True)
        thread.start()
        while True:
            batch = []
            try:
                batch.append(mailbox.get(timeout=SEND_EVERY_S))
                while True:
                    batch.append(mailbox.get_nowait())
            except queue.Empty:
                pass
            if batch:
                yield batch
            if not thread.is_alive() and mailbox.empty():
                return


class _RemoteCancel:
    """The pool's cancel flag: setting it tells every worker to stop sending."""

    def __init__(self, pool: RayClientPool) -> None:
        self.pool = pool
        self._set = threading.Event()

    def set(self) -> None:
        if not self._set.is_set():
            self._set.set()
            for actor in self.pool.actors:
                try:
                    actor.cancel.remote()
                except Exception:  # gone with its node: nothing to stop
                    pass

    def is_set(self) -> bool:
        return self._set.is_set()


class RayClientPool(ClientPool):
    """``nodes`` client workers, one per node (``STRICT_SPREAD``), for a run against an endpoint."""

    def __init__(self, nodes: int, *, on_note: Any = None) -> None:
        super().__init__(nodes, on_note=on_note)
        self.workers = nodes
        self.actors: list[Any] = []
        self.hosts: list[str] = []
        self._group: Any = None
        self._readers: list[threading.Thread] = []
        self._lost: dict[int, str] = {}

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.actors:
            return
        self._results = queue.Queue()
        self._cancel = _RemoteCancel(self)
        group = placement_group([{"CPU": CLIENT_CPUS}] * self.workers, strategy="STRICT_SPREAD")
        if not ray.wait([group.ready()], timeout=60)[0]:
            ray.util.remove_placement_group(group)
            raise UserError(f"the cluster has no {self.workers} nodes with a free core each for the client "
                            "(--client-nodes asks for one worker per node)")
        self._group = group
        worker = ray.remote(ClientWorker)
        self.actors = [worker.options(num_cpus=CLIENT_CPUS, max_concurrency=2, scheduling_strategy=(
            PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k))).remote(k)
            for k in range(self.workers)]

    def _wait_ready(self, cancel: Any) -> None:
        import ray

        if self.hosts:
            return
        try:
            where = ray.get([a.where.remote() for a in self.actors], timeout=120)
        except Exception as exc:
            raise ClientProcessError(f"the client workers did not start on the cluster: {exc}") from None
        self.pids = []  # they run on other hosts: none is a process of this machine
        self.hosts = [f"{host}/{node_id[:8]}" for _pid, host, node_id in where]
        if self.on_note is not None:
            self.on_note(f"the load client runs on {len(self.hosts)} nodes: {', '.join(self.hosts)}")

    def _dispatch(self, jobs: list[Job]) -> None:
        """The barrier: every worker armed with its share first, then all told to go at once."""
        import ray

        ray.get([actor.arm.remote(job) for actor, job in zip(self.actors, jobs, strict=True)])
        streams = [actor.go.options(num_returns="streaming").remote() for actor in self.actors]
        self._readers = [threading.Thread(target=self._read, args=(k, stream), daemon=True, name=f"client-read-{k}")
                         for k, stream in enumerate(streams)]
        for reader in self._readers:
            reader.start()

    def _read(self, k: int, stream: Any) -> None:
        import ray

        try:
            for ref in stream:
                for message in ray.get(ref):
                    self._results.put(message)
        except ray.exceptions.RayActorError:
            host = self.hosts[k] if k < len(self.hosts) else str(k)
            self._results.put(("crashed", k, f"the client worker on node {host} was lost"))

    def _check_alive(self, pending: set[int]) -> None:
        """Workers report their own end (or their loss) through the results."""

    def start_skew_note(self, label: str, started_wall_s: dict[int, float]) -> str:
        spread_ms = (max(started_wall_s.values()) - min(started_wall_s.values())) * 1e3
        return (f"level {label}: started on {len(started_wall_s)} hosts within {spread_ms:.1f} ms of each other "
                "(their wall clocks; each worker times its requests with its own monotonic clock)")

    def close(self, timeout_s: float = 5.0) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._cancel is not None:
            self._cancel.set()
        for reader in self._readers:
            reader.join(timeout_s)
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:
                pass
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception:
                pass
        self.actors, self._readers, self._group, self._results, self._cancel = [], [], None, None, None
