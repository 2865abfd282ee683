"""Run database… and whose runs History shows: the author/host/GPU filters, the dialog that picks
a store (a file or a PostgreSQL URL, never showing its password), switching History to it, and a
delete confirmation that names a colleague's runs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QLabel, QLineEdit, QMessageBox, QTableWidgetItem

from app.gui.history import HistoryView
from app.gui.main_window import MainWindow
from app.gui.settings import GuiSettings, save_settings
from app.gui.store_box import StoreDialog
from app.profiles import load_profile_file, resolve_profile
from app.store import RunStore
from db.records import RunInfo
from db.writes import AUTHOR_ENV
from tests.gui.conftest import close_window

pytestmark = pytest.mark.gui

PASSWORD = "s3cret-pw"


@pytest.fixture(autouse=True)
def _own_settings_and_author(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dialog saves settings and sets the author in the environment: both stay in this test."""
    monkeypatch.setenv("TUNEBENCH_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv(AUTHOR_ENV, "unset on undo")  # records whether it was set: undo restores that
    monkeypatch.delenv(AUTHOR_ENV)


def run_info(run_id: int, name: str, author: str, host: str, gpu: str, **extra: object) -> RunInfo:
    return RunInfo(id=run_id, uid=f"u{run_id}", name=name, status="completed", started_at=1_700_000_000 + run_id * 60,
                   finished_at=1_700_000_050 + run_id * 60, engine_kind="vllm", model="Qwen/Qwen3-8B",
                   author=author, host=host, gpu_model=gpu,
                   metrics={"output_tok_per_s": 1000.0 + 100 * run_id, "ttft_ms_p50": 80.0 - run_id,
                            "itl_ms_p50": 9.5, "requests_total": 400, "requests_failed": 0}, **extra)  # type: ignore[arg-type]


TEAM_RUNS = [
    run_info(1, "baseline", "alice", "gpu-box-1", "NVIDIA H100 80GB HBM3"),
    run_info(2, "prefix caching on", "alice", "gpu-box-1", "NVIDIA H100 80GB HBM3", notes="warm cache"),
    run_info(3, "fp8 kv cache", "bob", "gpu-box-7", "NVIDIA H200"),
    run_info(4, "chunked prefill", "bob", "gpu-box-7", "NVIDIA H200"),
    run_info(5, "cpu smoke test", "carol", "laptop", ""),
]


def name_cell(view: HistoryView, row: int) -> QTableWidgetItem:
    item = view.table.item(row, 1)
    assert item is not None
    return item


def visible_names(view: HistoryView) -> list[str]:
    return sorted(name_cell(view, r).text() for r in range(view.table.rowCount()) if not view.table.isRowHidden(r))


def choose(view: HistoryView, combo_attr: str, value: str | None) -> None:
    combo = getattr(view, combo_attr)
    combo.setCurrentIndex(combo.findData(value) if value is not None else 0)


def test_author_host_and_gpu_filters_narrow_the_table(qtbot) -> None:  # type: ignore[no-untyped-def]
    view = HistoryView()
    qtbot.addWidget(view)
    view.set_runs(list(TEAM_RUNS))
    assert [view.author_filter.itemText(i) for i in range(view.author_filter.count())] == \
        ["All authors", "alice", "bob", "carol"]
    assert [view.gpu_filter.itemText(i) for i in range(view.gpu_filter.count())] == \
        ["All GPUs", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "no GPU"]
    assert len(visible_names(view)) == 5

    choose(view, "author_filter", "bob")
    assert visible_names(view) == ["chunked prefill", "fp8 kv cache"]
    assert view.message.text() == "2 of 5 run(s) shown"
    view.filter.setText("fp8")  # with the text filter
    assert visible_names(view) == ["fp8 kv cache"]
    view.filter.setText("")
    choose(view, "author_filter", None)
    choose(view, "gpu_filter", "")  # the machine without a GPU
    assert visible_names(view) == ["cpu smoke test"]
    choose(view, "gpu_filter", None)
    choose(view, "host_filter", "gpu-box-1")
    view.status.setCurrentText("failed")  # with the status combo: none of alice's failed
    assert visible_names(view) == []
    view.status.setCurrentText("any status")
    assert visible_names(view) == ["baseline", "prefix caching on"]

    # A refresh keeps a choice that still exists, and drops one that does not.
    view.set_runs(list(TEAM_RUNS[:4]))
    assert view.host_filter.currentData() == "gpu-box-1"
    assert visible_names(view) == ["baseline", "prefix caching on"]
    view.set_runs([r for r in TEAM_RUNS if r.host != "gpu-box-1"])
    assert view.host_filter.currentIndex() == 0
    assert len(visible_names(view)) == 3

    # Whose a run is, on its name; the notes after.
    view.set_runs(list(TEAM_RUNS))
    tips = {name_cell(view, r).text(): name_cell(view, r).toolTip() for r in range(view.table.rowCount())}
    assert tips["fp8 kv cache"] == "by bob on gpu-box-7"
    assert tips["prefix caching on"] == "by alice on gpu-box-1\nwarm cache"


def test_delete_names_the_runs_someone_else_recorded(qtbot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    view = HistoryView()
    qtbot.addWidget(view)
    view.author = "alice"
    view.set_runs(list(TEAM_RUNS))
    asked: list[str] = []

    def answer_no(_parent: object, _title: str, text: str, *_a: object) -> QMessageBox.StandardButton:
        asked.append(text)
        return QMessageBox.StandardButton.No

    monkeypatch.setattr(QMessageBox, "question", answer_no)
    deleted: list[list[int]] = []
    view.delete_requested.connect(deleted.append)

    view.select_ids([2, 3, 4])
    qtbot.mouseClick(view.delete_button, Qt.MouseButton.LeftButton)
    assert asked[-1].startswith("2 of these runs were recorded by someone else (bob on gpu-box-7). Delete 3 run(s)")
    view.select_ids([1, 2])  # alice's own: the plain question
    qtbot.mouseClick(view.delete_button, Qt.MouseButton.LeftButton)
    assert asked[-1].startswith("Delete 2 run(s) and everything recorded with them?")
    view.select_ids([5])
    qtbot.mouseClick(view.delete_button, Qt.MouseButton.LeftButton)
    assert asked[-1].startswith("This run was recorded by someone else (carol on laptop). Delete 1 run(s)")
    assert deleted == []  # No deletes nothing


def test_dialog_refuses_a_bad_location_inline_and_accepts_a_path(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dialog = StoreDialog(None)
    qtbot.addWidget(dialog)
    dialog.show()
    assert "postgresql://" in dialog.location_edit.placeholderText()
    assert "PGPASSWORD" in dialog.help.text() and "~/.pgpass" in dialog.help.text()
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)

    dialog.location_edit.setText("mysql://x@h/db")
    qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and dialog.result() != StoreDialog.DialogCode.Accepted
    assert dialog.error.isVisible() and "mysql URL" in dialog.error.text()
    assert "\n" not in dialog.error.text()

    path = tmp_path / "team" / "runs.db"
    dialog.location_edit.setText(str(path))
    dialog.author_edit.setText("  dana ")
    with qtbot.waitSignal(dialog.accepted, timeout=2000):
        qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    assert (dialog.location(), dialog.author()) == (str(path), "dana")
    assert not path.exists()  # parsed, never opened: the window opens it in a worker


def test_a_password_in_the_url_is_never_shown(qtbot) -> None:  # type: ignore[no-untyped-def]
    url = f"postgresql://alice:{PASSWORD}@db.example:5432/tunebench"
    dialog = StoreDialog(None, url, "alice")
    qtbot.addWidget(dialog)
    assert PASSWORD not in dialog.location_edit.text() and "alice:***@db.example" in dialog.location_edit.text()
    assert dialog.location() == url  # left as it was: the URL in use, password and all
    dialog.location_edit.setText("postgresql://alice@db.example:5432/other")
    assert dialog.location() == "postgresql://alice@db.example:5432/other"


def seed(path: Path, names: list[str], author: str) -> None:
    with RunStore(path, author=author) as store:
        for i, name in enumerate(names):
            run_id = store.create_run(name=name, model="tunebench:demo", engine_kind="vllm",
                                      hardware={"gpus": [{"name": "NVIDIA L4"}]}, started_at=time.time() - 600 + i)
            store.finish_run(run_id, "completed", None, {}, time.time() - 500 + i)


def names_shown(window: MainWindow) -> list[str]:
    return sorted(r.name for r in window.history.runs)


def test_accepting_switches_where_history_reads(qtbot, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                make_window: Callable[..., MainWindow]) -> None:
    first, second = tmp_path / "mine.db", tmp_path / "team.db"
    seed(first, ["my run"], "alice")
    seed(second, ["bob's baseline", "bob's fp8"], "bob")
    window = make_window(db_path=first)
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: names_shown(window) == ["my run"], timeout=10_000)
    assert window.history.where.text() == f"Runs in: {first}"

    dialog = window.open_store_dialog()
    assert dialog.location_edit.text() == str(first) and dialog.now.text() == f"Now: {first}"
    dialog.location_edit.setText(str(second))
    dialog.author_edit.setText("alice")
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: names_shown(window) == ["bob's baseline", "bob's fp8"], timeout=10_000)
    assert window.history.where.text() == f"Runs in: {second}"
    assert window.db_path == str(second)
    assert os.environ[AUTHOR_ENV] == "alice" and window.history.author == "alice"
    assert window.history.author_filter.findData("bob") > 0
    assert window.history.gpu_filter.findData("NVIDIA L4") > 0
    qtbot.waitUntil(lambda: window.settings.store_location == str(second), timeout=2000)
    settings_file = tmp_path / "config" / "gui.json"
    qtbot.waitUntil(lambda: settings_file.exists() and str(second) in settings_file.read_text(), timeout=5000)

    # An empty author is the OS user again.
    dialog = window.open_store_dialog()
    dialog.author_edit.setText("")
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: AUTHOR_ENV not in os.environ, timeout=2000)
    qtbot.waitUntil(lambda: names_shown(window) == ["bob's baseline", "bob's fp8"], timeout=10_000)


