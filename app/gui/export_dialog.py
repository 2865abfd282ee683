"""Export from a run or a comparison: launch script (bash, docker, compose, Kubernetes), HTML
report, JSON or CSV, with a preview, copy to clipboard and save.

Rendering and writing are ``app.export``'s, the same calls as ``tunebench export``: the preview is
``export(...)`` run in a worker (it reads the store), and Save writes that previewed text with
``app.export.save`` (atomic, scripts executable). The store is reached through the ``with_store``
callable the window passes in, never through the window's internals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.export import EXECUTABLE_FORMATS, FORMATS, SUFFIXES, Target, export, save
from app.gui.workers import run_in_worker
from app.store import RunStore

WithStore = Callable[[Callable[[RunStore], Any]], Any]
"""Runs ``fn(store)`` on the window's store (called in a worker thread)."""

FORMAT_LABELS = {"bash": "Launch script (bash)", "docker": "docker run script", "compose": "Docker Compose",
                 "k8s": "Kubernetes manifest", "ray": "Multi-node: Ray cluster script (vLLM)",
                 "k8s-multinode": "Multi-node: Kubernetes LeaderWorkerSet (vLLM)", "html": "HTML report",
                 "json": "Run data (JSON)", "csv": "Requests (CSV)"}
PREVIEW_MAX_CHARS = 400_000


def export_target(fmt: str, run_id: int, run_ids: list[int]) -> Target:
    """What the dialog exports: the chosen run; a report compares it (the baseline) with the others."""
    if fmt == "html":
        return Target(runs=[run_id, *(r for r in run_ids if r != run_id)], baseline=run_id)
    return Target(runs=[run_id])


class ExportDialog(QDialog):
    def __init__(self, parent: QWidget, run_ids: list[int], with_store: WithStore, comparison: bool = False) -> None:
        super().__init__(parent)
        self.owner = parent
        self.with_store = with_store
        self.run_ids = list(run_ids)
        self.setWindowTitle("Export")
        self.resize(900, 650)
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.run_choice = QComboBox()
        for run_id in self.run_ids:
            self.run_choice.addItem(f"run #{run_id}", run_id)
        self.run_choice.setToolTip("The run whose configuration or data is exported (the baseline of a report)")
        self.format = QComboBox()
        for fmt in FORMATS:
            label = FORMAT_LABELS.get(fmt, fmt)
            if fmt == "html":
                label += " (comparison)" if len(self.run_ids) > 1 else " (this run)"
            self.format.addItem(label, fmt)
        if comparison:
            self.format.setCurrentIndex(self.format.findData("html"))
        top.addWidget(QLabel("From:"))
        top.addWidget(self.run_choice)
        top.addWidget(QLabel("Format:"))
        top.addWidget(self.format, 1)
        layout.addLayout(top)
        self.preview = QPlainTextEdit()
        self.preview.setReadOnly(True)
        self.preview.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout.addWidget(self.preview, 1)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        layout.addWidget(self.message)
        buttons = QHBoxLayout()
        self.copy_button = QPushButton("Copy to clipboard")
        self.save_button = QPushButton("Save…")
        self.close_button = QPushButton("Close")
        buttons.addStretch(1)
        for button in (self.copy_button, self.save_button, self.close_button):
            buttons.addWidget(button)
        layout.addLayout(buttons)
        self.text = ""
        self.rendered_fmt = ""
        self._generation = 0
        self.copy_button.clicked.connect(self.copy)
        self.save_button.clicked.connect(self._save_dialog)
        self.close_button.clicked.connect(self.close)
        self.format.currentIndexChanged.connect(lambda _i: self.render_preview())
        self.run_choice.currentIndexChanged.connect(lambda _i: self.render_preview())
        self.render_preview()

    @property
    def fmt(self) -> str:
        return str(self.format.currentData())

    def _error(self, message: str) -> None:
        self.message.setText(message)
        self.message.setStyleSheet("color: #d93025;")

    def render_preview(self) -> None:
        self._generation += 1
        generation = self._generation
        fmt = self.fmt
        target = export_target(fmt, int(self.run_choice.currentData()), self.run_ids)
        self.copy_button.setEnabled(False)
        self.save_button.setEnabled(False)
        self.message.setText("Rendering…")
        self.message.setStyleSheet("")

        def done(text: Any) -> None:
            if generation != self._generation:
                return  # a newer choice is being rendered
            self.text, self.rendered_fmt = str(text), fmt
            shown = self.text if len(self.text) < PREVIEW_MAX_CHARS else (
                self.text[:PREVIEW_MAX_CHARS] + "\n… (preview truncated)")
            self.preview.setPlainText(shown)
            self.message.setText(f"{FORMAT_LABELS.get(fmt, fmt)}: {len(self.text):,} characters")
            self.copy_button.setEnabled(True)
            self.save_button.setEnabled(True)

        def failed(message: str) -> None:
            if generation != self._generation:
                return
            self.text, self.rendered_fmt = "", ""
            self.preview.setPlainText("")
            self._error(message)

        run_in_worker(lambda: self.with_store(lambda store: export(target, fmt, store=store)), done, failed,
                      name="export", parent=self.owner)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self.message.setText("Copied to the clipboard")

    def _save_dialog(self) -> None:
        name = f"tunebench-run{self.run_choice.currentData()}{SUFFIXES.get(self.fmt, '.txt')}"
        path, _ = QFileDialog.getSaveFileName(self, "Save export", str(Path.home() / name))
        if path:
            self.save_to(Path(path))

    def save_to(self, path: Path) -> None:
        """Write the previewed text (what the user saw) by the CLI's rule: atomically, scripts
        executable, special files and links refused with a one-line message."""
        text, fmt = self.text, self.rendered_fmt
        if not fmt:
            self._error("Nothing to save yet: the export is still rendering or failed")
            return
        executable = " (executable)" if fmt in EXECUTABLE_FORMATS else ""
        run_in_worker(lambda: save(text, fmt, path), lambda p: self.message.setText(f"Saved {p}{executable}"),
                      self._error, name="export-save", parent=self.owner)
