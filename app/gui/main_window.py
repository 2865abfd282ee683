"""The workbench window: configuration and the run bar (name, note, Start) on the left; live
view, history and compare on the right; presentation mode (live, or before/after of two runs)
on F11 / Ctrl+P.

Threading: the GUI thread only drains the bus (a QTimer at 20 Hz), updates widgets and starts
workers. Runs, engine stops, store queries, profile files and validation all run in
:class:`app.gui.workers.Worker` threads; their errors come back as one-line messages shown in
the banner, never as tracebacks.

Why one module: the window is the one place that wires the panels to the bus timer,
the workers and the session (closing included); each panel is its own module, and no figure is
computed here.
"""

from __future__ import annotations

import hashlib
import html
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.analysis import metric_catalog as catalog
from app.analysis.compare import Comparison
from app.bus import Bus, Event, Sample
from app.config import RunConfig
from app.cost import PriceTable, RunCost, live_cost_basis, price_table, run_cost, usd_text
from app.engines import CheckReport, check_config
from app.errors import UserError
from app.events import (
    CLIENT_SOURCE,
    NOTE_PREFIX,
    EngineReady,
    LevelFinished,
    LevelStarted,
    LogLine,
    Notice,
    PhaseChanged,
    Progress,
    RunFinished,
    RunStarted,
    TelemetrySupport,
)
from app.gui.availability import Availability, compute_availability, judge_here
from app.gui.capacity_box import CapacityBox
from app.gui.config_panel import ConfigPanel, ConfigState
from app.gui.dashboard import Dashboard
from app.gui.export_dialog import ExportDialog
from app.gui.history import CompareExtras, CompareView, HistoryView, compare_with_extras
from app.gui.ladder_tab import LadderTab
from app.gui.live import LogView, PhaseBar
from app.gui.presentation import CurrentPageStack, PresentationView
from app.gui.repeats import run_work
from app.gui.run_bar import RunBar
from app.gui.series import SeriesKey, SeriesStore
from app.gui.session import EngineSession
from app.gui.settings import GuiSettings, load_settings, save_settings, settings_path
from app.gui.store_box import StoreDialog, shown_location
from app.gui.tune_tab import TuneTab
from app.gui.workers import Worker, busy_workers, run_in_worker
from app.labels import engine_defaults, features_on, suggest_run_name
from app.load.metrics import LevelSummary, level_notes
from app.planner.live import limit_figures, plan_for_run
from app.planner.plan import Plan
from app.profiles import ProfileError, load_profile, save_profile, shipped_profiles
from app.runner import RunResult
from app.store import DB_ENV, RunInfo, RunStore
from db.writes import AUTHOR_ENV, default_author
from engine_adapters.base import (
    FeatureCheck,
    FlagSet,
    ValidationIssue,
    feature_check_line,
    feature_status_text,
)
from engine_adapters.features import FEATURES
from engine_adapters.hardware import HardwareInfo
from engine_adapters.registry import get_adapter, maturity
from engine_adapters.secrets import mask_text

REFRESH_HZ = 20
CHECK_COLOURS = {"verified": "#188038", "accepted": "#b06000", "not active": "#d93025", "unknown": "#5f6368"}
"""Feature-check colours: green only for an effect measured, amber for an echo alone."""
LIVE_SOURCES = (CLIENT_SOURCE, "engine")
"""Sources whose latest values the tiles read (the client's rolling figures, the engine's own)."""


def startup_key(config: RunConfig) -> str:
    """The key under which an engine's last start time is remembered: its engine, runtime and
    model (what a start spends its time on: loading and warming the model), not its features."""
    return hashlib.sha256(config.engine.model_dump_json().encode()).hexdigest()[:16]


HISTORY_POLL_MS = 5000
"""While History lists a running run, it is read again this often: a run another workbench records
into a shared store finishes there, not here."""