def test_a_run_another_workbench_records_shows_running_then_its_end(  # type: ignore[no-untyped-def]
        qtbot, tmp_path: Path, make_window: Callable[..., MainWindow]) -> None:
    path = tmp_path / "team.db"
    with RunStore(path, author="bob") as colleague:  # another workbench, still recording
        run_id = colleague.create_run(name="bob's long soak", hardware={"hostname": "gpu-box-7"})
        window = make_window(db_path=path)
        window.tabs.setCurrentWidget(window.history)
        qtbot.waitUntil(lambda: [r.status for r in window.history.runs] == ["running"], timeout=10_000)
        colleague.finish_run(run_id, "completed")
        qtbot.waitUntil(lambda: [r.status for r in window.history.runs] == ["completed"], timeout=20_000)


def test_start_up_reads_the_chosen_store_unless_db_is_given(qtbot, tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                                            make_window: Callable[..., MainWindow]) -> None:
    monkeypatch.setenv("TUNEBENCH_DATA_DIR", str(tmp_path / "data"))  # where the default file would be
    chosen, given = tmp_path / "chosen.db", tmp_path / "given.db"
    seed(chosen, ["chosen run"], "dana")
    seed(given, ["given run"], "dana")
    save_settings(GuiSettings(store_location=str(chosen), author="dana"))

    window = make_window(db_path=given)  # --db wins
    qtbot.waitUntil(lambda: names_shown(window) == ["given run"] and os.environ.get(AUTHOR_ENV) == "dana",
                    timeout=10_000)
    assert window.history.where.text() == f"Runs in: {given}" and window.history.author == "dana"
    close_window(qtbot, window)

    path = resolve_profile("cpu-demo")
    window = MainWindow(load_profile_file(path), path)  # no --db: the settings' store, not the default file
    window.show()
    try:
        qtbot.waitUntil(lambda: names_shown(window) == ["chosen run"], timeout=10_000)
        assert window.history.where.text() == f"Runs in: {chosen}" and window.db_path == str(chosen)
        assert not (tmp_path / "data" / "runs.db").exists()  # never opened on the way
    finally:
        close_window(qtbot, window)


