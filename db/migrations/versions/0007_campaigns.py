"""One stored form for campaigns: ``campaigns`` (one row each) and ``campaign_runs`` (a step's
runs, or a tune's trials). Tunes move over from ``tunes`` and ``tune_trials``; ladders, which
kept their whole state in the summary of each of their runs (the copy with the highest revision
current), move over from there, each run linked at the step its ``repeat:<ladder>-<step>`` tag
names. Nothing is lost either way: the downgrade writes both old forms back.

A campaign's ``state`` keeps no run ids (its links do), so that a copy into another store, where
runs get new ids, maps them.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from db.dialects import Int64, Json
from db.migrations.tables import create_tune_tables, runs_metadata, tune_tables

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

LADDER_TAG, SUMMARY_KEY = "ladder:", "ladder"
COLUMN_KEYS = ("ladder_id", "name", "profile", "status", "reason", "revision", "writer_pid", "writer_create_time")
"""A ladder state's fields that are the campaign row's columns."""
TRIAL_LINK_KEYS = ("candidate", "knobs", "load_kind", "load_value", "figures")
"""A tune trial's columns that a link keeps in its ``doc`` (the trial's own doc goes under ``detail``)."""


def _campaign_tables() -> tuple[sa.Table, sa.Table]:
    meta = runs_metadata()
    campaigns = sa.Table(
        "campaigns", meta,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("revision", Int64, nullable=False),
        sa.Column("state", Json, nullable=False),
        sa.Column("writer_pid", Int64, nullable=True),
        sa.Column("writer_create_time", sa.Float, nullable=True),
        sa.Column("writer_namespace", sa.Text, nullable=False, server_default=""),
    )
    links = sa.Table(
        "campaign_runs", meta,
        sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", Int64, primary_key=True),
        sa.Column("idx", Int64, primary_key=True),
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("doc", Json, nullable=False),
    )
    return campaigns, links


_RUNS = sa.table("runs", sa.column("id", Int64), sa.column("name", sa.Text), sa.column("status", sa.String),
                 sa.column("started_at", sa.Float), sa.column("finished_at", sa.Float), sa.column("model", sa.Text),
                 sa.column("engine_version", sa.String), sa.column("hardware", Json), sa.column("summary", Json),
                 sa.column("writer_namespace", sa.Text))
_TAGS = sa.table("run_tags", sa.column("run_id", Int64), sa.column("tag", sa.String))


def _ladder(ladder_id: str, runs: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ladder's campaign row and links, from its runs (sorted by start). The runs its state had
    not seen (the step running when its process died) stay unlinked, found by their tags as
    before."""
    states = [r.summary[SUMMARY_KEY] for r in runs
              if isinstance(r.summary, dict) and isinstance(r.summary.get(SUMMARY_KEY), dict)]
    state: dict[str, Any] = max(states, key=lambda s: int(s.get("revision") or 0)) if states else {}
    if not state:  # its process died during its first step: only the run and its tags are known
        first = runs[0]
        state = {"ladder_id": ladder_id, "name": first.name.split(" [", 1)[0], "started_wall_s": first.started_at,
                 "model": first.model, "engine_version": first.engine_version, "hardware": first.hardware or {}}
    status = {r.id: r.status for r in runs}
    links: list[dict[str, Any]] = []
    placed: set[int] = set()
    rows = [dict(row) for row in state.get("rows") or []]
    for row in rows:
        for run_id in row.pop("run_ids", None) or []:
            if run_id in status and run_id not in placed:
                links.append({"step": int(row["index"]), "run_id": run_id, "status": status[run_id]})
                placed.add(run_id)
    count: dict[int, int] = {}
    for link in links:
        link.update(campaign_id=ladder_id, idx=count.setdefault(link["step"], 0), role="measured", reason=None,
                    started_at=None, finished_at=None, doc={})
        count[link["step"]] += 1
    places = {r.writer_namespace for r in runs}
    row = {"id": ladder_id, "kind": "ladder", "name": state.get("name") or "", "profile": state.get("profile") or "",
           "status": state.get("status") or "running", "reason": state.get("reason"),
           "created_at": float(state.get("started_wall_s") or runs[0].started_at),
           "updated_at": max(float(r.finished_at or r.started_at) for r in runs),
           "revision": int(state.get("revision") or 0),
           "state": {**{k: v for k, v in state.items() if k not in COLUMN_KEYS}, "rows": rows},
           "writer_pid": state.get("writer_pid"), "writer_create_time": state.get("writer_create_time"),
           "writer_namespace": places.pop() if len(places) == 1 else ""}
    return row, links


