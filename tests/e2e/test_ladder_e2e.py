"""The acceleration ladder on the real vLLM CPU engine (profile cpu-ladder): every step runs (or,
on a CPU without AVX-512 or AMX, the FP8 KV step is skipped with its reason), is verified in the
engine, stored as one group with its staircase and factors; the load-only step reuses the engine.
And ``tunebench ladder`` killed with SIGKILL after its first step: that step stays stored, the
ladder reads back interrupted, and no engine is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main
from app.cost import default_prices, price_table, step_costs
from app.ladder.stored import list_ladders
from app.store import RunStore
from db import campaign_store
from engine_adapters.hardware import probe_hardware
from engine_adapters.launcher import registered_engines
from tests.e2e.cli_io import read_until, sigkill_and_check_engine_stops

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_cpu_ladder_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, out = tmp_path / "runs.db", tmp_path / "ladder.json"
    ours_before = {e.pid for e in registered_engines() if e.owner_pid == os.getpid()}  # the session's shared engines
    started = time.monotonic()
    code = main(["ladder", "cpu-ladder", "--db", str(db), "--json", str(out)])
    elapsed_s = time.monotonic() - started
    text = capsys.readouterr().out
    assert code == 0, text[-3000:]
    print(f"\ncpu-ladder: {elapsed_s:.0f} s\n" + text[text.index("step  "):] if "step  " in text else text[-2000:])
    state = json.loads(out.read_text())["ladder"]
    rows = state["rows"]
    assert [r["name"] for r in rows] == ["baseline", "+ continuous batching", "+ FP8 KV cache", "+ prefix caching"]
    fp8_here = probe_hardware().cpu_has_avx512_or_amx
    ran = [r for r in rows if r["status"] == "completed"]
    if fp8_here:
        assert len(ran) == 4, [(r["name"], r["status"], r["reason"]) for r in rows]
    else:  # the branch the CPU dictates: skipped with the reason, and the ladder goes on
        assert rows[2]["status"] == "skipped" and "AVX-512" in rows[2]["reason"]
        assert [r["status"] for r in rows[:2] + rows[3:]] == ["completed"] * 3
    for row in ran:
        assert row["verification"] == "verified", (row["name"], row["checks"])
        assert row["output_tok_per_s"] > 0 and row["total_tok_per_s"] > row["output_tok_per_s"]
        assert row["ttft_ms"] is not None and row["itl_ms"] is not None
        assert row["ceiling_tok_per_s"] and (row["percent_of_limit"] is not None or row["ceiling_note"]), row
        assert len(row["run_ids"]) == 1
    assert [c["status"] for c in rows[1]["checks"]][-1] == "verified"  # the engine really ran bigger batches
    # Fair by construction: prefix caching off (and every level cold) until the prefix step.
    assert all((r["prefix_cache_hit_rate"] or 0.0) == 0.0 for r in ran[:-1])
    assert ran[-1]["prefix_cache_hit_rate"] > 0.25  # the shared prefix reused within the level
    # Load-only steps add no engine restart; each engine-flag change relaunches.
    assert rows[1]["engine_reused"] is True and rows[1]["startup_s"] is None
    assert [r["engine_reused"] for r in ran if r["index"] != 1] == [False] * (len(ran) - 1)
    assert state["engine_launches"] == len(ran) - 1
    # The staircase and its factors are stored with the runs, as one group.
    assert ran[0]["factor_baseline"] == pytest.approx(1.0)
    for before, row in zip(ran, ran[1:], strict=False):
        assert row["factor_previous"] == pytest.approx(row["output_tok_per_s"] / before["output_tok_per_s"])
        assert row["loss"] == (row["factor_previous"] < 1.0)
    with RunStore(db) as store:
        stored = list_ladders(store)
        assert len(stored) == 1 and stored[0].state.status == "completed"
        assert stored[0].state.rows[1].factor_baseline == pytest.approx(rows[1]["factor_baseline"])
        runs = [store.get_run(i) for i in stored[0].run_ids]
        assert all(f"ladder:{state['ladder_id']}" in r.tags and r.status == "completed" for r in runs)
        campaign = campaign_store.get_campaign(store, state["ladder_id"])
        assert campaign.status == "completed" and [link.run_id for link in campaign.links] == stored[0].run_ids
        # (read from the store: the --json file masks what this process was told is secret)
        checks = {c.feature: c for r in stored[0].state.rows if r.index in (1, 2) for c in r.checks}
        assert checks["load.concurrency"].status == "verified" and "tokens per step" in checks["load.concurrency"].evidence
        if fp8_here:
            assert checks["kv_cache_dtype"].status == "verified"  # twice the tokens in the same KV memory
        # $ per 1M output tokens per step = price x cores / (tok/s x 3600) x 1e6: on one machine's
        # cores, the cost ratio between steps is exactly the inverse throughput ratio.
        costs, price = step_costs(store, stored[0].state, price_table()), default_prices().cpu().usd_per_hour
        steps = [(r.name, r.output_tok_per_s, costs[r.index]) for r in stored[0].state.rows if r.status == "completed"]
        figures = [(tok_per_s, cost.units, cost.output.usd) for _name, tok_per_s, cost in steps]
        assert all(t and u and usd for t, u, usd in figures), steps
        for tok_per_s, units, usd in figures:
            assert usd == pytest.approx(price * units / (tok_per_s * 3600) * 1e6), steps  # type: ignore[operator]
        assert len({units for _t, units, _usd in figures}) == 1, steps  # one machine's cores
        for (tok_a, _ua, usd_a), (tok_b, _ub, usd_b) in zip(figures, figures[1:], strict=False):
            assert usd_b / usd_a == pytest.approx(tok_a / tok_b)  # type: ignore[operator]
    assert "$/1M out" in text  # the staircase printed its cost column
    assert not [e for e in registered_engines() if e.owner_pid == os.getpid() and e.pid not in ours_before], \
        "an engine outlived the ladder"
    report = tmp_path / "ladder.html"
    assert main(["ladders", "report", state["ladder_id"], "--db", str(db), "-o", str(report)]) == 0
    assert "+ prefix caching" in report.read_text() and "--enable-prefix-caching" in report.read_text()
    assert "<th>$ / 1M output tokens</th>" in report.read_text()  # priced from the stored runs


def test_sigkill_after_the_first_step_keeps_it_and_leaves_no_engine(tmp_path: Path) -> None:
    db = tmp_path / "killed.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "ladder", "cpu-ladder", "--db", str(db)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        read_until(proc, r"step 1/4 'baseline': [\d,]+ output tok/s", 600)
        engines = [e for e in registered_engines() if e.owner_pid == proc.pid]
        assert len(engines) == 1, engines  # kept for the next (load-only) step
        sigkill_and_check_engine_stops(proc, engines[0].pid, "ladder")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    with RunStore(db) as store:  # opening marks the run the process left "running" interrupted
        (ladder,) = list_ladders(store)
        state = ladder.state
        assert state.status == "interrupted" and "ended before the ladder finished" in (state.reason or "")
        first = state.rows[0]
        assert first.status == "completed" and first.output_tok_per_s and len(first.run_ids) == 1
        assert store.get_run(first.run_ids[0]).status == "completed"
        assert [r.status for r in state.rows[1:]] in (["interrupted", "pending", "pending"],
                                                      ["pending", "pending", "pending"])
    with RunStore(db) as store:  # marked once: read again, it stays interrupted without a live writer
        (again,) = list_ladders(store, mark_interrupted=False)
        assert again.state.status == "interrupted" and again.state.revision == state.revision
    listed = subprocess.run([sys.executable, "-m", "app.cli", "ladders", "list", "--db", str(db)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "interrupted" in listed.stdout, listed.stdout + listed.stderr