class MainWindow(QMainWindow):
    def __init__(self, config: RunConfig | None = None, profile_path: Path | None = None, *,
                 db_path: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("tunebench")
        self.resize(1366, 768)
        self.db_path = db_path
        # --db, then TUNEBENCH_DB, win over the location chosen in Run database… (as in docs/store.md)
        self._explicit_db = db_path is not None or bool(os.environ.get(DB_ENV, "").strip())
        self._author_from_env = bool(os.environ.get(AUTHOR_ENV, "").strip())  # as --db: wins over the settings
        self._history_from: str | None = None  # the location History's table was read from
        self._history_poll = QTimer(self)
        self._history_poll.setSingleShot(True)
        self._history_poll.setInterval(HISTORY_POLL_MS)
        self._history_poll.timeout.connect(self.refresh_history)
        self._location_known = threading.Event()  # set once --db or the settings say which store to open
        if self._explicit_db:
            self._location_known.set()
        self.state = ConfigState(config or RunConfig())
        self.profile_path = profile_path
        self.settings = GuiSettings()
        self.shipped = shipped_profiles()  # listed once, before the event loop runs
        self.bus = Bus()
        # Request records are the store's business; the window needs samples and run events.
        self.sub = self.bus.subscribe(maxlen=500_000, kinds=(
            Sample, PhaseChanged, LogLine, RunStarted, EngineReady, LevelStarted, LevelFinished, Progress,
            TelemetrySupport, Notice, RunFinished))
        self.series = SeriesStore()
        self._level_started_wall: dict[int, float] = {}
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
        self._support: dict[str, TelemetrySupport] = {}
        self._close_requested = False
        self._close_ready = False
        self._shutting_engine = False
        self._validation_pending = False
        self._validation_running = False
        self._compare_ids: list[int] = []
        self._previous_config: dict[str, Any] | None = None  # the last run's configuration: the name suggestion
        self._run_config: RunConfig | None = None
        self._run_plan: Plan | None = None  # what the running run's rates are measured against
        self._run_note = ""
        self._ticks = 0
        self.issues: list[ValidationIssue] = []
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
        self.profile_picker.setMinimumWidth(200)
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
        self.present_action = QAction("Presentation (F11)", self)
        toolbar.addAction(self.present_action)
        self.store_action = QAction("Run database…", self)
        self.store_action.setToolTip("Where runs are kept (a file, or a team's PostgreSQL database) and the author "
                                     "name new runs carry")
        toolbar.addAction(self.store_action)

        self.run_bar = RunBar()
        self.start_button = self.run_bar.start_button
        self.stop_button = self.run_bar.stop_button
        self.keep_engine = self.run_bar.keep_engine
        self.repeats = self.run_bar.repeats  # app.gui.repeats: N runs of the configuration, each on a cold cache

        self.banner = QLabel("")
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.banner.setVisible(False)
        self.banner_close = QPushButton("Dismiss")
        self.banner_close.setVisible(False)
        self.banner_close.clicked.connect(lambda: self.show_banner(None))

        self.config_panel = ConfigPanel(self.state, engine_defaults=engine_defaults(self.state.config.engine.kind))
        self.config_panel.validation_requested = self._validate
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(4, 4, 0, 4)
        left_layout.setSpacing(4)
        left_layout.addWidget(self.config_panel, 1)
        left_layout.addWidget(self.run_bar)

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
        self.checks_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.checks_label.setVisible(False)
        live_layout.addWidget(self.checks_label)
        live_split = QSplitter(Qt.Orientation.Vertical)
        live_split.addWidget(self.dashboard)
        live_split.addWidget(self.log_view)
        live_split.setSizes([560, 150])
        live_split.setStretchFactor(0, 4)
        live_split.setStretchFactor(1, 1)
        live_layout.addWidget(live_split, 1)

        self.history = HistoryView()
        self.compare = CompareView(with_store=self.with_store)
        self.tabs = QTabWidget()
        self.tabs.addTab(live, "Live")
        self.tabs.addTab(self.history, "History")
        self.tabs.addTab(self.compare, "Compare")
        self.ladder = LadderTab(self)  # app.gui.ladder_tab: the acceleration ladder
        self.tabs.addTab(self.ladder, "Ladder")
        self.tune = TuneTab(self)  # app.gui.tune_tab: the tuner
        self.tabs.addTab(self.tune, "Tune")

        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        banner_row = QHBoxLayout()
        banner_row.addWidget(self.banner, 1)
        banner_row.addWidget(self.banner_close)
        right_layout.addLayout(banner_row)
        right_layout.addWidget(self.tabs, 1)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([400, 966])
        self.desk = split
        self.presentation = PresentationView()
        self.stack = CurrentPageStack()
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
        self.store_action.triggered.connect(self.open_store_dialog)
        for key in ("F11", "Ctrl+P"):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.setContext(Qt.ShortcutContext.ApplicationShortcut)
            shortcut.activated.connect(self.toggle_presentation)
        escape = QShortcut(QKeySequence("Escape"), self)
        escape.activated.connect(self._leave_presentation)
        # L and B switch the presentation's page; enabled only while presenting (they are letters).
        self.page_keys = []
        for key, page in (("L", self.presentation.show_live), ("B", self.presentation.show_before_after)):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.activated.connect(page)
            shortcut.setEnabled(False)
            self.page_keys.append(shortcut)
        self.history.refresh_requested.connect(self.refresh_history)
        self.history.compare_requested.connect(self.compare_runs)
        self.history.export_requested.connect(lambda ids: self.open_export(run_ids=ids))
        self.history.rename_requested.connect(lambda i, n: self._store_call(lambda s: s.rename(i, n)))
        self.history.tag_requested.connect(lambda i, a, r: self._store_call(lambda s: s.tag(i, a, r)))
        self.history.delete_requested.connect(self._delete_runs)
        self.compare.baseline_changed.connect(lambda rid: self.compare_runs(self._compare_ids, baseline=rid))
        self.compare.export_requested.connect(lambda: self.open_export(run_ids=self._compare_ids, comparison=True))
        self.compare.present_requested.connect(self.present_before_after)
        for box in self._capacity_boxes():
            box.prices_changed.connect(self._prices_changed)
        self.tabs.currentChanged.connect(self._tab_changed)
        self._fill_profile_picker()
        self._suggest_name()

    # -- messages ------------------------------------------------------------------------------

    def show_banner(self, text: str | None, error: bool = True) -> None:
        """Worker errors and run failures, in words, above the tabs (secrets masked)."""
        text = mask_text(text) if text else text
        self.banner.setText(text or "")
        colours = ("#fce8e6", "#a50e0e") if error else ("#e6f4ea", "#137333")
        self.banner.setStyleSheet(f"background: {colours[0]}; color: {colours[1]}; padding: 6px; border-radius: 4px;")
        self.banner.setVisible(bool(text))
        self.banner_close.setVisible(bool(text))

    def show_error(self, message: str) -> None:
        self.show_banner(message)
        self.statusBar().showMessage(mask_text(message), 10_000)

    # -- startup: settings, hardware, flags, history ---------------------------------------------

    def _startup_checks(self) -> None:
        run_in_worker(load_settings, self._settings_loaded, self._settings_failed, name="settings", parent=self)
        self.phase_bar.set_text("Checking hardware and the installed engine…")
        self._probe_engine()
        if self._explicit_db:  # else the settings may name the store: History is read once they are loaded
            self.refresh_history()
        self.state.changed.connect(self._config_changed)

    def _probe_engine(self) -> None:
        """Hardware fingerprint and the configured runtime's flags (the first discovery runs the
        engine's --help, ~10 s; then it is cached by version)."""
        config = self.state.config
        self._probed_runtime = config.engine.runtime.model_dump_json() + config.engine.kind
        run_in_worker(lambda: check_config(config), self._probed, self.show_error, name="probe", parent=self)

    def _config_changed(self, path: str) -> None:
        engine = self.state.config.engine
        if engine.runtime.model_dump_json() + engine.kind != getattr(self, "_probed_runtime", None):
            self._probe_engine()
        self._suggest_name()

    def _settings_loaded(self, settings: GuiSettings) -> None:
        self.settings = settings
        author = settings.author if not self._author_from_env else os.environ.get(AUTHOR_ENV, "")
        location = settings.store_location if not self._explicit_db and settings.store_location else self.db_path
        if author != os.environ.get(AUTHOR_ENV, "") or location != self.db_path:
            self._use_store(location, author)
        elif not self._explicit_db:
            self.refresh_history()
        self._location_known.set()
        for box in self._capacity_boxes():
            box.set_prices(settings.prices)
        self.config_panel.set_recent_models(settings.recent_models)
        self._fill_profile_picker()

    def _settings_failed(self, message: str) -> None:
        self.show_error(message)
        self._location_known.set()
        if not self._explicit_db:
            self.refresh_history()

    def _probed(self, report: CheckReport) -> None:
        assert report.hardware is not None  # check_config always probes it
        self.hardware, self.flags, note = report.hardware, report.flags, "; ".join(report.notes)
        self.has_gpu = self.has_gpu or self.hardware.has_gpu
        self._apply_support()
        engine_text = f"{get_adapter(self.state.config.engine.kind).display_name} {self.flags.version}" \
            if self.flags else "engine version unknown"
        if (proven := maturity(self.state.config.engine.kind)) is not None:
            engine_text += f" ({proven})"
        if not self.running:
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
                      self.show_error, name="availability", parent=self)

    def _availability_ready(self, availability: Availability) -> None:
        self.availability = availability
        self.config_panel.apply_availability(availability)

    # -- validation ------------------------------------------------------------------------------

    def _validate(self) -> None:
        """Adapter validation (and what this machine can do) in a worker; a newer request waits
        for the running one."""
        if self.hardware is None:
            return
        if self._validation_running:
            self._validation_pending = True
            return
        self._validation_running = True
        config, hardware, flags = self.state.config, self.hardware, self.flags

        def judge() -> list[ValidationIssue]:
            issues = check_config(config, discover_flags=False, hardware=hardware, flags=flags).issues
            return [*issues, *judge_here(config, hardware, issues)]

        run_in_worker(judge, self._validated, self._validation_failed, name="validate", parent=self)

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
        self.show_error(message)

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
            self.config_panel.set_engine_defaults(engine_defaults(config.engine.kind))
            self.setWindowTitle(f"tunebench — {path.name}")
            self.statusBar().showMessage(f"Opened {path}", 5000)
            self.show_banner(None)
            if str(path) not in {str(p) for p in self.shipped.values()}:
                self._remember("recent_profiles", str(path))
            self._fill_profile_picker()
            self._refresh_availability()
            if not self.running:  # the last run's graphs and figures belong to another profile
                self._clear_live(f"Profile \u201c{config.name}\u201d loaded. Press \u25b6 Start to run it.")

        run_in_worker(lambda: load_profile(path), loaded, self.show_error, name="open-profile", parent=self)

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
            self.show_error("Not saved, the configuration has unfinished edits: " + "; ".join(problems))
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

        run_in_worker(write, saved, self.show_error, name="save-profile", parent=self)

    def _remember(self, kind: str, value: str) -> None:
        self.settings = self.settings.remember(kind, value)
        self._save_settings()
        if kind == "recent_models":
            self.config_panel.set_recent_models(self.settings.recent_models)

    def prices(self) -> PriceTable:
        """The shipped prices with yours from the settings on top (a hand-edited settings file with
        a bad price falls back to the shipped list, and says so)."""
        try:
            return price_table(self.settings.prices)
        except UserError as exc:
            self.show_error(f"Your prices in {settings_path()} are not used: {exc}")
            return price_table()

    def _capacity_boxes(self) -> list[CapacityBox]:
        return [box for box in (self.compare.capacity, self.tune.capacity) if box is not None]

    def _prices_changed(self, prices: list[str]) -> None:
        """A sizing succeeded with these prices: keep them, show them in every Capacity box, and
        cost the comparison on screen at them."""
        if prices == self.settings.prices:
            return
        self.settings = self.settings.model_copy(update={"prices": list(prices)})
        self._save_settings()
        for box in self._capacity_boxes():
            box.set_prices(prices)
        self.tune.show_state(self.tune.state)  # its cost axis, at these prices
        self.ladder.show_state(self.ladder.state)  # the staircase's costs
        comparison = self.compare.comparison
        if comparison is not None:
            self.compare_runs(self._compare_ids, baseline=comparison.runs[comparison.baseline].id)

    def _save_settings(self) -> None:
        settings = self.settings
        run_in_worker(lambda: save_settings(settings), None, self.show_error, name="save-settings", parent=self)

    # -- runs ----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.run_worker is not None

    def _suggest_name(self) -> None:
        """The run bar's name: what changed since the last run ("prefix caching on"), or the
        profile's name for a first run."""
        config = self.state.config
        self.run_bar.suggest(suggest_run_name(config.model_dump(mode="json"), self._previous_config, config.name,
                                              engine_defaults=engine_defaults(config.engine.kind)))

    def _clear_live(self, idle_text: str) -> None:
        """Forget the last run's graphs and figures (a new profile, a new run)."""
        self.series.clear()
        self._level_started_wall.clear()
        self.latest.clear()
        self.dashboard.reset()
        self.presentation.reset()
        self.dashboard.tiles.set_header("")
        self.presentation.tiles.set_header("")
        self.show_feature_checks([])
        self.dashboard.show_idle(idle_text)

    def start_run(self) -> None:
        if self.running or self._close_requested:
            return
        problems = self.config_panel.problems()
        if problems:
            self.show_error("Cannot start: " + "; ".join(problems))
            return
        errors = [i for i in self.issues if i.severity == "error"]
        if errors:
            path = self.config_panel.editor_for_issue(errors[0])
            if path is not None:
                self.config_panel.show_field(path)
            self.show_error("Cannot start: " + "; ".join(f"{i.field}: {i.message}" for i in errors))
            return
        name = self.run_bar.run_name() or self.state.config.name
        config = self.state.config.model_copy(update={"name": name})
        self._run_config, self._run_note = config, self.run_bar.run_note()
        self.show_banner(None)
        self._clear_live("")
        self.log_view.clear()
        engine = get_adapter(config.engine.kind).display_name
        self.dashboard.show_startup(f"Starting {engine} on {config.engine.model}")
        self.dashboard.tiles.set_header(f"Live \u2014 {name}: the client's figures over the last few seconds")
        self._plan_run(config)
        previous = self.settings.startup_s.get(startup_key(config))
        self.phase_bar.set_levels(len(config.load.levels) if config.load.pattern == "sweep" else 1)
        self.phase_bar.engine_starting(previous)
        self.cancel = threading.Event()
        cancel, keep, bus, session, db_path = self.cancel, self.keep_engine.isChecked(), self.bus, self.session, self.db_path
        self.run_worker = run_in_worker(
            run_work(session, config, bus, cancel, keep_engine=keep, db_path=db_path, repeats=self.repeats.value()),
            self._run_done, self._run_failed, name="run", parent=self)
        self._set_running(True)
        self.presentation.set_heading(name, self._load_text(config), self._features_text(config))
        self._remember("recent_models", config.engine.model)
        self.run_bar.started()
        self.tabs.setCurrentIndex(0)

    def _plan_run(self, config: RunConfig) -> None:
        """The plan the run is measured against, for this machine (``app.planner.live``), off the
        GUI thread: it may read the model's config.json or measure the host's bandwidth once."""
        self._run_plan = None
        self.set_run_plan(None, "planning\u2026")

        def planned(result: tuple[Plan | None, str | None]) -> None:
            if self._run_config is config:  # not a plan for an earlier run
                self.set_run_plan(*result)

        run_in_worker(lambda: plan_for_run(config), planned, name="plan-run", parent=self)

    def set_run_plan(self, plan: Plan | None, why: str | None = None) -> None:
        self._run_plan = plan
        self.dashboard.set_plan(plan, why or "")
        self.presentation.tiles.set_plan(plan, why or "")

    @staticmethod
    def _load_text(config: RunConfig) -> str:
        load = config.load
        if load.pattern == "closed":
            how = f"{load.concurrency:,} concurrent"
        elif load.pattern == "sweep":
            how = f"sweep of {load.sweep_of} " + ", ".join(f"{v:g}" for v in load.levels)
        else:
            how = f"{load.pattern} at {load.rate_rps:g} req/s" if load.rate_rps else load.pattern
        return (f"{config.engine.model} \u00b7 {how} \u00b7 {config.workload.input_len.mean:,} in / "
                f"{config.workload.output_len.mean:,} out tokens")

    @staticmethod
    def _features_text(config: RunConfig) -> str:
        on = features_on(config.features.model_dump(mode="json"))
        return "Features: " + (" \u00b7 ".join(on) if on else "the engine's defaults")

    def stop_run(self) -> None:
        if self.cancel is not None and not self.cancel.is_set():
            self.cancel.set()
            self.stop_button.setEnabled(False)
            self.phase_bar.set_text("Stopping: cancelling requests and stopping the engine…")
            self.statusBar().showMessage("Stopping…")

    def _set_running(self, running: bool) -> None:
        self.run_bar.set_running(running)
        self.config_panel.setEnabled(not running)
        self.profile_picker.setEnabled(not running)
        self.open_action.setEnabled(not running)
        self.store_action.setEnabled(not running)  # a run records where it started; History would lose it

    def _run_done(self, result: RunResult) -> None:
        self.last_result = result
        if self._run_config is not None:
            self._previous_config = self._run_config.model_dump(mode="json")
        if result.status == "failed":
            self.dashboard.startup.set_phase("failed", result.reason or "")
        note = self._run_note
        if note and result.run_id:
            self._store_call(lambda s: s.set_notes(s.resolve(result.run_id), note))
        self.run_ended()
        self._show_run_summary(result)
        if result.status == "failed":
            self.show_error(f"Run failed: {result.reason}")
            self.log_view.show_diagnosis(result.reason)
        elif result.status == "cancelled":
            self.show_banner(f"Run cancelled: {result.reason or 'stopped by the user'}", error=False)
        else:
            flagged = [lv.label for lv in result.levels if lv.summary.unreliable()]
            caveat = (f" — at {', '.join(flagged)} the client's own timings were unreliable (hover the greyed "
                      "figures for why): the engine's figures stand in for them" if flagged else "")
            self.show_banner(f"Run completed: {self._result_line(result, self._run_plan)}{caveat}", error=False)

    def _show_run_summary(self, result: RunResult) -> None:
        """After a run, the tiles show its summary (the last level's), labelled as such."""
        levels = [lv for lv in result.levels if lv.summary.requests]
        if not levels:
            return
        level = levels[-1]
        which = f", {level.label}" + (f" (the last of {len(result.levels)} levels)" if len(result.levels) > 1 else "")
        header = (f"Run summary \u2014 {result.name}{which}: {level.summary.completed:,} requests in "
                  f"{level.summary.duration_s:,.1f} s ({result.status})")
        figures, unreliable = level.summary.figures(), level.summary.unreliable()
        for row in (self.dashboard.tiles, self.presentation.tiles):
            row.show_summary(figures, unreliable, header)
        limit = limit_figures(self._run_plan, level.summary) if self._run_plan is not None else None
        self.dashboard.show_limit(limit)
        self.presentation.tiles.show_limit(limit)
        if result.run_id:
            self._show_run_cost(result.run_id, figures.get("output_tok_per_s"), figures.get("total_tok_per_s"),
                                unreliable.get("output_tok_per_s"))

    def _show_run_cost(self, run_id: str, output_tok_per_s: float | None, total_tok_per_s: float | None,
                       unreliable: str | None) -> None:
        """The cost tile, from the stored run (its GPUs and profile prices) at the summary's throughput."""
        prices = self.prices()

        def cost(store: RunStore) -> RunCost:
            run = store.get_run(store.resolve(run_id))
            return run_cost(run, prices, output_tok_per_s, total_tok_per_s, unreliable=unreliable)

        def show(c: RunCost) -> None:
            for row in (self.dashboard.tiles, self.presentation.tiles):
                if c.output.usd is None:
                    row.show_cost("n/a", "no cost", c.reason or "")
                else:
                    row.show_cost(usd_text(c.output.usd), c.price_text(), c.note or "")

        run_in_worker(lambda: self.with_store(cost), show, None, name="run-cost", parent=self)

    @staticmethod
    def _result_line(result: RunResult, plan: Plan | None = None) -> str:
        """Each level's throughput and TTFT, and with a plan its share of the decode ceiling; a
        client figure the level flagged gives way to the engine's own, labelled (app.analysis.metric_catalog
        decides which)."""
        parts = []
        for level in result.levels:
            figures, unreliable = level.summary.figures(), level.summary.unreliable()
            texts = []
            for key in ("output_tok_per_s", "ttft_ms_p50"):
                shown = key
                alt = catalog.metric(key).engine_alternative
                if key in unreliable and alt and figures.get(alt) is not None:
                    shown = alt
                value = figures.get(shown)
                if value is not None:
                    m = catalog.metric(shown)
                    texts.append(f"{m.name} {m.format(value)} {m.unit}")
            limit = limit_figures(plan, level.summary) if plan is not None else None
            if limit is not None:
                texts.append(limit.text())
            parts.append(f"{level.label}: " + ", ".join(texts))
        return "; ".join(parts) or "no requests measured"

    def _run_failed(self, message: str) -> None:
        self.dashboard.startup.set_phase("failed", message)
        self.run_ended()
        self.show_error(f"Run failed: {message}")
        self.log_view.show_diagnosis(message)
        self.phase_bar.set_phase("failed", message)

    def start_campaign(self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[str], None],
                       cancel: threading.Event, name: str, phase_text: str, owner: QWidget) -> None:
        """``work()`` (a campaign tab's ladder or tune) in the run worker, as the window's running
        run: Stop sets ``cancel``, closing the window waits for it, and the live view is cleared."""
        self.show_banner(None)
        self._clear_live("")
        self.log_view.clear()
        self.cancel = cancel
        self.run_worker = run_in_worker(work, done, failed, name=name, parent=owner)
        self._set_running(True)
        self.phase_bar.set_text(phase_text, 2)

    def run_ended(self) -> None:
        self.run_worker = None
        self.cancel = None
        self._set_running(False)
        self._tick()
        if self.phase_bar.stage in ("engine", "load"):  # the run ended without saying so on the bus
            self.phase_bar.finished("Run ended", completed=False)
        if self.dashboard.page == Dashboard.STARTUP and self.dashboard.startup.failed_reason is None:
            self.dashboard.show_idle("The run ended before the engine was ready. Press \u25b6 Start to try again.")
        self.refresh_history()
        self._suggest_name()
        if self._close_requested:
            self._finish_close()

    # -- the bus -------------------------------------------------------------------------------

    def _tick(self) -> None:
        items = self.sub.drain()
        self._ticks += 1
        if items:
            # Client progress is an event; plotted (and shown in the tiles) as the ``client`` series.
            samples: list[Sample] = []
            for item in items:
                if isinstance(item, Sample):
                    samples.append(item)
                elif isinstance(item.payload, Progress):
                    samples.append(item.payload.sample(item.t_mono, item.t_wall))
            lines: list[str] = []
            for item in items:
                if isinstance(item, Event):
                    if isinstance(item.payload, LogLine):
                        lines.append(item.payload.line)
                    elif isinstance(item.payload, EngineReady):
                        # The plots start with the load: what came before belongs to the start.
                        samples = [s for s in samples if s.t_mono >= item.t_mono]
                        self._on_event(item)
                    else:
                        self._on_event(item)
            self.series.ingest(samples)
            for sample in samples:
                if sample.source in LIVE_SOURCES:
                    for name, value in sample.values.items():
                        self.latest[(sample.source, name)] = float(value)
                if sample.source.startswith("gpu") and not self.has_gpu:
                    self.has_gpu = True
                    self._apply_support()
            if samples and self.dashboard.page == Dashboard.IDLE:
                self.dashboard.show_plots()
            if lines:
                self.log_view.append(lines)
        if self._ticks % (REFRESH_HZ // 2) == 0:
            self._tick_times()
        if self.presenting:
            self.presentation.refresh(self.series, self.latest)
        elif self.tabs.currentIndex() == 0:
            self.dashboard.refresh(self.series, self.latest)

    def _tick_times(self) -> None:
        """Elapsed and remaining times, twice a second."""
        self.phase_bar.tick()
        if self.phase_bar.stage == "engine":
            previous = self.settings.startup_s.get(startup_key(self._run_config)) if self._run_config else None
            self.dashboard.startup.set_times(self.phase_bar.engine_elapsed_s(), self.phase_bar.eta_s(), previous)

    def _on_event(self, event: Event) -> None:
        p = event.payload
        if isinstance(p, PhaseChanged):
            self.phase_bar.set_phase(p.phase.value, p.detail)
            if self.running and p.phase.value not in ("ready", "stopping", "stopped"):
                if self.dashboard.page != Dashboard.STARTUP:
                    engine = get_adapter(self.state.config.engine.kind).display_name
                    self.dashboard.show_startup(f"Starting {engine} on {self.state.config.engine.model}")
                self.dashboard.startup.set_phase(p.phase.value, p.detail)
        elif isinstance(p, RunStarted):
            self.statusBar().showMessage(f"Run {p.name} started ({p.engine_kind} {p.engine_version or ''})")
            basis = live_cost_basis(p, self.prices())  # in memory: the run's GPUs or cores and price
            for row in (self.dashboard.tiles, self.presentation.tiles):
                row.set_cost_basis(basis)
        elif isinstance(p, EngineReady):
            lines = [f"{NOTE_PREFIX}engine ready at {p.base_url}" +
                     (f" after {p.startup_s:.1f} s" if p.startup_s is not None else "")]
            lines += [NOTE_PREFIX + feature_check_line(check) for check in p.feature_checks]
            self.log_view.append(lines)
            self.phase_bar.set_phase("ready", "running the load")
            self.show_feature_checks(p.feature_checks)
            self.series.clear()
            self._level_started_wall.clear()
            self.dashboard.plots.reset()
            self.presentation.plots.reset()
            self.dashboard.show_plots()
            if p.startup_s is not None and self._run_config is not None:
                self.settings = self.settings.with_startup(startup_key(self._run_config), p.startup_s)
                self._save_settings()
        elif isinstance(p, LevelStarted):
            self._level_started_wall[p.index] = p.started_wall_s
            self.statusBar().showMessage(f"Level {p.index}: {p.label}")
            duration = self._run_config.load.duration_s if self._run_config is not None else None
            self.phase_bar.level_started(p.index, p.label, p.num_requests, duration)
            if self.dashboard.page != Dashboard.PLOTS:
                self.dashboard.show_plots()
        elif isinstance(p, Progress):
            self.phase_bar.progress(p.requests_done, p.planned, p.elapsed_s)
        elif isinstance(p, LevelFinished):
            summary = p.summary
            self.statusBar().showMessage(f"Level {p.index} done: {summary.completed} requests, "
                                         f"{summary.output_tok_per_s:,.0f} tok/s")
            self.log_view.append([f"{NOTE_PREFIX}level {p.label}: {note}" for note in level_notes(summary)])
            limit = limit_figures(self._run_plan, summary) if self._run_plan is not None else None
            if limit is not None:
                self.log_view.append([f"{NOTE_PREFIX}level {p.label}: {limit.text()} ({limit.detail()})"])
            self.dashboard.roofline.add_level(p.label, limit)
            self._mark_steady(p.index, p.label, summary)
            flagged = summary.unreliable()  # the run flagged these: live tiles switch to the engine's own
            for row in (self.dashboard.tiles, self.presentation.tiles):
                row.flagged.update(flagged)
        elif isinstance(p, TelemetrySupport):
            self._support[p.source] = p
            if p.source.startswith("gpu") and p.available:
                self.has_gpu = True
            self._apply_support()
        elif isinstance(p, Notice):
            self.statusBar().showMessage(p.message, 10_000)
        elif isinstance(p, RunFinished):
            text = f"Run {p.status}" + (f": {p.reason}" if p.reason else "")
            self.phase_bar.finished(text, p.status == "completed")

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

    def _mark_steady(self, index: int, label: str, summary: LevelSummary) -> None:
        """Shade the level's steady window on the live plots, placed by the wall clock (the
        plots count from their first sample, the level from its own start)."""
        started, t0_wall = self._level_started_wall.get(index), self.series.t0_wall
        if summary.steady is None or started is None or t0_wall is None:
            return
        start_s, end_s = started + summary.steady.start_s - t0_wall, started + summary.steady.end_s - t0_wall
        for plots in (self.dashboard.plots, self.presentation.plots):
            plots.mark_window(start_s, end_s, f"steady: {label}")

    def _apply_support(self) -> None:
        if self.has_gpu:
            note = ""
        else:
            note = "No NVIDIA GPU here: host memory and CPU stand in for GPU memory, bandwidth and utilization."
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
        self.show_error(message)
        self._finish_close()

    def toggle_presentation(self) -> None:
        if self.presenting:
            self.stack.setCurrentIndex(0)
            for shortcut in self.page_keys:
                shortcut.setEnabled(False)
            self.toolbar.setVisible(True)
            self.statusBar().setVisible(True)
            self.showNormal()
        else:
            if self._run_config is None:
                config = self.state.config
                self.presentation.set_heading(config.name, self._load_text(config), self._features_text(config))
            self.stack.setCurrentIndex(1)
            for shortcut in self.page_keys:
                shortcut.setEnabled(True)
            self.toolbar.setVisible(False)
            self.statusBar().setVisible(False)
            self.showFullScreen()
        self.stack.updateGeometry()
        self._tick()

    def present_before_after(self) -> None:
        """The compared runs' headline, before and after, in presentation mode."""
        headlines = self.compare.extras.headlines
        if not headlines:
            self.show_error("Compare two runs first: the before/after view shows their headline.")
            return
        money = self.compare.extras.money_lines
        self.presentation.show_before_after(headlines[0], money[0] if money else "")
        if not self.presenting:
            self.toggle_presentation()

    # -- history, compare, export ----------------------------------------------------------------

    def with_store(self, fn: Any) -> Any:
        """Run ``fn(store)`` (in a worker); the store is opened on first use, once it is known
        which one (the settings may name it: the default file is not made on the way)."""
        self._location_known.wait(10)
        with self._store_lock:
            if self.store is None:
                self.store = RunStore(self.db_path)
            store = self.store
        return fn(store)

    def refresh_history(self) -> None:
        location = self.db_path

        def read(result: tuple[str, list[RunInfo]]) -> None:
            if location != self.db_path:
                return  # read from the store before a switch: a newer refresh is on its way
            self._history_from = location
            self.history.set_where(result[0])
            self._history_loaded(result[1])

        def failed(message: str) -> None:
            if location == self.db_path and self._history_from != location:  # not the runs on screen
                self.history.set_where(f"{shown_location(location)} (not opened)")
                self.history.set_runs([])
            self.show_error(message)

        run_in_worker(lambda: self.with_store(lambda s: (s.where, s.list_runs(limit=5000))), read, failed,
                      name="history", parent=self)

    def open_store_dialog(self) -> StoreDialog:
        """Run database…: on OK the choice is saved, the store switched and History re-read."""
        dialog = StoreDialog(self, self.db_path or "", os.environ.get(AUTHOR_ENV, ""),
                             where=self.history.where.text().removeprefix("Runs in: "))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # a typed password does not outlive it
        dialog.accepted.connect(lambda: self._store_chosen(dialog.location(), dialog.author()))
        dialog.open()
        return dialog

    def _store_chosen(self, location: str, author: str) -> None:
        self.settings = self.settings.model_copy(update={"store_location": location, "author": author})
        self._save_settings()
        self._use_store(location or None, author)

    def _use_store(self, location: str | None, author: str) -> None:
        """Record as ``author`` (runs this process records read it from the environment) into the
        store at ``location``; the open store is closed in a worker (the next call opens the new
        one, with the new author) and History re-reads."""
        if author:
            os.environ[AUTHOR_ENV] = author
        else:
            os.environ.pop(AUTHOR_ENV, None)
        self.history.author = default_author()
        self.db_path = location

        def drop() -> None:
            with self._store_lock:  # a worker opening the old store finishes first
                store, self.store = self.store, None
            if store is not None:
                store.close()

        run_in_worker(drop, lambda _r: self._store_switched(), self.show_error, name="store-close", parent=self)

    def _store_switched(self) -> None:
        self.refresh_history()
        for tab in (self.ladder, self.tune):  # their pickers list the stored campaigns of the store in use
            tab.refresh_stored()

    def _history_loaded(self, runs: list[RunInfo]) -> None:
        self.history.set_runs(runs)
        if any(r.status == "running" for r in runs) and not self._history_poll.isActive():
            self._history_poll.start()  # a run being recorded (here, or by another workbench) moves on
        if self._previous_config is None and runs:  # a first run this session: suggest against the last stored
            latest = max(runs, key=lambda r: r.started_at)
            run_in_worker(lambda: self.with_store(lambda s: s.get_run(latest.id).config), self._previous_loaded,
                          None, name="last-config", parent=self)

    def _previous_loaded(self, config: dict[str, Any]) -> None:
        if self._previous_config is None and config:
            self._previous_config = config
            self._suggest_name()

    def _store_call(self, fn: Any) -> None:
        run_in_worker(lambda: self.with_store(fn), lambda _r: self.refresh_history(), self.show_error,
                      name="store-edit", parent=self)

    def _delete_runs(self, ids: list[int]) -> None:
        def delete(store: RunStore) -> None:
            for run_id in ids:
                store.delete(run_id)
        self._store_call(delete)

    def compare_runs(self, ids: list[int], baseline: int | None = None) -> None:
        if len(ids) < 2:
            self.show_error("Select at least two runs to compare.")
            return
        self._compare_ids = list(ids)
        prices = self.prices()
        run_in_worker(lambda: self.with_store(lambda s: compare_with_extras(s, ids, baseline, prices)),
                      self._compared,
                      self.show_error, name="compare", parent=self)

    def _compared(self, result: tuple[Comparison, CompareExtras]) -> None:
        comparison, extras = result
        self.compare.show_comparison(comparison, extras)
        self.tabs.setCurrentWidget(self.compare)

    def open_export(self, run_ids: list[int], comparison: bool = False) -> ExportDialog:
        dialog = ExportDialog(self, run_ids=run_ids, with_store=self.with_store, comparison=comparison)
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
            return  # run_ended calls back
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
        self._history_poll.stop()
        self.bus.unsubscribe(self.sub)
        self._close_ready = True
        QTimer.singleShot(0, self.close)  # not from inside closeEvent (no store was open): Qt ignores that close


def bring_up(window: MainWindow) -> None:
    """Show the window (used by ``tunebench gui`` and the screenshot script)."""
    window.show()
    app = QApplication.instance()
    if app is not None:
        app.setApplicationName("tunebench")
