"""One editor row of the configuration panel (``app.gui.config_panel``): the input widget a
field's type calls for, its inline message and whether this machine can use it.

The row reads and shows a value and says when it was edited; whether the value is accepted is
the editing model's business (``app.editing``), what the message says is the panel's.
"""

from __future__ import annotations

import shlex
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gui.fields import FieldSpec
from app.labels import ENGINE_DEFAULT, no_value_text, value_text
from engine_adapters.features import FEATURES_BY_KEY
from engine_adapters.runtimes import MANAGED_RUNTIMES

INT_MAX = 2_000_000_000
CHOICES_OVERRIDE = {"engine.runtime.managed": tuple(sorted(MANAGED_RUNTIMES))}


def tooltip_for(path: str, spec: FieldSpec) -> str:
    info = FEATURES_BY_KEY.get(path.removeprefix("features.")) if path.startswith("features.") else None
    if info is not None:
        return f"{info.explanation}\n\nAttacks: {info.attacks}."
    return spec.description


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
