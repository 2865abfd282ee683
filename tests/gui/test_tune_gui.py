"""The Tune tab (offscreen): a tune from the window's configuration with stand-in engines and runs
(``tests.fakes.tuner``): the Pareto chart and the trials table grow as trials end, the pick is
named with its binding constraint, then the stored tune is listed, its pick exported, a vllm bench
sweep imported onto its chart and the report written; and a stopped tune resumes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.gui.main_window import MainWindow
from tests.fakes.tuner import FakeEngines, FakeTuneRunner

pytestmark = pytest.mark.gui

SPACE = '[knobs]\nmax_num_seqs = [2, 8]\nprefix_caching = [false, true]\n[load]\nconcurrency = [1, 4, 16]\n'
SWEEP_CSV = (",max_num_seqs,max_concurrency,output_throughput,mean_tpot_ms,p99_ttft_ms,completed,failed\n"
             "0,4,4,180.0,20.0,120.0,16,0\n1,16,16,520.0,35.0,300.0,16,0\n")


def test_tune_tab_runs_shows_the_trade_off_and_exports_the_pick(  # type: ignore[no-untyped-def]
        qtbot, make_window: Callable[..., MainWindow], tmp_path: Path) -> None:
    FakeTuneRunner.reset()
    FakeTuneRunner.run_s = 0.05
    window = make_window("cpu-demo", db_path=tmp_path / "runs.db")
    tab = window.tune
    window.tabs.setCurrentWidget(tab)
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    tab.space_edit.setText(str(space))
    tab.slo_edit.setText("ttft_ms<=150,tpot_ms<=60")
    tab.runner_factory, tab.engines = FakeTuneRunner, FakeEngines()
    qtbot.mouseClick(tab.start_button, Qt.MouseButton.LeftButton)
    assert window.running and tab.stop_button.isEnabled()
    qtbot.waitUntil(lambda: not window.running, timeout=120_000)
    state = tab.state
    assert state is not None and state.status == "completed", window.banner.text()
    assert tab.table.rowCount() == len(state.trials) >= 6
    statuses = [tab.table.item(r, 3).text() for r in range(tab.table.rowCount())]
    assert "failed" in statuses and "PICK passed" in statuses
    assert tab.chart.points["pick"] == [(state.pick.tok_s_per_user, state.pick.tok_s_per_gpu)]  # type: ignore[union-attr]
    assert tab.chart.points["met the SLO"] and tab.chart.points["missed the SLO"] and tab.chart.points["SLO frontier"]
    assert tab.chart.points["TPOT SLO"] == [(1000 / 60, 0.0)]
    assert "The pick: max seqs 8, prefix cache on at concurrency 4" in tab.pick_label.text()
    assert "Bound by: TTFT p99 hit" in tab.pick_label.text() and "The pick" in window.banner.text()

    # Each finished trial's cost, priced from its stored run in a worker: what `tunes show` prints.
    from app.cost import price_table, trial_costs, usd_text
    from app.export.tune_report import COLUMNS
    from app.store import RunStore

    out_col, good_col = COLUMNS.index("$/1M out"), COLUMNS.index("$/1M good")

    def cost_index(row: int) -> int:
        return int(tab.table.item(row, 0).text()) - 1
    qtbot.waitUntil(lambda: all(tab.table.item(r, out_col).text().startswith("$")
                                for r in range(tab.table.rowCount())), timeout=30_000)
    with RunStore(tmp_path / "runs.db") as store:
        costs = trial_costs(store, state, price_table())
    assert len(costs) == len(state.trials)
    for r in range(tab.table.rowCount()):
        cost = costs[cost_index(r)]
        assert cost.units == 2 and tab.table.item(r, out_col).text() == usd_text(cost.output.usd)
        tok_per_s = next(t for t in state.trials if t.index == cost_index(r)).figures["output_tok_per_s"]
        assert cost.output.usd == pytest.approx(2 * 0.05 / (tok_per_s * 3600) * 1e6)  # 2 cores x 0.05 $/core-h
        assert tab.table.item(r, good_col).text() == "n/a"  # stand-in runs store no requests to count

    # Stored: listed; the pick exported; a sweep drawn on the same chart; the report written.
    qtbot.waitUntil(lambda: tab.stored_picker.count() == 1, timeout=30_000)
    script = tmp_path / "pick.sh"
    tab.export_pick(str(script), "bash")
    qtbot.waitUntil(script.exists, timeout=30_000)
    assert "--max-num-seqs 8" in script.read_text() and "--enable-prefix-caching" in script.read_text()
    sweep = tmp_path / "summary.csv"
    sweep.write_text(SWEEP_CSV)
    tab.import_points(str(sweep))
    qtbot.waitUntil(lambda: "vllm bench sweep (imported)" in tab.chart.points, timeout=30_000)
    assert tab.chart.points["vllm bench sweep (imported)"] == [(50.0, 180.0), (1000 / 35, 520.0)]
    report = tmp_path / "tune.html"
    tab.save_report(str(report))
    qtbot.waitUntil(report.exists, timeout=30_000)
    assert "vllm bench sweep (imported)" in report.read_text() or "data:image/svg+xml" in report.read_text()
    assert "<th>$/1M out</th>" in report.read_text() and "costs at 2 cores x 0.05 $/core-h" in report.read_text()


def test_a_stopped_tune_resumes_from_the_tab(  # type: ignore[no-untyped-def]
        qtbot, make_window: Callable[..., MainWindow], tmp_path: Path) -> None:
    FakeTuneRunner.reset()
    window = make_window("cpu-demo", db_path=tmp_path / "runs.db")
    tab = window.tune
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    tab.space_edit.setText(str(space))
    tab.runner_factory, tab.engines = FakeTuneRunner, FakeEngines()
    FakeTuneRunner.hook = staticmethod(lambda c: window.cancel.set() if c.features.max_num_seqs == 8  # type: ignore[assignment]
                                       and window.cancel is not None else None)
    tab.start()
    qtbot.waitUntil(lambda: not window.running, timeout=120_000)
    assert tab.state is not None and tab.state.status == "cancelled"
    qtbot.waitUntil(lambda: tab.stored_picker.count() == 1 and tab.resume_button.isEnabled(), timeout=30_000)
    ran_before = len(FakeTuneRunner.calls)
    FakeTuneRunner.hook = None
    qtbot.mouseClick(tab.resume_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.running, timeout=120_000)
    assert tab.state.status == "completed"
    first_engine = [c for c in FakeTuneRunner.calls[ran_before:] if c[0] == 2]
    assert not first_engine  # the configurations finished before the stop were not run again


def test_pareto_redraws_leave_no_chart_items_to_the_garbage_collector(qtbot) -> None:  # type: ignore[no-untyped-def]
    """Each redraw (four a second while a tune runs) must free what it replaces at once: an item
    left in a reference cycle is freed by the cyclic GC at an arbitrary moment, even inside a paint
    that is signalling it, which crashed the process once."""
    import gc

    import pyqtgraph as pg

    from app.gui.tune_tab import ParetoChart
    from app.tuner.state import TuneState

    chart = ParetoChart()
    qtbot.addWidget(chart)
    chart.show()
    state = TuneState(tune_id="t", slo="ttft_ms<=150,tpot_ms<=60")
    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, pg.InfiniteLine)}  # other windows' too
    gc.disable()
    try:
        for _ in range(5):
            chart.set_state(state)
            chart.plot.repaint()
            qtbot.wait(10)
        assert chart.points["TPOT SLO"] == [(1000 / 60, 0.0)]
        left = [o for o in gc.get_objects() if isinstance(o, pg.InfiniteLine) and id(o) not in before]
    finally:
        gc.enable()
    assert left == [], f"{len(left)} TPOT lines left to the garbage collector by 5 redraws"
