"""The ladder's staircase to a file: the same chart as the Ladder tab's presentation view
(``StaircaseChart``, dark, compact), its steps appearing one after another (``STEP_S`` each) in
an animation, or the whole staircase as a PNG."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtWidgets import QApplication, QLabel, QVBoxLayout, QWidget

from app.export.animation import write_animation, write_still
from app.gui.ladder_chart import StaircaseChart
from app.gui.race_view import EXPORT_SIZE, rgb_frame
from app.gui.theme import DARK, stylesheet
from app.ladder.state import LadderState
from app.race import FPS, frame_times_ms

STEP_S = 1.0
"""How long each step of an exported staircase stands before the next one appears."""


def staircase_upto(state: LadderState, shown: int) -> LadderState:
    """The ladder as it stood when its first ``shown`` steps had finished (the rest pending, their
    figures kept so that the axes do not move)."""
    rows = [row if k < shown else row.model_copy(update={"status": "pending"}) for k, row in enumerate(state.rows)]
    return state.model_copy(update={"rows": rows})


class _Page(QWidget):
    """The ladder's name and date over its staircase, laid out as on screen but never shown there
    (``WA_DontShowOnScreen``: the chart's axes are placed only once it is shown)."""

    def __init__(self, state: LadderState, size: tuple[int, int]) -> None:
        super().__init__()
        self.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
        self.setStyleSheet(stylesheet(DARK))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 20)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(state.started_wall_s)) if state.started_wall_s else ""
        title = QLabel(f"{state.name or 'Acceleration ladder'}" + (f"  ·  measured {when}" if when else ""))
        title.setStyleSheet(f"font-size: {DARK.tile_label_pt}pt; color: {DARK.muted};")
        layout.addWidget(title)
        self.chart = StaircaseChart(DARK, compact=True)
        layout.addWidget(self.chart, 1)
        self.resize(*size)
        self.show()

    def grab_state(self, state: LadderState) -> QImage:
        self.chart.set_state(state)
        QApplication.processEvents()
        return self.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)


def _timeline(image: QImage, done: float) -> QImage:
    """A strip along the bottom that fills as the animation plays (so no two frames are alike:
    an encoder that merges equal frames keeps one per 1/fps)."""
    painter = QPainter(image)
    try:
        height = max(3, image.height() // 120)
        painter.fillRect(QRectF(0, image.height() - height, image.width() * done, height), QColor(DARK.accent))
    finally:
        painter.end()
    return image


def staircase_frames(state: LadderState, fps: int = FPS, size: tuple[int, int] = EXPORT_SIZE) -> Iterator[QImage]:
    page = _Page(state, size)
    try:
        duration_ms = len(state.rows) * STEP_S * 1e3
        for t_ms in frame_times_ms(duration_ms, fps):
            shown = staircase_upto(state, int(t_ms // (STEP_S * 1e3)) + 1)
            yield _timeline(page.grab_state(shown), t_ms / duration_ms)
    finally:
        page.close()
        page.deleteLater()


def export_staircase(state: LadderState, path: Path, fps: int = FPS, size: tuple[int, int] = EXPORT_SIZE) -> Path:
    """The staircase written to ``path`` (``.gif``, ``.mp4``; ``.png``: every step)."""
    if path.suffix.lower() == ".png":
        page = _Page(state, size)
        try:
            return write_still(rgb_frame(page.grab_state(state)), path)
        finally:
            page.close()
            page.deleteLater()
    return write_animation((rgb_frame(image) for image in staircase_frames(state, fps, size)), path, fps)
