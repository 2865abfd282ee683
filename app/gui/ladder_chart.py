"""The staircase: output tok/s per ladder step as bars that appear as the steps finish, each
labelled with its total tok/s and its factor against the baseline and the previous step (prompts
often outweigh outputs tenfold, so total tok/s on the same axis would flatten the output bars
into the floor: it is written, not drawn); a loss in red,
a skipped step greyed with its word, a reference figure as a dashed mark. The desk theme in the
Ladder tab, the dark one (large type) in presentation mode."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.gui.theme import LIGHT, Theme
from app.ladder.state import LadderState, StepRow, factor_text, limit_text

BAR_WIDTH = 0.55


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


def bar_labels(row: StepRow, first: bool, compact: bool = False, cost: str = "", good_cost: str = "") -> list[str]:
    """The lines above a step's bars: the value, then the factors (what the test reads back),
    last its cost per 1M output tokens when known (``cost``: ``$0.0120``) and per 1M good output
    tokens under the steps' SLO (``good_cost``); ``compact`` (the projector) keeps the value, the
    factor against the baseline, a loss and the cost."""
    if not row.ran or row.output_tok_per_s is None:
        return [row.status]
    lines = [f"{_fmt(row.output_tok_per_s)} tok/s"]
    if not compact and row.total_tok_per_s is not None:
        lines.append(f"(total {_fmt(row.total_tok_per_s)})")
    if first:
        lines.append("baseline")
    elif compact:
        lines.append(factor_text(row.factor_baseline))
        if row.loss:
            lines.append(f"LOSS {factor_text(row.factor_previous)}")
    else:
        lines.append(f"{factor_text(row.factor_baseline)} vs baseline")
        lines.append(("LOSS " if row.loss else "") + f"{factor_text(row.factor_previous)} vs previous")
    if not compact and (row.percent_of_limit is not None or row.ceiling_note):
        lines.append(limit_text(row))
    if cost:
        lines.append(f"{cost} / 1M out")
    if good_cost and not compact:
        lines.append(f"{good_cost} / 1M good")
    return lines


class StaircaseChart(QWidget):
    """``set_state(state)`` redraws; only finished steps get bars, so the staircase grows."""

    def __init__(self, theme: Theme = LIGHT, parent: QWidget | None = None, *, compact: bool = False) -> None:
        super().__init__(parent)
        self.theme = theme
        self.compact = compact
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.plot = pg.PlotWidget(background=theme.background)
        item = self.plot.getPlotItem()
        item.showGrid(y=True, alpha=0.15)
        item.setMenuEnabled(False)
        item.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        font = QFont()
        font.setPointSize(theme.axis_pt)
        for side in ("left", "bottom"):
            axis = item.getAxis(side)
            axis.setTickFont(font)
            axis.setTextPen(theme.foreground)
            axis.setPen(theme.muted)
        item.setLabel("left", "tok/s", color=theme.foreground, size=f"{theme.axis_pt}pt")
        item.setTitle("Output tok/s per step", color=theme.foreground,
                      size=f"{theme.plot_title_pt}pt")
        layout.addWidget(self.plot)
        self.labels: dict[int, list[str]] = {}
        """Per step index, the lines written above its bars (for tests and screenshots)."""
        self.bars: dict[int, tuple[float, float | None]] = {}
        """Per step index that has bars: (output tok/s, total tok/s)."""
        self.costs: dict[int, str] = {}
        self.good_costs: dict[int, str] = {}
        """Per step index, its $ per 1M output tokens as written (``set_costs``)."""

    def clear(self) -> None:
        self.plot.getPlotItem().clear()
        self.labels.clear()
        self.bars.clear()

    def set_costs(self, costs: dict[int, str], source: str = "", good_costs: dict[int, str] | None = None) -> None:
        """Each step's cost per 1M output tokens (and per 1M good output tokens), written under its
        tok/s from the next redraw; ``source`` (whose price) goes in the title."""
        self.costs = dict(costs)
        self.good_costs = dict(good_costs or {})
        title = "Output tok/s per step" + (f" and $ per 1M output tokens ({source})" if costs and source else "")
        self.plot.getPlotItem().setTitle(title, color=self.theme.foreground, size=f"{self.theme.plot_title_pt}pt")

    def set_state(self, state: LadderState | None) -> None:
        self.clear()
        if state is None or not state.rows:
            return
        item = self.plot.getPlotItem()
        rows = state.rows
        first = next((r.index for r in rows if r.ran), None)
        top = max([v for r in rows for v in (r.output_tok_per_s, r.reference_tok_per_s)
                   if v is not None and math.isfinite(v)] or [1.0])
        out_colour = pg.mkColor(self.theme.accent)
        loss_colour = pg.mkColor(self.theme.bad)
        font = QFont()
        font.setPointSize(max(self.theme.axis_pt, 8))
        for row in rows:
            x = float(row.index)
            lines = bar_labels(row, row.index == first, self.compact, self.costs.get(row.index, ""),
                               self.good_costs.get(row.index, ""))
            self.labels[row.index] = lines
            if row.ran and row.output_tok_per_s is not None:
                out = row.output_tok_per_s
                item.addItem(pg.BarGraphItem(x=[x], height=[out], width=BAR_WIDTH,
                                             brush=loss_colour if row.loss else out_colour, pen=None))
                self.bars[row.index] = (out, row.total_tok_per_s)
                height = out
                colour = self.theme.bad if row.loss else self.theme.foreground
            else:
                height = 0.0
                colour = self.theme.muted
            text = pg.TextItem("\n".join(lines), color=colour, anchor=(0.5, 1.0))
            text.setFont(font)
            text.setPos(x, height)
            item.addItem(text)
            if row.reference_tok_per_s is not None:
                ref = pg.PlotDataItem([x - 0.45, x + 0.45], [row.reference_tok_per_s] * 2,
                                      pen=pg.mkPen(self.theme.muted, width=2, style=Qt.PenStyle.DashLine))
                item.addItem(ref)
                label = pg.TextItem(f"reference {_fmt(row.reference_tok_per_s)}", color=self.theme.muted,
                                    anchor=(0.0, 0.5))
                label.setFont(font)
                label.setPos(x + 0.46, row.reference_tok_per_s)
                item.addItem(label)
        limit = 18 if self.compact else 40
        names = [(float(r.index), f"{r.index + 1}. {r.name}" if len(r.name) <= limit
                  else f"{r.index + 1}. {r.name[:limit - 1]}\u2026") for r in rows]
        item.getAxis("bottom").setTicks([names])
        item.setXRange(-0.6, len(rows) - 0.4, padding=0)
        item.setYRange(0, top * (1.45 if self.compact else 1.6), padding=0)
