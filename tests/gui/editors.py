"""Setting a configuration field the way a user does: through its editor in the config panel."""

from __future__ import annotations

from PySide6.QtWidgets import QSpinBox

from app.gui.main_window import MainWindow


def set_spin(window: MainWindow, path: str, value: int) -> None:
    """Type ``value`` into the spin box that edits the field at ``path`` (``"load.concurrency"``),
    which must take it without a message."""
    editor = window.config_panel.editor(path)
    assert isinstance(editor.widget, QSpinBox)
    editor.widget.setValue(value)
    assert editor.message_text == "", editor.message_text
