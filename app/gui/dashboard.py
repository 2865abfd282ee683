"""The live dashboard: big-number tiles and time-series plots over the shared ring buffers.

Views never own data: they read :class:`app.gui.series.SeriesStore` and only call ``setData``
on curves whose ring buffer changed since the last refresh. Plots downsample to the screen
width and clip to the visible range, so panning and zooming an hour of history stays cheap.

Why one module: the tiles, the plot grid and the page switching share one refresh
path driven by the window's timer (one place decides what a tile or plot shows); the data they
read is ``app.gui.series``, the roofline plot ``app.gui.roofline``.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.analysis import metric_catalog as catalog
from app.cost import RunCost, live_cost, usd_text
from app.gui.discard import discard
from app.gui.fit_label import FitLabel
from app.gui.live import StartupView
from app.gui.quality_view import QUALITY_TILE, show_quality, waiting_for_quality
from app.gui.roofline import RooflinePanel, style_plot
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
from app.planner.live import LimitFigures, live_limit_figures, roofline
from app.planner.plan import Plan

pg.setConfigOptions(antialias=False, useOpenGL=False)
CPU_COUNT = os.cpu_count() or 1
"""Cores of this machine: per-core CPU readings are divided by it (``Trace.per_core``)."""
CEILING_IN_VIEW = 4.0
"""The dashed ceiling line is kept in view while it is at most this many times the measured peak."""
LIMIT_TILE = TileSpec("limit", "% of limit", "", "", "{:.0f}%")
"""Output tok/s against the decode ceiling at the batch the engine runs (``app.planner.live``)."""
COST_TILE = TileSpec("cost", "$ / 1M output tokens", "", "", "{}")
"""What a million output tokens cost: live, at the output rate the tokens tile shows, on the GPUs
(or cores) and price the run's ``RunStarted`` gives (``app.cost.live_cost``); after the run, at its
measured throughput from the stored run (``app.cost.run_cost``), the same GPUs and price."""
COST_TILE_TIP = ("What a million output tokens cost at this run's measured throughput: GPUs (or cores) x price "
                 "per hour / output tokens per hour")
LIVE_COST_TIP = ("What a million output tokens cost at the output rate shown beside it (the last few seconds): "
                 "GPUs (or cores) x price per hour / output tokens per hour. After the run, the stored run's "
                 "figure, at its measured throughput, replaces it")

class Tile(QFrame):
    """One big number with its caption and a small line under it (the engine's own figure, or
    the client's figure that was set aside and why)."""

    def __init__(self, spec: TileSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spec = spec
        self.setObjectName("tile")
        # Tiles share the row equally and never widen the window: their texts wrap and shrink.
        policy = QSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)  # a narrow tile grows down for its wrapped lines
        self.setSizePolicy(policy)
        self.setMinimumWidth(80)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 4, 10, 4)
        layout.setSpacing(0)
        # A long number shrinks to the tile (a projector at 1024 px, seven tiles), keeping most of its size.
        self.value_label = FitLabel("–", keep_share=0.6)
        self.value_label.setObjectName("tileValue")
        self.value_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.caption = FitLabel(spec.label, wrap=True)  # long captions wrap, then shrink: never widen the window
        self.caption.setObjectName("tileLabel")
        self.caption.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.sub = FitLabel("", wrap=True)
        self.sub.setObjectName("tileSub")
        self.sub.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(self.value_label)
        layout.addWidget(self.caption)
        layout.addWidget(self.sub)
        self._shown: tuple[str, str, str, str] | None = None

    def show(self, value: str, caption: str, sub: str = "", tooltip: str = "") -> None:  # type: ignore[override]
        """Set what the tile says; unchanged text is not touched (labels are costly to lay out)."""
        wanted = (value, caption, sub, tooltip)
        if wanted == self._shown:
            return
        self._shown = wanted
        self.value_label.setText(value)
        self.caption.setText(caption)
        self.sub.setText(sub)
        self.setToolTip(tooltip)

    def set_value(self, value: float | None) -> None:
        self.show(_fmt(self.spec.fmt, value), self.spec.label)

    def text(self) -> str:
        return self.value_label.text()


