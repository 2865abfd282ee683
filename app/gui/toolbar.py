"""The window's toolbar: the profile picker (shipped and recent profiles), Open/Save/Save as,
Presentation and Run database…; and the file dialogs the profile actions ask for a path in.

The toolbar only offers; the window opens and saves profiles (in workers) and decides what the
picker lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QComboBox, QFileDialog, QLabel, QToolBar, QWidget


class MainToolBar(QToolBar):
    def __init__(self, parent: QWidget) -> None:
        super().__init__("Main", parent)
        self.setMovable(False)
        self.addWidget(QLabel(" Profile: "))
        self.profile_picker = QComboBox()
        self.profile_picker.setMinimumWidth(200)
        self.profile_picker.setToolTip("Shipped and recent profiles")
        self.addWidget(self.profile_picker)
        self.open_action = QAction("Open…", self)
        self.open_action.setShortcut(QKeySequence.StandardKey.Open)
        self.save_action = QAction("Save", self)
        self.save_action.setShortcut(QKeySequence.StandardKey.Save)
        self.save_as_action = QAction("Save as…", self)
        for action in (self.open_action, self.save_action, self.save_as_action):
            self.addAction(action)
        self.addSeparator()
        self.present_action = QAction("Presentation (F11)", self)
        self.addAction(self.present_action)
        self.store_action = QAction("Run database…", self)
        self.store_action.setToolTip("Where runs are kept (a file, or a team's PostgreSQL database) and the author "
                                     "name new runs carry")
        self.addAction(self.store_action)

    def fill_profiles(self, shipped: Mapping[str, Path], recent: Iterable[str], current: Path | None) -> None:
        """The shipped profiles, then the recent ones; ``current`` is selected when listed."""
        picker = self.profile_picker
        picker.blockSignals(True)
        picker.clear()
        picker.addItem("— choose a profile —", None)
        for stem, path in sorted(shipped.items()):
            picker.addItem(f"{stem} (shipped)", str(path))
        for path_text in recent:
            if picker.findData(path_text) < 0:
                picker.addItem(f"{Path(path_text).name} (recent)", path_text)
        if current is not None:
            index = picker.findData(str(current))
            picker.setCurrentIndex(max(index, 0))
        picker.blockSignals(False)

    def picked_profile(self, index: int) -> Path | None:
        path = self.profile_picker.itemData(index)
        return Path(path) if path else None

    def set_idle(self, idle: bool) -> None:
        """What a run must not change while it runs: the profile, and the store it records into."""
        self.profile_picker.setEnabled(idle)
        self.open_action.setEnabled(idle)
        self.store_action.setEnabled(idle)  # a run records where it started; History would lose it

    def ask_open_path(self, start: Path) -> Path | None:
        path, _ = QFileDialog.getOpenFileName(self.window(), "Open profile", str(start),
                                              "Profiles (*.toml);;All files (*)")
        return Path(path) if path else None

    def ask_save_path(self, suggested: Path) -> Path | None:
        path, _ = QFileDialog.getSaveFileName(self.window(), "Save profile", str(suggested), "Profiles (*.toml)")
        return Path(path) if path else None
