"""The configuration panel: editors generated from the pydantic models' field types and the
feature catalogue (labels, families, explanations), bound to one :class:`ConfigState`.

Laid out to fit a laptop screen: three tabs (the features to try, the workload and load, the
engine and model), the common settings first and the rare ones behind "More settings" in each
group, and settings that do not apply (a speculative decoding setting while it is off, a rate in
a closed loop) hidden. A switch the engine decides by default is two-state and says what that
default is ("on (engine default)"); a feature this machine cannot run is greyed, says so, and
never claims "on".

Every edit builds a new, fully validated :class:`RunConfig` (a refused value is explained under
its editor, in the field's own words, and the previous value is kept); the engine adapter's own
``validate`` then runs in a worker and its messages appear by the field they concern too.
Loading a profile replaces the state and every editor follows, so open/save round-trips exactly.

Why one module: every editor is generated here from the field types and the
catalogue, with its inline message and availability; the rules live in pydantic, the adapters and
``app.gui.fields``, so this file is layout and binding only.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPalette, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.config import RunConfig
from app.gui.availability import Availability
from app.gui.fields import FieldSpec, field_spec, get_path
from app.gui.plan_box import PlanBox
from app.labels import ENGINE_DEFAULT, in_field_words, label_for, no_value_text, value_text
from app.workload import FILE_KINDS
from engine_adapters.base import ValidationIssue
from engine_adapters.features import FEATURES, FEATURES_BY_KEY, Family
from engine_adapters.runtimes import MANAGED_RUNTIMES

DEFAULT_TEXT = ENGINE_DEFAULT
INT_MAX = 2_000_000_000

# Fields the catalogue does not describe, shown next to the feature they qualify.
COMPANIONS: dict[str, tuple[str, ...]] = {
    "kv_offload_gib": ("kv_offload_backend",),
    "speculative.ngram_prompt_lookup_max": ("speculative.ngram_prompt_lookup_min",),
}
ENGINE_FIELDS = ("engine.model", "engine.runtime.kind", "engine.runtime.managed", "engine.runtime.python",
                 "engine.runtime.executable", "engine.runtime.docker_image", "engine.kind", "engine.port")
WORKLOAD_FIELDS = ("workload.kind", "workload.dataset_path", "workload.trace_format", "workload.trace_start_s",
                   "workload.trace_end_s", "workload.trace_block_tokens", "workload.num_requests", "workload.input_len.mean",
                   "workload.output_len.mean", "workload.shared_prefix_tokens", "workload.shared_prefix_fraction",
                   "workload.turns", "workload.input_len.distribution", "workload.input_len.spread",
                   "workload.output_len.distribution", "workload.output_len.spread", "workload.api",
                   "workload.ignore_eos", "workload.temperature", "workload.seed", "workload.cache")
LOAD_FIELDS = ("load.pattern", "load.concurrency", "load.rate_rps", "load.speedup", "load.burstiness", "load.ramp_start_rps",
               "load.sweep_of", "load.levels", "load.max_concurrency", "load.duration_s", "load.max_requests",
               "load.ramp_up_s", "load.warmup_requests", "load.slo", "load.max_error_fraction",
               "load.request_timeout_s", "load.workers")
ADVANCED = frozenset({
    "engine.kind", "engine.port",
    "workload.input_len.distribution", "workload.input_len.spread", "workload.output_len.distribution",
    "workload.output_len.spread", "workload.api", "workload.ignore_eos", "workload.temperature", "workload.seed",
    "workload.cache", "workload.shared_prefix_fraction", "workload.trace_format", "workload.trace_block_tokens",
    "load.warmup_requests", "load.slo", "load.max_error_fraction", "load.request_timeout_s", "load.workers",
    "load.duration_s", "load.max_requests", "load.ramp_up_s",
})
"""Settings behind each group's "More settings" (shown at once when one of them has a message)."""
CHOICES_OVERRIDE = {"engine.runtime.managed": tuple(sorted(MANAGED_RUNTIMES))}
OPEN_LOOP = ("constant", "poisson", "gamma", "ramp", "sweep", "trace")
TRACE = ("trace",)
SPEC_ON = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
Condition = tuple[str, Callable[[Any], bool]]


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


