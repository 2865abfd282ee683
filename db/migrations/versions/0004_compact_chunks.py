"""Compact request storage: the ``requests`` rows (one per request) and the old chunks (float32
latencies, JSON extras) become one packed row per chunk (``db.codecs``); telemetry chunks get a
``codec`` (0 raw, 1 packed). Latencies move over exactly, to the microsecond.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

from db.codecs import decode_extras, decode_itl, decode_requests, encode_requests
from db.dialects import Int64, driver_sql
from db.migrations.tables import create_requests_table, request_chunk_columns

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

CHUNK_REQUESTS = 8192  # requests per new chunk (a recording's old chunks were smaller)


def _old_chunks(conn: sa.Connection, run_id: int) -> tuple[dict[int, list[float]], dict[int, dict[str, Any]]]:
    """Latencies and extra fields by seq, from revision 0003's chunks (int32 counts, float32
    values, zlib JSON ``{"keys", "rows"}`` extras)."""
    itls: dict[int, list[float]] = {}
    extras: dict[int, dict[str, Any]] = {}
    for seq_start, n, counts_blob, values_blob, extras_blob in conn.exec_driver_sql(driver_sql(
            conn, 'SELECT seq_start, n, counts, "values", extras FROM request_chunks WHERE run_id = ? ORDER BY seq_start'),
            (run_id,)):
        counts = np.frombuffer(counts_blob or b"", "<i4")[:n]
        values = np.frombuffer(values_blob or b"", "<f4").astype(np.float64)
        bounds = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        for i in range(counts.size):
            itls[seq_start + i] = values[bounds[i]:bounds[i + 1]].tolist()
        if extras_blob:
            doc = json.loads(zlib.decompress(extras_blob))
            for i, row in enumerate(doc["rows"]):
                extra = row if isinstance(row, dict) else dict(zip(doc["keys"], row, strict=True))
                if extra:
                    extras[seq_start + i] = extra
    return itls, extras


def _runs_of_consecutive(seqs: Sequence[int]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` index ranges of ``seqs`` that count up by one, at most CHUNK_REQUESTS long."""
    start = 0
    for i in range(1, len(seqs) + 1):
        if i == len(seqs) or seqs[i] != seqs[i - 1] + 1 or i - start == CHUNK_REQUESTS:
            yield start, i
            start = i


def upgrade() -> None:
    conn = op.get_bind()
    op.create_table(
        "request_chunks_new",
        sa.Column("run_id", Int64, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq_start", Int64, primary_key=True),
        sa.Column("n", Int64, nullable=False),
        sa.Column("end_wall", sa.Float),
        sa.Column("columns", sa.LargeBinary, nullable=False),
        sa.Column("itl", sa.LargeBinary, nullable=False),
    )
    run_ids = [r[0] for r in conn.exec_driver_sql("SELECT DISTINCT run_id FROM requests ORDER BY run_id")]
    for run_id in run_ids:
        itls, extras = _old_chunks(conn, run_id)
        rows = conn.exec_driver_sql(driver_sql(
            conn, "SELECT seq, level, start_wall, ttft_ms, e2e_ms, input_tokens, output_tokens, error FROM requests "
            "WHERE run_id = ? ORDER BY seq"), (run_id,)).fetchall()
        seqs = [r[0] for r in rows]
        for start, end in _runs_of_consecutive(seqs):
            records = [{**extras.get(seq, {}), "level": level, "start_wall": start_wall, "ttft_ms": ttft,
                        "e2e_ms": e2e, "input_tokens": tokens_in, "output_tokens": tokens_out, "error": error,
                        "itl_ms": itls.get(seq, [])}
                       for seq, level, start_wall, ttft, e2e, tokens_in, tokens_out, error in rows[start:end]]
            chunk = encode_requests(records, exact_itl=True)
            conn.exec_driver_sql(driver_sql(conn, "INSERT INTO request_chunks_new (run_id, seq_start, n, end_wall, "
                                                        "columns, itl) VALUES (?, ?, ?, ?, ?, ?)"),
                                 (run_id, seqs[start], chunk.n, chunk.end_wall, chunk.columns, chunk.itl))
    op.drop_table("request_chunks")
    op.drop_index("ix_requests_run_seq", table_name="requests")
    op.drop_table("requests")
    op.rename_table("request_chunks_new", "request_chunks")
    with op.batch_alter_table("sample_chunks") as batch:
        batch.add_column(sa.Column("codec", Int64, nullable=False, server_default="0"))


def downgrade() -> None:
    """Back to one row per request and float32 latencies (packed telemetry is unpacked)."""
    conn = op.get_bind()
    from db.series import SampleChunkRow, merge_blocks

    create_requests_table()
    op.create_table("request_chunks_old", *request_chunk_columns())

    def value(x: float, kind: type) -> Any:
        return None if x != x else kind(x)

    chunks = conn.exec_driver_sql("SELECT run_id, seq_start, n, columns, itl FROM request_chunks").fetchall()
    for run_id, seq_start, n, columns, itl_blob in chunks:
        part = decode_requests(columns)
        c = part.columns
        conn.exec_driver_sql(driver_sql(
            conn, "INSERT INTO requests (run_id, seq, level, start_wall, ttft_ms, e2e_ms, input_tokens, output_tokens, "
            "error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            [(run_id, seq_start + i, value(c["level"][i], int), value(c["start_wall"][i], float),
              value(c["ttft_ms"][i], float), value(c["e2e_ms"][i], float), value(c["input_tokens"][i], int),
              value(c["output_tokens"][i], int), part.errors.get(i)) for i in range(n)])
        extras = decode_extras(columns)
        extras_blob = (zlib.compress(json.dumps({"keys": [], "rows": extras}, default=str).encode(), 1)
                       if any(extras) else None)
        conn.exec_driver_sql(driver_sql(
            conn, 'INSERT INTO request_chunks_old (run_id, seq_start, n, counts, "values", extras) VALUES (?, ?, ?, ?, ?, ?)'),
            (run_id, seq_start, n, c["itl_n"].astype("<i4").tobytes(), decode_itl(itl_blob).astype("<f4").tobytes(),
             extras_blob))
    op.drop_table("request_chunks")
    op.rename_table("request_chunks_old", "request_chunks")

    packed = conn.exec_driver_sql("SELECT id, source, n, names, t_mono, t_wall, data, codec FROM sample_chunks "
                                  "WHERE codec = 1").fetchall()
    for row_id, source, n, names, t_mono, t_wall, data, codec in packed:
        block = merge_blocks(source, [SampleChunkRow(n, json.loads(names) if isinstance(names, str) else names, t_mono, t_wall, data, codec)])
        conn.exec_driver_sql(driver_sql(conn, "UPDATE sample_chunks SET t_mono = ?, t_wall = ?, data = ? WHERE id = ?"),
                             (block.t_mono.astype("<f8").tobytes(), block.t_wall.astype("<f8").tobytes(),
                              np.ascontiguousarray(block.values, "<f8").tobytes(), row_id))
    with op.batch_alter_table("sample_chunks") as batch:
        batch.drop_column("codec")
