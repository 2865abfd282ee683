"""Presentation mode: dark, full screen, big numbers and large plots, readable from the back of a
room, fitting a 1024x768 or 1280x720 projector. Three pages: the live run (the same ring buffers as
the desk dashboard), and a before/after view of two runs with the A/B headline
(:mod:`app.headline`), and the race of two measured runs (:mod:`app.gui.race_view`). Each page may read out one finding (:mod:`app.run_findings`): the ended
run's first warning, or why the after run differs from the before."""

from __future__ import annotations

import math

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QGridLayout, QStackedWidget, QVBoxLayout, QWidget

from app.bus import Subscription
from app.gui.dashboard import PlotGrid, TileRow
from app.gui.discard import discard
from app.gui.fit_label import FitLabel
from app.gui.race_view import RaceView
from app.gui.series import SeriesKey, SeriesStore
from app.gui.theme import DARK, MIN_THEME_PT, Theme, scaled, stylesheet
from app.headline import Headline
from app.race import LiveRace, Race

PRESENTATION_PLOTS = ("tokens", "latency", "itl")
FINDING_COLOUR = "#fbbc04"
"""A warning read out on the dark page: amber, as the workbench's warnings."""
VERDICT_COLOURS = {"better": DARK.good, "worse": DARK.bad, "same": DARK.muted, "unreliable": DARK.muted, "": DARK.muted}
DESIGN_SIZE = (1024, 716)
"""The room the presentation page is laid out for at its theme's sizes (a 1024x768 window less
the workbench's banner); on a smaller screen, or a larger display scaling (which leaves fewer
logical pixels), every font shrinks in proportion, so the plots keep room for their curves."""


class _Text(FitLabel):
    """A presentation text at its design size, scaled with the window, shrunk further to fit."""

    def __init__(self, text: str, pt: int, colour: str, bold: bool) -> None:
        super().__init__(text, wrap=True)
        self.design_pt, self.colour, self.bold = pt, colour, bold
        self.set_scale(1.0)

    def set_scale(self, factor: float) -> None:
        size = max(MIN_THEME_PT, round(self.design_pt * factor))
        self.setStyleSheet(f"font-size: {size}pt; color: {self.colour};" + (" font-weight: 600;" if self.bold else ""))


def _label(text: str, pt: int, colour: str = DARK.foreground, bold: bool = False) -> _Text:
    return _Text(text, pt, colour, bold)


def scale_for(width_px: int, height_px: int) -> float:
    """The presentation's font scale for a page: 1 at its design size or larger, less (in steps
    of 0.05, so a resize by a pixel does not restyle) on a smaller one."""
    factor = min(1.0, width_px / DESIGN_SIZE[0], height_px / DESIGN_SIZE[1])
    return max(0.5, math.floor(factor * 20) / 20)