VISIBLE_WHEN: dict[str, Condition] = {
    "engine.runtime.managed": ("engine.runtime.kind", _one_of("managed")),
    "engine.runtime.python": ("engine.runtime.kind", _one_of("python")),
    "engine.runtime.executable": ("engine.runtime.kind", _one_of("executable")),
    "engine.runtime.docker_image": ("engine.runtime.kind", _one_of("docker")),
    "workload.dataset_path": ("workload.kind", _one_of(*FILE_KINDS)),
    # A trace gives every request's lengths: the generated ones' settings do not apply.
    "workload.input_len.mean": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.output_len.mean": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.input_len.distribution": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.output_len.distribution": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.trace_format": ("workload.kind", _one_of(*TRACE)),
    "workload.trace_start_s": ("workload.kind", _one_of(*TRACE)),
    "workload.trace_end_s": ("workload.kind", _one_of(*TRACE)),
    "workload.trace_block_tokens": ("workload.kind", _one_of(*TRACE)),
    "load.speedup": ("load.pattern", _one_of(*TRACE)),
    "workload.shared_prefix_tokens": ("workload.kind", _one_of("shared_prefix", "multi_turn", "random")),
    "workload.shared_prefix_fraction": ("workload.kind", _one_of("shared_prefix", "multi_turn", "random")),
    "workload.input_len.spread": ("workload.input_len.distribution", _one_of("uniform", "normal")),
    "workload.output_len.spread": ("workload.output_len.distribution", _one_of("uniform", "normal")),
    "workload.turns": ("workload.kind", _one_of("multi_turn")),
    "load.concurrency": ("load.pattern", _one_of("closed", "sweep")),
    "load.rate_rps": ("load.pattern", _one_of("constant", "poisson", "gamma", "ramp")),
    "load.burstiness": ("load.pattern", _one_of("gamma")),
    "load.ramp_start_rps": ("load.pattern", _one_of("ramp")),
    "load.sweep_of": ("load.pattern", _one_of("sweep")),
    "load.levels": ("load.pattern", _one_of("sweep")),
    "load.max_concurrency": ("load.pattern", _one_of(*OPEN_LOOP)),
    "load.ramp_up_s": ("load.pattern", _one_of("closed", "sweep")),
    # Speculative decoding's own settings only while it is on, and only those its method reads.
    "features.speculative.num_speculative_tokens": ("features.speculative.method", _one_of(*SPEC_ON)),
    "features.speculative.draft_model": ("features.speculative.method", _one_of("eagle", "eagle3", "draft_model")),
    "features.speculative.ngram_prompt_lookup_max": ("features.speculative.method", _one_of("ngram")),
    "features.speculative.ngram_prompt_lookup_min": ("features.speculative.method", _one_of("ngram")),
    "features.kv_offload_backend": ("features.kv_offload_gib", lambda gib: bool(gib)),
}
TABS = ("Features", "Workload and load", "Engine and model")


def tooltip_for(path: str, spec: FieldSpec) -> str:
    info = FEATURES_BY_KEY.get(path.removeprefix("features.")) if path.startswith("features.") else None
    if info is not None:
        return f"{info.explanation}\n\nAttacks: {info.attacks}."
    return spec.description


def issue_path(issue: ValidationIssue) -> str:
    """Adapter issues name Features paths (``speculative.draft_model``) or ``engine.*``."""
    return issue.field if issue.field.startswith(("engine", "workload", "load")) else f"features.{issue.field}"


