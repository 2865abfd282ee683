"""The workbench under a real X server (run by ``test_race_e2e`` in a process of its own, with
``DISPLAY`` set to an Xvfb): Compare two stored runs, press Race, watch the replay in
presentation mode to its finish, then the presentation's before/after and live pages; each
screen is grabbed from the X server itself (what a projector would show) into OUT.

    DISPLAY=:N QT_QPA_PLATFORM=xcb python -m tests.e2e.race_screens DB OUT A B

Prints one JSON line: what it saw (pages, the verdict, the window's size on the screen)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.gui.main_window import MainWindow
from app.profiles import load_profile_file, resolve_profile
from docs.screenshot_kit import fail, pause, wait_until


def shoot(app: QApplication, path: Path) -> str:
    """The whole X screen, as the server has it (not a widget's own rendering)."""
    pause(app, 0.5)
    screen = app.primaryScreen()
    if not screen.grabWindow(0).save(str(path)):
        raise fail(f"could not write {path}")
    return path.name


def main(db: str, out: Path, a: int, b: int) -> dict[str, object]:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    path = resolve_profile("cpu-demo")
    window = MainWindow(load_profile_file(path), path, db_path=db)
    window.show()
    seen: dict[str, object] = {"platform": app.platformName()}
    wait_until(app, lambda: len(window.history.runs) >= 2, 60, "the history")
    window.compare_runs([a, b], baseline=a)
    wait_until(app, lambda: window.compare.comparison is not None and window.compare.race_button.isEnabled(), 60,
               "the comparison")
    window.compare.race_button.click()
    presentation = window.presentation
    wait_until(app, lambda: presentation.page == "race" and presentation.race.race is not None, 60, "the race")
    race = presentation.race.race
    assert race is not None
    # Xvfb runs no window manager, and full screen is a window manager's doing: do what it would.
    window.setGeometry(app.primaryScreen().geometry())
    wait_until(app, lambda: presentation.race.finished, 120, "the finish")
    presentation.race.hold(race.duration_ms * 0.5)  # a demo model's replay is over in a blink
    shots = [shoot(app, out / "race-running.png")]
    presentation.race.start()
    wait_until(app, lambda: presentation.race.finished, 120, "the finish of the replay again")
    shots.append(shoot(app, out / "race-finished.png"))
    seen.update(race_page=presentation.page, verdict=race.verdict(), presenting=window.presenting,
                window=[window.width(), window.height()], duration_ms=race.duration_ms)
    window.present_before_after()
    shots.append(shoot(app, out / "presentation-before-after.png"))
    presentation.show_live()
    shots.append(shoot(app, out / "presentation-live.png"))
    seen["shots"] = shots
    window.close()
    wait_until(app, lambda: window._close_ready, 120, "the window to close")
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
