"""The Capacity box of Compare and Tune: how many GPUs (or cores), nodes and dollars a traffic
needs at an SLO, sized on one stored run's measured levels, the answer ``tunebench capacity``
prints (``app.cost``; the arithmetic and the words are that module's). It also holds the prices
the window uses: typed here as ``NAME=USD`` entries, they are kept in the workbench's settings.
The sizing reads the store, so it runs in a worker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.cost import DEFAULT_HEADROOM, PERCENTILES, capacity_text, plan_capacity, price_table
from app.gui.theme import LIGHT
from app.gui.workers import run_in_worker

DEFAULT_CAPACITY_SLO = "ttft_ms<=500"


def split_prices(text: str) -> list[str]:
    """``'H100=2.49, cpu=0.05'`` -> ``['H100=2.49', 'cpu=0.05']`` (commas or spaces between)."""
    return [part for part in text.replace(",", " ").split() if part]


@dataclass(frozen=True)
class CapacityRequest:
    """What the box asks: ``tunebench capacity``'s arguments."""

    run_id: int
    slo: str
    percentile: str
    users: int | None
    tokens_per_day: float | None
    headroom: float
    prices: tuple[str, ...]


def size_request(store: Any, request: CapacityRequest) -> str:
    """The capacity answer in ``tunebench capacity``'s words (run it in a worker: it reads the
    store); a bad price, SLO or run is a ``UserError`` with one line."""
    prices = price_table(request.prices)  # a bad price is refused before the store is read
    run = store.get_run(request.run_id)
    requests = store.requests(run.id) if run.n_requests else None  # the good output, re-counted at this SLO
    plan = plan_capacity(run, request.slo, prices, users=request.users, tokens_per_day=request.tokens_per_day,
                         headroom=request.headroom, percentile=request.percentile, requests=requests)
    return capacity_text(plan)


