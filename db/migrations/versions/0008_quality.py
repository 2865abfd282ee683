"""A run's quality figures (``app.quality``): agreement and KL divergence against a reference, the
noise floor, accuracy, and the outputs that make the run a reference for others. Runs recorded
before this revision have none (NULL).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.dialects import Json

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("quality", Json, nullable=True))


def downgrade() -> None:
    # ALTER TABLE, not a batch copy: SQLite's copy drops the old ``runs``, and with foreign keys on
    # that deletes every run's rows in the tables that cascade from it.
    op.execute("ALTER TABLE runs DROP COLUMN quality")
