"""The load client in its own process(es): the one way a run sends its load.

Timestamps are only as good as the event loop that takes them. In the GUI the runner is a thread
of the Qt process (one interpreter lock with Qt and pyqtgraph), and on a small machine the engine
takes the cores: a client there woke up hundreds of milliseconds late and reported late, bunched
tokens. So the client runs in child processes (``spawn``: no inherited threads or Qt state),
started once per run and kept for all its levels, optionally bound to cores of their own
(``bind_current_process``) and niced up where allowed.

What crosses back is compact: records in batches of plain tuples (:func:`pack_record`, the ITLs
as float32 bytes) every 0.1 s, token/in-flight counters, and per level a small outcome. The parent
rebuilds each record once, to publish and aggregate it, and keeps none.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from app.load.client import ClientOptions, OnSample, OnSamplePiece, merged_pieces
from app.load.datasets import Dataset
from app.load.executor import (
    TICK_S,
    CancelFlag,
    LevelOutcome,
    LiveStats,
    StopRule,
    planned_requests,
    run_level,
)
from app.load.metrics import RequestRecord
from app.load.patterns import LevelPlan

FIELDS = tuple(RequestRecord.model_fields)
_ITL = FIELDS.index("itl_ms")
REPORT_S = 0.1
"""Records and counters cross over this often (and whenever BATCH_MAX records are waiting)."""
BATCH_MAX = 256
START_MARGIN_S = 0.5
"""Several workers start a level together, this long after it was handed to them."""
READY_TIMEOUT_S = 120.0
"""Spawning imports numpy, aiohttp and pydantic: seconds on a loaded 2-core machine."""
CLIENT_NICE = -10
"""Priority asked for the client (needs the right to raise it; silently kept otherwise)."""
ORPHAN_POLL_S = 0.2
"""How often a client process checks that the process that started it still lives."""


class ClientProcessError(Exception):
    """A client process could not start or died; the message says how."""


def pack_record(rec: RequestRecord) -> tuple[Any, ...]:
    """A record as a plain tuple in :data:`FIELDS` order, its ITLs as float32 bytes."""
    values = [getattr(rec, name) for name in FIELDS]
    values[_ITL] = np.asarray(rec.itl_ms, dtype=np.float32).tobytes()
    return tuple(values)


def unpack_record(packed: Sequence[Any]) -> RequestRecord:
    """The record back (``itl_ms`` as a read-only float32 array; no validation: we made it)."""
    values = dict(zip(FIELDS, packed, strict=True))
    values["itl_ms"] = np.frombuffer(packed[_ITL], dtype=np.float32)
    return RequestRecord.model_construct(**values)


def own_scheduling_group(nice: int | None) -> None:
    """A session of its own: with autogroup scheduling (most Linux desktops and servers) the CPU
    is shared between sessions first and a nice value only counts inside its session, so a client
    in the session of a busy GUI, test run or shell is starved however nice it is. Alone in its
    group it gets a group's share, raised by ``nice`` where allowed. The parent turns Ctrl-C into
    a cancel and a dead parent is noticed (:func:`exit_when_orphaned`), so leaving the terminal's
    process group loses nothing."""
    if not hasattr(os, "setsid"):
        return
    try:
        os.setsid()
    except OSError:  # already a group leader: keep the group it has
        return
    if nice is not None:
        try:
            with open("/proc/self/autogroup", "w", encoding="ascii") as f:
                f.write(str(nice))
        except OSError:  # no autogroup, or no right to raise it: the group's fair share stays
            pass


def bind_current_process(cpus: Sequence[int] | None, nice: int | None) -> list[str]:
    """Bind every thread of this process to ``cpus`` and raise its priority to ``nice`` (Linux:
    affinity and niceness are per thread, so each thread is set); returns what could not be done."""
    problems: list[str] = []
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            for tid in tids:
                os.sched_setaffinity(tid, set(cpus))
        except OSError as exc:
            problems.append(f"could not bind the load client to cores {list(cpus)}: {exc.strerror}")
    if nice is not None and hasattr(os, "setpriority"):
        try:
            for tid in tids:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass  # raising priority needs privileges; binding is what matters
    return problems


@dataclass
class Job:
    plan: LevelPlan
    dataset: Dataset
    opts: ClientOptions
    rule: StopRule
    seed: int
    t_start: float | None
    cpus: tuple[int, ...] | None
    nice: int | None
    sample: bool = False
    """Report one request of the share as it streamed (a ``sample`` message), and its pieces while
    it streams (``pieces`` messages, batched as the records are)."""


def exit_when_orphaned(parent_pid: int, poll_s: float = ORPHAN_POLL_S) -> threading.Thread:
    """End this process within ``poll_s`` of its parent's death, however the parent died (SIGKILL
    too). Nobody reads its results any more, it would keep sending load, and it holds the parent's
    stdout and stderr: a reader of those (a pipe, ``tee``, a script) would wait on it. It cannot
    wind down in order either: its results queue flushes at exit into a pipe that nobody empties,
    which blocks for ever once that pipe is full. So it exits at once (the kernel closes its
    connections). A thread that polls, not ``PR_SET_PDEATHSIG``: that signal follows the parent's
    *thread* that started the process, and a GUI's run thread may end while its pool lives on."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    watcher = threading.Thread(target=watch, name="tunebench-orphan-watch", daemon=True)
    watcher.start()
    return watcher


