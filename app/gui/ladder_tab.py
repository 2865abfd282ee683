"""The Ladder tab: the profile's acceleration ladder as an editable list of steps (add from the
seeds' order, remove, reorder), each step's plan (what it changes, whether the engine restarts,
whether it can run here), Start, and the staircase growing as steps finish, with the table of
figures and factors. Stored ladders open here too (Compare, the HTML report, the final step's
launch script). While a step runs its live graphs show in the Live tab as for any run; in
presentation mode a large staircase sits above the plots.

The work is :func:`app.ladder.run.run_ladder` in a worker (the window's run worker, so Stop and
closing the window treat it as the running run); edits go into the window's configuration, so a
saved profile keeps its ladder.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QSplitter,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.bus import Bus, Event
from app.cost import sources_text, step_costs, usd_text
from app.events import CampaignUpdated
from app.gui.campaign_panel import CampaignHost, CampaignTab
from app.gui.cluster_box import open_cluster
from app.gui.ladder_chart import StaircaseChart
from app.gui.theme import DARK, LIGHT
from app.gui.workers import run_in_worker
from app.ladder.spec import LadderError, LadderSpec, LadderStepSpec, default_ladder, ladder_of
from app.ladder.state import LadderState, StepRow, factor_text, limit_text
from app.race import ladder_pair

COLUMNS = ("step", "status", "change", "out tok/s", "x baseline", "x previous", "total tok/s", "TTFT ms", "ITL ms",
           "% of limit", "engine", "verified")
TICK_MS = 100


def _num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def row_cells(row: StepRow) -> list[str]:
    """A step as the table shows it."""
    status = row.status + (f": {row.reason}" if row.reason and row.status in ("skipped", "failed") else "")
    engine = "" if row.engine_reused is None else "reused" if row.engine_reused else "launched"
    if row.status == "pending" and row.engine_restart is not None:
        engine = "relaunch" if row.engine_restart and row.index else "launch" if row.engine_restart else "reuse"
    return [f"{row.index + 1}. {row.name}", status, row.change, _num(row.output_tok_per_s),
            factor_text(row.factor_baseline), ("LOSS " if row.loss else "") + factor_text(row.factor_previous),
            _num(row.total_tok_per_s), _num(row.ttft_ms, 1), _num(row.itl_ms, 2),
            limit_text(row) if row.ran else "", engine, row.verification if row.ran else ""]


def _style_cell(item: QTableWidgetItem, row: StepRow, col: int) -> None:
    """Losses, failures and inactive features in red, skipped steps muted; the why in tooltips."""
    if col == 5 and row.loss or col == 1 and row.status in ("failed", "interrupted") \
            or col == 11 and row.verification == "not active":
        item.setForeground(QBrush(QColor(LIGHT.bad)))
    elif row.status == "skipped":
        item.setForeground(QBrush(QColor(LIGHT.muted)))
    if col == 1 and row.reason:
        item.setToolTip(row.reason)
    if col == 11 and row.checks:
        item.setToolTip("\n".join(f"{c.feature} = {c.requested}: {c.status} ({c.evidence})" for c in row.checks))
    if col == 9 and row.ceiling_note:
        item.setToolTip(row.ceiling_note)


class LadderTab(CampaignTab):
    """See the module docstring. ``window`` is its :class:`~app.gui.campaign_panel.CampaignHost`."""

    noun, title, tick_ms = "ladder", "Ladder", TICK_MS

    def __init__(self, window: CampaignHost, parent: QWidget | None = None) -> None:
        super().__init__(window, parent)
        self.spec: LadderSpec | None = None
        self.is_default = False
        self.state: LadderState | None = None
        self.present_chart: StaircaseChart | None = None
        self._costs_key: tuple[Any, ...] | None = None
        """The steps and prices the staircase's costs were worked out for."""
        self._plan_pending = False
        self._planning = False
        self._planned_hardware: Any = None
        self._ladder_ok = False  # the configuration can carry a ladder (a shared-prefix workload, one level)
        self._showing_stored = False  # a stored ladder is open: a new plan does not replace it
        self.sub = window.bus.subscribe(kinds=(CampaignUpdated,))
        self._build()
        self._start_ticking()
        window.state.changed.connect(self._config_changed)
        self._load_spec()

    # -- layout --------------------------------------------------------------------------------

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self.workload_label = QLabel("")
        self.workload_label.setObjectName("ladderWorkload")
        self.workload_label.setWordWrap(True)
        layout.addWidget(self.workload_label)
        split = QSplitter(Qt.Orientation.Horizontal)
        left_box = self._left_panel(split)
        left_box.addWidget(QLabel("Steps (each a change to the previous step that ran):"))
        self.steps = QListWidget()
        self.steps.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        left_box.addWidget(self.steps, 1)
        edit = QHBoxLayout()
        self.add_button = QToolButton()
        self.add_button.setText("Add \u25be")
        self.add_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.add_menu = QMenu(self.add_button)
        self.add_button.setMenu(self.add_menu)
        self.remove_button = QPushButton("Remove")
        self.up_button = QPushButton("Up")
        self.down_button = QPushButton("Down")
        self.default_button = QPushButton("Seeds' order")
        self.default_button.setToolTip("Replace the steps by the default order after the seeds: baseline, FP8 weights, "
                                       "batching, FP8 KV cache, prefix caching, speculative decoding")
        for button in (self.add_button, self.remove_button, self.up_button, self.down_button, self.default_button):
            edit.addWidget(button)
        left_box.addLayout(edit)
        self._add_run_row(left_box, "\u25b6 Start ladder", "startLadder")
        self.open_button, self.compare_button, self.report_button, self.export_button = self._add_stored_box(
            left_box, "Stored ladders:", "Open", "Compare", "Report\u2026", "Export final step\u2026")
        self.race_button = QPushButton("Race baseline vs final step")
        self.race_button.setToolTip("The first and the last step that ran replay one request each, side by side, "
                                    "at the pace they measured (presentation mode)")
        left_box.addWidget(self.race_button)
        self._add_why(left_box, "Why each step?", "Each step's factor and why its run differs from the previous "
                      "step's, with its run's warnings, from the stored runs' findings")
        self._add_message(left_box)
        self.chart = StaircaseChart(LIGHT)
        self._add_results(split, self.chart, COLUMNS, [520, 260])
        right = split.widget(split.count() - 1)
        assert isinstance(right, QSplitter)
        right.addWidget(self.why_view)  # under the steps' table
        self.why_view.setVisible(False)
        split.setSizes([290, 1000])
        layout.addWidget(split, 1)
        self.remove_button.clicked.connect(self.remove_step)
        self.up_button.clicked.connect(lambda: self.move_step(-1))
        self.down_button.clicked.connect(lambda: self.move_step(1))
        self.default_button.clicked.connect(self.use_default)
        self.start_button.clicked.connect(self.start)
        self.open_button.clicked.connect(self.open_stored)
        self.compare_button.clicked.connect(self.compare_stored)
        self.race_button.clicked.connect(self.race_stored)
        self.report_button.clicked.connect(self.save_report)
        self.export_button.clicked.connect(self.export_final)
        self.steps.currentRowChanged.connect(lambda _r: self._update_buttons())

    # -- the ladder being edited ------------------------------------------------------------------

    def _load_spec(self) -> None:
        config = self.main.state.config
        try:
            self.spec, self.is_default = ladder_of(self.main.state.campaigns.ladder, config)
        except LadderError as exc:
            self.spec, self.is_default = None, False
            self.message.setText(str(exc))
        self._fill_steps()
        self._fill_presets()
        self.replan()

    def _config_changed(self, path: str) -> None:
        if self.running_here:
            return
        if path == "":  # another profile (or one opened): its ladder
            self._showing_stored = False
            self._load_spec()
        else:  # an edit of the workload, load or features: the plan changes with it
            self.replan()

    def _fill_steps(self) -> None:
        self.steps.clear()
        for i, step in enumerate(self.spec.steps if self.spec else []):
            item = QListWidgetItem(f"{i + 1}. {step.name}")
            item.setToolTip(step.note or step.name)
            self.steps.addItem(item)
        self._update_buttons()

    def _fill_presets(self) -> None:
        self.add_menu.clear()
        for step in default_ladder(self.main.state.config).steps:
            action = self.add_menu.addAction(step.name)
            action.setToolTip(step.note)
            action.triggered.connect(lambda _checked=False, s=step: self.add_step(s))

    def _set_spec(self, steps: list[LadderStepSpec]) -> None:
        """Edits become the window's configuration (saved with the profile)."""
        if not steps:
            self.message.setText("A ladder needs at least one step.")
            return
        base = self.spec or LadderSpec(steps=steps)
        self.spec = base.model_copy(update={"steps": steps})
        self.is_default = False
        self._showing_stored = False
        self.main.state.set_ladder(self.spec)
        self._fill_steps()
        self.replan()

    def add_step(self, step: LadderStepSpec) -> None:
        steps = list(self.spec.steps if self.spec else [])
        names = {s.name for s in steps}
        name, n = step.name, 2
        while name in names:
            name, n = f"{step.name} ({n})", n + 1
        steps.append(step.model_copy(update={"name": name}))
        self._set_spec(steps)
        self.steps.setCurrentRow(len(steps) - 1)

    def remove_step(self) -> None:
        row = self.steps.currentRow()
        if self.spec is None or row < 0:
            return
        steps = [s for i, s in enumerate(self.spec.steps) if i != row]
        self._set_spec(steps)
        self.steps.setCurrentRow(min(row, len(steps) - 1))

    def move_step(self, delta: int) -> None:
        row = self.steps.currentRow()
        if self.spec is None or row < 0 or not 0 <= row + delta < len(self.spec.steps):
            return
        steps = list(self.spec.steps)
        steps[row], steps[row + delta] = steps[row + delta], steps[row]
        self._set_spec(steps)
        self.steps.setCurrentRow(row + delta)

    def use_default(self) -> None:
        self._set_spec(list(default_ladder(self.main.state.config).steps))

    def _update_buttons(self) -> None:
        row, n = self.steps.currentRow(), self.steps.count()
        busy = self.main.running
        for button, ok in ((self.remove_button, row >= 0 and n > 1), (self.up_button, row > 0),
                           (self.down_button, 0 <= row < n - 1), (self.add_button, True), (self.default_button, True)):
            button.setEnabled(ok and not busy)
        self.start_button.setEnabled(self.spec is not None and self._ladder_ok and not busy)
        self.stop_button.setEnabled(self.running_here)
        chosen = self._chosen()
        have = chosen is not None
        for button in (self.open_button, self.compare_button, self.report_button, self.why_button):
            button.setEnabled(have)
        self.export_button.setEnabled(have and chosen is not None and chosen.state.final_row is not None
                                      and bool(chosen.state.final_row.run_ids))
        self.race_button.setEnabled(chosen is not None and ladder_pair(chosen.state) is not None)

    # -- the plan (before starting) ----------------------------------------------------------------

    def replan(self) -> None:
        """Each step's change, engine action and whether it can run here, checked in a worker."""
        if self.spec is None or self.running_here:
            return
        if self._planning:
            self._plan_pending = True
            return
        from app.ladder.run import Ladder

        config, spec, w = self.main.state.config, self.spec, self.main
        try:
            ladder = Ladder(config, Bus(), spec=spec, hardware=w.hardware, flags=w.flags, discover_flags=False)
        except LadderError as exc:
            self.workload_label.setText(f"<span style='color:{LIGHT.bad}'>{exc}</span>")
            self._ladder_ok = False
            self._update_buttons()
            return
        self._ladder_ok = True
        self._update_buttons()
        self._planning = True
        self._planned_hardware = w.hardware
        run_in_worker(ladder.plan, self._planned, self._plan_failed, name="ladder-plan", parent=self)

    def _planned(self, state: LadderState) -> None:
        self._planning = False
        if not self.running_here and not self._showing_stored:
            self.workload_label.setText(f"<b>Fair by construction:</b> {state.workload}. "
                                        + ("(No [campaigns.ladder] in this profile: the default order after the seeds.)"
                                           if self.is_default else ""))
            self.show_state(state)
        if self._plan_pending:
            self._plan_pending = False
            self.replan()

    def _plan_failed(self, message: str) -> None:
        self._planning = False
        self.message.setText(message)

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        w = self.main
        if w.running or self.spec is None or self._blocked():
            return
        from app.ladder.run import run_ladder

        config, spec = w.state.config, self.spec
        cancel = threading.Event()
        keep, session, bus, db_path, hardware, flags = (w.keep_engine.isChecked(), w.session, w.bus, w.db_path,
                                                        w.hardware, w.flags)
        stem = w.profile_path.stem if w.profile_path else ""
        cluster, follow = w.cluster_choice(), w.follow_slot

        def work() -> LadderState:
            if cluster is not None:  # each step is a trial on the cluster, side by side (ladder --cluster)
                on_cluster = open_cluster(cluster, config, bus, follow)
                return run_ladder(config, bus, cancel, spec=spec, profile=stem, db_path=db_path, hardware=hardware,
                                  flags=flags, runner_factory=self.runner_factory, **on_cluster)
            if not keep:
                session.shutdown()  # the ladder keeps its own engine from step to step, then stops it
            return run_ladder(config, bus, cancel, spec=spec, profile=stem, engines=session if keep else None,
                              db_path=db_path, hardware=hardware, flags=flags, runner_factory=self.runner_factory)

        self._showing_stored = False
        self._launch(work, cancel, "Ladder starting\u2026")
        w.presentation.set_heading(spec.name or config.name, "Acceleration ladder: " + " \u2192 ".join(
            s.name for s in spec.steps), "The staircase grows as each step finishes")

    def _done(self, state: LadderState) -> None:
        self._finished()
        done = state.completed_rows
        best = max((r.factor_baseline or 0.0 for r in done), default=0.0)
        text = (f"Ladder {state.status}: {len(done)} of {len(state.rows)} steps ran"
                + (f", up to {factor_text(best)} output tok/s over the baseline" if best else "")
                + (f" ({state.reason})" if state.reason else ""))
        self.main.show_banner(text, error=state.status not in ("completed", "cancelled"))
        self.show_state(state)

    def tick(self) -> None:
        self._follow_window()
        if self._planned_hardware is None and self.main.hardware is not None and not self.running_here:
            self.replan()  # the window's probe arrived: judge the steps on this machine, not the ladder's GPU
        latest = None
        for item in self.sub.drain():
            if isinstance(item, Event) and isinstance(item.payload, CampaignUpdated) \
                    and isinstance(item.payload.state, LadderState):
                latest = item.payload.state
        if latest is not None and self.running_here:
            self.show_state(latest)
            running = next((r for r in latest.rows if r.status == "running"), None)
            if running is not None:
                self.main.phase_bar.set_text(f"Ladder step {running.index + 1}/{len(latest.rows)}: {running.name} "
                                               f"({running.change})")

    def show_state(self, state: LadderState | None) -> None:
        self.state = state
        self.chart.set_state(state)
        self._presentation_chart().set_state(state)
        self._fill_table(state.rows if state else [], row_cells, _style_cell)
        self._price_steps(state)

    def _price_steps(self, state: LadderState | None) -> None:
        """Each finished step's $ per 1M output (and good output) tokens on the staircase
        (``app.cost.step_costs``, from its stored runs, in a worker); priced again when a step
        finishes or the prices change."""
        if state is None:
            self._costs_key = None
            return
        key = (state.ladder_id, tuple((r.index, r.output_tok_per_s) for r in state.rows if r.run_ids),
               tuple(self.main.settings.prices))
        if key == self._costs_key or not key[1]:
            return
        self._costs_key = key
        prices = self.main.prices()

        def price(store: Any) -> tuple[dict[int, str], str, dict[int, str]]:
            costs = step_costs(store, state, prices)
            return ({i: usd_text(c.output.usd) for i, c in costs.items() if c.output.usd is not None},
                    sources_text(costs.values()),
                    {i: usd_text(g.usd) for i, c in costs.items() if (g := c.good_output) is not None and g.usd is not None})

        def show(result: tuple[dict[int, str], str, dict[int, str]]) -> None:
            for chart in (self.chart, self.present_chart):
                if chart is not None:
                    chart.set_costs(*result)
                    chart.set_state(self.state)

        run_in_worker(lambda: self.main.with_store(price), show, None, name="ladder-cost", parent=self)

    def _presentation_chart(self) -> StaircaseChart:
        """A large, dark staircase above the presentation's plots (created on first use)."""
        if self.present_chart is None:
            self.present_chart = StaircaseChart(DARK, compact=True)
            self.present_chart.setMinimumHeight(320)
            self.main.presentation.add_above_plots(self.present_chart, 3)
        self.present_chart.setVisible(self.state is not None and bool(self.state.completed_rows or self.running_here))
        return self.present_chart

    # -- stored ladders ----------------------------------------------------------------------------

    def _list_stored(self, store: Any) -> list[Any]:
        from app.ladder.stored import list_ladders

        return list_ladders(store)

    def _stored_label(self, item: Any) -> str:
        st = item.state
        return f"{st.ladder_id} \u00b7 {st.name} \u00b7 {st.status} ({len(st.completed_rows)}/{len(st.rows)} steps)"

    def open_stored(self) -> None:
        chosen = self._chosen()
        if chosen is not None:
            self._showing_stored = True
            self.workload_label.setText(f"<b>Stored ladder {chosen.state.ladder_id}</b> ({chosen.state.status}): "
                                        f"{chosen.state.workload}")
            self.show_state(chosen.state)

    def compare_stored(self) -> None:
        chosen = self._chosen()
        if chosen is not None:
            self.main.compare_runs(chosen.run_ids)

    def race_stored(self) -> None:
        chosen = self._chosen()
        pair = ladder_pair(chosen.state) if chosen is not None else None
        if pair is not None:
            self.main.race_runs(*pair)

    def _report_target(self) -> tuple[Any, str] | None:
        chosen = self._chosen()
        return None if chosen is None else (chosen.state, chosen.ladder_id)

    def _render_report(self, state: Any) -> str:
        """In the report's worker: each step's cost from its stored run, at your prices."""
        from app.export.ladder_report import render_ladder_report

        prices = self._quiet_prices()
        costs = self.main.with_store(lambda store: step_costs(store, state, prices)) if state.run_ids else None
        return render_ladder_report(state, costs=costs)

    def _why_lines(self, store: Any, state: Any) -> list[str]:
        from app.campaign_findings import ladder_lines

        return ladder_lines(store, state)

    def export_final(self) -> None:
        chosen = self._chosen()
        final = chosen.state.final_row if chosen is not None else None
        if final is not None and final.run_ids:
            self.main.open_export(run_ids=[final.run_ids[-1]])
