"""Run data out (JSON, CSV, HTML report) and other tools' results in (vllm bench, GuideLLM)."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from pathlib import Path

import pytest

from app.analysis.compare import compare_runs
from app.errors import UserError
from app.export import import_results, render_report, run_to_csv, run_to_json, spec_from_run
from app.export.report import format_value
from app.store import RunStore, SampleIn

EVIL = '<script>alert("x")</script> & =cmd|\' /C calc\'!A0'
FORMULA = "=cmd|' /C calc'!A0"


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    with RunStore(tmp_path / "r.db") as s:
        yield s


def _stored_run(store: RunStore, name: str, ttft_ms: float, prefix: bool) -> int:
    run_id = store.create_run(name=name, tags=["t"], engine_kind="vllm", model="tunebench:demo",
                              config={"name": name, "features": {"prefix_caching": prefix}}, t0_mono=10.0,
                              started_at=1.9e9)
    store.write_batch(run_id, requests=[
        {"level": 0, "start_wall": 1.9e9 + i, "ttft_ms": ttft_ms, "e2e_ms": 200.0, "input_tokens": 10,
         "output_tokens": 4, "itl_ms": [50.0, 50.0, 50.0], "error": {0: EVIL, 2: FORMULA}.get(i)} for i in range(5)],
        samples=[SampleIn("client", 10.0 + t, 1.9e9 + t, {"output_tok_per_s": 50.0 + t}) for t in range(6)],
        log_lines=["INFO starting", "INFO ready"])
    store.finish_run(run_id, "completed", None, {"output_tok_per_s": 20.0})
    return run_id


def test_json_export_round_trips_through_import(store: RunStore, tmp_path: Path) -> None:
    run_id = _stored_run(store, "orig", 40.0, True)
    doc = run_to_json(store, run_id)
    assert doc["format"] == "tunebench-run" and len(doc["requests"]) == 5 and doc["log"] == ["INFO starting",
                                                                                               "INFO ready"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    (new_id,) = import_results(store, path)
    orig, copy = store.get_run(run_id), store.get_run(new_id)
    assert copy.imported and copy.imported_from == "tunebench: run.json" and "imported" in copy.tags
    assert copy.config == orig.config and copy.n_requests == 5 and copy.n_samples == 6 and copy.n_log_lines == 2
    assert copy.metrics["ttft_ms_p50"] == orig.metrics["ttft_ms_p50"]
    assert store.request_records(new_id)[1]["itl_ms"] == [50.0, 50.0, 50.0]
    with pytest.raises(UserError, match="imported"):
        spec_from_run(copy)  # an imported run is no launch recipe


def test_csv_has_one_row_per_request_and_inert_cells(store: RunStore) -> None:
    run_id = _stored_run(store, "csv", 40.0, True)
    rows = list(csv.DictReader(io.StringIO(run_to_csv(store, run_id))))
    assert len(rows) == 5 and rows[1]["ttft_ms"] == "40.0" and rows[1]["itl_ms"] == "50 50 50"
    assert rows[0]["error"] == EVIL and rows[1]["error"] == ""
    assert rows[2]["error"] == "'" + FORMULA  # a spreadsheet shows it as text instead of running it


def test_html_report_is_self_contained_and_escaped(store: RunStore) -> None:
    a = _stored_run(store, "prefix off", 40.0, False)
    b = _stored_run(store, EVIL, 20.0, True)
    html = render_report(compare_runs(store, [a, b], baseline=a))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "features.prefix_caching" in html and "ttft_ms_p50" in html and "-50% better" in html and "TTFT p50 (ms)" in html
    assert 'class="better"' in html
    images = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    assert len(images) >= 3  # bar charts and the telemetry overlay
    svgs = [base64.b64decode(i).decode() for i in images]
    assert all(s.startswith("<svg") and "<script>" not in s for s in svgs)
    assert any("polyline" in s for s in svgs)
    assert "http://" not in html.replace("http://www.w3.org", "")  # nothing fetched from elsewhere


def _vllm_bench_result() -> dict[str, object]:
    """The shape `vllm bench serve --save-result --save-detailed` writes (times in seconds)."""
    return {
        "date": "20261128-101500", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B", "tokenizer_id": "x",
        "num_prompts": 4, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2, "duration": 2.0,
        "completed": 3, "failed": 1, "total_input_tokens": 300, "total_output_tokens": 30,
        "request_throughput": 1.5, "request_goodput": None, "output_throughput": 15.0, "total_token_throughput": 165.0,
        "mean_ttft_ms": 100.0, "median_ttft_ms": 100.0, "std_ttft_ms": 0.0, "p99_ttft_ms": 120.0,
        "mean_tpot_ms": 20.0, "median_tpot_ms": 20.0, "p99_tpot_ms": 22.0,
        "mean_itl_ms": 20.0, "median_itl_ms": 20.0, "p99_itl_ms": 21.0,
        "mean_e2el_ms": 280.0, "median_e2el_ms": 280.0, "p99_e2el_ms": 300.0,
        "input_lens": [100, 100, 100, 100], "output_lens": [10, 10, 10, 0],
        "ttfts": [0.09, 0.1, 0.11, 0.0], "itls": [[0.02] * 9, [0.02] * 9, [0.02] * 9, []],
        "latencies": [0.27, 0.28, 0.29, 0.0], "start_times": [50.0, 50.5, 51.0, 51.5],
        "generated_texts": ["a", "b", "c", ""], "errors": ["", "", "", "Connection reset"],
    }


def test_import_vllm_bench_serve(store: RunStore, tmp_path: Path) -> None:
    path = tmp_path / "vllm-bench.json"
    path.write_text(json.dumps(_vllm_bench_result()))
    (run_id,) = import_results(store, path)
    run = store.get_run(run_id)
    assert run.imported and run.imported_from == "vllm bench serve: vllm-bench.json"
    assert run.model == "meta-llama/Llama-3.1-8B" and run.status == "completed"
    assert run.n_requests == 4
    assert run.metrics["requests_failed"] == 1 and run.metrics["ttft_ms_p50"] == pytest.approx(100.0)
    assert run.metrics["itl_ms_p50"] == pytest.approx(20.0)
    assert run.summary["p99_ttft_ms"] == 120.0
    assert run.config["imported"]["max_concurrency"] == 2


def test_import_vllm_bench_summary_only(store: RunStore, tmp_path: Path) -> None:
    data = {k: v for k, v in _vllm_bench_result().items()
            if k not in ("ttfts", "itls", "latencies", "start_times", "input_lens", "output_lens", "errors",
                         "generated_texts")}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    (run_id,) = import_results(store, path, name="from summary")
    run = store.get_run(run_id)
    assert run.name == "from summary" and run.n_requests == 0
    assert run.metrics["ttft_ms_p99"] == 120.0 and run.metrics["output_tok_per_s"] == 15.0
    assert run.metrics["ttft_ms_p50"] == 100.0 and run.metrics["error_rate_pct"] == 25.0


def _guidellm() -> dict[str, object]:
    def dist(mean: float, p99: float) -> dict[str, object]:
        return {"successful": {"mean": mean, "median": mean, "count": 2, "percentiles": {"p50": mean, "p90": p99,
                                                                                          "p99": p99}}}

    def bench(rate: float, ttft: float) -> dict[str, object]:
        return {
            "type_": "generative_benchmark", "start_time": 1.9e9, "end_time": 1.9e9 + 10,
            "args": {"profile": {"type_": "constant", "rate": rate}},
            "worker": {"backend_model": "Qwen/Qwen3-8B"},
            "metrics": {"time_to_first_token_ms": dist(ttft, ttft * 2), "inter_token_latency_ms": dist(8.0, 12.0),
                        "request_latency": dist(1.5, 2.0), "output_tokens_per_second": dist(400.0 * rate, 0),
                        "requests_per_second": dist(rate, 0), "request_totals": {"successful": 2, "errored": 0}},
            "requests": {"successful": [
                {"start_time": 1.9e9 + i, "time_to_first_token_ms": ttft, "request_latency": 1.5,
                 "prompt_tokens": 64, "output_tokens": 32} for i in range(2)], "errored": [], "incomplete": []},
        }

    return {"benchmarks": [bench(1.0, 50.0), bench(4.0, 90.0)]}


def test_import_guidellm_benchmarks(store: RunStore, tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(_guidellm()))
    (run_id,) = import_results(store, path)
    run = store.get_run(run_id)
    assert run.imported and run.model == "Qwen/Qwen3-8B" and len(run.levels) == 2
    assert run.levels[1].label == "constant" and run.levels[1].summary["ttft_ms_p99"] == 180.0
    assert run.levels[0].summary["e2e_ms_p50"] == 1500.0  # seconds -> ms
    assert run.n_requests == 4 and run.metrics["L1.ttft_ms_p50"] == 90.0


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"hello": 1}', "not a vllm bench serve result"),
    ('{"benchmarks": []}', "without benchmarks"),
    ('{"ttfts": "oops", "completed": 1}', "could not import"),
    ('{"output_throughput": 1.0}\n{"hello": 2}', "not a vllm bench serve result"),  # all or nothing
    ("", "empty file"),
])
def test_bad_import_files_give_one_line_and_store_nothing(store: RunStore, tmp_path: Path, content: str,
                                                          message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as info:
        import_results(store, path)
    assert "\n" not in str(info.value)
    assert store.list_runs() == []


@pytest.mark.parametrize("value, text", [(2049.6, "2,050"), (2050.0, "2,050"), (123.45, "123.5"), (12.345, "12.35"),
                                         (0.5, "0.5"), (100.0, "100"), (7e10, "7e+10"), (None, "–")])
def test_report_numbers(value: float | None, text: str) -> None:
    assert format_value(value) == text


def test_import_appended_vllm_bench_results(store: RunStore, tmp_path: Path) -> None:
    """`vllm bench serve --append-result` writes one JSON object per run into the same file."""
    first = _vllm_bench_result()
    second = dict(first, max_concurrency=8, output_throughput=30.0)
    path = tmp_path / "appended.json"
    path.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    ids = import_results(store, path, name="sweep")
    runs = [store.get_run(i) for i in ids]
    assert [r.name for r in runs] == ["sweep #1", "sweep #2"]
    assert [r.config["imported"]["max_concurrency"] for r in runs] == [2, 8]
