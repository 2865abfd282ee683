"""The configuration panel: editors generated from the pydantic models' field types and the
feature catalogue (labels, families, explanations), bound to one :class:`ConfigState`.

Laid out to fit a laptop screen: three tabs (the features to try, the workload and load, the
engine and model), the common settings first and the rare ones behind "More settings" in each
group, and settings that do not apply (a speculative decoding setting while it is off, a rate in
a closed loop) hidden. A switch the engine decides by default is two-state and says what that
default is ("on (engine default)"); a feature this machine cannot run is greyed, says so, and
never claims "on".

Every edit goes to the editing model (``app.editing``: a refused value is explained under its
editor, in the field's own words, and the previous value is kept); the engine adapter's own
``validate`` then runs in a worker and its messages appear by the field they concern too.
Loading a profile replaces the state and every editor follows, so open/save round-trips exactly.
Each row is an ``app.gui.field_editor.FieldEditor``; this module lays the rows out and routes
messages to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QLabel,
    QScrollArea,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.editing import ALL_PATHS, COMPANIONS, ENGINE_FIELDS, LOAD_FIELDS, WORKLOAD_FIELDS, issue_path
from app.gui.availability import Availability
from app.gui.config_state import ConfigState
from app.gui.field_editor import FieldEditor
from app.gui.fields import field_spec, get_path
from app.gui.plan_box import PlanBox
from app.labels import in_field_words, label_for
from engine_adapters.base import ValidationIssue
from engine_adapters.features import FEATURES, Family

__all__ = ["ConfigPanel", "ConfigState", "FieldEditor"]

ADVANCED = frozenset({
    "engine.kind", "engine.port",
    "workload.input_len.distribution", "workload.input_len.spread", "workload.output_len.distribution",
    "workload.output_len.spread", "workload.api", "workload.ignore_eos", "workload.temperature", "workload.seed",
    "workload.cache", "workload.shared_prefix_fraction", "workload.trace_format", "workload.trace_block_tokens",
    "load.warmup_requests", "load.slo", "load.max_error_fraction", "load.request_timeout_s", "load.workers",
    "load.duration_s", "load.max_requests", "load.ramp_up_s",
})
"""Settings behind each group's "More settings" (shown at once when one of them has a message)."""
TABS = ("Features", "Workload and load", "Engine and model")


class Group(QGroupBox):
    """A titled form; rows in :data:`ADVANCED` sit behind its "More settings" switch."""

    def __init__(self, title: str, tab: int) -> None:
        super().__init__(title)
        self.setObjectName(f"group:{title}")
        self.tab = tab
        self.form = QFormLayout(self)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        self.form.setVerticalSpacing(4)
        self.more = QToolButton()
        self.more.setCheckable(True)
        self.more.setAutoRaise(True)
        self.more.setText("More settings \u25be")
        self.more.setVisible(False)
        self.advanced: list[str] = []


