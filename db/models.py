"""The run store's tables (SQLAlchemy 2 declarative): the schema at the newest migration.

Telemetry is stored as packed chunks (one row per source per flush, values as float64 arrays)
because a run has tens of thousands of samples: one row per sample, or one per value, would make
writing and comparing runs slow. Requests keep one row each (they are queried and exported
individually); their inter-token latencies are packed float32 arrays.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_STATUSES = ("running", "completed", "failed", "interrupted", "cancelled")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Run(Base):
    """One run: what was launched, on what, with which result."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(16), default="running")
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    t0_mono: Mapped[float | None] = mapped_column(Float, nullable=True)
    engine_kind: Mapped[str] = mapped_column(String(32), default="")
    engine_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str] = mapped_column(Text, default="")
    endpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    argv: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    engine_info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    imported: Mapped[bool] = mapped_column(Boolean, default=False)
    imported_from: Mapped[str | None] = mapped_column(Text, nullable=True)  # revision 0002
    writer_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    writer_create_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    dropped_items: Mapped[int] = mapped_column(Integer, default=0)

    __table_args__ = (
        Index("ix_runs_started_at", "started_at"),  # revision 0002
        Index("ix_runs_status", "status"),  # revision 0002
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
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    label: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Request(Base):
    """One request as the client saw it; ``seq`` numbers it within its run. Its inter-token
    latencies and the rest of its record live in :class:`RequestChunk` (packed per batch:
    100,000 small blobs or JSON documents are slow to write and large)."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    level: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_wall: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    e2e_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    input_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    output_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_requests_run_seq", "run_id", "seq", unique=True),)


class RequestChunk(Base):
    """What one batch of requests ``seq_start .. seq_start + n - 1`` carried besides the columns:
    inter-token latencies as ``counts`` (int32, one per request) and ``values`` (float32 ms, back
    to back), and ``extras``: the other record fields, a zlib-compressed JSON list (one object per
    request), or NULL when there were none."""

    __tablename__ = "request_chunks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq_start: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    counts: Mapped[bytes] = mapped_column(LargeBinary)
    values: Mapped[bytes] = mapped_column(LargeBinary)
    extras: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class SampleChunk(Base):
    """Samples of one source flushed together: times and an n x k float64 matrix of values."""

    __tablename__ = "sample_chunks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(String(64))
    n: Mapped[int] = mapped_column(Integer)
    names: Mapped[list[Any]] = mapped_column(JSON)
    t_mono: Mapped[bytes] = mapped_column(LargeBinary)
    t_wall: Mapped[bytes] = mapped_column(LargeBinary)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class LogChunk(Base):
    """Engine log lines flushed together, zlib-compressed UTF-8 joined by newlines."""

    __tablename__ = "log_chunks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    n_lines: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunEvent(Base):
    """The run's timeline of rare events: phases, engine readiness, notices."""

    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    t_wall: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
