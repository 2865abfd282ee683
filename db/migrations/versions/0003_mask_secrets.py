"""Mask secrets that older versions stored: profile environment values (``HF_TOKEN``,
``OPENAI_API_KEY``...), ``--api-key`` values in argv and ``extra_args``, ``user:password@`` in
endpoints, tokens in reasons, events, request errors and the engine log
(rules: ``engine_adapters.secrets``). Masking cannot be undone: the downgrade keeps the masks.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

from alembic import op

from db.dialects import SQLITE, driver_sql
from engine_adapters.secrets import mask_argv, mask_env, mask_obj, mask_text, mask_url

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _json(mask: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A masker for a JSON text column (NULL and unparsable text pass as they are)."""

    def apply(text: Any) -> Any:
        if text is None:
            return None
        if not isinstance(text, str | bytes):  # a driver that parses JSON columns (psycopg)
            return mask(text)
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            return mask_text(str(text))
        masked = json.dumps(mask(value))
        return text if masked == json.dumps(value) else masked

    return apply


def _text(value: Any) -> Any:
    return None if value is None else mask_text(str(value))


def _url(value: Any) -> Any:
    return None if value is None else mask_url(str(value))


def _argv(value: Any) -> Any:
    return mask_argv(value) if isinstance(value, list) else mask_obj(value)


def _env(value: Any) -> Any:
    return mask_env(value) if isinstance(value, dict) else mask_obj(value)


_RUN_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "env": _json(_env), "argv": _json(_argv), "config": _json(mask_obj), "endpoint": _url, "reason": _text,
    "engine_info": _json(mask_obj), "summary": _json(mask_obj),
}
"""Environment first: masking it remembers the values, so their echoes elsewhere are masked too."""


def _mask_rows(table: str, key: tuple[str, ...], columns: dict[str, Callable[[Any], Any]],
               where_sql: str = "") -> None:
    """Rewrite the rows whose masked values differ (names are this module's constants)."""
    conn = op.get_bind()
    names = list(columns)
    rows = conn.exec_driver_sql(f"SELECT {', '.join(key + tuple(names))} FROM {table} {where_sql}").fetchall()
    where = " AND ".join(f"{k} = ?" for k in key)
    for row in rows:
        ids, old = tuple(row[:len(key)]), row[len(key):]
        new = [columns[name](value) for name, value in zip(names, old, strict=True)]
        changed = [(name, value) for name, value, before in zip(names, new, old, strict=True) if value != before]
        if changed:
            sets = ", ".join(f'"{name}" = ?' for name, _ in changed)
            conn.exec_driver_sql(driver_sql(conn, f"UPDATE {table} SET {sets} WHERE {where}"), tuple(v for _, v in changed) + ids)


def _mask_logs() -> None:
    """Log chunks are zlib-compressed UTF-8 lines: decode, mask each line, re-encode."""
    conn = op.get_bind()
    keys = conn.exec_driver_sql("SELECT run_id, seq FROM log_chunks").fetchall()
    for run_id, seq in keys:
        blob = conn.exec_driver_sql(driver_sql(conn, "SELECT data FROM log_chunks WHERE run_id = ? AND seq = ?"),
                                    (run_id, seq)).scalar()
        if not isinstance(blob, bytes):
            continue
        try:
            text = zlib.decompress(blob).decode("utf-8", "replace")
        except zlib.error:
            continue
        masked = "\n".join(mask_text(line) for line in text.split("\n"))
        if masked != text:
            conn.exec_driver_sql(driver_sql(conn, "UPDATE log_chunks SET data = ? WHERE run_id = ? AND seq = ?"),
                                 (zlib.compress(masked.encode("utf-8"), 6), run_id, seq))


def _mask_all() -> None:
    _mask_rows("runs", ("id",), _RUN_COLUMNS)
    _mask_rows("levels", ("run_id", "idx"), {"params": _json(mask_obj), "summary": _json(mask_obj)})
    _mask_rows("run_events", ("id",), {"payload": _json(mask_obj)})
    _mask_rows("requests", ("id",), {"error": _text}, "WHERE error IS NOT NULL")
    _mask_logs()


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != SQLITE:  # PostgreSQL's VACUUM, not a pragma, reclaims old row versions
        _mask_all()
        return
    # Overwrite what the updates free (old row images, overflow pages): otherwise the secrets
    # would stay readable in the file's free space.
    before = conn.exec_driver_sql("PRAGMA secure_delete").scalar()
    conn.exec_driver_sql("PRAGMA secure_delete = ON")
    try:
        _mask_all()
    finally:
        conn.exec_driver_sql(f"PRAGMA secure_delete = {int(before or 0)}")


def downgrade() -> None:
    """Nothing to undo: the secrets are gone for good."""
