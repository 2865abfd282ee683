"""The workbench window: configuration on the left; live view, history and compare on the right;
presentation mode on F11 / Ctrl+P.

Threading: the GUI thread only drains the bus (a QTimer at 20 Hz), updates widgets and starts
workers. Runs, engine stops, store queries, profile files and validation all run in
:class:`app.gui.workers.Worker` threads; their errors come back as one-line messages shown in
the banner, never as tracebacks.
"""

from __future__ import annotations

import html
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.bus import Bus, Event, Sample
from app.config import RunConfig
from app.gui.availability import Availability, compute_availability
from app.gui.config_panel import ConfigPanel, ConfigState
from app.gui.dashboard import Dashboard
from app.gui.export_dialog import ExportDialog
from app.gui.history import CompareView, HistoryView
from app.gui.live import LogView, PhaseBar
from app.gui.presentation import PresentationView
from app.gui.series import SeriesKey, SeriesStore
from app.gui.session import EngineSession
from app.gui.settings import GuiSettings, load_settings, save_settings
from app.gui.workers import Worker, busy_workers, run_in_worker
from app.load.metrics import LevelSummary, client_starved, level_notes
from app.profiles import ProfileError, load_profile, save_profile, shipped_profiles
from app.runner import RunResult
from db.compare import Comparison, compare_runs
from db.store import RunInfo, RunStore
from engine_adapters.base import FlagSet, ValidationIssue
from engine_adapters.features import FEATURES
from engine_adapters.hardware import HardwareInfo, probe_hardware
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import RuntimeErrorMessage

REFRESH_HZ = 20
TILE_FROM_PROGRESS = {"done": "requests_done", "errors": "errors", "output_tok_per_s": "output_tok_per_s"}