def _ladders_up(conn: sa.Connection, campaigns: sa.Table, links: sa.Table) -> None:
    tag_rows = conn.execute(sa.select(_TAGS.c.run_id, _TAGS.c.tag)
                            .where(_TAGS.c.tag.like(f"{LADDER_TAG}%"))).all()
    members: dict[str, list[int]] = {}
    for run_id, tag in tag_rows:
        members.setdefault(tag[len(LADDER_TAG):], []).append(run_id)
    for ladder_id, ids in sorted(members.items()):
        runs = sorted(conn.execute(sa.select(_RUNS).where(_RUNS.c.id.in_(ids))).all(),
                      key=lambda r: (r.started_at, r.id))
        row, ladder_links = _ladder(ladder_id, runs)
        conn.execute(sa.insert(campaigns).values(**row))
        if ladder_links:
            conn.execute(sa.insert(links), ladder_links)
        for run in runs:
            if isinstance(run.summary, dict) and SUMMARY_KEY in run.summary:
                summary = {k: v for k, v in run.summary.items() if k != SUMMARY_KEY}
                conn.execute(sa.update(_RUNS).where(_RUNS.c.id == run.id).values(summary=summary))


def _tunes_up(conn: sa.Connection, campaigns: sa.Table, links: sa.Table) -> None:
    tunes, trials = tune_tables(writer_namespace=True)  # as revision 0006 left them
    for tune in conn.execute(sa.select(tunes)).mappings().all():
        conn.execute(sa.insert(campaigns).values(
            id=tune["id"], kind="tune", name=tune["name"], profile=tune["profile"], status=tune["status"],
            reason=tune["reason"], created_at=tune["created_at"], updated_at=tune["updated_at"], revision=0,
            state={**(tune["doc"] or {}), "strategy": tune["strategy"], "slo": tune["slo"]},
            writer_pid=tune["writer_pid"], writer_create_time=tune["writer_create_time"],
            writer_namespace=tune["writer_namespace"]))
    rows = [{"campaign_id": t["tune_id"], "step": t["idx"], "idx": 0, "run_id": t["run_id"], "status": t["status"],
             "role": t["source"], "reason": t["reason"], "started_at": t["started_at"], "finished_at": t["finished_at"],
             "doc": {**{k: t[k] for k in TRIAL_LINK_KEYS}, "detail": t["doc"] or {}}}
            for t in conn.execute(sa.select(trials)).mappings().all()]
    if rows:
        conn.execute(sa.insert(links), rows)


def upgrade() -> None:
    conn = op.get_bind()
    campaigns, links = _campaign_tables()
    campaigns.create(conn)
    links.create(conn)
    op.create_index("ix_campaigns_kind", "campaigns", ["kind", "created_at"])
    op.create_index("ix_campaign_runs_run", "campaign_runs", ["run_id"])
    _tunes_up(conn, campaigns, links)
    _ladders_up(conn, campaigns, links)
    op.drop_index("ix_tune_trials_candidate", table_name="tune_trials")
    op.drop_table("tune_trials")
    op.drop_table("tunes")


def downgrade() -> None:
    conn = op.get_bind()
    tunes, trials = create_tune_tables(conn, writer_namespace=True)
    campaigns, links = _campaign_tables()
    for row in conn.execute(sa.select(campaigns)).mappings().all():
        these = conn.execute(sa.select(links).where(links.c.campaign_id == row["id"])
                             .order_by(links.c.step, links.c.idx)).mappings().all()
        state = dict(row["state"] or {})
        if row["kind"] == "tune":
            strategy, slo = state.pop("strategy", "grid"), state.pop("slo", "")
            conn.execute(sa.insert(tunes).values(
                id=row["id"], name=row["name"], profile=row["profile"], status=row["status"], reason=row["reason"],
                strategy=strategy, slo=slo, created_at=row["created_at"], updated_at=row["updated_at"], doc=state,
                writer_pid=row["writer_pid"], writer_create_time=row["writer_create_time"],
                writer_namespace=row["writer_namespace"]))
            for link in these:
                doc = dict(link["doc"] or {})
                conn.execute(sa.insert(trials).values(
                    tune_id=row["id"], idx=link["step"], source=link["role"], status=link["status"],
                    run_id=link["run_id"], reason=link["reason"], started_at=link["started_at"],
                    finished_at=link["finished_at"], doc=doc.get("detail") or {},
                    **{k: doc.get(k) for k in TRIAL_LINK_KEYS}))
        elif row["kind"] == "ladder":
            run_ids: dict[int, list[int]] = {}
            for link in these:
                if link["run_id"] is not None:
                    run_ids.setdefault(link["step"], []).append(link["run_id"])
            full = {**state, "ladder_id": row["id"], "name": row["name"], "profile": row["profile"],
                    "status": row["status"], "reason": row["reason"], "revision": row["revision"],
                    "writer_pid": row["writer_pid"], "writer_create_time": row["writer_create_time"],
                    "rows": [{**r, "run_ids": run_ids.get(int(r["index"]), [])} for r in state.get("rows") or []]}
            for run_id in sorted({i for ids in run_ids.values() for i in ids}):
                summary = conn.execute(sa.select(_RUNS.c.summary).where(_RUNS.c.id == run_id)).scalar()
                summary = dict(summary) if isinstance(summary, dict) else {}
                conn.execute(sa.update(_RUNS).where(_RUNS.c.id == run_id).values(summary={**summary, SUMMARY_KEY: full}))
    op.drop_index("ix_campaign_runs_run", table_name="campaign_runs")
    op.drop_table("campaign_runs")
    op.drop_index("ix_campaigns_kind", table_name="campaigns")
    op.drop_table("campaigns")
