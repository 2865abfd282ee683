"""Compare never shows a client figure its run flagged unreliable as if it were true: the issue's
demo (prefix caching off -> on; the engine's TTFT fell 91.2 -> 19.7 ms while a starved client saw
121 -> 173 ms, "+42.6%" in red, and an ITL p50 of 0 as "better, -100%")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.analysis.compare import compare_runs
from app.cli import main
from app.export import render_report
from app.load.aggregate import summarize
from app.load.metrics import EngineDeltas, RequestRecord
from app.store import RunStore


def _store_run(store: RunStore, name: str, *, prefix: bool, client_ttft_ms: float, itl_ms: float, lag_ms: float,
               engine_ttft_ms: float) -> int:
    """One stored one-level run, recorded as the runner records it (requests and level summary)."""
    records = [RequestRecord(level=0, index=i, scheduled_s=0.2 * i, start_s=0.2 * i, start_wall_s=1.9e9 + 0.2 * i,
                             queue_ms=0.1, ttft_ms=client_ttft_ms + i, itl_ms=[itl_ms] * 15,
                             tpot_ms=itl_ms, e2e_ms=client_ttft_ms + i + 15 * itl_ms, input_tokens=600,
                             output_tokens=16, ok=True) for i in range(12)]
    engine = EngineDeltas(generation_tokens=192.0, requests_finished=12.0, engine_ttft_ms_mean=engine_ttft_ms,
                          engine_itl_ms_mean=12.0, engine_e2e_ms_mean=engine_ttft_ms + 180.0,
                          prefix_cache_queries=7200.0, prefix_cache_hits=6000.0 if prefix else 0.0,
                          prefix_cache_hit_rate=6000 / 7200 if prefix else 0.0)
    summary = summarize(records, 4.0, engine=engine, client_lag_ms=[lag_ms] * 50)
    run_id = store.create_run(name=name, engine_kind="vllm", model="tunebench:demo", started_at=1.9e9, t0_mono=0.0,
                              config={"name": name, "features": {"prefix_caching": prefix}})
    store.write_batch(run_id, requests=[r.model_dump(mode="json") for r in records])
    store.start_level(run_id, 0, "concurrency 4", {}, 1.9e9)
    store.finish_level(run_id, 0, summary.model_dump(mode="json"), 1.9e9 + 4.0)
    store.finish_run(run_id, "completed", None, {}, 1.9e9 + 5.0)
    return run_id


def store_prefix_demo(path: Path) -> tuple[int, int]:
    """The issue's demo pair: prefix caching off, then on with a starved client (900 ms lag)."""
    with RunStore(path) as store:
        off = _store_run(store, "prefix off", prefix=False, client_ttft_ms=121.0, itl_ms=12.0, lag_ms=3.0,
                         engine_ttft_ms=91.2)
        on = _store_run(store, "prefix on", prefix=True, client_ttft_ms=173.0, itl_ms=0.0, lag_ms=900.0,
                        engine_ttft_ms=19.7)
    return off, on


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, int, int]:
    path = tmp_path / "runs.db"
    off, on = store_prefix_demo(path)
    return path, off, on


def test_the_engine_figure_leads_and_the_starved_client_figure_is_never_judged(demo: tuple[Path, int, int]) -> None:
    path, off, on = demo
    with RunStore(path) as store:
        c = compare_runs(store, [off, on], series=False)
    names = [m.name for m in c.headline()]
    assert names.index("engine_ttft_ms_mean") < names.index("ttft_ms_p50")  # the reliable figure leads
    engine = c.metric("engine_ttft_ms_mean")
    assert engine is not None and engine.values == [91.2, 19.7] and engine.verdict(1) == "better"
    assert engine.change(1) == "-78%" and engine.label == "TTFT mean (engine)"
    ttft = c.metric("ttft_ms_p50")
    assert ttft is not None and ttft.unreliable[0] is None and "starved" in (ttft.unreliable[1] or "")
    assert ttft.verdict(1) == "unreliable"  # not "worse, +43%"
    itl = c.metric("itl_ms_p50")
    assert itl is not None and itl.values[1] == 0.0 and itl.verdict(1) == "unreliable"  # not "better, -100%"
    hit = c.metric("prefix_cache_hit_rate")
    assert hit is not None and hit.verdict(1) == "better"
    # charts draw the engine's figures in place of the flagged client ones
    assert [m.name for m in c.chart_metrics()] == ["output_tok_per_s", "engine_ttft_ms_mean", "engine_itl_ms_mean"]
    row = next(r for r in c.rows() if r["key"] == "ttft_ms_p50")
    assert row["cells"][1]["cls"] == "unreliable" and "starved" in row["cells"][1]["note"]


def test_cli_compare_and_report_grey_the_unreliable_figure(demo: tuple[Path, int, int],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, off, on = demo
    assert main(["compare", str(off), str(on), "--db", str(path)]) == 0
    out = capsys.readouterr().out
    ttft_line = next(line for line in out.splitlines() if line.startswith("TTFT p50"))
    assert "unreliable [" in ttft_line and "worse" not in ttft_line
    engine_line = next(line for line in out.splitlines() if line.startswith("TTFT mean (engine)"))
    assert "19.7 (-78% better)" in engine_line
    itl_line = next(line for line in out.splitlines() if line.startswith("ITL p50"))
    assert itl_line.endswith("0.00 (unreliable [1])") and "-100%" not in itl_line
    assert "client starved of CPU" in out
    assert main(["compare", str(off), str(on), "--db", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ttft = next(m for m in data["metrics"] if m["name"] == "ttft_ms_p50")
    assert ttft["verdict"][1] == "unreliable" and ttft["label"] == "TTFT p50" and ttft["direction"] == "lower"
    with RunStore(path) as store:
        html = render_report(compare_runs(store, [off, on]))
    cell = html.split('title="ttft_ms_p50"', 1)[1].split("</tr>", 1)[0]
    assert 'class="unreliable"' in cell and "starved" in cell and 'class="worse"' not in cell


def test_a_reliable_run_is_judged_as_before(tmp_path: Path) -> None:
    with RunStore(tmp_path / "r.db") as store:
        a = _store_run(store, "a", prefix=False, client_ttft_ms=120.0, itl_ms=12.0, lag_ms=2.0, engine_ttft_ms=90.0)
        b = _store_run(store, "b", prefix=True, client_ttft_ms=40.0, itl_ms=12.0, lag_ms=2.0, engine_ttft_ms=20.0)
        c = compare_runs(store, [a, b], series=False)
    ttft = c.metric("ttft_ms_p50")
    assert ttft is not None and ttft.headline and ttft.verdict(1) == "better" and ttft.unreliable == [None, None]
    assert [m.name for m in c.chart_metrics()] == ["output_tok_per_s", "ttft_ms_p50", "itl_ms_p50"]


def test_runs_stored_before_the_judgement_are_judged_from_their_levels(demo: tuple[Path, int, int]) -> None:
    path, off, on = demo
    with RunStore(path) as store:
        run = store.get_run(on)
        assert "ttft_ms_p50" in run.metrics["unreliable"]
        from app.analysis.compare import run_unreliable

        old = run.model_copy(update={"metrics": {k: v for k, v in run.metrics.items() if k != "unreliable"}})
        assert "ttft_ms_p50" in run_unreliable(old)