class CapacityBox(QGroupBox):
    """Run, SLO, traffic, headroom and prices in; the answer below. ``prices_changed`` carries
    the price entries of a sizing that succeeded, for the window to keep and reuse."""

    prices_changed = Signal(list)

    def __init__(self, with_store: Callable[[Callable[[Any], Any]], Any], *, side_by_side: bool = True,
                 parent: QWidget | None = None) -> None:
        """``side_by_side``: the inputs beside the answer (a wide, low place), else above it."""
        super().__init__("Capacity", parent)  # a group box is at least as wide as its title: keep it short
        self.setObjectName("capacityBox")
        self.setToolTip("GPUs (or cores), nodes and dollars for your traffic at an SLO, from a run's measured levels")
        self._with_store = with_store
        layout: QHBoxLayout | QVBoxLayout = QHBoxLayout(self) if side_by_side else QVBoxLayout(self)
        inputs = QVBoxLayout()
        form = QFormLayout()
        self.run_choice = QComboBox()
        self.run_choice.setToolTip("The run whose measured levels the answer is sized on")
        self.run_choice.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.run_choice.setMinimumContentsLength(12)  # long run labels never widen the window
        self.slo_edit = QLineEdit(DEFAULT_CAPACITY_SLO)
        self.slo_edit.setToolTip("Bounds on ttft_ms, tpot_ms, e2e_ms, queue_ms, e.g. ttft_ms<=500,tpot_ms<=50")
        self.percentile = QComboBox()
        self.percentile.addItems(list(PERCENTILES))
        self.percentile.setCurrentText("p99")
        slo_row = QHBoxLayout()
        slo_row.addWidget(self.slo_edit, 1)
        slo_row.addWidget(self.percentile)
        self.users = QSpinBox()
        self.users.setRange(0, 1_000_000_000)  # a QSpinBox holds 32 bits
        self.users.setValue(100)
        self.users.setSpecialValueText("-")
        self.users.setToolTip("Concurrent users to serve (- : size for tokens a day only)")
        self.tokens_per_day = QDoubleSpinBox()
        self.tokens_per_day.setRange(0.0, 1e15)
        self.tokens_per_day.setDecimals(0)
        self.tokens_per_day.setSpecialValueText("-")
        self.tokens_per_day.setToolTip("Output tokens to generate per day (- : size for users only)")
        self.headroom = QSpinBox()
        self.headroom.setRange(0, 1000)
        self.headroom.setSuffix(" %")
        self.headroom.setValue(round(DEFAULT_HEADROOM * 100))
        self.headroom.setToolTip("Spare capacity on top of what the traffic needs")
        self.prices_edit = QLineEdit("")
        self.prices_edit.setPlaceholderText("default list prices; yours: H100=2.49, cpu=0.05")
        self.prices_edit.setToolTip("Your price per GPU-hour (or per core-hour: cpu=...), over the shipped, dated "
                                    "list; kept for Compare's costs too")
        form.addRow("Sized on:", self.run_choice)
        form.addRow("SLO:", slo_row)
        form.addRow("Users:", self.users)
        form.addRow("Or tokens a day:", self.tokens_per_day)
        form.addRow("Headroom:", self.headroom)
        form.addRow("Prices:", self.prices_edit)
        inputs.addLayout(form)
        buttons = QHBoxLayout()
        self.size_button = QPushButton("Size it")
        self.size_button.setObjectName("capacitySize")
        self.size_button.setEnabled(False)
        buttons.addStretch(1)
        buttons.addWidget(self.size_button)
        inputs.addLayout(buttons)
        if side_by_side:
            inputs.addStretch(1)
        layout.addLayout(inputs, 2)
        self.answer = QPlainTextEdit()
        self.answer.setObjectName("capacityAnswer")
        self.answer.setReadOnly(True)
        self.answer.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.answer.setPlaceholderText("Choose a run, an SLO and the traffic, then press Size it.")
        self.answer.setMinimumSize(160, 60)
        layout.addWidget(self.answer, 3)
        self.size_button.clicked.connect(self.size_it)

    def set_runs(self, runs: Sequence[tuple[int, str]]) -> None:
        """The runs it can size on, ``(id, label)``, the first chosen; the answer is cleared when
        they change. The same runs again (their comparison or tune re-costed at the prices a sizing
        just kept) keep the choice and the answer sized at those prices."""
        listed = [(self.run_choice.itemData(i), self.run_choice.itemText(i)) for i in range(self.run_choice.count())]
        if runs and listed == [tuple(run) for run in runs]:
            return
        current = self.run_choice.currentData()
        self.run_choice.clear()
        for run_id, label in runs:
            self.run_choice.addItem(label, run_id)
        index = self.run_choice.findData(current)
        self.run_choice.setCurrentIndex(index if index >= 0 else 0)
        self.size_button.setEnabled(bool(runs))
        self.answer.clear()

    def set_slo(self, slo: str, percentile: str) -> None:
        if slo:
            self.slo_edit.setText(slo)
        if percentile in PERCENTILES:
            self.percentile.setCurrentText(percentile)

    def set_prices(self, prices: Sequence[str]) -> None:
        self.prices_edit.setText(", ".join(prices))

    def request(self) -> CapacityRequest | None:
        run_id = self.run_choice.currentData()
        if run_id is None:
            return None
        tokens = self.tokens_per_day.value()
        return CapacityRequest(int(run_id), self.slo_edit.text().strip(), self.percentile.currentText(),
                               self.users.value() or None, tokens or None, self.headroom.value() / 100,
                               tuple(split_prices(self.prices_edit.text())))

    def size_it(self) -> None:
        request = self.request()
        if request is None:
            return
        self.size_button.setEnabled(False)
        self.answer.setStyleSheet("")
        self.answer.setPlainText("Sizing\u2026")

        def done(text: str) -> None:
            self.size_button.setEnabled(True)
            self.answer.setPlainText(text)
            self.prices_changed.emit(list(request.prices))

        def failed(message: str) -> None:
            self.size_button.setEnabled(True)
            self.answer.setStyleSheet(f"color: {LIGHT.bad};")
            self.answer.setPlainText(message)

        run_in_worker(lambda: self._with_store(lambda store: size_request(store, request)), done, failed,
                      name="capacity", parent=self)
