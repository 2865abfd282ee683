"""The first schema: runs, tags, levels, requests (+ packed ITLs and other fields), packed telemetry, compressed
log, events.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.dialects import Int64, Json
from db.migrations.tables import create_requests_table, request_chunk_columns

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", Int64, primary_key=True),
        sa.Column("uid", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("notes", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float),
        sa.Column("t0_mono", sa.Float),
        sa.Column("engine_kind", sa.String(32), nullable=False),
        sa.Column("engine_version", sa.String(64)),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("endpoint", sa.Text),
        sa.Column("config", Json, nullable=False),
        sa.Column("argv", Json),
        sa.Column("env", Json, nullable=False),
        sa.Column("hardware", Json, nullable=False),
        sa.Column("engine_info", Json, nullable=False),
        sa.Column("summary", Json, nullable=False),
        sa.Column("metrics", Json, nullable=False),
        sa.Column("imported", sa.Boolean, nullable=False),
        sa.Column("writer_pid", Int64),
        sa.Column("writer_create_time", sa.Float),
        sa.Column("dropped_items", Int64, nullable=False),
    )
    op.create_table(
        "run_tags",
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("tag", sa.String(200), primary_key=True),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    op.create_table(
        "levels",
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idx", Int64, primary_key=True),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("params", Json, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("summary", Json),
    )
    create_requests_table()
    op.create_table("request_chunks", *request_chunk_columns())
    op.create_table(
        "sample_chunks",
        sa.Column("id", Int64, primary_key=True),
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("n", Int64, nullable=False),
        sa.Column("names", Json, nullable=False),
        sa.Column("t_mono", sa.LargeBinary, nullable=False),
        sa.Column("t_wall", sa.LargeBinary, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_sample_chunks_run_id", "sample_chunks", ["run_id"])
    op.create_table(
        "log_chunks",
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", Int64, primary_key=True),
        sa.Column("n_lines", Int64, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "run_events",
        sa.Column("id", Int64, primary_key=True),
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("t_wall", sa.Float, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", Json),
    )
    op.create_index("ix_run_events_run_id", "run_events", ["run_id"])


def downgrade() -> None:
    for table in ("run_events", "log_chunks", "sample_chunks", "request_chunks", "requests", "levels", "run_tags", "runs"):
        op.drop_table(table)
