"""The run store: one SQLite file that the GUI and CLI runs write concurrently (WAL, busy
timeout), migrated to the newest schema on open, and cleaned of runs whose writer died.

Writes are batched by the caller (``write_batch``) so telemetry and requests land at least once
a second during a run; reads return plain pydantic models or numpy columns.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import time
import uuid
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from pydantic import BaseModel, Field
from sqlalchemy import Connection, Engine, create_engine, delete, event, func, insert, select, update

from db.models import (
    RUN_STATUSES,
    Base,
    Level,
    LogChunk,
    Request,
    RequestChunk,
    Run,
    RunEvent,
    RunTag,
    SampleChunk,
)
from db.summary import RequestArrays, summarize_requests

DB_ENV = "TUNEBENCH_DB"
BUSY_TIMEOUT_S = 30.0
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
FINAL_STATUSES = tuple(s for s in RUN_STATUSES if s != "running")
_SECRET_NAME_RE = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
_SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token"})
MASK = "***"


class StoreError(Exception):
    """A store problem with a one-line, user-facing message."""


def default_db_path() -> Path:
    """``TUNEBENCH_DB``, else ``runs.db`` in the user data directory."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    from engine_adapters.paths import data_dir

    return data_dir() / "runs.db"


def mask_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    """Secrets never reach the database, even if a caller forgot to mask them."""
    return {str(k): (MASK if _SECRET_NAME_RE.search(str(k)) and v not in (None, "", MASK) else str(v))
            for k, v in (env or {}).items()}


def mask_argv(argv: Sequence[Any] | None) -> list[str] | None:
    if argv is None:
        return None
    out: list[str] = []
    hide_next = False
    for token in (str(t) for t in argv):
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif token.split("=", 1)[0] in _SECRET_FLAGS:
            hide_next = "=" not in token
            out.append(token if hide_next else token.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(token)
    return out


def _process_identity() -> tuple[int, float]:
    me = psutil.Process()
    return me.pid, me.create_time()


def writer_alive(pid: int | None, create_time: float | None) -> bool:
    """Is the process that wrote a run still the same live process (pids get reused)?"""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except psutil.Error:
        return False


# --- read models -------------------------------------------------------------------------------

class LevelInfo(BaseModel):
    idx: int
    label: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    summary: dict[str, Any] | None = None


class RunInfo(BaseModel):
    """A run as listed: identity, status and headline metrics."""

    id: int
    uid: str
    name: str
    status: str
    reason: str | None = None
    tags: list[str] = Field(default_factory=list)
    notes: str = ""
    started_at: float
    finished_at: float | None = None
    engine_kind: str = ""
    engine_version: str | None = None
    model: str = ""
    imported: bool = False
    imported_from: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


class RunDetail(RunInfo):
    """Everything recorded about a run except the bulky series (requests, samples, log)."""

    endpoint: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    argv: list[str] | None = None
    env: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    engine_info: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)
    t0_mono: float | None = None
    levels: list[LevelInfo] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    n_requests: int = 0
    n_samples: int = 0
    n_log_lines: int = 0
    dropped_items: int = 0
    writer_pid: int | None = None


@dataclass
class SeriesBlock:
    """One source's samples: times and an n x k value matrix (NaN = not sampled)."""

    source: str
    names: list[str]
    t_mono: np.ndarray
    t_wall: np.ndarray
    values: np.ndarray

    def column(self, name: str) -> np.ndarray:
        return self.values[:, self.names.index(name)]


@dataclass
class SampleIn:
    """What ``write_batch`` accepts for telemetry (app.bus.Sample has the same fields)."""

    source: str
    t_mono: float
    t_wall: float
    values: Mapping[str, float]


# --- packing -----------------------------------------------------------------------------------

def _f(value: Any) -> float | None:
    if value is None or value.__class__ is bool:
        return None
    if value.__class__ is float:
        return value if value - value == 0.0 else None  # finite
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _i(value: Any) -> int | None:
    f = _f(value)
    return None if f is None else int(f)


