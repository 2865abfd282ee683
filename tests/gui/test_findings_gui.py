"""The findings' faces in the workbench: a stored run's findings in the Live tab after it ends and
for a run picked in History, Try it setting the next trial in the configuration, Compare's "why
B differs from A" under the headline, and the presentation's one sentence. The runs are those of
tests/unit/test_findings.py: recorded engine /metrics pages, stored as the recorder stores them.

``TUNEBENCH_SHOTS_DIR=docs`` writes the panel's picture for docs/findings.md (docs/findings-panel.png)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.events import LevelStarted, RunFinished, RunStarted, Sample
from app.gui.main_window import MainWindow
from app.load.metrics import LevelSummary
from app.run_findings import first_sentence, headline_finding, stored_findings, top_change
from app.runner import LevelResult, RunResult
from app.store import RunStore
from tests.gui.test_text_fits import _fits_at_every_size, _longest_figures
from tests.gui.text_fit import cut_labels
from tests.unit.test_findings import SHARED, START_WALL, Engine, Recorded, llama_config, store_run

pytestmark = pytest.mark.gui

KV_FULL = Recorded(llama_config(), Engine(kv_full_pct=97.0, waiting=12.0, preempt_per_s=0.5), name="kv full")
PREFIX_OFF = Recorded(llama_config(prefix_caching=False, workload=SHARED), Engine(hit_ratio=0.0), name="prefix off")
PREFIX_ON = Recorded(llama_config(prefix_caching=True, workload=SHARED), Engine(hit_ratio=0.85), name="prefix on")


def _stored(db: Path, *runs: Recorded) -> list[int]:
    with RunStore(db) as store:
        return [store_run(store, rec) for rec in runs]


def _result(db: Path, run_id: int, rec: Recorded) -> RunResult:
    """What the runner hands the window for the stored run ``run_id`` (its uid, its last level)."""
    with RunStore(db) as store:
        run = store.get_run(run_id)
    summary = LevelSummary.model_validate(run.levels[-1].summary)
    return RunResult(run_id=run.uid, name=rec.name, config=rec.config, started_wall_s=START_WALL,
                     levels=[LevelResult(index=0, label="c=8", mode="closed", concurrency=8,
                                         started_wall_s=START_WALL, summary=summary)])


def test_a_kv_bound_run_shows_its_finding_after_the_run_and_try_it_sets_the_next_trial(
        qtbot, make_window: Callable[..., MainWindow], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "runs.db"
    (run_id,) = _stored(db, KV_FULL)
    window = make_window(db_path=db)
    assert window.state.config.features.kv_cache_dtype != "fp8"
    window.resize(1600, 1000)  # a desk monitor: the findings get the room the plots do not need
    panel, bottom = window.live_tab.findings, window.live_tab.bottom
    assert bottom.currentWidget() is window.log_view  # no run ended yet: the engine log
    assert window.live_tab.show_summary(_result(db, run_id, KV_FULL))  # the window's path when a run ends
    qtbot.waitUntil(lambda: panel.row("kv_bound") is not None, timeout=30_000)
    assert bottom.currentWidget() is panel and panel.isVisible() and "1 warning(s)" in panel.heading.text()
    assert bottom.tabText(1) == "Findings (1 warning)"
    row = panel.row("kv_bound")
    assert row is not None and "warning" in row.title.text()
    assert "KV" in row.explanation.text()
    assert panel.findings[0].rule == "kv_bound"  # warnings first
    # The presentation's live page reads out the first warning.
    assert window.presentation.finding.text() == first_sentence(panel.findings[0].explanation)  # read out: one sentence
    qtbot.waitUntil(lambda: all(r.height() >= r.heightForWidth(r.width()) for r in panel.rows))  # wrapped whole
    shots = Path(os.environ.get("TUNEBENCH_SHOTS_DIR") or tmp_path)
    assert window.grab().save(str(shots / "findings-panel.png"))
    assert row.try_button is not None
    qtbot.mouseClick(row.try_button, Qt.MouseButton.LeftButton)
    assert window.state.config.features.kv_cache_dtype == "fp8"  # in the configuration a Start runs
    assert window.config_panel.editor("features.kv_cache_dtype").value() == "fp8"  # and in its field
    assert "press Start" in panel.message.text()
    window.live_tab.clear("")  # a new run: the last run's findings go
    assert bottom.currentWidget() is window.log_view and not panel.rows
    assert window.presentation.finding.text() == "" and bottom.tabText(1) == "Findings"


def test_a_run_picked_in_history_shows_its_findings(qtbot, make_window: Callable[..., MainWindow],  # type: ignore[no-untyped-def]
                                                    tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    off, on = _stored(db, PREFIX_OFF, PREFIX_ON)
    window = make_window(db_path=db)
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: window.history.table.rowCount() == 2, timeout=20_000)
    panel = window.history.findings
    window.history.select_ids([off])
    qtbot.waitUntil(lambda: panel.row("prefix_cold") is not None, timeout=30_000)
    assert f"#{off} prefix off" in panel.heading.text()
    window.history.select_ids([on])  # the cache hitting: no prefix finding
    qtbot.waitUntil(lambda: f"#{on} prefix on" in panel.heading.text() and "reading" not in panel.heading.text(),
                    timeout=30_000)
    assert panel.row("prefix_cold") is None and panel.findings
    row = panel.row(panel.findings[0].rule)
    assert row is not None
    window.history.select_ids([off, on])  # two runs: no single run to explain
    assert not panel.isVisible()


def test_compare_says_why_the_second_run_differs_and_presents_it(qtbot, make_window: Callable[..., MainWindow],  # type: ignore[no-untyped-def]
                                                                 tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    off, on = _stored(db, PREFIX_OFF, PREFIX_ON)
    window = make_window(db_path=db)
    window.compare_runs([off, on])
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=30_000)
    why = [label.text() for label in window.compare.card.lines if label.objectName() == "headlineWhy"]
    assert any("prefill did 85% less work" in line for line in why), why
    assert any(f"run {on} differs from run {off}" in line for line in why)
    assert any("->" in line for line in why) and not any("&gt;" in line for line in why), why  # shown as written
    window.present_before_after()
    assert window.presentation.page == "before_after"
    assert "prefill did 85% less work" in window.presentation.before_after.why.text()
    window.toggle_presentation()


def test_the_presentations_finding_sentence_fits_at_every_projector_size(
        qtbot, make_window: Callable[..., MainWindow], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The longest sentences real runs produce (a KV-bound run's warning, the why of a change with
    its configuration) on the live page and the before/after view: nothing cut."""
    db = tmp_path / "runs.db"
    off, on = _stored(db, PREFIX_OFF, PREFIX_ON)
    with RunStore(db) as store:
        kv = store_run(store, KV_FULL)
        warning = headline_finding(stored_findings(store, kv))
        why = top_change(stored_findings(store, on, off))
    assert warning is not None and why is not None
    window = make_window(db_path=db)
    window.presentation.set_heading("kv full", "tunebench:demo \u00b7 8 concurrent", "Features: prefix caching on")
    _longest_figures(window)
    window.presentation.set_finding(warning.explanation)
    qtbot.keyClick(window, Qt.Key.Key_F11)
    window.showNormal()
    presentation = window.presentation
    _fits_at_every_size(qtbot, window, lambda: cut_labels(presentation), tmp_path, "finding")
    window.compare_runs([off, on])
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=30_000)
    window.present_before_after()
    assert presentation.before_after.why.text() == first_sentence(why.explanation)
    _fits_at_every_size(qtbot, window, lambda: cut_labels(presentation), tmp_path, "why")


