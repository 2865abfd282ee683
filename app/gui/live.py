"""The startup and log side of the live view: the run's progress (engine start, then load, with
elapsed and remaining time), the startup phases shown where the graphs will be, and a filterable
engine log with errors highlighted and access lines hidden, plus the diagnosis of a failed start
in plain words."""

from __future__ import annotations

import html
import re
import time
from collections import deque

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from engine_adapters.base import Phase
from engine_adapters.secrets import mask_lines, mask_text

ERROR_RE = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|Traceback|\w+(Error|Exception)\b|error:")
WARNING_RE = re.compile(r"\bWARNING\b")
ACCESS_RE = re.compile(r'"(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) \S+ HTTP/[\d.]+" \d{3}')
"""An HTTP server's access line (``"POST /v1/completions HTTP/1.1" 200 OK``): one per request."""
SHUTDOWN_NOISE_RE = re.compile(r"nanobind: (leaked|this is likely)|resource_tracker: There appear to be \d+ leaked|"
                               r"resource_tracker.*(UserWarning|leaked)|warnings\.warn\('resource_tracker")
"""What the engine's Python extensions print at interpreter exit after a stop: nothing a user can
act on. multiprocessing's leaked-semaphore warning is switched off at its source (the launcher's
warning filter for the engine's processes, ``engine_adapters.launcher.QUIET_AT_EXIT``); nanobind's
leak report comes from a compiled extension inside vLLM (triton's bindings) that no setting
outside the engine turns off, so it is hidden here (the log pane's "routine lines" shows it)."""
MAX_LINES = 20_000
SHOWN_LINES = 5_000
STARTUP_PHASES: tuple[Phase, ...] = (Phase.LAUNCHING, Phase.LOADING_WEIGHTS, Phase.PROFILING, Phase.WARMING_UP,
                                     Phase.KV_CACHE, Phase.STARTING_SERVER, Phase.READY)


def is_error_line(line: str) -> bool:
    return bool(ERROR_RE.search(line))


def is_access_line(line: str) -> bool:
    """A routine line hidden by default: an HTTP access line, or exit-time noise after a stop."""
    return bool(ACCESS_RE.search(line) or SHUTDOWN_NOISE_RE.search(line)) and not is_error_line(line)