def _first(rec: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in rec and rec[key] is not None:
            return rec[key]
    return None


_REQUEST_ALIASES = {
    "start_wall": ("start_wall_s", "t_start_wall", "started_at", "start_time", "t_wall"),
    "e2e_ms": ("latency_ms",),
    "input_tokens": ("prompt_tokens",),
    "output_tokens": ("completion_tokens", "tokens"),
    "level": ("level_index",),
}
_KNOWN_REQUEST_KEYS = frozenset({"level", "start_wall", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens",
                                 "itl_ms", "error", "seq", "ok", "run_id"} | {k for keys in _REQUEST_ALIASES.values() for k in keys})
_NUMBER_TYPES = (float, int)


def _num(value: Any) -> Any:
    """Floats and ints pass as they are (SQLite stores NaN as NULL); anything else is parsed."""
    return value if value.__class__ in _NUMBER_TYPES else _f(value)


def _get(rec: Mapping[str, Any], key: str) -> Any:
    value = rec.get(key)
    if value is None and key in _REQUEST_ALIASES:
        for alias in _REQUEST_ALIASES[key]:
            value = rec.get(alias)
            if value is not None:
                break
    return value


@dataclass
class RequestBatch:
    """Request records as ``requests`` rows plus one packed chunk (ITLs, other fields)."""

    rows: list[tuple[Any, ...]]
    counts: array
    values: array
    extra_keys: list[str]
    extras: list[Any]  # value lists in extra_keys order, or dicts for records with other keys

    def extras_blob(self) -> bytes | None:
        """zlib JSON ``{"keys": [...], "rows": [[...] or {...}, ...]}``; None when there is nothing."""
        if not self.extra_keys and not any(self.extras):
            return None
        return zlib.compress(_EXTRA_ENCODER.encode({"keys": self.extra_keys, "rows": self.extras}).encode(), 1)


def unpack_extras(blob: bytes) -> list[dict[str, Any]]:
    doc = json.loads(zlib.decompress(blob))
    keys = doc["keys"]
    return [row if isinstance(row, dict) else dict(zip(keys, row, strict=True)) for row in doc["rows"]]


_EXTRA_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))  # json.dumps(default=) builds one per call


def _int_or_none(value: Any) -> int | None:
    return value if value.__class__ is int else (None if value is None else _i(value))


def pack_requests(run_id: int, seq_start: int, records: Sequence[Mapping[str, Any]]) -> RequestBatch:
    """Request records (the bus payload; a few key aliases accepted) as rows and an ITL chunk.
    This runs for every request of every run, so it avoids per-field function calls where it can."""
    rows = []
    extras: list[Any] = []
    counts = array("i")
    values = array("f")
    known = _KNOWN_REQUEST_KEYS
    num_types = _NUMBER_TYPES
    first_keys = records[0].keys() if records else {}.keys()
    extra_keys = [k for k in first_keys if k not in known]
    for offset, rec in enumerate(records):
        get = rec.get
        itl = get("itl_ms")
        if itl is None:
            counts.append(0)
        else:
            counts.append(len(itl))
            values.extend(itl.tolist() if isinstance(itl, np.ndarray) else itl)
        error = get("error")
        if not error and get("ok") is False:
            error = get("error_kind") or "failed"
        if rec.keys() == first_keys:  # same fields as the first record: values only, in order
            extras.append([rec[k] for k in extra_keys])
        else:
            extras.append({k: v for k, v in rec.items() if k not in known})
        start = get("start_wall")
        if start is None:
            start = _get(rec, "start_wall")
        e2e = get("e2e_ms")
        if e2e is None:
            e2e = _get(rec, "e2e_ms")
        ttft = get("ttft_ms")
        in_tok = get("input_tokens")
        out_tok = get("output_tokens")
        level = get("level")
        rows.append((
            run_id, seq_start + offset,
            _int_or_none(level if level is not None else _get(rec, "level")),
            start if start.__class__ in num_types else _f(start),
            ttft if ttft.__class__ in num_types else _f(ttft),
            e2e if e2e.__class__ in num_types else _f(e2e),
            _int_or_none(in_tok if in_tok is not None else _get(rec, "input_tokens")),
            _int_or_none(out_tok if out_tok is not None else _get(rec, "output_tokens")),
            None if error in (None, "", False) else str(error),
        ))
    return RequestBatch(rows, counts, values, extra_keys, extras)


# The per-flush inserts go straight to the driver: a run makes thousands of them.
_CHUNK_INSERT = ("INSERT INTO request_chunks (run_id, seq_start, n, counts, \"values\", extras) "
                 "VALUES (?, ?, ?, ?, ?, ?)")
