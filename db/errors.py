"""The store's one error type, and what a failed SQLite call means for the user.

Every store method turns a driver error into a one-line :class:`StoreError` that names the file
and what to do about it (the CLI prints it and exits 2). A damaged file is confirmed with
``PRAGMA quick_check`` before it is called damaged.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import URL

from engine_adapters.errors import TunebenchError

P = ParamSpec("P")
R = TypeVar("R")

INT64_MAX = 2**63 - 1
"""The largest integer SQLite stores (ids, limits and counts beyond it are refused)."""


class StoreError(TunebenchError):
    """A store problem with a one-line, user-facing message."""


class StoreMissing(StoreError):
    """A command that only reads named a store that does not exist (it is not created)."""


class StoreUnreachable(StoreError):
    """The store's server cannot be reached, or the connection to it was lost: worth retrying
    (a recording holds its records and tries again; see ``app.recording``)."""


class DamagedData(Exception):
    """Stored bytes that do not decode (a failed checksum or an impossible shape): raised by the
    codecs, reported by :func:`translate` as a damaged database."""


# SQLite's primary result codes (https://sqlite.org/rescode.html)
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 3, 5, 6, 8, 10, 11, 13, 14, 26


def quick_check(path: Path, timeout_s: float = 5.0) -> str | None:
    """None when SQLite finds the file sound, else its first complaints (read-only: the check
    never writes to a file it suspects)."""
    try:
        conn = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=timeout_s)
        try:
            rows = conn.execute("PRAGMA quick_check(3)").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:  # damage that stops the check itself counts; being unable to run it does not
        return str(exc) if _code(exc) in (_CORRUPT, _NOTADB) else None
    found = [line.strip() for r in rows for line in str(r[0]).splitlines()
             if line.strip() and not line.startswith("*** in database")]
    return None if found == ["ok"] else "; ".join(found[:3]) or "quick_check failed"


def _code(exc: BaseException) -> int:
    """SQLite's primary result code of a driver error (0 when it has none)."""
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def damaged(path: Path, detail: str) -> StoreError:
    return StoreError(f"the run database {path} is damaged ({_first_line(detail)}): restore it from a backup, "
                      f"or move it aside to start a new one (`sqlite3 {path} .recover` may save its runs)")


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else type(text).__name__


