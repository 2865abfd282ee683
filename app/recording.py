"""The bridge from the event bus to the run store: a RunRecorder subscribes to a Bus and, from
its own thread, writes each run's row, requests, telemetry, log and levels in batches at least
once a second, so a crash loses at most the last second. ``db`` never imports ``app``; this
module is where the two meet.

Usage (what ``tunebench run`` and the GUI do)::

    recorder = record_to_default_store(bus)      # before the runner publishes run_started
    try:
        result = Runner(config, bus).run()
    finally:
        recorder.close()                         # flushes and finalises
    recorder.check_stored(result)                # not "completed" if its data was not all stored

A run whose items could not all be written (disk full, a database locked for too long, a
mailbox that overflowed) is stored as ``failed`` with the count in its reason, never as
``completed``; :meth:`RunRecorder.check_stored` carries that verdict to the run's result and
so to the exit code.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from app import events
from app.bus import Bus, Event, Sample
from app.store import RunStore, StoreError, StoreUnreachable

log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH_INTERVAL_S = 0.5
"""Pending items are written at least this often (the contract is at least once a second)."""
PRE_RUN_LOG_LINES = 50_000
STORE_OUTAGE_LIMIT_S = 60.0
"""How long a recording waits for a store server that went away (a restart, a network blip)
before it gives up on a write; records wait in memory meanwhile, none is dropped."""
MAX_HELD_ITEMS = 250_000
"""Items kept in memory while the database refuses writes, before they are dropped (a request
record with its ITLs is about a kilobyte: a few minutes of a 1,000-stream soak)."""


def _short(exc: BaseException) -> str:
    """The database's own words (the first line; SQLAlchemy appends the statement and its values)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _jsonable(value: Any) -> Any:
    """Payloads are meant to be JSON-able; anything else is stored as its string form."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)



def run_columns(p: events.RunStarted) -> dict[str, Any]:
    """What the store keeps of a run from its ``RunStarted`` (``RunStore.create_run``'s fields,
    less its times): also what a running run's cost is counted from (``app.cost.started_run``)."""
    return dict(name=p.name or p.config.name, tags=list(p.tags), config=p.config.model_dump(mode="json"),
                engine_kind=p.engine_kind, engine_version=p.engine_version, model=p.model, argv=p.argv,
                env=dict(p.env), hardware=_jsonable(p.hardware), endpoint=p.endpoint)

