"""The fleet on a local Ray cluster: how well trials run side by side, and whether the driver keeps
up with the request records the trials stream back.

A head (no CPUs: it holds no trial) and 4 worker nodes of 2 CPUs each start on this machine as
the fleet's tests start theirs (``tests/ray_cluster.py``: 127.0.0.1 only, a temporary
``RAY_TMPDIR``, shut down through its handle). Each node holds one trial of a CPU engine. The
slots' actor is :class:`SleepyWorker`: its "engine start" is a sleep, so a trial costs what an
engine start costs without taking a core (the 2 cores here would otherwise decide the result),
and its run publishes what a real run publishes (``RunStarted``, ``EngineReady``, the level, a
``RequestDone`` per request, ``Progress``, ``RunFinished``) through ``TrialWorker``'s own
streaming. Everything on the driver is the product's: the campaign, ``RayFleet``'s placements,
the streaming generator, the slot buses, a ``RunRecorder`` per slot into one SQLite store.

- **Parallel efficiency:** 8 trials at 1, 2 and 4 slots; efficiency at P slots = serial wall time
  / (P x wall time at P). Target: >= 0.85 at 2 and 4 slots. Measured twice: *warm*, with the
  slots' placements and actors made once beforehand and kept between the campaigns (what is
  judged: it measures the trials, not Ray starting a Python process per slot on a shared
  2-core machine), and *cold*, each campaign placing its own slots (printed, with the time to
  place 4 slots at once: a real engine start of 30 s or more amortises it).
- **Streaming:** 4 trials at once, each publishing its records at a quarter of ``--records-per-s``
  for ``--stream-s`` seconds. Target: the driver takes in and stores at least 20,000 records a
  second of wall-clock time, measured over the stored window (records stored / (the last run
  stored - the first record sent)), and every record sent is stored. Here the workers that send
  share the machine's cores with the driver, which on a real cluster they would not, so the rate
  offered is printed beside it (a miss with less offered than the target is this machine's, and
  still a miss), and so is the driver's CPU time a record (a projection, not judged).

    .venv/bin/python benchmarks/fleet.py [--quick] [--engine-start-s 3] [--trials 8]
                                         [--records-per-s 25000] [--stream-s 5]

Takes about 2 minutes (``--quick``: under 1). Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from repo_path import ROOT

from app.bus import Bus, Event
from app.campaign import Campaign, Step, StepResult
from app.config import RunConfig
from app.events import (
    EngineReady,
    LevelFinished,
    LevelStarted,
    Progress,
    RequestDone,
    RequestsDone,
    RunFinished,
    RunStarted,
)
from app.fleet.trial import BATCH_INTERVAL_S, MAX_BATCH_ITEMS, RayFleet, RaySlot, TrialWorker
from app.load.metrics import LevelSummary, RequestRecord
from app.profiles import read_profile
from app.recording import RunRecorder
from app.runner import LevelResult, RunResult
from app.store import RunStore

EFFICIENCY_TARGET = 0.85
RECORDS_TARGET_PER_S = 20_000.0
WORKER_NODES = 4
PARALLEL = (1, 2, 4)
PROGRESS_INTERVAL_S = 0.5
OUTPUT_TOKENS = 32


def record(index: int, t0_wall_s: float) -> RequestRecord:
    """A completed request as the client records one: 32 output tokens, their 31 inter-token gaps."""
    itl_ms = [20.0 + (index + k) % 7 for k in range(OUTPUT_TOKENS - 1)]
    ttft_ms = 80.0 + index % 13
    e2e_ms = ttft_ms + sum(itl_ms)
    start_s = index * 0.01
    return RequestRecord(level=0, index=index, scheduled_s=start_s, start_s=start_s, start_wall_s=t0_wall_s + start_s,
                         queue_ms=0.1, ttft_ms=ttft_ms, itl_ms=itl_ms, tpot_ms=sum(itl_ms) / len(itl_ms), e2e_ms=e2e_ms,
                         input_tokens=64, input_tokens_counted=64, output_tokens=OUTPUT_TOKENS,
                         expected_output_tokens=OUTPUT_TOKENS, chunks=OUTPUT_TOKENS, finish_reason="length", ok=True,
                         request_id=f"bench-{index}")


def level_summary(records: Sequence[RequestRecord], duration_s: float) -> LevelSummary:
    """The level's totals (the store computes every figure from the stored records; the client's
    per-record accumulator would cost the stand-in more CPU than sending does)."""
    output_tokens = sum(r.output_tokens for r in records)
    input_tokens = sum(r.input_tokens or 0 for r in records)
    duration_s = max(duration_s, 1e-9)
    return LevelSummary(requests=len(records), completed=len(records), duration_s=duration_s,
                        input_tokens=input_tokens, output_tokens=output_tokens,
                        request_throughput_rps=len(records) / duration_s, output_tok_per_s=output_tokens / duration_s,
                        total_tok_per_s=(input_tokens + output_tokens) / duration_s)


class SleepyWorker(TrialWorker):
    """A slot's actor whose engine start is a sleep of ``engine_start_s``; its run then publishes
    ``num_requests`` request records (at ``records_per_s``, or as fast as it can when 0) and
    streams them to the driver exactly as a real trial's (``TrialWorker._stream``)."""

    engine_start_s: ClassVar[float] = 3.0
    records_per_s: ClassVar[float] = 0.0

    @classmethod
    def tuned(cls, engine_start_s: float, records_per_s: float = 0.0) -> type[SleepyWorker]:
        """A subclass with these settings (the actor is made by Ray with no arguments)."""
        return type("SleepyWorker", (cls,), {"engine_start_s": engine_start_s, "records_per_s": records_per_s})

    def run(self, config: RunConfig, telemetry: bool, node: dict[str, Any],
            batch_interval_s: float = BATCH_INTERVAL_S, max_batch: int = MAX_BATCH_ITEMS) -> Iterator[Any]:
        yield from self._stream(lambda bus, cancel: self._sleep_and_send(config, node, bus, cancel),
                                batch_interval_s, max_batch)

    def _sleep_and_send(self, config: RunConfig, node: dict[str, Any], bus: Bus,
                        cancel: threading.Event) -> RunResult | str:
        run_id, t0_wall_s = uuid.uuid4().hex, time.time()
        hardware = {"cpu_model": "benchmark stand-in", "node": node}
        bus.emit(RunStarted(run_id=run_id, name=config.name, tags=list(config.tags), config=config,
                            engine_kind=config.engine.kind, model=config.engine.model, hardware=hardware,
                            started_wall_s=t0_wall_s))
        start_s = time.monotonic()
        records = [record(i, t0_wall_s) for i in range(config.workload.num_requests)]  # while the "engine" starts
        if cancel.wait(max(0.0, self.engine_start_s - (time.monotonic() - start_s))):
            return "cancelled"
        bus.emit(EngineReady(run_id=run_id, base_url="http://127.0.0.1:1", startup_s=self.engine_start_s))
        c = config.load.concurrency
        level_wall_s = time.time()
        bus.emit(LevelStarted(run_id=run_id, index=0, label=f"c{c}", mode="closed", concurrency=c,
                              started_wall_s=level_wall_s, num_requests=len(records)))
        level_s = time.monotonic()
        next_progress_s = level_s + PROGRESS_INTERVAL_S
        for i, rec in enumerate(records):
            now_s = time.monotonic()
            if self.records_per_s > 0:
                ahead_s = level_s + i / self.records_per_s - now_s
                if ahead_s > 0.002:
                    time.sleep(ahead_s)
            bus.emit(RequestDone(run_id=run_id, record=rec))
            if now_s >= next_progress_s:
                next_progress_s = now_s + PROGRESS_INTERVAL_S
                elapsed_s = now_s - level_s
                bus.emit(Progress(run_id=run_id, level=0, planned=len(records), requests_done=i + 1, errors=0,
                                  requests_in_flight=c, output_tokens=(i + 1) * OUTPUT_TOKENS, elapsed_s=elapsed_s,
                                  output_tok_per_s=(i + 1) * OUTPUT_TOKENS / max(elapsed_s, 1e-9)))
        summary = level_summary(records, time.monotonic() - level_s)
        bus.emit(LevelFinished(run_id=run_id, index=0, label=f"c{c}", summary=summary))
        result = RunResult(run_id=run_id, name=config.name, config=config, hardware=hardware, model=config.engine.model,
                           started_wall_s=t0_wall_s, startup_s=self.engine_start_s,
                           levels=[LevelResult(index=0, label=f"c{c}", mode="closed", concurrency=c,
                                               started_wall_s=level_wall_s, summary=summary)])
        result.ended_wall_s = time.time()
        bus.emit(RunFinished(run_id=run_id, status="completed", ended_wall_s=result.ended_wall_s,
                             summary=result.summary()))
        return result


