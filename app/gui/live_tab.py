"""The Live tab: run progress, the feature checks, the dashboard, the run's findings (so far while
it runs, then the stored run's) and the engine log, drawn from the window's :class:`app.live_run.LiveRun` (and the presentation's live
page with them).

Each handler here subscribes to one kind of event the live run folded and only draws; what the
run is, and what it has said so far, is the live run's. The window drains the bus into it and
asks this tab to ingest the samples and refresh.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QSizePolicy, QSplitter, QTabWidget, QVBoxLayout, QWidget

from app.analysis.findings import Finding
from app.bus import Sample
from app.cost import PriceTable, RunCost, live_cost_basis, usd_text
from app.events import (
    NOTE_PREFIX,
    EngineReady,
    LevelFinished,
    LevelStarted,
    Notice,
    PhaseChanged,
    Progress,
    QualityMeasured,
    RunFinished,
    RunStarted,
    TelemetrySupport,
)
from app.gui.dashboard import Dashboard, TileRow
from app.gui.findings_panel import FindingsPanel
from app.gui.live import LogView, PhaseBar
from app.gui.presentation import PresentationView
from app.gui.series import SeriesStore
from app.gui.workers import run_in_worker
from app.live_run import LiveRun
from app.load.metrics import level_notes
from app.planner.live import limit_figures
from app.run_findings import LiveFindings, first_sentence, headline_finding
from app.runner import RunResult
from engine_adapters.base import FeatureCheck, feature_check_line, feature_status_text
from engine_adapters.features import FEATURES

CHECK_COLOURS = {"verified": "#188038", "accepted": "#b06000", "not active": "#d93025", "unknown": "#5f6368"}
"""Feature-check colours: green only for an effect measured, amber for an echo alone."""
DASHBOARD_KEEPS_PX = 560
"""The dashboard's height the findings never take (its tiles and two rows of plots, legible); a
taller window gives the rest to the findings when they arrive."""
LIVE_FINDINGS_MS = 3000
"""How often the running run's findings are read again (when something new arrived)."""
StatusLine = Callable[[str, int], None]
"""Shows a message in the window's status bar for so many milliseconds (0: until replaced)."""


