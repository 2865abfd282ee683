"""What the Ladder tab (``app.gui.ladder_tab``) and the Tune tab (``app.gui.tune_tab``) share:
both drive an ``app.campaign`` owner in the window's run worker (so Stop and closing the window
treat it as the running run), show it as a chart over a table, and open stored campaigns from a
picker to report or export. :class:`CampaignTab` holds that machinery once; each tab builds its
own controls and keeps its own wording (``noun``, ``title``) and object names.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractItemView,
    QBoxLayout,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.cost import PriceTable, price_table
from app.errors import UserError
from app.gui.host import Busy, ProfileNamed, RunPlace
from app.gui.workers import run_in_worker

if TYPE_CHECKING:
    from engine_adapters.base import FlagSet
    from engine_adapters.hardware import HardwareInfo

Row = TypeVar("Row")


class CampaignHost(RunPlace, Busy, ProfileNamed, Protocol):
    """What a campaign tab needs of the window (``app.gui.main_window.MainWindow`` is one): the
    configuration being edited, what the window probed, its store, and one running run at a time.
    A tab asks for nothing else, so a test can host one on a small window of its own."""

    @property
    def hardware(self) -> HardwareInfo | None: ...
    @property
    def flags(self) -> FlagSet | None: ...

    def stop_run(self) -> None: ...
    def open_export(self, run_ids: list[int], comparison: bool = False) -> Any: ...
    def compare_runs(self, ids: list[int], baseline: int | None = None) -> None: ...
    def race_runs(self, a: int, b: int) -> None: ...

    def start_campaign(self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[str], None],
                       cancel: threading.Event, name: str, phase_text: str, owner: QWidget) -> None:
        """``work()`` in a worker as the window's running run (Stop sets ``cancel``)."""
        ...

    def run_ended(self) -> None:
        """The running run ended: the window is idle again."""
        ...


