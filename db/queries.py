"""Reading the run store: finding runs, their details and their bulk (requests as numpy
columns or records, telemetry blocks, the engine log). :class:`RunQueries` is the read half of
``db.store.RunStore``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import URL, Connection, Engine, func, select

from db.codecs import decode_extras, decode_itl, decode_itl_all, decode_requests
from db.dialects import driver_sql
from db.errors import INT64_MAX, DamagedData, StoreError, guarded
from db.models import Level, LogChunk, RequestChunk, Run, RunEvent, RunTag, SampleChunk
from db.records import LevelInfo, RequestArrays, RunDetail, RunInfo, SeriesBlock
from db.series import SampleChunkRow, decode_log, merge_blocks


def request_arrays(chunks: Sequence[tuple[bytes, bytes]]) -> RequestArrays:
    """Request chunks ``(columns, itl)`` in order as one set of columns."""
    if not chunks:
        empty = np.empty(0)
        return RequestArrays(empty, empty, empty, empty, empty, empty, np.empty(0, bool))
    decoded = [decode_requests(columns) for columns, _ in chunks]
    itl_flat = decode_itl_all([itl for _, itl in chunks])
    columns = {name: np.concatenate([d.columns[name] for d in decoded]) for name in decoded[0].columns}
    if int(columns["itl_n"].sum()) != itl_flat.size:
        raise DamagedData(f"request chunks hold {itl_flat.size} latencies for {int(columns['itl_n'].sum())}")
    errors: list[str | None] = []
    for d in decoded:
        part_errors: list[str | None] = [None] * d.n
        for row, text in d.errors.items():
            part_errors[row] = text
        errors.extend(part_errors)
    counts = columns["itl_n"].astype(np.int64)
    return RequestArrays(
        level=columns["level"], start_wall=columns["start_wall"], ttft_ms=columns["ttft_ms"], e2e_ms=columns["e2e_ms"],
        input_tokens=columns["input_tokens"], output_tokens=columns["output_tokens"],
        ok=np.array([e is None for e in errors], dtype=bool), errors=errors,
        itl_flat=itl_flat, itl_bounds=np.concatenate(([0], np.cumsum(counts, dtype=np.int64))))


def _int(value: float) -> int | None:
    return None if value != value else int(value)  # NaN: no value


def _float(value: float) -> float | None:
    return None if value != value else float(value)


class RunQueries:
    """Read access to the store's file (the engine and path are set by ``RunStore``)."""

    engine: Engine
    location: Path | URL
    where: str
    busy_timeout_s: float

    def _id(self, ref: int | str) -> int:
        return ref if isinstance(ref, int) and not isinstance(ref, bool) else self.resolve(ref)

    @guarded
    def schema_revision(self) -> str | None:
        from db.schema import current_revision

        return current_revision(self.engine)

    @guarded
    def resolve(self, ref: int | str) -> int:
        """A run by numeric id, uid (or a unique uid prefix of 4+ characters) or exact name."""
        text = str(ref).strip()
        with self.engine.connect() as conn:
            if text.isascii() and text.isdigit() and int(text) <= INT64_MAX:
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
        raise StoreError(f"no run '{text}' in {self.where} (see `tunebench runs list`)")

    def _tags(self, conn: Connection, ids: Sequence[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {i: [] for i in ids}
        if ids:
            for run_id, tag in conn.execute(select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(ids))
                                            .order_by(RunTag.tag)):
                out[run_id].append(tag)
        return out

    @guarded
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
        author: str | None = None,
        host: str | None = None,
        gpu_model: str | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """Newest first. ``model``, ``name`` and ``gpu_model`` match substrings; the rest match
        exactly."""
        if limit is not None and not 0 <= limit <= INT64_MAX:
            raise StoreError(f"a limit of {limit} runs is out of range (0 to {INT64_MAX:,}; 0: no limit)")
        cols = [Run.id, Run.uid, Run.name, Run.status, Run.reason, Run.notes, Run.started_at, Run.finished_at,
                Run.engine_kind, Run.engine_version, Run.model, Run.imported, Run.imported_from, Run.metrics,
                Run.author, Run.host, Run.gpu_model]
        query = select(*cols).order_by(Run.started_at.desc(), Run.id.desc())
        if engine:
            query = query.where(Run.engine_kind == engine)
        if model:
            query = query.where(Run.model.contains(model, autoescape=True))
        if name:
            query = query.where(Run.name.contains(name, autoescape=True))
        if status:
            query = query.where(Run.status == status)
        if author:
            query = query.where(Run.author == author)
        if host:
            query = query.where(Run.host == host)
        if gpu_model:
            query = query.where(Run.gpu_model.contains(gpu_model, autoescape=True))
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

    @guarded
    def get_run(self, ref: int | str) -> RunDetail:
        run_id = self._id(ref)
        with self.engine.connect() as conn:
            run = conn.execute(select(Run.__table__).where(Run.id == run_id)).first()
            if run is None:  # no such id, or deleted meanwhile
                raise StoreError(f"no run '{run_id}' in {self.where} (see `tunebench runs list`)")
            data = {k: v for k, v in run._asdict().items() if k != "writer_create_time"}
            levels = [LevelInfo(idx=lv.idx, label=lv.label, params=lv.params or {}, started_at=lv.started_at,
                                finished_at=lv.finished_at, summary=lv.summary, sample=lv.sample)
                      for lv in conn.execute(select(Level.__table__).where(Level.run_id == run_id).order_by(Level.idx))]
            events = [{"t_wall": e.t_wall, "kind": e.kind, "payload": e.payload}
                      for e in conn.execute(select(RunEvent.__table__).where(RunEvent.run_id == run_id)
                                            .order_by(RunEvent.id))]
            n_requests, n_samples, n_log = conn.execute(select(  # one round trip (a team's store is remote)
                select(func.coalesce(func.sum(RequestChunk.n), 0)).where(RequestChunk.run_id == run_id)
                .scalar_subquery(),
                select(func.coalesce(func.sum(SampleChunk.n), 0)).where(SampleChunk.run_id == run_id)
                .scalar_subquery(),
                select(func.coalesce(func.sum(LogChunk.n_lines), 0)).where(LogChunk.run_id == run_id)
                .scalar_subquery())).one()
            tags = self._tags(conn, [run_id])[run_id]
        data.pop("created_at", None)
        return RunDetail(**data, tags=tags, levels=levels, events=events, n_requests=int(n_requests),
                         n_samples=int(n_samples), n_log_lines=int(n_log))

    def _request_chunks(self, conn: Connection, run_id: int) -> list[tuple[int, bytes, bytes]]:
        rows = conn.exec_driver_sql(driver_sql(conn, "SELECT seq_start, columns, itl FROM request_chunks "
                                                     "WHERE run_id = ? ORDER BY seq_start"), (run_id,)).fetchall()
        return [(int(seq), columns, itl) for seq, columns, itl in rows]

    @guarded
    def requests(self, ref: int | str) -> RequestArrays:
        """A run's requests as numpy columns, in arrival order."""
        run_id = self._id(ref)
        with self.engine.connect() as conn:
            chunks = self._request_chunks(conn, run_id)
        return request_arrays([(columns, itl) for _, columns, itl in chunks])

    @guarded
    def request_records(self, ref: int | str) -> list[dict[str, Any]]:
        """Requests as dicts (for JSON/CSV export), in arrival order; fields beyond the stored
        ones under ``extra``."""
        run_id = self._id(ref)
        with self.engine.connect() as conn:
            chunks = self._request_chunks(conn, run_id)
        out = []
        for seq_start, columns, itl_blob in chunks:
            part = decode_requests(columns)
            extras = decode_extras(columns)
            itl = decode_itl(itl_blob)
            bounds = np.concatenate(([0], np.cumsum(part.columns["itl_n"].astype(np.int64))))
            if bounds[-1] != itl.size:
                raise DamagedData(f"a request chunk holds {itl.size} latencies for {bounds[-1]}")
            c = part.columns
            for i in range(part.n):
                rec: dict[str, Any] = {
                    "seq": seq_start + i, "level": _int(c["level"][i]), "start_wall": _float(c["start_wall"][i]),
                    "ttft_ms": _float(c["ttft_ms"][i]), "e2e_ms": _float(c["e2e_ms"][i]),
                    "input_tokens": _int(c["input_tokens"][i]), "output_tokens": _int(c["output_tokens"][i]),
                    "itl_ms": [round(float(x), 4) for x in itl[bounds[i]:bounds[i + 1]]],
                    "error": part.errors.get(i),
                }
                if extras[i]:
                    rec["extra"] = extras[i]
                out.append(rec)
        return out

    @guarded
    def samples(self, ref: int | str, *, conn: Connection | None = None) -> dict[str, SeriesBlock]:
        """Telemetry per source, in time order."""
        run_id = self._id(ref)
        sql = ("SELECT source, n, names, t_mono, t_wall, data, codec FROM sample_chunks WHERE run_id = ? "
               "ORDER BY id")  # the driver's rows: a running run has thousands of chunks
        if conn is None:
            with self.engine.connect() as own:
                rows = own.exec_driver_sql(driver_sql(own, sql), (run_id,)).fetchall()
        else:
            rows = conn.exec_driver_sql(driver_sql(conn, sql), (run_id,)).fetchall()
        names: dict[str, list[str]] = {}
        by_source: dict[str, list[SampleChunkRow]] = {}
        for source, n, names_json, t_mono, t_wall, data, codec in rows:
            if not isinstance(names_json, str):  # a driver that parses JSON columns (psycopg)
                names_json = json.dumps(names_json)
            if names_json not in names:
                names[names_json] = [str(name) for name in json.loads(names_json)]
            by_source.setdefault(source, []).append(SampleChunkRow(n, names[names_json], bytes(t_mono), bytes(t_wall),
                                                                   bytes(data), codec))
        return {source: merge_blocks(source, cs) for source, cs in by_source.items()}

    @guarded
    def log_lines(self, ref: int | str) -> list[str]:
        run_id = self._id(ref)
        with self.engine.connect() as conn:
            blobs = conn.execute(select(LogChunk.data).where(LogChunk.run_id == run_id)
                                 .order_by(LogChunk.seq)).scalars().all()
        lines: list[str] = []
        for blob in blobs:
            lines.extend(decode_log(blob))
        return lines
