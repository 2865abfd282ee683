"""The workbench driven like a user, without an engine: configuration, profiles, validation,
live dashboard from bus events, log, presentation mode, closing, and errors as messages."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QGroupBox, QMessageBox, QSpinBox

from app.bus import Bus
from app.config import RunConfig
from app.events import EngineReady, LogLine, PhaseChanged, Progress, TelemetrySupport
from app.gui.main_window import MainWindow
from app.gui.workers import Worker, busy_workers, run_in_worker
from app.profiles import load_profile
from app.runner import RunResult
from engine_adapters.base import FeatureCheck
from engine_adapters.launcher import registered_engines
from tests.gui.conftest import close_window, leftovers, live_children

pytestmark = pytest.mark.gui


def test_profile_edit_save_and_reopen_round_trips(qtbot, window: MainWindow, tmp_path: Path) -> None:
    panel = window.config_panel
    prefix = panel.editor("features.prefix_caching").widget
    assert isinstance(prefix, QCheckBox) and prefix.checkState() == Qt.CheckState.Checked  # cpu-demo turns it on
    qtbot.mouseClick(prefix, Qt.MouseButton.LeftButton, pos=QPoint(8, prefix.height() // 2))  # on the box
    assert window.state.config.features.prefix_caching is False
    spin = panel.editor("load.concurrency").widget
    assert isinstance(spin, QSpinBox)
    spin.setValue(3)
    combo = panel.editor("features.speculative.method").widget
    assert isinstance(combo, QComboBox)
    combo.setCurrentIndex(combo.findData("ngram"))
    combo.activated.emit(combo.currentIndex())
    assert window.state.config.load.concurrency == 3
    assert window.state.config.features.speculative.method == "ngram"

    target = tmp_path / "mine.toml"
    window.save_profile_to(target)
    qtbot.waitUntil(lambda: target.exists() and window.profile_path == target, timeout=10_000)
    saved = window.state.config
    assert load_profile(target) == saved

    window.open_profile(Path(str(window.profile_picker.itemData(window.profile_picker.findText("cpu-demo (shipped)")))))
    qtbot.waitUntil(lambda: window.state.config.features.prefix_caching is True, timeout=10_000)
    assert window.state.config.load.concurrency == 8
    window.open_profile(target)
    qtbot.waitUntil(lambda: window.state.config == saved, timeout=10_000)
    assert isinstance(prefix, QCheckBox) and prefix.checkState() == Qt.CheckState.Unchecked
    assert spin.value() == 3
    assert window.profile_picker.findData(str(target)) >= 0  # now a recent profile


def test_a_broken_profile_is_one_line_message_and_keeps_the_config(qtbot, window: MainWindow, tmp_path: Path) -> None:
    before = window.state.config
    bad = tmp_path / "bad.toml"
    bad.write_text("[features]\nprefix_caching = 'yes please'\n")
    window.open_profile(bad)
    qtbot.waitUntil(window.banner.isVisible, timeout=10_000)
    text = window.banner.text()
    assert "bad.toml" in text and "prefix_caching" in text
    assert "Traceback" not in text and "\n" not in text
    assert window.state.config == before


def test_validation_messages_appear_inline_and_block_start(qtbot, window: MainWindow) -> None:
    panel = window.config_panel
    combo = panel.editor("features.speculative.method").widget
    assert isinstance(combo, QComboBox)
    combo.setCurrentIndex(combo.findData("eagle"))
    combo.activated.emit(combo.currentIndex())
    draft = panel.editor("features.speculative.draft_model")
    qtbot.waitUntil(lambda: "draft model" in draft.message_text, timeout=10_000)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    assert not window.running
    assert "Cannot start" in window.banner.text()

    # A value pydantic rejects is explained under its editor and not applied.
    lo = panel.editor("features.speculative.ngram_prompt_lookup_min").widget
    assert isinstance(lo, QSpinBox)
    lo.setValue(9)
    assert "must not exceed" in panel.editor("features.speculative.ngram_prompt_lookup_min").message_text
    assert window.state.config.features.speculative.ngram_prompt_lookup_min == 1


def test_features_this_machine_cannot_run_are_disabled_with_the_reason(window: MainWindow) -> None:
    assert window.hardware is not None
    editor = window.config_panel.editor("features.cuda_graphs")
    if window.hardware.has_gpu:
        assert editor.widget.isEnabled()
    else:
        assert not editor.widget.isEnabled()
        assert "NVIDIA GPU" in editor.message_text and "NVIDIA GPU" in editor.widget.toolTip()
    prefix = window.config_panel.editor("features.prefix_caching")
    assert prefix.widget.isEnabled()
    assert "prefill" in prefix.widget.toolTip()  # the catalogue's explanation is the tooltip
    titles = {box.title() for box in window.config_panel.findChildren(QGroupBox)}
    assert {"Move fewer bytes", "Use idle compute", "Manage the KV cache"} <= titles


def _feed(bus: Bus, seconds: int, rate_hz: int = 10) -> None:
    t0 = time.monotonic()
    for i in range(seconds * rate_hz):
        t = t0 + i / rate_hz
        bus.emit(Progress(run_id="r", level=0, requests_done=i, errors=0, requests_in_flight=4, output_tokens=64 * i,
                          elapsed_s=i / rate_hz, output_tok_per_s=100.0 + i, ttft_ms_p50=50.0, itl_ms_p50=2.5),
                 (t, time.time()))
        bus.sample("engine", {"kv_cache_usage_pct": 10.0, "requests_running": 4.0, "requests_waiting": 1.0,
                              "generation_tok_per_s": 120.0 + i}, (t, time.time()))
        bus.sample("host", {"cpu_pct": 50.0, "memory_used_bytes": 4 * 2.0**30, "engine_rss_bytes": 2.0**30,
                            "engine_cpu_pct": 80.0}, (t, time.time()))


def test_dashboard_plots_and_tiles_follow_the_bus(qtbot, window: MainWindow) -> None:
    window.bus.emit(TelemetrySupport(source="gpu", available=False, state="no NVIDIA GPU"))
    _feed(window.bus, seconds=3)
    window.bus.emit(LogLine(line="INFO loading"))
    window.bus.emit(LogLine(line="ERROR something broke: ValueError: bad"))
    window.bus.emit(PhaseChanged(phase="loading weights", detail="Loading safetensors"))
    tokens = window.dashboard.plots.panels["tokens"]
    qtbot.waitUntil(lambda: len(tokens.curves) == 2, timeout=5000)
    curve = tokens.curves[("client", "output_tok_per_s")][0]
    x, y = curve.getData()
    assert len(x) == 30 and y[-1] == pytest.approx(129.0)
    assert window.dashboard.tiles.tiles["tok_s"].text() == "129"
    assert window.dashboard.tiles.tiles["done"].text() == "29"
    assert "No NVIDIA GPU" in window.dashboard.banner.text()
    assert set(window.dashboard.plots.panels) == {"host_memory", "cpu", "tokens", "kv", "requests", "latency", "itl"}
    mem = window.dashboard.plots.panels["host_memory"].curves[("host", "memory_used_bytes")][0]
    assert mem.getData()[1][-1] == pytest.approx(4.0)  # shown in GiB
    assert window.phase_bar.bar.value() == 20 and "loading weights" in window.phase_bar.label.text()
    # the log: errors highlighted, filter and errors-only
    html = window.log_view.text.document().toHtml()
    assert "#d93025" in html
    window.log_view.errors_only.setChecked(True)
    assert window.log_view.visible_lines() == ["ERROR something broke: ValueError: bad"]
    window.log_view.errors_only.setChecked(False)
    window.log_view.filter.setText("loading")
    assert window.log_view.visible_lines() == ["INFO loading"]

    # the engine's own confirmation of each requested feature
    window.bus.emit(EngineReady(run_id="r", base_url="http://127.0.0.1:1", startup_s=40.0, feature_checks=[
        FeatureCheck("prefix_caching", "True", "verified", "prefix-cache hits"),
        FeatureCheck("max_num_seqs", "8", "not active", "engine parsed max_num_seqs=None")]))
    qtbot.waitUntil(window.checks_label.isVisible, timeout=5000)
    text = window.checks_label.text()
    assert "Prefix caching = True: active (verified)" in text and "Max concurrent sequences = 8: NOT ACTIVE" in text

    # a GPU appearing switches the layout to GPU plots
    window.bus.sample("gpu0", {"memory_used_bytes": 2.0**33, "gpu_util_pct": 90.0, "dram_bw_bytes_per_s": 3e12})
    qtbot.waitUntil(lambda: "gpu_memory" in window.dashboard.plots.panels, timeout=5000)
    qtbot.waitUntil(lambda: bool(window.dashboard.plots.panels["gpu_memory"].curves), timeout=5000)
    assert window.dashboard.banner.text() == ""


def test_zooming_a_plot_stops_following_until_the_auto_button(qtbot, window: MainWindow) -> None:
    _feed(window.bus, seconds=2)
    panel = window.dashboard.plots.panels["tokens"]
    qtbot.waitUntil(lambda: bool(panel.curves), timeout=5000)
    view = panel.getPlotItem().getViewBox()
    view.sigRangeChangedManually.emit([True, True])
    assert not panel.follow
    _feed(window.bus, seconds=1)

    def points() -> int:
        x, _ = panel.curves[("client", "output_tok_per_s")][0].getData()
        return 0 if x is None else len(x)

    qtbot.waitUntil(lambda: points() == 30, timeout=5000)
    assert points() == 30 and not panel.follow  # full resolution once the user takes over
    button = panel.getPlotItem().autoBtn
    button.clicked.emit(button)
    assert panel.follow


def test_presentation_mode_toggles_with_f11_and_ctrl_p(qtbot, window: MainWindow) -> None:
    _feed(window.bus, seconds=1)
    qtbot.keyClick(window, Qt.Key.Key_F11)
    assert window.presenting and window.isFullScreen()
    assert not window.toolbar.isVisible()
    qtbot.waitUntil(lambda: window.presentation.tiles.tiles["tok_s"].text() == "109", timeout=5000)
    assert set(window.presentation.plots.panels) == {"tokens", "latency", "itl"}
    big = window.presentation.tiles.tiles["tok_s"].value_label.font().pointSize()
    desk = window.dashboard.tiles.tiles["tok_s"].value_label.font().pointSize()
    assert big >= 2 * desk
    qtbot.keyClick(window, Qt.Key.Key_P, Qt.KeyboardModifier.ControlModifier)
    assert not window.presenting and not window.isFullScreen()
    assert window.toolbar.isVisible()


def _blocking_run(started: threading.Event):  # type: ignore[no-untyped-def]
    """Stands in for EngineSession.run: blocks until cancelled, like a run waiting on an engine."""
    def run(config: RunConfig, bus: Bus, cancel: threading.Event, *, keep_engine: bool,
            db_path: str | None = None) -> RunResult:
        started.set()
        cancel.wait(30)
        return RunResult(run_id="x", name=config.name, config=config, status="cancelled", reason="cancelled by user",
                         started_wall_s=time.time())
    return run


def test_closing_during_a_run_asks_and_no_keeps_it_running(qtbot, window: MainWindow, monkeypatch) -> None:
    started = threading.Event()
    monkeypatch.setattr(window.session, "run", _blocking_run(started))
    asked: list[str] = []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: (asked.append(a[1]), QMessageBox.StandardButton.No)[1])
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(started.is_set, timeout=5000)
    window.close()
    assert asked == ["Stop the run?"]
    assert window.isVisible() and window.running
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    close_window(qtbot, window, timeout_ms=20_000)
    assert window.last_result is not None and window.last_result.status == "cancelled"


def test_errors_in_workers_reach_the_user_as_one_line(qtbot, window: MainWindow, monkeypatch) -> None:
    def explode(*_a: object, **_k: object) -> RunResult:
        raise KeyError("no such thing")
    monkeypatch.setattr(window.session, "run", explode)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running and window.banner.isVisible(), timeout=5000)
    assert window.banner.text() == "Run failed: KeyError: 'no such thing'"
    assert window.start_button.isEnabled()


def test_a_failed_start_shows_the_diagnosis_in_plain_words(qtbot, window: MainWindow, monkeypatch) -> None:
    reason = "This CPU cannot keep the KV cache in FP8: set KV-cache precision to 'auto'."

    def failed(config: RunConfig, bus: Bus, cancel: threading.Event, **_k: object) -> RunResult:
        bus.emit(PhaseChanged(phase="failed", detail=reason))
        bus.emit(LogLine(line="NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."))
        return RunResult(run_id="x", name=config.name, config=config, status="failed", reason=reason,
                         started_wall_s=time.time())

    monkeypatch.setattr(window.session, "run", failed)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running and window.log_view.diagnosis.isVisible(), timeout=5000)
    assert window.log_view.diagnosis.text() == f"Why it failed: {reason}"
    assert window.banner.text() == f"Run failed: {reason}"
    window.log_view.errors_only.setChecked(True)
    assert window.log_view.visible_lines() == ["NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."]


def test_the_leak_check_sees_a_running_worker_thread_and_child_process(qtbot) -> None:
    import subprocess
    import sys
    children, engines = live_children(), {r.pid for r in registered_engines()}  # shared e2e engines may run
    threads = set(threading.enumerate())
    gate = threading.Event()
    worker = run_in_worker(lambda: gate.wait(10), name="sleeper")
    qtbot.waitUntil(worker.isRunning, timeout=2000)
    helper = threading.Thread(target=gate.wait, args=(10,), name="forgotten-helper")
    helper.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        problems = leftovers(children, engines, threads)
        assert any("sleeper" in p for p in problems)
        assert any("forgotten-helper" in p for p in problems)
        assert any(str(child.pid) in p for p in problems)
    finally:
        child.kill()
        child.wait()
        gate.set()
        helper.join()
        qtbot.waitUntil(lambda: not busy_workers(), timeout=5000)
    assert not leftovers(children, engines, threads)
    assert not Worker.live or all(not w.isRunning() for w in Worker.live)


def test_ring_buffers_keep_an_hour_at_ten_hz(window: MainWindow) -> None:
    """The window's own history, fed more than an hour at 10 Hz: it holds the newest hour, in
    order, in the arrays it started with, and they are what they cost (measured, not computed)."""
    from app.bus import Sample

    store = window.series
    n = 36_000 + 500
    samples = [Sample("engine", 1000.0 + i / 10, 0.0, {"generation_tok_per_s": float(i)}) for i in range(n)]
    store.ingest(samples[:10])
    ring = store.series[("engine", "generation_tok_per_s")]
    arrays = (ring._t, ring._v)
    store.ingest(samples[10:])
    t, v = ring.view()
    assert len(t) == 36_000 and v[0] == n - 36_000 and v[-1] == n - 1  # the newest hour, oldest dropped
    assert t[-1] - t[0] == pytest.approx(3599.9) and bool(np.all(np.diff(t) > 0))
    assert ring._t is arrays[0] and ring._v is arrays[1]  # preallocated: nothing grew or was copied
    assert ring._t.nbytes + ring._v.nbytes < 2_000_000  # per series


def test_model_can_be_typed_browsed_and_is_remembered(qtbot, window: MainWindow, tmp_path: Path, monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog
    editor = window.config_panel.editor("engine.model")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    qtbot.mouseClick(editor.browse, Qt.MouseButton.LeftButton)
    assert window.state.config.engine.model == str(tmp_path)
    missing = tmp_path / "nope"
    editor.set_value(str(missing))
    editor._emit()
    qtbot.waitUntil(lambda: "model path not found" in editor.message_text, timeout=10_000)
    editor.set_value("   ")
    editor._emit()
    assert "at least 1 character" in editor.message_text and window.state.config.engine.model == str(missing)
    window.files.remember("recent_models", "Qwen/Qwen3-8B")
    combo = editor.widget
    assert isinstance(combo, QComboBox) and combo.findText("Qwen/Qwen3-8B") >= 0


def test_load_settings_follow_the_pattern(qtbot, window: MainWindow) -> None:
    panel = window.config_panel
    panel.tabs.setCurrentIndex(1)  # "Workload and load"
    form, container = panel._rows["load.levels"]
    pattern = panel.editor("load.pattern").widget
    assert isinstance(pattern, QComboBox)
    assert not container.isVisibleTo(panel) and panel._rows["load.concurrency"][1].isVisibleTo(panel)
    pattern.setCurrentIndex(pattern.findData("sweep"))
    pattern.activated.emit(pattern.currentIndex())
    # a sweep needs levels: the choice is kept as a draft, explained, and blocks Start and Save
    assert container.isVisibleTo(panel)
    assert "needs levels" in panel.editor("load.pattern").message_text
    assert window.state.config.load.pattern == "closed"
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    assert not window.running and "needs levels" in window.banner.text()
    levels = panel.editor("load.levels")
    levels.widget.setText("1, 4 16")  # type: ignore[attr-defined]
    levels.widget.editingFinished.emit()  # type: ignore[attr-defined]
    assert window.state.config.load.levels == [1.0, 4.0, 16.0]
    assert window.state.config.load.pattern == "sweep"
    assert panel.editor("load.pattern").message_text == "" and panel.problems() == []
    levels.widget.setText("1, many")  # type: ignore[attr-defined]
    levels.widget.editingFinished.emit()  # type: ignore[attr-defined]
    assert "cannot read" in levels.message_text and window.state.config.load.levels == [1.0, 4.0, 16.0]
    # the summary never says "OK" while a field shows a value that is not in use
    summary = panel.summary.text()
    assert not summary.startswith("Configuration OK") and "error(s)" in summary, summary
    assert "not applied, the last valid value is in use: " in summary and "Workload and load" in summary, summary
    levels.widget.setText("1, 4, 16")  # type: ignore[attr-defined]
    levels.widget.editingFinished.emit()  # type: ignore[attr-defined]
    assert levels.message_text == "" and "not applied" not in panel.summary.text()
    pattern.setCurrentIndex(pattern.findData("poisson"))
    pattern.activated.emit(pattern.currentIndex())
    assert panel._rows["load.rate_rps"][1].isVisibleTo(panel) and not container.isVisibleTo(panel)


def test_every_workload_and_load_setting_has_an_editor(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    """What a profile can set, the window can set: length shapes (the spread shows with a shape
    that has one), the error budget, client processes."""
    from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox

    from app.workload import LengthSpec, LoadConfig, WorkloadConfig

    panel = window.config_panel
    panel.tabs.setCurrentIndex(1)  # "Workload and load"
    panel.show_advanced()  # length shapes, error budget and client processes are "More settings"
    not_in_the_form = {"workload.model_name", "workload.tokenizer", "workload.input_len", "workload.output_len",
                       "load.continuous_usage"}  # advanced: profiles and the CLI set them
    paths = [f"workload.{n}" for n in WorkloadConfig.model_fields] + [f"load.{n}" for n in LoadConfig.model_fields]
    paths += [f"workload.{side}.{n}" for side in ("input_len", "output_len") for n in ("distribution", "mean", "spread")]
    missing = [p for p in paths if p not in not_in_the_form and p not in panel._rows]
    assert missing == [], missing
    assert {"minimum", "maximum"} <= set(LengthSpec.model_fields)  # clipping stays a profile setting

    shape = panel.editor("workload.output_len.distribution").widget
    assert isinstance(shape, QComboBox)
    spread_row = panel._rows["workload.output_len.spread"][1]
    assert not spread_row.isVisibleTo(panel)  # "fixed" has no spread
    shape.setCurrentIndex(shape.findData("uniform"))
    shape.activated.emit(shape.currentIndex())
    assert spread_row.isVisibleTo(panel)
    spread = panel.editor("workload.output_len.spread").widget
    assert isinstance(spread, QSpinBox)
    spread.setValue(16)
    assert window.state.config.workload.output_len.model_dump()["distribution"] == "uniform"
    assert window.state.config.workload.output_len.spread == 16
    budget = panel.editor("load.max_error_fraction").widget
    assert isinstance(budget, QDoubleSpinBox)
    budget.setValue(0.1)
    workers = panel.editor("load.workers").widget
    assert isinstance(workers, QSpinBox)
    workers.setValue(2)
    assert (window.state.config.load.max_error_fraction, window.state.config.load.workers) == (0.1, 2)