async def _run_job(k: int, job: Job, results: Any, cancel: CancelFlag) -> LevelOutcome:
    if job.t_start is not None:
        await asyncio.sleep(max(0.0, job.t_start - time.perf_counter()))
    live = LiveStats(None)
    batch: list[tuple[Any, ...]] = []
    pieces: list[dict[str, Any]] = []

    def flush() -> None:
        if batch:
            results.put(("records", k, list(batch)))
            batch.clear()
        if pieces:
            results.put(("pieces", k, merged_pieces(pieces)))
            pieces.clear()

    def on_record(rec: RequestRecord) -> None:
        batch.append(pack_record(rec))
        if len(batch) >= BATCH_MAX:
            flush()

    async def report() -> None:
        while True:
            await asyncio.sleep(REPORT_S)
            flush()
            results.put(("progress", k, (live.tokens, live.in_flight)))

    def on_sample(sample: dict[str, Any]) -> None:
        flush()  # its last pieces before its end
        results.put(("sample", k, sample))

    reporter = asyncio.create_task(report())
    try:
        return await run_level(job.plan, job.dataset, job.opts, job.rule, live=live, cancel=cancel, seed=job.seed,
                               on_record=on_record, keep_records=False, on_sample=on_sample if job.sample else None,
                               on_sample_piece=pieces.append if job.sample else None)
    finally:
        reporter.cancel()
        flush()
        results.put(("progress", k, (live.tokens, 0)))


def done_message(k: int, out: LevelOutcome) -> tuple[str, int, tuple[float, int, str, bytes, int]]:
    """What a worker reports when its share of a level ends (compact: no records)."""
    return ("done", k, (out.duration_s, out.peak_concurrency, out.stop_reason,
                        out.client_lag_ms.astype(np.float32).tobytes(), out.output_tokens))


def run_job(k: int, job: Job, results: Any, cancel: CancelFlag) -> LevelOutcome:
    """Worker ``k``'s share of a level, its records and counters put on ``results`` as it goes
    (a process's queue here; a Ray actor's in ``app.fleet``)."""
    return asyncio.run(_run_job(k, job, results, cancel))


