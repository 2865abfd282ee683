"""The screens a customer sees, without an engine: two-state switches that say what
the engine's default is, greyed features that claim nothing, settings that do not apply hidden,
messages in the field's words by the field, progress that does not lie, tiles that show the
run's summary (and never a client figure the run flagged), fixed series colours, presentation
mode on a projector, and Compare's headline."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QSpinBox

from app.bus import Bus
from app.config import RunConfig
from app.events import EngineReady, LevelFinished, LevelStarted, LogLine, PhaseChanged, Progress
from app.gui.dashboard import Dashboard
from app.gui.main_window import MainWindow
from app.load.aggregate import summarize
from app.load.metrics import EngineDeltas, RequestRecord
from app.runner import LevelResult, RunResult
from engine_adapters.config import Features

pytestmark = pytest.mark.gui


def _click(qtbot, box: QCheckBox) -> None:  # type: ignore[no-untyped-def]
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))


def test_a_switch_the_engine_decides_is_two_state_and_says_what_the_default_is(qtbot, window: MainWindow) -> None:
    window.state.replace(window.state.config.model_copy(update={"features": Features()}))
    editor = window.config_panel.editor("features.prefix_caching")
    box = editor.widget
    assert isinstance(box, QCheckBox) and not box.isTristate()
    assert box.isChecked() and box.text() == "on (engine default)"  # vLLM turns it on by itself
    assert window.state.config.features.prefix_caching is None
    _click(qtbot, box)
    assert window.state.config.features.prefix_caching is False and box.text() == "off"
    _click(qtbot, box)
    assert window.state.config.features.prefix_caching is True and box.text() == "on"  # never a third state
    assert editor.reset_button is not None and editor.reset_button.isVisibleTo(window)
    qtbot.mouseClick(editor.reset_button, Qt.MouseButton.LeftButton)
    assert window.state.config.features.prefix_caching is None and box.text() == "on (engine default)"


def test_greyed_features_claim_nothing_and_settings_that_do_not_apply_are_hidden(window: MainWindow) -> None:
    panel = window.config_panel
    assert window.hardware is not None
    if not window.hardware.has_gpu:
        cuda = panel.editor("features.cuda_graphs").widget
        assert isinstance(cuda, QCheckBox) and not cuda.isEnabled()
        assert not cuda.isChecked() and "on" not in cuda.text().split()  # greyed, it does not say "on"
    speculative = ("features.speculative.num_speculative_tokens", "features.speculative.draft_model",
                   "features.speculative.ngram_prompt_lookup_max", "features.speculative.ngram_prompt_lookup_min")
    form, _ = panel._rows[speculative[0]]
    assert not any(form.isRowVisible(panel._rows[p][1]) for p in speculative)  # speculation is off
    method = panel.editor("features.speculative.method").widget
    assert isinstance(method, QComboBox)
    method.setCurrentIndex(method.findData("ngram"))
    method.activated.emit(method.currentIndex())
    visible = {p for p in speculative if form.isRowVisible(panel._rows[p][1])}
    assert visible == {speculative[0], speculative[2], speculative[3]}  # ngram needs no draft model
    # client-side limits are not an engine's business
    panel.show_advanced()
    for path in ("load.duration_s", "load.max_requests"):
        spin = panel.editor(path).widget
        assert spin.specialValueText() in ("no limit", "all of them")  # type: ignore[attr-defined]
    assert panel.tabs.count() == 3 and [panel._group_of[p].tab for p in ("workload.kind", "load.pattern")] == [1, 1]
    labels = {form.labelForField(panel._rows[p][1]).text() for p in ("workload.api", "workload.num_requests")  # type: ignore[union-attr]
              for form in [panel._rows[p][0]]}
    assert labels == {"API", "Requests"}


def test_a_trace_workload_shows_its_settings_and_hides_the_generated_lengths(window: MainWindow) -> None:
    """A trace gives every request's lengths and times: its file, format, window and speedup show,
    the generated prompts' lengths do not; and a trace set in the form is the profile's."""
    panel = window.config_panel
    panel.tabs.setCurrentIndex(1)
    panel.show_advanced()
    trace_rows = ("workload.dataset_path", "workload.trace_format", "workload.trace_start_s", "workload.trace_end_s",
                  "workload.trace_block_tokens")
    lengths = ("workload.input_len.mean", "workload.output_len.mean", "workload.input_len.distribution")

    def shown(path: str) -> bool:
        form, _ = panel._rows[path]
        return form.isRowVisible(panel._rows[path][1])

    assert not any(shown(p) for p in trace_rows) and all(shown(p) for p in lengths)
    sample = str(Path(__file__).resolve().parent.parent.parent / "assets" / "traces" / "mooncake-sample.jsonl")
    panel.editor("workload.dataset_path").widget.setText(sample)  # type: ignore[attr-defined]
    for path, value in (("workload.kind", "trace"), ("load.pattern", "trace")):
        combo = panel.editor(path).widget
        assert isinstance(combo, QComboBox)
        combo.setCurrentIndex(combo.findData(value))
        combo.activated.emit(combo.currentIndex())
    panel.editor("workload.dataset_path").widget.editingFinished.emit()  # type: ignore[attr-defined]
    assert all(shown(p) for p in trace_rows) and not any(shown(p) for p in lengths)
    assert shown("load.speedup") and shown("load.max_concurrency") and not shown("load.concurrency")
    config = window.state.config
    assert (config.workload.kind, config.load.pattern, config.workload.dataset_path) == ("trace", "trace", sample)


def test_bad_values_are_explained_by_their_field_in_its_words(qtbot, window: MainWindow) -> None:
    panel = window.config_panel
    panel.tabs.setCurrentIndex(1)
    concurrency = panel.editor("load.concurrency")
    spin = concurrency.widget
    assert isinstance(spin, QSpinBox)
    spin.setValue(0)  # the box takes it (it would silently revert otherwise) and says why it is refused
    assert concurrency.message_text == "must be at least 1"
    assert window.state.config.load.concurrency == 8
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    assert not window.running and "Concurrency: must be at least 1" in window.banner.text()
    spin.setValue(100_000)
    qtbot.waitUntil(lambda: "100,000" in concurrency.message_text, timeout=10_000)
    assert not panel.summary.text().startswith("Configuration OK")
    assert "Workload and load" in panel.tabs.tabText(1) and panel.tabs.tabText(1) != "Workload and load"
    spin.setValue(8)
    pattern = panel.editor("load.pattern").widget
    assert isinstance(pattern, QComboBox)
    pattern.setCurrentIndex(pattern.findData("poisson"))
    pattern.activated.emit(pattern.currentIndex())
    message = panel.editor("load.pattern").message_text
    assert "Rate (req/s)" in message and "rate_rps" not in message


def test_a_gpu_profile_on_a_machine_without_one_is_flagged_field_by_field(qtbot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window("qwen3-27b-fp8-h100")
    assert window.hardware is not None
    if window.hardware.has_gpu:
        pytest.skip("this machine has a GPU")
    panel = window.config_panel
    qtbot.waitUntil(lambda: "GPU" in panel.editor("features.weights_dtype").message_text, timeout=30_000)
    for path in ("features.kv_cache_dtype", "features.speculative.method"):
        assert panel.editor(path).message_text, path
    assert "GPU" in panel.editor("engine.runtime.kind").message_text  # the runtime's own error, by its field
    assert "\u26a0" in panel.tabs.tabText(2)  # the tab holding it says so


def test_a_new_profile_clears_the_last_runs_graphs(qtbot, window: MainWindow) -> None:
    window.bus.sample("engine", {"generation_tok_per_s": 100.0})
    qtbot.waitUntil(lambda: window.dashboard.page == Dashboard.PLOTS and bool(window.series.series), timeout=5000)
    picker = window.profile_picker
    window.open_profile(Path(str(picker.itemData(picker.findText("qwen3-27b-fp8-h100 (shipped)")))))
    qtbot.waitUntil(lambda: window.state.config.engine.model != "tunebench:demo", timeout=10_000)
    assert window.dashboard.page == Dashboard.IDLE and not window.series.series
    assert all(tile.text() == "\u2013" for tile in window.dashboard.tiles.tiles.values())


def _starved_summary() -> tuple[LevelResult, list[RequestRecord]]:
    records = [RequestRecord(level=0, index=i, scheduled_s=0.1 * i, start_s=0.1 * i, start_wall_s=time.time(),
                             queue_ms=0.1, ttft_ms=170.0 + i, itl_ms=[0.0] * 15, tpot_ms=0.0, e2e_ms=180.0 + i,
                             input_tokens=600, output_tokens=16, ok=True) for i in range(20)]
    engine = EngineDeltas(generation_tokens=320.0, requests_finished=20.0, engine_ttft_ms_mean=19.7,
                          engine_itl_ms_mean=11.5, engine_e2e_ms_mean=200.0)
    summary = summarize(records, 4.0, engine=engine, client_lag_ms=[900.0] * 50)
    return LevelResult(index=0, label="concurrency 4", mode="closed", concurrency=4, started_wall_s=time.time(),
                       summary=summary), records


def test_live_tiles_never_show_a_flagged_client_figure_and_end_on_the_runs_summary(
        qtbot, window: MainWindow, monkeypatch) -> None:
    level, _ = _starved_summary()

    def run(config: RunConfig, bus: Bus, cancel: threading.Event, **_k: object) -> RunResult:
        bus.emit(PhaseChanged(phase="loading weights", detail="Loading safetensors"))
        gate.wait(10)
        bus.emit(EngineReady(run_id="r", base_url="http://127.0.0.1:1", startup_s=30.0))
        bus.emit(LevelStarted(run_id="r", index=0, label="concurrency 4", mode="closed", concurrency=4,
                              started_wall_s=time.time(), num_requests=20))
        for i in range(1, 11):
            bus.emit(Progress(run_id="r", level=0, planned=20, requests_done=i, errors=0, requests_in_flight=4,
                              output_tokens=16 * i, elapsed_s=i * 0.5, output_tok_per_s=80.0, ttft_ms_p50=170.0,
                              itl_ms_p50=0.0))
            bus.sample("engine", {"ttft_mean_ms": 19.7, "itl_mean_ms": 11.5, "generation_tok_per_s": 82.0})
        bus.emit(LogLine(line='INFO:     127.0.0.1:4242 - "POST /v1/completions HTTP/1.1" 200 OK'))
        progressed.set()
        gate2.wait(10)
        bus.emit(LevelFinished(run_id="r", index=0, label="concurrency 4", summary=level.summary))
        return RunResult(run_id="r", name=config.name, config=config, started_wall_s=time.time(), levels=[level])

    gate, gate2, progressed = threading.Event(), threading.Event(), threading.Event()
    monkeypatch.setattr(window.session, "run", run)
    qtbot.mouseClick(window.start_button, Qt.MouseButton.LeftButton)
    # the engine's phases stand where the graphs will be; the bar does not claim the run is done
    qtbot.waitUntil(lambda: window.dashboard.page == Dashboard.STARTUP
                    and window.phase_bar.phase == "loading weights", timeout=5000)
    assert window.phase_bar.bar.value() < 100
    gate.set()
    qtbot.waitUntil(progressed.is_set, timeout=5000)
    try:
        _check_live(qtbot, window)
    finally:
        gate2.set()
    qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    _check_summary(window)


def _check_live(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    qtbot.waitUntil(lambda: window.phase_bar.stage == "load" and "10/20 requests" in window.phase_bar.label.text(),
                    timeout=5000)
    assert window.phase_bar.bar.value() == 50 and window.dashboard.page == Dashboard.PLOTS
    itl = window.dashboard.tiles.tiles["itl"]  # an ITL p50 of 0 is bunched tokens, not a figure
    qtbot.waitUntil(lambda: "(engine)" in itl.caption.text(), timeout=5000)
    assert itl.text() == "11.5" and "unreliable" in itl.sub.text()
    assert not any("POST /v1" in line for line in window.log_view.visible_lines())  # the access line is hidden...
    window.log_view.show_access.setChecked(True)
    assert any("POST /v1" in line for line in window.log_view.visible_lines())  # ...not lost
    window.log_view.show_access.setChecked(False)


def _check_summary(window: MainWindow) -> None:
    tiles = window.dashboard.tiles
    assert tiles.mode == "summary" and tiles.header.text().startswith("Run summary")
    ttft = tiles.tiles["ttft"]
    assert ttft.caption.text() == "TTFT mean (engine) (ms)" and ttft.text() == "19.7"
    assert "unreliable" in ttft.sub.text() and "starved" in ttft.toolTip()
    assert "TTFT mean (engine) 19.7 ms" in window.banner.text()  # the banner agrees with the tiles
    assert "TTFT p50" not in window.banner.text()


def test_series_keep_their_colour_and_the_legend_stays_off_the_lines(qtbot, window: MainWindow) -> None:
    def colours() -> dict[str, str]:
        panel = window.dashboard.plots.panels["tokens"]
        return {key[0]: curve.opts["pen"].color().name() for key, (curve, _s, _v) in panel.curves.items()}

    window.bus.sample("engine", {"generation_tok_per_s": 1.0})
    window.bus.emit(Progress(run_id="r", level=0, requests_done=1, errors=0, requests_in_flight=1, output_tokens=1,
                             elapsed_s=1.0, output_tok_per_s=1.0))
    qtbot.waitUntil(lambda: len(colours()) == 2, timeout=5000)
    first = colours()
    window.dashboard.reset()
    window.series.clear()
    window.bus.emit(Progress(run_id="r", level=0, requests_done=1, errors=0, requests_in_flight=1, output_tokens=1,
                             elapsed_s=1.0, output_tok_per_s=1.0))  # the client first this time
    window.bus.sample("engine", {"generation_tok_per_s": 1.0})
    qtbot.waitUntil(lambda: len(colours()) == 2, timeout=5000)
    assert colours() == first and first["engine"] != first["client"]
    panel = window.dashboard.plots.panels["tokens"]
    assert sorted(panel.legend_labels()) == ["client", "engine"]
    assert "client" in panel.getPlotItem().titleLabel.text  # the legend is in the title, above the plot
    latency, itl = window.dashboard.plots.panels["latency"], window.dashboard.plots.panels["itl"]
    assert {t.name for t in latency.spec.traces} == {"ttft_ms_p50", "ttft_mean_ms"}  # TTFT and ITL apart
    assert {t.name for t in itl.spec.traces} == {"itl_ms_p50", "itl_mean_ms"}


def test_presentation_fits_a_projector_and_says_which_features_are_on(qtbot, window: MainWindow) -> None:
    # after a run the tiles carry their longest texts (the engine's figure standing in, and why)
    for row in (window.dashboard.tiles, window.presentation.tiles):
        row.set_header("Run summary \u2014 prefix caching on with a long run name, concurrency 8: 400 requests in "
                       "8.3 s (completed)")
        for tile in row.tiles.values():
            tile.show("12,345.6", "TTFT mean (engine) (ms)", "client TTFT p50 81.4: unreliable (the client was starved)")
    window.show_banner("Run completed: concurrency 4: Output throughput 401.2 tok/s, TTFT mean (engine) 75.4 ms, "
                       "5% of limit — at concurrency 4 the client's own timings were unreliable (hover the greyed "
                       "figures for why): the engine's figures stand in for them", error=False)
    assert window.minimumSizeHint().width() <= 1366, window.minimumSizeHint()
    qtbot.keyClick(window, Qt.Key.Key_F11)
    assert window.presenting
    window.showNormal()
    for width, height in ((1024, 768), (1280, 720)):
        hint = window.minimumSizeHint()
        assert hint.width() <= width and hint.height() <= height, hint
    assert "prefix caching on" in window.presentation.features.text()
    axis = window.presentation.plots.panels["tokens"].getPlotItem().getAxis("bottom")
    assert "14pt" in axis.labelStyle.get("font-size", "")


def test_compare_leads_with_a_headline_in_words(qtbot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.unit.test_compare_reliability import store_prefix_demo

    db = tmp_path / "demo.db"
    off, on = store_prefix_demo(db)
    window = make_window(db_path=db)
    window.compare_runs([off, on])
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=10_000)
    assert window.compare.headline_text() == ("prefix caching off \u2192 on: TTFT mean (engine) 91.2 \u2192 19.7 ms, "
                                              "4.6\u00d7 faster")
    table = window.compare.metrics
    sections = [table.item(r, 0).text() for r in range(table.rowCount()) if table.item(r, 0).data(
        Qt.ItemDataRole.UserRole) is None]
    assert sections[0] == "Headline" and "The engine's own figures" in sections
    keys = {table.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in range(table.rowCount())}
    assert "ttft_ms_p90" not in keys  # a middle percentile is detail, behind "All figures"
    window.compare.all_figures.setChecked(True)
    assert "ttft_ms_p90" in {table.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in range(table.rowCount())}
    assert window.compare.diff.item(0, 0).text() == "Prefix caching"
    window.compare.present_button.click()
    assert window.presenting and window.presentation.page == "before_after"
    assert window.presentation.before_after.sentence.text() == "TTFT mean (engine) 91.2 \u2192 19.7 ms, 4.6\u00d7 faster"
    window.showNormal()
    for width, height in ((1024, 768), (1280, 720)):  # the before/after page fits a projector too
        hint = window.minimumSizeHint()
        assert hint.width() <= width and hint.height() <= height, hint
    qtbot.keyClick(window, Qt.Key.Key_L)
    assert window.presentation.page == "live"
    qtbot.keyClick(window, Qt.Key.Key_B)
    assert window.presentation.page == "before_after"
    qtbot.keyClick(window, Qt.Key.Key_F11)
    assert not window.presenting
    run_name = window.run_bar.name
    run_name.setFocus()
    qtbot.keyClicks(run_name, "LB")  # on the desk the letters are text, not page switches
    assert run_name.text().endswith("LB")


def test_a_levels_steady_window_is_shaded_on_the_live_plots(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    """The span a level's steady figures are of, placed on the plots' time axis by the wall
    clock: the level began 3 s after the plots' first sample, its window 2 s to 8 s into it."""
    from app.load.metrics import LevelSummary, SteadyWindow

    first_wall = time.time() - 20.0
    window.bus.sample("engine", {"generation_tok_per_s": 1.0}, t=(time.monotonic(), first_wall))
    qtbot.waitUntil(lambda: window.series.t0_wall is not None, timeout=5000)
    window.bus.emit(LevelStarted(run_id="r", index=0, label="concurrency 8", mode="closed", concurrency=8,
                                 started_wall_s=first_wall + 3.0, num_requests=None))
    steady = SteadyWindow(start_s=2.0, end_s=8.0, rule="while at least 8 of the 8 requests asked were in flight",
                          output_tok_per_s=80.0)
    window.bus.emit(LevelFinished(run_id="r", index=0, label="concurrency 8",
                                  summary=LevelSummary(completed=10, steady=steady)))
    panel = window.dashboard.plots.panels["tokens"]
    qtbot.waitUntil(lambda: len(panel.steady_windows()) == 1, timeout=5000)
    assert panel.steady_windows()[0] == pytest.approx((5.0, 11.0), abs=1e-6)
    assert all(len(p.steady_windows()) == 1 for p in window.presentation.plots.panels.values())
    window.dashboard.plots.reset()  # a new run's plots start clean
    assert not panel.steady_windows()


