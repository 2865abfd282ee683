"""Run history and comparison: a runs table (filter, sort, tag, rename, delete) and the compare
view (config differences, metric deltas against a baseline, overlaid series, bar charts).

Everything comes from ``db.store.RunStore`` and ``app.analysis.compare.compare_runs``; queries run in
workers and the views only display what they return.

Why one module: the runs table and the compare view share the selection, the
baseline and the worker calls that load them; what they show is computed headless
(``app.analysis.compare``, and ``app.compare_bundle``, which the HTML report shows too; its
``compare_with_extras`` is named here as well, for the window's store link).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.analysis import metric_catalog as catalog
from app.analysis.compare import Comparison
from app.analysis.findings import Finding
from app.compare_bundle import CompareExtras
from app.compare_bundle import compare_with_extras as compare_with_extras
from app.cost.text import COST_COLUMNS, cost_rows, sources_text
from app.distributions import aligned, load_start_offsets
from app.gui.capacity_box import CapacityBox
from app.gui.discard import discard
from app.gui.findings_panel import FindingsPanel
from app.gui.quality_view import OutputsView
from app.gui.series import series_label
from app.gui.theme import LIGHT
from app.headline import Headline
from app.labels import engine_defaults, label_for, value_text
from app.run_findings import why_lines
from app.store import RunInfo, RunStore
from db.writes import default_author

HEADLINES: tuple[tuple[str, str], ...] = (
    ("output_tok_per_s", "tok/s"),
    ("ttft_ms_p50", "TTFT p50 ms"),
    ("itl_ms_p50", "ITL p50 ms"),
    ("requests_total", "requests"),
    ("requests_failed", "errors"),
)
"""History columns: catalogue key and a short header (the catalogue's name is in the tooltip)."""
COLUMNS = ("id", "name", "status", "started", "model", "tags", *(h[1] for h in HEADLINES), "note")
STATUSES = ("any status", "completed", "failed", "cancelled", "interrupted", "running")
WHO_FILTERS: tuple[tuple[str, str, str, str], ...] = (
    ("author", "Author:", "All authors", "(not recorded)"),
    ("host", "Host:", "All hosts", "(not recorded)"),
    ("gpu_model", "GPU:", "All GPUs", "no GPU"),
)
"""The combos that narrow History to whose runs, where: RunInfo field, label, the first item, how
an empty value reads (a run from before authors were recorded, a machine without an NVIDIA GPU)."""


class _Item(QTableWidgetItem):
    """Sorts by the number when there is one (so 900 < 1,200)."""

    def __init__(self, text: str, sort_key: Any = None) -> None:
        super().__init__(text)
        self.sort_key = sort_key if sort_key is not None else text
        self.setFlags(self.flags() & ~Qt.ItemFlag.ItemIsEditable)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.sort_key, getattr(other, "sort_key", other.text())
        try:
            return bool(mine < theirs)
        except TypeError:
            return str(mine) < str(theirs)


def _fmt(value: Any, key: str) -> str:
    if isinstance(value, int | float) and math.isfinite(value):
        return catalog.metric(key).format(float(value))
    return ""


def whose(run: RunInfo) -> str:
    """``by AUTHOR on HOST``, as far as the run recorded them ("" for a run from before)."""
    return " ".join(part for part in (f"by {run.author}" if run.author else "",
                                      f"on {run.host}" if run.host else "") if part)


def others_text(runs: Sequence[RunInfo], author: str) -> str:
    """What the delete confirmation says about runs another author recorded ("" when none): a
    team shares one store, and deleting a colleague's run deletes it for everyone."""
    others = [r for r in runs if r.author not in ("", author)]
    if not others:
        return ""
    names = ", ".join(dict.fromkeys(f"{r.author} on {r.host}" if r.host else r.author for r in others))
    if len(runs) == 1:
        return f"This run was recorded by someone else ({names}). "
    return f"{len(others)} of these runs were recorded by someone else ({names}). "


def headline_cell(metrics: dict[str, Any], key: str) -> tuple[str, Any, str | None]:
    """What History shows for a run's headline figure: (text, sort key, reason it was replaced).
    A client figure the run flagged unreliable is replaced by the engine's own figure, labelled
    "(engine)", as everywhere else; without one it is shown with the reason."""
    flags = metrics.get("unreliable") if isinstance(metrics.get("unreliable"), dict) else {}
    value = metrics.get(key)
    reason = flags.get(key) if flags else None
    if reason is not None:
        alt = catalog.metric(key).engine_alternative
        alt_value = metrics.get(alt) if alt else None
        if alt and isinstance(alt_value, int | float):
            return f"{_fmt(alt_value, alt)} (engine)", alt_value, (
                f"{catalog.metric(alt).name} shown: the client's {catalog.metric(key).name} "
                f"({_fmt(value, key)}) is unreliable: {reason}")
        return _fmt(value, key), value if isinstance(value, int | float) else -1.0, f"unreliable: {reason}"
    return _fmt(value, key), value if isinstance(value, int | float) else -1.0, None


class HistoryView(QWidget):
    """The runs table and, below it, the picked run's findings. Actions call back into the window,
    which runs store calls in workers."""

    compare_requested = Signal(list)
    export_requested = Signal(list)
    refresh_requested = Signal()
    rename_requested = Signal(int, str)
    tag_requested = Signal(int, list, list)
    delete_requested = Signal(list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runs: list[RunInfo] = []
        self._by_id: dict[int, RunInfo] = {}
        self.author = default_author()
        """This workbench's author: deleting anyone else's run asks by name (the window updates it)."""
        layout = QVBoxLayout(self)
        self.where = QLabel("")
        self.where.setObjectName("runsWhere")
        self.where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.where.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        layout.addWidget(self.where)
        bar = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name, model or tag")
        self.filter.setClearButtonEnabled(True)
        bar.addWidget(self.filter, 1)
        self.who: dict[str, QComboBox] = {}
        for attr, label, everyone, _empty in WHO_FILTERS:
            combo = QComboBox()
            combo.addItem(everyone, None)
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(len(everyone) + 1)  # long GPU names: the popup shows them whole
            combo.setToolTip(everyone)
            self.who[attr] = combo
            name = QLabel(label)
            name.setBuddy(combo)
            bar.addWidget(name)
            bar.addWidget(combo)
        self.author_filter, self.host_filter, self.gpu_filter = (self.who[w[0]] for w in WHO_FILTERS)
        self.status = QComboBox()
        self.status.addItems(STATUSES)
        self.refresh_button = QPushButton("Refresh")
        bar.addWidget(self.status)
        bar.addWidget(self.refresh_button)
        layout.addLayout(bar)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setSortingEnabled(True)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.findings = FindingsPanel()  # the picked run's findings (the window gives it the store)
        self._picked: int | None = None
        table_split = QSplitter(Qt.Orientation.Vertical)
        table_split.addWidget(self.table)
        table_split.addWidget(self.findings)
        table_split.setStretchFactor(0, 3)
        table_split.setStretchFactor(1, 2)
        layout.addWidget(table_split, 1)
        actions = QHBoxLayout()
        self.rename_button = QPushButton("Rename…")
        self.tag_button = QPushButton("Tag…")
        self.delete_button = QPushButton("Delete")
        self.compare_button = QPushButton("Compare selected")
        self.export_button = QPushButton("Export…")
        for button in (self.rename_button, self.tag_button, self.delete_button):
            actions.addWidget(button)
        actions.addStretch(1)
        actions.addWidget(self.compare_button)
        actions.addWidget(self.export_button)
        layout.addLayout(actions)
        self.message = QLabel("")
        layout.addWidget(self.message)
        self.filter.textChanged.connect(self._apply_filter)
        self.status.currentIndexChanged.connect(lambda _i: self._apply_filter())
        for combo in self.who.values():
            combo.currentIndexChanged.connect(lambda _i, c=combo: self._who_chosen(c))
        self.refresh_button.clicked.connect(self.refresh_requested.emit)
        self.compare_button.clicked.connect(self._compare)
        self.export_button.clicked.connect(self._export)
        self.rename_button.clicked.connect(self._rename)
        self.tag_button.clicked.connect(self._tag)
        self.delete_button.clicked.connect(self._delete)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

    def set_where(self, where: str) -> None:
        """Which store the table shows (a URL without its password): a team may have several."""
        self.where.setText(f"Runs in: {where}" if where else "")
        self.where.setToolTip(where)

    def set_runs(self, runs: list[RunInfo]) -> None:
        selected = set(self.selected_ids())
        self.runs = runs
        self._by_id = {run.id: run for run in runs}
        self._fill_who(runs)
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(runs))
        for row, run in enumerate(runs):
            started = dt.datetime.fromtimestamp(run.started_at).strftime("%Y-%m-%d %H:%M:%S")
            cells = [_Item(str(run.id), run.id), _Item(run.name), _Item(run.status), _Item(started, run.started_at),
                     _Item(run.model), _Item(", ".join(run.tags))]
            for key, _label in HEADLINES:
                text, sort_key, why = headline_cell(run.metrics, key)
                figure = _Item(text, sort_key)
                figure.setToolTip(why or catalog.metric(key).label)
                if why is not None and not text.endswith("(engine)"):
                    figure.setForeground(QBrush(QColor(LIGHT.muted)))
                cells.append(figure)
            cells.append(_Item(run.notes))
            tip = "\n".join(part for part in (whose(run), run.notes) if part)
            if tip:
                cells[1].setToolTip(tip)
            cells[0].setData(Qt.ItemDataRole.UserRole, run.id)
            if run.reason:
                cells[2].setToolTip(run.reason)
            if run.status == "failed":
                cells[2].setForeground(QBrush(QColor(LIGHT.bad)))
            for col, cell in enumerate(cells):
                self.table.setItem(row, col, cell)
        self.table.setSortingEnabled(True)
        self.table.resizeColumnsToContents()
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 0)
            if item is not None and item.data(Qt.ItemDataRole.UserRole) in selected:
                self.table.selectRow(row)
        self._apply_filter()

    def _fill_who(self, runs: list[RunInfo]) -> None:
        """Each combo lists the values the listed runs have; a choice still among them is kept."""
        for attr, _label, everyone, empty in WHO_FILTERS:
            combo = self.who[attr]
            current = combo.currentData()
            values = sorted({str(getattr(run, attr)) for run in runs}, key=lambda v: (v == "", v.lower()))
            combo.blockSignals(True)
            combo.clear()
            combo.addItem(everyone, None)
            for value in values:
                combo.addItem(value or empty, value)
            index = combo.findData(current) if current is not None else 0
            combo.setCurrentIndex(max(index, 0))
            combo.setToolTip(combo.currentText())
            combo.blockSignals(False)

    def _who_chosen(self, combo: QComboBox) -> None:
        combo.setToolTip(combo.currentText())
        self._apply_filter()

    def _apply_filter(self) -> None:
        query = self.filter.text().strip().lower()
        status = self.status.currentText()
        chosen = {attr: combo.currentData() for attr, combo in self.who.items()}
        shown = 0
        for row in range(self.table.rowCount()):
            text = " ".join((self.table.item(row, c) or QTableWidgetItem("")).text().lower()
                            for c in (1, 4, 5, len(COLUMNS) - 1))
            row_status = (self.table.item(row, 2) or QTableWidgetItem("")).text()
            id_item = self.table.item(row, 0)
            run = self._by_id.get(id_item.data(Qt.ItemDataRole.UserRole)) if id_item is not None else None
            hidden = (bool(query) and query not in text) or (status != STATUSES[0] and row_status != status) or (
                run is not None and any(value is not None and getattr(run, attr) != value
                                        for attr, value in chosen.items()))
            self.table.setRowHidden(row, hidden)
            shown += not hidden
        total = self.table.rowCount()
        self.message.setText(f"{total} run(s)" if shown == total else f"{shown} of {total} run(s) shown")

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.table.selectedIndexes() if not self.table.isRowHidden(i.row())})
        ids = []
        for row in rows:
            item = self.table.item(row, 0)
            if item is not None:
                ids.append(int(item.data(Qt.ItemDataRole.UserRole)))
        return ids

    def select_ids(self, ids: Sequence[int]) -> None:
        self.table.clearSelection()
        mode = self.table.selectionMode()
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.MultiSelection)
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 0)
            if item is not None and item.data(Qt.ItemDataRole.UserRole) in ids:
                self.table.selectRow(row)
        self.table.setSelectionMode(mode)

    def _update_buttons(self) -> None:
        n = len(self.selected_ids())
        self.rename_button.setEnabled(n == 1)
        self.tag_button.setEnabled(n >= 1)
        self.delete_button.setEnabled(n >= 1)
        self.compare_button.setEnabled(n >= 2)
        self.export_button.setEnabled(n >= 1)
        self._show_picked()

    def _show_picked(self) -> None:
        """One run picked: its findings below the table (read again only when another is picked)."""
        ids = self.selected_ids()
        picked = ids[0] if len(ids) == 1 else None
        if picked == self._picked:
            return
        self._picked = picked
        run = self._run(picked) if picked is not None else None
        if run is None:
            self.findings.clear()
            return
        self.findings.show_run(run.id, f"#{run.id} {run.name}")

    def _run(self, run_id: int) -> RunInfo | None:
        return next((r for r in self.runs if r.id == run_id), None)

    def _compare(self) -> None:
        self.compare_requested.emit(sorted(self.selected_ids()))  # the oldest run is the first baseline

    def _export(self) -> None:
        self.export_requested.emit(self.selected_ids())

    def _rename(self) -> None:
        ids = self.selected_ids()
        run = self._run(ids[0]) if ids else None
        if run is None:
            return
        name, ok = QInputDialog.getText(self, "Rename run", "Name:", text=run.name)
        if ok and name.strip():
            self.rename_requested.emit(run.id, name.strip())

    def _tag(self) -> None:
        ids = self.selected_ids()
        if not ids:
            return
        text, ok = QInputDialog.getText(self, "Tag runs", "Tags to add (space-separated; prefix - to remove):")
        if not ok:
            return
        words = text.split()
        add = [w for w in words if not w.startswith("-")]
        remove = [w[1:] for w in words if w.startswith("-") and len(w) > 1]
        for run_id in ids:
            self.tag_requested.emit(run_id, add, remove)

    def _delete(self) -> None:
        ids = self.selected_ids()
        if not ids:
            return
        runs = [run for run_id in ids if (run := self._run(run_id)) is not None]
        answer = QMessageBox.question(self, "Delete runs", f"{others_text(runs, self.author)}Delete {len(ids)} "
                                      "run(s) and everything recorded with them? This cannot be undone.")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(ids)


