"""Opening the run database: where it is, how SQLite is set up for several processes, which files
are refused, and migrating to the newest schema (Alembic, ``db/migrations``).

A store is an SQLite file (the default) or a PostgreSQL database (:func:`store_location`). The
path is a path: ``?`` and ``#`` in a file name stay in the file name. A file or database that
holds another program's tables is refused before anything is written to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Dialect, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.exc import ArgumentError, DisconnectionError

from db.dialects import POSTGRESQL_DRIVER, SQLITE
from db.errors import StoreError, translate
from db.models import Base
from engine_adapters.secrets import mask_url

DB_ENV = "TUNEBENCH_DB"
BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another process's write to finish before it gives up."""
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
PAGE_SIZE_BYTES = 8192
"""Pages of new files: a flush's request chunk (about 10 KiB in a busy run) fills one overflow page
and leaves a small rest in its leaf page; with 4 KiB pages the rests waste about 5% of the file."""
HISTORIC_TABLES = frozenset({"requests", "request_chunks_new", "request_chunks_old", "tunes", "tune_trials"})
"""Tables older revisions had, or that a migration makes on its way (beside ``db.models``'s)."""
BATCH_TABLE_PREFIX = "_alembic_tmp_"
"""Alembic's batch mode copies a table to ``_alembic_tmp_<name>`` before it drops the old one."""


def default_db_path() -> StoreLocation:
    """``TUNEBENCH_DB``, else ``runs.db`` in the user data directory."""
    env = os.environ.get(DB_ENV)
    if env:
        return store_location(env)
    from engine_adapters.paths import data_dir

    return data_dir() / "runs.db"


_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES_SCHEMES = ("postgresql", "postgres")

StoreLocation = Path | URL
"""Where a store lives: an SQLite file, or a PostgreSQL database (a SQLAlchemy URL)."""


def store_location(location: str | Path | URL) -> StoreLocation:
    """The store a ``--db``/``TUNEBENCH_DB`` value names. A path stays a path (a ``?`` or a ``:``
    in it included); ``sqlite:///FILE`` names FILE; ``postgresql://`` (or ``postgres://``,
    ``postgresql+psycopg://``) names a PostgreSQL database, reached through psycopg; any other URL
    is refused before anything is made from it (a directory named after a URL would hold its
    password)."""
    if isinstance(location, URL | Path):
        return location if isinstance(location, Path) else _postgres_url(location, str(location))
    text = str(location)
    scheme = _URL_SCHEME.match(text)
    if scheme is None:
        return Path(text).expanduser()
    try:
        url = make_url(text)
        if url.get_backend_name() in _POSTGRES_SCHEMES:
            url.port  # noqa: B018 - parsed lazily: a port that is not a number fails here
    except ArgumentError:
        url = None
    except ValueError:  # a port that is not a number, often a forgotten host (user:password/db)
        raise StoreError(f"the {scheme.group(1)} URL given as the run database does not parse (is the host "
                         f"missing, or the port not a number?); write {scheme.group(1)}://USER@HOST:5432/DATABASE "
                         f"(it is not repeated here: it may hold a password)") from None
    if url is not None and url.get_backend_name() == SQLITE and url.database:
        return Path(url.database).expanduser()
    if url is not None and url.get_backend_name() in _POSTGRES_SCHEMES:
        return _postgres_url(url, text)
    raise StoreError(f"the run database must be an SQLite file or a PostgreSQL URL: {mask_url(text)} is a "
                     f"{scheme.group(1)} URL; pass --db with a file path, sqlite:///PATH or "
                     f"postgresql://USER@HOST:5432/DATABASE")


def _postgres_url(url: URL, text: str) -> URL:
    if url.drivername not in (*_POSTGRES_SCHEMES, POSTGRESQL_DRIVER):
        raise StoreError(f"tunebench reaches PostgreSQL through psycopg: {mask_url(text)} names the driver "
                         f"{url.drivername!r}; write postgresql://... or {POSTGRESQL_DRIVER}://...")
    if url.host and "@" in url.host:  # an "@" in the password, not written %40
        raise StoreError("the PostgreSQL URL given as the run database has an '@' in its password: write it as "
                         "%40 (it is not repeated here: it holds a password)")
    if url.port is not None and not 0 < url.port < 65536:
        raise StoreError(f"the PostgreSQL URL {mask_url(text)} has port {url.port}: a port is 1 to 65535")
    if not url.database and "service" not in url.query:  # a libpq service file may name it
        raise StoreError(f"the PostgreSQL URL {url.render_as_string(hide_password=True)} names no database: add "
                         f"/DATABASE (or "
                         f"?service=NAME for a service in ~/.pg_service.conf)")
    return url.set(drivername=POSTGRESQL_DRIVER)