def _fmt(fmt: str, value: float | None) -> str:
    return "–" if value is None or not np.isfinite(value) else fmt.format(value)


class TileRow(QWidget):
    """The big numbers. Live, each shows the client's rolling figure with the engine's own
    under it; a client figure that the run flagged unreliable (``app.analysis.metric_catalog``) gives way
    to the engine's figure, labelled, and is shown greyed with its reason. After a run,
    :meth:`show_summary` shows the run's summary figures, labelled as such, until the next run."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(2)
        self.header = QLabel("")
        self.header.setObjectName("tileHeader")
        self.header.setWordWrap(True)  # "Run summary — <a long run name>, ..." never widens the window
        self.header.setVisible(False)
        outer.addWidget(self.header)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.tiles = {spec.key: Tile(spec) for spec in TILES}
        for tile in self.tiles.values():
            row.addWidget(tile)
            tile.setVisible(not tile.spec.only_when_measured)
        # "% of limit": not a catalogue figure, so beside the tiles rather than among them (app.planner.live).
        self.limit_tile = Tile(LIMIT_TILE)
        row.addWidget(self.limit_tile)
        self.cost_tile = Tile(COST_TILE)
        row.addWidget(self.cost_tile)
        self.cost_tile.show("–", COST_TILE.label, "once the run starts", COST_TILE_TIP)
        self.quality_tile = Tile(QUALITY_TILE)  # beside the price: what the run kept (app.gui.quality_view)
        self.quality_tile.setVisible(False)
        row.addWidget(self.quality_tile)
        outer.addLayout(row)
        self.plan: Plan | None = None
        self.plan_note = "no plan yet"
        self.limit: LimitFigures | None = None
        """The live (or, after a run, the last level's) measured rate against its ceiling."""
        self.mode = "live"
        self.flagged: dict[str, str] = {}
        """Client figures (catalogue keys) the running run flagged, with the reason."""
        self.cost_basis: RunCost | None = None
        """What the running run is priced on (``app.cost.live_cost_basis``); None before it starts."""

    def set_header(self, text: str) -> None:
        self.header.setText(text)
        self.header.setVisible(bool(text))

    def set_plan(self, plan: Plan | None, note: str = "") -> None:
        """The plan the run's rates are measured against (None: ``note`` says why there is none)."""
        self.plan, self.plan_note = plan, note or "no plan"
        self.show_limit(None)

    def show_limit(self, figures: LimitFigures | None) -> None:
        """The "% of limit" tile: a share of the ceiling, or, above it, a bug (never over 100%)."""
        self.limit = figures
        if figures is None:
            why = self.plan_note if self.plan is None else "no decode rate and batch measured yet"
            self.limit_tile.show("–", LIMIT_TILE.label, "", why)
        elif figures.fraction is None:
            self.limit_tile.show("bug", f"{LIMIT_TILE.label}: above the ceiling",
                                 f"{figures.ceiling_tok_per_s:,.0f} tok/s ceiling", figures.detail())
        else:
            self.limit_tile.show(f"{100 * min(figures.fraction, 1.0):.0f}%", LIMIT_TILE.label,
                                 f"of {figures.ceiling_tok_per_s:,.0f} at batch {figures.batch:,.1f}", figures.detail())

    def refresh(self, latest: dict[SeriesKey, float]) -> None:
        if self.mode != "live":
            return
        if self.plan is not None:
            self.show_limit(live_limit_figures(self.plan, latest))
        shown: dict[str, float | None] = {}  # each tile's number as shown: the engine's where the client's is set aside
        for tile in self.tiles.values():
            spec = tile.spec
            value = latest.get((spec.source, spec.name))
            if spec.only_when_measured:
                if value is None and tile.isHidden():
                    continue
                tile.setVisible(True)
            engine = latest.get(("engine", spec.engine_name)) if spec.engine_name else None
            figures = {spec.figure: value} if value is not None and spec.figure else {}
            reason = self.flagged.get(spec.figure) or catalog.unreliable_figures(figures).get(spec.figure)
            alt = catalog.metric(spec.figure).engine_alternative if spec.figure else None
            shown[spec.figure] = engine if reason and engine is not None and alt else value
            if reason and engine is not None and alt:
                tile.show(_fmt(spec.engine_fmt, engine), catalog.metric(alt).label,
                          f"client {_fmt(spec.fmt, value)}: unreliable",
                          f"The client's {spec.label} is not shown: {reason}")
            elif reason:
                tile.show(_fmt(spec.fmt, value), f"{spec.label} (unreliable)", "", reason)
            else:
                sub = f"engine {_fmt(spec.engine_fmt, engine)}" if engine is not None else ""
                tile.show(_fmt(spec.fmt, value), spec.label, sub,
                          "The client's figure over the last few seconds" + (
                              f"; under it, the engine's own ({catalog.metric(alt).name})" if alt and sub else ""))
        if self.cost_basis is not None:
            self._show_live_cost(self.cost_basis, shown.get("output_tok_per_s"))

    def set_cost_basis(self, basis: RunCost | None) -> None:
        """Price the running run on ``basis`` (``app.cost.live_cost_basis``) from now on."""
        self.cost_basis = basis
        if basis is not None and basis.price is None:
            self.cost_tile.show("n/a", COST_TILE.label, "no cost", f"{basis.output.reason}\n{COST_TILE_TIP}")

    def _show_live_cost(self, basis: RunCost, output_tok_per_s: float | None) -> None:
        figure = live_cost(basis, output_tok_per_s)
        if figure.usd is not None:
            self.cost_tile.show(usd_text(figure.usd), COST_TILE.label,
                                f"live, {basis.price_text(with_source=False)}", LIVE_COST_TIP)

    def show_summary(self, figures: Mapping[str, float], unreliable: Mapping[str, str], header: str) -> None:
        """The run's (or the last level's) summary figures, in place of the live ones; the cost
        tile waits for the stored run's (``show_cost``), never keeping a live figure."""
        self.mode = "summary"
        self.set_header(header)
        self.cost_basis = None
        self.cost_tile.show("\u2013", COST_TILE.label, "from the stored run", COST_TILE_TIP)
        for tile in self.tiles.values():
            key = tile.spec.figure
            m = catalog.metric(key)
            value = figures.get(key)
            if tile.spec.only_when_measured:
                tile.setVisible(value is not None)
            alt = m.engine_alternative
            reason = unreliable.get(key)
            if reason and alt and figures.get(alt) is not None:
                tile.show(catalog.metric(alt).format(figures[alt]), catalog.metric(alt).label,
                          f"client {m.name} {m.format(value)}: unreliable", f"{m.name} is not shown: {reason}")
            elif reason:
                tile.show(m.format(value), f"{m.label} (unreliable)", "", reason)
            else:
                sub = (f"engine {catalog.metric(alt).format(figures[alt])}"
                       if alt and figures.get(alt) is not None else "")
                tile.show(m.format(value), m.label, sub, m.description)

    def show_cost(self, value: str, sub: str, why: str = "") -> None:
        """The run's cost per 1M output tokens (``value``: ``$0.77``, or ``n/a`` with ``why``)."""
        self.cost_tile.show(value, COST_TILE.label, sub, f"{why}\n{COST_TILE_TIP}" if why else COST_TILE_TIP)

    def show_quality(self, shown: Mapping[str, Any] | None, *, waiting: bool = False) -> None:
        """The quality tile: the probe's figures, or (``waiting``) that they come after the load."""
        if waiting:
            waiting_for_quality(self.quality_tile)
        else:
            show_quality(self.quality_tile, shown)

    def live(self, header: str = "") -> None:
        """Back to live figures (a new run)."""
        self.show_quality(None)
        self.mode = "live"
        self.flagged = {}
        self.set_header(header)
        for tile in self.tiles.values():
            tile.show("–", tile.spec.label)
            tile.setVisible(not tile.spec.only_when_measured)
        self.show_limit(None)
        self.cost_basis = None
        self.cost_tile.show("–", COST_TILE.label, "once the run starts", COST_TILE_TIP)


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


def _font(pt: int, bold: bool = False) -> QFont:
    font = QFont()
    font.setPointSize(pt)
    font.setBold(bold)
    return font


def wrap_entries(entries: Sequence[str], pt: int, width_px: int, gap: str = "   ") -> list[list[int]]:
    """Entries packed greedily into lines no wider than ``width_px`` at ``pt`` (an entry wider
    than that has a line of its own): the indices of each line's entries."""
    metrics = QFontMetrics(_font(pt))
    lines: list[list[int]] = []
    used = 0
    for i, entry in enumerate(entries):
        width = metrics.horizontalAdvance(entry)
        if lines and used + metrics.horizontalAdvance(gap) + width <= width_px:
            lines[-1].append(i)
            used += metrics.horizontalAdvance(gap) + width
        else:
            lines.append([i])
            used = width
    return lines


class PlotPanel(pg.PlotWidget):
    """One plot of a :class:`PlotSpec`; curves appear when their first sample arrives."""

    def __init__(self, spec: PlotSpec, theme: Theme = LIGHT, parent: QWidget | None = None) -> None:
        super().__init__(parent=parent, background=theme.background)
        self.spec, self.theme = spec, theme
        item = style_plot(self, theme)
        item.showGrid(x=False, y=True, alpha=0.15)  # horizontal lines to read values; vertical ones cost ~0.4 ms a refresh
        item.setMenuEnabled(False)
        self._axis_label: tuple[str, int] | None = None
        """The time axis's label as set, and its size: ``_fit_axis_label`` sets it for the width."""
        # The legend is part of the title, above the plot: it never covers a line.
        self._legend: list[tuple[str, str]] = []
        self.ceiling: float | None = None
        """The decode ceiling drawn dashed (the "tokens" plot; ``set_ceiling``)."""
        self._ceiling_line: pg.InfiniteLine | None = None
        self._windows: list[tuple[pg.LinearRegionItem, pg.InfLineLabel]] = []
        """The shaded steady windows (``mark_window``), made once and reused for the panel's life:
        a labelled item dropped on reset is left in a line <-> label cycle still wired to the
        scene's paint signal, and the cyclic GC freed it at any moment, even inside a paint."""
        self._windows_shown = 0
        self._titled_width = -1
        self._set_title()
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

    def _set_title(self) -> None:
        """The title, then the legend, wrapped to the plot's width: a narrow plot (a projector
        at 150%) gets more lines, never a cut one."""
        theme = self.theme
        unit = f"({self.spec.unit})" if self.spec.unit else ""
        entries = [(f"\u2501\u2501 {label}", colour) for label, colour in self._legend]
        if self.ceiling is not None:
            entries.append(("\u2504\u2504 ceiling", self.theme.muted))
            if self.ceiling > CEILING_IN_VIEW * self._data_max():
                entries.append(("(off the scale)", self.theme.muted))
        size = max(theme.plot_title_pt - 2, 8)
        name = self.spec.short if self.spec.short and theme.name == "dark" else self.spec.title
        room = self._title_room()
        bold = QFontMetrics(_font(theme.plot_title_pt, bold=True))
        heading = [f"<b>{html.escape(name)}</b>"] + ([html.escape(unit)] if unit else [])
        one_line = bold.horizontalAdvance(f"{name} {unit}".strip()) <= room
        title = " ".join(heading) if one_line else "<br>".join(heading)
        legend_lines = wrap_entries([text for text, _ in entries], size, room) or [[]]
        legend = "<br>".join("&nbsp;&nbsp;&nbsp;".join(
            f'<span style="color:{entries[i][1]}">{html.escape(entries[i][0])}</span>' for i in line) or "&nbsp;"
            for line in legend_lines)
        item = self.getPlotItem()
        item.setTitle(f'{title}<br><span style="font-size:{size}pt">{legend}</span>', color=theme.foreground,
                      size=f"{theme.plot_title_pt}pt")
        height = math.ceil(item.titleLabel.item.boundingRect().height())  # its lines and the text's margins
        item.titleLabel.setMaximumHeight(height)
        item.titleLabel.setMinimumWidth(0)  # the text is wrapped to the room: it must not widen the plot
        item.layout.setRowFixedHeight(0, height)
        self._titled_width = self.width()
        self._fit_axis_label(room)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        style_plot(self, theme)
        self._set_title()

    def _title_room(self) -> int:
        """Pixels across the plot for the title: the widget less the left axis and margins."""
        return max(self.width() - int(self.getPlotItem().getAxis("left").width()) - 16, 40)

    def _fit_axis_label(self, room: int) -> None:
        """The time axis's label, shortened to its unit when the plot is too narrow for it."""
        axis = self.getPlotItem().getAxis("bottom")
        full = "s since load start"
        text = full if QFontMetrics(_font(self.theme.axis_pt)).horizontalAdvance(full) <= room else "s"
        if self._axis_label != (text, self.theme.axis_pt):
            self._axis_label = (text, self.theme.axis_pt)
            axis.setLabel(text, **{"color": self.theme.muted, "font-size": f"{self.theme.axis_pt}pt"})

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt API
        # Re-wrapped first: the plot is then laid out to the new width with the title's new minimum.
        if getattr(self, "_titled_width", None) not in (None, self.width()):  # pyqtgraph resizes before __init__ ends
            self._set_title()
        super().resizeEvent(event)

    def _data_max(self) -> float:
        return max((hi for _, _, hi in self._extent.values()), default=0.0)

    def set_ceiling(self, value: float | None) -> None:
        """A dashed horizontal line at the decode ceiling (None: none). In view while it is within
        ``CEILING_IN_VIEW`` times the data; above that the legend gives it, "off the scale", so the
        measured curve is not flattened against the floor."""
        if value is not None:
            value = float(f"{value:.3g}")  # a ceiling that moves with the batch: repaint on real moves only
        if value == self.ceiling:
            return
        self.ceiling = value
        item = self.getPlotItem()
        if value is None:
            if self._ceiling_line is not None:
                item.removeItem(self._ceiling_line)
                self._ceiling_line = None
        else:
            if self._ceiling_line is None:
                self._ceiling_line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(
                    self.theme.muted, width=self.theme.line_width, style=Qt.PenStyle.DashLine))
                item.addItem(self._ceiling_line, ignoreBounds=True)
            self._ceiling_line.setPos(value)
        self._set_title()
        self._range = None
        if self.follow:
            self._follow()

    def legend_labels(self) -> list[str]:
        return [label for label, _ in self._legend]

    def _curve(self, key: SeriesKey, label: str, scale: float, colour: int) -> tuple[_Curve, float, int]:
        color = self.theme.curves[colour % len(self.theme.curves)]
        curve = _Curve(pen=pg.mkPen(color, width=self.theme.line_width), name=label, skipFiniteCheck=True)
        self.getPlotItem().addItem(curve)
        self._legend.append((label, color))
        self._set_title()
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
            for n, source in enumerate(sources):
                ring = store.series.get((source, trace.name))
                if ring is None:
                    continue
                key = (source, trace.name)
                curve, scale, seen = self.curves.get(key) or self._curve(
                    key, trace.label if trace.source != "gpu*" or len(sources) == 1 else f"{source} {trace.label}",
                    trace.scale / (CPU_COUNT if trace.per_core else 1), trace.colour + n)
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
        if self.ceiling is not None and self.ceiling <= CEILING_IN_VIEW * y_hi:
            y_hi = max(y_hi, self.ceiling)
        wanted = (0.0, nice_ceil(max(t_end, 10.0)), -nice_ceil(-y_lo) if y_lo < 0 else 0.0, nice_ceil(y_hi * 1.05))
        if wanted != self._range:
            self._range = wanted
            self.getPlotItem().getViewBox().setRange(xRange=wanted[:2], yRange=wanted[2:], padding=0)
            if self.ceiling is not None:
                self._set_title()  # "off the scale" or not

    def mark_window(self, start_s: float, end_s: float, label: str) -> None:
        """Shade a level's steady window (``app.load.delivery``): the span its steady figures are of."""
        if self._windows_shown == len(self._windows):
            colour = pg.mkColor(self.theme.good)
            colour.setAlpha(28)
            region = pg.LinearRegionItem(movable=False, brush=pg.mkBrush(colour),
                                         pen=pg.mkPen(self.theme.good, width=1, style=Qt.PenStyle.DotLine))
            region.setZValue(-10)  # under the curves
            text = pg.InfLineLabel(region.lines[0], position=0.92, anchor=(0, 0.5), color=self.theme.good)
            self.getPlotItem().addItem(region, ignoreBounds=True)
            self._windows.append((region, text))
        region, text = self._windows[self._windows_shown]
        region.setRegion((start_s, end_s))
        text.setFormat(label.replace("{", "{{").replace("}", "}}"))  # a format string: braces are literal
        region.show()
        self._windows_shown += 1

    def steady_windows(self) -> list[tuple[float, float]]:
        """The windows shaded now, as (start, end) seconds on the plot's time axis."""
        return [tuple(region.getRegion()) for region, _ in self._windows[:self._windows_shown]]  # type: ignore[misc]

    def reset(self) -> None:
        for region, _ in self._windows:
            region.hide()  # kept for the next run's windows (see ``_windows``)
        self._windows_shown = 0
        for curve, _, _ in self.curves.values():
            self.getPlotItem().removeItem(curve)
        self._legend.clear()
        self._set_title()
        self.curves.clear()
        self._extent.clear()
        self._decimators.clear()
        self._range = None
        self.follow = True
        self.set_ceiling(None)


