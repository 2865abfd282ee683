"""What the screenshot scripts share: Qt offscreen with the repository importable, the workbench
opened on a shipped profile, and waiting on it while its events are served.

Import it before anything from ``app``: importing it sets the platform and the import path.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication  # noqa: E402

from app.gui.main_window import MainWindow  # noqa: E402
from app.profiles import load_profile_file, resolve_profile  # noqa: E402

DESK = (1366, 768)
"""A laptop's screen."""


def fail(message: str) -> SystemExit:
    """The script's way out, its name first."""
    return SystemExit(f"{Path(sys.argv[0]).stem}: {message}")


def wait_until(app: QApplication, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise fail(f"timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.02)


def pause(app: QApplication, seconds: float) -> None:
    """Serve the window's events for a while (the layout settles, figures repaint)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.02)


def open_window(profile: str, db_path: str, size: tuple[int, int] = DESK) -> tuple[QApplication, MainWindow]:
    """The workbench on a shipped profile and a run database, shown at ``size``."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    path = resolve_profile(profile)
    window = MainWindow(load_profile_file(path), path, db_path=db_path)
    window.resize(*size)
    window.show()
    return app, window
