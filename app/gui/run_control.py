"""Starting, stopping and ending the window's one running run: a run of the configuration being
edited, or a campaign tab's ladder or tune (:meth:`RunControl.start_campaign`).

The work runs in a worker (``app.gui.repeats.run_work`` in a :class:`app.gui.workers.Worker`);
what it publishes reaches the GUI through the window's bus subscription, drained by its timer
into the live run (``app.live_run``). This module only launches, cancels and reports the end.
What it needs of the window is :class:`RunHost`; the window is one.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from app.config import RunConfig
from app.cost import RunCost, run_cost
from app.gui.dashboard import Dashboard
from app.gui.host import Lifetime, LiveShown, Previous, RunPlace, Status, Tabs
from app.gui.repeats import run_work
from app.gui.workers import Worker, run_in_worker
from app.live_run import features_text, load_text, result_line
from app.planner.live import plan_for_run
from app.planner.plan import Plan
from app.runner import RunResult
from app.store import RunStore
from engine_adapters.registry import get_adapter

if TYPE_CHECKING:
    from app.gui.run_bar import RunBar


def startup_key(config: RunConfig) -> str:
    """The key under which an engine's last start time is remembered: its engine, runtime and
    model (what a start spends its time on: loading and warming the model), not its features."""
    return hashlib.sha256(config.engine.model_dump_json().encode()).hexdigest()[:16]


def starting_text(config: RunConfig) -> str:
    return f"Starting {get_adapter(config.engine.kind).display_name} on {config.engine.model}"


class RunRecords(Protocol):
    """Who edits and lists the stored runs (the store link): a run's note, History after a run."""

    def store_call(self, fn: Callable[[RunStore], Any]) -> None: ...
    def refresh_history(self) -> None: ...


class RunHost(Lifetime, Status, LiveShown, RunPlace, Tabs, Previous, Protocol):
    """What a run needs of the window: the configuration and run bar it starts from, where it
    runs and records, the live view it clears and reports into, and the window's own steps
    (idle or running, the bus drained, the next name suggested, closing once the run ended)."""

    @property
    def run_bar(self) -> RunBar: ...
    def set_running(self, running: bool) -> None: ...
    def tick(self) -> None: ...
    def suggest_name(self) -> None: ...

    @property
    def store_link(self) -> RunRecords: ...

    @property
    def close_requested(self) -> bool: ...
    def finish_close(self) -> None: ...


