"""The window's run database: which store it reads and records into (``--db``, the environment,
or Run database…), opened once in a worker, and the History and Compare tabs fed from it.

Every store call runs in a worker (:func:`app.gui.workers.run_in_worker`); the window and the
campaign tabs reach the store through :meth:`StoreLink.with_store` only. What it needs of the
window is :class:`StoreHost`; the window is one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from app.analysis.compare import Comparison
from app.gui.history import CompareExtras, compare_with_extras
from app.gui.host import Errors, Lifetime, Previous, Priced, Settings, Tabs
from app.gui.store_box import StoreDialog, shown_location
from app.gui.workers import run_in_worker
from app.race import Race, race_of
from app.store import DB_ENV, RunInfo, RunStore
from db.writes import AUTHOR_ENV, default_author

if TYPE_CHECKING:
    from app.gui.history import CompareView, HistoryView

T = TypeVar("T")
HISTORY_POLL_MS = 5000
"""While History lists a running run, it is read again this often: a run another workbench records
into a shared store finishes there, not here."""


class StoreHost(Lifetime, Errors, Settings, Priced, Tabs, Previous, Protocol):
    """What the store link needs of the window: the settings that name the store, the tabs fed
    from it, and the last run's configuration (a first run's name is suggested against it)."""

    @property
    def history(self) -> HistoryView: ...
    @property
    def compare(self) -> CompareView: ...
    def previous_loaded(self, config: dict[str, Any]) -> None: ...
    def show_race(self, race: Race) -> None: ...


class StoreLink(QObject):
    """The store in use and the tabs that show it (History, Compare, the campaign pickers)."""

    store_chosen = Signal()
    """Run database… named a store: the settings, which now name it, are to be saved."""
    store_switched = Signal()
    """Another store is in use: the campaign tabs' pickers list its stored campaigns."""

    def __init__(self, host: StoreHost, db_path: str | None) -> None:
        super().__init__(host.window())
        self.host = host
        self.db_path = db_path
        # --db, then TUNEBENCH_DB, win over the location chosen in Run database… (as in docs/store.md)
        self.explicit = db_path is not None or bool(os.environ.get(DB_ENV, "").strip())
        self.author_from_env = bool(os.environ.get(AUTHOR_ENV, "").strip())  # as --db: wins over the settings
        self.store: RunStore | None = None
        self._lock = threading.Lock()
        self._history_from: str | None = None  # the location History's table was read from
        self.location_known = threading.Event()  # set once --db or the settings say which store to open
        if self.explicit:
            self.location_known.set()
        self.compare_ids: list[int] = []
        self.history_poll = QTimer(self)
        self.history_poll.setSingleShot(True)
        self.history_poll.setInterval(HISTORY_POLL_MS)
        self.history_poll.timeout.connect(self.refresh_history)

    def with_store(self, fn: Callable[[RunStore], T]) -> T:
        """Run ``fn(store)`` (in a worker); the store is opened on first use, once it is known
        which one (the settings may name it: the default file is not made on the way)."""
        self.location_known.wait(10)
        with self._lock:
            if self.store is None:
                self.store = RunStore(self.db_path)
            store = self.store
        return fn(store)

    def settings_read(self, location: str | None, author: str) -> None:
        """The settings loaded (or failed to: None, ""): what they say wins unless --db or the
        environment said otherwise; History is read once it is known where."""
        author = author if not self.author_from_env else os.environ.get(AUTHOR_ENV, "")
        location = location if not self.explicit and location else self.db_path
        if author != os.environ.get(AUTHOR_ENV, "") or location != self.db_path:
            self.use_store(location, author)
        elif not self.explicit:
            self.refresh_history()
        self.location_known.set()

    def settings_failed(self) -> None:
        """No settings to read: the store is the one --db, the environment or the default names."""
        self.location_known.set()
        if not self.explicit:
            self.refresh_history()

    def refresh_history(self) -> None:
        location, history = self.db_path, self.host.history

        def read(result: tuple[str, list[RunInfo]]) -> None:
            if location != self.db_path:
                return  # read from the store before a switch: a newer refresh is on its way
            self._history_from = location
            history.set_where(result[0])
            self._history_loaded(result[1])

        def failed(message: str) -> None:
            if location == self.db_path and self._history_from != location:  # not the runs on screen
                history.set_where(f"{shown_location(location)} (not opened)")
                history.set_runs([])
            self.host.show_error(message)

        run_in_worker(lambda: self.with_store(lambda s: (s.where, s.list_runs(limit=5000))), read, failed,
                      name="history", parent=self)

    def _history_loaded(self, runs: list[RunInfo]) -> None:
        self.host.history.set_runs(runs)
        if any(r.status == "running" for r in runs) and not self.history_poll.isActive():
            self.history_poll.start()  # a run being recorded (here, or by another workbench) moves on
        if self.host.previous_config is None and runs:  # a first run this session: suggest against the last stored
            latest = max(runs, key=lambda r: r.started_at)
            run_in_worker(lambda: self.with_store(lambda s: s.get_run(latest.id).config),
                          self.host.previous_loaded, None, name="last-config", parent=self)

    def open_store_dialog(self) -> StoreDialog:
        """Run database…: on OK the choice is saved, the store switched and History re-read."""
        dialog = StoreDialog(self.host.window(), self.db_path or "", os.environ.get(AUTHOR_ENV, ""),
                             where=self.host.history.where.text().removeprefix("Runs in: "))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # a typed password does not outlive it
        dialog.accepted.connect(lambda: self._store_chosen(dialog.location(), dialog.author()))
        dialog.open()
        return dialog

    def _store_chosen(self, location: str, author: str) -> None:
        host = self.host
        host.settings = host.settings.model_copy(update={"store_location": location, "author": author})
        self.store_chosen.emit()
        self.use_store(location or None, author)

    def use_store(self, location: str | None, author: str) -> None:
        """Record as ``author`` (runs this process records read it from the environment) into the
        store at ``location``; the open store is closed in a worker (the next call opens the new
        one, with the new author) and History re-reads."""
        if author:
            os.environ[AUTHOR_ENV] = author
        else:
            os.environ.pop(AUTHOR_ENV, None)
        self.host.history.author = default_author()
        self.db_path = location

        def drop() -> None:
            with self._lock:  # a worker opening the old store finishes first
                store, self.store = self.store, None
            if store is not None:
                store.close()

        run_in_worker(drop, lambda _r: self._store_switched(), self.host.show_error, name="store-close",
                      parent=self)

    def _store_switched(self) -> None:
        self.refresh_history()
        self.store_switched.emit()

    def store_call(self, fn: Callable[[RunStore], Any]) -> None:
        """An edit of the stored runs (rename, tag, notes, delete); History re-reads after it."""
        run_in_worker(lambda: self.with_store(fn), lambda _r: self.refresh_history(), self.host.show_error,
                      name="store-edit", parent=self)

    def delete_runs(self, ids: list[int]) -> None:
        def delete(store: RunStore) -> None:
            for run_id in ids:
                store.delete(run_id)
        self.store_call(delete)

    def compare_runs(self, ids: list[int], baseline: int | None = None) -> None:
        if len(ids) < 2:
            self.host.show_error("Select at least two runs to compare.")
            return
        self.compare_ids = list(ids)
        prices = self.host.prices()
        run_in_worker(lambda: self.with_store(lambda s: compare_with_extras(s, ids, baseline, prices)),
                      self._compared, self.host.show_error, name="compare", parent=self)

    def race_runs(self, a: int, b: int) -> None:
        """Two stored runs' sample requests, read in a worker, raced in presentation mode."""
        run_in_worker(lambda: self.with_store(lambda s: race_of(s, a, b)), self.host.show_race, self.host.show_error,
                      name="race", parent=self)

    def _compared(self, result: tuple[Comparison, CompareExtras]) -> None:
        comparison, extras = result
        self.host.compare.show_comparison(comparison, extras)
        self.host.tabs.setCurrentWidget(self.host.compare)

    def recompare(self) -> None:
        """The comparison on screen again (at new prices), with its baseline."""
        comparison = self.host.compare.comparison
        if comparison is not None:
            self.compare_runs(self.compare_ids, baseline=comparison.runs[comparison.baseline].id)

    def close_store(self, then: Callable[[], None], failed: Callable[[str], None]) -> bool:
        """Close the open store in a worker, then ``then()``; False when none is open."""
        if self.store is None:
            return False
        store, self.store = self.store, None
        run_in_worker(store.close, lambda _r: then(), failed, name="store-close", parent=self)
        return True