class CurrentPageStack(QStackedWidget):
    """Pages sized by the page shown (a plain stack asks for the largest page's room): the desk
    and the presentation, and the presentation's own pages, so presentation mode fits a 1024x768
    projector whatever the other pages need."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt API
        page = self.currentWidget()
        return page.minimumSizeHint() if page is not None else super().minimumSizeHint()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        page = self.currentWidget()
        return page.sizeHint() if page is not None else super().sizeHint()

    def setCurrentIndex(self, index: int) -> None:  # noqa: N802 - Qt API
        super().setCurrentIndex(index)
        self.updateGeometry()  # the hints above changed with the page


class BeforeAfterView(QWidget):
    """Two runs side by side: what changed, and each headline figure before and after with the
    change in words (``4.6x faster``), coloured only when the figure can be trusted."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(14)
        self.sentence = _label("", 24, DARK.foreground, bold=True)
        layout.addWidget(self.sentence)
        self.why = _label("", 15, DARK.accent)
        self.why.setObjectName("beforeAfterWhy")
        self.why.setVisible(False)
        layout.addWidget(self.why)
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(24)
        self.grid.setVerticalSpacing(10)
        layout.addLayout(self.grid)
        self.money = _label("", 22, DARK.accent, bold=True)
        self.money.setObjectName("beforeAfterMoney")
        layout.addWidget(self.money)
        self.quality = _label("", 18, DARK.foreground, bold=True)  # greyed within the noise floor
        self.quality.setObjectName("beforeAfterQuality")
        self.quality.setVisible(False)
        layout.addWidget(self.quality)
        self.note = _label("", 13, DARK.muted)
        layout.addWidget(self.note)
        layout.addStretch(1)
        self.headline: Headline | None = None
        self.scale = 1.0

    def set_scale(self, factor: float) -> None:
        self.scale = factor
        for label in self.findChildren(_Text):
            label.set_scale(factor)

    def show_headline(self, headline: Headline, money: str = "", why: str = "") -> None:
        """``money``: the same change in money (``app.headline.money_line``), the line a customer
        remembers; ``why``: the top reason the after run differs (``app.run_findings.top_change``);
        each hidden when there is none."""
        self.headline = headline
        self.money.setText(money)
        self.money.setVisible(bool(money))
        self.why.setText(why)
        self.why.setVisible(bool(why))
        kept = headline.quality
        self.quality.setText(kept.text if kept is not None else "")
        self.quality.colour = DARK.muted if kept is None or kept.greyed else DARK.foreground
        self.quality.setVisible(kept is not None)
        lead = headline.lead
        self.sentence.setText(lead.text() if lead is not None else "No clear difference in the headline figures")
        while self.grid.count():
            item = self.grid.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                discard(widget)
        self.grid.addWidget(_label("", 14), 0, 0)
        self.grid.addWidget(_label(f"Before\n{headline.before_label}", 16, DARK.muted, True), 0, 1)
        self.grid.addWidget(_label(f"After\n{headline.after_label}", 16, DARK.muted, True), 0, 2)
        self.grid.addWidget(_label("Change", 16, DARK.muted, True), 0, 3)
        notes = []
        for row, fig in enumerate(headline.figures, start=1):
            muted = fig.verdict == "unreliable"
            value_colour = DARK.muted if muted else DARK.foreground
            self.grid.addWidget(_label(fig.name + (f" ({fig.unit})" if fig.unit else ""), 18, DARK.muted), row, 0)
            self.grid.addWidget(_label(fig.before_text, 40, value_colour, True), row, 1)
            self.grid.addWidget(_label(fig.after_text, 40, value_colour, True), row, 2)
            change = fig.factor if fig.verdict != "same" else "no significant difference"
            self.grid.addWidget(_label(change or "–", 22, VERDICT_COLOURS.get(fig.verdict, DARK.muted), True), row, 3)
            if fig.note:
                notes.append(f"{fig.name}: {fig.note}")
        for col, stretch in enumerate((3, 2, 2, 3)):
            self.grid.setColumnStretch(col, stretch)
        self.note.setText("\n".join(notes))
        self.set_scale(self.scale)


