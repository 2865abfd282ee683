"""The Cluster box under the configuration: where Start's runs (the Repeats) and the Ladder's
steps run. Empty, they run on this machine, one after another; with a Ray address they are trials
on that cluster, side by side (what ``--cluster ADDRESS --parallel N`` does, docs/fleet.md).

Check connects and lists the nodes in a worker (``app.fleet.status``); a run connects again in
its own worker through ``app.fleet.choice.open_fleet``, the CLI's entry point. Nothing here
imports Ray: only ``app.fleet`` does, and only once an address is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QGroupBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from app.bus import Bus
from app.config import RunConfig
from app.events import LogLine
from app.fleet.status import ClusterStatus, NodeRow
from app.gui.theme import LIGHT
from app.gui.workers import Worker, run_in_worker

ADDRESS_HINT = "auto, HOST:6379 or ray://HOST:10001"
MAX_TRIALS_AT_ONCE = 64
NODE_COLUMNS = ("node", "alive", "CPUs", "GPUs", "tunebench", "mismatch")
COLUMN_TIPS = ("Host name / the start of Ray's node id", "Whether Ray sees the node", "Free / total cores",
               "Free / total GPUs, and their model", "The node's tunebench: version + a digest of its code",
               "Whether the node's tunebench, Python or Ray differ from this workbench's")
TABLE_ROWS_SHOWN = 3
"""Rows the node table shows before it scrolls: the configuration above keeps its room."""
HERE_TEXT = "Empty: runs on this machine, one after another."


@dataclass(frozen=True)
class ClusterChoice:
    """Where a run goes: the cluster's address and how many trials at once (None: as many as
    the cluster's free resources hold)."""

    address: str
    trials_at_once: int | None = None


def open_cluster(choice: ClusterChoice, config: RunConfig, bus: Bus, follow: Callable[[Bus], None]) -> dict[str, Any]:
    """In a run's worker: connect, check the nodes and run the preflight as the CLI does, each
    problem a note on the bus; returns the campaign's ``fleet``, ``max_parallel`` and
    ``on_slot_bus`` (``follow`` makes the window's live view follow each slot's bus). A refusal
    is a one-line ``UserError``."""
    from app.fleet.choice import open_fleet

    def report(line: str) -> None:
        bus.emit(LogLine.note(f"cluster: {line}"))

    where = open_fleet(choice.address, config, parallel=choice.trials_at_once, report=report)
    return {"fleet": where.fleet, "max_parallel": where.parallel, "on_slot_bus": follow}


def _check(address: str, config: RunConfig) -> ClusterStatus:
    from app.fleet.status import check_cluster

    return check_cluster(address, config)


def node_cells(node: NodeRow) -> list[str]:
    """A node as the table shows it."""
    return [node.label, "yes" if node.alive else "dead", node.cpus_text if node.alive else "",
            node.gpus_text if node.alive else "", node.tunebench or ("did not report" if node.alive else ""),
            "; ".join(m.split(": ", 1)[-1] for m in node.mismatches) or ("no" if node.alive else "")]


