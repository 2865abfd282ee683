"""The Findings panel: a stored run explained from what it measured (``app.run_findings``), one
row per finding (severity, explanation, evidence) and, where a finding knows the next trial, a
**Try it** button that sets it in the configuration being edited, as the user's own edit would,
so the next Start runs it.

The findings are read in a worker (they read the run's telemetry from the store and may plan its
ceiling); the panel only draws what comes back, and drops a reply for a run no longer asked for.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.analysis.findings import Finding
from app.gui.discard import discard
from app.gui.theme import LIGHT
from app.gui.workers import run_in_worker
from app.run_findings import suggestion_text

LoadFindings = Callable[[int | str], list[Finding]]
"""A stored run (id, uid or name) -> its findings; called in a worker."""
ApplySuggestion = Callable[[Mapping[str, Any]], str | None]
"""Sets a finding's suggestion in the configuration being edited; a one-line message when refused."""
SEVERITY_COLOURS = {"warning": "#b06000", "info": LIGHT.muted}


def _wrapped(text: str, style: str = "") -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setMinimumWidth(120)  # wraps to the room it is given; its height follows the width
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if style:
        label.setStyleSheet(style)
    return label


class FindingRow(QFrame):
    """One finding: ``[warning] kv_bound``, its explanation, its evidence and the next trial."""

    def __init__(self, finding: Finding, on_try: Callable[[Finding], None] | None) -> None:
        super().__init__()
        self.finding = finding
        self.setObjectName("findingRow")
        colour = SEVERITY_COLOURS.get(finding.severity, LIGHT.muted)
        self.setStyleSheet(f"QFrame#findingRow {{ background: {LIGHT.panel}; border-left: 4px solid {colour}; "
                           "border-radius: 4px; }")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        head = QHBoxLayout()
        self.title = _wrapped(f'<b style="color:{colour}">{html.escape(finding.severity)}</b> &nbsp;'
                              f"<b>{html.escape(finding.rule)}</b> &nbsp;"
                              f'<span style="color:{LIGHT.muted}">confidence {html.escape(finding.confidence)}</span>')
        head.addWidget(self.title, 1)
        self.try_button: QPushButton | None = None
        if finding.suggestion and on_try is not None:
            self.try_button = QPushButton("Try it")
            self.try_button.setToolTip("Set " + suggestion_text(finding.suggestion) + " in the configuration; "
                                       "press Start to run it")
            self.try_button.clicked.connect(lambda: on_try(finding))
            head.addWidget(self.try_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(head)
        self.explanation = _wrapped(html.escape(finding.explanation))
        layout.addWidget(self.explanation)
        if finding.evidence:
            items = "".join(f"<li>{html.escape(e.text())}</li>" for e in finding.evidence)
            layout.addWidget(_wrapped(f'<ul style="margin:0; color:{LIGHT.muted}">{items}</ul>'))
        if finding.suggestion:
            layout.addWidget(_wrapped(f"Next trial: <code>{html.escape(suggestion_text(finding.suggestion))}</code>"))


class _RowsBody(QWidget):
    """The scrolled rows: as tall as its wrapped texts need at its width (a scroll area sizes its
    widget without asking the height for a width, so wrapped rows would be squeezed)."""

    def fit(self) -> None:
        layout = self.layout()
        if layout is not None and layout.hasHeightForWidth():
            self.setMinimumHeight(layout.heightForWidth(self.width()))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.fit()


class FindingsPanel(QWidget):
    """A run's findings, warnings first; hidden until it has a run to show (unless its host, a tab,
    shows it anyway). ``shown(findings)`` after each run's findings are drawn (the presentation
    reads out the first warning)."""

    shown = Signal(list)

    def __init__(self, load: LoadFindings | None = None, apply: ApplySuggestion | None = None,
                 parent: QWidget | None = None, *, hide_when_empty: bool = True) -> None:
        super().__init__(parent)
        self.hide_when_empty = hide_when_empty
        self.setObjectName("findingsPanel")
        self._load, self._apply = load, apply
        self._asked: int | str | None = None  # the run whose findings are on their way
        self.findings: list[Finding] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(4)
        self.heading = _wrapped("")
        layout.addWidget(self.heading)
        self.message = _wrapped("")
        self.message.setVisible(False)
        layout.addWidget(self.message)
        self.body = body = _RowsBody()
        self.rows_layout = QVBoxLayout(body)
        self.rows_layout.setContentsMargins(0, 0, 0, 0)
        self.rows_layout.setSpacing(6)
        self.rows_layout.addStretch(1)
        self.area = QScrollArea()
        self.area.setWidgetResizable(True)
        self.area.setFrameShape(QFrame.Shape.NoFrame)
        self.area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.area.setWidget(body)
        layout.addWidget(self.area, 1)
        self.rows: list[FindingRow] = []
        self.clear()

    def set_sources(self, load: LoadFindings | None, apply: ApplySuggestion | None) -> None:
        """Where findings are read from and where Try it sets a suggestion (the window's store and
        configuration panel)."""
        self._load, self._apply = load, apply
        self._show_rows(self.findings)

    def show_run(self, ref: int | str, title: str) -> None:
        """Read the stored run ``ref``'s findings in a worker, then show them under ``title``."""
        if self._load is None:
            return
        self._asked = ref
        load = self._load
        self._show_rows([])
        self.heading.setText(f"<b>Findings</b> \u2014 {html.escape(title)}: reading\u2026")
        self._shown(True)

        def done(findings: list[Finding]) -> None:
            if self._asked == ref:
                self.show_findings(findings, title)

        def failed(message: str) -> None:
            if self._asked == ref:
                self.heading.setText(f"<b>Findings</b> \u2014 {html.escape(title)}: not read ({html.escape(message)})")

        run_in_worker(lambda: load(ref), done, failed, name="findings", parent=self)

    def show_findings(self, findings: Sequence[Finding], title: str) -> None:
        """Draw ``findings`` (already read) under ``title``."""
        self.findings = list(findings)
        warnings = sum(f.severity == "warning" for f in findings)
        count = f"{warnings} warning(s)" if warnings else "no warning"
        self.heading.setText(f"<b>Findings</b> \u2014 {html.escape(title)}: {count}")
        self.message.setVisible(False)
        self._show_rows(self.findings)
        self._shown(bool(findings))
        self.shown.emit(self.findings)

    def _show_rows(self, findings: Sequence[Finding]) -> None:
        for row in self.rows:
            discard(row)
        self.rows = []
        on_try = self._try if self._apply is not None else None
        for finding in findings:
            row = FindingRow(finding, on_try)
            self.rows_layout.insertWidget(self.rows_layout.count() - 1, row)
            self.rows.append(row)
        self.body.fit()

    def row(self, rule: str) -> FindingRow | None:
        return next((r for r in self.rows if r.finding.rule == rule), None)

    def _try(self, finding: Finding) -> None:
        if self._apply is None or not finding.suggestion:
            return
        refused = self._apply(finding.suggestion)
        text = (f"Not set: {refused}" if refused else
                f"Set {suggestion_text(finding.suggestion)}: press Start to run it.")
        self.message.setText(html.escape(text))
        self.message.setStyleSheet(f"color: {LIGHT.bad if refused else LIGHT.good};")
        self.message.setVisible(True)

    def clear(self) -> None:
        self._asked = None
        self.findings = []
        self._show_rows([])
        self.heading.setText("")
        self.message.setVisible(False)
        self._shown(False)
        if not self.hide_when_empty:
            self.heading.setText("The findings of a run appear here while it runs and once it has ended: what its figures say, "
                                 "and the next trial to run.")

    def _shown(self, on: bool) -> None:
        if self.hide_when_empty:
            self.setVisible(on)