def _dict_get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def _ctx_number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def error_text(error: Mapping[str, Any], paths: tuple[str, ...] | list[str] = ()) -> str:
    """One pydantic error in the words of the field it concerns: ``must be at least 1``,
    ``load pattern 'poisson' needs Rate (req/s)``."""
    kind, ctx = error.get("type", ""), error.get("ctx") or {}
    words = {
        "greater_than_equal": lambda: f"must be at least {_ctx_number(ctx.get('ge'))}",
        "greater_than": lambda: f"must be more than {_ctx_number(ctx.get('gt'))}",
        "less_than_equal": lambda: f"must be at most {_ctx_number(ctx.get('le'))}",
        "less_than": lambda: f"must be less than {_ctx_number(ctx.get('lt'))}",
        "string_too_short": lambda: f"must have at least {ctx.get('min_length', 1)} character(s)",
        "too_long": lambda: f"must have at most {_ctx_number(ctx.get('max_length'))} entries",
        "finite_number": lambda: "must be a finite number",
    }
    text = words[kind]() if kind in words else str(error.get("msg", "")).removeprefix("Value error, ")
    return in_field_words(text, paths)


ALL_PATHS: tuple[str, ...] = (*ENGINE_FIELDS, *WORKLOAD_FIELDS, *LOAD_FIELDS,
                              *(f"features.{info.key}" for info in FEATURES), "features.kv_offload_backend",
                              "features.speculative.ngram_prompt_lookup_min")