class PresentationView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("presentation")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)  # paint the dark background
        self.setStyleSheet(stylesheet(DARK) + f"QWidget#presentation {{ background: {DARK.background}; }}")
        self._layout = layout = QVBoxLayout(self)
        self._space(1.0)
        self.title = _label("tunebench", 26, DARK.foreground, bold=True)
        self.subtitle = _label("", 15, DARK.muted)
        self.features = _label("", 15, DARK.accent)
        self.finding = _label("", 14, FINDING_COLOUR, bold=True)  # the ended run's first warning
        self.finding.setObjectName("presentationFinding")
        self.finding.setVisible(False)
        self.hint = _label("F11 or Esc: back to the workbench  ·  L: live  ·  B: before/after  ·  R: race", 11,
                           DARK.muted)
        self.hint.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.tiles = TileRow()
        self.plots = PlotGrid(DARK, columns=3, only=PRESENTATION_PLOTS)
        live = QWidget()
        live_layout = QVBoxLayout(live)
        live_layout.setContentsMargins(0, 0, 0, 0)
        live_layout.addWidget(self.finding)
        live_layout.addWidget(self.tiles)
        live_layout.addWidget(self.plots, 1)
        self._live_layout = live_layout
        self.before_after = BeforeAfterView()
        self.empty = _label("Choose two runs in Compare and press \u201cPresent before/after\u201d.", 18, DARK.muted)
        self.pages = CurrentPageStack()
        self.pages.addWidget(live)
        self.pages.addWidget(self.before_after)
        self.pages.addWidget(self.empty)
        self.race = RaceView()  # app.gui.race_view: two measured runs replayed side by side
        self.pages.addWidget(self.race)
        layout.addWidget(self.title)
        layout.addWidget(self.subtitle)
        layout.addWidget(self.features)
        layout.addWidget(self.pages, 1)
        layout.addWidget(self.hint)
        self._live_heading = ("tunebench", "", "")
        self.scale = 1.0

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt API
        factor = scale_for(event.size().width(), event.size().height())
        if factor != self.scale:  # restyled before the layout places anything at the new size
            self.set_theme(scaled(DARK, factor), factor)
        super().resizeEvent(event)

    def _space(self, factor: float) -> None:
        """Margins and gaps at their design size, scaled as the fonts are."""
        self._layout.setContentsMargins(*(round(m * factor) for m in (24, 14, 24, 10)))
        self._layout.setSpacing(round(10 * factor))

    def set_theme(self, theme: Theme, factor: float) -> None:
        self.scale = factor
        self._space(factor)
        self.setStyleSheet(stylesheet(theme) + f"QWidget#presentation {{ background: {theme.background}; }}")
        for label in self.findChildren(_Text):
            label.set_scale(factor)
        self.before_after.scale = factor
        self.plots.set_theme(theme)

    # -- the heading ------------------------------------------------------------------------

    def set_heading(self, title: str, subtitle: str, features: str = "") -> None:
        """What is shown: the run, the model and load, and which features are on."""
        self._live_heading = (title, subtitle, features)
        if self.page == "live":
            self._apply_heading(*self._live_heading)

    def _apply_heading(self, title: str, subtitle: str, features: str) -> None:
        self.title.setText(title)
        self.subtitle.setText(subtitle)
        self.features.setText(features)
        self.features.setVisible(bool(features))

    # -- pages --------------------------------------------------------------------------------

    @property
    def page(self) -> str:
        return ("live", "before_after", "empty", "race")[self.pages.currentIndex()]

    def show_live(self) -> None:
        self.race.stop()
        self.pages.setCurrentIndex(0)
        self._apply_heading(*self._live_heading)

    def show_race(self, race: Race) -> None:
        """The race page, replaying ``race`` from its start."""
        self.pages.setCurrentIndex(3)
        self._apply_heading("The race: one prompt each, at its measured pace", f"A: {race.a.name}  \u2192  "
                            f"B: {race.b.name}", "")
        self.race.set_race(race)

    def show_live_race(self, live: LiveRace, events: Subscription) -> None:
        """The race page, following two trials that run now (``RaceView.follow_live``)."""
        self.pages.setCurrentIndex(3)
        self._apply_heading("The race, live: one prompt each, as it streams", "Two trials running side by side", "")
        self.race.follow_live(live, events)

    def show_before_after(self, headline: Headline | None = None, money: str = "", why: str = "") -> None:
        self.race.stop()
        if headline is not None:
            self.before_after.show_headline(headline, money, why)
        current = self.before_after.headline
        if current is None:
            self.pages.setCurrentIndex(2)
            self._apply_heading("Before and after", "", "")
            return
        self.pages.setCurrentIndex(1)
        change = current.change or "Before and after"
        self._apply_heading(change[:1].upper() + change[1:],
                            f"Before: {current.before_label}  \u2192  After: {current.after_label}", "")

    def set_finding(self, text: str) -> None:
        """The live page's one finding (the ended run's first warning); "" hides it."""
        self.finding.setText(text)
        self.finding.setVisible(bool(text))

    def add_above_plots(self, widget: QWidget, stretch: int) -> None:
        """A campaign's own chart on the live page, between the tiles and the plots."""
        self._live_layout.insertWidget(self._live_layout.indexOf(self.plots), widget, stretch)

    def refresh(self, store: SeriesStore, latest: dict[SeriesKey, float]) -> int:
        self.tiles.refresh(latest)
        if self.page != "live":
            return 0
        return self.plots.refresh(store)

    def reset(self) -> None:
        self.plots.reset()
        self.tiles.live()