@dataclass
class KeptSlot:
    """A slot of :class:`KeptFleet`: its runs run on a kept placement; closing it keeps that."""

    fleet: KeptFleet
    inner: RaySlot

    def runner(self, config: RunConfig, bus: Bus, *, telemetry: bool) -> Any:
        return self.inner.runner(config, bus, telemetry=telemetry)

    def requeue(self, run: RunResult) -> bool:
        return self.inner.requeue(run)

    def close(self) -> None:
        self.fleet.give_back(self.inner)


@dataclass
class KeptFleet:
    """Slots placed once (:meth:`place`) and kept between campaigns, so a timed campaign measures
    its trials, not the placement groups and actor processes Ray makes for a new slot."""

    fleet: RayFleet
    idle: list[RaySlot] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def place(self, config: RunConfig, slots: int) -> float:
        """Places ``slots`` slots at once for ``config``; returns the wall time it took."""
        made = [self.fleet.new_slot() for _ in range(slots)]
        start_s = time.perf_counter()
        threads = [threading.Thread(target=s.place, args=(config, threading.Event())) for s in made]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.idle.extend(made)
        return time.perf_counter() - start_s

    def new_slot(self) -> KeptSlot:
        with self.lock:
            return KeptSlot(self, self.idle.pop() if self.idle else self.fleet.new_slot())

    def give_back(self, slot: RaySlot) -> None:
        with self.lock:
            self.idle.append(slot)

    def close(self) -> None:
        for slot in self.idle:
            slot.close()
        self.idle.clear()