def duration_text(seconds: float) -> str:
    """``45 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _phase(name: str) -> Phase | None:
    try:
        return Phase(name)
    except ValueError:
        return None


def engine_eta_s(elapsed_s: float, phase: Phase | None, previous_s: float | None) -> float | None:
    """Seconds left to ready: from the previous start of the same engine when there is one (the
    best guess a machine has), else from the phase reached (its rough share of a start)."""
    if previous_s is not None and previous_s > 0:
        return max(previous_s - elapsed_s, 1.0)
    if phase is not None and 0.15 <= phase.progress < 1.0 and elapsed_s > 3:
        return elapsed_s * (1.0 - phase.progress) / phase.progress
    return None


class PhaseBar(QWidget):
    """What the run is doing and how far it is: the engine's start (phases from the adapter, time
    left from the previous start of the same engine), then the load (requests or time of each
    level, with elapsed and remaining time). The bar never reads 100% before the load is done."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel("Idle")
        self.label.setObjectName("phaseLabel")
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)  # long log details never widen the window
        self.bar = QProgressBar()
        self.bar.setRange(0, 100)
        self.bar.setValue(0)
        self.bar.setMaximumWidth(260)
        self.bar.setMinimumWidth(160)
        self.bar.setTextVisible(True)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.bar)
        self.phase: str = ""
        self.stage = "idle"  # idle | engine | load | done
        self._engine_t0: float | None = None
        self._previous_start_s: float | None = None
        self._detail = ""
        self._levels = 1
        self._level = 0
        self._level_label = ""
        self._done = self._planned = 0
        self._level_elapsed_s = 0.0
        self._level_t: float | None = None
        self._duration_s: float | None = None
        self._load_t0: float | None = None

    # -- the engine ---------------------------------------------------------------------------

    def engine_starting(self, previous_start_s: float | None) -> None:
        """A run is starting an engine; ``previous_start_s`` is how long the last start of the
        same engine took (None when unknown)."""
        self.stage, self._engine_t0, self._previous_start_s = "engine", time.monotonic(), previous_start_s
        self.phase, self._detail = "", ""
        self.bar.setFormat("engine %p%")
        self.bar.setValue(0)
        self._render()

    def engine_elapsed_s(self) -> float:
        return 0.0 if self._engine_t0 is None else time.monotonic() - self._engine_t0

    def eta_s(self) -> float | None:
        """Seconds left to ready, while the engine starts."""
        if self.stage != "engine":
            return None
        return engine_eta_s(self.engine_elapsed_s(), _phase(self.phase), self._previous_start_s)

    def set_phase(self, phase: str, detail: str = "") -> None:
        self.phase = phase
        known = _phase(phase)
        if known is not None and known not in (Phase.FAILED, Phase.STOPPING, Phase.STOPPED, Phase.READY):
            if self.stage not in ("engine",):
                self.stage = "engine"
                self.bar.setFormat("engine %p%")
                if self._engine_t0 is None:
                    self._engine_t0 = time.monotonic()
            self.bar.setValue(int(known.progress * 100))
        if known is Phase.FAILED:
            self.bar.setValue(0)
            self.stage = "done"
        if known is Phase.READY:  # the engine is up; the bar now measures the load
            elapsed = self.engine_elapsed_s() if self.stage == "engine" else None
            self.load_starting(self._levels)
            self.label.setText("Engine ready" + (f" after {duration_text(elapsed)}" if elapsed else "")
                               + (f" — {detail}" if detail else ""))
            return
        self._detail = detail if known is not Phase.LAUNCHING else ""
        if self.stage == "engine" or known in (Phase.FAILED, Phase.STOPPING, Phase.STOPPED):
            short = self._detail if len(self._detail) < 110 else self._detail[:107] + "..."
            self.label.setText(f"Engine: {phase}" + (f" — {short}" if short else ""))
            if self.stage == "engine":
                self._render()

    # -- the load -----------------------------------------------------------------------------

    def load_starting(self, levels: int) -> None:
        self.stage, self._levels, self._level = "load", max(levels, 1), 0
        self._load_t0 = time.monotonic()
        self._done = self._planned = 0
        self._level_elapsed_s, self._level_t, self._duration_s = 0.0, None, None
        self.bar.setFormat("load %p%")
        self.bar.setValue(0)
        self._render()

    def level_started(self, index: int, label: str, planned: int | None, duration_s: float | None) -> None:
        if self.stage != "load":
            self.load_starting(self._levels)
        self._level, self._level_label = index, label
        self._done, self._planned = 0, planned or 0
        self._duration_s = duration_s
        self._level_elapsed_s, self._level_t = 0.0, time.monotonic()
        self._render()

    def set_levels(self, levels: int) -> None:
        self._levels = max(levels, 1)

    def progress(self, done: int, planned: int | None, elapsed_s: float) -> None:
        if self.stage != "load":
            self.load_starting(self._levels)
        self._done, self._planned = done, planned or self._planned
        self._level_elapsed_s, self._level_t = elapsed_s, time.monotonic()
        self._render()

    def level_fraction(self) -> float:
        """How much of the running level is done (requests, or time for a timed level)."""
        elapsed = self._level_elapsed_now()
        fractions = []
        if self._planned:
            fractions.append(self._done / self._planned)
        if self._duration_s:
            fractions.append(elapsed / self._duration_s)
        return min(max(fractions, default=0.0), 1.0)

    def _level_elapsed_now(self) -> float:
        if self._level_t is None:
            return self._level_elapsed_s
        return self._level_elapsed_s + (time.monotonic() - self._level_t)

    def load_fraction(self) -> float:
        return min((self._level + self.level_fraction()) / self._levels, 1.0)

    def load_remaining_s(self) -> float | None:
        """Time left for the whole load, from the running level's pace."""
        fraction, elapsed = self.level_fraction(), self._level_elapsed_now()
        if fraction <= 0.02 or elapsed < 1.0:
            return None
        level_total = elapsed / fraction
        return max(level_total - elapsed, 0.0) + level_total * (self._levels - self._level - 1)

    def finished(self, text: str, completed: bool) -> None:
        self.stage = "done"
        self.bar.setFormat("%p%")
        if completed:
            self.bar.setValue(100)
        self.label.setText(text)

    def tick(self) -> None:
        """Refresh the elapsed and remaining times (the window's timer calls this)."""
        if self.stage in ("engine", "load"):
            self._render()

    def _render(self) -> None:
        if self.stage == "engine":
            elapsed = self.engine_elapsed_s()
            eta = self.eta_s()
            what = self.phase or "launching"
            left = f", about {duration_text(eta)} left" if eta is not None else ""
            short = self._detail if len(self._detail) < 70 else self._detail[:67] + "..."
            self.label.setText(f"Engine starting: {what}" + (f" — {short}" if short else "")
                               + f" · {duration_text(elapsed)}{left}")
            self.bar.setFormat("engine %p%")
        elif self.stage == "load":
            fraction = self.load_fraction()
            self.bar.setValue(int(fraction * 100))
            level = f"level {self._level + 1} of {self._levels}" + (f" ({self._level_label})" if self._level_label else "")
            count = f" · {self._done:,}/{self._planned:,} requests" if self._planned else f" · {self._done:,} requests"
            elapsed = (time.monotonic() - self._load_t0) if self._load_t0 is not None else self._level_elapsed_now()
            remaining = self.load_remaining_s()
            left = f", about {duration_text(remaining)} left" if remaining is not None else ""
            self.label.setText(f"Load: {level}{count} · {duration_text(elapsed)} elapsed{left}")

    def set_text(self, text: str, progress: int | None = None) -> None:
        self.label.setText(text)
        if progress is not None:
            self.bar.setValue(progress)


