"""Cost at goodput: $ per 1M output tokens of the requests that met an SLO, in compare (``--slo``,
or the SLO the runs were measured under), per tune trial (the tune's SLO) and per ladder step (the
steps' SLO, pooled over a repeated step's runs), hand-counted from the stored requests; and their
cost columns in the CLI tables, the JSON and the HTML reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.analysis.compare import compare_runs, single_run_comparison
from app.cli.ladder_cmds import format_ladder_table, ladder_json
from app.cli.tune_cmds import format_table
from app.cost import COST_COLUMNS, price_table, step_costs, trial_costs, usd_text
from app.export.ladder_report import render_ladder_report
from app.export.report import render_report
from app.export.tune_report import COLUMNS, render_tune_report, trial_table
from app.ladder.state import LadderState, StepRow
from app.store import RunStore
from app.tuner.state import Trial, TuneState
from tests.fuzz.hostile import Outcome, cli
from tests.unit.test_cost_capacity import _requests_run

PRICE = 2.49  # the shipped H100 price
RUN_SLO = "ttft_ms<=400"


def _good_and_all(records: list[Any], ttft_limit_ms: float, tpot_limit_ms: float | None = None) -> tuple[int, int]:
    """Output tokens of the completed requests under the bounds and of all completed ones, counted
    here one by one (TPOT = (E2E - TTFT) / (tokens - 1), 0 for a one-token output)."""
    good = total = 0
    for r in records:
        if not r.ok:
            continue
        total += r.output_tokens
        tpot = (r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        if r.ttft_ms <= ttft_limit_ms and (tpot_limit_ms is None or tpot <= tpot_limit_ms):
            good += r.output_tokens
    return good, total


@pytest.fixture()
def runs(tmp_path: Path) -> tuple[Path, list[Any]]:
    path = tmp_path / "good.db"
    with RunStore(path) as store:
        run_id, records = _requests_run(store, RUN_SLO)
        second, _ = _requests_run(store, RUN_SLO)  # the same requests again: the same costs
    assert (run_id, second) == (1, 2)
    return path, records


def compare(db: Path, *argv: str) -> Outcome:
    return cli("compare", "--db", str(db), *argv).check()


def test_compare_prices_good_output_under_the_slo_asked(runs: tuple[Path, list[Any]]) -> None:
    db, records = runs
    doc = json.loads(compare(db, "1", "2", "--json", "--no-series", "--slo", "ttft_ms<=600,tpot_ms<=30").out)
    cost = doc["runs"][0]["cost"]
    good, total = _good_and_all(records, 600, 30)
    assert 0 < good < total
    assert cost["good_slo"] == "ttft_ms<=600,tpot_ms<=30"
    assert cost["usd_per_1m_good_output_tokens"] == pytest.approx(cost["usd_per_1m_output_tokens"] * total / good)
    text = compare(db, "1", "2", "--slo", "ttft_ms<=600,tpot_ms<=30").out
    header = next(line for line in text.splitlines() if line.startswith("RUN"))
    assert "$/1M GOOD OUTPUT" in header
    expected = cost["usd_per_1m_output_tokens"] * total / good
    assert f"${expected:,.2f}" in text
    assert "good output: the output tokens of the requests that met your SLO 'ttft_ms<=600,tpot_ms<=30'" in text


def test_compare_uses_the_runs_own_slo_and_says_whose(runs: tuple[Path, list[Any]]) -> None:
    db, records = runs
    doc = json.loads(compare(db, "1", "2", "--json", "--no-series").out)
    good, total = _good_and_all(records, 400)
    for run in doc["runs"]:
        assert run["cost"]["good_slo"] == RUN_SLO
        assert run["cost"]["usd_per_1m_good_output_tokens"] == pytest.approx(
            run["cost"]["usd_per_1m_output_tokens"] * total / good)
    assert "met the runs' SLO 'ttft_ms<=400'" in compare(db, "1", "2").out


def test_good_output_that_cannot_be_priced_says_why(runs: tuple[Path, list[Any]]) -> None:
    db, _records = runs
    never = compare(db, "1", "2", "--slo", "ttft_ms<=1")
    assert never.code == 0 and "#1 (base): good-output cost: n/a (no request met the SLO)" in never.out
    queue = compare(db, "1", "2", "--slo", "queue_ms<=100")
    assert queue.code == 0 and "queue_ms is not stored per request" in queue.out
    bad = compare(db, "1", "2", "--slo", "ttft<=5")
    assert bad.code == 2 and bad.err.count("\n") == 1 and "--slo" in bad.err


def test_compare_without_any_slo_prices_no_good_output(tmp_path: Path) -> None:
    from tests.unit.test_cost_compare import GPU_ENGINE, H100, _store_run

    path = tmp_path / "plain.db"
    with RunStore(path) as store:
        _store_run(store, "a", {"engine": GPU_ENGINE}, 1000.0, H100)
        _store_run(store, "b", {"engine": GPU_ENGINE}, 2000.0, H100)
    out = compare(path, "1", "2")
    assert "$/1M GOOD OUTPUT" not in out.out
    assert "good output not priced: the runs were measured without an SLO: pass --slo" in out.out
    doc = json.loads(compare(path, "1", "2", "--json", "--no-series").out)
    assert doc["runs"][0]["cost"]["usd_per_1m_good_output_tokens"] is None


def _tune(run_ids: list[int | None], tok_per_s: list[float], slo: str = "ttft_ms<=600,tpot_ms<=30") -> TuneState:
    trials = [Trial(index=i, candidate=0, status="passed" if run_id else "pending", run_id=run_id, load_value=8,
                    label="max seqs 8", figures={"output_tok_per_s": tok, "total_tok_per_s": tok * 2})
              for i, (run_id, tok) in enumerate(zip(run_ids, tok_per_s, strict=True))]
    return TuneState(tune_id="t1", name="t", slo=slo, trials=trials)


def test_each_trial_costs_its_gpus_over_its_throughput_and_its_good_share(runs: tuple[Path, list[Any]]) -> None:
    db, records = runs
    state = _tune([1, 2, None], [1000.0, 2000.0, 0.0])
    with RunStore(db) as store:
        costs = trial_costs(store, state, price_table())
    assert set(costs) == {0, 1}  # the pending trial is not priced
    # 1 H100 x 2.49 $/h / (1,000 tok/s x 3600) x 1e6 = 0.691667; twice the throughput, half the cost.
    assert costs[0].output.usd == pytest.approx(PRICE / 3600 / 1000 * 1e6)
    assert costs[0].total.usd == pytest.approx(PRICE / 3600 / 2000 * 1e6)
    assert costs[1].output.usd == pytest.approx(costs[0].output.usd / 2)
    good, total = _good_and_all(records, 600, 30)
    assert costs[0].good_output is not None and costs[0].good_output.usd == pytest.approx(
        costs[0].output.usd * total / good)
    rows = trial_table(state, costs)
    assert rows[0]["$/1M out"] == "$0.69" and rows[1]["$/1M out"] == "$0.35"
    assert rows[0]["$/1M good"] == f"${costs[0].output.usd * total / good:,.2f}"
    assert rows[2]["$/1M out"] == "\u2013"
    table = format_table(state, costs)
    header = table.splitlines()[0]
    assert "$/1M out" in header and "$/1M good" in header and header.index("$/1M good") < header.index("engine")
    assert "costs at 1 GPU x 2.49 $/GPU-h (default price, as of 2026-12); $/1M good: per 1M output tokens of the " \
           "requests that met ttft_ms<=600,tpot_ms<=30 (lower is better)" in table
    assert "$/1M" not in format_table(state)  # nothing priced (no store): the table as before
    html = render_tune_report(state, costs=costs)
    assert all(f"<th>{c}</th>" in html for c in COLUMNS)
    assert ">$0.69</td>" in html and "costs at 1 GPU x 2.49 $/GPU-h" in html


def test_a_trial_whose_run_was_deleted_is_left_unpriced(runs: tuple[Path, list[Any]]) -> None:
    db, _records = runs
    state = _tune([1, 99], [1000.0, 1000.0])
    with RunStore(db) as store:
        costs = trial_costs(store, state, price_table(["H100=3.60"]))
    assert set(costs) == {0} and costs[0].output.usd == pytest.approx(1.0)  # 3.60 / (1,000 x 3600) x 1e6


def test_tunes_show_and_report_refuse_a_bad_price_in_one_line(tmp_path: Path) -> None:
    for argv in (("tunes", "show", "t1"), ("tunes", "report", "t1", "-o", str(tmp_path / "t.html")),
                 ("ladders", "report", "l1", "-o", str(tmp_path / "l.html"))):
        out = cli(*argv, "--db", str(tmp_path / "none.db"), "--price", "H100=-1").check()
        assert out.code == 2 and "--price 'H100': the price must be above 0" in out.err and out.err.count("\n") == 1, out
    assert not (tmp_path / "none.db").exists()  # refused before the store was opened


def _ladder(step_runs: list[list[int]], tok_per_s: list[float]) -> LadderState:
    return LadderState(ladder_id="l1", name="l", started_wall_s=1.9e9, rows=[
        StepRow(index=i, name=f"step {i}", status="completed", run_ids=ids, output_tok_per_s=tok,
                total_tok_per_s=tok * 2) for i, (ids, tok) in enumerate(zip(step_runs, tok_per_s, strict=True))])


def test_each_ladder_step_is_priced_at_goodput_pooled_over_its_runs(runs: tuple[Path, list[Any]]) -> None:
    db, records = runs
    with RunStore(db) as store:
        third, other = _requests_run(store, RUN_SLO, seed=8)  # a repeat whose requests differ
        state = _ladder([[1], [2, third]], [1000.0, 2000.0])
        costs = step_costs(store, state, price_table())
    good, total = _good_and_all(records, 400)
    good_other, total_other = _good_and_all(other, 400)
    assert 0 < good < total and (good_other, total_other) != (good, total)
    assert costs[0].good_slo == RUN_SLO  # the SLO every step was measured under
    assert costs[0].good_output is not None and costs[0].good_output.usd == pytest.approx(
        PRICE / 3600 / 1000 * 1e6 * total / good)
    pooled = (good + good_other) / (total + total_other)  # the repeated step's share, request by request
    assert costs[1].good_output is not None and costs[1].good_output.usd == pytest.approx(
        PRICE / 3600 / 2000 * 1e6 / pooled)
    table = format_ladder_table(state, costs)
    lines = table.splitlines()
    assert lines[0].split()[-4:] == ["$/1M", "out", "$/1M", "good"]
    assert lines[2].split()[-2:] == ["$0.69", usd_text(costs[0].good_output.usd)]
    assert "$/1M good: per 1M output tokens of the requests that met the steps' SLO 'ttft_ms<=400'" in table
    html = render_ladder_report(state, costs=costs)
    assert "<th>$ / 1M good output tokens</th>" in html and f"<td>{usd_text(costs[1].good_output.usd)}</td>" in html
    assert "requests that met the steps&#39; SLO 'ttft_ms&lt;=400'" in html
    assert ladder_json(state, costs)["rows"][1]["cost"]["usd_per_1m_good_output_tokens"] == pytest.approx(
        costs[1].good_output.usd)


def test_ladder_steps_under_different_slos_or_none_get_no_good_column(runs: tuple[Path, list[Any]]) -> None:
    db, _records = runs
    with RunStore(db) as store:
        other_slo, _ = _requests_run(store, "ttft_ms<=600")
        mixed = step_costs(store, _ladder([[1], [other_slo]], [1000.0, 1000.0]), price_table())
        never = step_costs(store, _ladder([[1]], [1000.0]), price_table(), slo="ttft_ms<=1")
    assert all(c.good_output is None for c in mixed.values())
    assert "$/1M good" not in format_ladder_table(_ladder([[1], [other_slo]], [1000.0, 1000.0]), mixed)
    assert never[0].good_output is not None and never[0].good_output.reason == "no request met the SLO"
    table = format_ladder_table(_ladder([[1]], [1000.0]), never)
    assert "1. step 0: good-output cost n/a (no request met the SLO)" in table


def test_the_compare_report_has_every_runs_cost_with_its_good_output(runs: tuple[Path, list[Any]]) -> None:
    db, records = runs
    with RunStore(db) as store:
        comparison = compare_runs(store, [1, 2], baseline=1)
        html = render_report(comparison, store=store)
        unstored = render_report(comparison)
        alone = render_report(single_run_comparison(store, 1), store=store)
    good, total = _good_and_all(records, 400)
    output_usd = PRICE / 3600 / comparison.metric("output_tok_per_s").values[0] * 1e6
    assert all(f"<th>{c}</th>" in html for c in COST_COLUMNS)
    assert f"<td>{usd_text(output_usd)}</td>" in html and f"<td>{usd_text(output_usd * total / good)}</td>" in html
    assert "Good output: the requests that met the runs&#39; SLO &#39;ttft_ms&lt;=400&#39;." in html
    assert "Prices: default price, as of 2026-12." in html
    assert f"<td>{usd_text(output_usd * total / good)}</td>" not in unstored  # no requests to count: a dash
    assert "<th>vs baseline</th>" not in alone and "<th>$ / 1M good output tok</th>" in alone


def _store_ladder(store: RunStore, state: LadderState) -> None:
    """``state`` as a ladder run stores it: each step's runs tagged with the ladder and the step,
    the state as the ladder's campaign (what ``app.ladder.stored`` reads back)."""
    from app.ladder.stored import save_ladder

    for row in state.rows:
        for run_id in row.run_ids:
            store.tag(run_id, add=[f"ladder:{state.ladder_id}", f"repeat:{state.ladder_id}-{row.index}"])
    save_ladder(store, state)


