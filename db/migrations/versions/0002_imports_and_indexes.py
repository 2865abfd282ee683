"""Imported runs remember their source file; indexes for listing runs by date and for finding
runs left ``running`` at open.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("imported_from", sa.Text, nullable=True))
    op.create_index("ix_runs_started_at", "runs", ["started_at"])
    op.create_index("ix_runs_status", "runs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_runs_status", table_name="runs")
    op.drop_index("ix_runs_started_at", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("imported_from")