GROUP_TITLES = {"throughput": "Throughput", "latency": "Latency (as the client saw it)",
                "engine": "The engine's own figures", "errors": "Errors", "run": "The run", "client": "The load client"}
DETAIL_SUFFIXES = ("_p90", "_p95")
"""Figures the compact table leaves out (the full one has them): the tails p50/p99 bracket."""


def is_detail(key: str, values: Sequence[float | None]) -> bool:
    """A row the compact metric table hides: unknown everywhere, not a catalogue figure, a middle
    percentile, the client's own queueing, or a count that is zero in every run."""
    level, base = catalog.split_key(key)
    if level is not None or all(v is None for v in values) or base not in catalog.BY_KEY:
        return True  # per level, unknown, or a number the catalogue does not define (an import's own)
    if base.endswith(DETAIL_SUFFIXES) or base.startswith("queue_ms_"):
        return True
    m = catalog.metric(base)
    return m.group in ("errors", "client") and all(not v for v in values)


def _setting_text(key: str, value: Any) -> str:
    text = value_text(key, value, engine_defaults().get(key.removeprefix("features.")))
    return text if len(text) < 60 else text[:57] + "..."


class HeadlineCard(QFrame):
    """The A/B headline above the tables: one sentence per compared run, and each headline
    figure before -> after, coloured only when it can be trusted (greyed with the reason else)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("headlineCard")
        self.setStyleSheet(f"QFrame#headlineCard {{ background: {LIGHT.panel}; border-radius: 8px; }}")
        self.layout_ = QVBoxLayout(self)
        self.layout_.setContentsMargins(12, 8, 12, 8)
        self.layout_.setSpacing(2)
        self.lines: list[QLabel] = []

    def show_headlines(self, items: Sequence[Headline], money: Sequence[str] = (),
                       why: Sequence[Sequence[Finding]] = ()) -> None:
        """``why``: per headline, why its run differs from the baseline (``app.run_findings``),
        one line each under it."""
        for label in self.lines:
            discard(label)
        self.lines = []
        for i, headline in enumerate(items):
            sentence = _plain_label(headline.sentence())
            sentence.setObjectName("headlineSentence")
            sentence.setWordWrap(True)
            sentence.setStyleSheet("font-size: 13pt; font-weight: 600;")
            parts = []
            for fig in headline.figures:
                colour = {"better": LIGHT.good, "worse": LIGHT.bad}.get(fig.verdict, LIGHT.muted)
                style = f"color:{colour};" + ("font-style:italic;" if fig.verdict == "unreliable" else "")
                change = fig.factor if fig.verdict != "same" else "no significant difference"
                title = html.escape(fig.note) if fig.note else ""
                parts.append(f'<span style="{style}" title="{title}">{html.escape(fig.values_text())}'
                             f"{', ' + html.escape(change) if change else ''}</span>")
            figures = QLabel(" &nbsp;·&nbsp; ".join(parts))
            figures.setWordWrap(True)
            figures.setToolTip("\n".join(f"{f.name}: {f.note}" for f in headline.figures if f.note))
            labels = [sentence, figures]
            if i < len(money):
                cost = _plain_label(money[i])
                cost.setObjectName("headlineMoney")
                cost.setWordWrap(True)
                cost.setStyleSheet(f"color: {LIGHT.accent}; font-weight: 600;")
                labels.append(cost)
            if headline.quality is not None:  # greyed when within the reference's noise floor
                kept = _plain_label(headline.quality.text)
                kept.setObjectName("headlineQuality")
                kept.setWordWrap(True)
                kept.setStyleSheet(f"color: {LIGHT.muted if headline.quality.greyed else LIGHT.foreground};")
                labels.append(kept)
            for text, finding in why_lines(why[i]) if i < len(why) else ():
                line = _plain_label(text if finding is None else "\u2192 " + text)
                line.setObjectName("headlineWhy")
                line.setWordWrap(True)
                line.setToolTip("\n".join(e.text() for e in finding.evidence) if finding is not None else "")
                line.setStyleSheet(f"color: {LIGHT.foreground};")
                labels.append(line)
            for label in labels:
                self.layout_.addWidget(label)
                self.lines.append(label)
        self.setVisible(bool(items))

    def text(self) -> str:
        return "\n".join(label.text() for label in self.lines)


def _plain_label(text: str) -> QLabel:
    """A label that shows ``text`` as it is: an ``->`` or ``&`` in a finding or a run's name is
    no markup (Qt guesses rich text only from tags, so an escaped text showed its ``&gt;``)."""
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


def _plots() -> pg.GraphicsLayoutWidget:
    plots = pg.GraphicsLayoutWidget()
    plots.setBackground(LIGHT.background)
    return plots


def _note() -> QLabel:
    """The muted lines under a chart or table that say how to read it."""
    note = QLabel("")
    note.setWordWrap(True)
    note.setStyleSheet(f"color: {LIGHT.muted};")
    return note


def _noted_page(plots: QWidget, note: QLabel) -> QWidget:
    """A chart tab: the plots, and the note under them."""
    page = QWidget()
    box = QVBoxLayout(page)
    box.setContentsMargins(0, 0, 0, 0)
    box.addWidget(plots, 1)
    box.addWidget(note)
    return page


class CompareView(QWidget):
    """The A/B headline, config differences in words, metric deltas grouped with human names,
    and charts: series over time from the start of the load, headline bars, TTFT/ITL
    distributions and, for sweeps, throughput against latency."""

    baseline_changed = Signal(int)
    export_requested = Signal()
    present_requested = Signal()
    race_requested = Signal()

    def __init__(self, with_store: Callable[[Callable[[RunStore], Any]], Any] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.comparison: Comparison | None = None
        self.extras = CompareExtras()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        top = QHBoxLayout()
        self.title = QLabel("Select two or more runs in History and press Compare.")
        self.title.setWordWrap(True)
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.baseline = QComboBox()
        self.baseline.setToolTip("Deltas are shown against this run")
        self.baseline.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.baseline.setMinimumContentsLength(14)
        self.present_button = QPushButton("Present before/after")
        self.present_button.setToolTip("The baseline and the first other run, side by side in presentation mode")
        self.present_button.setEnabled(False)
        self.race_button = QPushButton("Race")
        self.race_button.setToolTip("The baseline and the first other run replay one request each, side by side, "
                                    "at the pace they measured (presentation mode)")
        self.race_button.setEnabled(False)
        self.export_button = QPushButton("Export report…")
        self.export_button.setEnabled(False)
        self.all_figures = QCheckBox("All figures")
        self.all_figures.setToolTip("Also the middle percentiles, the client's queueing and zero counts")
        top.addWidget(self.title, 1)
        top.addWidget(QLabel("Baseline:"))
        top.addWidget(self.baseline)
        top.addWidget(self.present_button)
        top.addWidget(self.race_button)
        top.addWidget(self.export_button)
        layout.addLayout(top)
        self.card = HeadlineCard()
        self.card.setVisible(False)
        layout.addWidget(self.card)
        split = QSplitter(Qt.Orientation.Vertical)
        tables = QSplitter(Qt.Orientation.Horizontal)
        self.diff = QTableWidget(0, 1)
        self.diff.verticalHeader().setVisible(False)
        self.diff.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.diff.setWordWrap(True)
        self.metrics = QTableWidget(0, 1)
        self.metrics.verticalHeader().setVisible(False)
        self.metrics.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.metrics.verticalHeader().setDefaultSectionSize(22)
        tables.addWidget(self._titled("What differs", self.diff))
        metrics_box = self._titled("Figures: green better, red worse, grey untrusted (hover for why)",
                                   self.metrics, self.all_figures)
        tables.addWidget(metrics_box)
        tables.setStretchFactor(0, 2)
        tables.setStretchFactor(1, 3)
        split.addWidget(tables)
        self.charts = QTabWidget()
        self.charts.setDocumentMode(True)
        over_time = QWidget()
        series_box = QVBoxLayout(over_time)
        series_box.setContentsMargins(0, 0, 0, 0)
        self.series_choice = QComboBox()
        self.series_plot = pg.PlotWidget(background=LIGHT.background)
        self.series_plot.getPlotItem().showGrid(x=True, y=True, alpha=0.15)
        self.series_plot.getPlotItem().setLabel("bottom", "seconds since the load started")
        series_box.addWidget(self.series_choice)
        series_box.addWidget(self.series_plot, 1)
        self.bars = _plots()
        self.dists, self.dist_note = _plots(), _note()
        self.sweep, self.sweep_note = _plots(), _note()
        self.charts.addTab(self.bars, "Headline figures")
        self.charts.addTab(over_time, "Over time")
        self.charts.addTab(_noted_page(self.dists, self.dist_note), "TTFT and ITL distributions")
        self.charts.addTab(_noted_page(self.sweep, self.sweep_note), "Throughput vs latency")
        cost_page = QWidget()
        cost_box = QVBoxLayout(cost_page)
        cost_box.setContentsMargins(0, 0, 0, 0)
        cost_left = QVBoxLayout()
        self.cost_table = QTableWidget(0, len(COST_COLUMNS))
        self.cost_table.setObjectName("costTable")
        self.cost_table.setHorizontalHeaderLabels(list(COST_COLUMNS))
        self.cost_table.verticalHeader().setVisible(False)
        self.cost_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.cost_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.cost_note = _note()
        cost_left.addWidget(QLabel("<b>Cost at each run's measured throughput</b> (lower is better)"))
        cost_left.addWidget(self.cost_table)
        cost_left.addWidget(self.cost_note)
        cost_box.addLayout(cost_left)
        self.capacity: CapacityBox | None = None
        if with_store is not None:
            self.capacity = CapacityBox(with_store)
            cost_box.addWidget(self.capacity, 1)
        self.charts.addTab(cost_page, "Cost and capacity")
        self.outputs = OutputsView()  # the A/B of outputs (app.gui.quality_view)
        self.charts.addTab(self.outputs, "Outputs side by side")
        split.addWidget(self.charts)
        split.setSizes([300, 300])
        layout.addWidget(split, 1)
        self.series_choice.currentIndexChanged.connect(lambda _i: self._draw_series())
        self.baseline.activated.connect(self._baseline_chosen)
        self.export_button.clicked.connect(self.export_requested.emit)
        self.present_button.clicked.connect(self.present_requested.emit)
        self.race_button.clicked.connect(self.race_requested.emit)
        self.all_figures.toggled.connect(lambda _on: self._fill_metrics())

    @staticmethod
    def _titled(title: str, widget: QWidget, extra: QWidget | None = None) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        label = QLabel(f"<b>{title}</b>")
        label.setWordWrap(True)
        label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        head.addWidget(label, 1)
        if extra is not None:
            head.addWidget(extra)
        layout.addLayout(head)
        layout.addWidget(widget, 1)
        return box

    def _baseline_chosen(self, index: int) -> None:
        run_id = self.baseline.itemData(index)
        if run_id is not None:
            self.baseline_changed.emit(int(run_id))

    def run_labels(self) -> list[str]:
        assert self.comparison is not None
        return self.comparison.labels()

    def headline_text(self) -> str:
        return "\n".join(h.sentence() for h in self.extras.headlines)

    def show_comparison(self, comparison: Comparison, extras: CompareExtras | None = None) -> None:
        self.comparison = comparison
        self.extras = extras or CompareExtras(load_start_s=load_start_offsets(comparison))
        runs = comparison.runs
        labels = self.run_labels()
        self.title.setText(f"Comparing {len(runs)} runs against #{runs[comparison.baseline].id}")
        self.export_button.setEnabled(True)
        self.present_button.setEnabled(bool(self.extras.headlines))
        self.race_button.setEnabled(len(runs) >= 2)
        self.baseline.blockSignals(True)
        self.baseline.clear()
        for run in runs:
            self.baseline.addItem(f"#{run.id} {run.name}", run.id)
        self.baseline.setCurrentIndex(comparison.baseline)
        self.baseline.blockSignals(False)
        self.card.show_headlines(self.extras.headlines, self.extras.money_lines, self.extras.why)
        self._fill_costs()
        others = [label for i, label in enumerate(labels) if i != comparison.baseline]
        self.outputs.show_pairs(self.extras.outputs, self.extras.outputs_note, labels[comparison.baseline],
                                others[0] if others else "")
        headers = [label.replace(" ", "\n", 1) for label in labels]  # "#12" over the name: narrow columns

        self.diff.clear()
        self.diff.setColumnCount(1 + len(runs))
        self.diff.setHorizontalHeaderLabels(["setting", *headers])
        self.diff.setRowCount(len(comparison.config_diff))
        for row, (key, values) in enumerate(comparison.config_diff):
            name = QTableWidgetItem(label_for(key))
            name.setData(Qt.ItemDataRole.UserRole, key)
            name.setToolTip(key)
            self.diff.setItem(row, 0, name)
            terms = comparison.engine_terms.get(key)
            engines = {str((r.config.get("engine") or {}).get("kind")) for r in runs}
            for col, value in enumerate(values):
                text = _setting_text(key, value)
                said = terms[col] if terms else None
                if said and len(engines) > 1:  # across engines, each in its own words
                    text += f"\n{said}"
                item = QTableWidgetItem(text)
                item.setToolTip(f"given to the engine as: {said}" if said else repr(value))
                self.diff.setItem(row, col + 1, item)
        self.diff.resizeColumnsToContents()
        self._fill_metrics()

        self.series_choice.blockSignals(True)
        current = self.series_choice.currentData()
        self.series_choice.clear()
        for series in comparison.series:
            finite = [v[np.isfinite(v)] for v in series.values]
            if not any(f.size and float(np.ptp(f)) > 0 for f in finite):
                continue  # nothing moved: noise for a chart
            self.series_choice.addItem(series_label(series.source, series.name), series.key)
        preferred = [current, "client.output_tok_per_s", "engine.generation_tok_per_s"]
        for key in preferred:
            index = self.series_choice.findData(key)
            if index >= 0:
                self.series_choice.setCurrentIndex(index)
                break
        self.series_choice.blockSignals(False)
        self._draw_series()
        self._draw_bars()
        self._draw_distributions()
        self._draw_sweep()

    def _fill_costs(self) -> None:
        comparison, costs = self.comparison, self.extras.costs
        rows = cost_rows(comparison, costs) if comparison is not None and costs else []
        self.cost_table.setRowCount(len(rows))
        for i, cells in enumerate(rows):
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col == 2 and ("cheaper" in text or "more expensive" in text):
                    item.setForeground(QBrush(QColor(LIGHT.good if "cheaper" in text else LIGHT.bad)))
                self.cost_table.setItem(i, col, item)
        self.cost_table.resizeRowsToContents()
        rows_px = sum(self.cost_table.rowHeight(i) for i in range(len(rows)))
        self.cost_table.setFixedHeight(self.cost_table.horizontalHeader().height() + rows_px + 6)  # no empty room
        notes = [f"#{c.run_id}: {c.note}" for c in costs if c.note]
        source = sources_text(costs)
        self.cost_note.setText(" ".join(
            ([f"Prices: {source} (a default price is a typical list price, not a quote; yours go in Prices).",
              "Per 1M tokens = GPUs (or cores) \u00d7 price per hour / tokens per hour."] if source else [])
            + ([self.extras.good_slo_text] if source and self.extras.good_slo_text else []) + notes))
        if self.capacity is not None and comparison is not None:
            order = [i for i in range(len(comparison.runs)) if i != comparison.baseline] + [comparison.baseline]
            labels = comparison.labels()
            self.capacity.set_runs([(comparison.runs[i].id, labels[i]) for i in order])

    def _fill_metrics(self) -> None:
        comparison = self.comparison
        if comparison is None:
            return
        labels = [label.replace(" ", "\n", 1) for label in self.run_labels()]
        everything = self.all_figures.isChecked()
        rows = [r for r in comparison.rows() if catalog.split_key(r["key"])[0] is None]  # per-level rows: CLI/report
        by_key = {m.name: m for m in comparison.metrics}
        shown = [r for r in rows if everything or r["headline"] or not is_detail(r["key"], by_key[r["key"]].values)]
        sections: list[tuple[str, list[dict[str, Any]]]] = [("Headline", [r for r in shown if r["headline"]])]
        for group, title in GROUP_TITLES.items():
            members = [r for r in shown if not r["headline"] and catalog.metric(r["key"]).group == group]
            if members:
                sections.append((title, members))
        table = self.metrics
        table.clear()
        table.setColumnCount(1 + len(labels))
        table.setHorizontalHeaderLabels(["figure", *labels])
        table.setRowCount(sum(1 + len(members) for _, members in sections if members))
        row = 0
        bold = QFont()
        bold.setBold(True)
        for title, members in sections:
            if not members:
                continue
            for col in range(1 + len(labels)):
                head = QTableWidgetItem(title if col == 0 else "")
                head.setFont(bold)
                head.setBackground(QBrush(QColor(LIGHT.panel)))
                head.setFlags(Qt.ItemFlag.ItemIsEnabled)
                table.setItem(row, col, head)
            row += 1
            for data in members:
                self._metric_row(row, data)
                row += 1
        table.resizeColumnsToContents()

    def _metric_row(self, row: int, data: dict[str, Any]) -> None:
        table = self.metrics
        name = QTableWidgetItem(data["name"])
        name.setData(Qt.ItemDataRole.UserRole, data["key"])
        m = catalog.metric(data["key"])
        name.setToolTip(f"{m.description + '; ' if m.description else ''}{data['direction']}")
        if data["headline"]:
            font = name.font()
            font.setBold(True)
            name.setFont(font)
        table.setItem(row, 0, name)
        for col, cell in enumerate(data["cells"]):
            item = QTableWidgetItem(f"{cell['value']}  {cell['note']}".rstrip() if cell["note"] and
                                    cell["cls"] != "unreliable" else cell["value"])
            cls = cell["cls"]
            if cls == "unreliable":  # greyed, never coloured better or worse; the reason on hover
                item.setForeground(QBrush(QColor(LIGHT.muted)))
                font = item.font()
                font.setItalic(True)
                item.setFont(font)
                item.setToolTip(cell["note"] or f"unreliable: {cell['reason']}")
            elif cls in ("better", "worse"):
                item.setForeground(QBrush(QColor(LIGHT.good if cls == "better" else LIGHT.bad)))
                item.setToolTip(cell["note"])
            elif cell["note"]:
                item.setToolTip(cell["note"])
            item.setData(Qt.ItemDataRole.UserRole, cell["verdict"])
            table.setItem(row, col + 1, item)

    def _draw_series(self) -> None:
        item = self.series_plot.getPlotItem()
        item.clear()
        comparison = self.comparison
        if comparison is None:
            return
        key = self.series_choice.currentData()
        series = next((s for s in comparison.series if s.key == key), None)
        if series is None:
            return
        legend = []
        offsets = self.extras.load_start_s or [0.0] * len(comparison.runs)
        for i, (label, values) in enumerate(zip(self.run_labels(), series.values, strict=True)):
            color = LIGHT.curves[i % len(LIGHT.curves)]
            shifted = aligned(values, offsets[i], comparison.bin_s)
            finite = np.isfinite(shifted)  # bins without a sample are skipped, not drawn as gaps
            item.plot(series.t_s[finite], shifted[finite], pen=pg.mkPen(color, width=2), name=label)
            legend.append(f'<span style="color:{color}">\u2501\u2501 {html.escape(label)}</span>')
        # The legend is in the title: it never covers a line.
        item.setTitle(f"<b>{html.escape(series_label(series.source, series.name))}</b>&nbsp;&nbsp;"
                      + "&nbsp;&nbsp;".join(legend), size="10pt")

    def _draw_bars(self) -> None:
        self.bars.clear()
        comparison = self.comparison
        if comparison is None:
            return
        # The reliable figures only: a client figure any run flagged gives way to the engine's own;
        # a chart whose bars would all be zero (or unknown) says nothing and is left out.
        charts = [m for m in comparison.chart_metrics() if any(v for v in m.values)]
        for col, metric in enumerate(charts):
            plot = self.bars.addPlot(row=0, col=col, title=metric.metric.label)
            values = [v if v is not None else 0.0 for v in metric.values]
            x = np.arange(len(values))
            brushes = [pg.mkBrush(LIGHT.curves[i % len(LIGHT.curves)]) for i in range(len(values))]
            plot.addItem(pg.BarGraphItem(x=x, height=values, width=0.6, brushes=brushes))
            for i, value in enumerate(metric.values):
                text = pg.TextItem(metric.metric.format(value), color=LIGHT.foreground, anchor=(0.5, 1.0))
                text.setPos(i, values[i])
                plot.addItem(text)
            plot.getAxis("bottom").setTicks([[(i, f"#{r.id}") for i, r in enumerate(comparison.runs)]])
            plot.setYRange(0, max(values) * 1.2 if max(values) > 0 else 1)
            plot.setMouseEnabled(x=False, y=False)

    def _draw_distributions(self) -> None:
        self.dists.clear()
        notes = []
        for col, (attr, title) in enumerate((("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms)"))):
            plot = self.dists.addPlot(row=0, col=col)
            plot.setLabel("bottom", title)
            plot.setLabel("left", "share of requests (%)" if attr == "ttft_ms" else "share of token gaps (%)")
            plot.showGrid(x=True, y=True, alpha=0.15)
            legend = []
            for i, dist in enumerate(self.extras.distributions):
                data = getattr(dist, attr)
                if data is None:
                    continue
                color = LIGHT.curves[i % len(LIGHT.curves)]
                flagged = dist.unreliable.get(attr)
                pen = pg.mkPen(color, width=2, style=Qt.PenStyle.DashLine if flagged else Qt.PenStyle.SolidLine)
                plot.plot(data.x, data.p * 100.0, pen=pen)
                legend.append(f'<span style="color:{color}">\u2501 #{dist.run_id}{" (unreliable)" if flagged else ""}'
                              "</span>")
                if flagged:
                    notes.append(f"#{dist.run_id} {title.split()[0]}: {flagged}")
            plot.setTitle(f"<b>{title.split()[0]} distribution</b>&nbsp;&nbsp;" + "&nbsp;&nbsp;".join(legend),
                          size="10pt")
        self.dist_note.setText(("Dashed: as the client measured it, which the run flagged — " + "; ".join(notes))
                               if notes else "Cumulative share of completed requests (TTFT) and of token gaps (ITL) "
                               "at or below each latency, as the client measured them.")

    def _draw_sweep(self) -> None:
        self.sweep.clear()
        sweeps_ = self.extras.sweeps
        if not sweeps_:
            self.sweep_note.setText("A sweep (Load pattern: sweep) plots throughput against latency for each of "
                                    "its levels here; none of these runs is one.")
            return
        self.sweep_note.setText("Each point is one load level; further right is more throughput, lower is "
                                "faster. Engine-side figures stand in where a level flagged the client's.")
        labels = self.run_labels()
        for col, sweep in enumerate(sweeps_):
            plot = self.sweep.addPlot(row=0, col=col)
            plot.setLabel("bottom", sweep.x_label)
            plot.setLabel("left", sweep.y_label)
            plot.showGrid(x=True, y=True, alpha=0.15)
            for curve in sweep.curves:
                i = next((k for k, r in enumerate(self.comparison.runs if self.comparison else []) if r.id == curve.run_id), 0)
                color = LIGHT.curves[i % len(LIGHT.curves)]
                xs = [p.x for p in curve.points]
                ys = [p.y for p in curve.points]
                plot.plot(xs, ys, pen=pg.mkPen(color, width=2), symbol="o", symbolBrush=color, symbolSize=7,
                          name=labels[i] if i < len(labels) else str(curve.run_id))
                for point in curve.points:
                    text = pg.TextItem(point.level, color=LIGHT.muted, anchor=(0, 1))
                    text.setPos(point.x, point.y)
                    plot.addItem(text)

    def clear(self) -> None:
        self.comparison = None
        self.extras = CompareExtras()
        self.diff.setRowCount(0)
        self.metrics.setRowCount(0)
        self.series_plot.getPlotItem().clear()
        self.bars.clear()
        self.dists.clear()
        self.sweep.clear()
        self.cost_table.setRowCount(0)
        self.cost_note.setText("")
        self.outputs.clear()
        if self.capacity is not None:
            self.capacity.set_runs([])
        self.card.setVisible(False)
        self.export_button.setEnabled(False)
        self.present_button.setEnabled(False)
        self.race_button.setEnabled(False)


Callback = Callable[[Any], None]
