"""Export from a run or a comparison: launch script (bash, docker, compose, Kubernetes), HTML
report, JSON or CSV, with a preview, copy to clipboard and save. Rendering is ``app.export``'s;
it runs in a worker because it reads the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

from app.export import (
    DATA_FORMATS,
    SCRIPT_FORMATS,
    render_launch,
    render_report,
    run_to_csv,
    run_to_json,
    spec_from_run,
)
from app.gui.workers import run_in_worker
from db.compare import compare_runs
from db.store import RunStore

if TYPE_CHECKING:
    from app.gui.main_window import MainWindow

FORMAT_LABELS = {"bash": "Launch script (bash)", "docker": "docker run script", "compose": "Docker Compose",
                 "k8s": "Kubernetes manifest", "html": "HTML report (comparison)", "json": "Run data (JSON)",
                 "csv": "Requests (CSV)"}
SUFFIX = {"bash": ".sh", "docker": ".sh", "compose": ".yaml", "k8s": ".yaml", "html": ".html", "json": ".json",
          "csv": ".csv"}


def render_export(store: RunStore, fmt: str, run_id: int, run_ids: list[int]) -> str:
    """The text of one export (what the preview shows and Save writes)."""
    if fmt in SCRIPT_FORMATS:
        return render_launch(spec_from_run(store.get_run(run_id)), fmt)
    if fmt == "html":
        others = [r for r in run_ids if r != run_id]
        return render_report(compare_runs(store, [run_id, *others], baseline=run_id))
    if fmt == "json":
        return json.dumps(run_to_json(store, run_id), indent=1)
    if fmt == "csv":
        return run_to_csv(store, run_id)
    raise ValueError(f"unknown export format {fmt}")


class ExportDialog(QDialog):
    def __init__(self, window: MainWindow, run_ids: list[int], comparison: bool = False,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent or window)
        self.window_ = window
        self.run_ids = list(run_ids)
        self.setWindowTitle("Export")
        self.resize(900, 650)
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.run_choice = QComboBox()
        for run_id in self.run_ids:
            self.run_choice.addItem(f"run #{run_id}", run_id)
        self.run_choice.setToolTip("The run whose configuration is exported (the baseline of a report)")
        self.format = QComboBox()
        for fmt in (*SCRIPT_FORMATS, *DATA_FORMATS):
            self.format.addItem(FORMAT_LABELS.get(fmt, fmt), fmt)
            if fmt == "html" and len(self.run_ids) < 2:
                index = self.format.count() - 1
                self.format.model().item(index).setEnabled(False)  # type: ignore[attr-defined]
                self.format.setItemData(index, "Select two or more runs for a comparison report", 3)
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

    def render_preview(self) -> None:
        self._generation += 1
        generation = self._generation
        fmt, run_id, run_ids = self.fmt, int(self.run_choice.currentData()), list(self.run_ids)
        self.copy_button.setEnabled(False)
        self.save_button.setEnabled(False)
        self.message.setText("Rendering…")
        self.message.setStyleSheet("")

        def done(text: Any) -> None:
            if generation != self._generation:
                return  # a newer choice is being rendered
            self.text = str(text)
            shown = self.text if len(self.text) < 400_000 else self.text[:400_000] + "\n… (preview truncated)"
            self.preview.setPlainText(shown)
            self.message.setText(f"{FORMAT_LABELS.get(fmt, fmt)}: {len(self.text):,} characters")
            self.copy_button.setEnabled(True)
            self.save_button.setEnabled(True)

        def failed(message: str) -> None:
            if generation != self._generation:
                return
            self.text = ""
            self.preview.setPlainText("")
            self.message.setText(message)
            self.message.setStyleSheet("color: #d93025;")

        run_in_worker(lambda: self.window_._with_store(lambda s: render_export(s, fmt, run_id, run_ids)),
                      done, failed, name="export", parent=self.window_)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text)
        self.message.setText("Copied to the clipboard")

    def _save_dialog(self) -> None:
        suggested = str(Path.home() / f"tunebench-run{self.run_choice.currentData()}{SUFFIX.get(self.fmt, '.txt')}")
        path, _ = QFileDialog.getSaveFileName(self, "Save export", suggested)
        if path:
            self.save_to(Path(path))

    def save_to(self, path: Path) -> None:
        text, executable = self.text, self.fmt in ("bash", "docker")

        def write() -> Path:
            try:
                path.write_text(text, encoding="utf-8")
                if executable:
                    path.chmod(0o755)
            except OSError as exc:
                raise OSError(f"{path}: cannot write: {exc.strerror}") from None
            return path

        def failed(message: str) -> None:
            self.message.setText(message)
            self.message.setStyleSheet("color: #d93025;")

        run_in_worker(write, lambda p: self.message.setText(f"Saved {p}"), failed, name="export-save",
                      parent=self.window_)