class ClusterBox(QGroupBox):
    """Address, Check, trials at once, a one-line status and the nodes' table. ``config()`` is
    the configuration being edited (what a trial asks the nodes for)."""

    changed = Signal()
    """The address or the trials at once were edited (the window keeps them in its settings)."""

    def __init__(self, config: Callable[[], RunConfig], parent: QWidget | None = None) -> None:
        super().__init__("Cluster", parent)
        self.setObjectName("clusterBox")
        self._config = config
        self.status: ClusterStatus | None = None
        self._checked_address = ""
        """The address as typed when ``status`` was read."""
        self.checking: Worker | None = None
        self._running = False
        grid = QGridLayout(self)
        grid.setContentsMargins(6, 6, 6, 6)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(4)
        self.address_edit = QLineEdit()
        self.address_edit.setObjectName("clusterAddress")
        self.address_edit.setPlaceholderText(ADDRESS_HINT)
        self.address_edit.setClearButtonEnabled(True)
        self.address_edit.setToolTip("A Ray cluster: Start's runs (each repeat) and the Ladder's steps run there as "
                                     "trials, side by side. " + HERE_TEXT)
        self.check_button = QPushButton("Check")
        self.check_button.setObjectName("clusterCheck")
        self.check_button.setToolTip("Connect and list the nodes: their free CPUs and GPUs, tunebench version and "
                                     "whether they run this workbench's code")
        self.parallel = QSpinBox()
        self.parallel.setObjectName("clusterParallel")
        self.parallel.setRange(0, MAX_TRIALS_AT_ONCE)
        self.parallel.setSpecialValueText("auto")
        self.parallel.setToolTip("At most this many trials at once; auto: as many as the cluster's free "
                                 "resources hold")
        self.parallel.setFixedWidth(self.parallel.fontMetrics().horizontalAdvance("auto") * 3)
        self.status_label = QLabel(HERE_TEXT)
        self.status_label.setObjectName("clusterStatus")
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.table = QTableWidget(0, len(NODE_COLUMNS))
        self.table.setObjectName("clusterNodes")
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setWordWrap(False)
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        for col, (name, tip) in enumerate(zip(NODE_COLUMNS, COLUMN_TIPS, strict=True)):
            heading = QTableWidgetItem(name)
            heading.setToolTip(tip)
            self.table.setHorizontalHeaderItem(col, heading)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(NODE_COLUMNS.index("tunebench"), QHeaderView.ResizeMode.Stretch)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the version elides instead
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.setVisible(False)
        grid.addWidget(QLabel("Address"), 0, 0)
        grid.addWidget(self.address_edit, 0, 1)
        grid.addWidget(self.check_button, 0, 2)
        grid.addWidget(QLabel("Trials at once"), 1, 0)
        grid.addWidget(self.parallel, 1, 1, 1, 2, Qt.AlignmentFlag.AlignLeft)
        grid.addWidget(self.status_label, 2, 0, 1, 3)
        grid.addWidget(self.table, 3, 0, 1, 3)
        grid.setColumnStretch(1, 1)
        self.check_button.clicked.connect(self.check)
        self.address_edit.returnPressed.connect(self.check)
        self.address_edit.textEdited.connect(self._address_edited)
        self.address_edit.editingFinished.connect(self.changed)
        self.parallel.valueChanged.connect(self._parallel_changed)
        self._update()

    # -- what the window reads -----------------------------------------------------------------

    def address(self) -> str:
        return self.address_edit.text().strip()

    def choice(self) -> ClusterChoice | None:
        """Where a run goes now; None: this machine."""
        address = self.address()
        if not address:
            return None
        return ClusterChoice(address, self.parallel.value() or None)

    def restore(self, address: str, trials_at_once: int) -> None:
        """The settings' values, shown without counting as an edit."""
        self.blockSignals(True)
        try:
            self.address_edit.setText(address)
            self.parallel.setValue(max(0, min(trials_at_once, MAX_TRIALS_AT_ONCE)))
        finally:
            self.blockSignals(False)
        self._address_edited(address)

    def set_running(self, running: bool) -> None:
        """While a run goes, the address stays as it was (a check of another cluster would drop
        the connection the run uses)."""
        self._running = running
        self._update()

    # -- checking --------------------------------------------------------------------------------

    def check(self) -> None:
        address = self.address()
        if not address or self.checking is not None or self._running:
            return
        self._say(f"Checking {address}\u2026", LIGHT.muted)
        config = self._config()
        self._checked_address = address
        self.checking = run_in_worker(lambda: _check(address, config), self._checked, self._check_failed,
                                      name="cluster-check", parent=self)
        self._update()

    def _checked(self, status: ClusterStatus) -> None:
        self.checking = None
        if self.address() != self._checked_address:  # edited while it was checked: not this address's nodes
            self._address_edited(self.address())
            return
        self.status = status
        self._fill(status)
        self._show_status()
        self._update()

    def _check_failed(self, message: str) -> None:
        self.checking = None
        self.status = None
        self.table.setVisible(False)
        first = message.strip().splitlines()[0] if message.strip() else "the check failed"
        self._say(first, LIGHT.bad)
        self._update()

    def _fill(self, status: ClusterStatus) -> None:
        self.table.setRowCount(len(status.nodes))
        for row, node in enumerate(status.nodes):
            for col, text in enumerate(node_cells(node)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if col == 5 and node.mismatches or col == 1 and not node.alive:
                    item.setForeground(QBrush(QColor(LIGHT.bad)))
                    item.setToolTip("\n".join(node.mismatches) or "Ray lost this node")
                elif node.alive and not node.can_host:
                    item.setForeground(QBrush(QColor(LIGHT.muted)))
                    item.setToolTip("Too small for a trial of this configuration")
                self.table.setItem(row, col, item)
        shown = min(len(status.nodes), TABLE_ROWS_SHOWN)
        height = self.table.horizontalHeader().sizeHint().height() + 2 * self.table.frameWidth()
        height += sum(self.table.rowHeight(r) for r in range(shown))
        self.table.setFixedHeight(height)
        self.table.setVisible(True)

    def _show_status(self) -> None:
        status = self.status
        if status is None:
            return
        line = status.line(self.parallel.value() or None)
        self._say(line, LIGHT.bad if status.mismatches or not status.hosts else LIGHT.good)
        self.status_label.setToolTip(f"{status.address}: {line}; this workbench runs tunebench {status.driver}")

    def _say(self, text: str, colour: str) -> None:
        self.status_label.setText(text)
        self.status_label.setToolTip(text)
        self.status_label.setStyleSheet(f"color: {colour};")

    # -- edits -----------------------------------------------------------------------------------

    def _address_edited(self, text: str) -> None:
        """Another address: the last check's nodes are no longer this one's."""
        if self.status is not None and text.strip() != self._checked_address:
            self.status = None
            self.table.setVisible(False)
        if self.status is None and self.checking is None:
            self._say(HERE_TEXT if not text.strip() else "Press Check to list the nodes (a run checks them too).",
                      LIGHT.muted)
        self._update()

    def _parallel_changed(self, _value: int) -> None:
        self._show_status()
        self.changed.emit()

    def _update(self) -> None:
        idle = not self._running
        self.address_edit.setEnabled(idle)
        self.parallel.setEnabled(idle)
        self.check_button.setEnabled(idle and self.checking is None and bool(self.address()))