class CampaignTab(QWidget):
    """The shared half of a campaign tab, hosted by a :class:`CampaignHost` (the window).
    A subclass sets ``noun``/``title``/``tick_ms``, builds its layout with the ``_add_*`` helpers,
    and supplies ``_list_stored``, ``_stored_label``, ``_report_target``, ``_render_report``,
    ``_update_buttons``, ``_done`` and ``tick``."""

    noun = "campaign"
    """Lower case, in messages and file names ("ladder", "tune")."""
    title = "Campaign"
    """Capitalised, at the start of a banner ("Ladder", "Tune")."""
    tick_ms = 250
    runner_factory: Any = None
    """Tests put a stand-in runner here (the campaign owner's ``runner_factory``)."""

    def __init__(self, window: CampaignHost, parent: QWidget | None = None) -> None:
        # Qt's metaclass cannot be mixed with ABCMeta, so the hooks' @abstractmethod is checked here:
        # a tab that lacks one fails when it is built, not when the user first reaches it.
        if missing := sorted(name for name in dir(type(self))
                             if getattr(getattr(type(self), name, None), "__isabstractmethod__", False)):
            raise TypeError(f"{type(self).__name__} does not define the campaign tab's {', '.join(missing)}")
        super().__init__(parent)
        self.main = window
        self.state: Any = None
        self.stored: list[Any] = []
        self._running = False
        self._busy = False

    def _start_ticking(self) -> None:
        """The tick (following the run and the window) and the first read of the store."""
        self.timer = QTimer(self)
        self.timer.setInterval(self.tick_ms)
        self.timer.timeout.connect(self.tick)
        self.timer.start()
        QTimer.singleShot(0, self.refresh_stored)

    # -- layout --------------------------------------------------------------------------------

    def _add_run_row(self, box: QBoxLayout, text: str, object_name: str) -> None:
        """Start (``object_name``, for tests) and Stop, which stops the window's run."""
        row = QHBoxLayout()
        self.start_button = QPushButton(text)
        self.start_button.setObjectName(object_name)
        self.stop_button = QPushButton("\u25a0 Stop")
        self.stop_button.setEnabled(False)
        row.addWidget(self.start_button)
        row.addWidget(self.stop_button)
        box.addLayout(row)
        self.stop_button.clicked.connect(self.main.stop_run)

    def _add_stored_box(self, box: QBoxLayout, label: str, *texts: str) -> list[QPushButton]:
        """The stored campaigns' picker and a row of buttons acting on the chosen one."""
        box.addWidget(QLabel(label))
        self.stored_picker = QComboBox()
        box.addWidget(self.stored_picker)
        row = QHBoxLayout()
        buttons = [QPushButton(text) for text in texts]
        for button in buttons:
            row.addWidget(button)
        box.addLayout(row)
        return buttons

    def _add_why(self, box: QBoxLayout, text: str, tooltip: str) -> None:
        """The button that explains the shown campaign from its stored runs' findings (the same
        text as ``tunebench explain --ladder/--tune``), and the read-only view it fills, which the
        tab places (hidden until there is something to show)."""
        self.why_button = QPushButton(text)
        self.why_button.setObjectName(self.noun + "Why")
        self.why_button.setToolTip(tooltip)
        box.addWidget(self.why_button)
        self.why_button.clicked.connect(self.explain_shown)
        self.why_view = QPlainTextEdit()
        self.why_view.setObjectName(self.noun + "WhyText")
        self.why_view.setReadOnly(True)
        self.why_view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)

    def _add_message(self, box: QBoxLayout) -> None:
        self.message = QLabel("")
        self.message.setWordWrap(True)
        box.addWidget(self.message)

    def _add_results(self, split: QSplitter, chart: QWidget, columns: Sequence[str], sizes: list[int]) -> None:
        """The chart over the table (read-only, one row per step or trial), on the right."""
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(chart)
        self.table = QTableWidget(0, len(columns))
        self.table.setHorizontalHeaderLabels(list(columns))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        right.addWidget(self.table)
        right.setSizes(sizes)
        split.addWidget(right)

    def _fill_table(self, rows: Sequence[Row], cells: Callable[[Row], Sequence[str]],
                    style: Callable[[QTableWidgetItem, Row, int], None]) -> None:
        """One table row per step or trial: ``cells(row)`` its texts, ``style(item, row, col)`` its look."""
        self.table.setRowCount(len(rows))
        for i, row in enumerate(rows):
            for col, text in enumerate(cells(row)):
                item = QTableWidgetItem(text)
                style(item, row, col)
                self.table.setItem(i, col, item)

    def _quiet_prices(self) -> PriceTable:
        """Your prices from the settings, for a worker thread: a hand-edited settings file with a
        bad price falls back to the shipped list (the window says so when it prices on its thread)."""
        try:
            return price_table(self.main.settings.prices)
        except UserError:
            return price_table()

    @staticmethod
    def _left_panel(split: QSplitter) -> QVBoxLayout:
        """The controls' column, on the left of ``split``."""
        left = QWidget()
        box = QVBoxLayout(left)
        box.setContentsMargins(0, 0, 0, 0)
        split.addWidget(left)
        return box

    # -- running ---------------------------------------------------------------------------------

    @property
    def running_here(self) -> bool:
        return self._running

    def _blocked(self) -> bool:
        """The configuration's problems, said in one message; True when there are any."""
        problems = self.main.config_panel.problems()
        if problems:
            self.main.show_error(f"Cannot start the {self.noun}: " + "; ".join(problems))
        return bool(problems)

    def _launch(self, work: Callable[[], Any], cancel: threading.Event, phase_text: str) -> None:
        """``work()`` in the window's run worker, as the window's running run."""
        self._running = True
        self.main.start_campaign(work, self._done, self._failed, cancel, self.noun, phase_text, self)
        self._update_buttons()

    @abstractmethod
    def _done(self, state: Any) -> None:
        """The run's final state, on the GUI thread: each tab shows it its own way."""

    def _failed(self, message: str) -> None:
        self._finished()
        self.main.show_error(f"{self.title} failed: {message}")

    def _finished(self) -> None:
        self._running = False
        self.main.run_ended()
        self._update_buttons()
        self.refresh_stored()

    def _follow_window(self) -> None:
        """A run started or ended (here or from the toolbar): the buttons follow."""
        if self.main.running != self._busy:
            self._busy = bool(self.main.running)
            self._update_buttons()

    def tick(self) -> None:
        self._follow_window()

    @abstractmethod
    def _update_buttons(self) -> None:
        """Which buttons the tab's state allows."""

    # -- stored campaigns --------------------------------------------------------------------------

    @abstractmethod
    def _list_stored(self, store: Any) -> list[Any]:
        """The tab's stored campaigns (in a worker, from the store)."""

    @abstractmethod
    def _stored_label(self, item: Any) -> str:
        """One stored campaign as the picker lists it."""

    def refresh_stored(self) -> None:
        run_in_worker(lambda: self.main.with_store(self._list_stored), self._stored_loaded, self.main.show_error,
                      name=self.noun + "s", parent=self)

    def _stored_loaded(self, items: list[Any]) -> None:
        self.stored = items
        self.stored_picker.blockSignals(True)
        self.stored_picker.clear()
        for item in items:
            self.stored_picker.addItem(self._stored_label(item))
        self.stored_picker.blockSignals(False)
        self._update_buttons()

    def _chosen(self) -> Any:
        i = self.stored_picker.currentIndex()
        return self.stored[i] if 0 <= i < len(self.stored) else None

    @abstractmethod
    def _report_target(self) -> tuple[Any, str] | None:
        """the state the report is of, and its id
        (for the file name)."""

    @abstractmethod
    def _render_report(self, state: Any) -> str:
        """The HTML report of one state."""

    @abstractmethod
    def _why_lines(self, store: Any, state: Any) -> list[str]:
        """In a worker: the state explained with its stored runs' findings
        (``app.campaign_findings``)."""

    def _reveal_why(self) -> None:
        """Bring the filled explanation into view."""
        self.why_view.setVisible(True)

    def explain_shown(self) -> None:
        """The shown campaign (the one a report would be of) explained, read from the store in a
        worker: computed from its stored runs, so an old campaign explains itself too."""
        target = self._report_target()
        if target is None:
            return
        state, _ident = target

        def shown(lines: list[str]) -> None:
            self.why_view.setPlainText("\n".join(lines))
            self._reveal_why()

        run_in_worker(lambda: self.main.with_store(lambda store: self._why_lines(store, state)), shown,
                      self.main.show_error, name=self.noun + "-why", parent=self)

    def save_report(self, path: str | None = None) -> None:
        target = self._report_target()
        if target is None:
            return
        state, ident = target
        path = path or self._save_path(f"Save the {self.noun} report", f"{self.noun}-{ident}.html", "HTML (*.html)")
        if not path:
            return

        def write() -> Path:
            from app.export import save

            return save(self._render_report(state), "html", path)

        self._write_in_worker(write, lambda p: f"Report written to {p}", f"{self.noun}-report")

    def _save_path(self, caption: str, default: str, filters: str = "") -> str:
        path, _ = QFileDialog.getSaveFileName(self, caption, default, filters)
        return str(path)

    def _write_in_worker(self, write: Callable[[], Path], said: Callable[[Path], str], name: str) -> None:
        """A file written off the GUI thread; the message says where, an error says why not."""
        run_in_worker(write, lambda p: self.message.setText(said(p)), self.main.show_error, name=name, parent=self)
