"""The roofline in the live dashboard: the plan's bandwidth slope and compute roof (log-log), the
running point (live) and one point per finished level. The figures come from
``app.planner.live`` (the same as the CLI's table and the HTML report); this only draws them."""

from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QGraphicsItem, QSizePolicy, QWidget

from app.gui.theme import LIGHT, Theme
from app.planner.live import LimitFigures, Roofline


def style_plot(widget: pg.PlotWidget, theme: Theme) -> pg.PlotItem:
    """Every plot's frame: shares what room there is (never asks for more than its cell), axes in
    the theme's colours and size, each axis cached as a pixmap until its range moves (text is the
    costly part of a plot)."""
    widget.setMinimumSize(140, 110)
    widget.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
    item = widget.getPlotItem()
    font = pg.QtGui.QFont()
    font.setPointSize(theme.axis_pt)
    for side in ("left", "bottom"):
        axis = item.getAxis(side)
        axis.setPen(theme.muted)
        axis.setTextPen(theme.foreground)
        axis.setTickFont(font)
        axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    return item

BUG_COLOUR_INDEX = 3
"""A point above its ceiling is drawn hollow in the theme's red (``curves[3]``): a bug, not a record."""


class RooflinePanel(pg.PlotWidget):
    """Achieved FLOP/s against arithmetic intensity, under the hardware's roof."""

    def __init__(self, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent=parent, background=theme.background)
        self.theme = theme
        item = style_plot(self, theme)
        item.setLogMode(x=True, y=True)
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setMenuEnabled(False)
        item.setLabel("bottom", "FLOP/byte", **{"color": theme.muted, "font-size": f"{theme.axis_pt}pt"})
        item.setLabel("left", "FLOP/s", **{"color": theme.muted, "font-size": f"{theme.axis_pt}pt"})
        self.roof_curve = pg.PlotDataItem(pen=pg.mkPen(theme.muted, width=max(theme.line_width, 1.5)))
        self.level_points = pg.ScatterPlotItem(size=9)
        self.live_point = pg.ScatterPlotItem(size=12, symbol="star")
        for it in (self.roof_curve, self.level_points, self.live_point):
            item.addItem(it)
        self.roof: Roofline | None = None
        self.levels: list[tuple[str, LimitFigures]] = []
        self.live: LimitFigures | None = None
        self.note = "no plan yet"
        self._set_title()

    def _set_title(self) -> None:
        theme = self.theme
        size = max(theme.plot_title_pt - 2, 8)
        roof = self.roof
        sub = html.escape(self.note if roof is None else f"{roof.bandwidth_bytes_per_s / 1e9:,.0f} GB/s" + (
            f" \u00b7 {roof.peak_flop_per_s / 1e12:,.0f} TFLOP/s" if roof.peak_flop_per_s else " \u00b7 no compute roof"))
        self.getPlotItem().setTitle(f"<b>Roofline</b> (log-log)<br><span style=\"font-size:{size}pt\">{sub}</span>",
                                    color=theme.foreground, size=f"{theme.plot_title_pt}pt")

    def set_roof(self, roof: Roofline | None, note: str = "") -> None:
        """The hardware's roof (None: no plan, ``note`` says why)."""
        self.roof, self.note = roof, note or "no plan"
        self._set_title()
        self._draw()

    def set_live(self, figures: LimitFigures | None) -> None:
        if figures == self.live:
            return
        self.live = figures
        self._draw_points(live_only=True)

    def add_level(self, label: str, figures: LimitFigures | None) -> None:
        if figures is not None:
            self.levels.append((label, figures))
            self._draw()

    def reset(self) -> None:
        self.levels.clear()
        self.live = None
        self._draw()

    def points(self) -> list[tuple[float, float]]:
        """(intensity, FLOP/s) of the finished levels, as drawn."""
        return [(f.arithmetic_intensity_flop_per_byte, f.achieved_flop_per_s) for _, f in self.levels]

    def _extent(self) -> tuple[float, float]:
        xs = [f.arithmetic_intensity_flop_per_byte for _, f in self.levels]
        if self.live is not None:
            xs.append(self.live.arithmetic_intensity_flop_per_byte)
        ridge = self.roof.ridge_flop_per_byte if self.roof is not None else None
        lo = 10 ** math.floor(math.log10(max(min([*xs, ridge or 1.0, 1.0]) / 2, 1e-6)))
        hi = 10 ** math.ceil(math.log10(max([*xs, (ridge or 1.0) * 4, 10.0]) * 2))
        return lo, hi

    def _draw(self) -> None:
        if self.roof is None:
            self.roof_curve.setData([], [])
        else:
            lo, hi = self._extent()
            xs = np.geomspace(lo, hi, 64)
            self.roof_curve.setData(xs, [self.roof.attainable_flop_per_s(x) for x in xs])
        self._draw_points(live_only=False)

    def _spot(self, figures: LimitFigures, colour: str, label: str) -> dict[str, object]:
        bug = self.theme.curves[BUG_COLOUR_INDEX]
        above = figures.fraction is None
        return {"pos": (math.log10(figures.arithmetic_intensity_flop_per_byte), math.log10(figures.achieved_flop_per_s)),
                "brush": pg.mkBrush(None if above else colour), "pen": pg.mkPen(bug if above else colour, width=2),
                "data": f"{label}: {figures.text()}; {figures.detail()}"}

    def _draw_points(self, live_only: bool) -> None:
        # Log mode: ScatterPlotItem takes positions already in log10 (PlotDataItem converts its own).
        if not live_only:
            self.level_points.setData([self._spot(f, self.theme.curves[i % len(self.theme.curves)], label)
                                       for i, (label, f) in enumerate(self.levels)])
            self.level_points.setToolTip("\n".join(f"{label}: {f.text()}" for label, f in self.levels))
        live = self.live
        self.live_point.setData([self._spot(live, self.theme.curves[1], "now")] if live is not None else [])
        base = self.roof.label if self.roof is not None else self.note
        self.setToolTip(base + (f"\nnow: {live.text()} ({live.detail()})" if live is not None else ""))