@dataclass
class Campaigned:
    """One timed campaign: its wall time and what it ran and stored."""

    wall_s: float
    runs: list[RunResult]
    stored_ids: list[int]


def campaign(steps: Sequence[Step], fleet: Any, store: RunStore, parallel: int,
             on_slot_bus: Callable[[Bus], None] | None = None,
             on_step_done: Callable[[int, StepResult], None] | None = None) -> Campaigned:
    """The steps run as a campaign on ``fleet`` with ``parallel`` slots, recorded into ``store``."""
    bus = Bus()
    recorder = RunRecorder(bus, store)
    try:
        start_s = time.perf_counter()
        result = Campaign(steps, bus, fleet=fleet, recorder=recorder, telemetry=False, on_slot_bus=on_slot_bus,
                          on_step_done=on_step_done).run(max_parallel=parallel)
        wall_s = time.perf_counter() - start_s
    finally:
        recorder.close()
    bad = [f"{r.name}: {r.status} ({r.reason})" for r in result.runs if r.status != "completed"]
    if result.status != "completed" or bad or len(result.runs) != len(steps):
        raise SystemExit(f"the campaign at {parallel} slot(s) did not complete: {result.reason}; {bad}")
    return Campaigned(wall_s, result.runs, [i for s in result.steps for i in s.stored_ids])


def trial_steps(config: RunConfig, trials: int, records: int, label: str) -> list[Step]:
    """``trials`` steps of ``config`` (each one trial: an engine start and a run of ``records`` requests)."""
    workload = config.workload.model_copy(update={"num_requests": records})
    return [Step(f"{label} {n + 1}", config.model_copy(update={"name": f"{label} {n + 1}", "workload": workload}))
            for n in range(trials)]


