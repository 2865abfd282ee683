"""``tunebench db copy|upgrade|check|unspill``: moving runs between stores (an SQLite file and a
team's PostgreSQL database, either way), bringing a store's schema up to date, checking a store,
and storing what a recording spilled while its store was away."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import URL

from app.cli.argtypes import db_parent, json_parent
from app.cli.terminal import safe
from app.errors import UserError
from app.recording import unspill
from app.store import RunStore
from db.errors import StoreError, translate
from db.schema import (
    StoreLocation,
    check_database,
    check_file,
    current_revision,
    default_db_path,
    open_engine,
    store_location,
)
from db.transfer import CopyReport, StoreCheck, check_store, copy_runs

EXIT_PROBLEMS = 1
"""``db check`` found problems (2 stays what it is everywhere: the check could not be made)."""
PEEK_TIMEOUT_S = 5.0
"""How long ``db upgrade`` waits to read the revision before the upgrade."""
BAR_WIDTH = 20


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


class Progress:
    """A copy's progress on ``stream``: a bar redrawn in place on a terminal, else a line at every
    tenth of the runs (a log file gets ten lines, not one per run)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.tenths_shown = 0
        self.drawn = False

    def __call__(self, done: int, total: int, _uid: str) -> None:
        if total <= 0:
            return
        if self.tty:
            filled = BAR_WIDTH * done // total
            self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done:,}/{total:,} runs")
            self.drawn = True
        else:
            tenths = 10 * done // total
            if tenths <= self.tenths_shown:
                return
            self.tenths_shown = tenths
            self.stream.write(f"copying: {done:,}/{total:,} runs ({100 * done // total}%)\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _same_store(a: RunStore, b: RunStore) -> bool:
    if a.path is not None and b.path is not None:
        return a.path.resolve() == b.path.resolve()
    return a.where == b.where


def copy_summary(report: CopyReport, src: RunStore, dst: RunStore) -> str:
    """The one line ``db copy`` ends with: the stores by their display names (no password)."""
    line = (f"copied {_plural(report.copied, 'run')} from {src.where} to {dst.where} "
            f"({report.skipped_existing:,} already there, {report.skipped_running:,} still running: not copied)")
    if report.campaigns_copied or report.campaigns_skipped or report.campaigns_running:
        line += (f"; {_plural(report.campaigns_copied, 'campaign')} (ladders, tunes; "
                 f"{report.campaigns_skipped:,} already there"
                 + (f", {report.campaigns_running:,} still running: not copied" if report.campaigns_running else "")
                 + ")")
    return line


def missing_destination_folder(dst: StoreLocation, make_parents: bool) -> Path | None:
    """The destination file's folder when it is not there: made only when asked (``--parents``),
    else refused, so a mistyped folder is not made without a word."""
    if not isinstance(dst, Path):
        return None
    folder = dst.absolute().parent
    if folder.is_dir():
        return None
    if not make_parents:
        raise UserError(f"the destination's folder {folder} does not exist: create it, or pass --parents to have "
                        f"db copy create it")
    return folder


def cmd_copy(args: argparse.Namespace) -> int:
    with RunStore(args.src, create=False) as src:
        dst_location = store_location(args.dst)
        made = missing_destination_folder(dst_location, args.parents)
        with RunStore(dst_location) as dst:
            if made is not None:
                print(safe(f"tunebench: created the folder {made} (--parents)"), file=sys.stderr)
            if _same_store(src, dst):
                raise StoreError(f"{src.where} is both the source and the destination: name two stores")
            progress = Progress(sys.stderr)
            try:
                report = copy_runs(src, dst, on_progress=progress)
            finally:
                progress.finish()
            if args.json:
                _print_json({"source": src.where, "destination": dst.where, **vars(report)})
            else:
                print(safe(copy_summary(report, src, dst)))
    return 0


def revision_before(location: StoreLocation) -> str | None:
    """The schema revision of the store at ``location`` as it is (None: no store there yet),
    read without changing it; a file or database that is not tunebench's is refused as
    ``RunStore`` would refuse it, before anything is opened for writing."""
    if isinstance(location, Path):
        if not location.exists():
            return None
        check_file(location, PEEK_TIMEOUT_S)  # read-only: a foreign or newer file is refused untouched
        if location.stat().st_size == 0:
            return None
    engine = open_engine(location, PEEK_TIMEOUT_S)
    try:
        if isinstance(location, URL):
            check_database(engine, location)
        return current_revision(engine)
    except StoreError:
        raise
    except Exception as exc:
        error = translate(exc, location, PEEK_TIMEOUT_S)
        if error is None:
            raise
        raise error from None
    finally:
        engine.dispose()


def cmd_upgrade(args: argparse.Namespace) -> int:
    location = store_location(args.db) if args.db is not None else default_db_path()
    before = revision_before(location)
    with RunStore(location) as store:
        after = store.schema_revision()
        where = store.where
    if before is None:
        was = "none: a new store"
    elif before == after:
        was = f"{before}: already current"
    else:
        was = before
    print(safe(f"{where}: schema at revision {after} (was {was})"))
    return 0


def _status_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {status}" for status, n in counts.items()) or "none"


def check_lines(check: StoreCheck) -> list[str]:
    lines = [f"store:     {check.where}",
             f"revision:  {check.revision or 'none'} (newest: {check.head})",
             f"runs:      {_status_counts(check.runs_by_status)}"]
    if not check.problems:
        return [*lines, "problems:  none"]
    return [*lines, f"problems:  {len(check.problems):,}", *[f"  - {p}" for p in check.problems]]


def cmd_check(args: argparse.Namespace) -> int:
    # Runs left running stay as they are: a check changes nothing it looks at (opening a store
    # of an older schema does migrate it).
    with RunStore(args.db, mark_interrupted=False, create=False) as store:
        check = check_store(store)
    if args.json:
        _print_json({"store": check.where, "revision": check.revision, "head": check.head,
                     "runs_by_status": check.runs_by_status, "problems": check.problems, "ok": check.ok})
    else:
        for line in check_lines(check):
            print(safe(line))
    return 0 if check.ok else EXIT_PROBLEMS


def cmd_unspill(args: argparse.Namespace) -> int:
    with RunStore(args.db) as store:
        run_id, written = unspill(Path(args.file), store)
        print(safe(f"stored {_plural(written, 'record')} and the end of run {run_id} in {store.where}; "
                   f"removed {args.file}"))
    return 0


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def register(sub: argparse._SubParsersAction) -> None:
    db = db_parent()
    as_json = json_parent()

    group = sub.add_parser("db", help="copy runs between stores, upgrade or check a store")
    dsub = group.add_subparsers(dest="db_command", metavar="ACTION", required=True)

    copy = dsub.add_parser("copy", parents=[as_json],
                           help="copy every finished run and tune of SRC that DST lacks (SQLite or PostgreSQL, "
                                "either way); running it again copies only what is new")
    copy.add_argument("src", metavar="SRC", help="the store to copy from: a file or a postgresql:// URL")
    copy.add_argument("dst", metavar="DST", help="the store to copy to (made if missing): a file or a "
                                                 "postgresql:// URL")
    copy.add_argument("--parents", action="store_true",
                      help="create DST's folder if it is missing (else a missing folder is an error)")
    copy.set_defaults(handler=cmd_copy)

    upgrade = dsub.add_parser("upgrade", parents=[db], help="bring the store's schema to this tunebench's newest")
    upgrade.set_defaults(handler=cmd_upgrade)

    check = dsub.add_parser("check", parents=[db, as_json],
                            help="schema revision, runs by status, and whether every run's data reads back "
                                 "(exit 1 when something does not)")
    check.set_defaults(handler=cmd_check)

    unspill_cmd = dsub.add_parser("unspill", parents=[db],
                                  help="store what a recording kept in a spill file while the run database was "
                                       "unreachable (the file is named in the run's message)")
    unspill_cmd.add_argument("file", metavar="FILE", help="the spill file (run-*.jsonl)")
    unspill_cmd.set_defaults(handler=cmd_unspill)