def translate(exc: BaseException, location: Path | URL, busy_timeout_s: float) -> StoreError | None:
    """The one-line error for what went wrong in a store call, or None if ``exc`` is not a
    database problem (a bug: let it surface)."""
    if isinstance(exc, StoreError):
        return exc
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's exception
    if isinstance(location, URL):
        return _translate_postgresql(orig, location)
    path = location
    if isinstance(orig, DamagedData | zlib.error | json.JSONDecodeError):
        return damaged(path, quick_check(path) or f"unreadable stored data: {_first_line(orig)}")
    if isinstance(orig, OverflowError):
        return StoreError(f"a number is too large for the run database {path} (SQLite stores integers "
                          f"up to {INT64_MAX:,}): {_first_line(orig)}")
    if isinstance(orig, UnicodeEncodeError):
        return StoreError(f"text that is not valid UTF-8 cannot be stored in the run database {path} "
                          f"({_first_line(orig)})")
    if isinstance(orig, OSError) and not isinstance(orig, sqlite3.Error):
        return StoreError(f"cannot use the run database {path}: {orig.strerror or orig} "
                          f"({orig.filename or path})")
    if not isinstance(orig, sqlite3.Error):
        return None
    code = _code(orig)
    message = _first_line(orig)
    if code in (_BUSY, _LOCKED) or "locked" in message:
        return StoreError(f"the run database {path} is locked by another process: try again when it has finished "
                          f"(a lock is waited for up to {busy_timeout_s:g} s; SQLite gives up at once where waiting "
                          "could never end)")
    if code == _READONLY or "readonly" in message:
        return StoreError(f"cannot write to the run database {path}: it is read-only; make it and its directory "
                          f"writable, or pass --db with another file")
    if code == _CANTOPEN:
        return StoreError(f"cannot open the run database {path} ({message}): the file and its directory must "
                          f"be writable (SQLite keeps {path.name}-wal and {path.name}-shm beside it)")
    if code == _PERM:
        return StoreError(f"cannot use the run database {path}: permission denied ({message})")
    if code == _FULL or "disk is full" in message:
        return StoreError(f"the disk holding the run database {path} is full: free some space "
                          f"(what was being written was not stored)")
    if code == _NOTADB or "not a database" in message:
        return StoreError(f"cannot open the run database {path}: it is not an SQLite database, or its header is "
                          f"damaged ({message}); pass --db with another file, or restore it from a backup")
    if code == _CORRUPT or "malformed" in message or "corrupt" in message:
        return damaged(path, quick_check(path) or message)
    if code == _IOERR:
        return StoreError(f"reading or writing the run database {path} failed ({message}): the disk may be full "
                          f"or failing; free some space or check the disk, then try again")
    return StoreError(f"run database {path}: {message}")


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """A store method whose database failures come out as one-line :class:`StoreError`\\ s."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            store: Any = args[0]
            error = translate(exc, store.location, store.busy_timeout_s)
            if error is None:
                raise
            raise error from None

    return wrapper


def _translate_postgresql(orig: BaseException, url: URL) -> StoreError | None:
    """A PostgreSQL store's failure in one line that names the server and the database, never
    the password (psycopg's messages do not hold it; a URL is shown without it)."""
    import psycopg

    where = url.render_as_string(hide_password=True)
    if isinstance(orig, DamagedData | zlib.error | json.JSONDecodeError):
        return StoreError(f"the run database {where} holds damaged data ({_first_line(orig)}): restore it from a "
                          f"backup")
    if not isinstance(orig, psycopg.Error):
        return None
    message = _redact(_pg_message(orig), url)
    host = f"{url.host or 'the local socket'}" + (f":{url.port}" if url.port else "")
    if isinstance(orig, psycopg.OperationalError) and (message.startswith("connection is bad")
                                                        or "failed to resolve host" in message):
        return StoreError(f"cannot connect to the run database {where}: {message}; check the URL's host and "
                          f"options")
    if isinstance(orig, psycopg.OperationalError) and message.startswith("connection failed"):
        lowered = message.lower()
        if "password" in lowered or "authentication" in lowered:
            return StoreError(f"cannot connect to the run database {where} on {host}: {message}; check the user "
                              f"and password (PGPASSWORD, ~/.pgpass)")
        if "does not exist" in lowered:
            return StoreError(f"cannot connect to the run database {where} on {host}: {message}; create it "
                              f"(CREATE DATABASE {url.database}; docs/store.md)")
        return StoreUnreachable(f"cannot connect to the run database {where} on {host}: {message}; is the server "
                                f"running, and is the host and port right?")
    if isinstance(orig, psycopg.errors.InsufficientPrivilege):
        return StoreError(f"the role {url.username or '(default)'} may not do this in the run database {where} "
                          f"({message}): grant it the rights docs/store.md lists")
    if isinstance(orig, psycopg.errors.NumericValueOutOfRange):
        return StoreError(f"a number is too large for the run database {where} (it stores integers up to "
                          f"{INT64_MAX:,}): {message}")
    if isinstance(orig, psycopg.errors.DiskFull):
        return StoreError(f"the disk of the server holding the run database {where} is full ({message}): what was "
                          f"being written was not stored")
    if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):  # a shutdown, a lost connection
        return StoreUnreachable(f"lost the connection to the run database {where} on {host} ({message}); try again when "
                          f"the server is back")
    return StoreError(f"run database {where}: {message}")


def _pg_message(exc: BaseException) -> str:
    """psycopg's first meaningful line (a failed connection says 'connection failed:' first)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _redact(message: str, url: URL) -> str:
    from engine_adapters.secrets import mask_text

    if url.password and len(str(url.password)) >= 4:  # a shorter one would mark letters of the message
        message = message.replace(str(url.password), "***")
    return mask_text(message)
