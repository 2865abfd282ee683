"""The workbench window: configuration and the run bar (name, note, Start) on the left; live
view, history and compare on the right; presentation mode (live, or before/after of two runs)
on F11 / Ctrl+P.

The window lays out and wires; it holds no run logic and draws nothing itself. The configuration
being edited is ``app.editing.EditedConfig`` (its Qt face ``state``: ``app.gui.config_state``);
a run as the bus tells it is ``app.live_run.LiveRun`` (``live``), which the Live tab
(``app.gui.live_tab``) subscribes to. Runs start and end in ``app.gui.run_control``; the store,
History and Compare go through ``app.gui.store_link``; the toolbar is ``app.gui.toolbar``.
The window implements ``app.gui.campaign_panel.CampaignHost`` for the Ladder and Tune tabs, and
the host each helper declares (``RunHost``, ``StoreHost``, ``ChecksHost``, ``FilesHost``), each
made of the parts in ``app.gui.host``: no other module of app.gui imports this one, even for type
hints (``importlinter-type-checking.toml``). The helpers do not call each other through the window:
it wires their signals.

Threading: the GUI thread only drains the bus (a QTimer at 20 Hz), updates widgets and starts
workers. Runs, engine stops, store queries, profile files and validation all run in
:class:`app.gui.workers.Worker` threads; their errors come back as one-line messages shown in
the banner, never as tracebacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.analysis.findings import Finding
from app.bus import Bus
from app.config import RunConfig
from app.cost import PriceTable, price_table
from app.editing import EditedConfig
from app.errors import UserError
from app.gui.availability import Availability
from app.gui.capacity_box import CapacityBox
from app.gui.cluster_box import ClusterBox, ClusterChoice
from app.gui.config_panel import ConfigPanel
from app.gui.config_state import ConfigState
from app.gui.export_dialog import ExportDialog
from app.gui.forwarded import Forwarded
from app.gui.history import CompareView, HistoryView
from app.gui.ladder_tab import LadderTab
from app.gui.live_tab import LiveTab
from app.gui.machine_checks import MachineChecks
from app.gui.presentation import CurrentPageStack, PresentationView
from app.gui.run_bar import RunBar
from app.gui.run_control import RunControl, starting_text, startup_key
from app.gui.session import EngineSession
from app.gui.settings import GuiSettings, settings_path
from app.gui.store_box import StoreDialog
from app.gui.store_link import StoreLink
from app.gui.toolbar import MainToolBar
from app.gui.tune_tab import TuneTab
from app.gui.user_files import UserFiles
from app.gui.workers import busy_workers, run_in_worker
from app.labels import engine_defaults, suggest_run_name
from app.live_run import LIVE_KINDS, LiveRun, features_text, load_text
from app.planner.plan import Plan
from app.profiles import Profile
from app.race import LIVE_RACE_KINDS, LiveRace, Race
from app.run_findings import first_sentence, stored_findings, top_change
from app.runner import RunResult
from app.store import RunStore
from engine_adapters.base import FlagSet
from engine_adapters.hardware import HardwareInfo
from engine_adapters.secrets import mask_text

REFRESH_HZ = 20
T = TypeVar("T")


class MainWindow(QMainWindow):
    def __init__(self, config: RunConfig | Profile | None = None, profile_path: Path | None = None, *,
                 db_path: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("tunebench")
        self.resize(1366, 768)
        profile = config if isinstance(config, Profile) else Profile(run=config or RunConfig())
        self.state = ConfigState(EditedConfig(profile.run, profile_path, profile.campaigns))
        self.settings = GuiSettings()
        self.bus = Bus()
        self.sub = self.bus.subscribe(maxlen=500_000, kinds=LIVE_KINDS)
        self.side_by_side = Bus().subscribe(maxlen=100_000, kinds=LIVE_RACE_KINDS)
        """A campaign's trials side by side (each slot's bus, ``follow_slot``): what a live race follows."""
        self.slots_followed = 0
        """Slot buses followed in the running campaign."""
        self.live = LiveRun()
        self.session = EngineSession()
        self.runs = RunControl(self)
        self.store_link = StoreLink(self, db_path)
        self.checks = MachineChecks(self)
        self.files = UserFiles(self)
        self.close_requested = False
        self._close_ready = False
        self._shutting_engine = False
        self.previous_config: dict[str, Any] | None = None  # the last run's configuration: the name suggestion
        self._ticks = 0
        self._build()
        self.live.engine_ready.connect(self.files.remember_startup)
        self.timer = QTimer(self)
        self.timer.setInterval(int(1000 / REFRESH_HZ))
        self.timer.timeout.connect(self.tick)
        self.timer.start()
        self._startup_checks()

    # -- layout --------------------------------------------------------------------------------

    def _build(self) -> None:
        self.toolbar = MainToolBar(self)
        self.addToolBar(self.toolbar)
        self.profile_picker = self.toolbar.profile_picker
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
        self.config_panel.validation_requested = self.checks.validate
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(4, 4, 0, 4)
        left_layout.setSpacing(4)
        left_layout.addWidget(self.config_panel, 1)
        # app.gui.cluster_box: where Start's runs and the Ladder's steps run (this machine, or a Ray cluster)
        self.cluster_box = ClusterBox(lambda: self.state.config)
        left_layout.addWidget(self.cluster_box)
        left_layout.addWidget(self.run_bar)

        self.presentation = PresentationView()
        self.live_tab = LiveTab(self.live, self.presentation, status=self.statusBar().showMessage,
                                running=lambda: self.running, prices=self.prices,
                                starting_text=lambda: starting_text(self.state.config))
        self.series, self.phase_bar = self.live_tab.series, self.live_tab.phase_bar
        self.dashboard, self.log_view = self.live_tab.dashboard, self.live_tab.log_view
        self.checks_label = self.live_tab.checks_label
        self.history = HistoryView()
        self.compare = CompareView(with_store=self.with_store)
        for panel in (self.live_tab.findings, self.history.findings):  # read from the store; Try it edits the config
            panel.set_sources(self.read_findings, self.config_panel.apply_changes)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.live_tab, "Live")
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
        self.stack = CurrentPageStack()
        self.stack.addWidget(split)
        self.stack.addWidget(self.presentation)
        self.setCentralWidget(self.stack)
        self.statusBar().showMessage("Ready")
        self._wire()

    def _wire(self) -> None:
        bar, link = self.toolbar, self.store_link
        bar.profile_picker.activated.connect(self.files.picked)
        bar.open_action.triggered.connect(self.files.ask_and_open)
        bar.save_action.triggered.connect(self.files.save)
        bar.save_as_action.triggered.connect(lambda: self.files.save(ask=True))
        bar.present_action.triggered.connect(self.toggle_presentation)
        bar.store_action.triggered.connect(self.open_store_dialog)
        self.start_button.clicked.connect(self.start_run)
        self.stop_button.clicked.connect(self.stop_run)
        self.cluster_box.changed.connect(self.files.remember_cluster)
        # the helpers tell each other through the window: settings read name the store, an opened
        # profile is checked again, a store chosen is saved in the settings, a run's model is remembered
        self.files.settings_read.connect(link.settings_read)
        self.files.settings_missing.connect(link.settings_failed)
        self.files.profile_opened.connect(self.checks.refresh_availability)
        link.store_chosen.connect(self.files.save_settings)
        link.store_switched.connect(self.ladder.refresh_stored)
        link.store_switched.connect(self.tune.refresh_stored)
        self.runs.run_started.connect(lambda config: self.files.remember("recent_models", config.engine.model))
        for key in ("F11", "Ctrl+P"):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.setContext(Qt.ShortcutContext.ApplicationShortcut)
            shortcut.activated.connect(self.toggle_presentation)
        escape = QShortcut(QKeySequence("Escape"), self)
        escape.activated.connect(self._leave_presentation)
        # L and B switch the presentation's page; enabled only while presenting (they are letters).
        self.page_keys = []
        for key, page in (("L", self.presentation.show_live), ("B", self.presentation.show_before_after),
                          ("R", self.race_compared)):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.activated.connect(page)
            shortcut.setEnabled(False)
            self.page_keys.append(shortcut)
        self.history.refresh_requested.connect(self.refresh_history)
        self.history.compare_requested.connect(self.compare_runs)
        self.history.export_requested.connect(lambda ids: self.open_export(run_ids=ids))
        self.history.rename_requested.connect(lambda i, n: link.store_call(lambda s: s.rename(i, n)))
        self.history.tag_requested.connect(lambda i, a, r: link.store_call(lambda s: s.tag(i, a, r)))
        self.history.delete_requested.connect(link.delete_runs)
        self.compare.baseline_changed.connect(lambda rid: self.compare_runs(link.compare_ids, baseline=rid))
        self.compare.export_requested.connect(lambda: self.open_export(run_ids=link.compare_ids, comparison=True))
        self.compare.present_requested.connect(self.present_before_after)
        self.compare.race_requested.connect(self.race_compared)
        for box in self._capacity_boxes():
            box.prices_changed.connect(self._prices_changed)
        self.tabs.currentChanged.connect(self._tab_changed)
        self.files.fill_picker()
        self.suggest_name()

    # -- what the window is (CampaignHost and the tests read these) -------------------------------

    running = Forwarded[bool]("runs")
    cancel = Forwarded[threading.Event | None]("runs")
    last_result = Forwarded[RunResult | None]("runs")
    hardware = Forwarded[HardwareInfo | None]("checks")
    flags = Forwarded[FlagSet | None]("checks")
    availability = Forwarded[Availability | None]("checks")
    db_path = Forwarded[str | None]("store_link")
    _compare_ids = Forwarded[list[int]]("store_link", "compare_ids")
    profile_path = Forwarded[Path | None]("state")

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
        self.files.load_settings()
        self.checks.start()
        if self.store_link.explicit:  # else the settings may name the store: History is read once they are loaded
            self.refresh_history()
        self.state.changed.connect(lambda _path: self.suggest_name())

    # -- profiles and settings (app.gui.user_files) ----------------------------------------------------

    def open_profile(self, path: Path) -> None:
        self.files.open_profile(path)

    def save_profile_to(self, path: Path) -> None:
        self.files.save_profile_to(path)

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

    def show_prices(self, prices: list[str]) -> None:
        for box in self._capacity_boxes():
            box.set_prices(prices)

    def _prices_changed(self, prices: list[str]) -> None:
        """A sizing succeeded with these prices: keep them, show them in every Capacity box, and
        cost the comparison on screen at them."""
        if prices == self.settings.prices:
            return
        self.settings = self.settings.model_copy(update={"prices": list(prices)})
        self.files.save_settings()
        self.show_prices(prices)
        self.tune.show_state(self.tune.state)  # its cost axis, at these prices
        self.ladder.show_state(self.ladder.state)  # the staircase's costs
        self.store_link.recompare()

    # -- runs (app.gui.run_control) -----------------------------------------------------------------

    def suggest_name(self) -> None:
        """The run bar's name: what changed since the last run ("prefix caching on"), or the
        profile's name for a first run."""
        config = self.state.config
        self.run_bar.suggest(suggest_run_name(config.model_dump(mode="json"), self.previous_config, config.name,
                                              engine_defaults=engine_defaults(config.engine.kind)))

    def previous_loaded(self, config: dict[str, Any]) -> None:
        """The last stored run's configuration: what a first run's name is suggested against."""
        if self.previous_config is None and config:
            self.previous_config = config
            self.suggest_name()

    def start_run(self) -> None:
        self.runs.start_run()

    def stop_run(self) -> None:
        self.runs.stop_run()

    def set_run_plan(self, plan: Plan | None, why: str | None = None) -> None:
        self.runs.set_run_plan(plan, why)

    def start_campaign(self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[str], None],
                       cancel: threading.Event, name: str, phase_text: str, owner: QWidget) -> None:
        self.runs.start_campaign(work, done, failed, cancel, name, phase_text, owner)

    def run_ended(self) -> None:
        self.runs.run_ended()

    def set_running(self, running: bool) -> None:
        if not running:  # the next campaign's trials are raced on a mailbox of their own (a live race
            # may still drain this one's last events)
            self.side_by_side = Bus().subscribe(maxlen=100_000, kinds=LIVE_RACE_KINDS)
            self.slots_followed = 0
        self.run_bar.set_running(running)
        self.cluster_box.set_running(running)
        self.config_panel.setEnabled(not running)
        self.toolbar.set_idle(not running)

    def cluster_choice(self) -> ClusterChoice | None:
        """Where a run or a campaign goes now: the Cluster box's cluster, or None (this machine)."""
        return self.cluster_box.choice()

    def follow_slot(self, slot_bus: Bus) -> None:
        """A campaign's slot on a cluster has a bus of its own: the live view follows it too
        (from the campaign's worker; the subscription is thread-safe), and so can the live race."""
        slot_bus.attach(self.sub)
        slot_bus.attach(self.side_by_side)
        self.slots_followed += 1

    # -- the bus -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Drain the bus into the live run (its subscribers draw), then refresh what is shown."""
        self.live_tab.ingest(self.live.fold(self.sub.drain()))
        self._ticks += 1
        if self._ticks % (REFRESH_HZ // 2) == 0:  # elapsed and remaining times, twice a second
            self.phase_bar.tick()
            if self.phase_bar.stage == "engine":
                config = self.live.config
                previous = self.settings.startup_s.get(startup_key(config)) if config is not None else None
                self.dashboard.startup.set_times(self.phase_bar.engine_elapsed_s(), self.phase_bar.eta_s(), previous)
        if self.presenting:
            self.presentation.refresh(self.series, self.live.latest)
        elif self.tabs.currentIndex() == 0:
            self.dashboard.refresh(self.series, self.live.latest)

    # -- presentation --------------------------------------------------------------------------

    @property
    def presenting(self) -> bool:
        return self.stack.currentIndex() == 1

    def _leave_presentation(self) -> None:
        if self.presenting:
            self.toggle_presentation()

    def toggle_presentation(self) -> None:
        presenting = not self.presenting
        if presenting and self.live.config is None:
            config = self.state.config
            self.presentation.set_heading(config.name, load_text(config), features_text(config))
        self.stack.setCurrentIndex(1 if presenting else 0)
        for shortcut in self.page_keys:
            shortcut.setEnabled(presenting)
        self.toolbar.setVisible(not presenting)
        self.statusBar().setVisible(not presenting)
        if presenting:
            self.showFullScreen()
        else:
            self.showNormal()
        self.stack.updateGeometry()
        self.tick()

    def present_before_after(self) -> None:
        """The compared runs' headline, before and after, in presentation mode."""
        headlines = self.compare.extras.headlines
        if not headlines:
            self.show_error("Compare two runs first: the before/after view shows their headline.")
            return
        money, why = self.compare.extras.money_lines, self.compare.extras.why
        top = top_change(why[0]) if why else None
        self.presentation.show_before_after(headlines[0], money[0] if money else "",
                                            first_sentence(top.explanation) if top is not None else "")
        if not self.presenting:
            self.toggle_presentation()

    def race_runs(self, a: int, b: int) -> None:
        """Two stored runs' sample requests replayed side by side in presentation mode (app.race)."""
        self.store_link.race_runs(a, b)

    def race_compared(self) -> None:
        """While a campaign runs trials side by side, its first two raced live; otherwise the
        compared baseline against the first other run, replayed."""
        if self.running and self.slots_followed >= 2:
            following = self.presentation.race.live  # pressed again: the same race (its start was drained)
            self.presentation.show_live_race(following or LiveRace("A", "B"), self.side_by_side)
            if not self.presenting:
                self.toggle_presentation()
            return
        comparison = self.compare.comparison
        if comparison is None or len(comparison.runs) < 2:
            self.show_error("Compare two runs first: the race replays the baseline against the first other run.")
            return
        base = comparison.runs[comparison.baseline].id
        self.race_runs(base, next(r.id for r in comparison.runs if r.id != base))

    def show_race(self, race: Race) -> None:
        self.presentation.show_race(race)
        if not self.presenting:
            self.toggle_presentation()

    # -- history, compare, export (app.gui.store_link) ------------------------------------------------

    def with_store(self, fn: Callable[[RunStore], T]) -> T:
        """``fn(store)`` on the window's run database (from a worker)."""
        return self.store_link.with_store(fn)

    def read_findings(self, ref: int | str) -> list[Finding]:
        """The stored run ``ref``'s findings (from a worker)."""
        return self.with_store(lambda store: stored_findings(store, ref))

    def refresh_history(self) -> None:
        self.store_link.refresh_history()

    def open_store_dialog(self) -> StoreDialog:
        return self.store_link.open_store_dialog()

    def compare_runs(self, ids: list[int], baseline: int | None = None) -> None:
        self.store_link.compare_runs(ids, baseline)

    def open_export(self, run_ids: list[int], comparison: bool = False) -> ExportDialog:
        dialog = ExportDialog(self, run_ids=run_ids, with_store=self.with_store, comparison=comparison)
        dialog.show()
        return dialog

    def _tab_changed(self, index: int) -> None:
        if index == 1:
            self.refresh_history()
        self.tick()

    # -- closing -------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt API
        if self._close_ready:
            event.accept()
            return
        if self.running and not self.close_requested:
            answer = QMessageBox.question(
                self, "Stop the run?", "A run is in progress. Stop it, stop the engine and close?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
            if answer != QMessageBox.StandardButton.Yes:
                event.ignore()
                return
        self.close_requested = True
        event.ignore()
        self.stop_run()
        self.finish_close()

    def finish_close(self) -> None:
        """Closing never waits on the GUI thread: each step finishes in a worker, then retries."""
        if self.running:
            return  # run_ended calls back
        if self.session.engine is not None and not self._shutting_engine:
            self._shutting_engine = True
            self.phase_bar.set_text("Stopping the engine…")
            run_in_worker(self.session.shutdown, lambda _r: self.finish_close(),
                          self._close_step_failed, name="engine-stop", parent=self)
            return
        if busy_workers():
            QTimer.singleShot(50, self.finish_close)
            return
        if self.store_link.close_store(self.finish_close, self._close_step_failed):
            return
        self.timer.stop()
        self.store_link.history_poll.stop()
        self.bus.unsubscribe(self.sub)
        self._close_ready = True
        QTimer.singleShot(0, self.close)  # not from inside closeEvent (no store was open): Qt ignores that close

    def _close_step_failed(self, message: str) -> None:
        self.show_error(message)
        self.finish_close()


def bring_up(window: MainWindow) -> None:
    """Show the window (used by ``tunebench gui`` and the screenshot script)."""
    window.show()
    app = QApplication.instance()
    if app is not None:
        app.setApplicationName("tunebench")