class RunControl(QObject):
    """The running run's worker and cancel event, and what the window does as it starts and ends."""

    run_started = Signal(object)
    """A run of this configuration (a ``RunConfig``) started: its model is remembered as a recent one."""

    def __init__(self, host: RunHost) -> None:
        super().__init__(host.window())
        self.host = host
        self.cancel: threading.Event | None = None
        self.worker: Worker | None = None
        self.last_result: RunResult | None = None
        self._note = ""

    @property
    def running(self) -> bool:
        return self.worker is not None

    def start_run(self) -> None:
        w = self.host
        if self.running or w.close_requested:
            return
        problems = w.config_panel.problems()
        if problems:
            w.show_error("Cannot start: " + "; ".join(problems))
            return
        errors = w.state.model.errors
        if errors:
            path = w.config_panel.editor_for_issue(errors[0])
            if path is not None:
                w.config_panel.show_field(path)
            w.show_error("Cannot start: " + "; ".join(f"{i.field}: {i.message}" for i in errors))
            return
        name = w.run_bar.run_name() or w.state.config.name
        config = w.state.config.model_copy(update={"name": name})
        self._note = w.run_bar.run_note()
        w.show_banner(None)
        w.live_tab.clear("")
        w.live.begin(config)
        w.live_tab.log_view.clear()
        w.live_tab.dashboard.show_startup(starting_text(config))
        w.live_tab.dashboard.tiles.set_header(f"Live \u2014 {name}: the client's figures over the last few seconds")
        self._plan_run(config)
        previous = w.settings.startup_s.get(startup_key(config))
        w.phase_bar.set_levels(len(config.load.levels) if config.load.pattern.takes_levels else 1)
        w.phase_bar.engine_starting(previous)
        self.cancel = cancel = threading.Event()
        work = run_work(w.session, config, w.bus, cancel, keep_engine=w.keep_engine.isChecked(),
                        db_path=w.db_path, repeats=w.run_bar.repeats.value(), cluster=w.cluster_choice(),
                        follow=w.follow_slot)
        self.worker = run_in_worker(work, self._run_done, self._run_failed, name="run", parent=self)
        w.set_running(True)
        w.presentation.set_heading(name, load_text(config), features_text(config))
        self.run_started.emit(config)
        w.run_bar.started()
        w.tabs.setCurrentIndex(0)

    def _plan_run(self, config: RunConfig) -> None:
        """The plan the run is measured against, for this machine (``app.planner.live``), off the
        GUI thread: it may read the model's config.json or measure the host's bandwidth once."""
        self.set_run_plan(None, "planning\u2026")

        def planned(result: tuple[Plan | None, str | None]) -> None:
            if self.host.live.config is config:  # not a plan for an earlier run
                self.set_run_plan(*result)

        run_in_worker(lambda: plan_for_run(config), planned, name="plan-run", parent=self)

    def set_run_plan(self, plan: Plan | None, why: str | None = None) -> None:
        w = self.host
        w.live.plan = plan
        w.live_tab.dashboard.set_plan(plan, why or "")
        w.presentation.tiles.set_plan(plan, why or "")

    def stop_run(self) -> None:
        w = self.host
        if self.cancel is not None and not self.cancel.is_set():
            self.cancel.set()
            w.run_bar.stop_button.setEnabled(False)
            w.phase_bar.set_text("Stopping: cancelling requests and stopping the engine…")
            w.statusBar().showMessage("Stopping…")

    def _run_done(self, result: RunResult) -> None:
        w = self.host
        self.last_result = result
        if w.live.config is not None:
            w.previous_config = w.live.config.model_dump(mode="json")
        if result.status == "failed":
            w.live_tab.dashboard.startup.set_phase("failed", result.reason or "")
        note = self._note
        if note and result.run_id:
            w.store_link.store_call(lambda s: s.set_notes(s.resolve(result.run_id), note))
        self.run_ended()
        self._show_run_summary(result)
        if result.status == "failed":
            w.show_error(f"Run failed: {result.reason}")
            w.live_tab.log_view.show_diagnosis(result.reason)
        elif result.status == "cancelled":
            w.show_banner(f"Run cancelled: {result.reason or 'stopped by the user'}", error=False)
        else:
            flagged = [lv.label for lv in result.levels if lv.summary.unreliable()]
            caveat = (f" — at {', '.join(flagged)} the client's own timings were unreliable (hover the greyed "
                      "figures for why): the engine's figures stand in for them" if flagged else "")
            w.show_banner(f"Run completed: {result_line(result, w.live.plan)}{caveat}", error=False)

    def _show_run_summary(self, result: RunResult) -> None:
        """The tiles show the run's summary; the cost tile is priced from the stored run (its GPUs
        and profile prices) at the summary's throughput."""
        w = self.host
        if not w.live_tab.show_summary(result) or not result.run_id:
            return
        summary = next(lv.summary for lv in reversed(result.levels) if lv.summary.requests)
        figures, unreliable = summary.figures(), summary.unreliable()
        prices, run_id = w.prices(), result.run_id

        def cost(store: RunStore) -> RunCost:
            run = store.get_run(store.resolve(run_id))
            return run_cost(run, prices, figures.get("output_tok_per_s"), figures.get("total_tok_per_s"),
                            unreliable=unreliable.get("output_tok_per_s"))

        run_in_worker(lambda: w.with_store(cost), w.live_tab.show_cost, None, name="run-cost", parent=self)

    def _run_failed(self, message: str) -> None:
        w = self.host
        w.live_tab.dashboard.startup.set_phase("failed", message)
        self.run_ended()
        w.show_error(f"Run failed: {message}")
        w.live_tab.log_view.show_diagnosis(message)
        w.phase_bar.set_phase("failed", message)

    def start_campaign(self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[str], None],
                       cancel: threading.Event, name: str, phase_text: str, owner: QWidget) -> None:
        """``work()`` (a campaign tab's ladder or tune) in the run worker, as the window's running
        run: Stop sets ``cancel``, closing the window waits for it, and the live view is cleared."""
        w = self.host
        w.show_banner(None)
        w.live_tab.clear("")
        w.live_tab.log_view.clear()
        self.cancel = cancel
        self.worker = run_in_worker(work, done, failed, name=name, parent=owner)
        w.set_running(True)
        w.phase_bar.set_text(phase_text, 2)

    def run_ended(self) -> None:
        w = self.host
        self.worker = None
        self.cancel = None
        w.set_running(False)
        w.tick()
        if w.phase_bar.stage in ("engine", "load"):  # the run ended without saying so on the bus
            w.phase_bar.finished("Run ended", completed=False)
        if w.live_tab.dashboard.page == Dashboard.STARTUP and w.live_tab.dashboard.startup.failed_reason is None:
            w.live_tab.dashboard.show_idle("The run ended before the engine was ready. Press \u25b6 Start to try again.")
        w.store_link.refresh_history()
        w.suggest_name()
        if w.close_requested:
            w.finish_close()
