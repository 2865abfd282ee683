"""One request of each level kept as it streamed (``levels.sample``): its prompt, its text in the
pieces it arrived in and their arrival times, so that two runs can be replayed side by side at
the pace they measured. Runs stored before keep none (NULL): a replay of them says so.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from db.dialects import Json

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("levels", sa.Column("sample", Json, nullable=True))


def downgrade() -> None:
    # ALTER TABLE, not a batch copy (see revision 0006's downgrade).
    op.execute("ALTER TABLE levels DROP COLUMN sample")
