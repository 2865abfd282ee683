"""The race and the staircase without a real engine: a store recorded before samples were kept
(``tests/data/store-before-campaigns.db``, a real ladder's runs) still opens, its runs say in one
line that they cannot race, and its ladder's staircase exports as an animation of a frame per
twentieth of a second and as a PNG."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtCore import Qt

from app.export.animation import gif_frame_cs
from app.gui.staircase_export import STEP_S
from app.ladder.stored import list_ladders
from app.race import FPS
from app.store import RunStore
from tests.fuzz.hostile import cli

pytestmark = pytest.mark.gui

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    shutil.copyfile(DATA / "store-before-campaigns.db", path)
    return path


def test_runs_stored_before_samples_say_in_one_line_that_they_cannot_race(old_store: Path) -> None:
    outcome = cli("race", "1", "2", "--db", str(old_store), "--export", str(old_store.parent / "race.gif"))
    assert outcome.code != 0 and outcome.out == ""
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and "no sample request stored" in lines[0] and "run 1" in lines[0], outcome.err
    assert not (old_store.parent / "race.gif").exists()


def test_a_stored_ladders_staircase_exports_as_an_animation_and_a_png(old_store: Path, qapp) -> None:  # type: ignore[no-untyped-def]
    with RunStore(str(old_store)) as store:
        ladder = list_ladders(store)[0].state
    ladder_id, steps = ladder.ladder_id, len(ladder.rows)
    gif, png = old_store.parent / "stairs.gif", old_store.parent / "stairs.png"
    for path in (gif, png):
        outcome = cli("staircase", ladder_id, "--db", str(old_store), "--export", str(path))
        assert outcome.code == 0, outcome.err
    with Image.open(gif) as image:
        assert image.n_frames == math.ceil(steps * STEP_S * FPS)
        durations = []
        for k in range(image.n_frames):
            image.seek(k)
            durations.append(image.info["duration"])
        assert set(durations) == {gif_frame_cs(FPS) * 10}  # ms, as Pillow reads a GIF's hundredths
    with Image.open(png) as still:
        assert still.size == (1024, 576) and len(still.convert("RGB").getcolors(1 << 20) or ()) > 10


def test_compare_and_the_ladder_race_and_an_old_run_says_why_it_cannot(make_window, old_store: Path, qtbot) -> None:  # type: ignore[no-untyped-def]
    """Race, from Compare and from the Ladder tab, reads the runs in a worker; runs without a
    sample say so in the banner, in one line, and presentation mode is not entered."""
    window = make_window(db_path=old_store)
    window.compare_runs([1, 4])
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=30_000)
    assert window.compare.race_button.isEnabled()
    qtbot.mouseClick(window.compare.race_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "no sample request stored" in window.banner.text(), timeout=30_000)
    assert "\n" not in window.banner.text().strip() and "run 1 " in window.banner.text()
    assert not window.presenting
    window.show_banner(None)
    tab = window.ladder
    qtbot.waitUntil(lambda: tab.stored_picker.count() == 2, timeout=30_000)
    tab.stored_picker.setCurrentIndex(next(i for i in range(2) if "4/4" in tab.stored_picker.itemText(i)))
    tab.stored_picker.activated.emit(tab.stored_picker.currentIndex())
    qtbot.waitUntil(tab.race_button.isEnabled, timeout=10_000)
    qtbot.mouseClick(tab.race_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "no sample request stored" in window.banner.text(), timeout=30_000)
    assert "run 1 " in window.banner.text() and not window.presenting
