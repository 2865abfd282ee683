"""The live dashboard: big-number tiles and time-series plots over the shared ring buffers.

Views never own data: they read :class:`app.gui.series.SeriesStore` and only call ``setData``
on curves whose ring buffer changed since the last refresh. Plots downsample to the screen
width and clip to the visible range, so panning and zooming an hour of history stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.gui.series import (
    TILES,
    Decimator,
    PlotSpec,
    Ring,
    SeriesKey,
    SeriesStore,
    TileSpec,
    nice_ceil,
    peak_decimate,
    plots_for,
)
from app.gui.theme import LIGHT, Theme, stylesheet

pg.setConfigOptions(antialias=False, useOpenGL=False)

class Tile(QFrame):
    """One big number with its caption."""

    def __init__(self, spec: TileSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spec = spec
        self.setObjectName("tile")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 6, 12, 6)
        self.value_label = QLabel("–")
        self.value_label.setObjectName("tileValue")
        self.value_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.caption = QLabel(spec.label)
        self.caption.setObjectName("tileLabel")
        self.caption.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(self.value_label)
        layout.addWidget(self.caption)
        self._shown: float | None = None

    def set_value(self, value: float | None) -> None:
        if value == self._shown:
            return
        self._shown = value
        self.value_label.setText("–" if value is None or not np.isfinite(value) else self.spec.fmt.format(value))

    def text(self) -> str:
        return self.value_label.text()


class TileRow(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.tiles = {spec.key: Tile(spec) for spec in TILES}
        for tile in self.tiles.values():
            layout.addWidget(tile)

    def refresh(self, latest: dict[SeriesKey, float]) -> None:
        for tile in self.tiles.values():
            tile.set_value(latest.get((tile.spec.source, tile.spec.name)))


class _Curve(pg.PlotCurveItem):
    """A curve that is handed its data bounds with its data: pyqtgraph would otherwise recompute
    them with NaN-aware reductions several times per paint (about 1 ms a refresh for 12 curves)."""

    _bounds: tuple[float, float, float, float] | None = None

    def set_data(self, t: np.ndarray, v: np.ndarray, bounds: tuple[float, float, float, float] | None) -> None:
        self._bounds = bounds
        self.setData(t, v)

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange: Any = None) -> Any:  # noqa: N802, N803 - Qt API
        bounds = self._bounds
        if bounds is None or frac < 1.0:
            return super().dataBounds(ax, frac, orthoRange)
        return (bounds[0], bounds[1]) if ax == 0 else (bounds[2], bounds[3])


def _finite_range(values: np.ndarray) -> tuple[float, float] | None:
    lo, hi = float(values.min()), float(values.max())
    if np.isfinite(lo) and np.isfinite(hi):
        return lo, hi
    finite = values[np.isfinite(values)]
    return (float(finite.min()), float(finite.max())) if len(finite) else None


class PlotPanel(pg.PlotWidget):
    """One plot of a :class:`PlotSpec`; curves appear when their first sample arrives."""

    def __init__(self, spec: PlotSpec, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent=parent, background=theme.background)
        self.spec, self.theme = spec, theme
        item = self.getPlotItem()
        title = spec.title + (f" ({spec.unit})" if spec.unit else "")
        item.setTitle(title, color=theme.foreground, size=f"{theme.plot_title_pt}pt")
        font = pg.QtGui.QFont()
        font.setPointSize(theme.axis_pt)
        for side in ("left", "bottom"):
            axis = item.getAxis(side)
            axis.setPen(theme.muted)
            axis.setTextPen(theme.foreground)
            axis.setTickFont(font)
            # Text is the costly part of a plot; cache each axis as a pixmap until its range moves.
            axis.setCacheMode(pg.QtWidgets.QGraphicsItem.CacheMode.DeviceCoordinateCache)
        item.showGrid(x=False, y=True, alpha=0.15)  # horizontal lines to read values; vertical ones cost ~0.4 ms a refresh
        item.setMenuEnabled(False)
        item.setLabel("bottom", "seconds", color=theme.muted, size=f"{theme.axis_pt}pt")
        self.legend = item.addLegend(offset=(-4, 4), labelTextColor=theme.foreground,
                                     labelTextSize=f"{max(theme.axis_pt, 8)}pt")
        # Light PlotCurveItems fed with data already clipped to the visible range and decimated to
        # the plot's width (PlotDataItem's own pipeline costs ~15x more per update).
        self.curves: dict[SeriesKey, tuple[_Curve, float, int]] = {}
        self.follow = True  # keep the whole run in view until the user pans or zooms
        self._range: tuple[float, float, float, float] | None = None
        self._extent: dict[SeriesKey, tuple[float, float, float]] = {}  # t_end, min, max shown
        self._decimators: dict[SeriesKey, Decimator] = {}
        view = item.getViewBox()
        view.disableAutoRange()
        view.sigRangeChangedManually.connect(self._user_moved)
        view.sigXRangeChanged.connect(self._x_range_changed)
        item.autoBtn.clicked.connect(self._follow_again)  # the "A" button brings the live view back

    def _mark_dirty(self) -> None:
        for key, (curve, scale, _) in list(self.curves.items()):
            self.curves[key] = (curve, scale, -1)

    def _user_moved(self, *_: object) -> None:
        self.follow = False
        self._range = None
        self._mark_dirty()

    def _x_range_changed(self, *_: object) -> None:
        if not self.follow:
            self._mark_dirty()  # re-clip and re-decimate for the new view on the next refresh

    def _follow_again(self, *_: object) -> None:
        self.follow = True
        self._range = None
        self._mark_dirty()
        self.getPlotItem().getViewBox().disableAutoRange()
        self.getPlotItem().autoBtn.show()

    def _curve(self, key: SeriesKey, label: str, scale: float) -> tuple[_Curve, float, int]:
        color = self.theme.curves[len(self.curves) % len(self.theme.curves)]
        curve = _Curve(pen=pg.mkPen(color, width=self.theme.line_width), name=label, skipFiniteCheck=True)
        self.getPlotItem().addItem(curve)
        if not any(sample.item is curve for sample, _ in self.legend.items):
            self.legend.addItem(curve, label)
        for sample, text in self.legend.items:  # legend text is costly to paint: cache it
            for graphic in (sample, text, text.item):
                graphic.setCacheMode(pg.QtWidgets.QGraphicsItem.CacheMode.DeviceCoordinateCache)
        entry = (curve, scale, -1)
        self.curves[key] = entry
        return entry

    def _visible(self, key: SeriesKey, ring: Ring) -> tuple[np.ndarray, np.ndarray]:
        """The points in view, about one per pixel: the whole run incrementally decimated while
        following, else the zoomed slice (plus one point either side) decimated afresh."""
        width = max(self.width(), 200)
        if self.follow:
            return self._decimators.setdefault(key, Decimator())(ring, width)
        t, v = ring.view()
        (x0, x1), _ = self.getPlotItem().getViewBox().viewRange()
        lo = max(int(np.searchsorted(t, x0)) - 1, 0)
        hi = min(int(np.searchsorted(t, x1)) + 1, len(t))
        return peak_decimate(t[lo:hi], v[lo:hi], width)

    def refresh(self, store: SeriesStore) -> int:
        """Push changed series to their curves; returns how many were updated."""
        updated = 0
        for trace in self.spec.traces:
            sources = store.gpu_sources() if trace.source == "gpu*" else [trace.source]
            for source in sources:
                ring = store.series.get((source, trace.name))
                if ring is None:
                    continue
                key = (source, trace.name)
                curve, scale, seen = self.curves.get(key) or self._curve(
                    key, trace.label if trace.source != "gpu*" or len(sources) == 1 else f"{source} {trace.label}",
                    trace.scale)
                if ring.version == seen:
                    continue
                t, v = self._visible(key, ring)
                shown = v * scale if scale != 1.0 else v
                y_range = _finite_range(shown) if len(shown) else None
                bounds = (float(t[0]), float(t[-1]), *y_range) if y_range is not None else None
                curve.set_data(t, shown, bounds)
                self.curves[key] = (curve, scale, ring.version)
                if bounds is not None:
                    self._extent[key] = (bounds[1], bounds[2], bounds[3])
                updated += 1
        if updated and self.follow:
            self._follow()
        return updated

    def _follow(self) -> None:
        """Show the whole run; limits move in round steps so axes repaint rarely."""
        t_end, y_lo, y_hi = 0.0, 0.0, 0.0
        for end, lo, hi in self._extent.values():
            t_end, y_lo, y_hi = max(t_end, end), min(y_lo, lo), max(y_hi, hi)
        wanted = (0.0, nice_ceil(max(t_end, 10.0)), -nice_ceil(-y_lo) if y_lo < 0 else 0.0, nice_ceil(y_hi * 1.05))
        if wanted != self._range:
            self._range = wanted
            self.getPlotItem().getViewBox().setRange(xRange=wanted[:2], yRange=wanted[2:], padding=0)

    def reset(self) -> None:
        for curve, _, _ in self.curves.values():
            self.getPlotItem().removeItem(curve)
        self.legend.clear()
        self.curves.clear()
        self._extent.clear()
        self._decimators.clear()
        self._range = None
        self.follow = True


class PlotGrid(QWidget):
    """The plots of one layout (desk dashboard or presentation), rebuilt when GPU mode changes."""

    def __init__(self, theme: Theme = LIGHT, columns: int = 3, only: Sequence[str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme, self.columns, self.only = theme, columns, list(only) if only else None
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.panels: dict[str, PlotPanel] = {}
        self.has_gpu: bool | None = None
        self.set_gpu_mode(False)

    def set_gpu_mode(self, has_gpu: bool) -> None:
        if has_gpu == self.has_gpu:
            return
        self.has_gpu = has_gpu
        for panel in self.panels.values():
            self.grid.removeWidget(panel)
            panel.hide()  # gone from the screen now, freed by the event loop
            panel.setParent(None)
            panel.deleteLater()
        self.panels.clear()
        specs = plots_for(has_gpu)
        if self.only is not None:
            specs = [s for s in specs if s.key in self.only]
        columns = self.columns if len(specs) <= 2 * self.columns else self.columns + 1  # two rows
        for i, spec in enumerate(specs):
            panel = PlotPanel(spec, self.theme)
            self.panels[spec.key] = panel
            self.grid.addWidget(panel, i // columns, i % columns)

    def refresh(self, store: SeriesStore) -> int:
        return sum(panel.refresh(store) for panel in self.panels.values())

    def reset(self) -> None:
        for panel in self.panels.values():
            panel.reset()


class Dashboard(QWidget):
    """Tiles over a grid of plots, with a line saying what is (not) measured."""

    def __init__(self, theme: Theme = LIGHT, columns: int = 3, only: Sequence[str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.tiles = TileRow()
        self.tiles.setStyleSheet(stylesheet(theme))
        self.banner = QLabel("")
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.plots = PlotGrid(theme, columns, only)
        layout.addWidget(self.tiles)
        layout.addWidget(self.banner)
        layout.addWidget(self.plots, 1)

    def set_support(self, has_gpu: bool, note: str) -> None:
        self.plots.set_gpu_mode(has_gpu)
        self.banner.setText(note)
        self.banner.setVisible(bool(note))

    def refresh(self, store: SeriesStore, latest: dict[SeriesKey, float]) -> int:
        self.tiles.refresh(latest)
        return self.plots.refresh(store)

    def reset(self) -> None:
        self.plots.reset()
        self.tiles.refresh({})