def _worker_main(k: int, jobs: Connection, results: Any, cancel: Any, parent_pid: int) -> None:
    """A client process: runs the levels it is sent until it gets None (or its parent is gone).
    Ctrl-C reaches the whole foreground group; the parent turns it into a cancel, so ignore it."""
    exit_when_orphaned(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    own_scheduling_group(CLIENT_NICE)
    bound: tuple[Any, ...] | None = None
    results.put(("ready", k, os.getpid()))
    while True:
        try:
            job: Job | None = jobs.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            if (job.cpus, job.nice) != bound:
                bound = (job.cpus, job.nice)
                for problem in bind_current_process(job.cpus, job.nice):
                    results.put(("note", k, problem))
            results.put(done_message(k, asyncio.run(_run_job(k, job, results, cancel))))
        except BaseException:  # reported to the parent, which fails the run with it
            results.put(("crashed", k, traceback.format_exc(limit=8)))
            return


def split_plan(plan: LevelPlan, dataset: Dataset, rule: StopRule, workers: int,
               k: int) -> tuple[LevelPlan, Dataset, StopRule]:
    """Worker ``k``'s share: every ``workers``-th conversation, its share of the concurrency or rate."""
    if workers == 1:
        return plan, dataset, rule
    share = Dataset(dataset.conversations[k::workers] or dataset.conversations[:1], dataset.lengths_exact,
                    dataset.length_source,
                    arrivals_s=(dataset.arrivals_s[k::workers] or dataset.arrivals_s[:1])
                    if dataset.arrivals_s is not None else None)
    conc = plan.concurrency
    if conc is not None:
        conc = max(1, conc // workers + (1 if k < conc % workers else 0))
    rate = plan.rate_rps / workers if plan.rate_rps is not None else None
    start = plan.ramp_start_rps / workers if plan.ramp_start_rps is not None else None
    sub = LevelPlan(plan.index, plan.label, plan.mode, concurrency=conc, rate_rps=rate, arrival=plan.arrival,
                    burstiness=plan.burstiness, ramp_start_rps=start, ramp_up_s=plan.ramp_up_s, speedup=plan.speedup)
    if rule.max_requests is not None:
        max_req: int | None = rule.max_requests // workers + (1 if k < rule.max_requests % workers else 0)
    elif rule.duration_s is None:  # the dataset once: a worker whose share is empty sends nothing
        max_req = len(dataset.conversations[k::workers])
    else:
        max_req = None
    return sub, share, StopRule(max_req, rule.duration_s, rule.max_error_fraction)


def crash_line(formatted: str) -> str:
    """A worker's traceback in one line: the error, and where it was raised (a bare
    ``AssertionError`` alone says nothing of which check failed)."""
    lines = formatted.strip().splitlines()
    frames = [line.strip() for line in lines if line.lstrip().startswith("File ")]
    where = f" ({frames[-1]})" if frames else ""
    return f"{lines[-1]}{where}" if lines else "no traceback"


class ClientPool:
    """``workers`` client processes for one run (a context manager; :meth:`close` ends them)."""

    def __init__(self, workers: int = 1, *, on_note: Callable[[str], None] | None = None) -> None:
        self.workers = max(1, workers)
        self.on_note = on_note
        self.cpus: tuple[int, ...] | None = None
        self.nice: int | None = CLIENT_NICE
        self.pids: list[int] = []
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._results: Any = None
        self._cancel: Any = None
        self._ready: set[int] = set()

    def __enter__(self) -> ClientPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Spawn the processes (returns at once; the first level waits until they are ready)."""
        if self._procs:
            return
        self._results = self._ctx.Queue()
        self._cancel = self._ctx.Event()
        for k in range(self.workers):
            parent_end, child_end = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker_main, name=f"tunebench-client-{k}", daemon=True,
                                     args=(k, child_end, self._results, self._cancel, os.getpid()))
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)

    def bind(self, cpus: Sequence[int] | None, nice: int | None = CLIENT_NICE) -> None:
        """Cores (and priority) for the client from the next level on; None leaves them free."""
        self.cpus = tuple(sorted(cpus)) if cpus else None
        self.nice = nice

    def close(self, timeout_s: float = 5.0) -> None:
        """End the processes (a level still running is cancelled first)."""
        if self._cancel is not None:
            self._cancel.set()
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
        for conn in self._conns:
            conn.close()
        if self._results is not None:
            self._results.cancel_join_thread()
            self._results.close()
        self._procs, self._conns, self._results = [], [], None

    def _dispatch(self, jobs: list[Job]) -> None:
        """Hand worker k its share of the level."""
        for conn, job in zip(self._conns, jobs, strict=True):
            conn.send(job)

    def start_skew_note(self, label: str, started_wall_s: dict[int, float]) -> str:
        """How far apart the workers' hosts started a level (their wall clocks)."""
        spread_ms = (max(started_wall_s.values()) - min(started_wall_s.values())) * 1e3
        return f"level {label}: the {len(started_wall_s)} client workers started within {spread_ms:.1f} ms of each other"

    def _check_alive(self, pending: set[int]) -> None:
        for k in pending:
            proc = self._procs[k]
            if not proc.is_alive():
                self._cancel.set()  # the other workers stop too
                raise ClientProcessError(f"the load client process {proc.pid} exited (code {proc.exitcode})")

    def _wait_ready(self, cancel: CancelFlag) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self._ready) < self.workers:
            if cancel.is_set():
                return
            try:
                kind, k, payload = self._results.get(timeout=0.1)
            except queue.Empty:
                kind = ""
            if kind == "":
                self._check_alive(set(range(self.workers)) - self._ready)
                if time.monotonic() > deadline:
                    raise ClientProcessError(f"the load client processes did not start in {READY_TIMEOUT_S:.0f} s")
                continue
            if kind == "ready":
                self._ready.add(k)
                self.pids.append(int(payload))

    def run_level(self, plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, *,
                  live: LiveStats, cancel: CancelFlag, seed: int,
                  on_record: Callable[[RequestRecord], None] | None = None, index_offset: int = 0,
                  on_sample: OnSample | None = None, on_sample_piece: OnSamplePiece | None = None) -> LevelOutcome:
        """One level, split over the workers from a common start time; each record reaches
        ``on_record`` within ~0.1 s of completing. With one worker, records keep the index the
        client gave them (the order they were sent); with several, the order they arrive here.
        Peak concurrency is the sum of the workers' peaks (an upper bound). ``on_sample`` gets the
        sample request of the first worker (``run_level``), ``on_sample_piece`` its pieces while it
        streams (each batch within ~0.1 s of its arrival)."""
        self.start()
        self._wait_ready(cancel)
        n = self.workers
        t_start = time.perf_counter() + START_MARGIN_S if n > 1 else None
        if cancel.is_set():
            self._cancel.set()
        jobs = []
        for k in range(n):
            sub, share, sub_rule = split_plan(plan, dataset, rule, n, k)
            own = replace(opts, request_ids=f"{opts.request_ids}-w{k}") if n > 1 and opts.request_ids else opts
            jobs.append(Job(sub, share, own, sub_rule, seed + k, t_start, self.cpus, self.nice,
                            sample=on_sample is not None and k == 0))
        self._dispatch(jobs)
        live.start_level(plan.index, planned_requests(dataset, rule))
        base_tokens = live.tokens
        latest: dict[int, tuple[int, int]] = {}
        done: dict[int, tuple[float, int, str, bytes, int]] = {}
        arrived = 0
        next_tick = time.perf_counter() + TICK_S
        pending = set(range(n))
        started_wall_s: dict[int, float] = {}
        while pending:
            if cancel.is_set() and not self._cancel.is_set():
                self._cancel.set()
            try:
                kind, k, payload = self._results.get(timeout=0.05)
            except queue.Empty:
                kind = ""
                self._check_alive(pending)
            if kind == "records":
                for packed in payload:
                    rec = unpack_record(packed)
                    rec.index = index_offset + (rec.index if n == 1 else arrived)
                    arrived += 1
                    if rec.ttft_ms is not None:
                        live.on_first(rec.ttft_ms)
                    live.on_record(rec)
                    if on_record is not None:
                        on_record(rec)
            elif kind == "progress":
                latest[k] = payload
                live.tokens = base_tokens + sum(tokens for tokens, _ in latest.values())
                live.in_flight = sum(in_flight for _, in_flight in latest.values())
            elif kind == "done":
                done[k] = payload
                pending.discard(k)
            elif kind == "sample" and on_sample is not None:
                on_sample(payload)
            elif kind == "pieces" and on_sample_piece is not None:
                on_sample_piece(payload)
            elif kind == "note" and self.on_note is not None:
                self.on_note(str(payload))
            elif kind == "started":
                started_wall_s[k] = float(payload)
            elif kind == "crashed":
                self._cancel.set()  # the other workers stop too
                raise ClientProcessError(f"the load client failed: {crash_line(str(payload))}")
            if time.perf_counter() >= next_tick:
                live.publish()
                next_tick = time.perf_counter() + TICK_S
        outcomes = [done[k] for k in range(n)]
        if len(started_wall_s) > 1 and self.on_note is not None and plan.index >= 0:
            self.on_note(self.start_skew_note(plan.label, started_wall_s))
        live.in_flight = 0
        live.tokens = base_tokens + sum(o[4] for o in outcomes)
        live.publish()
        reasons = [o[2] for o in outcomes if o[2] != "completed"]
        lags = np.concatenate([np.frombuffer(o[3], dtype=np.float32) for o in outcomes])
        return LevelOutcome([], max(o[0] for o in outcomes), sum(o[1] for o in outcomes),
                            reasons[0] if reasons else "completed", lags, sum(o[4] for o in outcomes))
