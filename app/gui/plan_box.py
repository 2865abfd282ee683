"""The plan beside the toggles: what the configuration being edited needs in memory and the fastest
the hardware can decode it, recomputed as the toggles change, before anything is launched.

The plan is ``app.planner.make_plan`` (as ``tunebench plan``); it may read the model's
``config.json`` and, on a CPU machine, measure the host's bandwidth once, so it runs in a worker.
Edits in quick succession make one plan (a short debounce), and a plan that arrives after a newer
edit is dropped. A configuration the planner cannot plan (an unknown model) gives a short grey
line, never a dialog."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QComboBox, QGridLayout, QGroupBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.config import RunConfig
from app.gui.theme import LIGHT
from app.gui.workers import run_in_worker
from app.planner.plan import Plan, decode_ceiling, make_plan
from engine_adapters.gpu_specs import GIB, GPU_SPECS

if TYPE_CHECKING:  # only its type: the panel that builds this box hands the state in
    from app.gui.config_state import ConfigState

THIS_MACHINE = "this machine"
SHORT_ERROR_CHARS = 90
DEBOUNCE_MS = 200

Planner = Callable[[RunConfig, str | None], Plan]
"""(configuration, GPU table name or None for this machine) -> the plan."""


def default_planner(config: RunConfig, gpu: str | None) -> Plan:
    return make_plan(config, gpu=gpu)


def concurrency_of(config: RunConfig) -> int:
    """The load's concurrency (a concurrency sweep: its highest level): the batch to plan for."""
    load = config.load
    return max(1, load.peak_concurrency)


def short_error(message: str) -> str:
    """The first clause of a planner error, for one grey line (the whole text is its tooltip)."""
    if ": pass --gpu" in message:  # the CLI's advice; here the card is chosen in the box
        return message.split(": pass --gpu", 1)[0] + ": choose a card under \"for\""
    first = message.split(": not ", 1)[0].split("; ", 1)[0]
    return first if len(first) <= SHORT_ERROR_CHARS else first[:SHORT_ERROR_CHARS - 1] + "\u2026"


def _bytes(value: float) -> str:
    return f"{value / 1e9:,.2f} GB" if value >= 1e8 else f"{value / 1e6:,.1f} MB"


class PlanBox(QGroupBox):
    """Weights, KV bytes per token, KV pool tokens, the sequences that fit and the decode
    ceilings at batch 1 and at the load's concurrency."""

    planned = Signal(object)
    """The new plan (``Plan``), or None when the configuration cannot be planned."""

    def __init__(self, state: ConfigState, planner: Planner = default_planner, parent: QWidget | None = None) -> None:
        super().__init__("Plan: the physics before launch", parent)
        self.setObjectName("planBox")
        self.state, self.planner = state, planner
        self.plan: Plan | None = None
        self.error: str | None = None
        self.pending = 0  # plans asked for and not yet back
        self._generation = 0
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 4, 6, 4)
        outer.setSpacing(2)
        head = QHBoxLayout()
        head.addWidget(QLabel("for"))
        self.gpu = QComboBox()
        self.gpu.addItems([THIS_MACHINE, *(s.name for s in GPU_SPECS)])
        self.gpu.setToolTip("The hardware to plan for: this machine (its GPU, or for a CPU engine its measured "
                            "memory bandwidth), or a card from the spec table")
        head.addWidget(self.gpu, 1)
        outer.addLayout(head)
        grid = QGridLayout()
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(1)
        self.values: dict[str, QLabel] = {}
        rows = (("weights", "Weights"), ("kv", "KV per token"), ("pool", "KV pool"), ("seqs", "Sequences that fit"),
                ("ceiling", "Decode ceiling"))
        for i, (key, caption) in enumerate(rows):
            name = QLabel(caption)
            name.setStyleSheet(f"color: {LIGHT.muted};")
            value = QLabel("–")
            value.setObjectName(f"plan_{key}")
            value.setWordWrap(True)
            grid.addWidget(name, i, 0)
            grid.addWidget(value, i, 1)
            self.values[key] = value
        grid.setColumnStretch(1, 1)
        outer.addLayout(grid)
        self.status = QLabel("")
        self.status.setObjectName("planStatus")
        self.status.setWordWrap(True)
        self.status.setStyleSheet(f"color: {LIGHT.muted};")
        outer.addWidget(self.status)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.replan)
        state.changed.connect(lambda _path: self._timer.start())
        self.gpu.currentIndexChanged.connect(lambda _i: self._timer.start())
        self._timer.start()

    def selected_gpu(self) -> str | None:
        text = self.gpu.currentText()
        return None if text == THIS_MACHINE else text

    def replan(self) -> None:
        """Plan the current configuration in a worker; only the newest request's answer is shown."""
        self._timer.stop()
        self._generation += 1
        generation, config, gpu, planner = self._generation, self.state.config, self.selected_gpu(), self.planner
        self.pending += 1
        if self.plan is None and self.error is None:
            self.status.setText("planning…")
        run_in_worker(lambda: planner(config, gpu), lambda plan: self._done(generation, plan, None),
                      lambda message: self._done(generation, None, message), name="plan", parent=self)

    def _done(self, generation: int, plan: Plan | None, error: str | None) -> None:
        self.pending -= 1
        if generation != self._generation:
            return  # a newer edit is being planned
        self.plan, self.error = plan, error
        if plan is None:
            for value in self.values.values():
                value.setText("–")
            self.status.setText(f"No plan: {short_error(error)}" if error else "")
            self.status.setToolTip(error or "")
            self.status.setStyleSheet(f"color: {LIGHT.muted};")
            self.setToolTip("")
        else:
            self._show(plan)
        self.planned.emit(plan)

    def _show(self, plan: Plan) -> None:
        m = plan.memory
        config = self.state.config
        per_device = f" ({_bytes(m.weights_bytes_per_device)} per device)" if plan.hardware.count > 1 else ""
        self.values["weights"].setText(f"{_bytes(m.weights_bytes)} {plan.weights_dtype.upper()}{per_device}")
        self.values["kv"].setText(f"{m.kv_bytes_per_token:,.0f} B {plan.kv_dtype.upper()}")
        self.values["pool"].setText(f"{m.kv_tokens:,} tokens ({m.kv_pool_bytes_per_device / GIB:,.1f} GiB)")
        concurrency = concurrency_of(config)
        self.values["seqs"].setText(f"{m.max_concurrent_seqs:,} at {m.context_tokens:,} tokens"
                                    + (f" (load wants {concurrency:,})" if concurrency > m.max_concurrent_seqs else ""))
        self.values["seqs"].setStyleSheet(f"color: {LIGHT.bad};" if concurrency > m.max_concurrent_seqs else "")
        one, many = decode_ceiling(plan, 1), decode_ceiling(plan, concurrency)
        self.values["ceiling"].setText(f"{one:,.0f} tok/s at batch 1" + (f" · {many:,.0f} at {concurrency:,}"
                                                                         if concurrency > 1 else ""))
        hw = plan.hardware
        where = f"{hw.name} x{hw.count} \u00b7 {hw.count * hw.bandwidth_bytes_per_s / 1e9:,.0f} GB/s memory bandwidth"
        self.status.setText(where + ("" if not plan.warnings else "\n\u26a0 " + "\n\u26a0 ".join(plan.warnings)))
        self.status.setStyleSheet(f"color: {LIGHT.bad if plan.warnings else LIGHT.muted};")
        self.status.setToolTip("")
        self.setToolTip("Assumptions:\n- " + "\n- ".join(plan.assumptions))
