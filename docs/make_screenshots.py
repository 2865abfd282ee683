"""Screenshots for the README and docs/gui.md, from a real A/B on the vLLM CPU engine (Qt under Xvfb, or offscreen).

    make screenshots        # under Xvfb: xvfb-run ... QT_QPA_PLATFORM=xcb .venv/bin/python docs/make_screenshots.py

The customer demo, as a presenter gives it: a shared-prefix workload run with prefix caching off,
then on (the kept engine restarts with the flag), then compared. Writes, at a laptop's 1366x768:
docs/main-window.png (the second run, live), docs/engine-start.png (the restart, with the time
left), docs/compare.png (the headline, figures and charts), docs/cost-capacity.png (cost per 1M tokens and
the Capacity box); and at a projector's 1024x768:
docs/presentation.png (live), docs/before-after.png and docs/race.png (the two runs' races, at the
moment the first finished; docs/race.gif, the whole replay). The runs go to a throw-away database
unless --db is given. Takes two to four minutes, most of it the engine's two starts; run it under
the shared engine lock on a machine where others start engines too.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QCheckBox, QComboBox, QLineEdit, QSpinBox
from screenshot_kit import DESK, ROOT, fail, open_window, pause, wait_until

from app.gui.dashboard import Dashboard
from app.gui.main_window import MainWindow
from app.gui.race_view import export_race

PROJECTOR = (1024, 768)


def set_spin(window: MainWindow, path: str, value: int) -> None:
    spin = window.config_panel.editor(path).widget
    assert isinstance(spin, QSpinBox)
    spin.setValue(value)


def choose(window: MainWindow, path: str, value: str) -> None:
    combo = window.config_panel.editor(path).widget
    assert isinstance(combo, QComboBox)
    combo.setCurrentIndex(combo.findData(value))
    combo.activated.emit(combo.currentIndex())


def set_text(window: MainWindow, path: str, value: str) -> None:
    window.config_panel.show_field(path)
    line = window.config_panel.editor(path).widget
    assert isinstance(line, QLineEdit)
    line.setText(value)
    line.editingFinished.emit()


def click_prefix_caching(window: MainWindow) -> None:
    window.config_panel.show_field("features.prefix_caching")
    box = window.config_panel.editor("features.prefix_caching").widget
    assert isinstance(box, QCheckBox)
    QTest.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))


def shoot(window: MainWindow, app: QApplication, path: Path, size: tuple[int, int]) -> None:
    window.resize(*size)
    pause(app, 1.0)
    if not window.grab().save(str(path)):
        raise fail(f"could not write {path}")
    print(path)


def run(window: MainWindow, app: QApplication, during: Callable[[], None] | None = None,
        starting: Callable[[], None] | None = None) -> None:
    pause(app, 1.0)  # validation
    window.start_run()
    if starting is not None:
        wait_until(app, lambda: window.phase_bar.stage == "engine" and window.phase_bar.eta_s() is not None
                   and window.dashboard.page == Dashboard.STARTUP or not window.running, 120, "the engine restart")
        pause(app, 3.0)
        starting()
    wait_until(app, lambda: window.phase_bar.phase == "ready" or not window.running, 600, "the engine")
    if during is not None:
        during()
    wait_until(app, lambda: not window.running, 600, "the run to finish")
    result = window.last_result
    if result is None or result.status != "completed":
        raise fail(f"run did not complete: {window.banner.text()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="run database (default: a temporary one)")
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="tunebench-shots-")
    db = args.db or str(Path(tmp.name) / "runs.db")

    app, window = open_window("cpu-demo", db)
    wait_until(app, lambda: window.availability is not None, 120, "the hardware probe")
    window.keep_engine.setChecked(True)
    window.config_panel.tabs.setCurrentIndex(1)
    choose(window, "workload.kind", "shared_prefix")
    set_spin(window, "workload.shared_prefix_tokens", 512)
    set_spin(window, "workload.num_requests", 400)
    set_spin(window, "workload.output_len.mean", 32)
    set_spin(window, "load.concurrency", 8)
    set_text(window, "load.slo", "ttft_ms<=2000")  # goodput counted: Compare prices the good output
    window.config_panel.tabs.setCurrentIndex(0)

    click_prefix_caching(window)  # off: the baseline
    window.run_bar.note.setText("baseline")
    run(window, app)

    click_prefix_caching(window)  # on: the suggested name says so

    def shoot_start() -> None:
        shoot(window, app, out / "engine-start.png", DESK)

    def shoot_live() -> None:
        tiles = window.dashboard.tiles.tiles
        wait_until(app, lambda: tiles["done"].text() not in ("–", "0"), 120, "first requests")
        pause(app, 6.0)
        shoot(window, app, out / "main-window.png", DESK)
        window.toggle_presentation()
        window.showNormal()  # offscreen "full screen" is the virtual screen; shoot at a projector's size
        shoot(window, app, out / "presentation.png", PROJECTOR)
        window.toggle_presentation()
        window.showNormal()
        window.resize(*DESK)

    run(window, app, during=shoot_live, starting=shoot_start)

    window.tabs.setCurrentWidget(window.history)
    wait_until(app, lambda: len(window.history.runs) >= 2, 30, "the history")
    ids = sorted(r.id for r in window.history.runs)[-2:]
    window.compare_runs(ids)
    wait_until(app, lambda: window.compare.comparison is not None, 60, "the comparison")
    shoot(window, app, out / "compare.png", DESK)
    compare = window.compare
    assert compare.capacity is not None
    compare.charts.setCurrentIndex(compare.charts.count() - 1)  # Cost and capacity
    compare.capacity.slo_edit.setText("ttft_ms<=2000")
    compare.capacity.users.setValue(50)
    compare.capacity.size_it()
    wait_until(app, lambda: compare.capacity is not None and compare.capacity.size_button.isEnabled(), 30,
               "the capacity answer")
    shoot(window, app, out / "cost-capacity.png", DESK)
    compare.charts.setCurrentIndex(0)
    window.present_before_after()
    window.showNormal()
    shoot(window, app, out / "before-after.png", PROJECTOR)
    window.race_compared()  # the baseline and the other run, one request each at its measured pace
    presentation = window.presentation
    wait_until(app, lambda: presentation.page == "race" and presentation.race.finished, 120, "the race")
    race = presentation.race.race
    assert race is not None
    presentation.race.hold(min(race.a.finish_ms, race.b.finish_ms))  # the moment the first one finished
    shoot(window, app, out / "race.png", PROJECTOR)
    print(export_race(race, out / "race.gif"))
    window.toggle_presentation()
    window.showNormal()

    window.close()
    wait_until(app, lambda: window._close_ready, 120, "the window to close and the engine to stop")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
