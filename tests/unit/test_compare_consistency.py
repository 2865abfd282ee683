"""One run, one number: the CLI table, the ``--json`` result, Compare (CLI and model) and the
HTML report show the same value for the same run and figure: one request summary."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.analysis import metric_catalog as catalog
from app.analysis.compare import compare_runs
from app.cli import main
from app.export import render_report
from app.store import RunStore
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer
from tests.small_profile import write_small_profile

# Figures in the CLI table that Compare also shows (the table adds runner-only ones).
CHECKED = ("output_tok_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "tpot_ms_p50",
           "e2e_ms_p50")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.004, api_key="k1")) as srv:
        yield srv


def _run(server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
         concurrency: int) -> tuple[str, dict[str, object]]:
    profile = write_small_profile(tmp_path / f"{name}.toml", name, 8, 9, f"concurrency = {concurrency}")
    out = tmp_path / f"{name}.json"
    code = main(["run", str(profile), "--endpoint", server.base_url, "--api-key", "k1", "--json", str(out),
                 "--no-telemetry", "--db", str(tmp_path / "runs.db")])
    text = capsys.readouterr().out
    assert code == 0, text
    return text, json.loads(out.read_text())


def _table_cells(text: str) -> dict[str, str]:
    """The CLI table's one level row, header -> cell."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("level ") and "  ok  err" in line)
    headers = re.split(r"\s{2,}", lines[head].strip())
    cells = re.split(r"\s{2,}", lines[head + 2].strip())
    assert len(headers) == len(cells), (headers, cells)
    return dict(zip(headers, cells, strict=True))


def test_cli_table_json_compare_and_report_agree(server: FakeOpenAIServer, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    text_a, json_a = _run(server, tmp_path, capsys, "one", 1)
    _text_b, json_b = _run(server, tmp_path, capsys, "two", 4)
    table = _table_cells(text_a)

    # --json: the level's figures under their catalogue keys, from the same LevelSummary.
    from app.load.metrics import LevelSummary

    level = LevelSummary.model_validate(json_a["levels"][0]["summary"])  # type: ignore[index]
    json_figures = level.figures()

    with RunStore(tmp_path / "runs.db") as store:
        comparison = compare_runs(store, [str(json_a["run_id"]), str(json_b["run_id"])])
        html = render_report(comparison)
    code = main(["compare", str(json_a["run_id"]), str(json_b["run_id"]), "--db", str(tmp_path / "runs.db"),
                 "--json"])
    compare_json = json.loads(capsys.readouterr().out)
    assert code == 0
    by_key = {m["name"]: m for m in compare_json["metrics"]}

    for key in CHECKED:
        m = catalog.metric(key)
        shown = m.format(json_figures[key])
        cell_text = table[m.header]
        assert cell_text.strip("[]") == shown, (key, cell_text, shown)
        row = comparison.metric(key)
        assert row is not None
        assert row.metric.format(row.values[0]) == shown, (key, row.values[0], shown)
        # ... and the same judgement: [bracketed] in the table exactly when Compare flags it
        assert cell_text.startswith("[") == (row.unreliable[0] is not None), (key, cell_text, row.unreliable[0])
        assert m.format(by_key[key]["values"][0]) == shown, key
        cell = next(r for r in comparison.rows() if r["key"] == key)["cells"][0]["value"]
        assert cell == shown and f">{shown}<" in html, key  # the report's cell holds the same text


def test_throughput_uses_the_level_duration_in_runner_and_store(server: FakeOpenAIServer, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The two summaries used to divide by different durations (level vs span of requests)."""
    _text, data = _run(server, tmp_path, capsys, "dur", 2)
    summary = data["levels"][0]["summary"]  # type: ignore[index]
    with RunStore(tmp_path / "runs.db") as store:
        metrics = store.get_run(str(data["run_id"])).metrics
    assert metrics["duration_s"] == pytest.approx(summary["duration_s"], rel=1e-12)
    assert metrics["output_tok_per_s"] == pytest.approx(summary["output_tok_per_s"], rel=1e-9)
    assert metrics["requests_per_s"] == pytest.approx(summary["request_throughput_rps"], rel=1e-9)