class PlotGrid(QWidget):
    """The plots of one layout (desk dashboard or presentation), rebuilt when GPU mode changes."""

    def __init__(self, theme: Theme = LIGHT, columns: int = 3, only: Sequence[str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme, self.columns, self.only = theme, columns, list(only) if only else None
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.panels: dict[str, PlotPanel] = {}
        self.extra: QWidget | None = None
        """A panel after the plots (the dashboard's roofline), in the grid's first free cell."""
        self.has_gpu: bool | None = None
        self.set_gpu_mode(False)

    def set_extra(self, widget: QWidget) -> None:
        self.extra = widget
        self._place_extra()

    def _place_extra(self) -> None:
        if self.extra is None:
            return
        n = len(self.panels)
        columns = self.columns if n <= 2 * self.columns else self.columns + 1  # as the plots are laid out
        self.grid.removeWidget(self.extra)
        self.grid.addWidget(self.extra, n // columns, n % columns)

    def set_gpu_mode(self, has_gpu: bool) -> None:
        if has_gpu == self.has_gpu:
            return
        self.has_gpu = has_gpu
        for panel in self.panels.values():
            discard(panel)
        self.panels.clear()
        specs = plots_for(has_gpu)
        if self.only is not None:
            specs = sorted((s for s in specs if s.key in self.only), key=lambda s: self.only.index(s.key))  # type: ignore[union-attr]
        columns = self.columns if len(specs) <= 2 * self.columns else self.columns + 1  # two rows
        for i, spec in enumerate(specs):
            panel = PlotPanel(spec, self.theme)
            self.panels[spec.key] = panel
            self.grid.addWidget(panel, i // columns, i % columns)
        self._place_extra()

    def refresh(self, store: SeriesStore) -> int:
        return sum(panel.refresh(store) for panel in self.panels.values())

    def set_theme(self, theme: Theme) -> None:
        """New font sizes (the presentation scaled to its screen); the colours stay."""
        self.theme = theme
        for panel in self.panels.values():
            panel.set_theme(theme)

    def mark_window(self, start_s: float, end_s: float, label: str) -> None:
        for panel in self.panels.values():
            panel.mark_window(start_s, end_s, label)

    def reset(self) -> None:
        for panel in self.panels.values():
            panel.reset()


class Dashboard(QWidget):
    """Tiles over a grid of plots, with a line saying what is (not) measured. Before the first
    run it says what to do; while an engine starts, its startup phases stand where the plots
    will be (they would be empty); from the start of the load, the plots."""

    IDLE, STARTUP, PLOTS = range(3)

    def __init__(self, theme: Theme = LIGHT, columns: int = 4, only: Sequence[str] | None = None,
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
        self.roofline = RooflinePanel(theme)
        self.plots.set_extra(self.roofline)
        self.startup = StartupView()
        self.idle = QLabel("")
        self.idle.setObjectName("idleHint")
        self.idle.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.idle.setWordWrap(True)
        self.idle.setStyleSheet(f"font-size: 13pt; color: {theme.muted};")
        self.stack = QStackedWidget()
        self.stack.addWidget(self.idle)
        self.stack.addWidget(self.startup)
        self.stack.addWidget(self.plots)
        layout.addWidget(self.tiles)
        layout.addWidget(self.banner)
        layout.addWidget(self.stack, 1)
        self.show_idle("Press \u25b6 Start to launch the engine and run the load: its startup, then live "
                       "throughput, latency and engine series appear here.")

    def set_support(self, has_gpu: bool, note: str) -> None:
        self.plots.set_gpu_mode(has_gpu)
        self.banner.setText(note)
        self.banner.setVisible(bool(note))

    def show_idle(self, text: str) -> None:
        self.idle.setText(text)
        self.stack.setCurrentIndex(self.IDLE)

    def show_startup(self, title: str) -> None:
        self.startup.start(title)
        self.stack.setCurrentIndex(self.STARTUP)

    def show_plots(self) -> None:
        self.stack.setCurrentIndex(self.PLOTS)

    @property
    def page(self) -> int:
        return self.stack.currentIndex()

    def set_plan(self, plan: Plan | None, note: str = "") -> None:
        """The plan this run is measured against: the "% of limit" tile, the dashed ceiling on
        the token-rate plot and the roofline (None: ``note`` says why there is none)."""
        self.tiles.set_plan(plan, note)
        self.roofline.set_roof(roofline(plan) if plan is not None else None, note)

    def show_limit(self, figures: LimitFigures | None) -> None:
        """A finished level's (or run's) figure: the tile and the ceiling line."""
        self.tiles.show_limit(figures)
        self._show_ceiling(figures)

    def _show_ceiling(self, figures: LimitFigures | None) -> None:
        tokens = self.plots.panels.get("tokens")
        if tokens is not None and figures is not None:
            tokens.set_ceiling(figures.ceiling_tok_per_s)

    def refresh(self, store: SeriesStore, latest: dict[SeriesKey, float]) -> int:
        self.tiles.refresh(latest)
        if self.stack.currentIndex() != self.PLOTS:
            return 0
        if self.tiles.mode == "live" and self.tiles.limit is not None:
            self._show_ceiling(self.tiles.limit)
            self.roofline.set_live(self.tiles.limit)
        return self.plots.refresh(store)

    def reset(self) -> None:
        self.plots.reset()
        self.roofline.reset()
        self.tiles.live()