def test_steady_windows_are_reused_run_after_run_never_deleted(qtbot) -> None:  # type: ignore[no-untyped-def]
    """Run after run, the shaded windows are the same items, hidden and shown again: a labelled
    region removed on reset was deleted under its label, still wired to the scene's paint signal,
    and the suite crashed (a segfault in the customer demo, whose runs follow one another)."""
    import pyqtgraph as pg
    import shiboken6

    from app.gui.dashboard import PlotPanel
    from app.gui.series import plots_for

    panel = PlotPanel(plots_for(False)[0])
    qtbot.addWidget(panel)
    panel.resize(600, 300)
    panel.show()
    panel.getPlotItem().getViewBox().setRange(xRange=(0.0, 30.0), yRange=(0.0, 1.0), padding=0)  # labels painted

    def regions() -> list[pg.LinearRegionItem]:
        return [item for item in panel.getPlotItem().items if isinstance(item, pg.LinearRegionItem)]

    first: list[int] = []
    for run in range(5):
        for level in range(3 if run % 2 == 0 else 2):
            panel.mark_window(10.0 * level, 10.0 * level + 8.0, f"steady: {{level}} {level}")
        panel.repaint()
        qtbot.wait(20)
        assert panel.steady_windows()[:2] == [(0.0, 8.0), (10.0, 18.0)], run
        first = first or [id(item) for item in regions()]
        assert [id(item) for item in regions()] == first, f"run {run} made new regions"
        assert all(shiboken6.isValid(item) for item in regions())
        assert sum(item.isVisible() for item in regions()) == len(panel.steady_windows()), run
        panel.reset()
        assert panel.steady_windows() == [] and not any(item.isVisible() for item in regions())
    assert len(first) == 3


def test_the_ttfat_tile_shows_only_for_a_model_that_reasons(qtbot) -> None:  # type: ignore[no-untyped-def]
    """A model that does not reason has no TTFAT of its own (it is its TTFT): no tile. Once a
    request reasoned, the live TTFAT p50 shows beside TTFT, and the run's summary keeps it."""
    from app.gui.dashboard import TileRow

    row = TileRow()
    qtbot.addWidget(row)
    row.show()
    ttfat = row.tiles["ttfat"]
    row.refresh({("client", "ttft_ms_p50"): 20.0})
    assert ttfat.isHidden()
    row.refresh({("client", "ttft_ms_p50"): 20.0, ("client", "ttfat_ms_p50"): 420.0})
    assert not ttfat.isHidden() and ttfat.text() == "420" and ttfat.caption.text() == "TTFAT p50 (ms)"
    row.show_summary({"ttft_ms_p50": 21.0, "ttfat_ms_p50": 433.0}, {}, "Run summary")
    assert not ttfat.isHidden() and ttfat.text() == "433.0"
    row.live()
    assert ttfat.isHidden()
    row.show_summary({"ttft_ms_p50": 21.0}, {}, "Run summary")  # nothing reasoned
    assert ttfat.isHidden()