class StartupView(QWidget):
    """Where the graphs will be, while the engine starts: each startup phase ticked off as the
    log reaches it, time so far and time left, and the engine's latest line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("startupView")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 16, 24, 16)
        self.title = QLabel("Starting the engine")
        self.title.setStyleSheet("font-size: 15pt; font-weight: 600;")
        self.time_label = QLabel("")
        self.time_label.setStyleSheet("font-size: 11pt; color: #5f6368;")
        layout.addWidget(self.title)
        layout.addWidget(self.time_label)
        self.rows: dict[Phase, QLabel] = {}
        for phase in STARTUP_PHASES:
            row = QLabel("")
            row.setTextFormat(Qt.TextFormat.RichText)
            row.setStyleSheet("font-size: 12pt; padding: 2px 0;")
            self.rows[phase] = row
            layout.addWidget(row)
        self.detail = QLabel("")
        self.detail.setWordWrap(True)
        self.detail.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.detail.setStyleSheet("color: #5f6368; font-family: monospace;")
        layout.addWidget(self.detail)
        layout.addStretch(1)
        self.reached: Phase | None = None
        self.failed_reason: str | None = None
        self._render()

    def start(self, what: str) -> None:
        self.title.setText(what)
        self.reached, self.failed_reason = None, None
        self.detail.setText("")
        self._render()

    def set_phase(self, phase: str, detail: str = "") -> None:
        known = _phase(phase)
        if known is Phase.FAILED:
            self.failed_reason = detail or "the engine did not start"
        elif known in STARTUP_PHASES:
            self.reached = known
        if detail:
            self.detail.setText(mask_text(detail if len(detail) < 300 else detail[:297] + "..."))
        self._render()

    def set_times(self, elapsed_s: float, eta_s: float | None, previous_s: float | None) -> None:
        text = f"{duration_text(elapsed_s)} so far"
        if eta_s is not None:
            text += f", about {duration_text(eta_s)} left"
        if previous_s is not None:
            text += f" (the last start of this engine took {duration_text(previous_s)})"
        self.time_label.setText(text)

    def _render(self) -> None:
        order = list(STARTUP_PHASES)
        at = order.index(self.reached) if self.reached in order else -1
        for i, phase in enumerate(order):
            name = html.escape(phase.value[:1].upper() + phase.value[1:])
            if i < at or (phase is Phase.READY and self.reached is Phase.READY):
                mark, style = "\u2714", "color: #188038;"
            elif i == at or (at < 0 and i == 0 and self.failed_reason is None):
                mark, style = "\u25cf", "color: #1a73e8; font-weight: 600;"
            else:
                mark, style = "\u25cb", "color: #9aa0a6;"
            if self.failed_reason is not None and i == max(at, 0):
                mark, style = "\u2716", "color: #d93025; font-weight: 600;"
            self.rows[phase].setText(f'<span style="{style}">{mark}&nbsp;&nbsp;{name}</span>')


class LogView(QWidget):
    """The engine log: a bounded buffer, a text filter, an errors-only switch, and HTTP access
    lines (one per request) hidden unless asked for."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.lines: deque[str] = deque(maxlen=MAX_LINES)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter the log (text or regular expression)")
        self.filter.setClearButtonEnabled(True)
        self.errors_only = QCheckBox("Errors only")
        self.show_access = QCheckBox("Routine lines")
        self.show_access.setToolTip("Hidden by default: one line per request from the engine's HTTP server "
                                    "('POST /v1/completions 200 OK'), and what the engine's extensions print "
                                    "at exit after a stop (nanobind leak reports, resource_tracker warnings)")
        self.hidden_label = QLabel("")
        self.hidden_label.setStyleSheet("color: #5f6368;")
        bar.addWidget(self.filter, 1)
        bar.addWidget(self.hidden_label)
        bar.addWidget(self.show_access)
        bar.addWidget(self.errors_only)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(SHOWN_LINES)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        font = self.text.font()
        font.setFamily("monospace")
        font.setStyleHint(font.StyleHint.Monospace)
        self.text.setFont(font)
        self.diagnosis = QLabel("")
        self.diagnosis.setObjectName("diagnosis")
        self.diagnosis.setWordWrap(True)
        self.diagnosis.setStyleSheet("background: #fce8e6; color: #a50e0e; padding: 6px; border-radius: 4px;")
        self.diagnosis.setVisible(False)
        layout.addWidget(self.diagnosis)
        layout.addLayout(bar)
        layout.addWidget(self.text, 1)
        self._pattern: re.Pattern[str] | None = None
        self.hidden_access = 0
        self.filter.textChanged.connect(self._refilter)
        self.errors_only.toggled.connect(self._refilter)
        self.show_access.toggled.connect(self._refilter)

    def _matches(self, line: str) -> bool:
        if self.errors_only.isChecked() and not is_error_line(line):
            return False
        if not self.show_access.isChecked() and is_access_line(line):
            return False
        return self._pattern is None or bool(self._pattern.search(line))

    @staticmethod
    def _html(line: str) -> str:
        text = html.escape(line)
        if is_error_line(line):
            return f'<span style="color:#d93025;font-weight:600">{text}</span>'
        if WARNING_RE.search(line):
            return f'<span style="color:#b06000">{text}</span>'
        if line.startswith("tunebench:"):
            return f'<span style="color:#1a73e8">{text}</span>'
        return f'<span>{text}</span>'

    def append(self, lines: list[str]) -> None:
        lines = mask_lines(lines)  # the screen (and a screenshot) never shows a secret
        self.lines.extend(lines)
        self.hidden_access += sum(1 for line in lines if is_access_line(line))
        shown = [self._html(line) for line in lines if self._matches(line)]
        if shown:
            self.text.appendHtml("<br>".join(shown))
        self._count()

    def _count(self) -> None:
        hidden = 0 if self.show_access.isChecked() else self.hidden_access
        self.hidden_label.setText(f"{hidden:,} routine lines hidden" if hidden else "")

    def _refilter(self) -> None:
        query = self.filter.text().strip()
        try:
            self._pattern = re.compile(query, re.IGNORECASE) if query else None
        except re.error:
            self._pattern = re.compile(re.escape(query), re.IGNORECASE)
        self.text.clear()
        shown = [self._html(line) for line in self.lines if self._matches(line)][-SHOWN_LINES:]
        if shown:
            self.text.appendHtml("<br>".join(shown))
        self._count()

    def visible_lines(self) -> list[str]:
        return [line for line in self.text.toPlainText().splitlines() if line]

    def clear(self) -> None:
        self.lines.clear()
        self.text.clear()
        self.hidden_access = 0
        self._count()
        self.show_diagnosis(None)

    def show_diagnosis(self, text: str | None) -> None:
        self.diagnosis.setText(f"Why it failed: {mask_text(text)}" if text else "")
        self.diagnosis.setVisible(bool(text))
