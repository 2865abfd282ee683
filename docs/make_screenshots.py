"""Screenshots for the README, from a real run on the vLLM CPU engine (offscreen Qt).

    make screenshots        # = QT_QPA_PLATFORM=offscreen .venv/bin/python docs/make_screenshots.py

Writes docs/main-window.png (during a run), docs/presentation.png and docs/compare.png. Two short
runs on one warm engine (concurrency 16, then 2); the runs go to a throw-away database unless
--db is given. Takes about two minutes, most of it the engine's start.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication, QSpinBox  # noqa: E402

from app.gui.main_window import MainWindow  # noqa: E402
from app.profiles import load_profile, resolve_profile  # noqa: E402

SIZE = (1600, 960)


def wait_until(app: QApplication, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"make_screenshots: timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.02)


def pause(app: QApplication, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.02)


def set_spin(window: MainWindow, path: str, value: int) -> None:
    spin = window.config_panel.editor(path).widget
    assert isinstance(spin, QSpinBox)
    spin.setValue(value)


def run(window: MainWindow, app: QApplication, concurrency: int, requests: int,
        during: Callable[[], None] | None = None) -> None:
    set_spin(window, "load.concurrency", concurrency)
    set_spin(window, "workload.num_requests", requests)
    window.state.replace(window.state.config.model_copy(update={"name": f"CPU demo, {concurrency} concurrent"}))
    pause(app, 1.0)  # validation
    window.start_run()
    wait_until(app, lambda: window.phase_bar.phase == "ready" or not window.running, 400, "the engine")
    if during is not None:
        during()
    wait_until(app, lambda: not window.running, 300, "the run to finish")
    result = window.last_result
    if result is None or result.status != "completed":
        raise SystemExit(f"make_screenshots: run did not complete: {window.banner.text()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="run database (default: a temporary one)")
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="tunebench-shots-")
    db = args.db or str(Path(tmp.name) / "runs.db")

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    path = resolve_profile("cpu-demo")
    window = MainWindow(load_profile(path), path, db_path=db)
    window.resize(*SIZE)
    window.show()
    wait_until(app, lambda: window.availability is not None, 120, "the hardware probe")
    window.keep_engine.setChecked(True)
    set_spin(window, "workload.output_len.mean", 64)

    def shoot_live() -> None:
        tiles = window.dashboard.tiles.tiles
        wait_until(app, lambda: tiles["done"].text() not in ("–", "0"), 120, "first requests")
        pause(app, 8.0)
        window.grab().save(str(out / "main-window.png"))
        window.toggle_presentation()
        window.showNormal()  # offscreen "full screen" is the virtual screen; shoot at a projector size
        window.resize(*SIZE)
        pause(app, 2.0)
        window.grab().save(str(out / "presentation.png"))
        window.toggle_presentation()
        window.showNormal()
        window.resize(*SIZE)

    run(window, app, concurrency=16, requests=1600, during=shoot_live)
    run(window, app, concurrency=2, requests=48)

    window.tabs.setCurrentWidget(window.history)
    wait_until(app, lambda: len(window.history.runs) >= 2, 30, "the history")
    ids = [r.id for r in window.history.runs[:2]][::-1]
    window.compare_runs(ids)
    wait_until(app, lambda: window.compare.comparison is not None, 60, "the comparison")
    index = window.compare.series_choice.findText("client.output_tok_per_s")
    if index >= 0:
        window.compare.series_choice.setCurrentIndex(index)
    pause(app, 1.0)
    window.grab().save(str(out / "compare.png"))

    window.close()
    wait_until(app, lambda: window._close_ready, 120, "the window to close and the engine to stop")
    for name in ("main-window.png", "presentation.png", "compare.png"):
        print(out / name)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
