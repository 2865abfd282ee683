"""docs/ladder.png: the Ladder tab showing a stored ladder from a real run (offscreen Qt).

    .venv/bin/tunebench ladder cpu-ladder --db /tmp/ladder.db          # the real CPU ladder, ~3 min
    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/make_ladder_screenshot.py --db /tmp/ladder.db

Opens the workbench on the cpu-ladder profile with that database, opens its newest ladder in the
Ladder tab and saves the window; ``--presentation`` also saves docs/ladder-presentation.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from screenshot_kit import ROOT, open_window, pause, wait_until

SIZE = (1600, 960)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a run database holding a ladder")
    parser.add_argument("--out", default=str(ROOT / "docs" / "ladder.png"))
    parser.add_argument("--presentation", action="store_true")
    args = parser.parse_args()
    app, window = open_window("cpu-ladder", args.db, SIZE)
    tab = window.ladder
    window.tabs.setCurrentWidget(tab)
    wait_until(app, lambda: tab.stored_picker.count() > 0, 60, "the stored ladders")
    wait_until(app, lambda: tab._planned_hardware is not None and not tab._planning, 60, "the plan")
    tab.stored_picker.setCurrentIndex(0)
    tab.open_stored()
    pause(app, 0.6)
    window.grab().save(args.out)
    print(f"wrote {args.out}")
    if args.presentation:
        window.toggle_presentation()
        pause(app, 0.6)
        out = str(Path(args.out).with_name("ladder-presentation.png"))
        window.grab().save(out)
        print(f"wrote {out}")
        window.toggle_presentation()
    window.close()
    wait_until(app, lambda: window._close_ready, 60, "the window to close")
    return 0


if __name__ == "__main__":
    sys.exit(main())
