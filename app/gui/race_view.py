"""The race on screen and in a file: :func:`paint_race` draws one moment of an ``app.race.Race``
(both sides' text so far, live TTFT and tok/s, each side's track to the finish line, the
verdict once both are in). The window (:class:`RaceView`, driven by a QTimer, never blocking the
GUI thread) and the export (:func:`render_frames`, painted into QImages without a display) call
the same function, so what a customer takes away is what was shown."""

from __future__ import annotations

import os
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from PySide6.QtCore import QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QImage, QPainter, QPaintEvent, QPen, QTextOption
from PySide6.QtWidgets import QApplication, QComboBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.bus import Subscription
from app.events import Event
from app.export.animation import Frame, write_animation, write_still
from app.gui.theme import DARK, Theme
from app.race import FPS, LiveRace, Race, RaceSide, SideState, frame_times_ms

EXPORT_SIZE = (1024, 576)
"""An exported replay's frame, in pixels (16:9, readable on a slide)."""
TICK_MS = 1000 // FPS
"""The window repaints at the export's frame rate."""
SIDE_COLOURS = {"A": 0, "B": 1}
"""Each side's colour: the theme's curve of this index."""


def _font(pt: float, bold: bool = False) -> QFont:
    font = QFont()
    font.setPointSizeF(max(6.0, pt))
    font.setBold(bold)
    return font


WRAP = QTextOption()
WRAP.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
"""Streamed text wraps between words, and inside a word longer than the line (never cut)."""


def _fitting_tail(painter: QPainter, text: str, rect: QRectF) -> str:
    """The longest end of ``text`` that fits ``rect`` wrapped in the painter's font (the newest
    text stays in view)."""
    def shown(start: int) -> str:
        return text if start == 0 else "…" + text[start:]

    def fits(start: int) -> bool:
        return painter.boundingRect(rect, shown(start), WRAP).height() <= rect.height()

    if fits(0):
        return text
    low, high = 0, len(text)
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return shown(low)


def _fit_pt(text: str, pt: float, width: float, bold: bool = False) -> float:
    """``pt``, or smaller so that ``text`` fits ``width`` on one line: never cut."""
    while pt > 6.0 and QFontMetricsF(_font(pt, bold)).horizontalAdvance(text) > width:
        pt -= 0.5
    return pt


NAME_MIN_SCALE = 0.6
"""A run's name shrinks to this share of its size at most; beyond, its end gives way to "…"
(a figure is never cut; a long name may be)."""


def _line(painter: QPainter, rect: QRectF, text: str, pt: float, colour: str, bold: bool = False,
          align: Qt.AlignmentFlag = Qt.AlignmentFlag.AlignLeft, elide: bool = False,
          min_scale: float = NAME_MIN_SCALE) -> None:
    size = _fit_pt(text, pt, rect.width(), bold)
    if elide and size < pt * min_scale:
        size = pt * min_scale
        text = QFontMetricsF(_font(size, bold)).elidedText(text, Qt.TextElideMode.ElideRight, rect.width())
    painter.setFont(_font(size, bold))
    painter.setPen(QColor(colour))
    painter.drawText(rect, int(align | Qt.AlignmentFlag.AlignVCenter), text)


def _tokens(count: int) -> str:
    return f"{count:,} token" + ("" if count == 1 else "s")


def _shown(text: str) -> str:
    """Streamed text as painted: control and format characters (a small model's stray bytes) as
    the replacement character, not as the font's empty boxes; lines and tabs kept."""
    return "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C" else "\ufffd" for c in text)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _counter(state: SideState) -> tuple[str, str]:
    ttft = "TTFT  —" if state.ttft_ms is None else f"TTFT  {state.ttft_ms:,.0f} ms"
    rate = "—  tok/s" if state.tok_per_s is None else f"{state.tok_per_s:,.1f}  tok/s"
    return ttft, rate