def efficiency(fleet: Any, steps: Sequence[Step], store: RunStore, label: str) -> bool:
    """Wall time at each number of slots and the efficiency against 1 slot; True when on target."""
    walls_s = {p: campaign(steps, fleet, store, p).wall_s for p in PARALLEL}
    serial_s = walls_s[1]
    ok = True
    print(f"{label}: {len(steps)} trials, 1 slot: {serial_s:.2f} s ({serial_s / len(steps):.2f} s a trial)")
    for p in PARALLEL[1:]:
        eff = serial_s / (p * walls_s[p])
        ok &= eff >= EFFICIENCY_TARGET
        print(f"{label}: {len(steps)} trials, {p} slots: {walls_s[p]:.2f} s, efficiency {eff:.2f} "
              f"(target >= {EFFICIENCY_TARGET})")
    return ok


class Arrivals:
    """Counts the request records that reach the slot buses, with the first one's send time (the
    worker stamped it) and the last one's arrival."""

    def __init__(self) -> None:
        self.sub = Bus().subscribe(maxlen=50_000_000, kinds=(RequestDone, RequestsDone))
        self.count = 0
        self.first_sent_wall_s = float("inf")
        self.last_sent_wall_s = 0.0
        self.last_arrived_wall_s = 0.0
        self.last_stored_wall_s = 0.0
        self.cpu_at_first_s = self.cpu_at_stored_s = 0.0
        """The driver's CPU time when the first record arrived and when the last run was stored."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="arrivals", daemon=True)
        self._thread.start()

    def attach(self, bus: Bus) -> None:
        bus.attach(self.sub)

    def stored(self) -> None:
        """A step is done: its run's records are stored (the campaign flushed its recorder)."""
        self.last_stored_wall_s = time.time()
        self.cpu_at_stored_s = time.process_time()

    def _loop(self) -> None:
        while not (self._stop.is_set() and not len(self.sub)):
            items = self.sub.drain(timeout_s=0.05)
            if not items:
                continue
            arrived_s = time.time()
            if not self.count:
                self.cpu_at_first_s = time.process_time()
            sent = [item.t_wall for item in items if isinstance(item, Event)]
            self.count += sum(len(item.payload.rows) if isinstance(item.payload, RequestsDone) else 1
                              for item in items if isinstance(item, Event))
            self.first_sent_wall_s = min(self.first_sent_wall_s, min(sent))
            self.last_sent_wall_s = max(self.last_sent_wall_s, max(sent))
            self.last_arrived_wall_s = arrived_s

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def streaming(config: RunConfig, store: RunStore, records_per_s: float, stream_s: float) -> bool:
    """4 trials at once, each sending its share of ``records_per_s`` for ``stream_s``: the
    driver's intake and what it stored against what was sent; True when on target."""
    per_trial_per_s = records_per_s / WORKER_NODES
    steps = trial_steps(config, WORKER_NODES, int(per_trial_per_s * stream_s), "stream")
    fleet = RayFleet(worker=SleepyWorker.tuned(engine_start_s=1.0, records_per_s=per_trial_per_s))
    arrivals = Arrivals()
    cpu_start_s = time.process_time()
    try:
        done = campaign(steps, fleet, store, WORKER_NODES, on_slot_bus=arrivals.attach,
                        on_step_done=lambda _index, _step: arrivals.stored())
    finally:
        arrivals.close()
    driver_cpu_s = time.process_time() - cpu_start_s
    stored_wall_s = arrivals.last_stored_wall_s
    sent = sum(lv.summary.requests for r in done.runs for lv in r.levels)
    stored = sum(store.get_run(i).n_requests for i in done.stored_ids)
    dropped_on_bus = sum(store.get_run(i).dropped_items or 0 for i in done.stored_ids)
    send_s = arrivals.last_sent_wall_s - arrivals.first_sent_wall_s
    intake_s = arrivals.last_arrived_wall_s - arrivals.first_sent_wall_s
    stored_s = stored_wall_s - arrivals.first_sent_wall_s
    stored_per_s = stored / stored_s if stored_s > 0 else 0.0
    dropped = sent - stored
    print(f"streaming: {WORKER_NODES} trials at once sent {sent:,} records in {send_s:.2f} s "
          f"({sent / max(send_s, 1e-9):,.0f} records/s offered); {arrivals.count:,} reached the slot buses by "
          f"{intake_s:.2f} s after the first was sent ({arrivals.count / max(intake_s, 1e-9):,.0f} records/s, the last "
          f"{arrivals.last_arrived_wall_s - arrivals.last_sent_wall_s:.2f} s after it was sent)")
    print(f"streaming: {stored:,} stored by {stored_s:.2f} s after the first was sent: {stored_per_s:,.0f} records/s "
          f"(target >= {RECORDS_TARGET_PER_S:,.0f}); dropped {dropped:,} (the recorders counted {dropped_on_bus:,}; "
          f"target 0)")
    window_cpu_s = arrivals.cpu_at_stored_s - arrivals.cpu_at_first_s
    cpu_per_record_s = window_cpu_s / max(stored, 1)
    print(f"streaming: the driver spent {driver_cpu_s:.2f} CPU s on the campaign, {window_cpu_s:.2f} s of it from the "
          f"first record's arrival to the last run stored: {cpu_per_record_s * 1e6:.0f} us a record (a projection, "
          f"not judged: one core of its own would take in {1 / max(cpu_per_record_s, 1e-12):,.0f} records/s; here "
          f"the 4 workers, Ray and the machine's other work share {os.cpu_count()} cores with it; load average "
          f"{os.getloadavg()[0]:.1f})")
    offered_per_s = sent / max(send_s, 1e-9)
    met = stored_per_s >= RECORDS_TARGET_PER_S and dropped == 0 and dropped_on_bus == 0
    print(f"streaming: judged: records stored a second of wall-clock time over the stored window, "
          f"{stored_per_s:,.0f} (target >= {RECORDS_TARGET_PER_S:,.0f}), and nothing dropped"
          + ("" if met or offered_per_s >= RECORDS_TARGET_PER_S else
             f"; the workers offered only {offered_per_s:,.0f} records/s on this machine's cores"))
    return met


