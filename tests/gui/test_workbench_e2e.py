"""The workbench on the real vLLM CPU engine, driven like a user: choose the demo profile,
toggle prefix caching, start a run, watch series and tiles, stop it, run again on the same warm
engine, find both runs in history, compare them, export a launch script, and close the window in
the middle of a third run.

One engine start for the whole test (the "keep engine running" switch), a few dozen short
requests; closing the window must stop the engine (the fixture fails otherwise).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QCheckBox, QMessageBox

from app.cost import default_prices, run_deployment, usd_text
from app.gui.main_window import MainWindow
from tests.conftest import engine_available
from tests.gui.conftest import close_window
from tests.gui.editors import set_spin

pytestmark = [pytest.mark.e2e, pytest.mark.gui]

ENGINE_START_MS = 300_000
UNREACHED_REQUESTS = 20_000
"""Prompts are built in memory before the load starts: about 6 s for this many here."""


def test_workbench_on_the_real_engine(qtbot, make_window: Callable[..., MainWindow], monkeypatch) -> None:
    if not engine_available():
        pytest.fail("vLLM CPU runtime or demo model missing: run `make engine`")
    window = make_window("qwen3-27b-fp8-h100")

    # choose the demo profile in the picker
    picker = window.profile_picker
    index = picker.findText("cpu-demo (shipped)")
    assert index > 0
    picker.setCurrentIndex(index)
    picker.activated.emit(index)
    qtbot.waitUntil(lambda: window.state.config.name == "CPU demo", timeout=10_000)

    # toggle prefix caching (the demo profile turns it on) and keep the run short
    prefix = window.config_panel.editor("features.prefix_caching").widget
    assert isinstance(prefix, QCheckBox)
    qtbot.mouseClick(prefix, Qt.MouseButton.LeftButton, pos=QPoint(8, prefix.height() // 2))
    assert window.state.config.features.prefix_caching is False
    # far more than it reaches before Stop even on a fast machine (3,000 once finished first on CI)
    set_spin(window, "workload.num_requests", UNREACHED_REQUESTS)
    set_spin(window, "workload.output_len.mean", 32)
    set_spin(window, "load.concurrency", 4)
    window.keep_engine.setChecked(True)
    qtbot.waitUntil(lambda: window.config_panel.summary.text().startswith("Configuration OK"), timeout=30_000)

    # start: phases, then series and tiles
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    assert window.running and window.stop_button.isEnabled()
    qtbot.waitUntil(lambda: window.phase_bar.phase == "ready", timeout=ENGINE_START_MS)
    assert any("Application startup complete" in line for line in window.log_view.lines)
    qtbot.waitUntil(window.checks_label.isVisible, timeout=10_000)
    # verified by effect: the probe's repeated prompt found nothing cached (an echo alone is "accepted")
    assert "Prefix caching = False: active (verified)" in window.checks_label.text()
    tiles = window.dashboard.tiles.tiles
    qtbot.waitUntil(lambda: tiles["done"].text() not in ("–", "0"), timeout=60_000)
    qtbot.waitUntil(lambda: tiles["tok_s"].text() not in ("–", "0"), timeout=30_000)
    tokens = window.dashboard.plots.panels["tokens"]
    qtbot.waitUntil(lambda: ("engine", "generation_tok_per_s") in tokens.curves
                    and len(tokens.curves[("client", "output_tok_per_s")][0].getData()[0]) >= 3, timeout=30_000)
    cpu = window.dashboard.plots.panels.get("cpu") or window.dashboard.plots.panels["gpu_util"]
    qtbot.waitUntil(lambda: bool(cpu.curves), timeout=30_000)
    done_seen = int(tiles["done"].text().replace(",", ""))
    qtbot.waitUntil(lambda: int(tiles["done"].text().replace(",", "") or 0) > done_seen, timeout=30_000)

    # stop: the run ends cancelled, the engine stays warm
    qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running, timeout=60_000)
    assert window.last_result is not None and window.last_result.status == "cancelled"
    engine = window.session.engine
    assert engine is not None and engine.is_running()

    # a second, complete run on the same engine
    set_spin(window, "workload.num_requests", 12)
    qtbot.waitUntil(lambda: window.config_panel.summary.text().startswith("Configuration OK"), timeout=30_000)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running, timeout=120_000)
    assert window.last_result is not None and window.last_result.status == "completed", window.banner.text()
    assert window.session.engine is engine  # reused, not restarted
    assert "Run completed" in window.banner.text()
    notes = [line for line in window.log_view.lines if line.startswith("tunebench: level")]
    assert any("client tokens" in n and ": equal" in n for n in notes), notes  # the engine's counter agrees
    assert any("tokens per step" in n for n in notes), notes

    # history: both runs are there
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: len(window.history.runs) == 2, timeout=20_000)
    statuses = sorted(r.status for r in window.history.runs)
    assert statuses == ["cancelled", "completed"]
    completed = next(r for r in window.history.runs if r.status == "completed")
    assert completed.metrics.get("output_tok_per_s", 0) > 0
    # the cost tile: the stored run's cores x the default per-core-hour price over its output tokens per hour
    cost_tile = window.dashboard.tiles.cost_tile
    qtbot.waitUntil(lambda: cost_tile.text().startswith("$"), timeout=20_000)
    deployment = run_deployment(window.with_store(lambda store: store.get_run(completed.id)))
    core_hour_usd = default_prices().cpu_core_hour_usd
    assert core_hour_usd is not None and deployment.kind == "cpu"
    expected = deployment.units_measured * core_hour_usd / (completed.metrics["output_tok_per_s"] * 3600) * 1e6
    assert cost_tile.text() == usd_text(expected), (cost_tile.text(), expected)
    assert "$/core-h (default price, as of" in cost_tile.sub.text()
    assert window.presentation.tiles.cost_tile.text() == cost_tile.text()
    window.history.filter.setText("")  # the second run is named after what changed, not "CPU demo"
    window.history.table.selectAll()
    assert sorted(window.history.selected_ids()) == sorted(r.id for r in window.history.runs)

    # compare the two runs
    qtbot.mouseClick(window.history.compare_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=30_000)
    comparison = window.compare.comparison
    assert comparison is not None and len(comparison.runs) == 2
    # it compares what was run and measured: the two runs of History, the setting that differs
    # with each run's value, and each run's own stored figures with the deltas between them
    by_id = {r.id: r for r in window.history.runs}
    columns = [r.id for r in comparison.runs]
    assert sorted(columns) == sorted(by_id)
    diff = {key: values for key, values in comparison.config_diff}
    wanted = {by_id[i].status: n for i, n in zip(columns, diff["workload.num_requests"], strict=True)}
    assert wanted == {"cancelled": UNREACHED_REQUESTS, "completed": 12}, diff
    diff_keys = [window.compare.diff.item(r, 0).data(Qt.ItemDataRole.UserRole)
                 for r in range(window.compare.diff.rowCount())]
    assert "workload.num_requests" in diff_keys  # and the table shows it
    figures = {m.name: m for m in comparison.metrics}
    for name in ("requests_total", "output_tok_per_s"):
        values = figures[name].values
        assert values == [by_id[i].metrics.get(name) for i in columns], (name, values)
    completed_col = columns.index(completed.id)
    assert figures["requests_total"].values[completed_col] == 12
    base = comparison.baseline
    tok = figures["output_tok_per_s"]
    for col, value in enumerate(tok.values):
        assert value is not None and value > 0
        assert tok.delta_pct[col] == pytest.approx(100.0 * (value - tok.values[base]) / tok.values[base])
    assert window.compare.metrics.rowCount() > 3
    assert window.compare.series_choice.count() > 0

    # export a launch script of the completed run
    dialog = window.open_export([completed.id])
    qtbot.waitUntil(lambda: bool(dialog.text), timeout=20_000)
    assert dialog.fmt == "bash"
    assert "--no-enable-prefix-caching" in dialog.text and "VLLM_API_KEY" in dialog.text
    assert dialog.copy_button.isEnabled()
    dialog.copy()
    from PySide6.QtGui import QGuiApplication
    assert QGuiApplication.clipboard().text() == dialog.text
    dialog.close()

    # close the window in the middle of a third run: it asks, then stops the run and the engine
    set_spin(window, "workload.num_requests", UNREACHED_REQUESTS)
    qtbot.waitUntil(lambda: window.config_panel.summary.text().startswith("Configuration OK"), timeout=30_000)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: tiles["done"].text() not in ("–", "0"), timeout=60_000)
    asked: list[str] = []
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *a, **k: (asked.append(a[1]), QMessageBox.StandardButton.Yes)[1])
    close_window(qtbot, window, timeout_ms=120_000)
    assert asked == ["Stop the run?"]
    assert window.last_result is not None and window.last_result.status == "cancelled"
    assert not engine.is_running()
    # the fixture then fails the test if a QThread, child process or registered engine is left