def location_text(location: StoreLocation) -> str:
    """How messages name a store: the file's path, or the URL without its password."""
    return str(location) if isinstance(location, Path) else location.render_as_string(hide_password=True)


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def tunebench_tables() -> frozenset[str]:
    """Every table name some revision of tunebench's schema makes, itself or on its way."""
    return frozenset(Base.metadata.tables) | HISTORIC_TABLES | {"alembic_version"}


def foreign_tables(tables: set[str]) -> set[str]:
    """The tables tunebench never makes (a file that holds one is some other program's)."""
    ours = tunebench_tables()
    return {t for t in tables if t not in ours and t.removeprefix(BATCH_TABLE_PREFIX) not in ours}


def open_engine(location: StoreLocation, busy_timeout_s: float) -> Engine:
    """An engine on the store. A file (``URL.create``: nothing in the path is parsed as a URL)
    gets connections set up for sharing it (:func:`_setup`); a PostgreSQL database, connections
    that are checked before use (a server restarted mid-run is reconnected to) and that give up
    on an unreachable host after ``busy_timeout_s``. An established connection whose host stops
    answering (a partition drops packets; nothing refuses) fails as well, after ``busy_timeout_s``
    of unacknowledged data or silent keepalives, rather than blocking for TCP's quarter of an hour:
    the recorder's outage limit and spill then apply (tests/hosts)."""
    if isinstance(location, URL):
        silent_s = max(1, int(busy_timeout_s))
        try:
            engine = create_engine(location, connect_args={
                "connect_timeout": silent_s, "application_name": "tunebench",
                "tcp_user_timeout": silent_s * 1000, "keepalives": 1, "keepalives_idle": silent_s,
                "keepalives_interval": max(1, silent_s // 3), "keepalives_count": 3})
        except (ArgumentError, ValueError, TypeError) as exc:  # a query option SQLAlchemy cannot take
            raise StoreError(f"the run database URL {location_text(location)} has an option that does not "
                             f"parse ({str(exc).splitlines()[0]})") from None
        event.listen(engine, "checkin", _note_checkin)
        event.listen(engine, "checkout", functools.partial(_ping_if_idle, engine.dialect))
        return engine
    engine = create_engine(URL.create("sqlite+pysqlite", database=str(location)),
                           connect_args={"timeout": busy_timeout_s, "check_same_thread": False})
    event.listen(engine, "connect", lambda conn, _record: _setup(conn, busy_timeout_s))
    return engine


IDLE_PING_S = 5.0
"""A pooled PostgreSQL connection idle this long is checked before use (a server restarted
meanwhile would fail the first statement); one in steady use, as a recording's, is not: a check
on every use would add a round trip to each flush."""


def _note_checkin(_dbapi_conn: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _ping_if_idle(dialect: Dialect, dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    """SQLAlchemy's pessimistic disconnect handling (its own ping, which leaves no transaction
    open), for idle connections only: a dead one is replaced by a fresh connection before the
    caller sees it."""
    if time.monotonic() - record.info.get("idle_since", time.monotonic()) < IDLE_PING_S:
        return
    try:
        dialect.do_ping(dbapi_conn)
    except Exception as exc:
        raise DisconnectionError(str(exc)) from exc


def _setup(dbapi_conn: Any, busy_timeout_s: float) -> None:
    """WAL lets a reader (the GUI) and a writer (a CLI run) share the file; the busy timeout makes
    a second writer wait instead of failing."""
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    if cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # a read-only file may already be in WAL
        cur.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")  # new files only (no effect once written)
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def prepare_new_file(path: Path, busy_timeout_s: float) -> None:
    """A missing or empty file is put in WAL mode under the migration lock, before any other
    connection uses it: two processes (or a window's workers) opening a new store at once would
    otherwise meet in the rollback journal's locks, where one of them fails at once with
    "database is locked" (its busy timeout does not apply to that deadlock)."""
    try:
        if path.exists() and path.stat().st_size > 0:
            return
        with migration_lock(path):
            conn = sqlite3.connect(path, timeout=busy_timeout_s)
            try:
                _setup(conn, busy_timeout_s)
            finally:
                conn.close()
    except sqlite3.Error as exc:
        error = translate(exc, path, busy_timeout_s)
        raise (error or StoreError(f"cannot create the run database {path}: {exc}")) from None
    except OSError:
        return  # no lock file or no file can be made here: opening the store names the problem


def check_file(path: Path, busy_timeout_s: float) -> None:
    """Refuse, before touching it, a path that is not a regular file or a database that is
    neither empty nor tunebench's. A missing or empty file is fine: it becomes a new store."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot open the run database {path}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise StoreError(f"cannot open the run database {path}: it is a directory; pass --db with a file")
    if not stat.S_ISREG(info.st_mode):
        raise StoreError(f"cannot open the run database {path}: it is not a regular file; pass --db with a file")
    if info.st_size == 0:
        return
    try:
        conn = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=busy_timeout_s)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            revision = (conn.execute("SELECT version_num FROM alembic_version").fetchone()
                        if "alembic_version" in tables else None)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        error = translate(exc, path, busy_timeout_s)
        raise (error or StoreError(f"cannot open the run database {path}: {exc}")) from None
    tables = {t for t in tables if not t.startswith("sqlite_")}
    if not tables:
        return
    # Migrations commit as one transaction (:func:`migrate`), so a reader sees no schema or a whole
    # one; a store some older tunebench is creating may still show a part of it. Only a table
    # tunebench never makes says the file is another program's.
    if foreign := foreign_tables(tables):
        shown = ", ".join(sorted(foreign)[:5]) + (", ..." if len(foreign) > 5 else "")
        raise StoreError(f"{path} is an SQLite database but not a tunebench run database (tables tunebench "
                         f"never makes: {shown}); pass --db with another file")
    if revision is not None and revision[0] not in known_revisions():
        raise StoreError(f"the run database {path} has schema revision {revision[0]!r}, which this tunebench "
                         f"does not know: it was written by a newer tunebench; upgrade tunebench")


def check_database(engine: Engine, location: StoreLocation) -> None:
    """Refuse a PostgreSQL database that holds another program's tables, or a schema revision
    this tunebench does not know (an empty database becomes a new store)."""
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        revision = (conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
                    if "alembic_version" in tables else None)
    where = location_text(location)
    if foreign := foreign_tables(tables):
        shown = ", ".join(sorted(foreign)[:5]) + (", ..." if len(foreign) > 5 else "")
        raise StoreError(f"{where} is not a tunebench run database (tables tunebench never makes: {shown}); "
                         f"give tunebench a database of its own (docs/store.md)")
    if revision is not None and revision not in known_revisions():
        raise StoreError(f"the run database {where} has schema revision {revision!r}, which this tunebench "
                         f"does not know: it was written by a newer tunebench; upgrade tunebench")


@contextlib.contextmanager
def migration_lock(path: Path) -> Iterator[None]:
    """One process migrates at a time (the others wait, then find the schema current)."""
    lock_path = path.with_name(path.name + ".migrate.lock")
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


MIGRATION_LOCK_KEY = 0x74756E6562656E63
"""PostgreSQL advisory lock that one migrating process holds ("tunebenc" in ASCII)."""


def migrate(engine: Engine, location: StoreLocation, revision: str = "head") -> None:
    """Upgrade the schema (a no-op at the newest revision)."""
    if revision == "head" and current_revision(engine) == head_revision():
        return
    if isinstance(location, URL):
        _migrate_postgresql(engine, revision)
    else:
        _migrate_sqlite(engine, location, revision)


def _migrate_postgresql(engine: Engine, revision: str) -> None:
    """PostgreSQL's DDL is transactional: the upgrade commits whole or not at all, and the
    advisory lock makes a second workbench wait, then find the schema current."""
    config = alembic_config()
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        if revision == "head" and MigrationContext.configure(conn).get_current_revision() == head_revision():
            conn.rollback()
            return
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        conn.commit()


def _migrate_sqlite(engine: Engine, path: Path, revision: str) -> None:
    config = alembic_config()
    with migration_lock(path), engine.connect() as conn:
        # pysqlite sends no BEGIN before DDL, so each CREATE, copy and DROP would commit on its own
        # and another process could open a schema made halfway. One explicit transaction (taken
        # for writing at once) makes the whole upgrade appear at its commit, or not at all.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        before = MigrationContext.configure(conn).get_current_revision()
        if revision == "head" and before == head_revision():  # another process migrated while we waited
            conn.rollback()
            return
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        conn.commit()
    if before is None:
        return  # a new store: nothing old was rewritten
    # A migration may have rewritten old values (0003 masks secrets): copy the WAL into the file and
    # empty it, so the old pages do not linger in the -wal file until some later checkpoint. Only
    # then: this checkpoint holds off every writer while it waits for the readers.
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def create_at_revision(location: str | Path | URL, revision: str) -> None:
    """A database at an older schema revision (for migration tests)."""
    where = store_location(location)
    engine = open_engine(where, BUSY_TIMEOUT_S)
    try:
        migrate(engine, where, revision)
    finally:
        engine.dispose()