class MainWindow(QMainWindow):
    def __init__(self, config: RunConfig | None = None, profile_path: Path | None = None, *,
                 db_path: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("tunebench")
        self.resize(1500, 920)
        self.db_path = db_path
        self.state = ConfigState(config or RunConfig())
        self.profile_path = profile_path
        self.settings = GuiSettings()
        self.shipped = shipped_profiles()  # listed once, before the event loop runs
        self.bus = Bus()
        # Request records are the store's business; the window needs samples and run events.
        self.sub = self.bus.subscribe(maxlen=500_000, kinds=(
            "sample", "phase", "log", "run_started", "engine_ready", "level_started", "level_finished", "progress",
            "telemetry_support", "notice", "run_finished"))
        self.series = SeriesStore()
        self.latest: dict[SeriesKey, float] = {}
        self.session = EngineSession()
        self.cancel: threading.Event | None = None
        self.run_worker: Worker | None = None
        self.last_result: RunResult | None = None
        self.store: RunStore | None = None
        self._store_lock = threading.Lock()
        self.flags: FlagSet | None = None
        self.hardware: HardwareInfo | None = None
        self.availability: Availability | None = None
        self.has_gpu = False
        self._support: dict[str, dict[str, Any]] = {}
        self._close_requested = False
        self._close_ready = False
        self._shutting_engine = False
        self._validation_pending = False
        self._validation_running = False
        self._compare_ids: list[int] = []
        self._build()
        self.timer = QTimer(self)
        self.timer.setInterval(int(1000 / REFRESH_HZ))
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        self._startup_checks()

    # -- layout --------------------------------------------------------------------------------

    def _build(self) -> None:
        toolbar = QToolBar("Main")
        toolbar.setMovable(False)
        self.addToolBar(toolbar)
        self.toolbar = toolbar
        toolbar.addWidget(QLabel(" Profile: "))
        self.profile_picker = QComboBox()
        self.profile_picker.setMinimumWidth(220)
        self.profile_picker.setToolTip("Shipped and recent profiles")
        toolbar.addWidget(self.profile_picker)
        self.open_action = QAction("Open…", self)
        self.open_action.setShortcut(QKeySequence.StandardKey.Open)
        self.save_action = QAction("Save", self)
        self.save_action.setShortcut(QKeySequence.StandardKey.Save)
        self.save_as_action = QAction("Save as…", self)
        for action in (self.open_action, self.save_action, self.save_as_action):
            toolbar.addAction(action)
        toolbar.addSeparator()
        self.start_button = QPushButton("▶ Start")
        self.start_button.setObjectName("start")
        self.stop_button = QPushButton("■ Stop")
        self.stop_button.setObjectName("stop")
        self.stop_button.setEnabled(False)
        self.keep_engine = QCheckBox("Keep engine running between runs")
        self.keep_engine.setToolTip("Later runs with the same engine and features reuse the running engine "
                                    "(a start takes about a minute); changing either restarts it.")
        toolbar.addWidget(self.start_button)
        toolbar.addWidget(self.stop_button)
        toolbar.addWidget(self.keep_engine)
        toolbar.addSeparator()
        self.present_action = QAction("Presentation (F11)", self)
        toolbar.addAction(self.present_action)

        self.banner = QLabel("")
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.setVisible(False)
        self.banner_close = QPushButton("Dismiss")
        self.banner_close.setVisible(False)
        self.banner_close.clicked.connect(lambda: self.show_banner(None))

        self.config_panel = ConfigPanel(self.state)
        self.config_panel.validation_requested = self._validate

        self.phase_bar = PhaseBar()
        self.dashboard = Dashboard()
        self.log_view = LogView()
        live = QWidget()
        live_layout = QVBoxLayout(live)
        live_layout.setContentsMargins(4, 4, 4, 4)
        live_layout.addWidget(self.phase_bar)
        self.checks_label = QLabel("")
        self.checks_label.setObjectName("featureChecks")
        self.checks_label.setWordWrap(True)
        self.checks_label.setVisible(False)
        live_layout.addWidget(self.checks_label)
        live_split = QSplitter(Qt.Orientation.Vertical)
        live_split.addWidget(self.dashboard)
        live_split.addWidget(self.log_view)
        live_split.setSizes([640, 200])
        live_layout.addWidget(live_split, 1)

        self.history = HistoryView()
        self.compare = CompareView()
        self.tabs = QTabWidget()
        self.tabs.addTab(live, "Live")
        self.tabs.addTab(self.history, "History")
        self.tabs.addTab(self.compare, "Compare")

        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        banner_row = QHBoxLayout()
        banner_row.addWidget(self.banner, 1)
        banner_row.addWidget(self.banner_close)
        right_layout.addLayout(banner_row)
        right_layout.addWidget(self.tabs, 1)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.config_panel)
        split.addWidget(right)
        split.setSizes([430, 1070])
        self.presentation = PresentationView()
        self.stack = QStackedWidget()
        self.stack.addWidget(split)
        self.stack.addWidget(self.presentation)
        self.setCentralWidget(self.stack)
        self.statusBar().showMessage("Ready")

        self.profile_picker.activated.connect(self._profile_picked)
        self.open_action.triggered.connect(self._open_profile_dialog)
        self.save_action.triggered.connect(self._save_profile)
        self.save_as_action.triggered.connect(lambda: self._save_profile(ask=True))
        self.start_button.clicked.connect(self.start_run)
        self.stop_button.clicked.connect(self.stop_run)
        self.present_action.triggered.connect(self.toggle_presentation)
        for key in ("F11", "Ctrl+P"):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.setContext(Qt.ShortcutContext.ApplicationShortcut)
            shortcut.activated.connect(self.toggle_presentation)
        escape = QShortcut(QKeySequence("Escape"), self)
        escape.activated.connect(self._leave_presentation)
        self.history.refresh_requested.connect(self.refresh_history)
        self.history.compare_requested.connect(self.compare_runs)
        self.history.export_requested.connect(lambda ids: self.open_export(run_ids=ids))
        self.history.rename_requested.connect(lambda i, n: self._store_call(lambda s: s.rename(i, n)))
        self.history.tag_requested.connect(lambda i, a, r: self._store_call(lambda s: s.tag(i, a, r)))
        self.history.delete_requested.connect(self._delete_runs)
        self.compare.baseline_changed.connect(lambda rid: self.compare_runs(self._compare_ids, baseline=rid))
        self.compare.export_requested.connect(lambda: self.open_export(run_ids=self._compare_ids, comparison=True))
        self.tabs.currentChanged.connect(self._tab_changed)
        self._fill_profile_picker()

    # -- messages ------------------------------------------------------------------------------

    def show_banner(self, text: str | None, error: bool = True) -> None:
        """Worker errors and run failures, in words, above the tabs."""
        self.banner.setText(text or "")
        colours = ("#fce8e6", "#a50e0e") if error else ("#e6f4ea", "#137333")
        self.banner.setStyleSheet(f"background: {colours[0]}; color: {colours[1]}; padding: 6px; border-radius: 4px;")
        self.banner.setVisible(bool(text))
        self.banner_close.setVisible(bool(text))

    def _error(self, message: str) -> None:
        self.show_banner(message)
        self.statusBar().showMessage(message, 10_000)

    # -- startup: settings, hardware, flags, history ---------------------------------------------

    def _startup_checks(self) -> None:
        run_in_worker(load_settings, self._settings_loaded, self._error, name="settings", parent=self)
        self.phase_bar.set_text("Checking hardware and the installed engine…")
        self._probe_engine()
        self.refresh_history()
        self.state.changed.connect(self._config_changed)

    def _probe_engine(self) -> None:
        """Hardware fingerprint and the configured runtime's flags (the first discovery runs the
        engine's --help, ~10 s; then it is cached by version)."""
        engine = self.state.config.engine
        self._probed_runtime = engine.runtime.model_dump_json() + engine.kind

        def probe() -> tuple[HardwareInfo, FlagSet | None, str | None]:
            hardware = probe_hardware()
            if engine.runtime.kind == "docker":
                return hardware, None, "flags are not checked for docker images"
            try:
                flags = get_adapter(engine.kind).discover_flags(engine)
                note = None
            except (RuntimeErrorMessage, OSError, ValueError) as exc:
                flags, note = None, f"flags not checked against the installed engine: {exc}"
            return hardware, flags, note

        run_in_worker(probe, self._probed, self._error, name="probe", parent=self)

    def _config_changed(self, path: str) -> None:
        engine = self.state.config.engine
        if engine.runtime.model_dump_json() + engine.kind != getattr(self, "_probed_runtime", None):
            self._probe_engine()

    def _settings_loaded(self, settings: GuiSettings) -> None:
        self.settings = settings
        self.config_panel.set_recent_models(settings.recent_models)
        self._fill_profile_picker()

    def _probed(self, result: tuple[HardwareInfo, FlagSet | None, str | None]) -> None:
        self.hardware, self.flags, note = result
        self.has_gpu = self.has_gpu or self.hardware.has_gpu
        self._apply_support()
        engine_text = f"{get_adapter(self.state.config.engine.kind).display_name} {self.flags.version}" \
            if self.flags else "engine version unknown"
        self.phase_bar.set_text(f"Idle — {self.hardware.summary()}; {engine_text}")
        if note:
            self.statusBar().showMessage(note, 15_000)
        self._refresh_availability()
        self._validate()

    def _refresh_availability(self) -> None:
        if self.hardware is None:
            return
        config, hardware, flags = self.state.config, self.hardware, self.flags
        run_in_worker(lambda: compute_availability(config, hardware, flags), self._availability_ready,
                      self._error, name="availability", parent=self)

    def _availability_ready(self, availability: Availability) -> None:
        self.availability = availability
        self.config_panel.apply_availability(availability)

    # -- validation ------------------------------------------------------------------------------

    def _validate(self) -> None:
        """Adapter validation in a worker; a newer request waits for the running one."""
        if self.hardware is None:
            return
        if self._validation_running:
            self._validation_pending = True
            return
        self._validation_running = True
        config, hardware, flags = self.state.config, self.hardware, self.flags
        adapter = get_adapter(config.engine.kind)

        def check() -> list[ValidationIssue]:
            try:
                return adapter.validate(config.engine, config.features, flags, hardware)
            except RuntimeErrorMessage as exc:
                return [ValidationIssue("engine", str(exc))]

        run_in_worker(check, self._validated, self._validation_failed, name="validate", parent=self)

    def _validated(self, issues: list[ValidationIssue]) -> None:
        self._validation_running = False
        self.issues = issues
        self.config_panel.show_issues(issues)
        errors = [i for i in issues if i.severity == "error"]
        self.start_button.setToolTip("\n".join(str(i) for i in errors) if errors else "Launch the engine and run the load")
        if self._validation_pending:
            self._validation_pending = False
            self._validate()

    def _validation_failed(self, message: str) -> None:
        self._validation_running = False
        self._error(message)

    # -- profiles --------------------------------------------------------------------------------

    def _fill_profile_picker(self) -> None:
        picker = self.profile_picker
        picker.blockSignals(True)
        picker.clear()
        picker.addItem("— choose a profile —", None)
        for stem, path in sorted(self.shipped.items()):
            picker.addItem(f"{stem} (shipped)", str(path))
        for recent in self.settings.recent_profiles:
            if picker.findData(recent) < 0:
                picker.addItem(f"{Path(recent).name} (recent)", recent)
        if self.profile_path is not None:
            index = picker.findData(str(self.profile_path))
            picker.setCurrentIndex(max(index, 0))
        picker.blockSignals(False)

    def _profile_picked(self, index: int) -> None:
        path = self.profile_picker.itemData(index)
        if path:
            self.open_profile(Path(path))

    def _open_profile_dialog(self) -> None:
        start = str(self.profile_path.parent) if self.profile_path else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Open profile", start, "Profiles (*.toml);;All files (*)")
        if path:
            self.open_profile(Path(path))

    def open_profile(self, path: Path) -> None:
        """Load in a worker; a bad file leaves the current configuration untouched."""
        def loaded(config: RunConfig) -> None:
            self.profile_path = path
            self.state.replace(config)
            self.setWindowTitle(f"tunebench — {path.name}")
            self.statusBar().showMessage(f"Opened {path}", 5000)
            self.show_banner(None)
            if str(path) not in {str(p) for p in self.shipped.values()}:
                self._remember("recent_profiles", str(path))
            self._fill_profile_picker()
            self._refresh_availability()

        run_in_worker(lambda: load_profile(path), loaded, self._error, name="open-profile", parent=self)

    def _save_profile(self, ask: bool = False) -> None:
        path = self.profile_path
        shipped = {str(p) for p in self.shipped.values()}
        if ask or path is None or str(path) in shipped:
            suggested = str(Path.home() / f"{self.state.config.name or 'profile'}.toml")
            chosen, _ = QFileDialog.getSaveFileName(self, "Save profile", suggested, "Profiles (*.toml)")
            if not chosen:
                return
            path = Path(chosen)
        self.save_profile_to(path)

    def save_profile_to(self, path: Path) -> None:
        problems = self.config_panel.problems()
        if problems:
            self._error("Not saved, the configuration has unfinished edits: " + "; ".join(problems))
            return
        config = self.state.config

        def saved(_: Any) -> None:
            self.profile_path = path
            self.setWindowTitle(f"tunebench — {path.name}")
            self.statusBar().showMessage(f"Saved {path}", 5000)
            self._remember("recent_profiles", str(path))
            self._fill_profile_picker()

        def write() -> Path:
            try:
                return save_profile(config, path)
            except OSError as exc:
                raise ProfileError(f"{path}: cannot write: {exc.strerror}") from None

        run_in_worker(write, saved, self._error, name="save-profile", parent=self)

    def _remember(self, kind: str, value: str) -> None:
        self.settings = self.settings.remember(kind, value)
        settings = self.settings
        run_in_worker(lambda: save_settings(settings), None, self._error, name="save-settings", parent=self)
        if kind == "recent_models":
            self.config_panel.set_recent_models(settings.recent_models)

    # -- runs ----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.run_worker is not None

    def start_run(self) -> None:
        if self.running or self._close_requested:
            return
        problems = self.config_panel.problems()
        if problems:
            self._error("Cannot start: " + "; ".join(problems))
            return
        errors = [i for i in getattr(self, "issues", []) if i.severity == "error"]
        if errors:
            self._error("Cannot start: " + "; ".join(f"{i.field}: {i.message}" for i in errors))
            return
        config = self.state.config
        self.show_banner(None)
        self.series.clear()
        self.latest.clear()
        self.dashboard.reset()
        self.presentation.reset()
        self.log_view.clear()
        self.show_feature_checks([])
        self.cancel = threading.Event()
        cancel, keep, bus, session, db_path = self.cancel, self.keep_engine.isChecked(), self.bus, self.session, self.db_path
        self.run_worker = run_in_worker(
            lambda: session.run(config, bus, cancel, keep_engine=keep, db_path=db_path),
            self._run_done, self._run_failed, name="run", parent=self)
        self._set_running(True)
        self.phase_bar.set_text("Starting…", 2)
        self.presentation.set_heading(config.name, f"{config.engine.model} · {config.load.pattern} load, "
                                      f"concurrency {config.load.concurrency}")
        self._remember("recent_models", config.engine.model)
        self.tabs.setCurrentIndex(0)

    def stop_run(self) -> None:
        if self.cancel is not None and not self.cancel.is_set():
            self.cancel.set()
            self.stop_button.setEnabled(False)
            self.phase_bar.set_text("Stopping: cancelling requests and stopping the engine…")
            self.statusBar().showMessage("Stopping…")

    def _set_running(self, running: bool) -> None:
        self.start_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.keep_engine.setEnabled(not running)
        self.config_panel.setEnabled(not running)
        self.profile_picker.setEnabled(not running)
        self.open_action.setEnabled(not running)

    def _run_done(self, result: RunResult) -> None:
        self.last_result = result
        self._after_run()
        if result.status == "failed":
            self._error(f"Run failed: {result.reason}")
            self.log_view.show_diagnosis(result.reason)
        elif result.status == "cancelled":
            self.show_banner(f"Run cancelled: {result.reason or 'stopped by the user'}", error=False)
        else:
            starved = [lv.label for lv in result.levels if client_starved(lv.summary)]
            caveat = (f" — the client was starved of CPU at {', '.join(starved)}: its TTFT/ITL are late and "
                      "bunched; the engine-side means in the log are the ones to trust" if starved else "")
            self.show_banner(f"Run completed: {self._result_line(result)}{caveat}", error=False)

    @staticmethod
    def _result_line(result: RunResult) -> str:
        parts = []
        for level in result.levels:
            flat = level.summary.flat()
            tok = flat.get("output_tok_per_s")
            ttft = flat.get("ttft_ms_p50")
            parts.append(f"{level.label}: " + ", ".join(
                x for x in (f"{tok:,.0f} tok/s" if isinstance(tok, int | float) else "",
                            f"TTFT p50 {ttft:,.0f} ms" if isinstance(ttft, int | float) else "") if x))
        return "; ".join(parts) or "no requests measured"

    def _run_failed(self, message: str) -> None:
        self._after_run()
        self._error(f"Run failed: {message}")
        self.log_view.show_diagnosis(message)
        self.phase_bar.set_phase("failed", message)

    def _after_run(self) -> None:
        self.run_worker = None
        self.cancel = None
        self._set_running(False)
        self._tick()
        self.refresh_history()
        if self._close_requested:
            self._finish_close()

    # -- the bus -------------------------------------------------------------------------------

    def _tick(self) -> None:
        items = self.sub.drain()
        if items:
            samples = [i for i in items if isinstance(i, Sample)]
            self.series.ingest(samples)
            for sample in samples:
                if sample.source == "client":
                    for name, value in sample.values.items():
                        self.latest[("client", name)] = float(value)
                if sample.source.startswith("gpu") and not self.has_gpu:
                    self.has_gpu = True
                    self._apply_support()
            lines: list[str] = []
            for item in items:
                if isinstance(item, Event):
                    if item.kind == "log":
                        lines.append(str((item.payload or {}).get("line", "")))
                    else:
                        self._on_event(item)
            if lines:
                self.log_view.append(lines)
        if self.presenting:
            self.presentation.refresh(self.series, self.latest)
        elif self.tabs.currentIndex() == 0:
            self.dashboard.refresh(self.series, self.latest)

    def _on_event(self, event: Event) -> None:
        p = event.payload if isinstance(event.payload, dict) else {}
        kind = event.kind
        if kind == "phase":
            self.phase_bar.set_phase(str(p.get("phase", "")), str(p.get("detail", "")))
        elif kind == "run_started":
            self.statusBar().showMessage(f"Run {p.get('name')} started ({p.get('engine_kind')} "
                                         f"{p.get('engine_version') or ''})")
        elif kind == "engine_ready":
            startup = p.get("startup_s")
            checks = p.get("feature_checks") or []
            lines = [f"tunebench: engine ready at {p.get('base_url')}" +
                     (f" after {startup:.1f} s" if isinstance(startup, int | float) else "")]
            for check in checks:
                state = {True: "active", False: "NOT ACTIVE", None: "unknown"}.get(check.get("active"))
                lines.append(f"tunebench: feature {check.get('key')}={check.get('requested')}: {state} "
                             f"({check.get('evidence')})")
            self.log_view.append(lines)
            self.phase_bar.set_phase("ready", "running the load")
            self.show_feature_checks(checks)
        elif kind == "level_started":
            self.statusBar().showMessage(f"Level {p.get('index')}: {p.get('label')}")
        elif kind == "level_finished":
            summary = p.get("summary") or {}
            tok = summary.get("output_tok_per_s")
            self.statusBar().showMessage(f"Level {p.get('index')} done: {summary.get('completed', '?')} requests"
                                         + (f", {tok:,.0f} tok/s" if isinstance(tok, int | float) else ""))
            try:
                notes = level_notes(LevelSummary.model_validate(summary))
            except ValidationError:
                notes = []
            self.log_view.append([f"tunebench: level {p.get('label', p.get('index'))}: {note}" for note in notes])
        elif kind == "progress":
            for key, tile in TILE_FROM_PROGRESS.items():
                value = p.get(key)
                if isinstance(value, int | float):
                    self.latest[("client", tile)] = float(value)
        elif kind == "telemetry_support":
            self._support[str(p.get("source"))] = p
            if str(p.get("source", "")).startswith("gpu") and p.get("available"):
                self.has_gpu = True
            self._apply_support()
        elif kind == "notice":
            self.statusBar().showMessage(str(p.get("message", "")), 10_000)
        elif kind == "run_finished":
            status = p.get("status")
            self.phase_bar.set_text(f"Run {status}" + (f": {p.get('reason')}" if p.get("reason") else ""), 100
                                    if status == "completed" else None)

    def show_feature_checks(self, checks: list[dict[str, Any]]) -> None:
        """Whether each requested feature really took effect, in the engine's own words."""
        parts = []
        for check in checks:
            key = str(check.get("key", ""))
            label = next((f.label for f in FEATURES if f.key == key), key)
            active = check.get("active")
            if active is True:
                colour, word = "#188038", "active"
            elif active is False:
                colour, word = "#d93025", "NOT active"
            else:
                colour, word = "#b06000", "not confirmed"
            parts.append(f'<span style="color:{colour}" title="{html.escape(str(check.get("evidence", "")))}">'
                         f"{html.escape(label)} = {html.escape(str(check.get('requested')))}: {word}</span>")
        self.checks_label.setText("Features: " + " · ".join(parts) if parts else "")
        self.checks_label.setVisible(bool(parts))

    def _apply_support(self) -> None:
        if self.has_gpu:
            note = ""
        else:
            note = ("No NVIDIA GPU here: the dashboard shows host and engine series (host memory and CPU "
                    "in place of GPU memory, bandwidth and utilization).")
        self.dashboard.set_support(self.has_gpu, note)
        self.presentation.plots.set_gpu_mode(self.has_gpu)

    # -- presentation --------------------------------------------------------------------------

    @property
    def presenting(self) -> bool:
        return self.stack.currentIndex() == 1

    def _leave_presentation(self) -> None:
        if self.presenting:
            self.toggle_presentation()

    def _close_step_failed(self, message: str) -> None:
        self._error(message)
        self._finish_close()

    def toggle_presentation(self) -> None:
        if self.presenting:
            self.stack.setCurrentIndex(0)
            self.toolbar.setVisible(True)
            self.statusBar().setVisible(True)
            self.showNormal()
        else:
            self.stack.setCurrentIndex(1)
            self.toolbar.setVisible(False)
            self.statusBar().setVisible(False)
            self.showFullScreen()
        self._tick()

    # -- history, compare, export ----------------------------------------------------------------

    def _with_store(self, fn: Any) -> Any:
        """Run ``fn(store)`` (in a worker); the store is opened on first use."""
        with self._store_lock:
            if self.store is None:
                self.store = RunStore(self.db_path)
            store = self.store
        return fn(store)

    def refresh_history(self) -> None:
        run_in_worker(lambda: self._with_store(lambda s: s.list_runs(limit=5000)), self._history_loaded,
                      self._error, name="history", parent=self)

    def _history_loaded(self, runs: list[RunInfo]) -> None:
        self.history.set_runs(runs)

    def _store_call(self, fn: Any) -> None:
        run_in_worker(lambda: self._with_store(fn), lambda _r: self.refresh_history(), self._error,
                      name="store-edit", parent=self)

    def _delete_runs(self, ids: list[int]) -> None:
        def delete(store: RunStore) -> None:
            for run_id in ids:
                store.delete(run_id)
        self._store_call(delete)

    def compare_runs(self, ids: list[int], baseline: int | None = None) -> None:
        if len(ids) < 2:
            self._error("Select at least two runs to compare.")
            return
        self._compare_ids = list(ids)
        run_in_worker(lambda: self._with_store(lambda s: compare_runs(s, ids, baseline)), self._compared,
                      self._error, name="compare", parent=self)

    def _compared(self, comparison: Comparison) -> None:
        self.compare.show_comparison(comparison)
        self.tabs.setCurrentWidget(self.compare)

    def open_export(self, run_ids: list[int], comparison: bool = False) -> ExportDialog:
        dialog = ExportDialog(self, run_ids=run_ids, comparison=comparison)
        dialog.show()
        return dialog

    def _tab_changed(self, index: int) -> None:
        if index == 1:
            self.refresh_history()
        self._tick()

    # -- closing -------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt API
        if self._close_ready:
            event.accept()
            return
        if self.running and not self._close_requested:
            answer = QMessageBox.question(
                self, "Stop the run?", "A run is in progress. Stop it, stop the engine and close?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
            if answer != QMessageBox.StandardButton.Yes:
                event.ignore()
                return
        self._close_requested = True
        event.ignore()
        self.stop_run()
        self._finish_close()

    def _finish_close(self) -> None:
        """Closing never waits on the GUI thread: each step finishes in a worker, then retries."""
        if self.running:
            return  # _after_run calls back
        if self.session.engine is not None and not self._shutting_engine:
            self._shutting_engine = True
            self.phase_bar.set_text("Stopping the engine…")
            run_in_worker(self.session.shutdown, lambda _r: self._finish_close(),
                          self._close_step_failed, name="engine-stop", parent=self)
            return
        if busy_workers():
            QTimer.singleShot(50, self._finish_close)
            return
        if self.store is not None:
            store, self.store = self.store, None
            run_in_worker(store.close, lambda _r: self._finish_close(),
                          self._close_step_failed, name="store-close", parent=self)
            return
        self.timer.stop()
        self.bus.unsubscribe(self.sub)
        self._close_ready = True
        self.close()


def bring_up(window: MainWindow) -> None:
    """Show the window (used by ``tunebench gui`` and the screenshot script)."""
    window.show()
    app = QApplication.instance()
    if app is not None:
        app.setApplicationName("tunebench")
