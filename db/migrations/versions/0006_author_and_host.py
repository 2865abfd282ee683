"""Who recorded a run and where: its author, host and GPU model, so that a team's shared store
can be filtered by them (runs recorded before this revision take host and GPU model from their
stored hardware, and no author); and where a run's or a tune's writer's pid means something
(``engine_adapters.process_group.pid_namespace``: only there can one tell whether it still runs).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

from db.dialects import driver_sql
from db.records import gpu_model_of

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in ("author", "host", "gpu_model", "writer_namespace"):
        op.add_column("runs", sa.Column(column, sa.Text, nullable=False, server_default=""))
    op.add_column("tunes", sa.Column("writer_namespace", sa.Text, nullable=False, server_default=""))
    op.create_index("ix_runs_author", "runs", ["author"])
    op.create_index("ix_runs_host", "runs", ["host"])
    conn = op.get_bind()
    for run_id, hardware in conn.exec_driver_sql("SELECT id, hardware FROM runs").fetchall():
        hw: Any = json.loads(hardware) if isinstance(hardware, str | bytes) else hardware
        hw = hw if isinstance(hw, dict) else {}
        host, gpu_model = str(hw.get("hostname") or ""), gpu_model_of(hw)
        if host or gpu_model:
            conn.exec_driver_sql(driver_sql(conn, "UPDATE runs SET host = ?, gpu_model = ? WHERE id = ?"),
                                 (host, gpu_model, run_id))


def downgrade() -> None:
    op.drop_index("ix_runs_host", table_name="runs")
    op.drop_index("ix_runs_author", table_name="runs")
    # ALTER TABLE, not a batch copy: SQLite's copy drops the old ``runs``, and with foreign keys on
    # that deletes every run's rows in the tables that cascade from it.
    for column in ("writer_namespace", "gpu_model", "host", "author"):
        op.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    op.execute("ALTER TABLE tunes DROP COLUMN writer_namespace")
