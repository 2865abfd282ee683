"""The run store's tables (SQLAlchemy 2 declarative): the schema at the newest migration.

A run's bulk is stored as packed chunks (``db.codecs``, ``db.series``): its requests as one row per batch
written together (columns of their fields and their per-token latencies, compressed), its
telemetry as one row per source per flush, packed into one row per source when it finishes.
One row per request, sample or token would make writing, comparing and storing runs slow
(100,000 requests of 63 tokens per run).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Index, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from db.dialects import Int64, Json

RUN_STATUSES = ("running", "completed", "failed", "interrupted", "cancelled")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: Json, list[Any]: Json}


class _Written:
    """How a run or a campaign stands, why (a stopped or failed one), and the process that writes
    it: a ``running`` row whose writer is gone (``writer_may_be_alive``) was interrupted."""

    status: Mapped[str] = mapped_column(String(16), default="running")
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    writer_pid: Mapped[int | None] = mapped_column(Int64, nullable=True)
    writer_create_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    writer_namespace: Mapped[str] = mapped_column(Text, default="", server_default="")


class Run(_Written, Base):
    """One run: what was launched, on what, with which result."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    uid: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    t0_mono: Mapped[float | None] = mapped_column(Float, nullable=True)
    engine_kind: Mapped[str] = mapped_column(String(32), default="")
    engine_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str] = mapped_column(Text, default="")
    endpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    config: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    argv: Mapped[list[Any] | None] = mapped_column(Json, nullable=True)
    env: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    hardware: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    engine_info: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    summary: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    imported: Mapped[bool] = mapped_column(Boolean, default=False)
    imported_from: Mapped[str | None] = mapped_column(Text, nullable=True)  # revision 0002
    dropped_items: Mapped[int] = mapped_column(Int64, default=0)
    author: Mapped[str] = mapped_column(Text, default="", server_default="")  # revision 0006
    host: Mapped[str] = mapped_column(Text, default="", server_default="")  # revision 0006
    gpu_model: Mapped[str] = mapped_column(Text, default="", server_default="")  # revision 0006
    quality: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)  # revision 0008

    __table_args__ = (
        Index("ix_runs_started_at", "started_at"),  # revision 0002
        Index("ix_runs_status", "status"),  # revision 0002
        Index("ix_runs_author", "author"),  # revision 0006
        Index("ix_runs_host", "host"),  # revision 0006
    )


class RunTag(Base):
    __tablename__ = "run_tags"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(200), primary_key=True)

    __table_args__ = (Index("ix_run_tags_tag", "tag"),)


class Level(Base):
    """One load level (a concurrency or a rate) and its summary."""

    __tablename__ = "levels"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Int64, primary_key=True)
    label: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    sample: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)  # revision 0009
    """One request of the level as it streamed: its prompt, its text in the pieces it arrived in
    and their arrival times (``app.load.client.StreamSample``), for replaying it (``app.race``)."""


class RequestChunk(Base):
    """Requests ``seq_start .. seq_start + n - 1`` of a run, written together (one flush of a
    recording, or part of an import): ``columns``, their fields (``db.codecs.encode_requests``:
    the stored ones, any others, and the error texts) and ``itl``, their inter-token latencies
    back to back (``db.codecs.encode_itl``). ``end_wall``: when the last of them ended (revision
    0004; before it, one ``requests`` row per request)."""

    __tablename__ = "request_chunks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq_start: Mapped[int] = mapped_column(Int64, primary_key=True)
    n: Mapped[int] = mapped_column(Int64)
    end_wall: Mapped[float | None] = mapped_column(Float, nullable=True)
    columns: Mapped[bytes] = mapped_column(LargeBinary)
    itl: Mapped[bytes] = mapped_column(LargeBinary)


class SampleChunk(Base):
    """Samples of one source: ``codec`` 0, one flush raw (times and an n x k float64 matrix of
    values); ``codec`` 1, a finished run's samples of the source packed into ``data``
    (``db.series.encode_series``, revision 0004), ``t_mono`` and ``t_wall`` empty."""

    __tablename__ = "sample_chunks"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(String(64))
    n: Mapped[int] = mapped_column(Int64)
    names: Mapped[list[Any]] = mapped_column(Json)
    t_mono: Mapped[bytes] = mapped_column(LargeBinary)
    t_wall: Mapped[bytes] = mapped_column(LargeBinary)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    codec: Mapped[int] = mapped_column(Int64, default=0, server_default="0")


class LogChunk(Base):
    """Engine log lines flushed together, zlib-compressed UTF-8 joined by newlines."""

    __tablename__ = "log_chunks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Int64, primary_key=True)
    n_lines: Mapped[int] = mapped_column(Int64)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunEvent(Base):
    """The run's timeline of rare events: phases, engine readiness, notices."""

    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    t_wall: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)


# --- campaigns (db/campaign_store.py reads and writes these) -------------------------------------

CAMPAIGN_KINDS = ("ladder", "tune")
CAMPAIGN_STATUSES = ("running", "completed", "failed", "cancelled", "interrupted")


class Campaign(_Written, Base):
    """One campaign: a sequence of runs driven as one (an acceleration ladder, a tune). ``state``
    is the campaign's own JSON (a ladder's staircase, a tune's space, candidates and pick) less its
    run links, so a stopped or crashed campaign reads back, or resumes, from the store alone
    (revision 0007, which carried the ``tunes`` table and the ladders kept in run summaries over)."""

    __tablename__ = "campaigns"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(Text, default="")
    profile: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    revision: Mapped[int] = mapped_column(Int64, default=0)
    state: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)

    __table_args__ = (Index("ix_campaigns_kind", "kind", "created_at"),)


class CampaignRun(Base):
    """A campaign's step and what measured it: the run ``run_id`` (kept when the run is deleted:
    ``doc`` keeps a tune trial's figures), or a point imported from another tool (``role``).
    A step repeated has one row per repeat (``idx``)."""

    __tablename__ = "campaign_runs"

    campaign_id: Mapped[str] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Int64, primary_key=True)
    idx: Mapped[int] = mapped_column(Int64, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    role: Mapped[str] = mapped_column(String(32), default="measured")
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    doc: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)

    __table_args__ = (Index("ix_campaign_runs_run", "run_id"),)
