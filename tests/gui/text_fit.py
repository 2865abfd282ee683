"""Does every text fit its widget? Measured with the font's own metrics, as it would be painted.

A label is cut when its text (wrapped, where the label wraps) needs more room than the label's
contents rectangle, or when the label itself lies partly outside its window. A plot's title line
(its name, then its legend) is cut when it is wider than the plot.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QFontMetrics, QTextDocument
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtWidgets import QLabel, QWidget

from app.gui.fit_label import FitLabel

PROJECTORS = ((1024, 768), (1280, 720), (1920, 1080))
SCALES = (1.0, 1.25, 1.5)
"""Display scaling as Qt applies it: a 1024x768 screen at 125% is 819x614 logical pixels, and
fonts keep their logical size. So a window resized to the logical size is what the room sees."""


MIN_PLOT_DATA_PX = 60
"""A plot whose data area is lower than this shows a line, not a trend."""


def logical_sizes() -> list[tuple[int, int, str]]:
    return [(round(w / s), round(h / s), f"{w}x{h} at {round(s * 100)}%") for w, h in PROJECTORS for s in SCALES]


def _plain(label: QLabel) -> str:
    if label.textFormat() == Qt.TextFormat.RichText or (
            label.textFormat() == Qt.TextFormat.AutoText and GuiQt.mightBeRichText(label.text())):
        doc = QTextDocument()
        doc.setHtml(label.text())
        return doc.toPlainText()
    return label.text()


def cut_labels(root: QWidget) -> list[str]:
    """Every visible label under ``root`` whose text does not fit, with what it needs and has."""
    problems = []
    window = root.window()
    for label in root.findChildren(QLabel):
        if not label.isVisibleTo(window) or not label.isVisible():
            continue
        text = _plain(label)
        if not text.strip():
            continue
        label.ensurePolished()
        metrics = QFontMetrics(label.fitted_font() if isinstance(label, FitLabel) else label.font())
        room = label.contentsRect().adjusted(label.margin(), label.margin(), -label.margin(), -label.margin())
        if label.wordWrap():
            needed = metrics.boundingRect(QRect(0, 0, room.width(), 100_000),
                                          int(Qt.TextFlag.TextWordWrap) | int(label.alignment()), text)
            widest_word = max((metrics.horizontalAdvance(w) for w in text.split()), default=0)
            width, height = widest_word, needed.height()
        else:
            lines = text.split("\n")
            width = max(metrics.horizontalAdvance(line) for line in lines)
            height = metrics.height() * len(lines)
        where = label.objectName() or type(label.parent()).__name__
        if width > room.width() or height > room.height() + 1:
            problems.append(f"{text!r} ({where}) needs {width}x{height} px, has {room.width()}x{room.height()}")
            continue
        shown = label.visibleRegion().boundingRect()
        if shown.size() != label.size():
            problems.append(f"{text!r} ({where}) is {label.width()}x{label.height()} px but only "
                            f"{shown.width()}x{shown.height()} of it is on screen")
    return problems


def cut_plot_texts(panels: dict[str, Any]) -> list[str]:
    """Every plot whose title, legend or time-axis label needs more room than it has, or whose
    plot is wider than its widget (pyqtgraph clips both without a word)."""
    problems = []
    for name, panel in panels.items():
        if not panel.isVisible():
            continue
        item = panel.getPlotItem()
        view = panel.viewport()
        if item.size().width() > view.width() + 1 or item.size().height() > view.height() + 1:
            problems.append(f"plot {name!r} is {item.size().width():.0f}x{item.size().height():.0f} px "
                            f"in a {view.width()}x{view.height()} px view")
        data_height = item.getViewBox().size().height()
        if data_height < MIN_PLOT_DATA_PX:
            problems.append(f"plot {name!r} has {data_height:.0f} px left for its data (under {MIN_PLOT_DATA_PX})")
        title = item.titleLabel
        text = title.item.toPlainText().replace("\n", " | ")
        needed = title.item.boundingRect()
        if needed.width() > title.size().width() + 1 or needed.height() > title.size().height() + 1:
            problems.append(f"plot {name!r}: title {text!r} needs {needed.width():.0f}x{needed.height():.0f} px, "
                            f"has {title.size().width():.0f}x{title.size().height():.0f}")
        axis = item.getAxis("bottom")
        label_width = axis.label.boundingRect().width()
        if axis.isVisible() and label_width > axis.size().width() + 1:
            problems.append(f"plot {name!r}: axis label {axis.labelText!r} needs {label_width:.0f} px, "
                            f"has {axis.size().width():.0f}")
    return problems
