"""Tunes and their trials (``tunebench tune``): a tune's state lives in the store so a
stopped or crashed tune resumes without rerunning the trials it completed.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

from db.migrations.tables import create_tune_tables

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_tune_tables(op.get_bind(), writer_namespace=False)


def downgrade() -> None:
    op.drop_index("ix_tune_trials_candidate", table_name="tune_trials")
    op.drop_table("tune_trials")
    op.drop_table("tunes")
