"""Presentation mode: dark, full screen, big numbers and three plots, readable from the back of
a room. It reads the same ring buffers as the desk dashboard."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.gui.dashboard import PlotGrid, TileRow
from app.gui.series import SeriesKey, SeriesStore
from app.gui.theme import DARK, stylesheet

PRESENTATION_PLOTS = ("tokens", "latency", "kv")


class PresentationView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("presentation")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # paint the dark background
        self.setStyleSheet(stylesheet(DARK) + f"QWidget#presentation {{ background: {DARK.background}; }}")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.setSpacing(18)
        self.title = QLabel("tunebench")
        self.title.setStyleSheet(f"font-size: 30pt; font-weight: 600; color: {DARK.foreground};")
        self.subtitle = QLabel("")
        self.subtitle.setStyleSheet(f"font-size: 18pt; color: {DARK.muted};")
        self.hint = QLabel("F11 or Ctrl+P: back to the workbench")
        self.hint.setStyleSheet(f"font-size: 11pt; color: {DARK.muted};")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.tiles = TileRow()
        self.plots = PlotGrid(DARK, columns=3, only=PRESENTATION_PLOTS)
        layout.addWidget(self.title)
        layout.addWidget(self.subtitle)
        layout.addWidget(self.tiles)
        layout.addWidget(self.plots, 1)
        layout.addWidget(self.hint)

    def set_heading(self, title: str, subtitle: str) -> None:
        self.title.setText(title)
        self.subtitle.setText(subtitle)

    def refresh(self, store: SeriesStore, latest: dict[SeriesKey, float]) -> int:
        self.tiles.refresh(latest)
        return self.plots.refresh(store)

    def reset(self) -> None:
        self.plots.reset()
        self.tiles.refresh({})
