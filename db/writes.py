"""Writing the run store: creating runs, the per-second batches a recording flushes, levels,
the final status and metrics, editing, deleting, and importing whole runs in one transaction.

Secrets are masked here (``engine_adapters.secrets``), whatever the caller did. A run's writer is
remembered (pid and start time) so that a later open can tell a live run from an orphaned one.
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from db.codecs import KNOWN_REQUEST_KEYS, EncodedRequests, encode_requests
from db.dialects import driver_sql
from db.errors import StoreError, guarded
from db.models import RUN_STATUSES, Base, Level, LogChunk, RequestChunk, Run, RunEvent, RunTag, SampleChunk
from db.queries import RunQueries, request_arrays
from db.records import ImportedRun, LevelInfo, RequestArrays, SampleIn, SeriesBlock, gpu_model_of
from db.series import encode_log, encode_series, pack_samples
from engine_adapters.process_group import pid_namespace
from engine_adapters.process_group import same_process_alive as writer_alive
from engine_adapters.secrets import mask_argv, mask_env, mask_obj, mask_text, mask_url


def this_host() -> str:
    """The host name runs recorded here carry (the one ``HardwareInfo.hostname`` records)."""
    return platform.node()


def default_author() -> str:
    """Who runs recorded here are by: ``TUNEBENCH_AUTHOR``, else the OS user."""
    name = os.environ.get(AUTHOR_ENV, "").strip()
    if name:
        return name
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return f"uid {os.getuid()}"


def writer_may_be_alive(pid: int | None, start: float | None, namespace: str | None) -> bool:
    """Whether the process that writes a run (or a tune) may still be writing it. Only a writer
    whose pids mean the same here (``pid_namespace``: this host, boot and container) can be looked
    at: another one (a shared store) is taken as alive, unless it ran on this host before its
    last boot. An empty namespace: recorded before namespaces were, on this machine."""
    if namespace and namespace != (here := pid_namespace()):
        host, boot, _ = (namespace.split("/") + ["", ""])[:3]
        this_host_name, this_boot, _ = here.split("/")
        return not (host == this_host_name and boot != this_boot)  # this host rebooted since: it died
    return writer_alive(pid, start)


AUTHOR_ENV = "TUNEBENCH_AUTHOR"
FINAL_STATUSES = tuple(s for s in RUN_STATUSES if s != "running")
IMPORT_CHUNK_REQUESTS = 8192
"""An imported run's requests are stored in chunks of this many (a recording's are its flushes)."""

# The per-flush inserts go straight to the driver: a run makes thousands of them.
_CHUNK_INSERT = "INSERT INTO request_chunks (run_id, seq_start, n, end_wall, columns, itl) VALUES (?, ?, ?, ?, ?, ?)"
_SAMPLE_INSERT = ("INSERT INTO sample_chunks (run_id, source, n, names, t_mono, t_wall, data, codec) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
_LOG_INSERT = "INSERT INTO log_chunks (run_id, seq, n_lines, data) VALUES (?, ?, ?, ?)"
_EVENT_INSERT = Base.metadata.tables["run_events"].insert()  # rare: Core, with JSON handling
_IMPORTED_FIELDS = frozenset({"level", "start_wall", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens", "itl_ms",
                              "error"})



def _insert_requests(conn: Connection, run_id: int, seq_start: int, chunk: EncodedRequests) -> None:
    conn.exec_driver_sql(driver_sql(conn, _CHUNK_INSERT), (run_id, seq_start, chunk.n, chunk.end_wall, chunk.columns, chunk.itl))


def _insert_samples(conn: Connection, run_id: int, samples: Sequence[SampleIn | Any], *, packed: bool = False) -> None:
    """One flush's samples as raw chunks, or (``packed``: a whole run at once) as the packed
    chunks ``compact_samples`` makes."""
    rows = []
    for r in pack_samples(samples):
        if packed:
            t_mono = np.frombuffer(r.t_mono, "<f8")
            order = np.argsort(t_mono, kind="stable")
            block = SeriesBlock(r.source, r.names, t_mono[order], np.frombuffer(r.t_wall, "<f8")[order],
                                np.frombuffer(r.data, "<f8").reshape(r.n, len(r.names))[order])
            rows.append((run_id, r.source, r.n, json.dumps(r.names), b"", b"", encode_series(block), 1))
        else:
            rows.append((run_id, r.source, r.n, json.dumps(r.names), r.t_mono, r.t_wall, r.data, 0))
    conn.exec_driver_sql(driver_sql(conn, _SAMPLE_INSERT), rows)


class RunWrites(RunQueries):
    """Write access (``RunStore`` sets the identity of this process and the sequence cache)."""

    _pid: int
    _create_time: float
    author: str
    _seq: dict[tuple[int, str], int]

    @guarded
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
            engine_kind=engine_kind, engine_version=engine_version, model=model,
            endpoint=None if endpoint is None else mask_url(endpoint),
            config=mask_obj(dict(config or {})), argv=mask_argv(argv), env=mask_env(env), hardware=dict(hardware or {}),
            engine_info={}, summary={}, metrics={}, imported=imported_from is not None, imported_from=imported_from,
            writer_pid=self._pid if status == "running" else None,
            writer_create_time=self._create_time if status == "running" else None, dropped_items=0,
            author=self.author, host=this_host(), gpu_model=gpu_model_of(hardware or {}),
            writer_namespace=pid_namespace() if status == "running" else "",
        )
        with self.engine.begin() as conn:
            found = conn.execute(select(Run.id, Run.status, Run.writer_pid, Run.writer_create_time,
                                        Run.writer_namespace).where(Run.uid == values["uid"])).first()
            if found is not None and status == found.status == "running" and \
                    (found.writer_pid, found.writer_create_time, found.writer_namespace) == (
                        self._pid, self._create_time, values["writer_namespace"]):
                return int(found.id)  # this process made it: a retry whose first try's answer was lost
            if found is not None:
                raise StoreError(f"a run with id {values['uid']} is already stored")
            key = conn.execute(insert(Run).values(**values)).inserted_primary_key
            assert key is not None
            run_id = int(key[0])
            unique_tags = sorted({t for t in tags if t})
            if unique_tags:
                conn.execute(insert(RunTag), [{"run_id": run_id, "tag": t} for t in unique_tags])
        return run_id

    @guarded
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
        """Everything that arrived since the last flush, in one transaction (all or nothing).

        Written again after a lost connection, a batch with requests or log lines is written once:
        its chunks go where the first try put them, and finding them there means the first try's
        commit arrived though its answer did not. (A batch of samples or events alone has no such
        key: it is the rare one that a retry after a commit lost on its way back can repeat.)"""
        chunk = encode_requests(requests, mask_text) if requests else None  # before the write lock
        positions: dict[tuple[int, str], int] = {}
        try:
            with self.engine.begin() as conn:
                if chunk is not None:
                    positions[(run_id, "requests")] = self._next_seq(conn, run_id, "requests")
                if log_lines:
                    positions[(run_id, "log")] = self._next_seq(conn, run_id, "log")
                if chunk is not None:
                    _insert_requests(conn, run_id, positions[(run_id, "requests")], chunk)
                if samples:
                    _insert_samples(conn, run_id, samples)
                if log_lines:
                    seq = positions[(run_id, "log")]
                    conn.exec_driver_sql(driver_sql(conn, _LOG_INSERT), (run_id, seq, len(log_lines),
                                                       encode_log([mask_text(line) for line in log_lines])))
                if events:
                    conn.execute(_EVENT_INSERT, [{"run_id": run_id, "t_wall": t, "kind": k, "payload": mask_obj(p)}
                                                 for t, k, p in events])
                if dropped_items is not None:
                    conn.execute(update(Run).where(Run.id == run_id).values(dropped_items=dropped_items))
        except IntegrityError:
            if not positions or not self._stored_before(run_id, positions, chunk, len(log_lines)):
                raise
        # Only now: a try that did not commit leaves the next one the same places.
        if chunk is not None:
            self._seq[(run_id, "requests")] = positions[(run_id, "requests")] + chunk.n
        if log_lines:
            self._seq[(run_id, "log")] = positions[(run_id, "log")] + 1

    def _stored_before(self, run_id: int, positions: Mapping[tuple[int, str], int], chunk: EncodedRequests | None,
                       n_log_lines: int) -> bool:
        """Whether a batch's chunks are already where this try put them (a retried commit)."""
        with self.engine.connect() as conn:
            if chunk is not None:
                found = conn.execute(select(RequestChunk.n, RequestChunk.columns).where(
                    RequestChunk.run_id == run_id, RequestChunk.seq_start == positions[(run_id, "requests")])).first()
                if found is None or found.n != chunk.n or bytes(found.columns) != chunk.columns:
                    return False
            if n_log_lines:
                lines = conn.execute(select(LogChunk.n_lines).where(
                    LogChunk.run_id == run_id, LogChunk.seq == positions[(run_id, "log")])).scalar()
                if lines != n_log_lines:
                    return False
        return True

    def _next_seq(self, conn: Connection, run_id: int, what: str) -> int:
        """Next sequence number of a run's requests or log chunks (cached: one writer per run)."""
        cached = self._seq.get((run_id, what))
        if cached is not None:
            return cached
        if what == "requests":
            query = select(func.coalesce(func.max(RequestChunk.seq_start + RequestChunk.n), 0))
            return int(conn.execute(query.where(RequestChunk.run_id == run_id)).scalar_one())
        query = select(func.coalesce(func.max(LogChunk.seq), -1))
        return int(conn.execute(query.where(LogChunk.run_id == run_id)).scalar_one()) + 1

    @guarded
    def update_run(self, run_id: int, **values: Any) -> None:
        """Set columns of a run (``engine_info`` and ``summary`` dicts are merged, not replaced)."""
        allowed = {"name", "notes", "engine_version", "endpoint", "engine_info", "summary", "model", "argv", "quality"}
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
            if values.get("endpoint") is not None:
                values["endpoint"] = mask_url(values["endpoint"])
            if "engine_info" in values:
                values["engine_info"] = mask_obj(values["engine_info"])
            conn.execute(update(Run).where(Run.id == run_id).values(**values))

    @guarded
    def start_level(self, run_id: int, idx: int, label: str = "", params: Mapping[str, Any] | None = None,
                    started_at: float | None = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(Level).where(Level.run_id == run_id, Level.idx == idx))
            conn.execute(insert(Level).values(run_id=run_id, idx=idx, label=label, params=mask_obj(dict(params or {})),
                                              started_at=started_at if started_at is not None else time.time()))

    @guarded
    def finish_level(self, run_id: int, idx: int, summary: Mapping[str, Any] | None,
                     finished_at: float | None = None, sample: Mapping[str, Any] | None = None) -> None:
        """``sample``: one request of the level as it streamed, its secrets already masked."""
        finished_at = finished_at if finished_at is not None else time.time()
        kept = dict(sample) if sample is not None else None
        with self.engine.begin() as conn:
            done = conn.execute(update(Level).where(Level.run_id == run_id, Level.idx == idx)
                                .values(summary=dict(summary or {}), finished_at=finished_at, sample=kept)).rowcount
            if not done:
                conn.execute(insert(Level).values(run_id=run_id, idx=idx, label="", params={},
                                                  finished_at=finished_at, summary=dict(summary or {}), sample=kept))

    @guarded
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
                status=status, reason=None if reason is None else mask_text(reason), finished_at=finished_at,
                summary=mask_obj(merged), metrics=metrics))

    def _last_activity(self, conn: Connection, run_id: int) -> float:
        """When an interrupted run last wrote something (its real end, not the time we noticed)."""
        candidates = [conn.execute(select(func.max(RequestChunk.end_wall)).where(RequestChunk.run_id == run_id)).scalar(),
                      conn.execute(select(func.max(RunEvent.t_wall)).where(RunEvent.run_id == run_id)).scalar(),
                      conn.execute(select(Run.started_at).where(Run.id == run_id)).scalar()]
        for block in self.samples(run_id, conn=conn).values():
            if block.t_wall.size:
                candidates.append(float(block.t_wall.max()))
        return max(float(c) for c in candidates if c is not None)

    @guarded
    def compact_samples(self, run_id: int) -> None:
        """Pack a run's per-flush telemetry chunks into one compressed chunk per source (smaller,
        and fast to read for comparisons)."""
        with self.engine.begin() as conn:
            # Two processes ending one run (both found it orphaned) must not both pack the same chunks:
            # on PostgreSQL the run's row is the lock (SQLite's one writer at a time needs none).
            conn.execute(select(Run.id).where(Run.id == run_id).with_for_update())
            counts = conn.execute(select(SampleChunk.source, func.count(), func.min(SampleChunk.codec))
                                  .where(SampleChunk.run_id == run_id).group_by(SampleChunk.source)).all()
            if all(n <= 1 and codec == 1 for _, n, codec in counts):
                return
            blocks = self.samples(run_id, conn=conn)
            conn.execute(delete(SampleChunk).where(SampleChunk.run_id == run_id))
            conn.execute(insert(SampleChunk), [{
                "run_id": run_id, "source": b.source, "n": int(b.t_mono.size), "names": b.names,
                "t_mono": b"", "t_wall": b"", "data": encode_series(b), "codec": 1} for b in blocks.values()])

    def metrics_of(self, requests: RequestArrays, levels: Sequence[LevelInfo]) -> dict[str, Any]:
        """The figures kept with a finished run, from its requests and levels. The store computes
        none (it stores): ``app.store.RunStore`` gives the runner's definitions."""
        return {}

    @guarded
    def compute_metrics(self, run_id: int) -> dict[str, Any]:
        """Store-side metrics (:meth:`metrics_of`, the runner's definitions): from the
        request rows and the recorded levels, overall and per level (``L<idx>.<name>``), with the
        client figures judged unreliable under ``unreliable``."""
        return self.metrics_of(self.requests(run_id), self.get_run(run_id).levels)

    @guarded
    def mark_interrupted(self, dead: Sequence[tuple[int, int | None]] | None = None) -> list[int]:
        """Runs left ``running`` by a process that no longer exists become ``interrupted``
        (``dead``: those already found, as ``(run id, pid)``)."""
        found = self.orphaned_runs() if dead is None else list(dead)
        for run_id, pid in found:
            self.finish_run(run_id, "interrupted",
                            f"the process that recorded it (pid {pid}) ended before the run finished",
                            only_if_running=True)
        return [run_id for run_id, _ in found]

    @guarded
    def orphaned_runs(self) -> list[tuple[int, int | None]]:
        """``(run id, pid)`` of the runs still ``running`` whose writer has gone. Only this
        host's writers can be looked at: a run another workbench records into a shared store
        stays ``running`` here."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Run.id, Run.writer_pid, Run.writer_create_time, Run.writer_namespace)
                                .where(Run.status == "running")).all()
        return [(r.id, r.writer_pid) for r in rows
                if not writer_may_be_alive(r.writer_pid, r.writer_create_time, r.writer_namespace)]

    # -- editing -------------------------------------------------------------------------------

    @guarded
    def rename(self, run_id: int, name: str) -> None:
        self.update_run(self.resolve(run_id), name=name)

    @guarded
    def set_notes(self, run_id: int, notes: str) -> None:
        self.update_run(self.resolve(run_id), notes=notes)

    @guarded
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

    @guarded
    def delete(self, run_id: int) -> None:
        run_id = self.resolve(run_id)
        with self.engine.begin() as conn:
            for table in (RequestChunk, SampleChunk, LogChunk, RunEvent, Level, RunTag):
                conn.execute(delete(table).where(table.run_id == run_id))
            conn.execute(delete(Run).where(Run.id == run_id))
        for key in [k for k in self._seq if k[0] == run_id]:
            del self._seq[key]

    # -- import: whole runs in one transaction ----------------------------------------------------

    @guarded
    def import_runs(self, runs: Sequence[ImportedRun]) -> list[int]:
        """Store finished runs read from a file (another tool's results or a tunebench export),
        all of them in one transaction: every run with all its data, or nothing. The caller has
        checked the values (``app.export.importers``); secrets are masked here as for a recording."""
        for run in runs:
            if run.status not in FINAL_STATUSES:
                raise StoreError(f"an imported run cannot be '{run.status}' "
                                 f"(expected one of {', '.join(FINAL_STATUSES)})")
        with self.engine.begin() as conn:
            return [self._insert_imported(conn, run) for run in runs]

    def _insert_imported(self, conn: Connection, run: ImportedRun) -> int:
        now = time.time()
        key = conn.execute(insert(Run).values(
            uid=uuid.uuid4().hex, name=run.name, notes=run.notes, status=run.status,
            reason=None if run.reason is None else mask_text(run.reason), created_at=now, started_at=run.started_at,
            finished_at=run.finished_at, t0_mono=run.t0_mono, engine_kind=run.engine_kind,
            engine_version=run.engine_version, model=run.model, endpoint=None, config=mask_obj(dict(run.config)),
            argv=mask_argv(run.argv), env={}, hardware=dict(run.hardware), engine_info={},
            summary=mask_obj(dict(run.summary)), metrics={}, imported=True, imported_from=run.imported_from,
            writer_pid=None, writer_create_time=None, dropped_items=0, author=self.author,
            host=str(run.hardware.get("hostname") or ""), gpu_model=gpu_model_of(run.hardware))).inserted_primary_key
        assert key is not None
        run_id = int(key[0])
        tags = sorted({t for t in ("imported", *run.tags) if t})
        conn.execute(insert(RunTag), [{"run_id": run_id, "tag": t} for t in tags])
        records = [{k: v for k, v in rec.items() if k in _IMPORTED_FIELDS or k not in KNOWN_REQUEST_KEYS}
                   for rec in run.requests]  # a file's extra keys never stand in for a field
        chunks = []
        for start in range(0, len(records), IMPORT_CHUNK_REQUESTS):
            chunk = encode_requests(records[start:start + IMPORT_CHUNK_REQUESTS], mask_text)
            _insert_requests(conn, run_id, start, chunk)
            chunks.append((chunk.columns, chunk.itl))
        if run.samples:
            _insert_samples(conn, run_id, run.samples, packed=True)
        if run.log_lines:
            conn.exec_driver_sql(driver_sql(conn, _LOG_INSERT), (run_id, 0, len(run.log_lines),
                                               encode_log([mask_text(line) for line in run.log_lines])))
        if run.levels:
            conn.execute(insert(Level), [
                {"run_id": run_id, "idx": lv.idx, "label": lv.label, "params": mask_obj(dict(lv.params)),
                 "started_at": lv.started_at, "finished_at": lv.finished_at, "summary": dict(lv.summary or {}),
                 "sample": mask_obj(lv.sample) if lv.sample is not None else None}
                for lv in run.levels])
        metrics = {**run.extra_metrics, **self.metrics_of(request_arrays(chunks), run.levels)}
        conn.execute(update(Run).where(Run.id == run_id).values(metrics=metrics))
        return run_id