def _paint_side(painter: QPainter, rect: QRectF, key: str, side: RaceSide, state: SideState, scale_ms: float,
                theme: Theme, unit: float, live: bool = False) -> None:
    colour = theme.curves[SIDE_COLOURS[key] % len(theme.curves)]
    pad = unit * 0.8
    inner = rect.adjusted(pad, pad, -pad, -pad)
    y = inner.top()
    head_h = unit * 2.2
    _line(painter, QRectF(inner.left(), y, inner.width(), head_h), f"{key}  {side.name}", unit * 1.25, colour, True,
          elide=True)
    y += head_h
    small_h = unit * 1.6
    _line(painter, QRectF(inner.left(), y, inner.width(), small_h),
          f"level {side.level_label} · " + ("live, running now" if live and not side.ended else "live" if live
                                             else f"measured {side.measured_text}"),
          unit * 0.8, theme.muted, elide=True)
    y += small_h
    ttft, rate = _counter(state)
    big_h = unit * 3.0
    half = inner.width() / 2
    _line(painter, QRectF(inner.left(), y, half, big_h), ttft, unit * 1.5, theme.foreground, True)
    _line(painter, QRectF(inner.left() + half, y, half, big_h), rate, unit * 1.5, theme.foreground, True,
          Qt.AlignmentFlag.AlignRight)
    y += big_h
    # The track: the replay clock runs left to right; the finish line is this side's own finish
    # on the slower side's scale, so the faster side's line stands short of the other's (live: on
    # the scale of the clocks so far, drawn once the side's request ended).
    track_h = unit * 1.4
    track = QRectF(inner.left(), y + track_h * 0.25, inner.width(), track_h * 0.5)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(theme.panel).lighter(160))
    painter.drawRoundedRect(track, track.height() / 2, track.height() / 2)
    done = min(1.0, state.elapsed_ms / scale_ms) if scale_ms > 0 else 1.0
    painter.setBrush(QColor(colour))
    painter.drawRoundedRect(QRectF(track.left(), track.top(), track.width() * done, track.height()),
                            track.height() / 2, track.height() / 2)
    if side.ended:
        finish_x = track.left() + track.width() * (min(1.0, side.finish_ms / scale_ms) if scale_ms > 0 else 1.0)
        painter.setPen(QPen(QColor(theme.foreground), max(2.0, unit * 0.15)))
        painter.drawLine(int(finish_x), int(y), int(finish_x), int(y + track_h))
    y += track_h
    status = (f"no sample: {side.failed}" if side.failed
              else f"finished in {side.finish_ms / 1e3:.2f} s · {_tokens(side.total_tokens)}" if state.finished
              else f"{state.elapsed_ms / 1e3:.2f} s · {_tokens(state.tokens)}")
    _line(painter, QRectF(inner.left(), y, inner.width(), small_h), status, unit * 0.9,
          theme.good if state.finished else theme.muted, state.finished)
    y += small_h
    text_rect = QRectF(inner.left(), y + unit * 0.3, inner.width(), inner.bottom() - y - unit * 0.3)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(theme.panel))
    painter.drawRoundedRect(text_rect, unit * 0.4, unit * 0.4)
    body = text_rect.adjusted(unit * 0.5, unit * 0.4, -unit * 0.5, -unit * 0.4)
    painter.setFont(_font(unit * 0.95))
    painter.setPen(QColor(theme.foreground))
    painter.drawText(body, _fitting_tail(painter, _shown(state.text), body), WRAP)


def paint_race(painter: QPainter, width: int, height: int, race: Race, t_ms: float, theme: Theme = DARK,
               clocks_ms: tuple[float, float] | None = None, status: str | None = None) -> None:
    """One moment (``t_ms`` of the replay) of the race, on a ``width`` x ``height`` canvas.
    ``clocks_ms``: each side's own clock instead (a live race: ``LiveRace.clocks_ms``); ``status``:
    the bottom line while the race runs, instead of the replay's pace."""
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
    painter.fillRect(QRectF(0, 0, width, height), QColor(theme.background))
    unit = min(width / 64.0, height / 36.0)
    margin = unit
    title_h = unit * 1.8
    _line(painter, QRectF(margin, margin * 0.5, width - 2 * margin, title_h), race.title(), unit * 0.85, theme.muted)
    prompt_h = unit * 1.8
    prompts = [" ".join(side.prompt.split()) for side in (race.a, race.b)]
    prompt_line = ("Prompt: " + _short(prompts[0], 160) if prompts[0] == prompts[1]
                   else f"Prompt A: {_short(prompts[0], 75)}  ·  B: {_short(prompts[1], 75)}")
    _line(painter, QRectF(margin, margin * 0.5 + title_h, width - 2 * margin, prompt_h), prompt_line, unit * 0.85,
          theme.foreground, elide=True, min_scale=1.0)
    verdict_h = unit * 2.6
    top = margin * 0.5 + title_h + prompt_h
    bottom = height - verdict_h - margin * 0.5
    column_w = (width - 3 * margin) / 2
    clocks = clocks_ms or (t_ms, t_ms)
    scale_ms = max(race.duration_ms, *clocks) if race.live else race.duration_ms
    for k, (key, side) in enumerate((("A", race.a), ("B", race.b))):
        rect = QRectF(margin + k * (column_w + margin), top, column_w, bottom - top)
        painter.setPen(QPen(QColor(theme.panel).lighter(200), 1.0))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(rect, unit * 0.5, unit * 0.5)
        _paint_side(painter, rect, key, side, side.state_at(clocks[k]), scale_ms, theme, unit, race.live)
    over = race.ended if race.live else t_ms >= race.duration_ms
    running = status or (f"live: A {clocks[0] / 1e3:.2f} s · B {clocks[1] / 1e3:.2f} s" if race.live
                         else f"replaying at the measured pace: {t_ms / 1e3:.2f} s")
    _line(painter, QRectF(margin, bottom, width - 2 * margin, verdict_h), race.verdict() if over else running,
          unit * 1.3, theme.good if over else theme.muted, True, Qt.AlignmentFlag.AlignHCenter)


