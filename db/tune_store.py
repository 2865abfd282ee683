"""Reading and writing tunes and their trials (tables ``tunes`` and ``tune_trials``, revision
0005). The tuner (``app.tuner``) writes a trial when it starts and again when it ends, so a tune
whose process died shows which trials completed (kept on ``--resume``) and which were running
(rerun). Plain dicts in and out: ``db`` never imports ``app``.

A tune remembers its writer (pid and start time) like a run does: one left ``running`` by a
process that is gone reads back ``interrupted``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, insert, select, update

from db.errors import StoreError, guarded
from db.models import Tune, TuneTrial
from db.store import RunStore
from db.writes import writer_may_be_alive
from engine_adapters.process_group import pid_namespace, process_identity
from engine_adapters.secrets import mask_obj, mask_text

TUNE_STATUSES = ("running", "completed", "failed", "cancelled", "interrupted")
TRIAL_FIELDS = ("candidate", "source", "status", "knobs", "load_kind", "load_value", "run_id", "figures", "reason",
                "started_at", "finished_at", "doc")


@dataclass
class StoredTune:
    """A tune as stored: its columns, its ``doc`` and its trials in order."""

    id: str
    name: str
    profile: str
    status: str
    reason: str | None
    strategy: str
    slo: str
    created_at: float
    updated_at: float
    doc: dict[str, Any]
    writer_pid: int | None = None
    writer_create_time: float | None = None
    writer_namespace: str = ""
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def writer_is_alive(self) -> bool:
        return writer_may_be_alive(self.writer_pid, self.writer_create_time, self.writer_namespace)


def _tune(row: Any, trials: list[dict[str, Any]]) -> StoredTune:
    return StoredTune(id=row.id, name=row.name, profile=row.profile, status=row.status, reason=row.reason,
                      strategy=row.strategy, slo=row.slo, created_at=row.created_at, updated_at=row.updated_at,
                      doc=dict(row.doc or {}), writer_pid=row.writer_pid, writer_create_time=row.writer_create_time,
                      writer_namespace=row.writer_namespace, trials=trials)


def _trial(row: Any) -> dict[str, Any]:
    return {"index": row.idx, **{k: getattr(row, k) for k in TRIAL_FIELDS}}


@guarded
def create_tune(store: RunStore, tune_id: str, *, name: str, profile: str, strategy: str, slo: str,
                doc: Mapping[str, Any]) -> None:
    """A new tune, ``running`` and owned by this process."""
    pid, created = process_identity()
    now = time.time()
    with store.engine.begin() as conn:
        if conn.execute(select(Tune.id).where(Tune.id == tune_id)).first() is not None:
            raise StoreError(f"a tune with id {tune_id} is already stored")
        conn.execute(insert(Tune).values(id=tune_id, name=name, profile=profile, status="running", reason=None,
                                         strategy=strategy, slo=slo, created_at=now, updated_at=now,
                                         doc=mask_obj(dict(doc)), writer_pid=pid, writer_create_time=created,
                                         writer_namespace=pid_namespace()))


@guarded
def update_tune(store: RunStore, tune_id: str, *, status: str | None = None, reason: str | None = None,
                doc: Mapping[str, Any] | None = None, claim: bool = False) -> None:
    """Set the status (with its reason) and merge ``doc`` keys in. ``claim``: this process becomes
    the writer (a resumed tune)."""
    if status is not None and status not in TUNE_STATUSES:
        raise StoreError(f"unknown tune status '{status}' (known: {', '.join(TUNE_STATUSES)})")
    with store.engine.begin() as conn:
        row = conn.execute(select(Tune.doc).where(Tune.id == tune_id)).first()
        if row is None:
            raise StoreError(f"no tune {tune_id}")
        values: dict[str, Any] = {"updated_at": time.time()}
        if status is not None:
            values["status"] = status
            values["reason"] = None if reason is None else mask_text(reason)
        if doc is not None:
            values["doc"] = mask_obj({**(row.doc or {}), **dict(doc)})
        if claim:
            values["writer_pid"], values["writer_create_time"] = process_identity()
            values["writer_namespace"] = pid_namespace()
        conn.execute(update(Tune).where(Tune.id == tune_id).values(**values))


@guarded
def put_trial(store: RunStore, tune_id: str, index: int, **values: Any) -> None:
    """Insert or replace trial ``index`` of a tune (fields: :data:`TRIAL_FIELDS`)."""
    put_trials(store, tune_id, [(index, values)])


@guarded
def get_tune(store: RunStore, tune_id: str) -> StoredTune:
    with store.engine.connect() as conn:
        row = conn.execute(select(Tune).where(Tune.id == tune_id)).first()
        if row is None:
            raise StoreError(f"no tune {tune_id}")
        trials = [_trial(t) for t in conn.execute(select(TuneTrial).where(TuneTrial.tune_id == tune_id)
                                                  .order_by(TuneTrial.idx))]
    return _tune(row, trials)


@guarded
def list_tunes(store: RunStore, *, mark_interrupted: bool = True) -> list[StoredTune]:
    """Every tune, newest first, with its trials; one left ``running`` by a dead process is marked
    ``interrupted`` (once: the mark is written back)."""
    with store.engine.connect() as conn:
        rows = list(conn.execute(select(Tune).order_by(Tune.created_at.desc())))
        trials: dict[str, list[dict[str, Any]]] = {}
        for t in conn.execute(select(TuneTrial).order_by(TuneTrial.tune_id, TuneTrial.idx)):
            trials.setdefault(t.tune_id, []).append(_trial(t))
    tunes = [_tune(r, trials.get(r.id, [])) for r in rows]
    if mark_interrupted:
        for tune in tunes:
            if tune.status == "running" and not tune.writer_is_alive:
                tune.status = "interrupted"
                tune.reason = tune.reason or "the process that ran the tune ended before the tune finished"
                update_tune(store, tune.id, status=tune.status, reason=tune.reason)
    return tunes


def find_tune(store: RunStore, ref: str, *, mark_interrupted: bool = True) -> StoredTune:
    """A tune by its id (``tune:`` prefix allowed; a unique start is enough)."""
    text = ref.strip().removeprefix("tune:")
    tunes = list_tunes(store, mark_interrupted=mark_interrupted)
    exact = [t for t in tunes if t.id == text]
    found = exact or ([t for t in tunes if t.id.startswith(text)] if text else [])
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise StoreError(f"tune '{ref}' is ambiguous: {', '.join(t.id for t in found)}")
    raise StoreError(f"no stored tune '{ref}' (tunebench tunes lists them)")


@guarded
def delete_tune(store: RunStore, tune_id: str) -> None:
    """The tune and its trials (its runs stay: delete them with ``tunebench runs delete``)."""
    with store.engine.begin() as conn:
        conn.execute(delete(TuneTrial).where(TuneTrial.tune_id == tune_id))
        if not conn.execute(delete(Tune).where(Tune.id == tune_id)).rowcount:
            raise StoreError(f"no tune {tune_id}")


@guarded
def put_trials(store: RunStore, tune_id: str, rows: list[tuple[int, dict[str, Any]]]) -> None:
    """Several trials in one transaction (an import: all or nothing)."""
    with store.engine.begin() as conn:
        if conn.execute(select(Tune.id).where(Tune.id == tune_id)).first() is None:
            raise StoreError(f"no tune {tune_id}")
        for index, values in rows:
            unknown = set(values) - set(TRIAL_FIELDS)
            if unknown:
                raise StoreError(f"unknown trial field(s): {', '.join(sorted(unknown))}")
            row = {"candidate": 0, "source": "measured", "status": "pending", "knobs": {}, "load_kind": "concurrency",
                   "load_value": None, "run_id": None, "figures": {}, "reason": None, "started_at": None,
                   "finished_at": None, "doc": {}, **values}
            row["knobs"], row["doc"] = mask_obj(dict(row["knobs"])), mask_obj(dict(row["doc"]))
            row["reason"] = None if row["reason"] is None else mask_text(str(row["reason"]))
            conn.execute(delete(TuneTrial).where(TuneTrial.tune_id == tune_id, TuneTrial.idx == index))
            conn.execute(insert(TuneTrial).values(tune_id=tune_id, idx=index, **row))
        conn.execute(update(Tune).where(Tune.id == tune_id).values(updated_at=time.time()))
