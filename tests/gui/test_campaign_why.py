"""The Ladder and Tune tabs explain the shown campaign from its stored runs' findings, with the text
``tunebench explain --ladder/--tune`` prints (``app.campaign_findings``): a stored ladder's steps
with why each moved, a tune's pick and why each rejected trial failed. The runs are recorded runs
(tests/unit/test_findings.py), stored before the tabs open, as an old campaign's are."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.campaign_findings import ladder_lines, tune_lines
from app.gui.ladder_tab import LadderTab
from app.gui.tune_tab import TuneTab
from app.gui.workers import busy_workers
from app.ladder.state import LadderState, StepRow
from app.ladder.stored import save_ladder
from app.store import RunStore
from app.tuner.state import Pick, Trial, TuneState
from tests.gui.test_campaign_host import SmallHost
from tests.unit.test_campaign_findings import KV_FULL, PREFIX_OFF, PREFIX_ON
from tests.unit.test_findings import store_run

pytestmark = pytest.mark.gui


def test_the_campaign_tabs_explain_a_stored_ladder_and_a_tune(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host = SmallHost(tmp_path / "runs.db")
    qtbot.addWidget(host)

    def stored(store: RunStore) -> tuple[LadderState, TuneState]:
        off, on, full = store_run(store, PREFIX_OFF), store_run(store, PREFIX_ON), store_run(store, KV_FULL)
        ladder = LadderState(ladder_id="lad-why", name="prefix ladder", started_wall_s=1.9e9, status="completed",
                             rows=[StepRow(index=0, name="baseline", status="completed", run_ids=[off],
                                           output_tok_per_s=1000.0),
                                   StepRow(index=1, name="prefix caching", change="prefix caching off -> on",
                                           status="completed", run_ids=[on], output_tok_per_s=1500.0,
                                           factor_previous=1.5)])
        save_ladder(store, ladder)
        tune = TuneState(tune_id="tune-why", name="tune", trials=[
            Trial(index=0, candidate=0, label="c=8", load_value=8, status="passed", run_id=on),
            Trial(index=1, candidate=0, label="c=16", load_value=16, status="failed", run_id=full,
                  reason="TTFT p99 2,400 ms > 500 ms")],
            pick=Pick(candidate=0, trial=0, label="c=8", load_label="concurrency 8", run_id=on, tok_s_per_gpu=1234.0))
        return ladder, tune

    ladder_state, tune_state = host.with_store(stored)
    expected_ladder = host.with_store(lambda store: ladder_lines(store, ladder_state))
    expected_tune = host.with_store(lambda store: tune_lines(store, tune_state))

    ladder = LadderTab(host)
    qtbot.addWidget(ladder)
    qtbot.waitUntil(lambda: ladder.stored_picker.count() == 1, timeout=30_000)
    assert ladder.why_button.isEnabled() and not ladder.why_view.isVisibleTo(ladder)  # hidden until asked
    ladder.why_button.click()
    qtbot.waitUntil(lambda: ladder.why_view.toPlainText() != "", timeout=30_000)
    assert ladder.why_view.toPlainText().splitlines() == expected_ladder
    assert ladder.why_view.isVisibleTo(ladder)
    text = ladder.why_view.toPlainText()
    assert "x1.50 over the previous step" in text and "prefill did 85% less work" in text
    assert "[warning] prefix_cold" in text  # the baseline's own run, explained

    tune = TuneTab(host)
    qtbot.addWidget(tune)
    qtbot.waitUntil(lambda: not busy_workers(), timeout=30_000)
    assert not tune.why_button.isEnabled()  # nothing shown, nothing stored: nothing to explain
    tune.show_state(tune_state)
    tune._update_buttons()
    assert tune.why_button.isEnabled()
    tune.why_button.click()
    qtbot.waitUntil(lambda: tune.why_view.toPlainText() != "", timeout=30_000)
    assert tune.why_view.toPlainText().splitlines() == expected_tune
    assert tune.results_tabs.currentWidget() is tune.why_view
    text = tune.why_view.toPlainText()
    assert "pick: c=8 at concurrency 8" in text and "TTFT p99 2,400 ms > 500 ms" in text
    assert "[warning] kv_bound" in text  # why the rejected trial failed: its KV cache was full
    assert not host.errors, host.errors
    qtbot.waitUntil(lambda: not busy_workers(), timeout=10_000)  # nothing of the tabs outlives the test
    qtbot.wait(100)
