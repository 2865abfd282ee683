"""Campaigns explained with their runs' findings (``app.campaign_findings``, ``tunebench explain
--ladder/--tune``): a ladder step's factor with why its run differs from the previous step's, and
a tune's pick and why each rejected trial failed. The runs are those of tests/unit/test_findings.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.campaign_findings import explain_ladder, explain_tune
from app.cli import main
from app.ladder.state import LadderState, StepRow
from app.ladder.stored import save_ladder
from app.store import RunStore
from app.tuner.state import Pick, Trial, TuneState
from tests.unit.test_findings import SHARED, Engine, Recorded, llama_config, store_run

PREFIX_OFF = Recorded(llama_config(prefix_caching=False, workload=SHARED), Engine(hit_ratio=0.0), name="prefix off")
PREFIX_ON = Recorded(llama_config(prefix_caching=True, workload=SHARED), Engine(hit_ratio=0.85), name="prefix on")
KV_FULL = Recorded(llama_config(), Engine(kv_full_pct=97.0, waiting=12.0, preempt_per_s=0.5), name="kv full")


def _ladder(off: int, on: int) -> LadderState:
    return LadderState(ladder_id="lad-1", name="prefix ladder", started_wall_s=1.9e9, status="completed", rows=[
        StepRow(index=0, name="baseline", status="completed", run_ids=[off], output_tok_per_s=1000.0),
        StepRow(index=1, name="prefix caching", change="prefix caching off -> on", status="completed",
                run_ids=[on], output_tok_per_s=1500.0, factor_previous=1.5),
        StepRow(index=2, name="fp8", status="skipped", reason="this CPU cannot keep the KV cache in FP8"),
    ])


def test_a_ladder_step_says_why_it_moved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    with RunStore(db) as store:
        off, on = store_run(store, PREFIX_OFF), store_run(store, PREFIX_ON)
        state = _ladder(off, on)
        steps = explain_ladder(store, state)
        save_ladder(store, state)
    baseline, prefix, skipped = steps
    assert baseline.figure == "1,000 tok/s, baseline" and not baseline.why
    assert [f.rule for f in baseline.warnings] == ["prefix_cold"]  # the baseline's own run, explained
    assert prefix.figure == "1,500 tok/s, x1.50 over the previous step" and prefix.run_id == on
    assert prefix.why[0].startswith(f"Why run {on} differs from run {off}: features.prefix_caching False -> True")
    assert prefix.why[1].startswith("prefix hits 0.00 -> 0.85: prefill did 85% less work")
    assert not prefix.warnings
    assert skipped.run_id is None and skipped.figure == "skipped" and "FP8" in (skipped.reason or "")
    assert main(["explain", "--ladder", "lad-1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ladder lad-1 (prefix ladder): each step's factor and why")
    assert f"step 2 prefix caching (prefix caching off -> on): 1,500 tok/s, x1.50 over the previous step (run {on})" \
        in out
    assert "    -> prefix hits 0.00 -> 0.85: prefill did 85% less work" in out
    assert "  [warning] prefix_cold: Prefix hits were near 0 though the workload shares prefixes" in out


def test_a_tune_explains_its_pick_and_each_rejected_trial(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        picked, full = store_run(store, PREFIX_ON), store_run(store, KV_FULL)
        state = TuneState(tune_id="tune-1", name="tune", trials=[
            Trial(index=0, candidate=0, label="c=8", load_value=8, status="passed", run_id=picked),
            Trial(index=1, candidate=0, label="c=16", load_value=16, status="failed", run_id=full,
                  reason="TTFT p99 2,400 ms > 500 ms"),
            Trial(index=2, candidate=1, label="fp8", load_value=8, status="error", reason="the engine did not start"),
        ], pick=Pick(candidate=0, trial=0, label="c=8", load_label="concurrency 8", run_id=picked,
                     tok_s_per_gpu=1234.0, binding="TTFT p99 at concurrency 16"))
        pick, rejected = explain_tune(store, state)
    assert pick is not None and pick.run_id == picked and pick.figure == "1,234 tok/s per GPU"
    assert pick.title == "pick: c=8 at concurrency 8" and "TTFT p99 at concurrency 16" in (pick.reason or "")
    assert not pick.warnings
    assert [r.run_id for r in rejected] == [full, None]  # the passed trial is not rejected
    kv = rejected[0]
    assert kv.figure == "failed" and kv.reason == "TTFT p99 2,400 ms > 500 ms"
    assert "kv_bound" in [f.rule for f in kv.warnings]  # why it failed: the KV cache was full
    assert rejected[1].reason == "the engine did not start" and not rejected[1].warnings
