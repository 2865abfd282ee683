"""Run database…: where the workbench keeps its runs (an SQLite file, or a team's PostgreSQL
database) and the author name its new runs carry.

The dialog only parses what is typed (``db.schema.store_location``, which never connects); the
window opens the store in a worker. A password is never shown: a URL that holds one is displayed
masked (``db.schema.location_text``), and a masked URL left as it was means the one in use.
"""

from __future__ import annotations

import getpass
import os

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from app.gui.theme import LIGHT
from db.errors import StoreError
from db.schema import default_db_path, location_text, store_location
from engine_adapters.errors import TunebenchError
from engine_adapters.secrets import mask_url

LOCATION_HINT = "runs.db path, or postgresql://user@host:5432/tunebench"
HELP_TEXT = ("A team shares one PostgreSQL database: everyone points the workbench at the same URL and sees "
             "each other's runs, each marked with its author and host. Leave the password out of the URL: "
             "PostgreSQL reads it from PGPASSWORD or ~/.pgpass. Left empty: $TUNEBENCH_DB, else runs.db in "
             "the user data directory. A --db given on the command line wins over this choice.")


def shown_location(location: str | None) -> str:
    """How the window names a store it has not opened: the path, or the URL with its password
    masked; empty or ``None`` is the default store."""
    try:
        return location_text(store_location(location) if location else default_db_path())
    except TunebenchError:  # a bad value (its own error says why elsewhere) or no data directory
        return mask_url(location) if location else "the default run database"


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return f"uid {os.getuid()}"


class StoreDialog(QDialog):
    """Location and author, checked on OK: a location that cannot be a store is refused inline and
    the dialog stays open; the caller reads :meth:`location` and :meth:`author` on ``accepted``."""

    def __init__(self, parent: QWidget | None, location: str = "", author: str = "", where: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Run database")
        self._current = location
        self._current_shown = shown_location(location) if location else ""
        layout = QVBoxLayout(self)
        self.now = QLabel(f"Now: {where}" if where else "")
        self.now.setWordWrap(True)
        self.now.setVisible(bool(where))
        layout.addWidget(self.now)
        form = QFormLayout()
        self.location_edit = QLineEdit(self._current_shown)
        self.location_edit.setPlaceholderText(LOCATION_HINT)
        self.location_edit.setClearButtonEnabled(True)
        self.location_edit.setMinimumWidth(460)
        self.author_edit = QLineEdit(author)
        self.author_edit.setPlaceholderText(os_user())
        self.author_edit.setToolTip("The name runs recorded by this workbench carry; empty: your OS user name")
        form.addRow("Location:", self.location_edit)
        form.addRow("Author:", self.author_edit)
        layout.addLayout(form)
        self.error = QLabel("")
        self.error.setObjectName("storeError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet(f"color: {LIGHT.bad};")
        self.error.setVisible(False)
        layout.addWidget(self.error)
        self.help = QLabel(HELP_TEXT)
        self.help.setWordWrap(True)
        self.help.setStyleSheet(f"color: {LIGHT.muted};")
        layout.addWidget(self.help)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.location_edit.textEdited.connect(lambda _t: self.error.setVisible(False))

    def location(self) -> str:
        """The location chosen ("" for the default); the masked URL shown, left as it was, is the
        one in use, password and all."""
        text = self.location_edit.text().strip()
        return self._current if self._current and text == self._current_shown else text

    def author(self) -> str:
        return self.author_edit.text().strip()

    def accept(self) -> None:
        location = self.location()
        try:
            if location:
                store_location(location)  # parses only: reaching the store is the window's worker's
        except StoreError as exc:
            self.error.setText(str(exc).strip().splitlines()[0])
            self.error.setVisible(True)
            self.adjustSize()  # room for the message: the help under it stays whole
            self.location_edit.setFocus()
            return
        super().accept()
