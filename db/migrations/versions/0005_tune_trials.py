"""Tunes and their trials (``tunebench tune``): a tune's state lives in the store so a
stopped or crashed tune resumes without rerunning the trials it completed.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.dialects import Int64, Json

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("strategy", sa.String(16), nullable=False),
        sa.Column("slo", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("doc", Json, nullable=False),
        sa.Column("writer_pid", Int64, nullable=True),
        sa.Column("writer_create_time", sa.Float, nullable=True),
    )
    op.create_table(
        "tune_trials",
        sa.Column("tune_id", sa.String(64), sa.ForeignKey("tunes.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("idx", Int64, primary_key=True),
        sa.Column("candidate", Int64, nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("knobs", Json, nullable=False),
        sa.Column("load_kind", sa.String(16), nullable=False),
        sa.Column("load_value", sa.Float, nullable=True),
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("figures", Json, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("doc", Json, nullable=False),
    )
    op.create_index("ix_tune_trials_candidate", "tune_trials", ["tune_id", "candidate"])


def downgrade() -> None:
    op.drop_index("ix_tune_trials_candidate", table_name="tune_trials")
    op.drop_table("tune_trials")
    op.drop_table("tunes")