class RunRecorder:
    """Records every run published on ``bus`` into ``store`` (one run at a time)."""

    def __init__(self, bus: Bus, store: RunStore, *, flush_interval_s: float = FLUSH_INTERVAL_S,
                 owns_store: bool = False, maxlen: int = 2_000_000,
                 outage_limit_s: float = STORE_OUTAGE_LIMIT_S) -> None:
        self.bus = bus
        self.store = store
        self.outage_limit_s = outage_limit_s
        self._outage_ends_at: float | None = None  # while the store is away: when the recorder stops waiting
        self.flush_interval_s = flush_interval_s
        self.owns_store = owns_store
        self.run_id: int | None = None  # store id of the run being recorded (or the last one)
        self.recorded: list[int] = []
        self.errors: list[str] = []
        self._open = False
        self._requests: list[Mapping[str, Any]] = []
        self._samples: list[Sample] = []
        self._log: list[str] = []
        self._events: list[tuple[float, str, dict[str, Any] | None]] = []
        # An engine warmed before the run (the GUI keeps engines) logs before run_started: keep it.
        self._pre_log: deque[str] = deque(maxlen=PRE_RUN_LOG_LINES)
        self._pre_events: deque[tuple[float, str, dict[str, Any] | None]] = deque(maxlen=1000)
        self._last_flush = time.monotonic()
        self._stop = threading.Event()
        self._flush_now = threading.Event()
        self._flushed = threading.Condition()
        self._flush_count = 0
        self._flush_wanted = 0  # flush() waits until _flush_count reaches it
        self._dropped_written = 0
        self.unstored: dict[str, str] = {}
        """Runner run id -> why some of its data is not in the store (see check_stored)."""
        self._uid = ""  # the runner's id of the open run (the key of ``unstored``)
        self._stored_uid = ""  # the open run's uid in the store
        self._lost = 0  # items of the open run dropped after failed writes
        self._last_write_error = ""
        self._dropped_at_start = 0
        self._sub = bus.subscribe(maxlen=maxlen)
        self._thread = threading.Thread(target=self._loop, name="run-recorder", daemon=True)
        self._thread.start()

    # -- public --------------------------------------------------------------------------------

    def flush(self, timeout_s: float = 10.0) -> None:
        """Write everything published so far (blocks until the recorder thread has done it)."""
        with self._flushed:
            # +2: the loop may be past its drain in this very round; the next round drains after us.
            target = self._flush_count + 2
            self._flush_wanted = max(self._flush_wanted, target)
            self._flush_now.set()
            self._sub.wake()  # neither round waits for new items: a flush asked for is not idle time
            self._flushed.wait_for(lambda: self._flush_count >= target or not self._thread.is_alive(), timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Drain, write, and end a run left open as ``interrupted``; stop the thread. By default
        it waits as long as a store that went away is waited for (a last batch, then the run's
        end), so the run's records are stored or spilled, never dropped by leaving early."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        waited_s = timeout_s if timeout_s is not None else 2 * self.outage_limit_s + 30.0
        self._thread.join(waited_s)
        if self._thread.is_alive() and self._open:  # a call to the store still hangs: not known to be stored
            self.unstored.setdefault(self._uid, f"the run database did not answer within {waited_s:g} s: the "
                                                "run's last records and its end may not be stored")
        self.bus.unsubscribe(self._sub)
        if self.owns_store:
            self.store.close()

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_stored(self, result: Any) -> str | None:
        """After :meth:`close`: if ``result``'s data (a RunResult: ``run_id``, ``status``,
        ``reason``) could not all be stored, mark it ``failed`` with why (a ``cancelled`` run
        stays cancelled, with the reason added) and return the reason; None when it is all stored."""
        problem = self.unstored.get(str(getattr(result, "run_id", "")))
        if problem is None:
            return None
        if result.status == "completed":
            result.status, result.reason = "failed", problem
        else:
            result.reason = f"{result.reason}; {problem}" if result.reason else problem
        return problem

    # -- the thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            flush_asked = self._flush_count < self._flush_wanted
            items = self._sub.drain(timeout_s=None if flush_asked else 0.1)
            for item in items:
                try:
                    self._handle(item)
                except Exception as exc:  # a bad payload must not stop the recording
                    self._error(f"could not record {getattr(item, 'kind', 'sample')}: {_short(exc)}")
            due = time.monotonic() - self._last_flush >= self.flush_interval_s
            if due or flush_asked or self._flush_now.is_set() or stopping:
                self._flush_now.clear()
                self._write_pending()
                with self._flushed:
                    self._flush_count += 1
                    self._flushed.notify_all()
            if stopping and not len(self._sub):
                break
        if self._open and self.run_id is not None:
            try:
                self._finish("interrupted", "recording stopped before the run finished", None, time.time())
            except Exception as exc:  # the database refuses even that: the row is found "running" later
                self._error(f"could not end run {self.run_id}: {_short(exc)}")
        with self._flushed:
            self._flushed.notify_all()

    def _error(self, message: str) -> None:
        if self.errors and self.errors[-1] == message:
            return  # the same failure at every flush (a full disk): once is enough
        log.info("run recorder: %s", message)  # the CLI prints ``errors`` once, at the end
        self.errors.append(message)

    def _handle(self, item: Sample | Event) -> None:
        if isinstance(item, Sample):
            if self._open:
                self._samples.append(item)
            return
        p = item.payload
        if isinstance(p, events.RunStarted):
            self._start(item, p)
        elif isinstance(p, events.CampaignUpdated):
            return  # a campaign stores itself (its whole state, each time it moves): not an event of a run
        elif isinstance(p, events.SampleStreamed):
            return  # the sample is stored whole with its level (LevelFinished)
        elif isinstance(p, events.RunFinished) and not self._open and self._uid and self._uid in self.unstored:
            self._uid = ""  # a run that could not even be created: its verdict is already in unstored
        elif not self._open:
            if isinstance(p, events.LogLine):
                self._pre_log.append(p.line)
            elif isinstance(p, events.PhaseChanged):
                self._pre_events.append((item.t_wall, p.kind, p.to_json()))
            return
        elif isinstance(p, events.RequestDone):
            self._requests.append(p.record.model_dump())
        elif isinstance(p, events.RequestsDone):  # a trial on a cluster: its requests in rows
            self._requests.extend(p.records())
        elif isinstance(p, events.Progress):  # the client's live figures: stored as the "client" series
            self._samples.append(p.sample(item.t_mono, item.t_wall))
        elif isinstance(p, events.LogLine):
            self._log.append(p.line)
        elif isinstance(p, events.RunFinished):
            self._write_pending()
            self._finish(p.status, p.reason, _jsonable(p.summary), item.t_wall)
        elif isinstance(p, events.LevelStarted):
            self._write_pending()
            params = {k: v for k, v in p.to_json().items() if k not in ("index", "label", "run_id") and v is not None}
            self._store_call(self.store.start_level, self._rid, p.index, p.label, params, item.t_wall)
        elif isinstance(p, events.LevelFinished):
            self._write_pending()
            self._store_call(self.store.finish_level, self._rid, p.index, p.summary.model_dump(mode="json"), item.t_wall,
                             sample=p.sample)
        elif isinstance(p, events.QualityMeasured):
            self._write_pending()
            self._store_call(self.store.update_run, self._rid, quality=p.quality)
        elif isinstance(p, events.EngineReady):
            info = p.to_json()
            self._events.append((item.t_wall, p.kind, info))
            self._write_pending()
            self._store_call(self.store.update_run, self._rid, engine_info=info, **({"endpoint": p.base_url} if p.base_url else {}))
        else:  # phase, notice, telemetry support...
            self._events.append((item.t_wall, p.kind, p.to_json()))

    def _store_call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``method`` of the store, tried again while its server is unreachable, for up to
        ``outage_limit_s`` (the bus holds what arrives meanwhile). Every write is one
        transaction, so a failed try left nothing behind."""
        delay_s = 0.1
        while True:
            try:
                result = method(*args, **kwargs)
            except StoreUnreachable as exc:
                now = time.monotonic()
                if self._outage_ends_at is None:  # one limit per outage, not per call: close() can wait it out
                    self._outage_ends_at = now + self.outage_limit_s
                    self._error(f"the run database went away ({_short(exc)}); retrying for up to "
                                f"{self.outage_limit_s:g} s")
                if now >= self._outage_ends_at:
                    raise
                time.sleep(min(delay_s, self._outage_ends_at - now))
                delay_s = min(delay_s * 2, 2.0)
                continue
            if self._outage_ends_at is not None:
                self._outage_ends_at = None
                self._error("the run database is back: recording goes on, nothing was lost")
            return result

    @property
    def _rid(self) -> int:
        assert self.run_id is not None
        return self.run_id

    def _start(self, item: Event, p: events.RunStarted) -> None:
        if self._open:
            self._write_pending()
            self._finish("interrupted", "a new run started before this one finished", None, item.t_wall)
        self._uid = p.run_id or ""
        self._stored_uid = p.run_id or uuid.uuid4().hex  # chosen here: a retried create finds its first try
        self._lost = 0
        self._last_write_error = ""
        self._dropped_at_start = self._sub.dropped
        kwargs = dict(**run_columns(p), started_at=item.t_wall, t0_mono=item.t_mono)
        try:
            try:
                self.run_id = self._store_call(self.store.create_run, uid=self._stored_uid, **kwargs)
            except StoreUnreachable:
                raise
            except StoreError:  # the same run id published twice: keep both, the second under a fresh id
                self._stored_uid = uuid.uuid4().hex
                self.run_id = self._store_call(self.store.create_run, uid=self._stored_uid, **kwargs)
        except Exception as exc:  # disk full, read-only, locked: nothing of this run can be kept
            self.run_id = None
            self.unstored[self._uid] = f"the run could not be stored: {_short(exc)}"
            self._error(self.unstored[self._uid])
            return
        self.recorded.append(self.run_id)
        self._open = True
        self._log[:0], self._events[:0] = list(self._pre_log), list(self._pre_events)
        self._pre_log.clear()
        self._pre_events.clear()

    def _finish(self, status: str, reason: Any, summary: Mapping[str, Any] | None, t_wall: float) -> None:
        status = status if status in ("completed", "failed", "cancelled", "interrupted") else "failed"
        reason = None if reason is None else str(reason)
        held = len(self._requests) + len(self._samples) + len(self._log)
        as_ended = (status, reason)  # what a spill keeps: the held items go with it, none is lost
        if held:  # held after failed writes: they must not leak into the next run
            self._error(f"{held} items of run {self.run_id} could not be written before it ended")
        dropped = self._sub.dropped - self._dropped_at_start
        lost = held + self._lost + dropped
        if lost:
            why = f": {self._last_write_error}" if self._last_write_error and held + self._lost else \
                " (the recorder fell behind)"
            problem = f"{lost} items of the run could not be stored{why}"
            self.unstored[self._uid] = problem
            if status == "completed":
                status, reason = "failed", problem
            else:
                reason = f"{reason}; {problem}" if reason else problem
        try:
            self._store_call(self.store.finish_run, self._rid, status, reason, summary, t_wall)
        except StoreUnreachable as exc:  # gone for good: keep what is held in a file, to write when it is back
            spill = self._spill(*(as_ended if lost == held else (status, reason)), summary, t_wall)
            self.unstored[self._uid] = (f"the run database stayed unreachable ({_short(exc)}): the run's last "
                                        f"records and its end are kept in {spill}; `tunebench db unspill {spill}` "
                                        f"stores them when the database is back")
            self._error(self.unstored[self._uid])
        except Exception as exc:
            self.unstored.setdefault(self._uid, f"the run's end could not be stored: {_short(exc)}")
            raise
        finally:
            self._open = False
            self._requests, self._samples, self._log, self._events = [], [], [], []

    def _spill(self, status: str, reason: str | None, summary: Mapping[str, Any] | None, t_wall: float) -> Path:
        """Everything held for the open run, and its end, as JSON lines in the user data
        directory (:func:`unspill` writes them to the store)."""
        from engine_adapters.paths import data_dir

        folder = data_dir() / "spill"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"run-{self._rid}-{int(time.time())}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            def put(doc: Mapping[str, Any]) -> None:
                handle.write(json.dumps(doc, default=str) + "\n")

            put({"kind": "run", "store": self.store.where, "run_id": self._rid, "uid": self._stored_uid})
            for record in self._requests:
                put({"kind": "request", "record": dict(record)})
            for sample in self._samples:
                put({"kind": "sample", "source": sample.source, "t_mono": sample.t_mono, "t_wall": sample.t_wall,
                     "values": dict(sample.values)})
            for line in self._log:
                put({"kind": "log", "line": line})
            for event_t_wall, kind, payload in self._events:
                put({"kind": "event", "t_wall": event_t_wall, "event": kind, "payload": payload})
            put({"kind": "finish", "status": status, "reason": reason, "summary": summary, "t_wall": t_wall})
        return path

    def _write_pending(self) -> None:
        self._last_flush = time.monotonic()
        if self.run_id is None or not (self._requests or self._samples or self._log or self._events):
            return
        requests, samples, lines, run_events = self._requests, self._samples, self._log, self._events
        self._requests, self._samples, self._log, self._events = [], [], [], []
        dropped = self._sub.dropped
        try:
            self._store_call(self.store.write_batch, self.run_id, requests=requests, samples=samples, log_lines=lines, events=run_events,
                                   dropped_items=dropped if dropped != self._dropped_written else None)
            self._dropped_written = dropped
        except Exception as exc:  # locked past the busy timeout, disk full...: keep it for the next flush
            self._last_write_error = _short(exc)
            held = len(requests) + len(samples) + len(lines) + len(self._requests) + len(self._samples)
            if held <= MAX_HELD_ITEMS:
                self._requests[:0], self._samples[:0] = requests, samples
                self._log[:0], self._events[:0] = lines, run_events
                self._error(f"could not write a batch ({self._last_write_error}); retrying with the next flush")
            else:
                self._lost += len(requests) + len(samples) + len(lines)
                self._error(f"could not write {len(requests)} requests and {len(samples)} samples, dropped: "
                            f"{self._last_write_error}")


def unspill(path: Path, store: RunStore) -> tuple[int, int]:
    """Write a spill file (:meth:`RunRecorder._spill`) into ``store``: the run's held records,
    then its end. Returns (run id, records written). The file is removed once stored."""
    from app.store import SampleIn

    try:
        docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read the spill file {path}: {exc}") from None
    if not docs or docs[0].get("kind") != "run" or docs[-1].get("kind") != "finish":
        raise StoreError(f"{path} is not a tunebench spill file (it must start with the run and end with its end)")
    head, end = docs[0], docs[-1]
    try:
        run = store.get_run(int(head["run_id"]))
    except (KeyError, TypeError, ValueError, StoreError):
        run = None
    if run is None or run.uid != head.get("uid"):  # ids are the store's own: the uid says it is the same run
        raise StoreError(f"{path} belongs to another run database ({head.get('store')}), not {store.where}: "
                         f"pass that one with --db")
    if run.status not in ("running", "interrupted"):  # interrupted: found orphaned meanwhile
        raise StoreError(f"run {run.id} in {store.where} has already ended: {path} was stored before")
    body = docs[1:-1]
    if body:
        store.write_batch(
            run.id,
            requests=[d["record"] for d in body if d.get("kind") == "request"],
            samples=[SampleIn(d["source"], d["t_mono"], d["t_wall"], d["values"])
                     for d in body if d.get("kind") == "sample"],
            log_lines=[d["line"] for d in body if d.get("kind") == "log"],
            events=[(d["t_wall"], d["event"], d["payload"]) for d in body if d.get("kind") == "event"])
        # Stored: what is left to do is the end, so running this again cannot store the records twice.
        rest = path.with_name(path.name + ".tmp")
        rest.write_text("".join(json.dumps(d) + "\n" for d in (head, end)), encoding="utf-8")
        rest.replace(path)
    store.finish_run(run.id, end["status"], end.get("reason"), end.get("summary"), end.get("t_wall"))
    path.unlink()
    return run.id, len(body)


def record_to_default_store(bus: Bus, db_path: str | Path | None = None) -> RunRecorder:
    """A recorder on the user's run database (``--db``/``TUNEBENCH_DB`` or the default); its
    ``close()`` also closes the store."""
    return RunRecorder(bus, RunStore(db_path), owns_store=True)
