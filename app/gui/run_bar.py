"""The run bar under the configuration: the run's name (suggested from what changed since the
last run, e.g. "prefix caching on"), a note, repeats, keeping the engine warm, and Start / Stop.
Start is the one highlighted button of the window: it is what to press next."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from app.gui.repeats import repeat_box

START_STYLE = ("QPushButton#start { background: #1a73e8; color: white; font-weight: 600; font-size: 11pt; "
               "padding: 6px 18px; border-radius: 4px; border: none; }"
               "QPushButton#start:hover { background: #1765cc; }"
               "QPushButton#start:disabled { background: #c6dafc; color: #f8f9fa; }"
               "QPushButton#stop { padding: 6px 12px; }")


class RunBar(QWidget):
    """Name, note, repeats, keep-warm and Start/Stop. The name field follows the suggestion
    until the user types a name of their own (clearing it goes back to the suggestion)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("runBar")
        self.setStyleSheet(START_STYLE)
        grid = QGridLayout(self)
        grid.setContentsMargins(4, 4, 4, 4)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(4)
        self.name = QLineEdit()
        self.name.setObjectName("runName")
        self.name.setPlaceholderText("run name")
        self.name.setToolTip("The run's name in History and Compare; suggested from what changed since the "
                             "last run until you type your own")
        self.note = QLineEdit()
        self.note.setObjectName("runNote")
        self.note.setPlaceholderText("a note for this run (optional)")
        self.note.setToolTip("Kept with the run (History, exports)")
        self.repeats = repeat_box()
        self.keep_engine = QCheckBox("Keep engine warm")
        self.keep_engine.setToolTip("Later runs with the same engine and features reuse the running engine "
                                    "(a start takes about a minute); changing either restarts it.")
        self.start_button = QPushButton("\u25b6 Start")
        self.start_button.setObjectName("start")
        self.start_button.setDefault(True)
        self.stop_button = QPushButton("\u25a0 Stop")
        self.stop_button.setObjectName("stop")
        self.stop_button.setEnabled(False)
        grid.addWidget(QLabel("Name"), 0, 0)
        grid.addWidget(self.name, 0, 1, 1, 3)
        grid.addWidget(QLabel("Note"), 1, 0)
        grid.addWidget(self.note, 1, 1, 1, 3)
        options = QHBoxLayout()
        options.addWidget(QLabel("Repeats"))
        options.addWidget(self.repeats)
        options.addWidget(self.keep_engine)
        options.addStretch(1)
        grid.addLayout(options, 2, 0, 1, 2)
        grid.addWidget(self.stop_button, 2, 2)
        grid.addWidget(self.start_button, 2, 3)
        grid.setColumnStretch(1, 1)
        self.suggestion = ""
        self._own_name = False
        self.name.textEdited.connect(self._typed)

    def _typed(self, text: str) -> None:
        self._own_name = bool(text.strip())

    def suggest(self, name: str) -> None:
        """The name to use unless the user chose one."""
        self.suggestion = name
        self.name.setPlaceholderText(name or "run name")
        if not self._own_name:
            self.name.setText(name)

    def run_name(self) -> str:
        return self.name.text().strip() or self.suggestion

    def run_note(self) -> str:
        return self.note.text().strip()

    def started(self) -> None:
        """After Start: the next run gets a fresh suggestion and an empty note."""
        self._own_name = False
        self.note.clear()

    def set_running(self, running: bool) -> None:
        self.start_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for widget in (self.keep_engine, self.repeats, self.name, self.note):
            widget.setEnabled(not running)
