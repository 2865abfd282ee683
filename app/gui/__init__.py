"""The Qt workbench (PySide6 + pyqtgraph): the only package that imports Qt.

``main(profile)`` opens the main window; see :mod:`app.gui.main_window` for the threading rules.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from app.errors import UserError


def main(profile: str | None = "cpu-demo", db_path: str | None = None) -> int:
    """Open the workbench on a profile (a path or a shipped profile's name)."""
    from app.profiles import ProfileError, load_profile_file, resolve_profile

    try:
        path = resolve_profile(profile) if profile else None
        config = load_profile_file(path) if path else None
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    if (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))):
        raise UserError("no display to open the workbench on (DISPLAY and WAYLAND_DISPLAY are unset); "
                        "run it in a desktop session, or set QT_QPA_PLATFORM=offscreen for a headless check")
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError as exc:  # pragma: no cover - the gui extra is missing
        raise UserError(f"the workbench needs PySide6 and pyqtgraph (pip install 'tunebench[gui]'): {exc}") from None
    from app.gui.main_window import MainWindow

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = MainWindow(config, Path(path) if path else None, db_path=db_path)
    # Ctrl-C / SIGTERM in the terminal close the window the normal way (which stops a run and
    # its engine); the window's 20 Hz timer lets Python see the signal while Qt waits.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: window.close())
    window.show()
    return int(app.exec())
