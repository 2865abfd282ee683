"""History, compare and export in the window, on a real run store seeded with two runs (the
engine-backed path is covered by test_workbench_e2e)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog, QMessageBox

from app.bus import Sample
from app.config import RunConfig
from app.gui.main_window import MainWindow
from app.store import RunStore
from app.workload import LoadConfig
from engine_adapters.config import Features

pytestmark = pytest.mark.gui


def seed_runs(db_path: Path) -> list[int]:
    """Two completed runs: 16 concurrent (fast) and 2 concurrent (half the throughput, higher TTFT)."""
    store = RunStore(db_path)
    ids = []
    now = time.time() - 600
    for i, (concurrency, tok_s, ttft_ms) in enumerate(((16, 1600.0, 60.0), (2, 800.0, 140.0))):
        config = RunConfig(name=f"demo c{concurrency}", load=LoadConfig(concurrency=concurrency),
                           features=Features(prefix_caching=i == 0))
        t0 = now + 100 * i
        run_id = store.create_run(name=config.name, config=config.model_dump(mode="json"), engine_kind="vllm",
                                  engine_version="0.32.0", model="tunebench:demo", started_at=t0, t0_mono=0.0)
        duration_s = 64 * 40 / tok_s
        records = [{"level": 0, "start_wall": t0 + k * duration_s / 40, "ttft_ms": ttft_ms + k % 3,
                    "e2e_ms": ttft_ms + 63 * 5.0, "input_tokens": 128, "output_tokens": 64, "itl_ms": [5.0] * 63}
                   for k in range(40)]
        store.write_batch(run_id, requests=records)
        store.write_batch(run_id, samples=[Sample("client", float(s), t0 + s, {"output_tok_per_s": tok_s + s})
                                   for s in range(12)])
        store.finish_run(run_id, "completed", None, {}, t0 + duration_s + 1)
        ids.append(run_id)
    store.close()
    return ids


@pytest.fixture
def seeded(tmp_path: Path, make_window: Callable[..., MainWindow]) -> tuple[MainWindow, list[int]]:
    db = tmp_path / "seeded.db"
    ids = seed_runs(db)
    return make_window(db_path=db), ids


def _select(window: MainWindow, ids: list[int]) -> None:
    window.history.select_ids(ids)
    assert sorted(window.history.selected_ids()) == sorted(ids)


def test_history_lists_filters_sorts_and_edits_runs(qtbot, seeded, monkeypatch) -> None:
    window, (fast, slow) = seeded
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: len(window.history.runs) == 2, timeout=10_000)
    table = window.history.table
    headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    tok_col = headers.index("tok/s")
    table.sortItems(tok_col, Qt.SortOrder.DescendingOrder)
    assert table.item(0, 1).text() == "demo c16"
    assert float(table.item(0, tok_col).text().replace(",", "")) > float(table.item(1, tok_col).text().replace(",", ""))

    window.history.filter.setText("c2")
    visible = [table.item(r, 1).text() for r in range(table.rowCount()) if not table.isRowHidden(r)]
    assert visible == ["demo c2"]
    window.history.filter.setText("")

    _select(window, [slow])
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("low concurrency", True))
    qtbot.mouseClick(window.history.rename_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(r.name == "low concurrency" for r in window.history.runs), timeout=10_000)
    _select(window, [slow])
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("baseline cpu", True))
    qtbot.mouseClick(window.history.tag_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: next(r for r in window.history.runs if r.id == slow).tags == ["baseline", "cpu"],
                    timeout=10_000)
    window.history.filter.setText("baseline")  # tags are searchable
    assert [table.item(r, 0).text() for r in range(table.rowCount()) if not table.isRowHidden(r)] == [str(slow)]
    window.history.filter.setText("")

    _select(window, [slow])
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.No)
    qtbot.mouseClick(window.history.delete_button, Qt.MouseButton.LeftButton)
    qtbot.wait(300)
    assert len(window.history.runs) == 2  # "No" keeps it
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(window.history.delete_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: [r.id for r in window.history.runs] == [fast], timeout=10_000)


def test_compare_colours_deltas_against_the_chosen_baseline(qtbot, seeded) -> None:
    window, (fast, slow) = seeded
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: len(window.history.runs) == 2, timeout=10_000)
    _select(window, [fast, slow])
    qtbot.mouseClick(window.history.compare_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=10_000)
    assert window.tabs.currentWidget() is window.compare

    def verdicts() -> dict[str, str]:
        table = window.compare.metrics
        return {table.item(r, 0).data(Qt.ItemDataRole.UserRole): table.item(r, 2).data(Qt.ItemDataRole.UserRole)
                for r in range(table.rowCount())}

    comparison = window.compare.comparison
    assert comparison is not None and [r.id for r in comparison.runs][comparison.baseline] == fast
    v = verdicts()
    assert v["output_tok_per_s"] == "worse" and v["ttft_ms_p50"] == "worse"
    diff = {window.compare.diff.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in range(window.compare.diff.rowCount())}
    assert {"load.concurrency", "features.prefix_caching"} <= diff
    assert window.compare.series_choice.currentData() == "client.output_tok_per_s"
    assert len(window.compare.bars.ci.items) == 3  # throughput, TTFT and ITL bar charts

    # the other run as the baseline flips the verdicts
    window.compare.baseline.setCurrentIndex(1)
    window.compare.baseline.activated.emit(1)
    qtbot.waitUntil(lambda: window.compare.comparison is not None and window.compare.comparison.baseline == 1,
                    timeout=10_000)
    table = window.compare.metrics
    row = next(r for r in range(table.rowCount()) if table.item(r, 0).data(Qt.ItemDataRole.UserRole) == "output_tok_per_s")
    assert table.item(row, 0).text() == "Output throughput (tok/s)"  # the human name; the key is its data
    assert table.item(row, 1).data(Qt.ItemDataRole.UserRole) == "better"


@pytest.mark.parametrize("fmt", ["bash", "docker", "compose", "k8s", "json", "csv"])
def test_export_previews_every_format_and_copies(qtbot, seeded, fmt: str) -> None:
    window, (fast, _slow) = seeded
    dialog = window.open_export([fast])
    dialog.format.setCurrentIndex(dialog.format.findData(fmt))
    qtbot.waitUntil(lambda: dialog.fmt == fmt and bool(dialog.text) and dialog.copy_button.isEnabled(), timeout=10_000)
    expected = {"bash": "--enable-prefix-caching", "docker": "docker run", "compose": "services:",
                "k8s": "kind: Deployment", "json": '"tunebench-run"', "csv": "ttft_ms"}[fmt]
    assert expected in dialog.text
    assert dialog.preview.toPlainText().startswith(dialog.text.replace("\r\n", "\n")[:200])
    dialog.copy()
    from PySide6.QtGui import QGuiApplication
    assert QGuiApplication.clipboard().text() == dialog.text
    dialog.close()


def test_export_html_report_of_one_or_more_runs_and_saves(qtbot, seeded, tmp_path: Path) -> None:
    window, (fast, slow) = seeded
    single = window.open_export([fast])  # one run: the same report as `tunebench export RUN -f html`
    single.format.setCurrentIndex(single.format.findData("html"))
    qtbot.waitUntil(lambda: single.rendered_fmt == "html" and bool(single.text), timeout=20_000)
    assert "tunebench report:" in single.text and "demo c16" in single.text
    single.close()
    window.compare_runs([fast, slow])
    qtbot.waitUntil(lambda: window.compare.export_button.isEnabled(), timeout=10_000)
    qtbot.mouseClick(window.compare.export_button, Qt.MouseButton.LeftButton)
    dialog = next(d for d in window.findChildren(type(single)) if d.isVisible())
    assert dialog.fmt == "html"
    qtbot.waitUntil(lambda: bool(dialog.text), timeout=20_000)
    assert "<html" in dialog.text.lower() and "demo c2" in dialog.text
    target = tmp_path / "report.html"
    dialog.save_to(target)
    qtbot.waitUntil(lambda: target.exists() and "Saved" in dialog.message.text(), timeout=10_000)
    assert target.read_text(encoding="utf-8") == dialog.text
    dialog.close()


def test_compare_greys_a_starved_clients_figures_and_leads_with_the_engines(qtbot, make_window, tmp_path: Path) -> None:
    """The issue's demo in the Compare tab: the engine's TTFT (91.2 -> 19.7 ms) leads and is green;
    the starved client's TTFT p50 is grey with its reason, never red; the bars draw the engine's."""
    from tests.unit.test_compare_reliability import store_prefix_demo

    db = tmp_path / "demo.db"
    off, on = store_prefix_demo(db)
    window = make_window(db_path=db)
    window.compare_runs([off, on])
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=10_000)
    table = window.compare.metrics
    rows = {table.item(r, 0).data(Qt.ItemDataRole.UserRole): r for r in range(table.rowCount())}
    assert rows["engine_ttft_ms_mean"] < rows["ttft_ms_p50"]  # the reliable figure comes first
    engine = table.item(rows["engine_ttft_ms_mean"], 2)
    assert engine.data(Qt.ItemDataRole.UserRole) == "better" and "-78% better" in engine.text()
    assert table.item(rows["engine_ttft_ms_mean"], 0).text() == "TTFT mean (engine) (ms)"
    for key in ("ttft_ms_p50", "itl_ms_p50"):
        cell = table.item(rows[key], 2)
        assert cell.data(Qt.ItemDataRole.UserRole) == "unreliable" and cell.font().italic()
        assert cell.foreground().color().name() == "#5f6368"  # the theme's muted grey, not green or red
        assert "unreliable" in cell.toolTip() and ("starved" in cell.toolTip() or "bunched" in cell.toolTip())
    titles = [item.titleLabel.text for item in window.compare.bars.ci.items]
    assert titles == ["Output throughput (tok/s)", "TTFT mean (engine) (ms)", "ITL mean (engine) (ms)"]


def test_repeats_box_beside_start_runs_a_set(qtbot, make_window, tmp_path: Path, monkeypatch) -> None:
    import app.gui.run_control as mw

    seen: dict[str, object] = {}

    def fake_run_work(session, config, bus, cancel, *, keep_engine, db_path, repeats, cluster=None,  # type: ignore[no-untyped-def]
                      follow=None):
        seen["repeats"], seen["cluster"] = repeats, cluster

        def work():  # type: ignore[no-untyped-def]
            raise RuntimeError("not run in this test")
        return work

    monkeypatch.setattr(mw, "run_work", fake_run_work)
    window = make_window(db_path=tmp_path / "r.db")
    assert window.repeats.minimum() == 1 and window.repeats.value() == 1
    window.repeats.setValue(3)
    qtbot.waitUntil(lambda: window.start_button.isEnabled(), timeout=30_000)
    window.start_run()
    assert seen["repeats"] == 3 and seen["cluster"] is None  # no address in the Cluster box: this machine
    qtbot.waitUntil(lambda: not window.running, timeout=30_000)