def render_frame(race: Race, t_ms: float, size: tuple[int, int] = EXPORT_SIZE, theme: Theme = DARK) -> QImage:
    """One moment painted into an image (no window, no display needed beyond a QGuiApplication)."""
    image = QImage(size[0], size[1], QImage.Format.Format_RGB888)
    painter = QPainter(image)
    try:
        paint_race(painter, size[0], size[1], race, t_ms, theme)
    finally:
        painter.end()
    return image


def render_frames(race: Race, fps: int = FPS, size: tuple[int, int] = EXPORT_SIZE) -> Iterator[QImage]:
    """The replay's frames at ``fps`` (``app.race.frame_times_ms``)."""
    for t_ms in frame_times_ms(race.duration_ms, fps):
        yield render_frame(race, t_ms, size)


def rgb_frame(image: QImage) -> Frame:
    """An image as the encoders take it: width, height and its RGB rows without padding."""
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    width, height, stride = image.width(), image.height(), image.bytesPerLine()
    data = bytes(image.constBits())[: stride * height]
    rows = b"".join(data[y * stride:y * stride + width * 3] for y in range(height)) if stride != width * 3 else data
    return Frame(width, height, rows)


def export_race(race: Race, path: Path, fps: int = FPS) -> Path:
    """The replay written to ``path`` (``.gif``, ``.mp4`` or ``.png``: the finish as a still)."""
    if path.suffix.lower() == ".png":
        return write_still(rgb_frame(render_frame(race, race.duration_ms)), path)
    return write_animation((rgb_frame(image) for image in render_frames(race, fps)), path, fps)


