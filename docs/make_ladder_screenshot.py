"""docs/ladder.png: the Ladder tab showing a stored ladder from a real run (offscreen Qt).

    .venv/bin/tunebench ladder cpu-ladder --db /tmp/ladder.db          # the real CPU ladder, ~3 min
    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/make_ladder_screenshot.py --db /tmp/ladder.db

Opens the workbench on the cpu-ladder profile with that database, opens its newest ladder in the
Ladder tab and saves the window; ``--presentation`` also saves docs/ladder-presentation.png.
"""

from __future__ import annotations

import argparse
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

SIZE = (1600, 960)


def wait_until(app: QApplication, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"make_ladder_screenshot: timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a run database holding a ladder")
    parser.add_argument("--out", default=str(ROOT / "docs" / "ladder.png"))
    parser.add_argument("--presentation", action="store_true")
    args = parser.parse_args()
    app = QApplication.instance() or QApplication(sys.argv)
    path = resolve_profile("cpu-ladder")
    window = MainWindow(load_profile_file(path), path, db_path=args.db)
    window.resize(*SIZE)
    window.show()
    tab = window.ladder
    window.tabs.setCurrentWidget(tab)
    wait_until(app, lambda: tab.stored_picker.count() > 0, 60, "the stored ladders")
    wait_until(app, lambda: tab._planned_hardware is not None and not tab._planning, 60, "the plan")
    tab.stored_picker.setCurrentIndex(0)
    tab.open_stored()
    for _ in range(30):
        app.processEvents()
        time.sleep(0.02)
    window.grab().save(args.out)
    print(f"wrote {args.out}")
    if args.presentation:
        window.toggle_presentation()
        for _ in range(30):
            app.processEvents()
            time.sleep(0.02)
        out = str(Path(args.out).with_name("ladder-presentation.png"))
        window.grab().save(out)
        print(f"wrote {out}")
        window.toggle_presentation()
    window.close()
    wait_until(app, lambda: window._close_ready, 60, "the window to close")
    return 0


if __name__ == "__main__":
    sys.exit(main())