_SAMPLE_INSERT = "INSERT INTO sample_chunks (run_id, source, n, names, t_mono, t_wall, data) VALUES (?, ?, ?, ?, ?, ?, ?)"
_LOG_INSERT = "INSERT INTO log_chunks (run_id, seq, n_lines, data) VALUES (?, ?, ?, ?)"
_EVENT_INSERT = Base.metadata.tables["run_events"].insert()  # rare: Core, with JSON handling
_INSERT_REQUEST = ("INSERT INTO requests (run_id, seq, level, start_wall, ttft_ms, e2e_ms, input_tokens, output_tokens, "
                   "error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


def pack_samples(samples: Sequence[SampleIn | Any]) -> list[dict[str, Any]]:
    """Group samples by source into chunk rows (names = union of the keys seen)."""
    by_source: dict[str, list[Any]] = {}
    for s in samples:
        by_source.setdefault(s.source, []).append(s)
    rows = []
    for source, items in by_source.items():
        names: dict[str, int] = {}
        for s in items:
            for key in s.values:
                names.setdefault(str(key), len(names))
        n = len(items)
        order = list(names)
        nan = math.nan
        try:  # the common case: plain numbers (None and missing names become NaN)
            data = np.array([[nan if (v := s.values.get(name)) is None else v for name in order] for s in items],
                            dtype="<f8").reshape(n, len(order))
        except (TypeError, ValueError):
            data = np.array([[nan if (v := _f(s.values.get(name))) is None else v for name in order] for s in items],
                            dtype="<f8").reshape(n, len(order))
        rows.append({
            "source": source, "n": n, "names": list(names),
            "t_mono": np.fromiter((s.t_mono for s in items), "<f8", n).tobytes(),
            "t_wall": np.fromiter((s.t_wall for s in items), "<f8", n).tobytes(),
            "data": data.astype("<f8").tobytes(),
        })
    return rows


def _merge_blocks(source: str, chunks: Sequence[Any]) -> SeriesBlock:
    names: dict[str, int] = {}
    for c in chunks:
        for name in c.names:
            names.setdefault(name, len(names))
    total = sum(c.n for c in chunks)
    values = np.full((total, len(names)), np.nan)
    t_mono = np.empty(total)
    t_wall = np.empty(total)
    row = 0
    for c in chunks:
        block = np.frombuffer(c.data, "<f8").reshape(c.n, len(c.names))
        cols = [names[nm] for nm in c.names]
        if cols == list(range(len(names))):
            values[row:row + c.n] = block
        else:
            values[row:row + c.n, cols] = block
        t_mono[row:row + c.n] = np.frombuffer(c.t_mono, "<f8")
        t_wall[row:row + c.n] = np.frombuffer(c.t_wall, "<f8")
        row += c.n
    order = np.argsort(t_mono, kind="stable")
    return SeriesBlock(source, list(names), t_mono[order], t_wall[order], values[order])


# --- the store ---------------------------------------------------------------------------------

class RunStore:
    """The SQLite run database. Safe to share between threads; several processes may open the
    same file (WAL). Opening migrates to the newest schema and marks orphaned runs interrupted."""

    def __init__(self, path: str | Path | None = None, *, mark_interrupted: bool = True) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the directory for the run database {self.path}: {exc.strerror}") from None
        self.engine: Engine = create_engine(
            f"sqlite+pysqlite:///{self.path}",
            connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        )
        event.listen(self.engine, "connect", _on_connect)
        self._pid, self._create_time = _process_identity()
        self._seq: dict[tuple[int, str], int] = {}
        try:
            self._migrate()
        except Exception as exc:  # sqlite3.DatabaseError: "file is not a database", locked, ...
            self.engine.dispose()
            raise StoreError(f"cannot open the run database {self.path}: {str(exc).splitlines()[0]}") from None
        self.interrupted_on_open: list[int] = self.mark_interrupted() if mark_interrupted else []

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _migration_lock(self) -> Iterator[None]:
        lock_path = self.path.with_name(self.path.name + ".migrate.lock")
        with open(lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def schema_revision(self) -> str | None:
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def _migrate(self, revision: str = "head") -> None:
        config = alembic_config()
        head = ScriptDirectory.from_config(config).get_current_head()
        with self.engine.connect() as conn:
            if revision == "head" and MigrationContext.configure(conn).get_current_revision() == head:
                return
        with self._migration_lock(), self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    def mark_interrupted(self) -> list[int]:
        """Runs left ``running`` by a process that no longer exists become ``interrupted``."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Run.id, Run.writer_pid, Run.writer_create_time)
                                .where(Run.status == "running")).all()
        dead = [r.id for r in rows if not writer_alive(r.writer_pid, r.writer_create_time)]
        for run_id in dead:
            pid = next(r.writer_pid for r in rows if r.id == run_id)
            self.finish_run(run_id, "interrupted",
                            f"the process that recorded it (pid {pid}) ended before the run finished",
                            only_if_running=True)
        return dead

    # -- writing -------------------------------------------------------------------------------

    def create_run(
        self,
        *,
        uid: str | None = None,
        name: str = "",
        tags: Iterable[str] = (),
        notes: str = "",
        config: Mapping[str, Any] | None = None,
        engine_kind: str = "",
        engine_version: str | None = None,
        model: str = "",
        argv: Sequence[Any] | None = None,
        env: Mapping[str, Any] | None = None,
        hardware: Mapping[str, Any] | None = None,
        endpoint: str | None = None,
        started_at: float | None = None,
        t0_mono: float | None = None,
        status: str = "running",
        imported_from: str | None = None,
    ) -> int:
        """A new run row (``running`` unless imported); returns its id."""
        if status not in RUN_STATUSES:
            raise StoreError(f"unknown run status '{status}' (known: {', '.join(RUN_STATUSES)})")
        now = time.time()
        values = dict(
            uid=str(uid or uuid.uuid4().hex), name=name, notes=notes, status=status, created_at=now,
            started_at=started_at if started_at is not None else now, t0_mono=t0_mono,
            engine_kind=engine_kind, engine_version=engine_version, model=model, endpoint=endpoint,
            config=dict(config or {}), argv=mask_argv(argv), env=mask_env(env), hardware=dict(hardware or {}),
            engine_info={}, summary={}, metrics={}, imported=imported_from is not None, imported_from=imported_from,
            writer_pid=self._pid if status == "running" else None,
            writer_create_time=self._create_time if status == "running" else None, dropped_items=0,
        )
        with self.engine.begin() as conn:
            if conn.execute(select(Run.id).where(Run.uid == values["uid"])).first() is not None:
                raise StoreError(f"a run with id {values['uid']} is already stored")
            key = conn.execute(insert(Run).values(**values)).inserted_primary_key
            assert key is not None
            run_id = int(key[0])
            unique_tags = sorted({t for t in tags if t})
            if unique_tags:
                conn.execute(insert(RunTag), [{"run_id": run_id, "tag": t} for t in unique_tags])
        return run_id

    def write_batch(
        self,
        run_id: int,
        *,
        requests: Sequence[Mapping[str, Any]] = (),
        samples: Sequence[SampleIn | Any] = (),
        log_lines: Sequence[str] = (),
        events: Sequence[tuple[float, str, Mapping[str, Any] | None]] = (),
        dropped_items: int | None = None,
    ) -> None:
        """Everything that arrived since the last flush, in one transaction."""
        with self.engine.begin() as conn:
            if requests:
                seq_start = self._next_seq(conn, run_id, "requests", Request.seq)
                batch = pack_requests(run_id, seq_start, requests)
                conn.exec_driver_sql(_INSERT_REQUEST, batch.rows)
                extras = batch.extras_blob()
                conn.exec_driver_sql(_CHUNK_INSERT, (run_id, seq_start, len(batch.rows), batch.counts.tobytes(),
                                                     batch.values.tobytes(), extras))
                self._seq[(run_id, "requests")] = seq_start + len(batch.rows)
            if samples:
                conn.exec_driver_sql(_SAMPLE_INSERT, [
                    (run_id, row["source"], row["n"], json.dumps(row["names"]), row["t_mono"], row["t_wall"], row["data"])
                    for row in pack_samples(samples)])
            if log_lines:
                seq = self._next_seq(conn, run_id, "log", LogChunk.seq)
                text = "\n".join(log_lines).encode("utf-8", "replace")
                conn.exec_driver_sql(_LOG_INSERT, (run_id, seq, len(log_lines), zlib.compress(text, 6)))
                self._seq[(run_id, "log")] = seq + 1
            if events:
                conn.execute(_EVENT_INSERT, [{"run_id": run_id, "t_wall": t, "kind": k, "payload": p}
                                             for t, k, p in events])
            if dropped_items is not None:
                conn.execute(update(Run).where(Run.id == run_id).values(dropped_items=dropped_items))

    def _next_seq(self, conn: Connection, run_id: int, what: str, column: Any) -> int:
        """Next sequence number of a run's requests or log chunks (cached: one writer per run)."""
        cached = self._seq.get((run_id, what))
        if cached is not None:
            return cached
        table = column.class_
        return int(conn.execute(select(func.coalesce(func.max(column), -1))
                                .where(table.run_id == run_id)).scalar_one()) + 1

    def add_requests(self, run_id: int, records: Sequence[Mapping[str, Any]]) -> None:
        self.write_batch(run_id, requests=records)

    def add_samples(self, run_id: int, samples: Sequence[SampleIn | Any]) -> None:
        self.write_batch(run_id, samples=samples)

    def add_log(self, run_id: int, lines: Sequence[str]) -> None:
        self.write_batch(run_id, log_lines=lines)

    def update_run(self, run_id: int, **values: Any) -> None:
        """Set columns of a run (``engine_info`` and ``summary`` dicts are merged, not replaced)."""
        allowed = {"name", "notes", "engine_version", "endpoint", "engine_info", "summary", "model", "argv"}
        unknown = set(values) - allowed
        if unknown:
            raise StoreError(f"cannot update {', '.join(sorted(unknown))}")
        with self.engine.begin() as conn:
            row = conn.execute(select(Run.engine_info, Run.summary).where(Run.id == run_id)).first()
            if row is None:
                raise StoreError(f"no run {run_id}")
            if "engine_info" in values:
                values["engine_info"] = {**(row.engine_info or {}), **values["engine_info"]}
            if "summary" in values:
                values["summary"] = {**(row.summary or {}), **values["summary"]}
            if "argv" in values:
                values["argv"] = mask_argv(values["argv"])
            conn.execute(update(Run).where(Run.id == run_id).values(**values))

    def start_level(self, run_id: int, idx: int, label: str = "", params: Mapping[str, Any] | None = None,
                    started_at: float | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(Level).where(Level.run_id == run_id, Level.idx == idx))
            conn.execute(insert(Level).values(run_id=run_id, idx=idx, label=label, params=dict(params or {}),
                                              started_at=started_at if started_at is not None else time.time()))

    def finish_level(self, run_id: int, idx: int, summary: Mapping[str, Any] | None,
                     finished_at: float | None = None) -> None:
        finished_at = finished_at if finished_at is not None else time.time()
        with self.engine.begin() as conn:
            done = conn.execute(update(Level).where(Level.run_id == run_id, Level.idx == idx)
                                .values(summary=dict(summary or {}), finished_at=finished_at)).rowcount
            if not done:
                conn.execute(insert(Level).values(run_id=run_id, idx=idx, label="", params={},
                                                  finished_at=finished_at, summary=dict(summary or {})))

    def finish_run(self, run_id: int, status: str, reason: str | None = None,
                   summary: Mapping[str, Any] | None = None, finished_at: float | None = None,
                   *, only_if_running: bool = False, extra_metrics: Mapping[str, float] | None = None) -> None:
        """Final status; derives metrics from the stored requests and compacts telemetry.
        ``extra_metrics`` (e.g. an imported file's own figures) fill what the requests cannot give."""
        if status not in FINAL_STATUSES:
            raise StoreError(f"a run cannot finish as '{status}' (expected one of {', '.join(FINAL_STATUSES)})")
        self.compact_samples(run_id)
        metrics = {**dict(extra_metrics or {}), **self.compute_metrics(run_id)}
        with self.engine.begin() as conn:
            row = conn.execute(select(Run.status, Run.summary).where(Run.id == run_id)).first()
            if row is None or (only_if_running and row.status != "running"):
                return
            if finished_at is None:
                finished_at = time.time() if status != "interrupted" else self._last_activity(conn, run_id)
            merged = {**(row.summary or {}), **dict(summary or {})}
            conn.execute(update(Run).where(Run.id == run_id).values(
                status=status, reason=reason, finished_at=finished_at, summary=merged, metrics=metrics))

    def _last_activity(self, conn: Connection, run_id: int) -> float:
        """When an interrupted run last wrote something (its real end, not the time we noticed)."""
        candidates = [conn.execute(select(func.max(Request.start_wall + func.coalesce(Request.e2e_ms, 0) / 1000.0))
                                   .where(Request.run_id == run_id)).scalar(),
                      conn.execute(select(func.max(RunEvent.t_wall)).where(RunEvent.run_id == run_id)).scalar(),
                      conn.execute(select(Run.started_at).where(Run.id == run_id)).scalar()]
        for block in self.samples(run_id, conn=conn).values():
            if block.t_wall.size:
                candidates.append(float(block.t_wall.max()))
        return max(float(c) for c in candidates if c is not None)

    def compact_samples(self, run_id: int) -> None:
        """Merge a run's per-flush chunks into one chunk per source (fast reads for comparison)."""
        with self.engine.begin() as conn:
            counts = conn.execute(select(SampleChunk.source, func.count()).where(SampleChunk.run_id == run_id)
                                  .group_by(SampleChunk.source)).all()
            if all(n <= 1 for _, n in counts):
                return
            blocks = self.samples(run_id, conn=conn)
            conn.execute(delete(SampleChunk).where(SampleChunk.run_id == run_id))
            conn.execute(insert(SampleChunk), [{
                "run_id": run_id, "source": b.source, "n": int(b.t_mono.size), "names": b.names,
                "t_mono": b.t_mono.astype("<f8").tobytes(), "t_wall": b.t_wall.astype("<f8").tobytes(),
                "data": np.ascontiguousarray(b.values, "<f8").tobytes()} for b in blocks.values()])

    def compute_metrics(self, run_id: int) -> dict[str, float]:
        """Store-side metrics from the request rows, overall and per level (``L<idx>.<name>``)."""
        req = self.requests(run_id)
        metrics = summarize_requests(req)
        levels = np.unique(req.level[np.isfinite(req.level)]) if len(req) else np.empty(0)
        if len(levels) > 1:
            for lv in levels:
                for key, value in summarize_requests(req.select(req.level == lv)).items():
                    metrics[f"L{int(lv)}.{key}"] = value
        return metrics

    # -- editing -------------------------------------------------------------------------------

    def rename(self, run_id: int, name: str) -> None:
        self.update_run(self.resolve(run_id), name=name)

    def set_notes(self, run_id: int, notes: str) -> None:
        self.update_run(self.resolve(run_id), notes=notes)

    def tag(self, run_id: int, add: Iterable[str] = (), remove: Iterable[str] = ()) -> list[str]:
        run_id = self.resolve(run_id)
        with self.engine.begin() as conn:
            for t in remove:
                conn.execute(delete(RunTag).where(RunTag.run_id == run_id, RunTag.tag == t))
            existing = set(conn.execute(select(RunTag.tag).where(RunTag.run_id == run_id)).scalars())
            new = sorted({t for t in add if t and t not in existing})
            if new:
                conn.execute(insert(RunTag), [{"run_id": run_id, "tag": t} for t in new])
            return sorted(conn.execute(select(RunTag.tag).where(RunTag.run_id == run_id)).scalars())

    def delete(self, run_id: int) -> None:
        run_id = self.resolve(run_id)
        with self.engine.begin() as conn:
            for table in (Request, RequestChunk, SampleChunk, LogChunk, RunEvent, Level, RunTag):
                conn.execute(delete(table).where(table.run_id == run_id))
            conn.execute(delete(Run).where(Run.id == run_id))
        for key in [k for k in self._seq if k[0] == run_id]:
            del self._seq[key]

    # -- reading -------------------------------------------------------------------------------

    def resolve(self, ref: int | str) -> int:
        """A run by numeric id, uid (or a unique uid prefix of 4+ characters) or exact name."""
        text = str(ref).strip()
        with self.engine.connect() as conn:
            if text.isdigit():
                found = conn.execute(select(Run.id).where(Run.id == int(text))).scalar()
                if found is not None:
                    return int(found)
            for clause in (Run.uid == text, Run.name == text) + (
                    (Run.uid.startswith(text, autoescape=True),) if len(text) >= 4 else ()):
                ids = list(conn.execute(select(Run.id).where(clause).limit(3)).scalars())
                if len(ids) == 1:
                    return int(ids[0])
                if len(ids) > 1:
                    raise StoreError(f"'{text}' matches several runs: use the numeric id (see `tunebench runs list`)")
        raise StoreError(f"no run '{text}' in {self.path} (see `tunebench runs list`)")

    def _tags(self, conn: Connection, ids: Sequence[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {i: [] for i in ids}
        if ids:
            for run_id, tag in conn.execute(select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(ids))
                                            .order_by(RunTag.tag)):
                out[run_id].append(tag)
        return out

    def list_runs(
        self,
        *,
        engine: str | None = None,
        model: str | None = None,
        tag: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        name: str | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """Newest first. ``model`` and ``name`` match substrings; the rest match exactly."""
        cols = [Run.id, Run.uid, Run.name, Run.status, Run.reason, Run.notes, Run.started_at, Run.finished_at,
                Run.engine_kind, Run.engine_version, Run.model, Run.imported, Run.imported_from, Run.metrics]
        query = select(*cols).order_by(Run.started_at.desc(), Run.id.desc())
        if engine:
            query = query.where(Run.engine_kind == engine)
        if model:
            query = query.where(Run.model.contains(model, autoescape=True))
        if name:
            query = query.where(Run.name.contains(name, autoescape=True))
        if status:
            query = query.where(Run.status == status)
        if since is not None:
            query = query.where(Run.started_at >= since)
        if until is not None:
            query = query.where(Run.started_at < until)
        if tag:
            query = query.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
        if limit:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
            tags = self._tags(conn, [r.id for r in rows])
        return [RunInfo(**r._asdict(), tags=tags[r.id]) for r in rows]

    def get_run(self, ref: int | str) -> RunDetail:
        run_id = self.resolve(ref)
        with self.engine.connect() as conn:
            run = conn.execute(select(Run.__table__).where(Run.id == run_id)).first()
            if run is None:  # deleted meanwhile
                raise StoreError(f"no run {run_id}")
            data = {k: v for k, v in run._asdict().items() if k != "writer_create_time"}
            levels = [LevelInfo(idx=lv.idx, label=lv.label, params=lv.params or {}, started_at=lv.started_at,
                                finished_at=lv.finished_at, summary=lv.summary)
                      for lv in conn.execute(select(Level.__table__).where(Level.run_id == run_id).order_by(Level.idx))]
            events = [{"t_wall": e.t_wall, "kind": e.kind, "payload": e.payload}
                      for e in conn.execute(select(RunEvent.__table__).where(RunEvent.run_id == run_id)
                                            .order_by(RunEvent.id))]
            n_requests = conn.execute(select(func.count()).where(Request.run_id == run_id)).scalar_one()
            n_samples = conn.execute(select(func.coalesce(func.sum(SampleChunk.n), 0))
                                     .where(SampleChunk.run_id == run_id)).scalar_one()
            n_log = conn.execute(select(func.coalesce(func.sum(LogChunk.n_lines), 0))
                                 .where(LogChunk.run_id == run_id)).scalar_one()
            tags = self._tags(conn, [run_id])[run_id]
        data.pop("created_at", None)
        return RunDetail(**data, tags=tags, levels=levels, events=events, n_requests=n_requests,
                         n_samples=int(n_samples), n_log_lines=int(n_log))

    def _itls(self, conn: Connection, run_id: int) -> tuple[np.ndarray, np.ndarray]:
        """All ITLs of a run back to back, and per-request bounds (request seq i: b[i]:b[i+1])."""
        chunks = conn.execute(select(RequestChunk.counts, RequestChunk.values).where(RequestChunk.run_id == run_id)
                              .order_by(RequestChunk.seq_start)).all()
        counts = np.frombuffer(b"".join(c.counts for c in chunks), np.int32) if chunks else np.empty(0, np.int32)
        flat = np.frombuffer(b"".join(c.values for c in chunks), np.float32) if chunks else np.empty(0, np.float32)
        return flat, np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))

    def requests(self, ref: int | str) -> RequestArrays:
        """A run's requests as numpy columns, in arrival order."""
        run_id = self.resolve(ref) if not isinstance(ref, int) else ref
        with self.engine.connect() as conn:  # plain DBAPI tuples: Row objects cost a third of the time
            rows = conn.exec_driver_sql(
                "SELECT level, start_wall, ttft_ms, e2e_ms, input_tokens, output_tokens, seq "
                "FROM requests WHERE run_id = ? ORDER BY seq", (run_id,)).cursor.fetchall()
            failed = conn.exec_driver_sql("SELECT seq, error FROM requests WHERE run_id = ? AND error IS NOT NULL",
                                          (run_id,)).cursor.fetchall()
            flat, bounds = self._itls(conn, run_id)
        n = len(rows)
        if n == 0:
            empty = np.empty(0)
            return RequestArrays(empty, empty, empty, empty, empty, empty, np.empty(0, bool))
        numeric = np.array(rows, dtype=float)  # None -> nan
        errors: list[str | None] = [None] * n
        if failed:
            position = {int(seq): i for i, seq in enumerate(numeric[:, 6])}
            for seq, error in failed:
                errors[position[seq]] = error
        if bounds.size != n + 1:  # cannot happen: rows and chunks are written in one transaction
            raise StoreError(f"run {run_id}: {n} requests but {bounds.size - 1} ITL records")
        return RequestArrays(
            level=numeric[:, 0], start_wall=numeric[:, 1], ttft_ms=numeric[:, 2], e2e_ms=numeric[:, 3],
            input_tokens=numeric[:, 4], output_tokens=numeric[:, 5],
            ok=np.array([e is None for e in errors], dtype=bool),
            errors=errors, itl_flat=flat, itl_bounds=bounds,
        )

    def request_records(self, ref: int | str) -> list[dict[str, Any]]:
        """Requests as dicts (for JSON/CSV export), in arrival order."""
        run_id = self.resolve(ref) if not isinstance(ref, int) else ref
        with self.engine.connect() as conn:
            rows = conn.execute(select(Request.__table__).where(Request.run_id == run_id)
                                .order_by(Request.seq)).all()
            flat, bounds = self._itls(conn, run_id)
            extras: dict[int, dict[str, Any]] = {}
            for seq_start, blob in conn.execute(select(RequestChunk.seq_start, RequestChunk.extras)
                                                .where(RequestChunk.run_id == run_id, RequestChunk.extras.is_not(None))):
                if blob is None:  # excluded by the query; for the type checker
                    continue
                for offset, extra in enumerate(unpack_extras(blob)):
                    if extra:
                        extras[seq_start + offset] = extra
        out = []
        for i, r in enumerate(rows):
            itl = flat[bounds[i]:bounds[i + 1]] if i + 1 < bounds.size else flat[:0]
            rec: dict[str, Any] = {
                "seq": r.seq, "level": r.level, "start_wall": r.start_wall, "ttft_ms": r.ttft_ms,
                "e2e_ms": r.e2e_ms, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                "itl_ms": [round(float(x), 4) for x in itl], "error": r.error,
            }
            if r.seq in extras:
                rec["extra"] = extras[r.seq]
            out.append(rec)
        return out

    def samples(self, ref: int | str, *, conn: Connection | None = None) -> dict[str, SeriesBlock]:
        """Telemetry per source, in time order."""
        run_id = self.resolve(ref) if not isinstance(ref, int) else ref
        query = select(SampleChunk.__table__).where(SampleChunk.run_id == run_id).order_by(SampleChunk.id)
        if conn is None:
            with self.engine.connect() as own:
                chunks = own.execute(query).all()
        else:
            chunks = conn.execute(query).all()
        by_source: dict[str, list[Any]] = {}
        for c in chunks:
            by_source.setdefault(c.source, []).append(c)
        return {source: _merge_blocks(source, cs) for source, cs in by_source.items()}

    def log_lines(self, ref: int | str) -> list[str]:
        run_id = self.resolve(ref) if not isinstance(ref, int) else ref
        with self.engine.connect() as conn:
            blobs = conn.execute(select(LogChunk.data).where(LogChunk.run_id == run_id)
                                 .order_by(LogChunk.seq)).scalars().all()
        lines: list[str] = []
        for blob in blobs:
            lines.extend(zlib.decompress(blob).decode("utf-8", "replace").split("\n"))
        return lines


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    """WAL lets a reader (the GUI) and a writer (a CLI run) share the file; the busy timeout makes
    a second writer wait instead of failing."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def create_at_revision(path: str | Path, revision: str) -> None:
    """A database at an older schema revision (for migration tests)."""
    engine = create_engine(f"sqlite+pysqlite:///{Path(path)}")
    event.listen(engine, "connect", _on_connect)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    engine.dispose()
