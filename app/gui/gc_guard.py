"""Python's cyclic garbage collector, run on the GUI thread between events, never elsewhere.

Left to itself the collector runs in whichever thread allocates when its counters pass their
thresholds: a worker, an engine's log reader, or the GUI thread inside a paint. A Qt object caught
in a reference cycle (a widget whose slot a signal still holds, a plot item and its label) is then
deleted there, and Qt takes the process down with a segmentation fault. Collecting from a timer of
the GUI thread frees those cycles at a moment Qt expects; the thresholds stay Python's own.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 250
_NAME = "tunebench-gc-guard"


class GuiGarbageCollector(QObject):
    """While it lives, automatic collection is off and its timer collects what is due."""

    def __init__(self, parent: QObject, interval_ms: int = INTERVAL_MS) -> None:
        super().__init__(parent)
        self.setObjectName(_NAME)
        self._was_enabled = gc.isenabled()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect_due)
        self._timer.start(interval_ms)
        gc.disable()

    def collect_due(self) -> int:
        """Collect the oldest generation whose count passed its threshold, as Python would have
        (0 when none is due); returns what was freed."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        due = [g for g in range(3) if thresholds[g] and counts[g] > thresholds[g]]
        return gc.collect(due[-1]) if due else 0

    def stop(self) -> None:
        """Back to Python's own collection (what was due is collected here, on this thread)."""
        self._timer.stop()
        gc.collect()
        if self._was_enabled:
            gc.enable()
        self.setParent(None)  # type: ignore[call-overload]


def guard_garbage_collection(app: QObject) -> GuiGarbageCollector:
    """The application's guard, made on first use (one per application)."""
    found = app.findChild(GuiGarbageCollector, _NAME)
    return found if isinstance(found, GuiGarbageCollector) else GuiGarbageCollector(app)