def _messages(exc: ValidationError) -> str:
    return "; ".join(error_text(e, ALL_PATHS) for e in exc.errors())


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
    unreadable = Signal(str)
    """A typed value could not be read (the message is by the field; nothing was edited)."""

    def __init__(self, path: str, spec: FieldSpec, parent: QWidget | None = None,
                 engine_default: Any = None) -> None:
        super().__init__(parent)
        self.path, self.spec = path, spec
        self.engine_default = engine_default
        """What the engine does when this switch is unset (None: not declared)."""
        self.tooltip = tooltip_for(path, spec)
        self.reset_button: QToolButton | None = None
        self._explicit = False  # a two-state switch: set by the user/profile, not the engine's default
        self._value: Any = None
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
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.widget, 1)
        if path == "engine.model":  # a hub id, a recent model, or a local directory
            self.browse = QToolButton()
            self.browse.setText("…")
            self.browse.setToolTip("Choose a local model directory")
            self.browse.clicked.connect(self._browse_model)
            row.addWidget(self.browse)
        if spec.kind == "tristate":
            self.reset_button = QToolButton()
            self.reset_button.setText("\u21ba")
            self.reset_button.setToolTip("Back to the engine's default")
            self.reset_button.setAutoRaise(True)
            self.reset_button.clicked.connect(self._reset_to_default)
            row.addWidget(self.reset_button)
        box.addLayout(row)
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
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(8)
            if spec.optional:
                combo.addItem(no_value_text(self.path), None)
            for choice in choices:
                combo.addItem(choice, choice)
            combo.activated.connect(lambda _i: self._emit())
            return combo
        if self.path == "engine.model":
            combo = QComboBox()
            combo.setEditable(True)
            combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)
            line_edit = combo.lineEdit()
            assert line_edit is not None
            line_edit.editingFinished.connect(self._emit)
            combo.activated.connect(lambda _i: self._emit())
            return combo
        if spec.kind in ("bool", "tristate"):
            # Two states even where the engine has a default: a click always gives the other of
            # on/off (never a third "default" state); the default shows what it is.
            check = QCheckBox()
            check.clicked.connect(self._check_clicked)
            return check
        if spec.kind == "int":
            spin = QSpinBox()
            low = int(spec.minimum) if spec.minimum is not None else 0
            # One below the minimum: "engine default" for an optional value; for a required one,
            # a value the user can type and be told about (instead of the box refusing silently).
            # A QSpinBox holds 32-bit ints: bounds beyond that (seed < 2**63) stop at INT_MAX.
            spin.setRange(low - 1, min(int(spec.maximum), INT_MAX) if spec.maximum else INT_MAX)
            if spec.optional:
                spin.setSpecialValueText(no_value_text(self.path))
            spin.setGroupSeparatorShown(True)
            spin.setKeyboardTracking(False)
            spin.valueChanged.connect(lambda _v: self._emit())
            return spin
        if spec.kind == "float":
            dspin = QDoubleSpinBox()
            dspin.setDecimals(2)
            low_f = spec.minimum if spec.minimum is not None else 0.0
            step = 0.05 if (spec.maximum or 2) <= 1 or "utilization" in self.path else 1.0
            dspin.setRange(low_f - (0.01 if spec.optional else step), spec.maximum if spec.maximum else 1e9)
            dspin.setSingleStep(step)
            if spec.optional:
                dspin.setSpecialValueText(no_value_text(self.path))
            dspin.setKeyboardTracking(False)
            dspin.valueChanged.connect(lambda _v: self._emit())
            return dspin
        line = QLineEdit()
        if spec.optional:
            line.setPlaceholderText(no_value_text(self.path))
        if spec.kind == "list":
            line.setPlaceholderText("space-separated" if spec.item_type == "str" else "comma-separated numbers")
        line.editingFinished.connect(self._emit)
        return line

    def _browse_model(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.widget, "Model directory (with config.json)")
        if folder:
            self.set_value(folder)
            self._emit()

    def _check_clicked(self, checked: bool) -> None:
        self._explicit = True
        self._value = bool(checked)
        self._show_check()
        self._emit()

    def _reset_to_default(self) -> None:
        self.set_value(None)
        self._emit()

    def _show_check(self) -> None:
        """The switch as it will act: its value, or the engine's default and what that is. Greyed
        out (this machine cannot do it), it claims neither on nor off."""
        check = self.widget
        assert isinstance(check, QCheckBox)
        check.blockSignals(True)
        try:
            if self._unavailable:
                check.setChecked(False)
                check.setText("not available here")
            elif self.spec.kind == "tristate" and not self._explicit:
                default = self.engine_default
                check.setChecked(bool(default))
                check.setText(f"{value_text(self.path, default)} ({ENGINE_DEFAULT})" if default is not None
                              else ENGINE_DEFAULT)
            else:
                check.setChecked(bool(self._value))
                check.setText("on" if self._value else "off")
        finally:
            check.blockSignals(False)
        if self.reset_button is not None:
            self.reset_button.setVisible(self._explicit and not self._unavailable)

    def value(self) -> Any:
        spec, w = self.spec, self.widget
        if isinstance(w, QComboBox):
            if w.isEditable():
                return w.currentText().strip()
            return w.currentData()
        if isinstance(w, QCheckBox):
            if spec.kind == "tristate" and not self._explicit:
                return None
            return bool(self._value)
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
                self._explicit = value is not None
                self._value = bool(value) if value is not None else None
                self._show_check()
            elif isinstance(w, QSpinBox | QDoubleSpinBox):
                # Clamped to the widget's range: a profile's seed may exceed what a QSpinBox holds.
                w.setValue(w.minimum() if value is None else min(max(value, w.minimum()), w.maximum()))  # type: ignore[arg-type]
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
            self.unreadable.emit(self.path)
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
        if isinstance(self.widget, QCheckBox):
            self._show_check()
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
            text, style = self._unavailable.split(";")[0], "color: #80868b; font-style: italic;"
        self.message.setText(text)
        self.message.setStyleSheet(style)
        self.message.setVisible(bool(text))

    @property
    def message_text(self) -> str:
        return self.message.text() if not self.message.isHidden() and self.message.text() else ""

    @property
    def severity(self) -> str | None:
        """``error`` / ``warning`` when the editor shows a message that asks for attention."""
        if self._edit_error:
            return "error"
        return self._issue[0] if self._issue else None


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
            visible = True
            condition = VISIBLE_WHEN.get(path)
            if condition is not None:
                other, wanted = condition
                visible = bool(wanted(self.state.draft_value(other)))
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