def headless_app() -> QApplication:
    """The application an export paints in: the running one, or one on Qt's offscreen platform
    when there is no display (a terminal, CI)."""
    app = QApplication.instance()
    if isinstance(app, QApplication):
        return app
    if not (os.environ.get("QT_QPA_PLATFORM") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    return QApplication(sys.argv[:1])


SPEEDS: tuple[tuple[str, float], ...] = (("measured pace \u00d71", 1.0), ("slowed \u00d710", 0.1),
                                         ("slowed \u00d7100", 0.01))
"""The replay's playback speeds: a share of the measured pace (the schedule's times stay the stored
ones; only the clock that walks them runs slower). A small model's reply lasts a tenth of a second."""


class RaceCanvas(QWidget):
    """The race painted at the replay clock's moment (nothing before a race is set)."""

    def __init__(self, theme: Theme = DARK, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.race: Race | None = None
        self.t_ms = 0.0
        self.clocks_ms: tuple[float, float] | None = None
        """A live race: each side's own clock (``LiveRace.clocks_ms``)."""
        self.status: str | None = None
        self.setMinimumSize(480, 320)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt API
        painter = QPainter(self)
        try:
            if self.race is None:
                painter.fillRect(self.rect(), QColor(self.theme.background))
            else:
                paint_race(painter, self.width(), self.height(), self.race, self.t_ms, self.theme, self.clocks_ms,
                           self.status)
        finally:
            painter.end()


class RaceView(QWidget):
    """The race, replayed from :meth:`set_race`, or live from :meth:`follow_live`: a QTimer
    advances the replay clock (the wall clock since the start, times the chosen speed, so a slow
    repaint skips frames and never slows the race); live, it drains the trials' events (their
    buses' subscription, filled by the runs' threads) into the :class:`~app.race.LiveRace`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("raceView")
        self.canvas = RaceCanvas()
        self.replay_button = QPushButton("\u21bb Replay")
        self.replay_button.setEnabled(False)
        self.replay_button.clicked.connect(self.start)
        self.speed_box = QComboBox()
        self.speed_box.setObjectName("raceSpeed")
        self.speed_box.setToolTip("Replay slower than measured, to see a short reply stream: the tokens keep their "
                                  "measured times, the clock that shows them runs slower")
        for text, speed in SPEEDS:
            self.speed_box.addItem(text, speed)
        self.speed_box.currentIndexChanged.connect(self._speed_changed)
        self.live_label = QLabel("")
        self.live_label.setObjectName("raceLive")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.canvas, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.live_label)
        buttons.addStretch(1)
        buttons.addWidget(self.speed_box)
        buttons.addWidget(self.replay_button)
        layout.addLayout(buttons)
        self.timer = QTimer(self)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self.tick)
        self._started = 0.0
        self._from_ms = 0.0
        """The replay moment the clock restarted from (a change of speed keeps the moment)."""
        self.live: LiveRace | None = None
        self._events: Subscription | None = None

    @property
    def race(self) -> Race | None:
        return self.canvas.race

    @property
    def speed(self) -> float:
        """The replay's pace: 1.0 is the measured one."""
        return float(self.speed_box.currentData())

    @property
    def finished(self) -> bool:
        if self.live is not None:
            return self.live.ended
        return self.race is not None and self.canvas.t_ms >= self.race.duration_ms

    @property
    def is_live(self) -> bool:
        return self.live is not None

    def set_race(self, race: Race) -> None:
        self._stop_live()
        self.canvas.race = race
        self.replay_button.setEnabled(True)
        self.start()

    def follow_live(self, live: LiveRace, events: Subscription) -> None:
        """Show ``live`` as its trials run: ``events`` (subscribed to their buses, from any thread)
        is drained at each tick; once both requests ended, Replay replays the race as measured."""
        self.live, self._events = live, events
        self.canvas.race, self.canvas.clocks_ms, self.canvas.status = live.race(), live.clocks_ms(), None
        self.replay_button.setEnabled(False)
        self.speed_box.setEnabled(False)
        self.live_label.setText("\u25cf LIVE: two trials running now")
        self.timer.start()
        self.canvas.update()

    def _stop_live(self) -> None:
        self.live, self._events = None, None
        self.canvas.clocks_ms = None
        self.speed_box.setEnabled(True)
        self.live_label.setText("")

    def start(self) -> None:
        """The replay from its start (after a live race: the race as measured, from the store's view)."""
        if self.live is not None:
            replay = self.live.replay()
            if replay is None:
                return
            self._stop_live()
            self.canvas.race = replay
        self._started = time.monotonic()
        self._from_ms = 0.0
        self.canvas.t_ms = 0.0
        self.canvas.status = self._status(0.0)
        self.timer.start()
        self.canvas.update()

    def stop(self) -> None:
        self.timer.stop()

    def hold(self, t_ms: float) -> None:
        """Stop the clock at ``t_ms`` of the replay and show that moment (Replay starts again)."""
        self.timer.stop()
        self.canvas.t_ms = t_ms
        self.canvas.status = self._status(t_ms)
        self.canvas.update()

    def _status(self, t_ms: float) -> str | None:
        """The bottom line of a slowed replay (the measured pace says its own)."""
        if self.speed == 1.0 or self.race is None:
            return None
        return (f"replaying {self.speed_box.currentText()}: {t_ms / 1e3:.3f} s of the measured "
                f"{self.race.duration_ms / 1e3:.3f} s")

    def _speed_changed(self) -> None:
        self._from_ms, self._started = self.canvas.t_ms, time.monotonic()
        self.canvas.status = self._status(self.canvas.t_ms)
        self.canvas.update()

    def replay_ms(self, now_s: float) -> float:
        """The replay's moment at monotonic ``now_s``: the stored times walked at :attr:`speed`."""
        return self._from_ms + (now_s - self._started) * 1e3 * self.speed

    def tick(self) -> None:
        if self.live is not None:
            self._tick_live(self.live)
            return
        if self.race is None:
            self.timer.stop()
            return
        self.canvas.t_ms = min(self.race.duration_ms, self.replay_ms(time.monotonic()))
        self.canvas.status = self._status(self.canvas.t_ms)
        if self.finished:
            self.timer.stop()
        self.canvas.update()

    def _tick_live(self, live: LiveRace) -> None:
        events = self._events
        if events is not None:
            for item in events.drain():
                if isinstance(item, Event):
                    live.feed(item)
        self.canvas.race, self.canvas.clocks_ms = live.race(), live.clocks_ms()
        if live.ended:
            self.timer.stop()
            self._events = None
            self.replay_button.setEnabled(True)
            self.live_label.setText("\u25cf LIVE race over: Replay shows it as measured")
        self.canvas.update()