class ConfigPanel(QWidget):
    """All editors, in three tabs: the features (by family), the workload and load, the engine
    and model. The summary line under them says whether the configuration can start."""

    def __init__(self, state: ConfigState, parent: QWidget | None = None,
                 engine_defaults: Mapping[str, Any] | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.engine_defaults = dict(engine_defaults or {})
        self.editors: dict[str, FieldEditor] = {}
        self._draft_paths: set[str] = set()
        self._rows: dict[str, tuple[QFormLayout, QWidget]] = {}
        self._group_of: dict[str, Group] = {}
        self.groups: list[Group] = []
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(4)
        self.hint = QLabel("Choose a profile above, set what to try here, then name the run and press "
                           "\u25b6 Start below.")
        self.hint.setObjectName("stepsHint")
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet("color: #5f6368; padding: 2px 4px;")
        outer.addWidget(self.hint)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        outer.addWidget(self.tabs, 1)
        pages = [self._page() for _ in TABS]
        for family in Family:
            paths: list[str] = []
            for info in FEATURES:
                if info.family is family:
                    paths.append(f"features.{info.key}")
                    paths.extend(f"features.{c}" for c in COMPANIONS.get(info.key, ()))
            pages[0][1].addWidget(self._group(family.value, paths, 0))
        pages[1][1].addWidget(self._group("Workload", WORKLOAD_FIELDS, 1))
        pages[1][1].addWidget(self._group("Load", LOAD_FIELDS, 1))
        pages[2][1].addWidget(self._group("Engine and model", ENGINE_FIELDS, 2))
        for (scroll, layout), title in zip(pages, TABS, strict=True):
            layout.addStretch(1)
            self.tabs.addTab(scroll, title)
        self.plan_box = PlanBox(state)  # the memory plan and ceilings, recomputed as the toggles change
        outer.addWidget(self.plan_box)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setObjectName("validationSummary")
        self.summary.setStyleSheet("padding: 2px 4px;")
        outer.addWidget(self.summary)
        self._issues: list[ValidationIssue] | None = None  # the last validation's (None: none yet)
        self._loose_notes: list[str] = []
        self.setMinimumWidth(330)
        state.changed.connect(self._on_state_changed)
        state.validated.connect(self.show_issues)
        self.refresh_all()
        self._validate_timer = QTimer(self)
        self._validate_timer.setSingleShot(True)
        self._validate_timer.setInterval(250)
        self.validation_requested: Callable[[], None] | None = None
        self._validate_timer.timeout.connect(self._request_validation)

    @staticmethod
    def _page() -> tuple[QScrollArea, QVBoxLayout]:
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(2, 4, 2, 4)
        layout.setSpacing(6)
        scroll = QScrollArea()
        scroll.setWidget(body)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        return scroll, layout

    def _group(self, title: str, paths: tuple[str, ...] | list[str], tab: int) -> Group:
        box = Group(title, tab)
        for path in paths:
            default = self.engine_defaults.get(path.removeprefix("features.")) if path.startswith("features.") else None
            editor = FieldEditor(path, field_spec(path), self, engine_default=default)
            editor.edited.connect(self._on_edit)
            editor.unreadable.connect(self._on_unreadable)
            label = QLabel(label_for(path))
            label.setToolTip(editor.tooltip)
            box.form.addRow(label, editor.container)
            self.editors[path] = editor
            self._rows[path] = (box.form, editor.container)
            self._group_of[path] = box
            if path in ADVANCED:
                box.advanced.append(path)
        if box.advanced:
            box.more.setVisible(True)
            box.form.addRow(box.more)
            box.more.toggled.connect(lambda on, b=box: self._show_more(b, on))
        self.groups.append(box)
        return box

    def _show_more(self, box: Group, on: bool) -> None:
        box.more.setText("Fewer settings \u25b4" if on else "More settings \u25be")
        self._apply_visibility()

    def show_advanced(self, on: bool = True) -> None:
        """Open (or close) every group's "More settings"."""
        for box in self.groups:
            if box.advanced:
                box.more.setChecked(on)

    def editor(self, path: str) -> FieldEditor:
        return self.editors[path]

    def show_field(self, path: str) -> None:
        """Bring a field into view: its tab, its group's advanced rows when it is one."""
        box = self._group_of.get(path)
        if box is None:
            return
        self.tabs.setCurrentIndex(box.tab)
        if path in box.advanced and not box.more.isChecked():
            box.more.setChecked(True)

    def set_engine_defaults(self, defaults: Mapping[str, Any]) -> None:
        self.engine_defaults = dict(defaults)
        for path, editor in self.editors.items():
            if path.startswith("features."):
                editor.engine_default = self.engine_defaults.get(path.removeprefix("features."))
                if isinstance(editor.widget, QCheckBox):
                    editor._show_check()

    def _on_edit(self, path: str, value: Any) -> None:
        error = self.state.set(path, value)
        self.editors[path].set_edit_error(error)
        if error is not None and error == self.state.pending:
            self._draft_paths.add(path)
        self._apply_visibility()
        self._update_tab_marks()

    def apply_changes(self, changes: Mapping[str, Any]) -> str | None:
        """Set ``changes`` (profile keys -> values, e.g. a finding's next trial) as the user's own
        edits would: each field shows its new value and the configuration takes it; the first
        field is brought into view. A one-line message when one is refused (the rest are left)."""
        for path, value in changes.items():
            editor = self.editors.get(path)
            if editor is None:  # a setting without a field here: the configuration takes it all the same
                error = self.state.set(path, value)
            else:
                editor.set_value(value)
                self._on_edit(path, value)
                error = editor._edit_error
            if error is not None and error != self.state.pending:  # refused (a draft may resolve with the next)
                return f"{label_for(path)}: {error}"
        if self.state.pending is not None:
            return self.state.pending
        first = next(iter(changes), None)
        if first is not None and first in self.editors:
            self.show_field(first)
        return None

    def _on_unreadable(self, _path: str) -> None:
        self._update_tab_marks()

    def _on_state_changed(self, path: str) -> None:
        if path == "":
            self.refresh_all()
        else:
            for draft_path in {path, *self._draft_paths}:  # the draft became valid
                self.editors[draft_path].set_edit_error(None)
            self._apply_visibility()
        self._draft_paths.clear()
        self._update_tab_marks()
        self._validate_timer.start()

    def problems(self) -> list[str]:
        """Edits not in the configuration: refused values and an unresolved draft."""
        return [f"{label_for(p)}: {e._edit_error}" for p, e in self.editors.items() if e._edit_error]

    def refresh_all(self) -> None:
        for path, editor in self.editors.items():
            editor.set_value(get_path(self.state.config, path))
            editor.set_edit_error(None)
        self._draft_paths.clear()
        self._apply_visibility()

    def _apply_visibility(self) -> None:
        for path, (form, container) in self._rows.items():
            visible = self.state.model.applies(path)
            box = self._group_of[path]
            editor = self.editors[path]
            if visible and path in box.advanced and not box.more.isChecked():
                visible = editor.severity is not None  # a message by a hidden field would go unseen
            form.setRowVisible(container, visible)

    def _update_summary(self) -> None:
        """The line under the tabs: the validation's counts and where to look, counting the edits
        that were not applied too (a refused value or an unresolved draft is an error: the
        configuration in use is not what the fields show)."""
        not_applied = [p for p, e in self.editors.items() if e._edit_error]
        issues = self._issues or []
        errors = sum(1 for i in issues if i.severity == "error") + len(not_applied)
        warnings = sum(1 for i in issues if i.severity != "error")
        if self._issues is None and not errors:
            return  # not validated yet: "OK" would be a claim
        if not errors and not warnings:
            head = "Configuration OK"
        else:
            marked = {p for p, e in self.editors.items() if e.severity is not None}
            where = sorted({TABS[self._group_of[p].tab] for p in marked})
            head = (f"{errors} error(s), {warnings} warning(s)" + (f": see {' and '.join(where)}" if where else ""))
        lines = [head, *self._loose_notes]
        if not_applied:
            lines.append("not applied, the last valid value is in use: " + ", ".join(label_for(p) for p in not_applied))
        self.summary.setText("\n".join(lines))
        self.summary.setStyleSheet("padding: 2px 4px;" + (" color: #d93025;" if errors else ""))

    def _update_tab_marks(self) -> None:
        """A tab holding a field with an error (or a warning) says so in its title, and the summary
        line counts them."""
        self._update_summary()
        counts = [[0, 0] for _ in TABS]
        for path, editor in self.editors.items():
            severity = editor.severity
            if severity is not None:
                counts[self._group_of[path].tab][0 if severity == "error" else 1] += 1
        for i, (title, (errors, warnings)) in enumerate(zip(TABS, counts, strict=True)):
            mark = f" \u26a0{errors}" if errors else (f" ({warnings})" if warnings else "")
            self.tabs.setTabText(i, title + mark)
            self.tabs.tabBar().setTabTextColor(
                i, QColor("#d93025") if errors else self.palette().color(QPalette.ColorRole.WindowText))

    def set_recent_models(self, models: list[str]) -> None:
        combo = self.editors["engine.model"].widget
        assert isinstance(combo, QComboBox)
        current = combo.currentText()
        combo.blockSignals(True)
        combo.clear()
        combo.addItems(models)
        combo.setEditText(current)
        combo.blockSignals(False)

    def apply_availability(self, availability: Availability) -> None:
        for path, editor in self.editors.items():
            editor.set_unavailable(availability.disabled.get(path))
            editor.set_choice_notes(availability.disabled_choices.get(path, {}),
                                    availability.cautions.get(path, {}))

    def _request_validation(self) -> None:
        if self.validation_requested is not None:
            self.validation_requested()

    def editor_for_issue(self, issue: ValidationIssue) -> str | None:
        """The editor an issue belongs by: its own path, else the nearest one (``engine.runtime``
        -> ``engine.runtime.kind``; a field with no editor -> its parent's)."""
        path = issue_path(issue)
        if path in self.editors:
            return path
        below = [p for p in self.editors if p.startswith(path + ".")]
        if below:
            return below[0]
        parts = path.split(".")
        while len(parts) > 1:
            parts.pop()
            if ".".join(parts) in self.editors:
                return ".".join(parts)
        return None

    def show_issues(self, issues: list[ValidationIssue], notes: list[str] | None = None) -> None:
        """Put each issue by the field it concerns (in that field's words); the rest go to the
        summary line, which also says where to look."""
        by_path: dict[str, tuple[str, str]] = {}
        loose: list[str] = list(notes or [])
        for issue in issues:
            path = self.editor_for_issue(issue)
            message = in_field_words(issue.message, ALL_PATHS)
            if path is not None and (path not in by_path or (issue.severity == "error" and by_path[path][0] != "error")):
                by_path[path] = (issue.severity, message)
            elif path is None:
                loose.append(f"{issue.severity}: {label_for(issue_path(issue))}: {message}")
        for path, editor in self.editors.items():
            editor.set_issue(by_path.get(path))
        self._issues, self._loose_notes = list(issues), loose
        self._apply_visibility()
        self._update_tab_marks()
