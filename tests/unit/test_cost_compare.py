"""Cost where customers look (``app.cost`` in ``tunebench compare``, the HTML report and the
ladder's staircase): $ per 1M tokens at each run's measured throughput, pinned to hand-computed
figures, the factor in words (lower cost is better), and runs that cannot be priced shown as
n/a without failing the compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.analysis.compare import compare_runs
from app.cli.ladder_cmds import format_ladder_table, ladder_json
from app.cost import (
    CostFigure,
    RunCost,
    compared_costs,
    cost_factor_text,
    price_table,
    step_costs,
    usd_per_million_tokens,
    usd_text,
)
from app.export import render_report
from app.ladder.state import LadderState, StepRow
from app.load.metrics import LevelSummary, Stats
from app.store import RunStore
from db.records import ImportedRun, LevelInfo
from tests.fuzz.hostile import Outcome, cli
from tests.stored_runs import store_measured_run

GPU_ENGINE = {"model": "meta-llama/Llama-3.1-8B-Instruct", "runtime": {"kind": "executable", "executable": "vllm"}}
H100 = {"gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]}
DEFAULT = "default price, as of 2026-12"


def _summary(tok_per_s: float) -> dict[str, Any]:
    """One level of 1,000 completed requests of 100 output and 50 input tokens: total = 1.5 x output."""
    summary = LevelSummary(requests=1000, completed=1000, duration_s=100.0, output_tok_per_s=tok_per_s,
                           total_tok_per_s=tok_per_s * 1.5, request_throughput_rps=tok_per_s / 100,
                           ttft_ms=Stats(count=1000, mean=50.0, median=50.0, p99=90.0))
    return summary.model_dump(mode="json")


def _store_run(store: RunStore, name: str, config: dict[str, Any], tok_per_s: float,
               hardware: dict[str, Any]) -> int:
    return store_measured_run(store, name, config, [(16, _summary(tok_per_s))], hardware=hardware, level_s=100.0)


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cost.db"
    with RunStore(path) as store:
        _store_run(store, "base", {"engine": GPU_ENGINE}, 1000.0, H100)  # 1
        _store_run(store, "prefix on", {"engine": GPU_ENGINE, "features": {"prefix_caching": True}},
                   3100.0, H100)  # 2
        _store_run(store, "tp2", {"engine": GPU_ENGINE, "features": {"tensor_parallel_size": 2}}, 1400.0, H100)  # 3
        store.import_runs([ImportedRun(name="bench", imported_from="vllm bench serve: x.json", started_at=1.9e9,
                                       finished_at=1.9e9 + 10, config={"imported": {"tool": "vllm bench serve"}},
                                       levels=[LevelInfo(idx=0, summary=_summary(500.0))])])  # 4
        _store_run(store, "rtx", {"engine": GPU_ENGINE}, 250.0,
                   {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090"}]})  # 5
        _store_run(store, "remote", {"engine": GPU_ENGINE}, 800.0, {"cpu_model": "Xeon"})  # 6
    return path


def compare(db: Path, *argv: str) -> Outcome:
    return cli("compare", "--db", str(db), *argv).check()


# --- the figures ----------------------------------------------------------------------------------

def test_each_run_costs_gpus_times_price_over_its_tokens_per_hour(db: Path) -> None:
    with RunStore(db) as store:
        costs = compared_costs(compare_runs(store, [1, 2, 3], series=False), price_table())
    base, prefix, tp2 = costs
    # 1 GPU x 2.49 $/h / (1,000 tok/s x 3600) x 1e6 = 0.691667; total 1,500 tok/s: 0.461111.
    assert base.output.usd == pytest.approx(0.6916667, rel=1e-6)
    assert base.total.usd == pytest.approx(0.4611111, rel=1e-6)
    # 2.49 / (3,100 x 3600) x 1e6 = 0.223118: x3.1 cheaper (0.691667 / 0.223118 = 3.1).
    assert prefix.output.usd == pytest.approx(0.2231183, rel=1e-6)
    # TP 2: 2 GPUs x 2.49 / (1,400 x 3600) x 1e6 = 0.988095: 0.691667 / 0.988095 = 0.7 = 1 / 1.43.
    assert tp2.units == 2 and tp2.output.usd == pytest.approx(0.9880952, rel=1e-6)
    assert base.price is not None and base.price.usd_per_hour == 2.49 and base.price.source == DEFAULT
    assert cost_factor_text(base, prefix) == "x3.1 cheaper"
    assert cost_factor_text(base, tp2) == "x1.4 more expensive"
    assert cost_factor_text(base, base) == "about the same cost"


def test_factor_words_say_lower_is_better() -> None:
    def cost(usd: float | None) -> RunCost:
        return RunCost(1, CostFigure(usd, None if usd else "no throughput was measured"), CostFigure(usd))

    assert cost_factor_text(cost(2.0), cost(1.0)) == "x2.0 cheaper"
    assert cost_factor_text(cost(1.0), cost(1.4)) == "x1.4 more expensive"
    assert cost_factor_text(cost(1.0), cost(1.04)) == "about the same cost"  # within 5%: x1.0 either way
    assert cost_factor_text(cost(1.0), cost(None)) == ""
    assert usd_text(1.8449) == "$1.84" and usd_text(0.0042) == "$0.00420" and usd_text(None) == "-"
    assert [usd_text(x) for x in (0.0114, 0.012, 0.09996, 0.1, 1234.5, 3.2e-7)] == [
        "$0.0114", "$0.0120", "$0.10", "$0.10", "$1,234.50", "$0.000000320"]


# --- tunebench compare ----------------------------------------------------------------------------

def test_compare_shows_cost_per_run_and_the_factor(db: Path) -> None:
    out = compare(db, "1", "2", "3")
    assert out.code == 0, out
    text = out.out
    assert "cost at each run's measured throughput (lower is better" in text
    lines = {line.split()[0]: line for line in text[text.index("cost at each"):].splitlines()[2:5]}
    assert lines["#1"].split()[2:4] == ["$0.69", "$0.46"]  # the baseline: no factor
    assert "$0.22 (x3.1 cheaper)" in lines["#2"] and "1 GPU x 2.49 $/GPU-h (default price, as of 2026-12)" in lines["#2"]
    assert "$0.99 (x1.4 more expensive)" in lines["#3"] and "2 GPUs x 2.49 $/GPU-h" in lines["#3"]


def test_compare_json_adds_a_cost_object_per_run(db: Path) -> None:
    plain = json.loads(compare(db, "1", "2", "--json", "--no-series").out)
    out = compare(db, "1", "2", "--json", "--no-series", "--price", "H100=3.60")
    doc = json.loads(out.out)
    for run, before in zip(doc["runs"], plain["runs"], strict=True):
        assert {k: v for k, v in run.items() if k != "cost"} == {k: v for k, v in before.items() if k != "cost"}
    base, prefix = (r["cost"] for r in doc["runs"])
    # Your price: 3.60 / (1,000 x 3600) x 1e6 = 1.00; total 1,500 tok/s: 0.666667.
    assert base["usd_per_1m_output_tokens"] == pytest.approx(1.0)
    assert base["usd_per_1m_total_tokens"] == pytest.approx(0.6666667, rel=1e-6)
    assert base["price_usd_per_hour"] == 3.6 and base["price_source"] == "your price"
    assert base["units"] == 1 and base["unit"] == "GPU" and base["reason"] is None
    assert prefix["usd_per_1m_output_tokens"] == pytest.approx(1.0 / 3.1)
    assert prefix["factor_vs_baseline"] == pytest.approx(3.1) and prefix["vs_baseline"] == "x3.1 cheaper"
    assert doc["metrics"] == plain["metrics"] and doc["config_diff"] == plain["config_diff"]


def test_runs_that_cannot_be_priced_are_na_and_compare_still_works(db: Path) -> None:
    out = compare(db, "1", "4", "5", "6")
    assert out.code == 0, out
    text = out.out
    assert "#4: cost: n/a (the run was imported from vllm bench serve: x.json: it records no engine" in text
    assert "#5: cost: n/a (no price for the GPU 'NVIDIA GeForce RTX 4090'" in text and "--price" in text
    assert "#6: cost: n/a (the run records no GPU (an engine on another machine?))" in text
    assert [line.split()[:3] for line in text.splitlines() if line.startswith("#4  ")][-1] == ["#4", "n/a", "n/a"]
    assert "headline" in text  # the comparison above is as before
    doc = json.loads(compare(db, "1", "4", "--json", "--no-series").out)
    imported = doc["runs"][1]["cost"]
    assert imported["usd_per_1m_output_tokens"] is None and "imported" in imported["reason"]
    assert imported["vs_baseline"] is None and imported["factor_vs_baseline"] is None


def test_your_price_prices_an_unlisted_gpu_and_an_unused_one_is_named(db: Path) -> None:
    out = compare(db, "1", "5", "--price", "RTX 4090=0.50", "--price", "A10G=0.9")
    assert out.code == 0, out
    # 0.50 / (250 x 3600) x 1e6 = 0.555556 against 0.691667: x1.2 cheaper.
    assert "$0.56 (x1.2 cheaper)" in out.out and "1 GPU x 0.50 $/GPU-h (your price)" in out.out
    assert "the runs ran on different hardware (NVIDIA GeForce RTX 4090, NVIDIA H100 80GB HBM3)" in out.out
    assert "configuration differences:" in out.out  # compare's own wording stays
    assert "--price for A10G priced none of the runs" in out.out


def test_a_bad_price_is_one_line(db: Path) -> None:
    out = compare(db, "1", "2", "--price", "H100=abc")
    assert out.code == 2 and "is not a number" in out.err


# --- the HTML report ------------------------------------------------------------------------------

def test_report_says_the_before_after_in_money(db: Path) -> None:
    with RunStore(db) as store:
        html = render_report(compare_runs(store, [1, 2], baseline=1))
        three = render_report(compare_runs(store, [1, 2, 3], baseline=1))
        na = render_report(compare_runs(store, [1, 4], baseline=1))
    # The label is the headline's (app.headline): vLLM's default for prefix caching is on.
    assert ("prefix caching on (engine default) \u2192 on: 3.1x the throughput per GPU, $0.69 \u2192 $0.22 per 1M output "
            f"tokens ({DEFAULT})") in html
    assert 'class="cost"' not in three  # a line for a baseline and one other run only
    assert "cost n/a (#4: the run was imported" in na


def test_export_html_costs_at_your_price(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = cli("export", "--db", str(db), "1", "2", "--format", "html", "-o", str(out), "--price", "H100=4.98")
    assert done.code == 0 and "Traceback" not in done.err, done
    # 4.98 / (1,000 x 3600) x 1e6 = 1.383; / 3,100 tok/s: 0.446
    assert "$1.38 \u2192 $0.45 per 1M output tokens (your price)" in out.read_text()
    bad = cli("export", "--db", str(db), "1", "2", "--format", "html", "--price", "H100=-3").check()
    assert bad.code == 2 and "must be above 0" in bad.err and len(bad.err.strip().splitlines()) == 1
    assert not (tmp_path / "never.html").exists()
    shown = cli("ladders", "show", "l1", "--db", str(db), "--price", "H100").check()
    assert shown.code == 2 and "expected NAME=USD_PER_HOUR" in shown.err  # refused before the store is read


def test_report_throughput_is_per_gpu() -> None:
    from app.cost import before_after_cost_text

    base = RunCost(1, usd_per_million_tokens(1, 2.49, 1000.0), CostFigure(None), units=1, unit="GPU")
    tp2 = RunCost(2, usd_per_million_tokens(2, 2.49, 1400.0), CostFigure(None), units=2, unit="GPU")
    # 1,400 tok/s on 2 GPUs = 700 per GPU against 1,000: 0.7x; $0.69 -> $0.99.
    assert before_after_cost_text("TP 1 \u2192 2", base, tp2, 1000.0, 1400.0).startswith(
        "TP 1 \u2192 2: 0.7x the throughput per GPU, $0.69 \u2192 $0.99 per 1M output tokens")


# --- the ladder's staircase -----------------------------------------------------------------------

def test_ladder_table_has_a_cost_column_from_each_steps_run(db: Path) -> None:
    state = LadderState(ladder_id="l1", name="l", started_wall_s=1.9e9, rows=[
        StepRow(index=0, name="baseline", status="completed", run_ids=[1], output_tok_per_s=1000.0,
                total_tok_per_s=1500.0),
        StepRow(index=1, name="+ prefix caching", status="completed", run_ids=[2], output_tok_per_s=3100.0,
                total_tok_per_s=4650.0),
        StepRow(index=2, name="+ imported", status="completed", run_ids=[4], output_tok_per_s=500.0),
        StepRow(index=3, name="+ spec decode", status="skipped", reason="no draft model")])
    with RunStore(db) as store:
        costs = step_costs(store, state, price_table())
    assert set(costs) == {0, 1, 2}
    assert costs[0].output.usd == pytest.approx(0.6916667, rel=1e-6)
    assert costs[1].output.usd == pytest.approx(0.2231183, rel=1e-6)
    table = format_ladder_table(state, costs)
    lines = table.splitlines()
    assert lines[0].rstrip().endswith("$/1M out")
    assert lines[2].rstrip().endswith("$0.69") and lines[3].rstrip().endswith("$0.22")
    assert lines[4].rstrip().endswith("n/a") and lines[5].rstrip().endswith("-")
    assert "$/1M out: per 1M output tokens at the step's throughput, 1 GPU x 2.49 $/GPU-h (default price" in table
    assert "3. + imported: cost n/a (the run was imported" in table
    assert "$/1M out" not in format_ladder_table(state)  # without costs: the table as before
    rows = ladder_json(state, costs)["rows"]  # `ladders show --json` and `ladder --json FILE`
    assert rows[1]["cost"]["usd_per_1m_output_tokens"] == pytest.approx(0.2231183, rel=1e-6)
    assert rows[1]["cost"]["price_source"] == "default price, as of 2026-12"
    assert rows[2]["cost"]["usd_per_1m_output_tokens"] is None and "imported" in rows[2]["cost"]["reason"]
    assert rows[3]["cost"] is None and rows[3]["name"] == "+ spec decode"  # the step's own keys unchanged
    from app.export.ladder_report import render_ladder_report

    html = render_ladder_report(state, costs=costs)  # `ladders report` and the Ladder tab's report
    assert "<th>$ / 1M output tokens</th>" in html and "<td>$0.69</td>" in html and "<td>$0.22</td>" in html
    assert "at the step's output tok/s, 1 GPU x 2.49 $/GPU-h (default price, as of 2026-12)" in html
    assert "n/a (the run was imported" in html
    assert "$ / 1M output tokens" not in render_ladder_report(state)  # nothing stored to price: no column
