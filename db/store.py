"""The run store: one SQLite file that the GUI and CLI runs write concurrently (WAL, busy
timeout), or a team's PostgreSQL database, migrated to the newest schema on open, and cleaned of
runs whose writer died.

Writes are batched by the caller (``write_batch``) so telemetry and requests land at least once
a second during a run; reads return plain pydantic models or numpy columns.

The store is split by job: ``db.schema`` (opening, migrations), ``db.codecs``, ``db.series`` and
``db.frames`` (how the bulk is packed), ``db.writes`` and ``db.queries`` (the two halves of
:class:`RunStore`), ``db.records`` (what goes in and out) and ``db.errors`` (one-line errors).
This module puts them together and is where callers import from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from sqlalchemy import URL

from db.errors import StoreError, StoreMissing, StoreUnreachable, damaged, quick_check, translate
from db.records import ImportedRun, LevelInfo, RunDetail, RunInfo, SampleIn, SeriesBlock
from db.schema import (
    BUSY_TIMEOUT_S,
    DB_ENV,
    StoreLocation,
    alembic_config,
    check_database,
    check_file,
    create_at_revision,
    default_db_path,
    location_text,
    prepare_new_file,
    store_location,
)
from db.schema import migrate as _migrate
from db.schema import open_engine as _open_engine
from db.writes import FINAL_STATUSES, RunWrites, default_author, writer_alive
from engine_adapters.process_group import process_identity

QUICK_CHECK_MAX_BYTES = 512 << 20
"""After an unclean stop, files up to this size are checked on open (2 to 3 s per GiB)."""

__all__ = [
    "BUSY_TIMEOUT_S", "DB_ENV", "FINAL_STATUSES", "ImportedRun", "LevelInfo", "RunDetail", "RunInfo", "RunStore",
    "SampleIn", "SeriesBlock", "StoreError", "StoreLocation", "StoreMissing", "StoreUnreachable", "alembic_config",
    "create_at_revision", "default_db_path",
    "location_text", "store_location",
    "writer_alive",
]


def _absent(path: Path) -> bool:
    """Nothing at ``path`` (another problem, such as no right to look, is for opening to name)."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def missing_store(where: str) -> StoreMissing:
    return StoreMissing(f"there is no run database at {where} (nothing was created there): check the path, "
                        f"--db or TUNEBENCH_DB; a run or tunebench import creates one")


class RunStore(RunWrites):
    """The run database (an SQLite file, or PostgreSQL). Safe to share between threads; several
    processes may open the same store. Opening refuses a file that is not a tunebench database, migrates to the
    newest schema and marks orphaned runs interrupted (after checking the file, since their
    writer stopped uncleanly). Every failure is a one-line :class:`StoreError`.

    ``create=False`` is for what only reads (or changes stored runs): an SQLite file that is not
    there is refused (:class:`StoreMissing`) and nothing is made, neither the file nor its folder.
    A file or a PostgreSQL database that exists, empty, is opened as an empty store."""

    def __init__(self, location: str | Path | URL | None = None, *, mark_interrupted: bool = True,
                 busy_timeout_s: float | None = None, author: str | None = None, create: bool = True) -> None:
        self.location: StoreLocation = store_location(location) if location is not None else default_db_path()
        self.path: Path | None = self.location if isinstance(self.location, Path) else None
        self.where = location_text(self.location)
        self.busy_timeout_s = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        if self.path is not None and not create and _absent(self.path):
            raise missing_store(self.where)
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the directory for the run database {self.path}: {exc.strerror}") from None
            check_file(self.path, self.busy_timeout_s)
            prepare_new_file(self.path, self.busy_timeout_s)
        self.engine = _open_engine(self.location, self.busy_timeout_s)
        self._pid, self._create_time = process_identity()
        self.author = author or default_author()
        self._seq: dict[tuple[int, str], int] = {}
        try:
            if self.path is None:
                check_database(self.engine, self.location)
            _migrate(self.engine, self.location)
            self.interrupted_on_open: list[int] = self._recover() if mark_interrupted else []
        except Exception as exc:
            self.engine.dispose()
            error = translate(exc, self.location, self.busy_timeout_s)
            if error is None:
                raise
            raise error from None

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    def _recover(self) -> list[int]:
        """Runs whose writer died become ``interrupted``; such a stop may have left a file
        damaged, so it is checked first (when that is cheap) and never written to if it is."""
        dead = self.orphaned_runs()
        if not dead:
            return []
        if self.path is not None:
            try:
                size = self.path.stat().st_size
            except OSError:
                size = QUICK_CHECK_MAX_BYTES + 1
            if size <= QUICK_CHECK_MAX_BYTES and (problem := quick_check(self.path, self.busy_timeout_s)):
                raise damaged(self.path, problem)
        return self.mark_interrupted(dead)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
