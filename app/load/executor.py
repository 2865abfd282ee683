"""Driving one load level: closed loop at a fixed concurrency or open loop on a seeded arrival
schedule; stopping on request count, duration, error budget or cancellation; live statistics.

Queue time is measured separately from TTFT: a request's *scheduled* time is when it became due
(its arrival, or for a closed loop the moment its slot freed up); its *start* is when the client
actually sent it. A client that cannot keep up shows as queue time, not as engine latency.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.bus import Bus
from app.events import Progress
from app.load.client import Cancelled, ClientOptions, OnSample, OnSamplePiece, StreamClient, make_session
from app.load.datasets import Conversation, Dataset
from app.load.metrics import RequestRecord
from app.load.patterns import LevelPlan, arrival_offsets_s
from engine_adapters.bounded_http import CancelFlag

MIN_REQUESTS_FOR_BUDGET = 5
TICK_S = 0.5
LAG_PROBE_S = 0.005
WINDOW_REQUESTS = 20_000
WINDOW_ITLS = 256


def _prune(window: deque[tuple[float, Any]], oldest: float) -> None:
    """Drop entries older than ``oldest`` (appended in time order)."""
    while window and window[0][0] < oldest:
        window.popleft()


@dataclass
class StopRule:
    max_requests: int | None = None  # conversations; None = the dataset once (or unbounded with duration_s)
    duration_s: float | None = None
    max_error_fraction: float = 0.5


@dataclass
class LevelOutcome:
    records: list[RequestRecord]  # empty unless the level was run with keep_records
    duration_s: float
    peak_concurrency: int
    stop_reason: str  # completed | duration reached | error budget exceeded: ... | cancelled
    client_lag_ms: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float32))
    output_tokens: int = 0  # of every record, kept or not


@dataclass
class LiveStats:
    """Rolling client-side figures, published as :class:`~app.events.Progress` events (the one
    client-side live figure; consumers plot it as the ``client`` series).
    Its windows are bounded in time and size: a long run does not pile up in them."""

    bus: Bus | None
    run_id: str = ""
    window_s: float = 5.0
    level: int = 0
    planned: int | None = None
    done: int = 0
    errors: int = 0
    in_flight: int = 0
    tokens: int = 0
    level_started: float = field(default_factory=time.perf_counter)
    _token_marks: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    _ttfts: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW_REQUESTS))
    _itls: deque[tuple[float, np.ndarray]] = field(default_factory=lambda: deque(maxlen=WINDOW_REQUESTS))
    _answers: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW_REQUESTS))
    """Of requests that reasoned: the time to their first answer token."""

    def start_level(self, index: int, planned: int | None) -> None:
        self.level, self.planned, self.done, self.errors, self.in_flight = index, planned, 0, 0, 0
        self.level_started = time.perf_counter()
        self._token_marks.clear()
        self._token_marks.append((self.level_started, self.tokens))

    def on_tokens(self, n: int) -> None:
        self.tokens += n

    def on_first(self, ttft_ms: float) -> None:
        now = time.perf_counter()
        self._ttfts.append((now, ttft_ms))
        _prune(self._ttfts, now - self.window_s)

    def on_record(self, rec: RequestRecord) -> None:
        if rec.error_kind == "cancelled":
            return
        self.done += 1
        if not rec.ok:
            self.errors += 1
        elif len(rec.itl_ms):
            now = time.perf_counter()
            if rec.reasoning_tokens is not None and rec.ttfat_ms is not None:
                self._answers.append((now, rec.ttfat_ms))
                _prune(self._answers, now - self.window_s)
            # A window's median needs no more than its last WINDOW_ITLS values per request.
            self._itls.append((now, np.asarray(rec.itl_ms[-WINDOW_ITLS:], dtype=np.float32)))
            _prune(self._itls, now - self.window_s)

    def snapshot(self) -> dict[str, float]:
        now = time.perf_counter()
        self._token_marks.append((now, self.tokens))
        old_t, old_tokens = self._token_marks[0]
        for t, n in self._token_marks:  # the oldest mark inside the window
            if now - t <= self.window_s:
                old_t, old_tokens = t, n
                break
        rate = (self.tokens - old_tokens) / (now - old_t) if now - old_t > 1e-3 else 0.0
        values = {"output_tok_per_s": rate, "requests_done": float(self.done), "errors": float(self.errors),
                  "requests_in_flight": float(self.in_flight)}
        ttfts = [v for t, v in self._ttfts if now - t <= self.window_s]
        if ttfts:
            values["ttft_ms_p50"] = float(np.median(ttfts))
        itls = [v for t, v in self._itls if now - t <= self.window_s]
        if itls:
            values["itl_ms_p50"] = float(np.median(np.concatenate(itls)))
        answers = [v for t, v in self._answers if now - t <= self.window_s]
        if answers:
            values["ttfat_ms_p50"] = float(np.median(answers))
        return values

    def publish(self) -> dict[str, float]:
        values = self.snapshot()
        if self.bus is not None:  # the one client-side live figure on the bus (the "client" series)
            self.bus.emit(Progress(
                run_id=self.run_id, level=self.level, planned=self.planned, requests_done=self.done,
                errors=self.errors, requests_in_flight=self.in_flight, output_tokens=self.tokens,
                elapsed_s=time.perf_counter() - self.level_started, output_tok_per_s=values["output_tok_per_s"],
                ttft_ms_p50=values.get("ttft_ms_p50"), itl_ms_p50=values.get("itl_ms_p50"),
                ttfat_ms_p50=values.get("ttfat_ms_p50")))
        return values


def planned_conversations(dataset: Dataset, rule: StopRule) -> int | None:
    """Conversations a level sends (None: until its duration is up)."""
    if rule.max_requests is not None:
        return rule.max_requests
    return None if rule.duration_s is not None else len(dataset.conversations)


def planned_requests(dataset: Dataset, rule: StopRule) -> int | None:
    """Requests (turns) a level sends, for progress; None when it runs for a duration."""
    convs, total = dataset.conversations, planned_conversations(dataset, rule)
    if total is None or not convs:
        return total
    if all(len(c.turns) == 1 for c in convs):
        return total
    return sum(len(convs[i % len(convs)].turns) for i in range(total))


async def run_level(plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, *,
                    live: LiveStats, on_record: Callable[[RequestRecord], None] | None = None,
                    cancel: CancelFlag | None = None, seed: int = 0, index_offset: int = 0,
                    keep_records: bool = True, on_sample: OnSample | None = None,
                    on_sample_piece: OnSamplePiece | None = None) -> LevelOutcome:
    """Run one level to its stop rule; never raises for a failing server (errors are records).
    Each record goes to ``on_record`` as it completes; ``keep_records=False`` (the client process)
    keeps none in the outcome, so a long level holds no per-request objects. ``on_sample`` gets
    one request of the level as it streamed, if it succeeds (``app.load.client.stream_sample``);
    ``on_sample_piece`` gets the same request while it streams."""
    convs = dataset.conversations
    total = planned_conversations(dataset, rule)
    live.start_level(plan.index, planned_requests(dataset, rule))
    records: list[RequestRecord] = []
    stop = asyncio.Event()
    stop_reason = ["completed"]
    in_flight = [0, 0]  # now, peak
    request_index = itertools.count(index_offset)
    t0 = time.perf_counter()
    deadline = t0 + rule.duration_s if rule.duration_s is not None else None
    limit = plan.concurrency or (len(convs) if plan.mode == "open" else 1)
    # The sample is the first request sent once the first wave is in flight (the last one when the
    # level sends fewer): a level's first requests all prefill at once, which no later one meets.
    sample_index = index_offset + max(0, min(limit, total - 1) if total is not None else limit)

    def halt(reason: str) -> None:
        if not stop.is_set():
            stop_reason[0] = reason
            stop.set()

    tally = {"failed": 0, "counted": 0}
    first_error: list[str] = []

    out_tokens = [0]

    def record(rec: RequestRecord) -> None:
        if keep_records:
            records.append(rec)
        out_tokens[0] += rec.output_tokens
        live.on_record(rec)
        if on_record is not None:
            on_record(rec)
        if rec.error_kind == "cancelled":
            return
        tally["counted"] += 1
        if not rec.ok:
            tally["failed"] += 1
            if not first_error:
                first_error.append(rec.error or "error")
        failed, counted = tally["failed"], tally["counted"]
        if failed >= MIN_REQUESTS_FOR_BUDGET and failed / counted > rule.max_error_fraction:
            halt(f"error budget exceeded: {failed} of {counted} requests failed "
                 f"(limit {rule.max_error_fraction:.0%}); first: {first_error[0]}")

    async with make_session(limit, opts.keep_alive) as session:
        client = StreamClient(session, opts)

        async def run_conversation(conv: Conversation, scheduled: float, cap_wait_ms: float = 0.0) -> None:
            replies: list[str] = []
            for turn in range(len(conv.turns)):
                if turn > 0 and stop.is_set():
                    return
                in_flight[0] += 1
                live.in_flight = in_flight[0]
                in_flight[1] = max(in_flight[1], in_flight[0])
                index = next(request_index)
                try:
                    rec, text = await client.send(conv, turn, replies, level=plan.index, index=index,
                                                  level_t0=t0, scheduled=scheduled, on_tokens=live.on_tokens,
                                                  on_first=live.on_first, cap_wait_ms=cap_wait_ms,
                                                  on_sample=on_sample if index == sample_index else None,
                                                  on_sample_piece=on_sample_piece if index == sample_index else None)
                except Cancelled as exc:
                    record(exc.record)
                    return
                finally:
                    in_flight[0] -= 1
                    live.in_flight = in_flight[0]
                record(rec)
                if not rec.ok:
                    return
                replies.append(text)
                scheduled, cap_wait_ms = time.perf_counter(), 0.0

        def due(i: int, when: float) -> bool:
            if stop.is_set() or (total is not None and i >= total):
                return False
            if deadline is not None and when >= deadline:
                halt("duration reached")
                return False
            return True

        async def watch() -> None:
            next_tick = time.perf_counter() + TICK_S
            while True:
                await asyncio.sleep(0.05)
                if cancel is not None and cancel.is_set():
                    halt("cancelled")
                    for task in tasks:
                        task.cancel()
                    return
                if stop.is_set() and stop_reason[0].startswith("error budget"):
                    for task in tasks:
                        task.cancel()
                if time.perf_counter() >= next_tick:
                    live.publish()
                    next_tick += TICK_S

        lags = array("f")

        async def lag_probe() -> None:
            """How late the event loop wakes up: when the client is starved of CPU (an engine
            spinning on the same cores), arrival times are late and tokens look bunched."""
            while True:
                t = time.perf_counter()
                await asyncio.sleep(LAG_PROBE_S)
                lags.append((time.perf_counter() - t - LAG_PROBE_S) * 1e3)

        tasks: set[asyncio.Task[None]] = set()
        if cancel is not None and cancel.is_set():
            halt("cancelled")
        watcher = asyncio.create_task(watch())
        prober = asyncio.create_task(lag_probe())
        try:
            if plan.mode == "closed":
                counter = itertools.count()

                async def worker(delay_s: float) -> None:
                    if delay_s > 0:  # a ramp-up: the workers start evenly over ramp_up_s
                        try:
                            await asyncio.wait_for(stop.wait(), delay_s)
                            return  # stopped before it started
                        except TimeoutError:
                            pass
                    while True:
                        i = next(counter)
                        now = time.perf_counter()
                        if not due(i, now):
                            return
                        await run_conversation(convs[i % len(convs)], now)

                workers = plan.concurrency or 1
                tasks.update(asyncio.create_task(worker(k * plan.ramp_up_s / workers)) for k in range(workers))
            else:
                n = total if total is not None else int(math.ceil((plan.rate_rps or 1) * (rule.duration_s or 0) * 1.5)) + 16
                offsets = arrival_offsets_s(plan, n, seed, dataset.arrivals_s)
                n = min(n, len(offsets))  # a trace ends with its last arrival
                gate = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None

                async def open_conversation(conv: Conversation, scheduled: float) -> None:
                    if gate is None:
                        await run_conversation(conv, scheduled)
                        return
                    entered = time.perf_counter()
                    async with gate:
                        if not stop.is_set():  # the wait for a slot is the cap's, not the client's lateness
                            await run_conversation(conv, scheduled, (time.perf_counter() - entered) * 1e3)

                for i in range(n):
                    when = t0 + float(offsets[i])
                    if not due(i, when):
                        break
                    delay = when - time.perf_counter()
                    if delay > 0:
                        try:
                            await asyncio.wait_for(stop.wait(), delay)
                            break  # stopped while waiting
                        except TimeoutError:
                            pass
                    task = asyncio.create_task(open_conversation(convs[i % len(convs)], when))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
                tasks = {t for t in tasks if not t.done()}
        finally:
            watcher.cancel()
            prober.cancel()
            await asyncio.gather(watcher, prober, return_exceptions=True)
    duration = time.perf_counter() - t0
    live.publish()
    return LevelOutcome(records, duration, in_flight[1], stop_reason[0], np.frombuffer(lags, dtype=np.float32).copy(),
                        out_tokens[0])
