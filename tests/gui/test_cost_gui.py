"""Cost and capacity where the customer looks in the window: Compare's money line and cost table,
the before/after view's line in money, and the Capacity box of Compare and Tune (sized in a
worker, a bad price refused in its own words and not kept, a good one kept in the settings and
used by Compare's costs). Figures are hand-computed: 1 GPU x 2.49 $/h over 1,000 and 3,100 output
tok/s is $0.69 and $0.22 per 1M output tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel

from app.gui.main_window import MainWindow
from app.gui.settings import load_settings, settings_path
from app.store import RunStore
from app.tuner.state import Pick, Trial, TuneState
from tests.unit.test_cost_compare import GPU_ENGINE, H100, _store_run

pytestmark = pytest.mark.gui


@pytest.fixture(autouse=True)
def own_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prices a test keeps stay in its own settings file (other windows would use them)."""
    monkeypatch.setenv("TUNEBENCH_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture()
def two_runs(tmp_path: Path) -> Path:
    path = tmp_path / "cost.db"
    with RunStore(path) as store:
        _store_run(store, "base", {"engine": GPU_ENGINE}, 1000.0, H100)  # 1
        _store_run(store, "prefix on", {"engine": GPU_ENGINE, "features": {"prefix_caching": True}}, 3100.0, H100)
    return path


def _compared(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    window.compare_runs([1, 2])
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=10_000)


def _cells(window: MainWindow, row: int) -> list[str]:
    table = window.compare.cost_table
    return [table.item(row, col).text() for col in range(table.columnCount())]


def _size(qtbot, box) -> str:  # type: ignore[no-untyped-def]
    box.answer.setPlainText("")
    box.size_button.click()
    qtbot.waitUntil(lambda: box.size_button.isEnabled() and box.answer.toPlainText() not in ("", "Sizing\u2026"),
                    timeout=10_000)
    return str(box.answer.toPlainText())


def test_compare_says_the_change_in_money_and_sizes_the_traffic(qtbot, make_window, two_runs: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(db_path=two_runs)
    _compared(qtbot, window)
    money = window.compare.card.findChildren(QLabel, "headlineMoney")
    assert len(money) == 1
    assert money[0].text().endswith(": 3.1x the throughput per GPU, $0.69 \u2192 $0.22 per 1M output tokens "
                                    "(default price, as of 2026-12)"), money[0].text()
    assert _cells(window, 0)[:4] == ["#1 base", "$0.69", "baseline", "$0.46"]
    assert _cells(window, 1)[1:3] == ["$0.22", "x3.1 cheaper"]
    assert _cells(window, 1)[4:6] == ["\u2013", "1 GPU x 2.49 $/GPU-h"]  # the source is said once, below the table
    assert "default price, as of 2026-12" in window.compare.cost_note.text()
    assert "No good-output cost: the runs were measured without an SLO." in window.compare.cost_note.text()

    box = window.compare.capacity
    assert box is not None and box.run_choice.currentData() == 2  # the run after the change, first
    box.users.setValue(100)
    answer = _size(qtbot, box)
    # 100 users x 1.3 headroom / 16 measured in flight = 8.125 -> 9 replicas of 1 GPU
    assert "answer: 9 replicas = 9 GPUs" in answer, answer
    assert "extrapolation from concurrency 16" in answer

    box.prices_edit.setText("H100=abc")
    answer = _size(qtbot, box)
    assert "is not a number" in answer and "Traceback" not in answer
    assert load_settings().prices == []  # a refused price is not kept

    box.prices_edit.setText("H100=4.98")
    shown = window.compare.comparison
    answer = _size(qtbot, box)
    assert "4.98 $/GPU-h (your price" in answer
    qtbot.waitUntil(lambda: window.compare.comparison is not shown, timeout=10_000)  # re-costed at your price
    assert _cells(window, 1)[1] == "$0.45"  # 4.98 / (3,100 x 3,600) x 1e6 = 0.446
    assert settings_path().exists() and load_settings().prices == ["H100=4.98"]
    assert window.tune.capacity.prices_edit.text() == "H100=4.98"  # one set of prices for the window

    window.present_before_after()
    view = window.presentation.before_after
    assert view.money.isVisibleTo(window) and "$1.38 \u2192 $0.45 per 1M output tokens (your price)" in view.money.text()
    window.showNormal()
    for width, height in ((1024, 768), (1280, 720)):  # the line in money still fits a projector
        hint = window.minimumSizeHint()
        assert hint.width() <= width and hint.height() <= height, hint


def test_tune_capacity_box_sizes_the_pick_at_the_tunes_slo(qtbot, make_window, two_runs: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(db_path=two_runs)
    state = TuneState(tune_id="t1", slo="ttft_ms<=80", percentile="p99", status="completed",
                      trials=[Trial(index=0, candidate=0, label="base", status="passed", run_id=1, load_value=16,
                                    figures={"output_tok_per_s": 1000.0}, tok_s_per_gpu=1000.0, tok_s_per_user=60.0),
                              Trial(index=1, candidate=1, label="prefix on", status="passed", run_id=2, load_value=16,
                                    figures={"output_tok_per_s": 3100.0}, tok_s_per_gpu=3100.0, tok_s_per_user=50.0)],
                      pick=Pick(candidate=1, trial=1, label="prefix on", load_label="concurrency 16", run_id=2))
    window.tune.show_state(state)
    box = window.tune.capacity
    assert [box.run_choice.itemData(i) for i in range(box.run_choice.count())] == [2, 1]
    assert box.run_choice.currentText().startswith("#2 the pick")
    assert box.slo_edit.text() == "ttft_ms<=80"
    # The Pareto chart reads tok/s per GPU as $ per 1M output tokens on its right axis: 2.49 $/GPU-h
    # (the trial's run: 1 H100) over 3,100 tok/s per GPU is $0.22, over 1,000 it is $0.69.
    axis = window.tune.chart.cost_axis
    qtbot.waitUntil(lambda: axis.usd_per_device_hour is not None, timeout=10_000)
    assert axis.usd_per_device_hour == pytest.approx(2.49)
    assert axis.tickStrings([3100.0, 1000.0, 0.0], 1.0, 100.0) == ["$0.22", "$0.69", ""]
    assert window.tune.chart.plot.getPlotItem().getAxis("right").isVisible()
    assert "$ per 1M output tokens (default price, as of 2026-12; lower is better)" in axis.labelText
    answer = _size(qtbot, box)
    # The stored level's TTFT p99 is 90 ms: an 80 ms SLO is never met, and the box says so, with no number.
    assert "not reachable with this configuration" in answer and "replicas" not in answer
    box.slo_edit.setText("ttft_ms<=500")
    box.users.setValue(16)
    answer = _size(qtbot, box)
    assert "answer: 2 replicas = 2 GPUs" in answer, answer  # 16 x 1.3 / 16 = 1.3 -> 2


def test_compare_prices_good_output_under_the_runs_slo(qtbot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from app.cost import usd_text
    from tests.unit.test_cost_capacity import _requests_run
    from tests.unit.test_cost_goodput import _good_and_all

    path = tmp_path / "good.db"
    with RunStore(path) as store:
        _run_id, records = _requests_run(store, "ttft_ms<=400")
        _requests_run(store, "ttft_ms<=400")
    window = make_window(db_path=path)
    _compared(qtbot, window)
    good, total = _good_and_all(records, 400)
    output_usd = window.compare.extras.costs[0].output.usd
    assert output_usd is not None and 0 < good < total
    assert _cells(window, 0)[4] == usd_text(output_usd * total / good)  # dearer than all output: fewer tokens count
    assert "Good output: the requests that met the runs' SLO 'ttft_ms<=400'." in window.compare.cost_note.text()


def test_the_cost_tile_is_live_during_a_run(qtbot, make_window) -> None:  # type: ignore[no-untyped-def]
    """While a run is under way the tile prices the output rate the tokens tile shows, on the run's
    GPUs and price; the run's summary clears it until the stored run's figure comes."""
    from app.cost import usd_text
    from tests.gui.test_workbench import _feed
    from tests.unit.test_cost_live import GPU_CONFIG, H100S, _started

    window = make_window()
    tiles = window.dashboard.tiles
    assert (tiles.cost_tile.text(), tiles.cost_tile.sub.text()) == ("\u2013", "once the run starts")
    window.bus.emit(_started(GPU_CONFIG, H100S))  # TP 2 on H100s, at the shipped 2.49 $/GPU-h
    _feed(window.bus, seconds=3)  # the client's output rate ends at 129 tok/s
    expected = usd_text(2 * 2.49 / (129 * 3600) * 1e6)
    qtbot.waitUntil(lambda: tiles.tiles["tok_s"].text() == "129" and tiles.cost_tile.text() == expected,
                    timeout=5000)
    assert tiles.cost_tile.sub.text() == "live, 2 GPUs x 2.49 $/GPU-h"
    assert window.presentation.tiles.cost_basis is tiles.cost_basis  # the projector's tile, once it is shown
    tiles.show_summary({"output_tok_per_s": 120.0}, {}, "Run summary")
    assert (tiles.cost_tile.text(), tiles.cost_tile.sub.text()) == ("\u2013", "from the stored run")
    window.dashboard.reset()  # a new run: priced again once it starts
    window.bus.emit(_started(GPU_CONFIG, {}))  # an engine elsewhere: no GPU recorded
    qtbot.waitUntil(lambda: tiles.cost_tile.text() == "n/a", timeout=5000)
    assert "records no GPU" in tiles.cost_tile.toolTip()