class LiveTab(QWidget):
    """Progress line, feature checks, plots and tiles over the log; subscribed to ``live``."""

    def __init__(self, live: LiveRun, presentation: PresentationView, *, status: StatusLine,
                 running: Callable[[], bool], starting_text: Callable[[], str],
                 prices: Callable[[], PriceTable]) -> None:
        super().__init__()
        self.live, self.presentation = live, presentation
        self._status, self._running, self._starting_text, self._prices = status, running, starting_text, prices
        self.series = SeriesStore()
        self.phase_bar = PhaseBar()
        self.dashboard = Dashboard()
        self.log_view = LogView()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.phase_bar)
        self.checks_label = QLabel("")
        self.checks_label.setObjectName("featureChecks")
        self.checks_label.setWordWrap(True)
        self.checks_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.checks_label.setVisible(False)
        layout.addWidget(self.checks_label)
        # The ended run's findings, beside the engine log (the window gives the panel the store):
        # the plots keep their room; a taller window gives the findings more.
        self.findings = FindingsPanel(hide_when_empty=False)
        self.findings.shown.connect(self._findings_shown)
        self.bottom = QTabWidget()
        self.bottom.setDocumentMode(True)
        self.bottom.addTab(self.log_view, "Engine log")
        self.bottom.addTab(self.findings, "Findings")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.dashboard)
        split.addWidget(self.bottom)
        split.setSizes([560, 150])
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        self.split = split
        layout.addWidget(split, 1)
        # The running run's findings, from what the bus said so far: read in a worker now and
        # then, drawn in the same panel until the stored run's replace them.
        self.live_findings = LiveFindings()
        self._live_timer = QTimer(self)
        self._live_timer.setInterval(LIVE_FINDINGS_MS)
        self._live_timer.timeout.connect(self.refresh_live_findings)
        self._live_generation = 0  # a reply for an earlier run (or after it ended) is dropped
        self._live_reading = False
        self._live_warnings = 0
        self._live_drawing = False
        self._live_title = ""
        live.started.connect(self._run_started)
        live.phase_changed.connect(self._phase_changed)
        live.engine_ready.connect(self._engine_ready)
        live.level_started.connect(self._level_started)
        live.progressed.connect(self._progressed)
        live.level_finished.connect(self._level_finished)
        live.support_changed.connect(lambda _support: self.apply_support())
        live.noticed.connect(self._noticed)
        live.quality_measured.connect(self._quality_measured)
        live.finished.connect(self._finished)
        live.logged.connect(self.log_view.append)

    @property
    def tile_rows(self) -> tuple[TileRow, TileRow]:
        """The desk's tiles and the presentation's: both show the same figures."""
        return self.dashboard.tiles, self.presentation.tiles

    # -- what the bus said -----------------------------------------------------------------------

    def ingest(self, samples: list[Sample]) -> None:
        """The samples of one drain (see :meth:`LiveRun.fold`) onto the plots."""
        if not samples:
            return
        self.series.ingest(samples)
        self.live_findings.ingest(samples)
        if self.dashboard.page == Dashboard.IDLE:
            self.dashboard.show_plots()

    def _run_started(self, started: RunStarted) -> None:
        where = self.live.nodes.get(started.run_id)
        self._status(f"Run {started.name} started" + (f" on {where}" if where else "")
                     + f" ({started.engine_kind} {started.engine_version or ''})", 0)
        basis = live_cost_basis(started, self._prices())  # in memory: the run's GPUs or cores and price
        for row in self.tile_rows:
            row.set_cost_basis(basis)
        self._stop_live_findings()
        self.live_findings.begin(started)
        self._live_title = f"run {started.name} so far"
        self._live_timer.start()
        # The desk's tiles only: a projector at 1024x768 and 150% has no room for a ninth tile
        # above its plots (the before/after view says the quality kept).
        quality = started.config.quality
        self.dashboard.tiles.show_quality(None, waiting=quality is not None and quality.enabled)

    def _quality_measured(self, measured: QualityMeasured) -> None:
        self.dashboard.tiles.show_quality(measured.quality)

    def _phase_changed(self, phase: PhaseChanged) -> None:
        detail = self.live.on_node(phase.run_id, phase.detail)
        self.phase_bar.set_phase(phase.phase.value, detail)
        if self._running() and phase.phase.value not in ("ready", "stopping", "stopped"):
            if self.dashboard.page != Dashboard.STARTUP:
                self.dashboard.show_startup(self._starting_text())
            self.dashboard.startup.set_phase(phase.phase.value, detail)

    def _engine_ready(self, ready: EngineReady) -> None:
        lines = [f"{NOTE_PREFIX}engine ready at {ready.base_url}" +
                 (f" after {ready.startup_s:.1f} s" if ready.startup_s is not None else "")]
        lines += [NOTE_PREFIX + feature_check_line(check) for check in ready.feature_checks]
        self.log_view.append(lines)
        self.phase_bar.set_phase("ready", "running the load")
        self.show_feature_checks(ready.feature_checks)
        self.series.clear()
        self.dashboard.plots.reset()
        self.presentation.plots.reset()
        self.dashboard.show_plots()

    def _level_started(self, level: LevelStarted) -> None:
        self.live_findings.level_started(level)
        self._status(f"Level {level.index}: {level.label}", 0)
        duration = self.live.config.load.duration_s if self.live.config is not None else None
        self.phase_bar.level_started(level.index, level.label, level.num_requests, duration)
        if self.dashboard.page != Dashboard.PLOTS:
            self.dashboard.show_plots()

    def _progressed(self, progress: Progress) -> None:
        self.phase_bar.progress(progress.requests_done, progress.planned, progress.elapsed_s)

    def _level_finished(self, finished: LevelFinished) -> None:
        self.live_findings.level_finished(finished, time.time())
        summary, label = finished.summary, finished.label
        self._status(f"Level {finished.index} done: {summary.completed} requests, "
                     f"{summary.output_tok_per_s:,.0f} tok/s", 0)
        self.log_view.append([f"{NOTE_PREFIX}level {label}: {note}" for note in level_notes(summary)])
        plan = self.live.plan
        limit = limit_figures(plan, summary) if plan is not None else None
        if limit is not None:
            self.log_view.append([f"{NOTE_PREFIX}level {label}: {limit.text()} ({limit.detail()})"])
        self.dashboard.roofline.add_level(label, limit)
        window_s = self.live.steady_window_s(finished, self.series.t0_wall)
        if window_s is not None:  # the level's steady window, shaded on the live plots
            for plots in (self.dashboard.plots, self.presentation.plots):
                plots.mark_window(*window_s, f"steady: {label}")
        flagged = summary.unreliable()  # the run flagged these: live tiles switch to the engine's own
        for row in self.tile_rows:
            row.flagged.update(flagged)

    def _noticed(self, notice: Notice) -> None:
        self._status(notice.message, 10_000)

    def _finished(self, outcome: RunFinished) -> None:
        self._stop_live_findings()  # the stored run's findings come next (show_summary)
        text = f"Run {outcome.status}" + (f": {outcome.reason}" if outcome.reason else "")
        self.phase_bar.finished(text, outcome.status == "completed")

    def refresh_live_findings(self) -> None:
        """Read the running run's findings again in a worker, when something new arrived since
        the last reading and none is under way (the GUI thread only draws the reply)."""
        if self._live_reading or not self.live_findings.changed:
            return
        generation, title = self._live_generation, self._live_title
        self._live_reading = True

        def done(findings: list[Finding]) -> None:
            self._live_reading = False
            if generation == self._live_generation and findings:
                self._live_drawing = True
                try:
                    self.findings.show_findings(findings, title)
                finally:
                    self._live_drawing = False

        def failed(message: str) -> None:
            self._live_reading = False
            if generation == self._live_generation:
                self._status(f"findings so far not read: {message}", 10_000)

        run_in_worker(self.live_findings.findings, done, failed, name="live findings", parent=self)

    def _stop_live_findings(self) -> None:
        self._live_timer.stop()
        self._live_generation += 1
        self._live_warnings = 0

    def apply_support(self, _support: TelemetrySupport | None = None) -> None:
        """GPU plots and tiles where there is a GPU; host memory and CPU stand in elsewhere."""
        has_gpu = self.live.has_gpu
        note = "" if has_gpu else \
            "No NVIDIA GPU here: host memory and CPU stand in for GPU memory, bandwidth and utilization."
        self.dashboard.set_support(has_gpu, note)
        self.presentation.plots.set_gpu_mode(has_gpu)

    # -- drawn by the window -----------------------------------------------------------------------

    def show_feature_checks(self, checks: list[FeatureCheck]) -> None:
        """Whether each requested feature really took effect, in the engine's own words."""
        parts = []
        for check in checks:
            label = next((f.label for f in FEATURES if f.key == check.key), check.key)
            colour = CHECK_COLOURS[check.status]
            word = feature_status_text(check, evidence=False)
            parts.append(f'<span style="color:{colour}" title="{html.escape(feature_status_text(check))}">'
                         f"{html.escape(label)} = {html.escape(check.requested)}: {word}</span>")
        self.checks_label.setText("Features: " + " · ".join(parts) if parts else "")
        self.checks_label.setVisible(bool(parts))

    def clear(self, idle_text: str) -> None:
        """Forget the last run's graphs and figures (a new profile, a new run)."""
        self.live.clear()
        self.series.clear()
        self.dashboard.reset()
        self.presentation.reset()
        self.dashboard.tiles.set_header("")
        self.presentation.tiles.set_header("")
        self.show_feature_checks([])
        self._stop_live_findings()
        self.findings.clear()
        self.bottom.setTabText(1, "Findings")
        self.bottom.setCurrentWidget(self.log_view)
        self.presentation.set_finding("")
        self.dashboard.show_idle(idle_text)

    def show_summary(self, result: RunResult) -> bool:
        """After a run, the tiles show its summary (the last level's), labelled as such; False
        when no level measured a request."""
        levels = [lv for lv in result.levels if lv.summary.requests]
        if not levels:
            return False
        level = levels[-1]
        which = f", {level.label}" + (f" (the last of {len(result.levels)} levels)" if len(result.levels) > 1 else "")
        header = (f"Run summary \u2014 {result.name}{which}: {level.summary.completed:,} requests in "
                  f"{level.summary.duration_s:,.1f} s ({result.status})")
        figures, unreliable = level.summary.figures(), level.summary.unreliable()
        for row in self.tile_rows:
            row.show_summary(figures, unreliable, header)
        plan = self.live.plan
        limit = limit_figures(plan, level.summary) if plan is not None else None
        self.dashboard.show_limit(limit)
        self.presentation.tiles.show_limit(limit)
        if result.run_id:  # what the stored run says about itself, in the Findings tab beside the log
            self.findings.show_run(result.run_id, f"run {result.name}")
        return True

    def _findings_shown(self, findings: list[Finding]) -> None:
        """The presentation's live page reads out the first warning (nothing when there is none)."""
        lead = headline_finding(findings)
        self.presentation.set_finding(first_sentence(lead.explanation) if lead is not None else "")
        warnings = sum(f.severity == "warning" for f in findings)
        self.bottom.setTabText(1, f"Findings ({warnings} warning{'s' if warnings != 1 else ''})" if findings
                               else "Findings")
        if not findings:
            return
        if self._live_drawing:  # during the run: the log stays in front until a new warning comes
            if warnings <= self._live_warnings:
                return
            self._live_warnings = warnings
        self.bottom.setCurrentWidget(self.findings)
        sizes = self.split.sizes()
        room = sum(sizes) - DASHBOARD_KEEPS_PX  # what the dashboard can give without squeezing its plots
        if room > sizes[1]:
            self.split.setSizes([sum(sizes) - room, room])

    def show_cost(self, cost: RunCost) -> None:
        for row in self.tile_rows:
            if cost.output.usd is None:
                row.show_cost("n/a", "no cost", cost.reason or "")
            else:
                row.show_cost(usd_text(cost.output.usd), cost.price_text(), cost.note or "")
