"""The Ladder tab (offscreen): the profile's steps listed and edited (add, remove, reorder, the
seeds' order) into the window's configuration, each step's plan shown before Start, the
staircase growing bar by bar with its factor labels as a ladder runs (stand-in engines and runs:
``tests.fakes.ladder``), the stored ladder opened, compared and reported, and the large
staircase in presentation mode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

import app.campaign as campaign_mod
import app.engines as engines_mod
import app.ladder.run as ladder_run
from app.gui.main_window import MainWindow
from app.profiles import load_profile_file
from engine_adapters.hardware import probe_hardware
from tests.fakes.ladder import FakeEngines, FakeLadderRunner, Script

pytestmark = pytest.mark.gui

SCRIPTS = {"baseline": Script(400, 1.2, delay_s=0.6), "batching": Script(1600, 12.0, delay_s=0.6),
           "FP8 KV": Script(1500, 12.0, delay_s=0.6), "prefix": Script(2000, 13.0, delay_s=0.6)}


def _names(window: MainWindow) -> list[str]:
    return [s.name for s in window.state.campaigns.ladder.steps]  # type: ignore[union-attr]


def test_ladder_tab_edits_runs_and_shows_the_staircase(  # type: ignore[no-untyped-def]
        qtbot, make_window: Callable[..., MainWindow], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engines = FakeEngines()
    monkeypatch.setattr(campaign_mod.EngineKeeper, "engine_for",
                        lambda self, config, bus, cancel: engines.engine_for(config, bus, cancel))
    # The fake engines stand for a CPU that keeps an FP8 KV cache (AVX-512): on one without it,
    # the plan would skip that step (the e2e ladder and test_ladder cover that case).
    here = probe_hardware()
    with_avx512 = here.model_copy(update={"cpu_flags": [*here.cpu_flags, "avx512f"]})
    for module in (engines_mod, ladder_run):  # the window's check and the ladder's plan
        monkeypatch.setattr(module, "probe_hardware", lambda: with_avx512)
    FakeLadderRunner.scripts, FakeLadderRunner.calls = SCRIPTS, []
    window = make_window("cpu-ladder", db_path=tmp_path / "runs.db")
    tab = window.ladder
    window.tabs.setCurrentWidget(tab)
    qtbot.waitUntil(lambda: tab.table.rowCount() == 4 and "shared-prefix" in tab.workload_label.text(), timeout=60_000)
    assert "one shared-prefix workload for every step" in tab.workload_label.text()  # said on screen
    assert [tab.table.item(r, 10).text() for r in range(4)] == ["launch", "reuse", "relaunch", "relaunch"]
    assert tab.table.item(1, 2).text() == "concurrency 1 \u2192 16"

    # Edit: reorder, remove, add from the seeds' order; each edit is the window's configuration.
    tab.steps.setCurrentRow(3)
    qtbot.mouseClick(tab.up_button, Qt.MouseButton.LeftButton)
    assert _names(window)[2:] == ["+ prefix caching", "+ FP8 KV cache"]
    qtbot.mouseClick(tab.down_button, Qt.MouseButton.LeftButton)
    assert _names(window)[2:] == ["+ FP8 KV cache", "+ prefix caching"]
    spec_action = next(a for a in tab.add_menu.actions() if a.text() == "+ speculative decoding")
    spec_action.trigger()
    assert _names(window)[-1] == "+ speculative decoding" and tab.steps.count() == 5
    qtbot.waitUntil(lambda: tab.table.rowCount() == 5, timeout=30_000)
    tab.steps.setCurrentRow(4)
    qtbot.mouseClick(tab.remove_button, Qt.MouseButton.LeftButton)
    assert _names(window) == ["baseline", "+ continuous batching", "+ FP8 KV cache", "+ prefix caching"]
    qtbot.waitUntil(lambda: tab.table.rowCount() == 4, timeout=30_000)

    # Start: the staircase grows as steps finish, labelled with the factors.
    tab.runner_factory = FakeLadderRunner
    qtbot.mouseClick(tab.start_button, Qt.MouseButton.LeftButton)
    assert window.running and not window.start_button.isEnabled() and tab.stop_button.isEnabled()
    qtbot.waitUntil(lambda: len(tab.chart.bars) == 1, timeout=30_000)
    assert tab.chart.labels[0][:3] == ["400 tok/s", "(total 800)", "baseline"]
    assert tab.chart.labels[3] == ["pending"]  # not yet a bar
    qtbot.waitUntil(lambda: not window.running, timeout=60_000)
    assert len(tab.chart.bars) == 4
    assert tab.chart.labels[1][2:4] == ["\u00d74.00 vs baseline", "\u00d74.00 vs previous"]
    assert tab.chart.labels[2][3] == "LOSS \u00d70.94 vs previous"  # a slower step is shown as a loss
    assert tab.table.item(2, 5).text() == "LOSS \u00d70.94" and tab.table.item(1, 10).text() == "reused"
    assert [tab.table.item(r, 11).text() for r in range(4)] == ["verified"] * 4
    assert "Ladder completed: 4 of 4 steps ran, up to \u00d75.00" in window.banner.text()
    assert len(engines.launched) == 3  # the load-only step reused the baseline's engine
    # Each step's cost per 1M output tokens, from its stored run, last under its bar: on one
    # machine's cores, in the inverse ratio of the throughputs (x4.00 the tok/s, a quarter of the cost).
    qtbot.waitUntil(lambda: len(tab.chart.costs) == 4, timeout=30_000)
    assert all(tab.chart.labels[i][-1] == f"{tab.chart.costs[i]} / 1M out" for i in range(4))
    base_usd, step_usd = (float(tab.chart.costs[i].lstrip("$")) for i in (0, 1))
    assert step_usd == pytest.approx(base_usd / 4, rel=0.01)
    assert "$ per 1M output tokens (default price, as of" in tab.chart.plot.getPlotItem().titleLabel.text

    # Stored: listed, opened, compared as a whole, reported.
    qtbot.waitUntil(lambda: tab.stored_picker.count() == 1, timeout=30_000)
    assert "completed (4/4 steps)" in tab.stored_picker.itemText(0)
    tab.chart.clear()
    qtbot.mouseClick(tab.open_button, Qt.MouseButton.LeftButton)
    assert len(tab.chart.bars) == 4
    qtbot.mouseClick(tab.compare_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.tabs.currentWidget() is window.compare, timeout=30_000)
    assert window._compare_ids == tab.stored[0].run_ids and len(window._compare_ids) == 4
    report = tmp_path / "ladder.html"
    tab.save_report(str(report))
    qtbot.waitUntil(report.exists, timeout=30_000)
    assert "+ prefix caching" in report.read_text() and "data:image/svg+xml" in report.read_text()
    assert "<th>$ / 1M output tokens</th>" in report.read_text() and f"<td>{tab.chart.costs[1]}</td>" in report.read_text()

    # Presentation: the staircase, large and dark, above the live plots.
    window.toggle_presentation()
    assert tab.present_chart is not None and tab.present_chart.isVisible() and len(tab.present_chart.bars) == 4
    window.toggle_presentation()

    # Saved with the profile: the edited ladder goes to the profile's [campaigns.ladder].
    tab.steps.setCurrentRow(3)
    qtbot.mouseClick(tab.remove_button, Qt.MouseButton.LeftButton)
    saved = tmp_path / "edited.toml"
    window.save_profile_to(saved)
    qtbot.waitUntil(saved.exists, timeout=30_000)
    assert "[campaigns.ladder]" in saved.read_text()
    assert [s.name for s in load_profile_file(saved).ladder.steps] == _names(window)  # type: ignore[union-attr]
    assert len(_names(window)) == 3


def test_a_profile_without_a_shared_prefix_workload_says_why_it_cannot_climb(  # type: ignore[no-untyped-def]
        qtbot, make_window: Callable[..., MainWindow]) -> None:
    window = make_window("cpu-demo")  # a random workload and no [ladder]: the seeds' order is offered
    tab = window.ladder
    assert [tab.steps.item(i).text() for i in range(tab.steps.count())][-1] == "6. + speculative decoding"
    qtbot.waitUntil(lambda: "shared-prefix workload" in tab.workload_label.text(), timeout=30_000)
    assert not tab.start_button.isEnabled()
    assert window.state.set("workload.shared_prefix_tokens", 256) is None
    assert window.state.set("workload.kind", "shared_prefix") is None
    qtbot.waitUntil(lambda: "Fair by construction" in tab.workload_label.text(), timeout=30_000)
    assert tab.start_button.isEnabled() and "256-token shared prefix" in tab.workload_label.text()
    qtbot.waitUntil(lambda: tab.table.rowCount() == 6, timeout=30_000)
    assert tab.table.item(1, 1).text().startswith("skipped: weights_dtype")  # FP8 weights on the CPU build


def test_a_steps_bar_says_its_cost_at_goodput_below_its_cost() -> None:
    from app.gui.ladder_chart import bar_labels
    from app.ladder.state import StepRow

    row = StepRow(index=1, name="+ FP8 KV", status="completed", run_ids=[2], output_tok_per_s=900.0,
                  total_tok_per_s=1800.0, factor_baseline=1.5, factor_previous=1.5)
    assert bar_labels(row, False, cost="$0.0120", good_cost="$0.0150")[-2:] == ["$0.0120 / 1M out", "$0.0150 / 1M good"]
    assert bar_labels(row, False, cost="$0.0120")[-1] == "$0.0120 / 1M out"  # no SLO: no good line
    assert bar_labels(row, False, compact=True, cost="$0.0120", good_cost="$0.0150")[-1] == "$0.0120 / 1M out"
