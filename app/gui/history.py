"""Run history and comparison: a runs table (filter, sort, tag, rename, delete) and the compare
view (config differences, metric deltas against a baseline, overlaid series, bar charts).

Everything comes from ``db.store.RunStore`` and ``db.compare.compare_runs``; queries run in
workers and the views only display what they return.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.gui.theme import LIGHT
from db.compare import Comparison
from db.store import RunInfo

HEADLINES: tuple[tuple[str, str, str], ...] = (
    ("output_tok_per_s", "tok/s", "{:,.0f}"),
    ("ttft_ms_p50", "TTFT p50 ms", "{:,.0f}"),
    ("itl_ms_p50", "ITL p50 ms", "{:,.1f}"),
    ("requests_total", "requests", "{:,.0f}"),
    ("requests_failed", "errors", "{:,.0f}"),
)
COLUMNS = ("id", "name", "status", "started", "model", "tags", *(h[1] for h in HEADLINES))
STATUSES = ("any status", "completed", "failed", "cancelled", "interrupted", "running")


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


def _fmt(value: Any, fmt: str) -> str:
    if isinstance(value, int | float) and math.isfinite(value):
        return fmt.format(value)
    return ""


class HistoryView(QWidget):
    """The runs table. Actions call back into the window, which runs store calls in workers."""

    compare_requested = Signal(list)
    export_requested = Signal(list)
    refresh_requested = Signal()
    rename_requested = Signal(int, str)
    tag_requested = Signal(int, list, list)
    delete_requested = Signal(list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runs: list[RunInfo] = []
        layout = QVBoxLayout(self)
        bar = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name, model or tag")
        self.filter.setClearButtonEnabled(True)
        self.status = QComboBox()
        self.status.addItems(STATUSES)
        self.refresh_button = QPushButton("Refresh")
        bar.addWidget(self.filter, 1)
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
        layout.addWidget(self.table, 1)
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
        self.refresh_button.clicked.connect(self.refresh_requested.emit)
        self.compare_button.clicked.connect(self._compare)
        self.export_button.clicked.connect(self._export)
        self.rename_button.clicked.connect(self._rename)
        self.tag_button.clicked.connect(self._tag)
        self.delete_button.clicked.connect(self._delete)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

    def set_runs(self, runs: list[RunInfo]) -> None:
        selected = set(self.selected_ids())
        self.runs = runs
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(runs))
        for row, run in enumerate(runs):
            started = dt.datetime.fromtimestamp(run.started_at).strftime("%Y-%m-%d %H:%M:%S")
            cells = [_Item(str(run.id), run.id), _Item(run.name), _Item(run.status), _Item(started, run.started_at),
                     _Item(run.model), _Item(", ".join(run.tags))]
            for key, _label, fmt in HEADLINES:
                value = run.metrics.get(key)
                cells.append(_Item(_fmt(value, fmt), value if isinstance(value, int | float) else -1.0))
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
        self.message.setText(f"{len(runs)} run(s)")

    def _apply_filter(self) -> None:
        query = self.filter.text().strip().lower()
        status = self.status.currentText()
        for row in range(self.table.rowCount()):
            text = " ".join((self.table.item(row, c) or QTableWidgetItem("")).text().lower() for c in (1, 4, 5))
            row_status = (self.table.item(row, 2) or QTableWidgetItem("")).text()
            hidden = (bool(query) and query not in text) or (status != STATUSES[0] and row_status != status)
            self.table.setRowHidden(row, hidden)

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
        answer = QMessageBox.question(self, "Delete runs", f"Delete {len(ids)} run(s) and everything recorded "
                                      "with them? This cannot be undone.")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(ids)


def _short(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.4g}"
    text = str(value)
    return text if len(text) < 60 else text[:57] + "..."


class CompareView(QWidget):
    """Config differences, metric deltas vs the baseline, overlaid series and bar charts."""

    baseline_changed = Signal(int)
    export_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.comparison: Comparison | None = None
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.title = QLabel("Select two or more runs in History and press Compare.")
        self.baseline = QComboBox()
        self.baseline.setToolTip("Deltas are shown against this run")
        self.export_button = QPushButton("Export comparison…")
        self.export_button.setEnabled(False)
        top.addWidget(self.title, 1)
        top.addWidget(QLabel("Baseline:"))
        top.addWidget(self.baseline)
        top.addWidget(self.export_button)
        layout.addLayout(top)
        split = QSplitter(Qt.Orientation.Vertical)
        tables = QSplitter(Qt.Orientation.Horizontal)
        self.diff = QTableWidget(0, 1)
        self.diff.verticalHeader().setVisible(False)
        self.diff.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.metrics = QTableWidget(0, 1)
        self.metrics.verticalHeader().setVisible(False)
        self.metrics.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        tables.addWidget(self._titled("Configuration differences", self.diff))
        tables.addWidget(self._titled("Metrics (delta vs baseline; green = better, red = worse)", self.metrics))
        split.addWidget(tables)
        charts = QWidget()
        charts_layout = QHBoxLayout(charts)
        charts_layout.setContentsMargins(0, 0, 0, 0)
        series_box = QVBoxLayout()
        self.series_choice = QComboBox()
        self.series_plot = pg.PlotWidget(background=LIGHT.background)
        self.series_plot.getPlotItem().showGrid(x=True, y=True, alpha=0.15)
        self.series_plot.getPlotItem().setLabel("bottom", "seconds since run start")
        self.series_legend = self.series_plot.getPlotItem().addLegend(offset=(-4, 4))
        series_box.addWidget(self.series_choice)
        series_box.addWidget(self.series_plot, 1)
        charts_layout.addLayout(series_box, 3)
        self.bars = pg.GraphicsLayoutWidget()
        self.bars.setBackground(LIGHT.background)
        charts_layout.addWidget(self.bars, 2)
        split.addWidget(charts)
        split.setSizes([300, 300])
        layout.addWidget(split, 1)
        self.series_choice.currentIndexChanged.connect(lambda _i: self._draw_series())
        self.baseline.activated.connect(self._baseline_chosen)
        self.export_button.clicked.connect(self.export_requested.emit)

    @staticmethod
    def _titled(title: str, widget: QWidget) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel(f"<b>{title}</b>"))
        layout.addWidget(widget, 1)
        return box

    def _baseline_chosen(self, index: int) -> None:
        run_id = self.baseline.itemData(index)
        if run_id is not None:
            self.baseline_changed.emit(int(run_id))

    def run_labels(self) -> list[str]:
        assert self.comparison is not None
        return [f"#{r.id} {r.name}" for r in self.comparison.runs]

    def show_comparison(self, comparison: Comparison) -> None:
        self.comparison = comparison
        runs = comparison.runs
        labels = self.run_labels()
        self.title.setText(f"Comparing {len(runs)} runs")
        self.export_button.setEnabled(True)
        self.baseline.blockSignals(True)
        self.baseline.clear()
        for run in runs:
            self.baseline.addItem(f"#{run.id} {run.name}", run.id)
        self.baseline.setCurrentIndex(comparison.baseline)
        self.baseline.blockSignals(False)

        self.diff.clear()
        self.diff.setColumnCount(1 + len(runs))
        self.diff.setHorizontalHeaderLabels(["setting", *labels])
        self.diff.setRowCount(len(comparison.config_diff))
        for row, (key, values) in enumerate(comparison.config_diff):
            self.diff.setItem(row, 0, QTableWidgetItem(key))
            for col, value in enumerate(values):
                self.diff.setItem(row, col + 1, QTableWidgetItem(_short(value)))
        self.diff.resizeColumnsToContents()

        self.metrics.clear()
        self.metrics.setColumnCount(1 + len(runs))
        self.metrics.setHorizontalHeaderLabels(["metric", *labels])
        rows = [m for m in comparison.metrics if not (m.name.startswith("L") and "." in m.name)]
        self.metrics.setRowCount(len(rows))
        for row, metric in enumerate(rows):
            self.metrics.setItem(row, 0, QTableWidgetItem(metric.name))
            for col, value in enumerate(metric.values):
                text = _short(value)
                pct = metric.delta_pct[col]
                if col != comparison.baseline and pct is not None:
                    text += f"  ({pct:+.1f}%)"
                item = QTableWidgetItem(text)
                verdict = metric.verdict(col) if col != comparison.baseline else ""
                if verdict:
                    item.setForeground(QBrush(QColor(LIGHT.good if verdict == "better" else LIGHT.bad)))
                    item.setToolTip(verdict)
                item.setData(Qt.ItemDataRole.UserRole, verdict)
                self.metrics.setItem(row, col + 1, item)
        self.metrics.resizeColumnsToContents()

        self.series_choice.blockSignals(True)
        current = self.series_choice.currentText()
        self.series_choice.clear()
        for series in comparison.series:
            self.series_choice.addItem(series.key)
        preferred = [current, "client.output_tok_per_s", "engine.generation_tok_per_s"]
        for key in preferred:
            index = self.series_choice.findText(key)
            if index >= 0:
                self.series_choice.setCurrentIndex(index)
                break
        self.series_choice.blockSignals(False)
        self._draw_series()
        self._draw_bars()

    def _draw_series(self) -> None:
        item = self.series_plot.getPlotItem()
        item.clear()
        self.series_legend.clear()
        comparison = self.comparison
        if comparison is None:
            return
        key = self.series_choice.currentText()
        series = next((s for s in comparison.series if s.key == key), None)
        if series is None:
            return
        for i, (label, values) in enumerate(zip(self.run_labels(), series.values, strict=True)):
            color = LIGHT.curves[i % len(LIGHT.curves)]
            finite = np.isfinite(values)  # bins without a sample are skipped, not drawn as gaps
            item.plot(series.t_s[finite], values[finite], pen=pg.mkPen(color, width=2), name=label)
        item.setTitle(key)

    def _draw_bars(self) -> None:
        self.bars.clear()
        comparison = self.comparison
        if comparison is None:
            return
        by_name = {m.name: m for m in comparison.metrics}
        for col, (name, title) in enumerate((("output_tok_per_s", "Throughput (tok/s)"),
                                             ("ttft_ms_p50", "TTFT p50 (ms)"), ("itl_ms_p50", "ITL p50 (ms)"))):
            plot = self.bars.addPlot(row=col, col=0, title=title)
            metric = by_name.get(name)
            values = [v if v is not None else 0.0 for v in (metric.values if metric else [])]
            if not values:
                continue
            x = np.arange(len(values))
            brushes = [pg.mkBrush(LIGHT.curves[i % len(LIGHT.curves)]) for i in range(len(values))]
            plot.addItem(pg.BarGraphItem(x=x, height=values, width=0.6, brushes=brushes))
            plot.getAxis("bottom").setTicks([[(i, f"#{r.id}") for i, r in enumerate(comparison.runs)]])
            plot.setMouseEnabled(x=False, y=False)

    def clear(self) -> None:
        self.comparison = None
        self.diff.setRowCount(0)
        self.metrics.setRowCount(0)
        self.series_plot.getPlotItem().clear()
        self.bars.clear()
        self.export_button.setEnabled(False)


Callback = Callable[[Any], None]