def test_the_next_runs_findings_replace_the_last_ones_on_screen_at_once(qtbot) -> None:  # type: ignore[no-untyped-def]
    """Pumping events as the screenshot script does (``processEvents``, which never runs deferred
    deletes), the second run's rows alone are on screen: the first's are gone, not only scheduled
    for deletion (they stayed drawn above the new ones)."""
    from PySide6.QtWidgets import QApplication

    from app.analysis.findings import Evidence, Finding
    from app.gui.findings_panel import FindingRow, FindingsPanel

    def finding(rule: str) -> Finding:
        return Finding(rule=rule, severity="warning", confidence="high", suggestion=None, explanation=rule,
                       evidence=[Evidence(figure="x", value=1.0, unit="%", window="level 0")])

    def pump_and_list() -> list[str]:
        for _ in range(5):
            QApplication.processEvents()
        return [row.finding.rule for row in panel.findChildren(FindingRow) if row.isVisible()]

    panel = FindingsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.show_findings([finding("prefix_cold")], "run 1")
    assert pump_and_list() == ["prefix_cold"]
    panel.show_findings([finding("client_limited")], "run 2")
    assert pump_and_list() == ["client_limited"]


def test_the_live_findings_update_during_the_run_from_a_worker(qtbot, make_window: Callable[..., MainWindow],  # type: ignore[no-untyped-def]
                                                              tmp_path: Path) -> None:
    """While a run runs, the Findings panel shows what its engine's samples say so far (a full KV
    cache before the level ends), read again every few seconds in a worker, never on the GUI
    thread; the log stays in front until a new warning comes; a finished run stops the readings."""
    window = make_window(db_path=tmp_path / "runs.db")
    tab, panel = window.live_tab, window.live_tab.findings
    readers: list[bool] = []
    read = tab.live_findings.findings

    def findings_read_off_the_gui_thread() -> list:  # type: ignore[type-arg]
        readers.append(threading.current_thread() is threading.main_thread())
        return read()

    tab.live_findings.findings = findings_read_off_the_gui_thread  # type: ignore[method-assign]
    _summary, samples = KV_FULL.pieces()
    tab.live.started.emit(RunStarted(run_id="live", name=KV_FULL.name, config=KV_FULL.config, engine_kind="vllm",
                                     model=KV_FULL.config.engine.model, hardware=KV_FULL.hardware,
                                     started_wall_s=START_WALL))
    tab.live.level_started.emit(LevelStarted(run_id="live", index=0, label="c=8", mode="closed", concurrency=8,
                                             started_wall_s=START_WALL + 2.0))
    half = len(samples) // 2
    tab.ingest([Sample(s.source, s.t_mono, s.t_wall, s.values) for s in samples[:half]])
    qtbot.waitUntil(lambda: panel.row("kv_bound") is not None, timeout=30_000)  # the QTimer's reading
    assert "so far" in panel.heading.text() and "1 warning(s)" in panel.heading.text()
    assert readers and not any(readers)  # every reading in a worker
    assert window.live_tab.bottom.currentWidget() is panel  # a new warning: in front
    window.live_tab.bottom.setCurrentWidget(window.log_view)
    tab.ingest([Sample(s.source, s.t_mono, s.t_wall, s.values) for s in samples[half:]])
    shown = panel.findings
    qtbot.waitUntil(lambda: panel.findings is not shown, timeout=30_000)  # read again: something new arrived
    assert window.live_tab.bottom.currentWidget() is window.log_view  # the same warning: the log stays
    tab.live.finished.emit(RunFinished(run_id="live", status="completed", ended_wall_s=START_WALL + 30.0))
    assert not tab._live_timer.isActive()
