"""The Repeats box beside Start: run the configuration N times, each on a cold prefix cache, as
one set (``app.campaign.run_repeats``, what ``tunebench run --repeat N`` does). Kept here so the
main window only places the box and asks :func:`run_work` for the worker function."""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtWidgets import QSpinBox

from app.bus import Bus
from app.campaign import repeat_lines, run_repeats
from app.config import RunConfig
from app.errors import EngineFailed
from app.events import LogLine
from app.gui.cluster_box import ClusterChoice, open_cluster
from app.gui.session import EngineSession
from app.runner import RunResult

MAX_REPEATS = 20


def repeat_box() -> QSpinBox:
    box = QSpinBox()
    box.setRange(1, MAX_REPEATS)
    box.setValue(1)
    box.setPrefix("× ")
    box.setToolTip("Run the configuration this many times, each on a cold prefix cache, and store the set: "
                   "History and Compare show each figure's mean with its 95% confidence interval, and a "
                   "difference inside the noise as 'no significant difference'")
    return box


def run_work(session: EngineSession, config: RunConfig, bus: Bus, cancel: threading.Event, *, keep_engine: bool,
             db_path: str | None, repeats: int, cluster: ClusterChoice | None = None,
             follow: Callable[[Bus], None] = lambda _slot_bus: None) -> Callable[[], RunResult]:
    """The blocking function a worker runs for Start: one run, or ``repeats`` of them. Returns the
    last run's result (the window shows it like a single run); the set's figures go to the log.
    With a ``cluster``, every run (even a single one) is a trial there, as ``--cluster`` makes it;
    ``follow`` gets each side-by-side trial's bus."""
    if repeats <= 1 and cluster is None:
        return lambda: session.run(config, bus, cancel, keep_engine=keep_engine, db_path=db_path)

    def work() -> RunResult:
        if cluster is not None:
            on_cluster = open_cluster(cluster, config, bus, follow)
            result = run_repeats(config, repeats, bus, cancel, db_path=db_path, **on_cluster)
        else:
            if not keep_engine:
                session.shutdown()  # the campaign keeps its own engine between repeats, then stops it
            result = run_repeats(config, repeats, bus, cancel, engines=session if keep_engine else None,
                                 db_path=db_path)
        last = result.last_run
        if last is None:
            raise EngineFailed(result.reason or "no run started")
        for step in (s for s in result.steps if len(s.runs) > 1):
            lines = repeat_lines(step)
            for line in lines:
                bus.emit(LogLine.note(f"{len(step.runs)} repeats: {line}"))
            last.notes.extend(lines)
        if result.status != "completed" and last.status == "completed":
            last.status, last.reason = result.status, result.reason
        return last

    return work