def efficiency_warm_and_cold(config: RunConfig, steps: Sequence[Step], store: RunStore, engine_start_s: float) -> bool:
    """Efficiency with kept slots (judged), then with each campaign placing its own (printed)."""
    worker = SleepyWorker.tuned(engine_start_s)
    kept = KeptFleet(RayFleet(worker=worker))
    try:
        placed_s = kept.place(config, WORKER_NODES)
        print(f"warm: {WORKER_NODES} slots placed at once in {placed_s:.2f} s (placement groups and actors)")
        ok = efficiency(kept, steps, store, "warm")
    finally:
        kept.close()
    efficiency(RayFleet(worker=worker), steps, store, "cold (not judged)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 trials of a 2 s engine start, 3 s of streaming")
    parser.add_argument("--engine-start-s", type=float, default=3.0, help="each trial's sleep for its engine start")
    parser.add_argument("--trials", type=int, default=8, help="trials of each efficiency campaign")
    parser.add_argument("--records", type=int, default=200, help="records each of those trials sends")
    parser.add_argument("--records-per-s", type=float, default=25_000.0,
                        help="records a second the 4 streaming trials send together")
    parser.add_argument("--stream-s", type=float, default=5.0, help="how long the streaming trials send")
    parser.add_argument("--only", choices=("efficiency", "streaming"), help="measure only this")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.engine_start_s, args.stream_s = 4, 2.0, 3.0
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    from tests.ray_cluster import (  # start_test_cluster sets RAY_TMPDIR and the loopback pin before Ray starts
        start_test_cluster,
        tiny_profile_text,
    )

    config = read_profile(tiny_profile_text(requests=100, warmup_requests=0), "fleet benchmark").run
    steps = trial_steps(config, args.trials, args.records, "trial")
    cluster = start_test_cluster(tuple(f"node_{n + 1}" for n in range(WORKER_NODES)))
    ok = True
    try:
        with tempfile.TemporaryDirectory() as tmp, RunStore(Path(tmp) / "runs.db") as store:
            if args.only != "streaming":
                ok &= efficiency_warm_and_cold(config, steps, store, args.engine_start_s)
            if args.only != "efficiency":
                ok &= streaming(config, store, args.records_per_s, args.stream_s)
    finally:
        cluster.shutdown()
    print("fleet: " + ("every target met" if ok else "MISS"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
