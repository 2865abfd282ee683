"""Table definitions that more than one revision needs as they stood then (not as ``db.models``
has them now): ``requests`` and ``request_chunks``, created by revision 0001, packed by 0004 and
written back by its downgrade; ``tunes`` and ``tune_trials``, created by revision 0005, given a
writer namespace by 0006, moved into campaigns by 0007 and written back by its downgrade. Each call
returns new columns, as a table owns its columns. Also the whole of a revision that adds one
nullable JSON column (:func:`json_column_revision`)."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

from db.dialects import Int64, Json


def create_requests_table() -> None:
    """``requests``, one row per request, with its (run, seq) index."""
    op.create_table(
        "requests",
        sa.Column("id", Int64, primary_key=True),
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", Int64, nullable=False),
        sa.Column("level", Int64),
        sa.Column("start_wall", sa.Float),
        sa.Column("ttft_ms", sa.Float),
        sa.Column("e2e_ms", sa.Float),
        sa.Column("input_tokens", Int64),
        sa.Column("output_tokens", Int64),
        sa.Column("error", sa.Text),
    )
    op.create_index("ix_requests_run_seq", "requests", ["run_id", "seq"], unique=True)


def request_chunk_columns() -> list[sa.Column]:
    """``request_chunks`` as revision 0001 made it (float32 latencies, per-request extras)."""
    return [
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq_start", Int64, primary_key=True),
        sa.Column("n", Int64, nullable=False),
        sa.Column("counts", sa.LargeBinary, nullable=False),
        sa.Column("values", sa.LargeBinary, nullable=False),
        sa.Column("extras", sa.LargeBinary),
    ]


def runs_metadata() -> sa.MetaData:
    """A metadata that knows ``runs`` (what the foreign keys of a trial or a link name)."""
    meta = sa.MetaData()
    sa.Table("runs", meta, sa.Column("id", Int64, primary_key=True))
    return meta


def tune_tables(*, writer_namespace: bool) -> tuple[sa.Table, sa.Table]:
    """``tunes`` and ``tune_trials``, to read or write them."""
    meta = runs_metadata()
    return (sa.Table("tunes", meta, *tune_columns(writer_namespace=writer_namespace)),
            sa.Table("tune_trials", meta, *tune_trial_columns()))


def create_tune_tables(conn: sa.Connection, *, writer_namespace: bool) -> tuple[sa.Table, sa.Table]:
    """Create ``tunes`` and ``tune_trials`` with the trials' index; returns the tables."""
    tunes, trials = tune_tables(writer_namespace=writer_namespace)
    tunes.create(conn)
    trials.create(conn)
    sa.Index("ix_tune_trials_candidate", trials.c.tune_id, trials.c.candidate).create(conn)
    return tunes, trials


def tune_columns(*, writer_namespace: bool) -> list[sa.Column]:
    """``tunes``: before revision 0006 (``writer_namespace`` False) or after it."""
    columns = [
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
    ]
    if writer_namespace:
        columns.append(sa.Column("writer_namespace", sa.Text, nullable=False, server_default=""))
    return columns


def tune_trial_columns() -> list[sa.Column]:
    """``tune_trials`` (unchanged from revision 0005 until 0007 dropped it)."""
    return [
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
    ]


def json_column_revision(table: str, column: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """The ``upgrade`` and ``downgrade`` of a revision that adds the nullable JSON column ``column``
    to ``table`` (rows stored before have NULL). The downgrade is ALTER TABLE, not a batch copy:
    SQLite's copy drops the old table, and with foreign keys on that deletes every row of the
    tables that cascade from it."""

    def upgrade() -> None:
        op.add_column(table, sa.Column(column, Json, nullable=True))

    def downgrade() -> None:
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")

    return upgrade, downgrade
