"""The Tune tab: the best engine configuration under an SLO (``app.tuner``), from the window's
configuration. The SLO, the strategy, the budget, the repeats and an optional space file are set
here; Start runs the tune in the window's run worker (Stop and closing the window treat it as the
running run, and each trial's live graphs show in the Live tab as for any run). As trials end the
Pareto chart (output tok/s per GPU against tok/s per user, the SLO frontier, the TPOT line, the
pick ringed) and the trials table grow; the pick is named with the constraint that bound it.
Stored tunes open here too: resumed, reported, their pick exported in any launch format, and
``vllm bench sweep`` or AIConfigurator points imported onto the chart.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.bus import Event
from app.cost import SECONDS_PER_HOUR, TOKENS_PER_MILLION, RunCost, run_cost, trial_costs, usd_text
from app.events import CampaignUpdated
from app.export.launch import SINGLE_NODE_FORMATS
from app.export.tune_report import COLUMNS, IMPORT_COLOURS, pick_text, trial_table
from app.gui.campaign_panel import CampaignHost, CampaignTab
from app.gui.capacity_box import CapacityBox
from app.gui.cluster_box import open_cluster
from app.gui.theme import LIGHT, Theme
from app.gui.workers import run_in_worker
from app.tuner.state import TuneState, chart_points, pareto_front, slo_frontier, tpot_floor

TICK_MS = 250
DEFAULT_SLO = "ttft_ms<=500,tpot_ms<=50"
SCRIPT_FORMATS = SINGLE_NODE_FORMATS  # a single winner runs on one machine


class CostAxis(pg.AxisItem):
    """The right axis of the Pareto chart: the left axis's output tok/s per GPU read as $ per 1M
    output tokens (one GPU-hour's price over its tokens per hour), so the best trial on either axis
    is the same dot. Labels only: the ticks sit where the left axis puts them."""

    def __init__(self) -> None:
        super().__init__("right")
        self.usd_per_device_hour: float | None = None

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802 - pyqtgraph API
        price = self.usd_per_device_hour
        if price is None:
            return ["" for _ in values]
        return [usd_text(price / (v * scale * SECONDS_PER_HOUR) * TOKENS_PER_MILLION) if v > 0 else ""
                for v in values]


class ParetoChart(QWidget):
    """``set_state(state)`` redraws the trade-off: each measured trial a dot (green met the SLO,
    red missed it, grey otherwise), the SLO frontier, the TPOT bound, the pick ringed, imported
    points as hollow diamonds by source."""

    def __init__(self, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme = theme
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.cost_axis = CostAxis()
        self.plot = pg.PlotWidget(background=theme.background, axisItems={"right": self.cost_axis})
        item = self.plot.getPlotItem()
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setMenuEnabled(False)
        item.setLabel("bottom", "tok/s per user (1000 / mean TPOT)")
        item.setLabel("left", "output tok/s per GPU")
        self.legend = item.addLegend(offset=(-10, 10))
        item.hideAxis("right")
        layout.addWidget(self.plot)
        # One TPOT line for the chart's life, moved and put back at each redraw: a labelled line made
        # anew each time left a line <-> label reference cycle whose label stayed connected to the
        # scene's paint signal, and the cyclic GC freed it at any moment, even inside a paint (a crash).
        self.tpot_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.bad, style=Qt.PenStyle.DashLine),
                                         label="TPOT SLO", labelOpts={"position": 0.9, "color": theme.bad})
        self.points: dict[str, list[tuple[float, float]]] = {}
        """What is drawn, by series name (tests read it back)."""

    def set_state(self, state: TuneState | None) -> None:
        item = self.plot.getPlotItem()
        item.clear()
        self.legend.clear()
        self.points = {}
        if state is None:
            return
        t = self.theme
        groups = {"met the SLO": ("passed", t.good), "missed the SLO": ("failed", t.bad)}
        measured = [x for x in state.trials if x.measured]
        for name, (status, colour) in groups.items():
            pts = chart_points([x for x in measured if x.status == status])
            if pts:
                self._scatter(name, pts, colour, "o")
        other = chart_points([x for x in measured if x.status not in ("passed", "failed")])
        if other:
            self._scatter("other", other, t.muted, "o")
        frontier = slo_frontier(state.trials)
        if frontier:
            pts = [(x.tok_s_per_user or 0.0, x.tok_s_per_gpu or 0.0) for x in frontier]
            self.points["SLO frontier"] = pts
            item.addItem(pg.PlotDataItem([p[0] for p in pts], [p[1] for p in pts], pen=pg.mkPen(t.good, width=2),
                                         name="SLO frontier"))
        for i, source in enumerate(sorted({x.source for x in state.trials if not x.measured})):
            mine = [x for x in state.trials if x.source == source]
            pts = chart_points(mine)
            colour = IMPORT_COLOURS[i % len(IMPORT_COLOURS)]
            self._scatter(f"{source} (imported)", pts, colour, "d", hollow=True)
            front = [pts[j] for j in pareto_front(pts)]
            if len(front) > 1:
                item.addItem(pg.PlotDataItem([p[0] for p in front], [p[1] for p in front],
                                             pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine)))
        floor = tpot_floor(state.slo) if state.slo else None
        if floor:
            self.points["TPOT SLO"] = [(floor, 0.0)]
            self.tpot_line.setValue(floor)
            item.addItem(self.tpot_line)
        pick = state.pick
        if pick is not None and pick.tok_s_per_user is not None and pick.tok_s_per_gpu is not None:
            self.points["pick"] = [(pick.tok_s_per_user, pick.tok_s_per_gpu)]
            item.addItem(pg.ScatterPlotItem([pick.tok_s_per_user], [pick.tok_s_per_gpu], size=22, symbol="o",
                                            pen=pg.mkPen("#f9ab00", width=3), brush=None, name="pick"))

    def set_cost(self, usd_per_device_hour: float | None, source: str = "") -> None:
        """Read tok/s per GPU as $ per 1M output tokens on the right (None: no price, no axis)."""
        self.cost_axis.usd_per_device_hour = usd_per_device_hour
        item = self.plot.getPlotItem()
        if usd_per_device_hour is None:
            item.hideAxis("right")
            return
        item.showAxis("right")
        item.setLabel("right", f"$ per 1M output tokens ({source}; lower is better)")
        self.cost_axis.picture = None  # the labels changed with the price: redraw them
        self.cost_axis.update()

    def _scatter(self, name: str, pts: list[tuple[float, float]], colour: str, symbol: str,
                 hollow: bool = False) -> None:
        self.points[name] = pts
        self.plot.getPlotItem().addItem(pg.ScatterPlotItem(
            [p[0] for p in pts], [p[1] for p in pts], size=10, symbol=symbol, pen=pg.mkPen(colour, width=1.5),
            brush=None if hollow else pg.mkBrush(colour), name=name))


def _style_cell(item: QTableWidgetItem, row: dict[str, str], col: int) -> None:
    """A trial's status in red (failed) or green (passed), the pick's row highlighted, notes as tooltips."""
    key, status = COLUMNS[col], row["status"]
    if key == "status" and status.endswith("failed"):
        item.setForeground(QBrush(QColor(LIGHT.bad)))
    elif key == "status" and status.endswith("passed"):
        item.setForeground(QBrush(QColor(LIGHT.good)))
    if status.startswith("PICK"):
        item.setBackground(QBrush(QColor("#fef7e0")))
    if key == "note" and row["note"]:
        item.setToolTip(row["note"])


class TuneTab(CampaignTab):
    """See the module docstring. ``window`` is its :class:`~app.gui.campaign_panel.CampaignHost`."""

    noun, title, tick_ms = "tune", "Tune", TICK_MS
    engines: Any = None
    """Tests put a stand-in engine source here (default: the tune's own engine keeper)."""

    def __init__(self, window: CampaignHost, parent: QWidget | None = None) -> None:
        super().__init__(window, parent)
        self.state: TuneState | None = None
        self._cost_key: tuple[Any, ...] | None = None
        """The run and prices the chart's cost axis was priced with (priced again when either changes)."""
        self._trial_costs: dict[int, RunCost] = {}
        self._trial_costs_key: tuple[Any, ...] | None = None
        """The tune, its finished trials and the prices the trials' cost cells were priced for."""
        self.stored: list[TuneState] = []
        self.sub = window.bus.subscribe(kinds=(CampaignUpdated,))
        """The running tune's state as it moves (``app.tuner.run`` publishes each change)."""
        self._build()
        self._start_ticking()

    # -- layout --------------------------------------------------------------------------------

    def _build(self) -> None:
        layout = QHBoxLayout(self)
        split = QSplitter(Qt.Orientation.Horizontal)
        box = self._left_panel(split)
        form = QFormLayout()
        self.slo_edit = QLineEdit(DEFAULT_SLO)
        self.slo_edit.setToolTip("Bounds on ttft_ms, tpot_ms, e2e_ms, queue_ms, held at the percentile below")
        self.percentile = QComboBox()
        self.percentile.addItems(["p99", "p95", "p90", "p50"])
        self.strategy = QComboBox()
        self.strategy.addItem("grid: every configuration", "grid")
        self.strategy.addItem("bayes: optuna TPE picks the next", "bayes")
        self.trials = QSpinBox()
        self.trials.setRange(0, 10_000)
        self.trials.setSpecialValueText("all")
        self.trials.setToolTip("At most this many engine configurations (each searched over the load range)")
        self.budget_min = QSpinBox()
        self.budget_min.setRange(0, 7 * 24 * 60)
        self.budget_min.setSuffix(" min")
        self.budget_min.setSpecialValueText("none")
        self.repeats = QSpinBox()
        self.repeats.setRange(0, 20)
        self.repeats.setSpecialValueText("off")
        self.repeats.setToolTip("Confirm the pick by this many reruns (at least 2) with its 95% confidence interval")
        space_row = QHBoxLayout()
        self.space_edit = QLineEdit("")
        self.space_edit.setPlaceholderText("default: from the profile and this machine")
        self.space_button = QPushButton("\u2026")
        self.space_button.setMaximumWidth(30)
        space_row.addWidget(self.space_edit, 1)
        space_row.addWidget(self.space_button)
        form.addRow("SLO:", self.slo_edit)
        form.addRow("Percentile:", self.percentile)
        form.addRow("Search:", self.strategy)
        form.addRow("Configurations:", self.trials)
        form.addRow("Budget:", self.budget_min)
        form.addRow("Confirm pick:", self.repeats)
        form.addRow("Space file:", space_row)
        box.addLayout(form)
        self._add_run_row(box, "\u25b6 Start tune", "startTune")
        self.open_button, self.resume_button, self.report_button = self._add_stored_box(
            box, "Stored tunes:", "Open", "Resume", "Report\u2026")
        export_row = QHBoxLayout()
        self.export_format = QComboBox()
        self.export_format.addItems(list(SCRIPT_FORMATS))
        self.export_button = QPushButton("Export pick\u2026")
        self.import_button = QPushButton("Import points\u2026")
        self.import_button.setToolTip("vllm bench sweep (summary.csv, summary.json, run=N.json) or an AIConfigurator "
                                      "Pareto CSV, drawn on this tune's chart")
        export_row.addWidget(self.export_format)
        export_row.addWidget(self.export_button)
        export_row.addWidget(self.import_button)
        box.addLayout(export_row)
        self._add_why(box, "Why this pick?", "The pick with its run's warnings and what bound it, and why each "
                      "rejected trial failed, from the stored runs' findings")
        self.pick_label = QLabel("")
        self.pick_label.setObjectName("tunePick")
        self.pick_label.setWordWrap(True)
        self.pick_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.addWidget(self.pick_label)
        self._add_message(box)
        box.addStretch(1)
        self.chart = ParetoChart(LIGHT)
        self._add_results(split, self.chart, COLUMNS, [480, 300])
        # The trials table and the Capacity box share the place under the chart, as two tabs.
        right = split.widget(split.count() - 1)
        assert isinstance(right, QSplitter)
        self.capacity = CapacityBox(self.main.with_store, side_by_side=False)
        self.results_tabs = QTabWidget()
        self.results_tabs.setDocumentMode(True)
        self.results_tabs.addTab(self.table, "Trials")
        self.results_tabs.addTab(self.capacity, "Capacity and cost")
        self.results_tabs.addTab(self.why_view, "Why")
        right.addWidget(self.results_tabs)
        right.setSizes([480, 300])
        split.setSizes([330, 960])
        layout.addWidget(split)
        self.start_button.clicked.connect(lambda: self.start())
        self.space_button.clicked.connect(self._pick_space)
        self.open_button.clicked.connect(self.open_stored)
        self.resume_button.clicked.connect(lambda: self.start(resume=True))
        self.report_button.clicked.connect(lambda: self.save_report())
        self.export_button.clicked.connect(lambda: self.export_pick())
        self.import_button.clicked.connect(lambda: self.import_points())
        self.stored_picker.currentIndexChanged.connect(lambda _i: self._update_buttons())
        self._update_buttons()

    def _pick_space(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Search space", "", "TOML (*.toml)")
        if path:
            self.space_edit.setText(path)

    def _update_buttons(self) -> None:
        busy = bool(self.main.running)
        chosen = self._chosen()
        self.start_button.setEnabled(not busy)
        self.stop_button.setEnabled(self._running)
        self.resume_button.setEnabled(not busy and chosen is not None and chosen.status != "completed")
        self.open_button.setEnabled(chosen is not None)
        self.report_button.setEnabled(chosen is not None or self.state is not None)
        self.why_button.setEnabled(chosen is not None or self.state is not None)
        shown = self.state
        self.export_button.setEnabled(shown is not None and shown.pick is not None)
        self.import_button.setEnabled(shown is not None and not self._running)

    # -- running ---------------------------------------------------------------------------------

    def start(self, resume: bool = False) -> None:
        w = self.main
        if w.running or not resume and self._blocked():
            return
        from app.tuner.run import Tuner
        from app.tuner.space import build_space, read_space_file

        config = w.state.config
        stem = w.profile_path.stem if w.profile_path else config.name
        chosen = self._chosen() if resume else None
        if resume and chosen is None:
            return
        slo, space_path = self.slo_edit.text().strip(), self.space_edit.text().strip()
        percentile, strategy = self.percentile.currentText(), self.strategy.currentData()
        trials = self.trials.value() or None
        budget_s = self.budget_min.value() * 60.0 or None
        repeats = self.repeats.value()
        if repeats == 1:
            w.show_error("Confirm pick: at least 2 reruns give a confidence interval (or off)")
            return
        cancel = threading.Event()
        bus, db_path, hardware, flags = w.bus, w.db_path, w.hardware, w.flags
        kwargs: dict[str, Any] = {"telemetry": True}
        if self.runner_factory is not None:
            kwargs["runner_factory"] = self.runner_factory
        if self.engines is not None:
            kwargs["engines"] = self.engines
        if flags is not None:
            kwargs.update(flags=flags, discover_flags=False)
        if hardware is not None:
            kwargs["hardware"] = hardware
        session = w.session
        cluster, follow = w.cluster_choice(), w.follow_slot

        def work() -> TuneState:
            from app.recording import record_to_default_store
            from db import tune_store

            if cluster is not None:  # each configuration's search is a trial on the cluster (tune --cluster)
                kwargs.update(open_cluster(cluster, config, bus, follow))
            else:
                session.shutdown()  # one engine at a time: the tune starts and stops its own
            recorder = record_to_default_store(bus, db_path)
            try:
                if chosen is not None:
                    stored = tune_store.find_tune(recorder.store, chosen.tune_id)
                    tuner = Tuner.resume(stored, bus, recorder=recorder, **kwargs)
                else:
                    raw = read_space_file(space_path) if space_path else None
                    space = build_space(config, hardware, raw, source=space_path or "search space")
                    space.percentile = percentile  # type: ignore[assignment]
                    tuner = Tuner(config, bus, slo=slo, space=space, strategy=strategy, max_candidates=trials,
                                  budget_s=budget_s, repeats=repeats, profile=stem, recorder=recorder, **kwargs)
                return tuner.run(cancel)
            finally:
                recorder.close()

        self.sub.drain()  # what earlier tunes published is not this one's
        self._launch(work, cancel, "Tune starting\u2026")

    def _done(self, state: TuneState) -> None:
        self._finished()
        self.show_state(state)
        self.main.show_banner(f"Tune {state.status}" + (f" ({state.reason})" if state.reason else "") + ". "
                              + pick_text(state), error=state.status not in ("completed", "cancelled"))

    def tick(self) -> None:
        self._follow_window()
        state = None
        for item in self.sub.drain():
            if isinstance(item, Event) and isinstance(item.payload, CampaignUpdated) \
                    and isinstance(item.payload.state, TuneState):
                state = item.payload.state
        if self._running and state is not None:
            if self.state is None or state.revision != self.state.revision:
                self.show_state(state)
                running = [t for t in state.trials if t.status == "running"]
                if running:
                    t = running[-1]
                    self.main.phase_bar.set_text(f"Tune: {t.label} @ {t.load_label} "
                                                 f"({sum(1 for x in state.measured if x.status != 'running')} "
                                                 f"trials done)")

    def show_state(self, state: TuneState | None) -> None:
        self.state = state
        self.chart.set_state(state)
        self.pick_label.setText(pick_text(state) if state is not None else "")
        self._fill_trials()
        self._fill_trial_costs(state)
        self._fill_capacity(state)
        self._fill_cost_axis(state)
        self._update_buttons()

    def _fill_trials(self) -> None:
        state = self.state
        costs = {} if state is None or self._trial_costs_key is None or self._trial_costs_key[0] != state.tune_id \
            else self._trial_costs
        self._fill_table(trial_table(state, costs) if state is not None else [], lambda row: [row[k] for k in COLUMNS],
                         _style_cell)

    def _fill_trial_costs(self, state: TuneState | None) -> None:
        """Each finished trial's costs, from its stored run and requests in a worker
        (``app.cost.trial_costs``); the table is filled again when they arrive."""
        if state is None:
            self._trial_costs_key, self._trial_costs = None, {}
            return
        done = tuple((t.index, t.run_id) for t in state.measured
                     if t.run_id is not None and t.status not in ("pending", "running"))
        key = (state.tune_id, done, tuple(self.main.settings.prices))
        if key == self._trial_costs_key:
            return
        self._trial_costs_key = key
        if not done:
            self._trial_costs = {}
            return
        prices = self._quiet_prices()

        def shown(costs: dict[int, RunCost]) -> None:
            if self._trial_costs_key == key:  # not a newer state's meanwhile
                self._trial_costs = costs
                self._fill_trials()

        run_in_worker(lambda: self.main.with_store(lambda store: trial_costs(store, state, prices)), shown, None,
                      name="tune-trial-costs", parent=self)

    def _fill_cost_axis(self, state: TuneState | None) -> None:
        """The chart's cost axis, priced from a measured trial's stored run (its GPUs or cores and
        price, ``app.cost.run_cost``): what one chart "GPU" (a device: a host on a CPU engine)
        costs an hour is that run's cost per token times its tok/s per device."""
        trial = next((t for t in (state.measured if state is not None else [])
                      if t.run_id is not None and t.tok_s_per_gpu and t.figures.get("output_tok_per_s")), None)
        if trial is None:
            self._cost_key = None
            self.chart.set_cost(None)
            return
        key = (trial.run_id, tuple(self.main.settings.prices))
        if key == self._cost_key:
            return
        self._cost_key = key
        prices, run_id, figures = self.main.prices(), trial.run_id, dict(trial.figures)
        per_device = float(trial.tok_s_per_gpu or 0.0)

        def price(store: Any) -> tuple[float | None, str]:
            cost = run_cost(store.get_run(run_id), prices, figures.get("output_tok_per_s"), None)
            if cost.output.usd is None or cost.price is None:
                return None, ""
            return cost.output.usd * per_device * SECONDS_PER_HOUR / TOKENS_PER_MILLION, cost.price.source

        run_in_worker(lambda: self.main.with_store(price), lambda r: self.chart.set_cost(*r), None,
                      name="tune-cost", parent=self)

    def _fill_capacity(self, state: TuneState | None) -> None:
        """The Capacity box sizes on the pick's run (first) or any measured trial's, at the tune's SLO."""
        if state is None:
            self.capacity.set_runs([])
            return
        runs: list[tuple[int, str]] = []
        pick = state.pick
        if pick is not None and pick.run_id is not None:
            runs.append((pick.run_id, f"#{pick.run_id} the pick: {pick.label} @ {pick.load_label}"))
        runs += [(t.run_id, f"#{t.run_id} {t.label} @ {t.load_label}") for t in state.measured
                 if t.run_id is not None and t.status != "running" and (pick is None or t.run_id != pick.run_id)]
        ids = [run_id for run_id, _label in runs]
        if ids != [self.capacity.run_choice.itemData(i) for i in range(self.capacity.run_choice.count())]:
            self.capacity.set_runs(runs)
            self.capacity.set_slo(state.slo, state.percentile)

    # -- stored tunes ------------------------------------------------------------------------------

    def _list_stored(self, store: Any) -> list[TuneState]:
        from app.tuner.stored import list_states

        return list_states(store)

    def _stored_label(self, item: TuneState) -> str:
        return f"{item.tune_id} \u00b7 {item.status} \u00b7 {len(item.measured)} trials \u00b7 {item.name}"

    def open_stored(self) -> None:
        chosen = self._chosen()
        if chosen is not None:
            self.show_state(chosen)
            self.message.setText(f"Stored tune {chosen.tune_id}: {chosen.status}")

    def _report_target(self) -> tuple[TuneState, str] | None:
        state = self.state or self._chosen()
        return None if state is None else (state, state.tune_id)

    def _render_report(self, state: TuneState) -> str:
        from app.export.tune_report import render_tune_report

        prices = self._quiet_prices()
        costs = self.main.with_store(lambda store: trial_costs(store, state, prices)) if state.measured else None
        return render_tune_report(state, costs=costs)

    def _why_lines(self, store: Any, state: TuneState) -> list[str]:
        from app.campaign_findings import tune_lines

        return tune_lines(store, state)

    def _reveal_why(self) -> None:
        self.results_tabs.setCurrentWidget(self.why_view)

    def export_pick(self, path: str | None = None, fmt: str | None = None) -> None:
        state = self.state
        if state is None or state.pick is None:
            return
        fmt = fmt or self.export_format.currentText()
        suffix = ".sh" if fmt in ("bash", "docker") else ".yaml"
        path = path or self._save_path("Export the pick", f"pick-{state.tune_id}{suffix}")
        if not path:
            return

        def write() -> Path:
            from app.export import save
            from app.export.tune_report import pick_launch_script

            return save(pick_launch_script(state, fmt), fmt, path)

        self._write_in_worker(write, lambda p: f"The pick written to {p} ({fmt})", "tune-export")

    def import_points(self, path: str | None = None) -> None:
        state = self.state
        if state is None:
            return
        if not path:
            path, _ = QFileDialog.getOpenFileName(self, "Import sweep points", "",
                                                  "Sweep results (*.csv *.json);;All files (*)")
        if not path:
            return
        tune_id = state.tune_id

        def work() -> TuneState:
            from app.export.sweep_import import import_into_tune
            from app.tuner.stored import load_tune

            def go(store: Any) -> TuneState:
                import_into_tune(store, tune_id, path)
                return load_tune(store, tune_id)

            return self.main.with_store(go)  # type: ignore[no-any-return]

        def done(new: TuneState) -> None:
            self.show_state(new)
            self.message.setText(f"Imported {len(new.imported)} point(s) onto tune {tune_id}")
            self.refresh_stored()

        run_in_worker(work, done, self.main.show_error, name="tune-import", parent=self)
