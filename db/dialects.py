"""What differs between the store's two backends, SQLite (the embedded default) and PostgreSQL
(a team's shared store), in one place: column types, the driver's parameter style, and the
backends' names. Everything else in ``db`` is written once for both.

Types: integers are 64-bit on both (SQLite's INTEGER is; PostgreSQL's is 32-bit, so BIGINT
there). JSON is text on both: PostgreSQL's JSONB would reorder an object's keys (a run's
configuration and summaries are shown in the order they were written), and both its JSON types
refuse NaN and Infinity, which figures hold. Nothing queries inside JSON. Bytes are BLOB and BYTEA
(``LargeBinary`` does that by itself). Times are seconds since the epoch as floats on both.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from sqlalchemy import JSON, BigInteger, Connection, Dialect, Integer, Text
from sqlalchemy.types import TypeDecorator, TypeEngine

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
POSTGRESQL_DRIVER = "postgresql+psycopg"
"""The one PostgreSQL driver tunebench uses (psycopg 3): ``postgresql://`` URLs are read as it."""

Int64 = BigInteger().with_variant(Integer(), SQLITE)
"""An integer column: INTEGER on SQLite (so an ``id`` primary key stays the rowid), BIGINT on
PostgreSQL (BIGSERIAL for a primary key)."""

class _JsonText(TypeDecorator[Any]):
    """JSON kept as text, as SQLite keeps it: PostgreSQL's ``json`` and ``jsonb`` refuse NaN and
    Infinity, which a run's figures hold (a level without a percentile, an unbounded ratio)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is JSON.NULL:  # JSON's own null, where None means SQL NULL (``none_as_null``)
            return "null"
        return None if value is None else json.dumps(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


def json_type(*, none_as_null: bool = False) -> TypeEngine[Any]:
    """A JSON value: SQLite's JSON; text on PostgreSQL (see :class:`_JsonText`)."""
    return JSON(none_as_null=none_as_null).with_variant(_JsonText(), POSTGRESQL)


Json = json_type()
"""A JSON column (see the module's note)."""


def driver_sql(conn: Connection, sql: str) -> str:
    """``sql`` written with ``?`` placeholders, in the parameter style of ``conn``'s driver (the
    hot inserts and reads go straight to the driver)."""
    return sql if conn.dialect.paramstyle == "qmark" else _format_style(sql)


@functools.cache
def _format_style(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")