def test_ladders_show_and_report_price_good_output_under_the_slo_asked(runs: tuple[Path, list[Any]],
                                                                       tmp_path: Path) -> None:
    db, records = runs
    state = _ladder([[1], [2]], [1000.0, 2000.0])
    state.status = "completed"
    with RunStore(db) as store:
        _store_ladder(store, state)
    good, total = _good_and_all(records, 600)
    own_good, _total = _good_and_all(records, 400)
    assert own_good < good < total  # the SLO asked counts other requests than the steps' own
    shown = cli("ladders", "show", "l1", "--db", str(db), "--slo", "ttft_ms<=600").check()
    assert shown.code == 0, shown
    step_2 = next(line for line in shown.out.splitlines() if line.startswith("2. step 1"))
    assert step_2.split()[-2:] == [usd_text(PRICE / 3600 / 2000 * 1e6), usd_text(PRICE / 3600 / 2000 * 1e6 * total / good)]
    assert "$/1M good: per 1M output tokens of the requests that met your SLO 'ttft_ms<=600'" in shown.out
    as_json = json.loads(cli("ladders", "show", "l1", "--db", str(db), "--slo", "ttft_ms<=600", "--json").check().out)
    assert as_json["rows"][0]["cost"]["usd_per_1m_good_output_tokens"] == pytest.approx(
        PRICE / 3600 / 1000 * 1e6 * total / good)
    own = cli("ladders", "show", "l1", "--db", str(db)).check()
    assert "requests that met the steps' SLO 'ttft_ms<=400'" in own.out
    html = tmp_path / "l.html"
    wrote = cli("ladders", "report", "l1", "--db", str(db), "--slo", "ttft_ms<=600", "-o", str(html))
    assert wrote.code == 0 and wrote.err == f"wrote {html}\n", wrote
    text = html.read_text()
    assert "requests that met your SLO 'ttft_ms&lt;=600'" in text
    assert f"<td>{usd_text(PRICE / 3600 / 2000 * 1e6 * total / good)}</td>" in text


def test_ladders_show_and_report_refuse_a_bad_slo_in_one_line(tmp_path: Path) -> None:
    for argv in (("ladders", "show", "l1"), ("ladders", "report", "l1", "-o", str(tmp_path / "l.html"))):
        out = cli(*argv, "--db", str(tmp_path / "none.db"), "--slo", "ttft_ms<=soon").check()
        assert out.code == 2 and out.err.startswith("tunebench: error: --slo: SLO 'ttft_ms<=soon'") and out.err.count("\n") == 1, out
    assert not (tmp_path / "none.db").exists()  # refused before the store was opened
