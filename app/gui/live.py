"""The startup and log side of the live view: phase progress and a filterable engine log with
errors highlighted, plus the diagnosis of a failed start in plain words."""

from __future__ import annotations

import html
import re
from collections import deque

from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from engine_adapters.base import Phase

ERROR_RE = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|Traceback|\w+(Error|Exception)\b|error:")
WARNING_RE = re.compile(r"\bWARNING\b")
MAX_LINES = 20_000
SHOWN_LINES = 5_000


def is_error_line(line: str) -> bool:
    return bool(ERROR_RE.search(line))


class PhaseBar(QWidget):
    """Startup phase as words and a progress bar (the phase order comes from the adapter)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel("Idle")
        self.label.setObjectName("phaseLabel")
        self.bar = QProgressBar()
        self.bar.setRange(0, 100)
        self.bar.setValue(0)
        self.bar.setMaximumWidth(260)
        self.bar.setTextVisible(True)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.bar)
        self.phase: str = ""

    def set_phase(self, phase: str, detail: str = "") -> None:
        self.phase = phase
        try:
            known: Phase | None = Phase(phase)
        except ValueError:
            known = None
        if known is not None and known not in (Phase.FAILED, Phase.STOPPING, Phase.STOPPED):
            self.bar.setValue(int(known.progress * 100))
        if known is Phase.FAILED:
            self.bar.setValue(0)
        short = detail if len(detail) < 110 else detail[:107] + "..."
        self.label.setText(f"Engine: {phase}" + (f" — {short}" if short and known is not Phase.LAUNCHING else ""))

    def set_text(self, text: str, progress: int | None = None) -> None:
        self.label.setText(text)
        if progress is not None:
            self.bar.setValue(progress)


class LogView(QWidget):
    """The engine log: a bounded buffer, a text filter and an errors-only switch."""

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
        bar.addWidget(self.filter, 1)
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
        self.filter.textChanged.connect(self._refilter)
        self.errors_only.toggled.connect(self._refilter)

    def _matches(self, line: str) -> bool:
        if self.errors_only.isChecked() and not is_error_line(line):
            return False
        return self._pattern is None or bool(self._pattern.search(line))

    @staticmethod
    def _html(line: str) -> str:
        text = html.escape(line)
        if is_error_line(line):
            return f'<span style="color:#d93025;font-weight:600">{text}</span>'
        if WARNING_RE.search(line):
            return f'<span style="color:#b06000">{text}</span>'
        return f'<span>{text}</span>'

    def append(self, lines: list[str]) -> None:
        self.lines.extend(lines)
        shown = [self._html(line) for line in lines if self._matches(line)]
        if shown:
            self.text.appendHtml("<br>".join(shown))

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

    def visible_lines(self) -> list[str]:
        return [line for line in self.text.toPlainText().splitlines() if line]

    def clear(self) -> None:
        self.lines.clear()
        self.text.clear()
        self.show_diagnosis(None)

    def show_diagnosis(self, text: str | None) -> None:
        self.diagnosis.setText(f"Why it failed: {text}" if text else "")
        self.diagnosis.setVisible(bool(text))
