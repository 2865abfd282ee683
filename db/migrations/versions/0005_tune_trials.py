"""Tunes and their trials (``tunebench tune``): a tune's state lives in the store so a
stopped or crashed tune resumes without rerunning the trials it completed.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

from db.migrations.tables import tune_columns, tune_trial_columns

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("tunes", *tune_columns(writer_namespace=False))
    op.create_table("tune_trials", *tune_trial_columns())
    op.create_index("ix_tune_trials_candidate", "tune_trials", ["tune_id", "candidate"])


def downgrade() -> None:
    op.drop_index("ix_tune_trials_candidate", table_name="tune_trials")
    op.drop_table("tune_trials")
    op.drop_table("tunes")