def test_an_unreachable_url_is_shown_masked(qtbot, tmp_path: Path,  # type: ignore[no-untyped-def]
                                            make_window: Callable[..., MainWindow]) -> None:
    seed(tmp_path / "mine.db", ["my run"], "alice")
    window = make_window(db_path=tmp_path / "mine.db")
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: names_shown(window) == ["my run"], timeout=10_000)
    dialog = window.open_store_dialog()
    dialog.location_edit.setText(f"postgresql://alice:{PASSWORD}@127.0.0.1:1/tunebench")  # nothing listens on 1
    qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "(not opened)" in window.history.where.text(), timeout=20_000)
    assert window.history.where.text() == \
        "Runs in: postgresql+psycopg://alice:***@127.0.0.1:1/tunebench (not opened)"
    assert window.history.runs == []  # not the previous store's runs under the new name
    assert window.banner.isVisible() and "alice:***@127.0.0.1" in window.banner.text()
    texts = [w.text() for w in window.findChildren(QLabel)] + [w.text() for w in window.findChildren(QLineEdit)]
    texts += [window.statusBar().currentMessage(), window.history.where.toolTip()]
    assert not [t for t in texts if PASSWORD in t]

    dialog = window.open_store_dialog()  # reopened: the URL is shown masked, and OK keeps the real one
    assert PASSWORD not in dialog.location_edit.text() and dialog.location().endswith(f"{PASSWORD}@127.0.0.1:1/tunebench")
    dialog.reject()


def test_screenshot_of_history_with_the_filters(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The History tab on a team's store, narrowed to one colleague's runs, at the size it has in a
    1366x768 window; saved into ``$TUNEBENCH_SHOTS`` when set (``docs`` for docs/history-filters.png)."""
    shots = Path(os.environ.get("TUNEBENCH_SHOTS") or tmp_path)
    view = HistoryView()
    qtbot.addWidget(view)
    view.resize(960, 420)
    view.set_where("postgresql+psycopg://alice@db.team.example:5432/tunebench")
    view.set_runs(list(TEAM_RUNS))
    choose(view, "author_filter", "bob")
    view.show()
    qtbot.waitExposed(view)
    view.select_ids([4])
    qtbot.wait(100)  # let the selection paint
    shots.mkdir(parents=True, exist_ok=True)
    assert view.grab().save(str(shots / "history-filters.png"))
