"""What differs between the store's two backends, SQLite (the embedded default) and PostgreSQL
(a team's shared store), in one place: column types, the driver's parameter style, and the
backends' names. Everything else in ``db`` is written once for both.

Types: integers are 64-bit on both (SQLite's INTEGER is; PostgreSQL's is 32-bit, so BIGINT
there). JSON stays JSON, not JSONB, on PostgreSQL: JSONB reorders an object's keys, and a run's
configuration and summaries are shown in the order they were written. Bytes are BLOB and BYTEA
(``LargeBinary`` does that by itself). Times are seconds since the epoch as floats on both.
"""

from __future__ import annotations

import functools

from sqlalchemy import JSON, BigInteger, Connection, Integer

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
POSTGRESQL_DRIVER = "postgresql+psycopg"
"""The one PostgreSQL driver tunebench uses (psycopg 3): ``postgresql://`` URLs are read as it."""

Int64 = BigInteger().with_variant(Integer(), SQLITE)
"""An integer column: INTEGER on SQLite (so an ``id`` primary key stays the rowid), BIGINT on
PostgreSQL (BIGSERIAL for a primary key)."""

Json = JSON
"""A JSON column (see the module's note on JSONB)."""


def driver_sql(conn: Connection, sql: str) -> str:
    """``sql`` written with ``?`` placeholders, in the parameter style of ``conn``'s driver (the
    hot inserts and reads go straight to the driver)."""
    return sql if conn.dialect.paramstyle == "qmark" else _format_style(sql)


@functools.cache
def _format_style(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")
