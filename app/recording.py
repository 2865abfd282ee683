"""The bridge from the event bus to the run store: a RunRecorder subscribes to a Bus and, from
its own thread, writes each run's row, requests, telemetry, log and levels in batches at least
once a second, so a crash loses at most the last second. ``db`` never imports ``app``; this
module is where the two meet.

Usage (what ``tunebench run`` and the GUI do)::

    recorder = record_to_default_store(bus)      # before the runner publishes run_started
    try:
        Runner(config, bus).run()
    finally:
        recorder.close()                         # flushes and finalises
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.bus import Bus, Event, Sample
from db.store import RunStore, StoreError

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
"""Pending items are written at least this often (the contract is at least once a second)."""
PRE_RUN_LOG_LINES = 50_000
MAX_HELD_ITEMS = 2_000_000
"""Items kept in memory while the database refuses writes, before they are dropped."""


def _jsonable(value: Any) -> Any:
    """Payloads are meant to be JSON-able; anything else is stored as its string form."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


class RunRecorder:
    """Records every run published on ``bus`` into ``store`` (one run at a time)."""

    def __init__(self, bus: Bus, store: RunStore, *, flush_interval_s: float = FLUSH_INTERVAL_S,
                 owns_store: bool = False, maxlen: int = 2_000_000) -> None:
        self.bus = bus
        self.store = store
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
        self._dropped_written = 0
        self._sub = bus.subscribe(maxlen=maxlen)
        self._thread = threading.Thread(target=self._loop, name="run-recorder", daemon=True)
        self._thread.start()

    # -- public --------------------------------------------------------------------------------

    def flush(self, timeout_s: float = 10.0) -> None:
        """Write everything published so far (blocks until the recorder thread has done it)."""
        with self._flushed:
            target = self._flush_count + 1
            self._flush_now.set()
            self._flushed.wait_for(lambda: self._flush_count >= target or not self._thread.is_alive(), timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Drain, write, and end a run left open as ``interrupted``; stop the thread."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout_s)
        self.bus.unsubscribe(self._sub)
        if self.owns_store:
            self.store.close()

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            items = self._sub.drain(timeout_s=0.1)
            for item in items:
                try:
                    self._handle(item)
                except Exception as exc:  # a bad payload must not stop the recording
                    self._error(f"could not record {getattr(item, 'kind', 'sample')}: {exc}")
            due = time.monotonic() - self._last_flush >= self.flush_interval_s
            if due or self._flush_now.is_set() or stopping:
                self._flush_now.clear()
                self._write_pending()
                with self._flushed:
                    self._flush_count += 1
                    self._flushed.notify_all()
            if stopping and not len(self._sub):
                break
        if self._open and self.run_id is not None:
            self._finish("interrupted", "recording stopped before the run finished", None, time.time())
        with self._flushed:
            self._flushed.notify_all()

    def _error(self, message: str) -> None:
        log.warning("run recorder: %s", message)
        self.errors.append(message)

    def _handle(self, item: Sample | Event) -> None:
        if isinstance(item, Sample):
            if self._open:
                self._samples.append(item)
            return
        kind, payload = item.kind, item.payload if isinstance(item.payload, Mapping) else {}
        if kind == "run_started":
            self._start(item, payload)
        elif not self._open:
            if kind == "log":
                self._pre_log.append(str(payload.get("line", "")))
            elif kind == "phase":
                self._pre_events.append((item.t_wall, kind, _jsonable(dict(payload))))
            return
        elif kind == "request":
            self._requests.append(payload)
        elif kind == "log":
            self._log.append(str(payload.get("line", "")))
        elif kind == "run_finished":
            self._write_pending()
            self._finish(str(payload.get("status") or "completed"), payload.get("reason"),
                         _jsonable(payload.get("summary") or {}), item.t_wall)
        elif kind == "level_started":
            self._write_pending()
            params = {k: v for k, v in payload.items() if k not in ("index", "label")}
            self.store.start_level(self._rid, int(payload.get("index", 0)), str(payload.get("label", "")),
                                   _jsonable(params), item.t_wall)
        elif kind == "level_finished":
            self._write_pending()
            self.store.finish_level(self._rid, int(payload.get("index", 0)), _jsonable(payload.get("summary") or {}),
                                    item.t_wall)
        elif kind == "engine_ready":
            info = _jsonable(dict(payload))
            self._events.append((item.t_wall, kind, info))
            self._write_pending()
            self.store.update_run(self._rid, engine_info=info, **(
                {"endpoint": str(payload["base_url"])} if payload.get("base_url") else {}))
        elif kind == "progress":
            return  # derived from requests; too frequent to keep
        else:  # phase, notice, ...
            self._events.append((item.t_wall, kind, _jsonable(dict(payload)) if payload else None))

    @property
    def _rid(self) -> int:
        assert self.run_id is not None
        return self.run_id

    def _start(self, item: Event, p: Mapping[str, Any]) -> None:
        if self._open:
            self._write_pending()
            self._finish("interrupted", "a new run started before this one finished", None, item.t_wall)
        config = p.get("config") or {}
        uid = str(p.get("run_id") or "") or None
        kwargs = dict(
            name=str(p.get("name") or (config.get("name") if isinstance(config, Mapping) else "") or ""),
            tags=[str(t) for t in (p.get("tags") or [])], config=_jsonable(config),
            engine_kind=str(p.get("engine_kind") or ""), engine_version=p.get("engine_version"),
            model=str(p.get("model") or ""), argv=p.get("argv"), env=p.get("env") or {},
            hardware=_jsonable(p.get("hardware") or {}), endpoint=p.get("endpoint"),
            started_at=item.t_wall, t0_mono=item.t_mono)
        try:
            self.run_id = self.store.create_run(uid=uid, **kwargs)
        except StoreError:  # the same run id published twice: keep both, the second under a fresh id
            self.run_id = self.store.create_run(uid=None, **kwargs)
        self.recorded.append(self.run_id)
        self._open = True
        self._log[:0], self._events[:0] = list(self._pre_log), list(self._pre_events)
        self._pre_log.clear()
        self._pre_events.clear()

    def _finish(self, status: str, reason: Any, summary: Mapping[str, Any] | None, t_wall: float) -> None:
        try:
            self.store.finish_run(self._rid, status if status in ("completed", "failed", "cancelled", "interrupted")
                                  else "failed", None if reason is None else str(reason), summary, t_wall)
        finally:
            self._open = False
            lost = len(self._requests) + len(self._samples) + len(self._log)
            if lost:  # held after failed writes: they must not leak into the next run
                self._error(f"{lost} items of run {self.run_id} could not be written before it ended")
            self._requests, self._samples, self._log, self._events = [], [], [], []

    def _write_pending(self) -> None:
        self._last_flush = time.monotonic()
        if self.run_id is None or not (self._requests or self._samples or self._log or self._events):
            return
        requests, samples, lines, events = self._requests, self._samples, self._log, self._events
        self._requests, self._samples, self._log, self._events = [], [], [], []
        dropped = self._sub.dropped
        try:
            self.store.write_batch(self.run_id, requests=requests, samples=samples, log_lines=lines, events=events,
                                   dropped_items=dropped if dropped != self._dropped_written else None)
            self._dropped_written = dropped
        except Exception as exc:  # locked past the busy timeout, disk full...: keep it for the next flush
            held = len(requests) + len(samples) + len(lines) + len(self._requests) + len(self._samples)
            if held <= MAX_HELD_ITEMS:
                self._requests[:0], self._samples[:0] = requests, samples
                self._log[:0], self._events[:0] = lines, events
                self._error(f"could not write a batch ({exc}); retrying with the next flush")
            else:
                self._error(f"could not write {len(requests)} requests and {len(samples)} samples, dropped: {exc}")


def record_to_default_store(bus: Bus, db_path: str | Path | None = None) -> RunRecorder:
    """A recorder on the user's run database (``--db``/``TUNEBENCH_DB`` or the default); its
    ``close()`` also closes the store."""
    return RunRecorder(bus, RunStore(db_path), owns_store=True)
