"""GUI fixtures: an offscreen workbench window that must leave nothing running behind it.

``window`` closes the window at the end of the test the way a user does, waits (without
blocking the event loop) until it has really closed, and then fails the test if any worker
QThread is still running or any engine process the test started is still alive.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import psutil  # noqa: E402
import pytest  # noqa: E402
from PySide6.QtCore import QThread  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.gui.main_window import MainWindow  # noqa: E402
from app.gui.workers import busy_workers  # noqa: E402
from app.profiles import load_profile_file, resolve_profile  # noqa: E402
from engine_adapters.launcher import registered_engines  # noqa: E402

CLOSE_TIMEOUT_MS = 90_000


def live_children() -> set[int]:
    """Processes this test process started (engines run in their own session but stay children)."""
    out = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.add(child.pid)
        except psutil.Error:
            continue
    return out


def leftovers(children_before: set[int], engines_before: set[int],
              threads_before: set[threading.Thread] | None = None) -> list[str]:
    """What is still running that was not before: worker QThreads, Python threads (recorder,
    telemetry, engine log readers), child processes, registered engines."""
    problems = [f"QThread {w.objectName()!r} still running" for w in busy_workers()]
    if threads_before is not None:
        # Dummy entries are how Python sees a QThread that ran Python code; QThreads are checked above.
        problems += [f"thread {t.name!r} still running" for t in threading.enumerate()
                     if t not in threads_before and t.is_alive()
                     and not isinstance(t, threading._DummyThread)]  # type: ignore[attr-defined]
    problems += [f"child process {pid} ({_name(pid)}) still alive" for pid in sorted(live_children() - children_before)
                 if not _is_resource_tracker(pid) and not _is_idle_ray_worker(pid)]
    problems += [f"engine pid {r.pid} still registered" for r in registered_engines() if r.pid not in engines_before]
    return problems


def _is_resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker: one per interpreter, started by the first spawned
    client process and meant to live until the interpreter exits (not a leak of the window)."""
    try:
        return any("multiprocessing.resource_tracker" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _is_idle_ray_worker(pid: int) -> bool:
    """A pooled worker of the session's test Ray cluster (its raylets are this process's children),
    idle between tasks: the cluster's, not the window's. A trial's actor (``ray::TrialWorker``) or
    its engine still counts."""
    try:
        return psutil.Process(pid).cmdline()[:1] == ["ray::IDLE"] or psutil.Process(pid).name() == "ray::IDLE"
    except (psutil.Error, IndexError):
        return False


def _name(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()[:3])
    except psutil.Error:
        return "?"


_ASK = QMessageBox.question  # the real box, before any test patches it


@pytest.fixture(autouse=True)
def _garbage_collected_on_the_gui_thread(qapp) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """What a test left in reference cycles (closed windows, their widgets and plot items) is
    freed here, on the GUI thread, when it ends. Left to the collector, it was freed whenever some
    later test allocated enough: on that test's worker thread, or inside its paint, and Qt crashed
    the process (a segfault in the customer demo's engine start, after the cost tests' windows)."""
    yield
    gc.collect()


def close_window(qtbot, window: MainWindow, timeout_ms: int = CLOSE_TIMEOUT_MS) -> None:  # type: ignore[no-untyped-def]
    # A window closed mid-run asks "Stop the run?" in a modal box. A test that answers it itself
    # has patched the box; otherwise (in this fixture's teardown a test's own monkeypatch is
    # already undone) nobody would answer: answer Yes here.
    if QMessageBox.question is _ASK:
        with mock.patch.object(QMessageBox, "question", return_value=QMessageBox.StandardButton.Yes):
            window.close()
    else:
        window.close()
    qtbot.waitUntil(lambda: window._close_ready and not window.isVisible(), timeout=timeout_ms)
    qtbot.waitUntil(lambda: not busy_workers(), timeout=10_000)


@pytest.fixture
def make_window(qtbot, tmp_path: Path) -> Iterator[Callable[..., MainWindow]]:  # type: ignore[no-untyped-def]
    """Build windows on the cpu-demo profile with a private run database; on teardown close
    each one and fail if a QThread, child process or engine is left running."""
    children_before = live_children()
    engines_before = {r.pid for r in registered_engines()}
    threads_before = set(threading.enumerate())  # the objects: thread idents get reused
    windows: list[MainWindow] = []

    def make(profile: str = "cpu-demo", db_path: Path | None = None) -> MainWindow:
        path = resolve_profile(profile)
        window = MainWindow(load_profile_file(path), path, db_path=str(db_path or tmp_path / "runs.db"))
        window.show()
        qtbot.waitUntil(lambda: window.hardware is not None and window.availability is not None, timeout=60_000)
        windows.append(window)
        return window

    yield make
    for window in windows:
        if not window._close_ready:
            close_window(qtbot, window)
    deadline = time.monotonic() + 10  # threads that were told to stop get a moment to return
    while leftovers(children_before, engines_before, threads_before) and time.monotonic() < deadline:
        qtbot.wait(100)
    problems = leftovers(children_before, engines_before, threads_before)
    assert not problems, "left running after the window closed: " + "; ".join(problems)
    assert QThread.currentThread() is not None


@pytest.fixture
def window(make_window: Callable[..., MainWindow]) -> MainWindow:
    return make_window()
