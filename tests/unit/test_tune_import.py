"""Other tools' trade-off points on a tune's chart: ``vllm bench sweep`` (summary.csv, the
per-combination summary.json, run=N.json, the output folder) and AIConfigurator's Pareto CSV;
bad files refused in one line with nothing stored; the report and the chart draw them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import UserError
from app.export.sweep_import import AICONFIGURATOR, VLLM_SWEEP, import_into_tune, parse_sweep
from app.export.tune_report import pareto_svg, pick_launch_script, render_tune_report
from app.store import RunStore
from app.tuner.state import Candidate, Pick, Trial, TuneState
from app.tuner.stored import load_tune
from db import tune_store

# As pandas writes it (an unnamed index column first); serve and bench parameters beside the result.
SUMMARY_CSV = (
    ",date,backend,max_concurrency,request_rate,completed,failed,output_throughput,mean_tpot_ms,median_tpot_ms,"
    "p99_tpot_ms,mean_ttft_ms,p99_ttft_ms,max_num_seqs,tensor_parallel_size,run_number\n"
    "0,20260101-120000,vllm,8,inf,64,0,900.5,12.5,12.0,15.0,80.0,140.0,64,2,0\n"
    "1,20260101-120100,vllm,32,inf,64,0,2400.0,25.0,24.0,31.0,150.0,420.0,64,2,0\n"
    "2,20260101-120200,vllm,64,inf,64,2,3000.0,,,,,,128,2,0\n"
)


def vllm_result(concurrency: int, throughput: float, tpot: float, **params: object) -> dict[str, object]:
    return {"date": "20260101-120000", "backend": "vllm", "max_concurrency": concurrency, "request_rate": "inf",
            "completed": 64, "failed": 0, "output_throughput": throughput, "mean_tpot_ms": tpot,
            "p99_ttft_ms": 100.0 + concurrency, "p99_tpot_ms": tpot * 1.2, "median_ttft_ms": 50.0, "run_number": 0,
            **params}


AIC_CSV = ("model,isl,osl,concurrency,ttft,tpot,tokens/s,tokens/s/gpu,tokens/s/user,num_total_gpus,tp,pp,dp,"
           "parallel,gemm,kvcache,backend\n"
           "QWEN3_32B,4000,500,16,250.1,18.2,880.0,220.0,54.9,4,4,1,1,tp4pp1dp1,fp8_block,fp8,vllm\n"
           "QWEN3_32B,4000,500,64,610.3,35.5,1800.0,450.0,28.2,4,4,1,1,tp4pp1dp1,fp8_block,fp8,vllm\n")


def test_vllm_sweep_summary_csv(tmp_path: Path) -> None:
    path = tmp_path / "summary.csv"
    path.write_text(SUMMARY_CSV)
    points = parse_sweep(path)
    assert [p.source for p in points] == [VLLM_SWEEP] * 3
    first, second, third = points
    assert first.tok_s_per_gpu == pytest.approx(900.5 / 2)  # tensor parallel 2: two GPUs
    assert first.tok_s_per_user == pytest.approx(1000 / 12.5)  # 1000 / mean TPOT, as the tuner measures
    assert (first.load_kind, first.load_value) == ("concurrency", 8.0)
    assert first.figures["ttft_ms_p99"] == 140.0 and first.figures["tpot_ms_p99"] == 15.0
    assert "max_num_seqs 64" in first.label and "date" not in first.label
    assert third.tok_s_per_user == pytest.approx(3000.0 / 64)  # no TPOT: throughput per user, as vLLM plots
    assert second.settings["tensor_parallel_size"] == "2"


def test_vllm_sweep_folder_and_run_files(tmp_path: Path) -> None:
    a = tmp_path / "exp" / "SERVE--max_num_seqs=32-BENCH--max_concurrency=8"
    b = tmp_path / "exp" / "SERVE--max_num_seqs=64-BENCH--max_concurrency=32"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "summary.json").write_text(json.dumps([vllm_result(8, 800.0, 10.0, max_num_seqs=32)]))
    (a / "run=0.json").write_text(json.dumps(vllm_result(8, 800.0, 10.0, max_num_seqs=32)))  # summarized: skipped
    (b / "run=0.json").write_text(json.dumps(vllm_result(32, 2000.0, 20.0, max_num_seqs=64)))  # not summarized yet
    points = parse_sweep(tmp_path / "exp")
    assert sorted((p.load_value, p.tok_s_per_gpu) for p in points) == [(8.0, 800.0), (32.0, 2000.0)]
    single = parse_sweep(b / "run=0.json")
    assert len(single) == 1 and single[0].tok_s_per_user == pytest.approx(50.0)


def test_aiconfigurator_pareto_csv(tmp_path: Path) -> None:
    path = tmp_path / "pareto.csv"
    path.write_text(AIC_CSV)
    points = parse_sweep(path)
    assert [(p.source, p.tok_s_per_gpu, p.tok_s_per_user) for p in points] == [
        (AICONFIGURATOR, 220.0, 54.9), (AICONFIGURATOR, 450.0, 28.2)]
    assert points[0].label == "vllm tp4pp1dp1 gemm fp8_block kvcache fp8"
    assert points[0].figures == {"ttft_ms_mean": 250.1, "tpot_ms_mean": 18.2, "output_tok_per_s": 880.0}


@pytest.mark.parametrize(("name", "text", "message"), [
    ("x.csv", "a,b\n1,2\n", "not a vllm bench sweep summary.csv"),
    ("x.json", "{not json", "not valid JSON"),
    ("x.json", "[1, 2]", "expected a vllm bench result"),
    ("x.json", json.dumps({"output_throughput": None}), "no point with both"),
])
def test_bad_files_are_one_line_errors(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError) as info:
        parse_sweep(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UserError, match="no vllm bench sweep results"):
        parse_sweep(tmp_path / "empty-dir" if (tmp_path / "empty-dir").mkdir() is None else tmp_path)


def _state() -> TuneState:
    trials = [Trial(index=0, candidate=0, knobs={"max_num_seqs": 8}, load_value=4.0, status="passed",
                    label="max seqs 8", tok_s_per_gpu=300.0, tok_s_per_user=40.0, run_id=1,
                    figures={"ttft_ms_p99": 90.0, "tpot_ms_p99": 30.0}),
              Trial(index=1, candidate=0, knobs={"max_num_seqs": 8}, load_value=16.0, status="failed",
                    label="max seqs 8", tok_s_per_gpu=500.0, tok_s_per_user=20.0,
                    reason="TTFT p99 hit 612.0 ms (limit <= 500 ms)")]
    config = {"engine": {"kind": "vllm", "model": "tunebench:demo"},
              "features": {"max_num_seqs": 8}, "load": {"concurrency": 4}}
    return TuneState(tune_id="t1", name="demo tune", slo="ttft_ms<=500,tpot_ms<=50", started_wall_s=1.9e9,
                     candidates=[Candidate(index=0, knobs={"max_num_seqs": 8}, label="max seqs 8", status="done",
                                           binding="TTFT p99 hit 612.0 ms (limit <= 500 ms) at concurrency 16")],
                     trials=trials, pick=Pick(candidate=0, trial=0, label="max seqs 8", load_label="concurrency 4",
                                              tok_s_per_gpu=300.0, tok_s_per_user=40.0, config=config,
                                              binding="TTFT p99 hit 612.0 ms (limit <= 500 ms) at concurrency 16"))


def test_imported_points_are_stored_with_the_tune_and_drawn(tmp_path: Path) -> None:
    sweep = tmp_path / "summary.csv"
    sweep.write_text(SUMMARY_CSV)
    aic = tmp_path / "pareto.csv"
    aic.write_text(AIC_CSV)
    state = _state()
    with RunStore(tmp_path / "runs.db") as store:
        tune_store.create_tune(store, "t1", name=state.name, profile="p", strategy="grid", slo=state.slo,
                               doc=state.doc())
        for t in state.trials:
            tune_store.put_trial(store, "t1", t.index, candidate=t.candidate, status=t.status, knobs=t.knobs,
                                 load_value=t.load_value, figures=t.figures, doc=t.doc())
        assert import_into_tune(store, "t1", sweep, label="H100 sweep") == 3
        assert import_into_tune(store, "t1", aic) == 2
        loaded = load_tune(store, "t1")
        with pytest.raises(UserError):
            import_into_tune(store, "t1", tmp_path / "missing.csv")
        assert len(load_tune(store, "t1").trials) == 7  # nothing stored from the bad file
    imported = loaded.imported
    assert [t.index for t in imported] == [2, 3, 4, 5, 6] and {t.status for t in imported} == {"imported"}
    assert imported[0].label.startswith("H100 sweep: ") and imported[0].ratios["ttft_ms"] == pytest.approx(140 / 500)
    svg = pareto_svg(loaded)
    assert "vllm bench sweep (imported)" in svg and "AIConfigurator (imported)" in svg
    assert svg.count("<circle") == 3  # two measured trials and the pick's ring
    assert "TPOT SLO: 20" in svg
    html = render_tune_report(loaded)
    assert "The pick: max seqs 8 at concurrency 4" in html and "TTFT p99 hit 612.0 ms" in html
    assert "--max-num-seqs 8" in html


def test_pick_launch_script_every_format_and_no_pick() -> None:
    state = _state()
    for fmt in ("bash", "docker", "compose", "k8s"):
        assert "max-num-seqs" in pick_launch_script(state, fmt)
    with pytest.raises(UserError, match="unknown launch format"):
        pick_launch_script(state, "html")
    with pytest.raises(UserError, match="has no pick"):
        pick_launch_script(state.model_copy(update={"pick": None}), "bash")
