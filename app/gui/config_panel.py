"""The configuration panel: editors generated from the pydantic models' field types and the
feature catalogue (labels, families, explanations), bound to one :class:`ConfigState`.

Every edit builds a new, fully validated :class:`RunConfig` (pydantic errors are shown under the
editor and the previous value is kept); the engine adapter's own ``validate`` then runs in a
worker and its messages appear inline too. Loading a profile replaces the state and every editor
follows, so open/save round-trips exactly.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.config import RunConfig
from app.gui.availability import Availability
from app.gui.fields import FieldSpec, field_spec, get_path, humanize
from engine_adapters.base import ValidationIssue
from engine_adapters.features import FEATURES, Family
from engine_adapters.runtimes import MANAGED_RUNTIMES

DEFAULT_TEXT = "engine default"
INT_MAX = 2_000_000_000

# Fields the catalogue does not describe, shown next to the feature they qualify.
COMPANIONS: dict[str, tuple[str, ...]] = {
    "kv_offload_gib": ("kv_offload_backend",),
    "speculative.ngram_prompt_lookup_max": ("speculative.ngram_prompt_lookup_min",),
}
ENGINE_FIELDS = ("engine.kind", "engine.runtime.kind", "engine.runtime.managed", "engine.runtime.python",
                 "engine.runtime.executable", "engine.runtime.docker_image", "engine.model", "engine.port")
WORKLOAD_FIELDS = ("workload.kind", "workload.dataset_path", "workload.num_requests",
                   "workload.input_len.distribution", "workload.input_len.mean", "workload.input_len.spread",
                   "workload.output_len.distribution", "workload.output_len.mean", "workload.output_len.spread",
                   "workload.shared_prefix_tokens", "workload.shared_prefix_fraction", "workload.turns",
                   "workload.api", "workload.ignore_eos", "workload.temperature", "workload.seed")
LOAD_FIELDS = ("load.pattern", "load.concurrency", "load.rate_rps", "load.burstiness", "load.ramp_start_rps",
               "load.sweep_of", "load.levels", "load.max_concurrency", "load.duration_s", "load.max_requests",
               "load.warmup_requests", "load.slo", "load.max_error_fraction", "load.request_timeout_s",
               "load.workers")
LABELS = {
    "engine.kind": "Engine", "engine.runtime.kind": "Runtime", "engine.runtime.managed": "Managed runtime",
    "engine.runtime.python": "Python (venv)", "engine.runtime.executable": "Executable",
    "engine.runtime.docker_image": "Docker image", "engine.model": "Model", "engine.port": "Port (0 = free)",
    "workload.kind": "Workload", "workload.input_len.mean": "Input tokens (mean)",
    "workload.output_len.mean": "Output tokens (mean)", "workload.input_len.distribution": "Input length shape",
    "workload.input_len.spread": "Input spread (tokens)", "workload.output_len.distribution": "Output length shape",
    "workload.output_len.spread": "Output spread (tokens)", "workload.shared_prefix_fraction": "Share of requests with it",
    "workload.ignore_eos": "Ignore EOS (exact lengths)", "load.max_error_fraction": "Error budget (fraction)",
    "load.request_timeout_s": "Request timeout (s)", "load.workers": "Client processes", "load.pattern": "Load pattern",
    "load.rate_rps": "Rate (req/s)", "features.kv_offload_backend": "KV offload backend",
    "load.ramp_start_rps": "Ramp start (req/s)", "load.levels": "Levels", "load.sweep_of": "Sweep of",
    "load.slo": "Goodput SLOs", "workload.dataset_path": "Dataset file",
    "features.speculative.ngram_prompt_lookup_min": "N-gram window (min)",
}
CHOICES_OVERRIDE = {"engine.runtime.managed": tuple(sorted(MANAGED_RUNTIMES))}
OPEN_LOOP = ("constant", "poisson", "gamma", "ramp", "sweep")
VISIBLE_WHEN: dict[str, tuple[str, tuple[str, ...]]] = {
    "engine.runtime.managed": ("engine.runtime.kind", ("managed",)),
    "engine.runtime.python": ("engine.runtime.kind", ("python",)),
    "engine.runtime.executable": ("engine.runtime.kind", ("executable",)),
    "engine.runtime.docker_image": ("engine.runtime.kind", ("docker",)),
    "workload.dataset_path": ("workload.kind", ("sharegpt", "jsonl")),
    "workload.shared_prefix_tokens": ("workload.kind", ("shared_prefix", "multi_turn", "random")),
    "workload.shared_prefix_fraction": ("workload.kind", ("shared_prefix", "multi_turn", "random")),
    "workload.input_len.spread": ("workload.input_len.distribution", ("uniform", "normal")),
    "workload.output_len.spread": ("workload.output_len.distribution", ("uniform", "normal")),
    "workload.turns": ("workload.kind", ("multi_turn",)),
    "load.concurrency": ("load.pattern", ("closed", "sweep")),
    "load.rate_rps": ("load.pattern", ("constant", "poisson", "gamma", "ramp")),
    "load.burstiness": ("load.pattern", ("gamma",)),
    "load.ramp_start_rps": ("load.pattern", ("ramp",)),
    "load.sweep_of": ("load.pattern", ("sweep",)),
    "load.levels": ("load.pattern", ("sweep",)),
    "load.max_concurrency": ("load.pattern", OPEN_LOOP),
}


def label_for(path: str) -> str:
    key = path.removeprefix("features.")
    for info in FEATURES:
        if info.key == key:
            return info.label
    return LABELS.get(path) or humanize(path.rsplit(".", 1)[-1])


def tooltip_for(path: str, spec: FieldSpec) -> str:
    key = path.removeprefix("features.")
    for info in FEATURES:
        if info.key == key:
            return f"{info.explanation}\n\nAttacks: {info.attacks}."
    return spec.description


def issue_path(issue: ValidationIssue) -> str:
    """Adapter issues name Features paths (``speculative.draft_model``) or ``engine.*``."""
    return issue.field if issue.field.startswith(("engine", "workload", "load")) else f"features.{issue.field}"


def _dict_get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def _messages(exc: ValidationError) -> str:
    return "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())


class ConfigState(QObject):
    """The RunConfig being edited. ``changed(path)`` fires after every accepted edit ("" = all).

    Rules that tie fields together (a sweep needs levels, a Poisson load a rate) would make some
    changes impossible one field at a time, so an edit that only breaks such a rule is kept as a
    *draft*: the editor shows it with the message, ``config`` stays the last valid one, and the
    draft becomes the config as soon as the other fields make it valid. A value that is wrong in
    itself (out of range) is refused outright.
    """

    changed = Signal(str)

    def __init__(self, config: RunConfig | None = None) -> None:
        super().__init__()
        self._config = config or RunConfig()
        self._draft: dict[str, Any] = self._config.model_dump()
        self.pending: str | None = None  # why the draft is not a valid configuration yet

    @property
    def config(self) -> RunConfig:
        return self._config

    def draft_value(self, path: str) -> Any:
        return _dict_get(self._draft, path)

    def replace(self, config: RunConfig) -> None:
        self._config = config
        self._draft = config.model_dump()
        self.pending = None
        self.changed.emit("")

    def set(self, path: str, value: Any) -> str | None:
        """Apply one edit; returns a one-line message when it is refused or left as a draft."""
        if self.draft_value(path) == value and self.pending is None:
            return None
        draft = copy.deepcopy(self._draft)
        node = draft
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
        try:
            config = RunConfig.model_validate(draft)
        except ValidationError as exc:
            message = _messages(exc)
            if any(".".join(str(p) for p in e["loc"]) == path for e in exc.errors()):
                return message  # the value itself is wrong: refused
            self._draft, self.pending = draft, message
            return message
        self._config, self._draft, self.pending = config, config.model_dump(), None
        self.changed.emit(path)
        return None


class FieldEditor(QObject):
    """One labelled editor row: the input widget, an inline message line, and availability."""

    edited = Signal(str, object)

    def __init__(self, path: str, spec: FieldSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path, self.spec = path, spec
        self.tooltip = tooltip_for(path, spec)
        self.widget = self._build()
        self.widget.setObjectName(f"editor:{path}")
        self.widget.setToolTip(self.tooltip)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setVisible(False)
        self.message.setObjectName(f"message:{path}")
        self.container = QWidget()
        box = QVBoxLayout(self.container)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(1)
        if path == "engine.model":  # a hub id, a recent model, or a local directory
            row = QHBoxLayout()
            row.addWidget(self.widget, 1)
            self.browse = QToolButton()
            self.browse.setText("…")
            self.browse.setToolTip("Choose a local model directory")
            self.browse.clicked.connect(self._browse_model)
            row.addWidget(self.browse)
            box.addLayout(row)
        else:
            box.addWidget(self.widget)
        box.addWidget(self.message)
        self._edit_error: str | None = None
        self._issue: tuple[str, str] | None = None
        self._unavailable: str | None = None

    # -- widgets -----------------------------------------------------------------------------

    def _build(self) -> QWidget:
        spec = self.spec
        choices = CHOICES_OVERRIDE.get(self.path, spec.choices)
        if spec.kind == "choice" or choices:
            combo = QComboBox()
            if spec.optional:
                combo.addItem(DEFAULT_TEXT, None)
            for choice in choices:
                combo.addItem(choice, choice)
            if self.path == "engine.model":
                combo.setEditable(True)
            combo.activated.connect(lambda _i: self._emit())
            return combo
        if self.path == "engine.model":
            combo = QComboBox()
            combo.setEditable(True)
            combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
            line_edit = combo.lineEdit()
            assert line_edit is not None
            line_edit.editingFinished.connect(self._emit)
            combo.activated.connect(lambda _i: self._emit())
            return combo
        if spec.kind in ("bool", "tristate"):
            check = QCheckBox()
            check.setTristate(spec.kind == "tristate")
            check.stateChanged.connect(self._check_changed)
            return check
        if spec.kind == "int":
            spin = QSpinBox()
            low = int(spec.minimum) if spec.minimum is not None else 0
            spin.setRange(low - 1 if spec.optional else low, int(spec.maximum) if spec.maximum else INT_MAX)
            if spec.optional:
                spin.setSpecialValueText(DEFAULT_TEXT)
            spin.setKeyboardTracking(False)
            spin.valueChanged.connect(lambda _v: self._emit())
            return spin
        if spec.kind == "float":
            dspin = QDoubleSpinBox()
            dspin.setDecimals(2)
            low_f = spec.minimum if spec.minimum is not None else 0.0
            dspin.setRange(low_f - 0.01 if spec.optional else low_f, spec.maximum if spec.maximum else 1e9)
            dspin.setSingleStep(0.05 if (spec.maximum or 2) <= 1 or "utilization" in self.path else 1.0)
            if spec.optional:
                dspin.setSpecialValueText(DEFAULT_TEXT)
            dspin.setKeyboardTracking(False)
            dspin.valueChanged.connect(lambda _v: self._emit())
            return dspin
        line = QLineEdit()
        if spec.optional:
            line.setPlaceholderText("not set")
        if spec.kind == "list":
            line.setPlaceholderText("space-separated" if spec.item_type == "str" else "comma-separated numbers")
        line.editingFinished.connect(self._emit)
        return line

    def _browse_model(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.widget, "Model directory (with config.json)")
        if folder:
            self.set_value(folder)
            self._emit()

    def _check_changed(self, _state: int) -> None:
        self._update_check_text()
        self._emit()

    def _update_check_text(self) -> None:
        check = self.widget
        assert isinstance(check, QCheckBox)
        state = check.checkState()
        if check.isTristate():
            check.setText({Qt.CheckState.PartiallyChecked: DEFAULT_TEXT, Qt.CheckState.Checked: "on",
                           Qt.CheckState.Unchecked: "off"}[state])
        else:
            check.setText("on" if state == Qt.CheckState.Checked else "off")

    def value(self) -> Any:
        spec, w = self.spec, self.widget
        if isinstance(w, QComboBox):
            if w.isEditable():
                return w.currentText().strip()
            return w.currentData()
        if isinstance(w, QCheckBox):
            state = w.checkState()
            if state == Qt.CheckState.PartiallyChecked:
                return None
            return state == Qt.CheckState.Checked
        if isinstance(w, QSpinBox | QDoubleSpinBox):
            if spec.optional and w.value() == w.minimum():
                return None
            return w.value()
        assert isinstance(w, QLineEdit)
        text = w.text().strip()
        if spec.kind == "list":
            if spec.item_type == "float":
                return [float(x) for x in text.replace(",", " ").split()]
            return shlex.split(text)
        return text or (None if spec.optional else "")

    def set_value(self, value: Any) -> None:
        w = self.widget
        w.blockSignals(True)
        try:
            if isinstance(w, QComboBox):
                if w.isEditable():
                    w.setEditText("" if value is None else str(value))
                else:
                    index = w.findData(value)
                    w.setCurrentIndex(max(index, 0))
            elif isinstance(w, QCheckBox):
                w.setCheckState(Qt.CheckState.PartiallyChecked if value is None else
                                Qt.CheckState.Checked if value else Qt.CheckState.Unchecked)
                self._update_check_text()
            elif isinstance(w, QSpinBox | QDoubleSpinBox):
                w.setValue(w.minimum() if value is None else value)  # type: ignore[arg-type]
            elif isinstance(w, QLineEdit):
                if self.spec.kind == "list":
                    w.setText(", ".join(str(x) for x in value) if self.spec.item_type == "float"
                              else shlex.join(value))
                else:
                    w.setText("" if value is None else str(value))
        finally:
            w.blockSignals(False)

    def _emit(self) -> None:
        try:
            value = self.value()
        except ValueError as exc:
            self.set_edit_error(f"cannot read this value: {exc}")
            return
        self.edited.emit(self.path, value)

    # -- messages and availability -------------------------------------------------------------

    def set_edit_error(self, text: str | None) -> None:
        self._edit_error = text
        self._render()

    def set_issue(self, issue: tuple[str, str] | None) -> None:
        self._issue = issue
        self._render()

    def set_unavailable(self, reason: str | None) -> None:
        self._unavailable = reason
        self.widget.setEnabled(reason is None)
        self.widget.setToolTip(self.tooltip + (f"\n\nUnavailable here: {reason}" if reason else ""))
        self._render()

    def set_choice_notes(self, disabled: dict[str, str], cautions: dict[str, str]) -> None:
        combo = self.widget
        if not isinstance(combo, QComboBox) or combo.isEditable():
            return
        model = combo.model()
        if not isinstance(model, QStandardItemModel):
            return
        for row in range(combo.count()):
            data = combo.itemData(row)
            item = model.item(row)
            reason = disabled.get(str(data))
            item.setEnabled(reason is None or data == combo.currentData())
            note = reason or cautions.get(str(data))
            item.setToolTip(f"Unavailable: {reason}" if reason else (f"Caution: {note}" if note else ""))

    def _render(self) -> None:
        text, style = "", ""
        if self._edit_error:
            text, style = self._edit_error, "color: #d93025;"
        elif self._issue:
            severity, message = self._issue
            text = message
            style = "color: #d93025;" if severity == "error" else "color: #b06000;"
        elif self._unavailable:
            text, style = f"Unavailable: {self._unavailable}", "color: #80868b; font-style: italic;"
        self.message.setText(text)
        self.message.setStyleSheet(style)
        self.message.setVisible(bool(text))

    @property
    def message_text(self) -> str:
        return self.message.text() if self.message.isVisible() else ""


class ConfigPanel(QScrollArea):
    """All editors, grouped: engine and model, the feature families, workload, load."""

    def __init__(self, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.editors: dict[str, FieldEditor] = {}
        self._draft_paths: set[str] = set()
        self._rows: dict[str, tuple[QFormLayout, QWidget]] = {}
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.addWidget(self._group("Engine and model", ENGINE_FIELDS))
        for family in Family:
            paths: list[str] = []
            for info in FEATURES:
                if info.family is family:
                    paths.append(f"features.{info.key}")
                    paths.extend(f"features.{c}" for c in COMPANIONS.get(info.key, ()))
            layout.addWidget(self._group(family.value, paths))
        layout.addWidget(self._group("Workload", WORKLOAD_FIELDS))
        layout.addWidget(self._group("Load", LOAD_FIELDS))
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setObjectName("validationSummary")
        layout.addWidget(self.summary)
        layout.addStretch(1)
        self.setWidget(body)
        self.setWidgetResizable(True)
        self.setMinimumWidth(360)
        state.changed.connect(self._on_state_changed)
        self.refresh_all()
        self._validate_timer = QTimer(self)
        self._validate_timer.setSingleShot(True)
        self._validate_timer.setInterval(250)
        self.validation_requested: Callable[[], None] | None = None
        self._validate_timer.timeout.connect(self._request_validation)

    def _group(self, title: str, paths: tuple[str, ...] | list[str]) -> QGroupBox:
        box = QGroupBox(title)
        box.setObjectName(f"group:{title}")
        form = QFormLayout(box)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for path in paths:
            editor = FieldEditor(path, field_spec(path), self)
            editor.edited.connect(self._on_edit)
            label = QLabel(label_for(path))
            label.setToolTip(editor.tooltip)
            form.addRow(label, editor.container)
            self.editors[path] = editor
            self._rows[path] = (form, editor.container)
        return box

    def editor(self, path: str) -> FieldEditor:
        return self.editors[path]

    def _on_edit(self, path: str, value: Any) -> None:
        error = self.state.set(path, value)
        self.editors[path].set_edit_error(error)
        if error is not None and error == self.state.pending:
            self._draft_paths.add(path)
        self._apply_visibility()

    def _on_state_changed(self, path: str) -> None:
        if path == "":
            self.refresh_all()
        else:
            for draft_path in {path, *self._draft_paths}:  # the draft became valid
                self.editors[draft_path].set_edit_error(None)
            self._apply_visibility()
        self._draft_paths.clear()
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
        for path, (other, wanted) in VISIBLE_WHEN.items():
            if path in self._rows:
                form, container = self._rows[path]
                form.setRowVisible(container, self.state.draft_value(other) in wanted)

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

    def show_issues(self, issues: list[ValidationIssue], notes: list[str] | None = None) -> None:
        """Put each adapter issue under its editor; others go to the summary line."""
        by_path: dict[str, tuple[str, str]] = {}
        loose: list[str] = list(notes or [])
        for issue in issues:
            path = issue_path(issue)
            if path in self.editors and path not in by_path:
                by_path[path] = (issue.severity, issue.message)
            elif path not in self.editors:
                loose.append(str(issue))
        for path, editor in self.editors.items():
            editor.set_issue(by_path.get(path))
        errors = sum(1 for i in issues if i.severity == "error")
        warnings = len(issues) - errors
        head = ("Configuration OK" if not issues else
                f"{errors} error(s), {warnings} warning(s)") if issues is not None else ""
        self.summary.setText("\n".join([head, *loose]))
        self.summary.setStyleSheet("color: #d93025;" if errors else "")
