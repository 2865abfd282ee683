"""A label that shrinks its text to fit rather than cutting it.

A projector at 1024x768, and more so at 125% or 150% display scaling, leaves a tile a hundred
pixels or less: a six-digit throughput at the theme's 48pt would lose its edges. The style sheet
keeps setting the theme's size (the largest the text may take); only the painting shrinks.
"""

from __future__ import annotations

from functools import lru_cache

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QFont, QFontMetrics, QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_PT = 6.0
"""Below this a figure is unreadable from the back of a room; the layout must give more room."""


@lru_cache(maxsize=2048)
def _fits(font_key: str, pt: float, text: str, width: int, height: int, wrap: bool) -> bool:
    font = QFont()
    font.fromString(font_key)
    font.setPointSizeF(pt)
    metrics = QFontMetrics(font)
    if wrap:
        widest_word = max((metrics.horizontalAdvance(word) for word in text.split()), default=0)
        needed = metrics.boundingRect(QRect(0, 0, width, 100_000), int(Qt.TextFlag.TextWordWrap), text)
        return widest_word <= width and needed.height() <= height
    lines = text.split("\n")
    return max(metrics.horizontalAdvance(line) for line in lines) <= width and metrics.height() * len(lines) <= height


class FitLabel(QLabel):
    """A plain-text label painted at the theme's size, or the largest smaller size at which the
    whole text (wrapped, where the label wraps) fits its contents rectangle."""

    def __init__(self, text: str = "", parent: QWidget | None = None, wrap: bool = False,
                 keep_share: float = 0.0) -> None:
        super().__init__(text, parent)
        self.keep_share = keep_share
        """The share of the style's size the layout must always leave room for (a tile's figure
        keeps most of its size; its caption gives way first)."""
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(wrap)
        # Its width is the layout's to give: a long text shrinks instead of widening the window.
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def fitted_font(self) -> QFont:
        """The font the text is painted in: the style's, shrunk until the text fits."""
        font = QFont(self.font())
        room = self.contentsRect()
        base_pt = font.pointSizeF()
        if base_pt <= 0 or not self.text() or room.width() <= 0:
            return font
        key, wrap = font.toString(), self.wordWrap()
        pt = base_pt
        while pt > MIN_PT and not _fits(key, pt, self.text(), room.width(), room.height(), wrap):
            pt = max(MIN_PT, pt * 0.92)
        font.setPointSizeF(pt)
        return font

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt API
        """Room for one line at the smallest size it may take: anything more is the layout's to give."""
        font = QFont(self.font())
        if font.pointSizeF() > 0:
            font.setPointSizeF(max(MIN_PT, font.pointSizeF() * self.keep_share))
        margins = self.contentsMargins()
        return QSize(1, QFontMetrics(font).height() + margins.top() + margins.bottom())

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt API
        painter = QPainter(self)
        painter.setFont(self.fitted_font())
        painter.setPen(self.palette().color(self.foregroundRole()))
        flags = int(self.alignment()) | (int(Qt.TextFlag.TextWordWrap) if self.wordWrap() else 0)
        painter.drawText(self.contentsRect(), flags, self.text())
