"""Moving runs between stores (``tunebench db copy``) and checking a store (``tunebench db check``).

A copy is row for row, in SQLAlchemy Core so that it reads and writes both backends the same way:
every column of a run and of its tags, levels, request, sample and log chunks and events, then the
campaigns (ladders, tunes) and their links. Only the destination's own keys are new: a run's ``id``
(its ``uid`` is kept, and is what makes a copy idempotent), a sample chunk's and an event's ``id``
(their order is kept), and a link's ``run_id``, which is mapped to the destination's id of the
same run. JSON
columns keep the difference between SQL NULL and JSON ``null``; bytes are copied as they are.

One run at a time, each in one destination transaction, its chunks read in batches: the memory a
copy needs is a batch of chunks, whatever the size of the store. A copy that fails part way keeps
the runs it finished, and running it again copies the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Connection, Table, bindparam, func, insert, select

from db.dialects import json_type
from db.errors import StoreError, quick_check, translate
from db.models import (
    Base,
    Campaign,
    CampaignRun,
    Level,
    LogChunk,
    RequestChunk,
    Run,
    RunEvent,
    RunTag,
    SampleChunk,
)
from db.schema import head_revision
from db.store import RunStore

ProgressFn = Callable[[int, int, str], None]
"""``(runs done, runs in the source, uid of the run just done)``."""

BATCH_ROWS = 64
"""Chunks read and written at a time (a request chunk of a busy run is some 10 KiB; an imported
run's may be a few MiB)."""

_TABLES = Base.metadata.tables
RUN_TABLES: tuple[Table, ...] = tuple(
    _TABLES[t.__tablename__] for t in (RunTag, Level, RequestChunk, SampleChunk, LogChunk, RunEvent))
"""A run's rows beside its ``runs`` row, in the order they are copied."""

_RUNS, _CAMPAIGNS, _LINKS = (_TABLES[t.__tablename__] for t in (Run, Campaign, CampaignRun))
_NULL_FLAG = "_tb_sql_null_"


@dataclass
class CopyReport:
    """What :func:`copy_runs` did. ``running``: the uids of the runs left behind because they were
    still being recorded (a copy of a running run would stay incomplete: copy again when it ends)."""

    copied: int = 0
    skipped_existing: int = 0
    skipped_running: int = 0
    campaigns_copied: int = 0
    campaigns_skipped: int = 0
    campaigns_running: int = 0
    running: list[str] = field(default_factory=list)


@dataclass
class StoreCheck:
    """What :func:`check_store` found: the schema revision and the newest one this tunebench
    knows, the number of runs by status, and one line per problem (none: the store is sound)."""

    where: str
    revision: str | None
    head: str | None
    runs_by_status: dict[str, int]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


# --- copying ----------------------------------------------------------------------------------------


def _copied_columns(table: Table, skip: frozenset[str]) -> list[Any]:
    """The columns read from ``table``, and for each JSON column that may be NULL, whether it is
    SQL NULL (``None`` alone cannot tell SQL NULL from JSON ``null``)."""
    columns: list[Any] = [c for c in table.columns if c.name not in skip]
    flags = [c.is_(None).label(_NULL_FLAG + c.name) for c in table.columns
             if c.name not in skip and c.nullable and isinstance(c.type, JSON)]
    return columns + flags


def _insert_statement(table: Table, skip: frozenset[str]) -> Any:
    """An INSERT of every column but ``skip``'s, whose JSON values are written as given: Python
    None as SQL NULL, :data:`JSON.NULL` as JSON ``null`` (see :func:`_values`)."""
    values: dict[str, Any] = {}
    for c in table.columns:
        if c.name in skip:
            continue
        values[c.name] = bindparam(c.name, type_=json_type(none_as_null=True) if isinstance(c.type, JSON) else c.type)
    return insert(table).values(values)


def _values(row: Mapping[Any, Any], table: Table, skip: frozenset[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in table.columns:
        if c.name in skip:
            continue
        value = row[c.name]
        if isinstance(c.type, JSON) and value is None:
            sql_null = bool(row[_NULL_FLAG + c.name]) if c.nullable else False
            value = None if sql_null else JSON.NULL
        out[c.name] = value
    return out


def _order_of(table: Table) -> list[Any]:
    """The rows of a run in the order the store reads them (ids, sequence numbers)."""
    keys = [c for c in table.primary_key.columns if c.name != "run_id"]
    return keys or [c for c in table.columns if c.name != "run_id"][:1]


@contextmanager
def _snapshot(store: RunStore) -> Iterator[Connection]:
    """A connection that reads one consistent state of ``store`` (pysqlite begins no transaction
    before a SELECT by itself; PostgreSQL's default sees each statement's own state)."""
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            try:
                yield conn
            finally:
                conn.rollback()
        return
    with store.engine.connect() as conn:
        conn.exec_driver_sql("BEGIN")
        try:
            yield conn
        finally:
            conn.rollback()


class _Blame:
    """Which store the statement being run belongs to (a failure is that store's, in its words)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store


def _copy_run(src: RunStore, dst: RunStore, src_id: int, uid: str, blame: _Blame) -> str:
    """Copy one run: ``copied``, ``exists`` (``dst`` has its uid) or ``gone`` (deleted meanwhile)."""
    no_id = frozenset({"id"})
    no_keys = frozenset({"id", "run_id"})
    blame.store = dst
    with dst.engine.begin() as dconn:
        if dconn.execute(select(_RUNS.c.id).where(_RUNS.c.uid == uid)).first() is not None:
            return "exists"
        blame.store = src
        with _snapshot(src) as sconn:
            run = sconn.execute(select(*_copied_columns(_RUNS, no_id)).where(_RUNS.c.id == src_id)).mappings().first()
            if run is None or run["uid"] != uid:
                return "gone"
            blame.store = dst
            key = dconn.execute(_insert_statement(_RUNS, no_id), _values(run, _RUNS, no_id)).inserted_primary_key
            assert key is not None
            dst_id = int(key[0])
            for table in RUN_TABLES:
                skip = no_keys if "id" in table.c else frozenset({"run_id"})
                statement = _insert_statement(table, skip).values(run_id=dst_id)
                query = (select(*_copied_columns(table, skip)).where(table.c.run_id == src_id)
                         .order_by(*_order_of(table)).execution_options(yield_per=BATCH_ROWS))
                blame.store = src
                for batch in sconn.execute(query).mappings().partitions():
                    blame.store = dst
                    dconn.execute(statement, [_values(r, table, skip) for r in batch])
                    blame.store = src
            blame.store = dst  # the commit
    return "copied"


def _copy_campaigns(src: RunStore, dst: RunStore, report: CopyReport, blame: _Blame) -> None:
    """Every finished campaign not in ``dst`` yet, with its links; a link's run is ``dst``'s run of
    the same uid (None when ``dst`` has no such run: it was still running, or deleted)."""
    blame.store = src
    with src.engine.connect() as sconn:
        campaigns = list(sconn.execute(select(_CAMPAIGNS.c.id, _CAMPAIGNS.c.status)
                                       .order_by(_CAMPAIGNS.c.created_at, _CAMPAIGNS.c.id)))
        uid_of: dict[int, str] = dict(sconn.execute(select(_RUNS.c.id, _RUNS.c.uid)).all())
    if not campaigns:
        return
    blame.store = dst
    with dst.engine.connect() as dconn:
        dst_id_of: dict[str, int] = dict(dconn.execute(select(_RUNS.c.uid, _RUNS.c.id)).all())
    campaign_skip, link_skip = frozenset[str](), frozenset({"campaign_id"})
    for campaign_id, status in campaigns:
        if status == "running":
            report.campaigns_running += 1
            continue
        blame.store = dst
        with dst.engine.begin() as dconn:
            if dconn.execute(select(_CAMPAIGNS.c.id).where(_CAMPAIGNS.c.id == campaign_id)).first() is not None:
                report.campaigns_skipped += 1
                continue
            blame.store = src
            with _snapshot(src) as sconn:
                row = (sconn.execute(select(*_copied_columns(_CAMPAIGNS, campaign_skip))
                                     .where(_CAMPAIGNS.c.id == campaign_id)).mappings().first())
                if row is None:  # deleted meanwhile
                    continue
                links = []
                for link in sconn.execute(select(*_copied_columns(_LINKS, link_skip))
                                          .where(_LINKS.c.campaign_id == campaign_id)
                                          .order_by(_LINKS.c.step, _LINKS.c.idx)).mappings():
                    values = _values(link, _LINKS, link_skip)
                    run_uid = None if values["run_id"] is None else uid_of.get(values["run_id"])
                    values["run_id"] = None if run_uid is None else dst_id_of.get(run_uid)
                    links.append(values)
            blame.store = dst
            dconn.execute(_insert_statement(_CAMPAIGNS, campaign_skip), _values(row, _CAMPAIGNS, campaign_skip))
            if links:
                dconn.execute(_insert_statement(_LINKS, link_skip).values(campaign_id=campaign_id), links)
        report.campaigns_copied += 1


def copy_runs(src: RunStore, dst: RunStore, *, on_progress: ProgressFn | None = None) -> CopyReport:
    """Copy every finished run of ``src`` that ``dst`` lacks (by uid), then every finished campaign
    it lacks (by id). Runs still ``running`` are left behind (``CopyReport.running``), as are running
    campaigns. Each run is copied in one transaction of ``dst``, whole or not at all; a failure is a
    one-line :class:`StoreError` naming the run, and the runs copied before it stay."""
    report = CopyReport()
    blame = _Blame(src)
    try:
        with src.engine.connect() as conn:
            runs = conn.execute(select(_RUNS.c.id, _RUNS.c.uid, _RUNS.c.status).order_by(_RUNS.c.id)).all()
    except Exception as exc:
        raise _error(exc, src) from None
    total = len(runs)
    for done, (src_id, uid, status) in enumerate(runs, start=1):
        if status == "running":
            report.skipped_running += 1
            report.running.append(uid)
        else:
            try:
                outcome = _copy_run(src, dst, src_id, uid, blame)
            except Exception as exc:
                kept = f"{report.copied} run{'' if report.copied == 1 else 's'} copied before it kept"
                raise StoreError(f"copying run {uid} from {src.where} to {dst.where} failed ({kept}): "
                                 f"{_error(exc, blame.store)}") from None
            if outcome == "copied":
                report.copied += 1
            elif outcome == "exists":
                report.skipped_existing += 1
        if on_progress is not None:
            on_progress(done, total, uid)
    try:
        _copy_campaigns(src, dst, report, blame)
    except Exception as exc:
        raise StoreError(f"copying the campaigns from {src.where} to {dst.where} failed: "
                         f"{_error(exc, blame.store)}") from None
    return report


def _error(exc: BaseException, store: RunStore) -> StoreError:
    """``exc`` as ``store``'s one-line error (anything that is no database problem is a bug: raised)."""
    error = translate(exc, store.location, store.busy_timeout_s)
    if error is None:
        raise exc
    return error


# --- checking ---------------------------------------------------------------------------------------


def check_store(store: RunStore) -> StoreCheck:
    """The schema revision, the runs by status, and the problems: an SQLite file SQLite finds
    unsound (``PRAGMA quick_check``), and runs whose requests, telemetry or engine log do not
    decode (every chunk carries a checksum). Reads the whole store: a run at a time."""
    problems: list[str] = []
    revision, head = store.schema_revision(), head_revision()
    if revision != head:
        problems.append(f"the schema is at revision {revision or 'none'}, this tunebench's is {head}: "
                        f"run `tunebench db upgrade`")
    if store.path is not None and (found := quick_check(store.path, store.busy_timeout_s)):
        problems.append(f"SQLite finds the file damaged: {found}")
    try:
        with store.engine.connect() as conn:
            counts = conn.execute(select(_RUNS.c.status, func.count()).group_by(_RUNS.c.status)
                                  .order_by(_RUNS.c.status)).all()
            runs = conn.execute(select(_RUNS.c.id, _RUNS.c.uid).order_by(_RUNS.c.id)).all()
    except Exception as exc:
        raise _error(exc, store) from None
    for run_id, uid in runs:
        try:
            store.requests(run_id)
            store.samples(run_id)
            store.log_lines(run_id)
        except StoreError as exc:
            problems.append(f"run {run_id} ({uid}): its stored requests, telemetry or log do not decode: {exc}")
    return StoreCheck(where=store.where, revision=revision, head=head,
                      runs_by_status={str(status): int(n) for status, n in counts}, problems=problems)


__all__ = ["BATCH_ROWS", "CopyReport", "StoreCheck", "check_store", "copy_runs"]
