"""Work off the GUI thread: every call that may block (engine, store, files, subprocesses) runs
in a :class:`Worker` QThread and comes back by signal, as a result or a one-line message."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any, ClassVar

import shiboken6
from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine_adapters.errors import TunebenchError

log = logging.getLogger("tunebench.gui")


def user_message(exc: BaseException) -> str:
    """A plain one-line message for the user; the traceback goes to the log, never the screen.
    Errors the user can act on (every :class:`TunebenchError`: input, store, runtime, engine) are
    shown as their own message; anything else is unexpected and keeps its type name."""
    text = str(exc).strip()
    if isinstance(exc, TunebenchError):
        return text or type(exc).__name__
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class Worker(QThread):
    """Runs ``fn()`` once in its own thread. ``succeeded(result)`` or ``failed(message)`` is
    emitted (delivered on the receiver's thread). Live workers are tracked so the window can
    wait for them before closing and tests can prove none is left running."""

    succeeded = Signal(object)
    failed = Signal(str)
    live: ClassVar[set[Worker]] = set()

    def __init__(self, fn: Callable[[], Any], name: str = "worker", parent: QObject | None = None) -> None:
        # No Qt parent on purpose: a thread must not be destroyed with its window while running;
        # the ``live`` set keeps it until it has finished. ``parent`` is accepted for readability.
        super().__init__()
        del parent
        self.fn = fn
        self.setObjectName(name)
        self.error: BaseException | None = None
        Worker.live.add(self)
        self.finished.connect(self._done)

    def run(self) -> None:  # runs in the worker thread
        try:
            result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
            if isinstance(exc, TunebenchError):  # the user's to act on: its message says it all
                log.info("worker %s: %s", self.objectName(), exc)
            else:  # a bug: keep the traceback
                log.warning("worker %s failed:\n%s", self.objectName(), traceback.format_exc())
            # Kept without its traceback (logged above): its frames would hold this worker in a
            # cycle, left to the cyclic GC, which may free a QThread on any thread at any moment.
            self.error = exc.with_traceback(None)
            self.failed.emit(user_message(exc))
            return
        self.succeeded.emit(result)

    def _done(self) -> None:
        Worker.live.discard(self)
        self.deleteLater()


class _Relay(QObject):
    """Lives on the GUI thread, so plain callbacks run there (queued), not in the worker."""

    def __init__(self, on_ok: Callable[[Any], None] | None, on_error: Callable[[str], None] | None) -> None:
        super().__init__()
        self._on_ok, self._on_error = on_ok, on_error

    @Slot(object)
    def ok(self, result: Any) -> None:
        if self._on_ok is not None:
            self._on_ok(result)

    @Slot(str)
    def error(self, message: str) -> None:
        if self._on_error is not None:
            self._on_error(message)


def run_in_worker(fn: Callable[[], Any], on_ok: Callable[[Any], None] | None = None,
                  on_error: Callable[[str], None] | None = None, *, name: str = "worker",
                  parent: QObject | None = None) -> Worker:
    """Start ``fn`` in a worker; ``on_ok``/``on_error`` are called on the calling (GUI) thread."""
    worker = Worker(fn, name, parent)
    relay = _Relay(on_ok, on_error)
    worker.relay = relay  # type: ignore[attr-defined]  # keep alive as long as the worker
    worker.succeeded.connect(relay.ok)
    worker.failed.connect(relay.error)
    worker.start()
    return worker


def busy_workers() -> list[Worker]:
    return [w for w in list(Worker.live) if shiboken6.isValid(w) and w.isRunning()]
