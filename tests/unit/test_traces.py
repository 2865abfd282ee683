"""Trace replay (``app.load.traces``): the three formats, the reuse a trace implies (counted by
hand), the window, equal block ids as equal tokens, and a replay through ``tunebench run`` against
the fake server at the trace's own times, ``speedup`` times faster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.cli import main
from app.config import RunConfig
from app.load.datasets import build_dataset, trace_dataset
from app.load.tokens import ApproxTokenizer, load_token_counter
from app.load.traces import Trace, TraceError, TraceRequest, read_trace
from app.store import RunStore
from app.workload import LoadConfig, WorkloadConfig
from engine_adapters.runtimes import demo_model_dir
from tests.data import make_trace_samples
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

SAMPLES = Path(__file__).resolve().parent.parent.parent / "assets" / "traces"


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_shipped_samples_are_what_their_generator_writes() -> None:
    for name, make in make_trace_samples.SAMPLES.items():
        assert (SAMPLES / name).read_text() == "\n".join(make()) + "\n", f"{name}: run tests/data/make_trace_samples.py"


@pytest.mark.parametrize(("name", "fmt", "requests"), [("mooncake-sample.jsonl", "mooncake", 40),
                                                       ("azure-sample.csv", "azure", 40),
                                                       ("tunebench-sample.jsonl", "tunebench", 30)])
def test_each_sample_is_read_in_its_format(name: str, fmt: str, requests: int) -> None:
    trace = read_trace(SAMPLES / name)
    assert trace.format == fmt and len(trace.requests) == requests
    times = [r.at_s for r in trace.requests]
    assert times[0] == 0.0 and times == sorted(times) and trace.duration_s == pytest.approx(trace.span_s)
    assert all(r.input_tokens >= 1 and r.output_tokens >= 1 for r in trace.requests)


def test_times_are_read_in_each_formats_unit(tmp_path: Path) -> None:
    mooncake = _write(tmp_path, "m.jsonl", ['{"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [1]}',
                                            '{"timestamp": 3500, "input_length": 10, "output_length": 2, "hash_ids": [1]}'])
    assert [r.at_s for r in read_trace(mooncake).requests] == [0.0, 2.5]  # milliseconds
    azure = _write(tmp_path, "a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens",
                                       "2023-11-16 18:15:46.6805900,100,5", "2023-11-16 18:15:49.1805900,200,6"])
    trace = read_trace(azure)
    assert [r.at_s for r in trace.requests] == pytest.approx([0.0, 2.5])
    assert [(r.input_tokens, r.output_tokens, r.blocks) for r in trace.requests] == [(100, 5, ()), (200, 6, ())]
    own = _write(tmp_path, "t.jsonl", ['{"at_s": 4.0, "input_tokens": 10, "output_tokens": 2}',
                                       '{"at_s": 1.5, "input_tokens": 12, "output_tokens": 3, "blocks": [7]}'])
    got = read_trace(own).requests  # arrival order, counted from the first
    assert [(r.line, r.at_s, r.blocks) for r in got] == [(2, 0.0, (7,)), (1, 2.5, ())]


def test_the_reuse_a_trace_implies_counted_by_hand() -> None:
    """Blocks of 4 tokens. A: [1 2 3] (12 tokens), B: [1 2 9] (12): 1 and 2 behind the same
    prefix hit, 8 tokens. C: [5 2] (8): 2 follows 5 here, a prefix never seen: no hit. D: [1 2 3]
    with 10 tokens: 1 and 2 hit (8); 3 is a partial block (2 of its 4 tokens): no hit.
    Blocks: 3 + 3 + 2 + 3 = 11 in all, 5 distinct (1 2 3 9 5). Hits 16 of 42 prompt tokens."""
    reqs = [TraceRequest(1, 0.0, 12, 1, (1, 2, 3)), TraceRequest(2, 1.0, 12, 1, (1, 2, 9)),
            TraceRequest(3, 2.0, 8, 1, (5, 2)), TraceRequest(4, 3.0, 10, 1, (1, 2, 3))]
    reuse = Trace(Path("t"), "tunebench", 4, reqs, 3.0).reuse()
    assert (reuse.total_blocks, reuse.distinct_blocks, reuse.prompt_tokens, reuse.prefix_hit_tokens) == (11, 5, 42, 16)
    assert reuse.block_reuse == pytest.approx(6 / 11) and reuse.prefix_token_reuse == pytest.approx(16 / 42)
    unique = Trace(Path("t"), "tunebench", 4, reqs, 3.0).with_unique_blocks().reuse()
    assert unique.prefix_hit_tokens == 0 and unique.distinct_blocks == unique.total_blocks == 11


def test_a_window_slices_the_trace_and_num_requests_caps_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.jsonl", [json.dumps({"at_s": float(t), "input_tokens": 8, "output_tokens": 1})
                                        for t in range(10)])
    window = read_trace(path, start_s=2.0, end_s=6.0)
    assert [(r.line, r.at_s) for r in window.requests] == [(3, 0.0), (4, 1.0), (5, 2.0), (6, 3.0)]
    assert window.span_s == 9.0 and window.duration_s == 3.0
    assert [r.line for r in read_trace(path, start_s=2.0, max_requests=2).requests] == [3, 4]
    with pytest.raises(TraceError, match=r"no request in the window \[20, 30\) s; the trace spans 9.000 s"):
        read_trace(path, start_s=20.0, end_s=30.0)


BAD = {
    "not json": (["{\"at_s\": 0, \"input_tokens\": 8, \"output_tokens\": 1}", "{oops"], "t.jsonl", "line 2: not JSON"),
    "missing key": (['{"timestamp": 0, "input_length": 8, "output_length": 1}', '{"timestamp": 5, "input_length": 8}'],
                    "m.jsonl", "line 2: no 'output_length'"),
    "negative time": (['{"timestamp": -4, "input_length": 8, "output_length": 1}'], "m.jsonl",
                      "line 1: timestamp must be a finite number >= 0"),
    "fractional tokens": (['{"at_s": 0, "input_tokens": 8.5, "output_tokens": 1}'], "t.jsonl",
                          "line 1: input_tokens must be a whole number"),
    "zero output": (['{"at_s": 0, "input_tokens": 8, "output_tokens": 0}'], "t.jsonl",
                    "line 1: output_tokens must be between 1"),
    "too many blocks": (['{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}'],
                        "m.jsonl", "line 1: 3 hash_ids for 600 prompt tokens: at most 2 blocks of 512"),
    "blocks not ints": (['{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": ["a"]}'],
                        "m.jsonl", "line 1: hash_ids must be a list of whole numbers"),
    "unknown key": (['{"at_s": 0, "input_tokens": 8, "output_tokens": 1, "prompt": "x"}'], "t.jsonl",
                    "line 1: unknown key(s) 'prompt'"),
    "a list line": (['{"at_s": 0, "input_tokens": 8, "output_tokens": 1}', "[1, 2]"], "t.jsonl",
                    "line 2: expected a JSON object, got list"),
    "azure header": (["time,ContextTokens,GeneratedTokens", "1,2,3"], "a.csv", "line 1: no column TIMESTAMP"),
    "azure date": (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,10,2", "yesterday,10,2"],
                   "a.csv", "line 3: TIMESTAMP 'yesterday' is neither"),
    "azure short row": (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,10"], "a.csv",
                        "line 2: 2 columns, the header has 3"),
    "azure tokens": (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,ten,2"], "a.csv",
                     "line 2: ContextTokens must be a whole number"),
    "empty": ([""], "t.jsonl", "no requests in this trace"),
    # Numbered as an editor does: a record separator is no line break (str.splitlines says it is).
    "record separator": (['{"at_s": 0, "input_tokens": 8, "output_tokens": 1}',
                          '{"at_s": 1, "input_tokens": 8, "output_tokens": 1}\x1e', "oops"], "t.jsonl",
                         "line 2: not JSON (Extra data)"),
    "unknown format": (['{"prompt": "hello"}'], "x.jsonl", "line 1: not a trace line this knows"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_line_refuses_the_trace_by_its_number(case: str, tmp_path: Path) -> None:
    lines, name, message = BAD[case]
    path = _write(tmp_path, name, lines)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_equal_block_ids_become_equal_tokens_and_the_rest_is_each_prompts_own() -> None:
    """In the demo model's own tokens (the engine re-tokenizes the text): prompts that share their
    first two blocks share exactly those 2 x 64 tokens, and no more."""
    counter = load_token_counter(str(demo_model_dir()))
    assert counter.exact, counter.source
    reqs = [TraceRequest(1, 0.0, 160, 2, (1, 2, 3)), TraceRequest(2, 0.5, 150, 2, (1, 2, 4)),
            TraceRequest(3, 1.0, 100, 2, (6, 2)), TraceRequest(4, 1.5, 90, 2, ())]
    dataset = trace_dataset(Trace(Path("t"), "tunebench", 64, reqs, 1.5), counter, np.random.default_rng(0))
    ids = [counter.encode(c.turns[0].user) for c in dataset.conversations]
    assert [len(i) for i in ids] == [160, 150, 100, 90]
    assert [c.turns[0].input_tokens for c in dataset.conversations] == [160, 150, 100, 90]

    assert ids[0][:128] == ids[1][:128] and ids[0][128:150] != ids[1][128:]  # blocks 1 and 2, then 3 vs 4
    assert ids[0][:64] != ids[2][:64] and ids[2][:64] != ids[3][:64]  # no first block in common
    assert ids[2][64:] == ids[0][64:100]  # block 2 (36 of its tokens), the same behind another prefix
    assert dataset.arrivals_s == [0.0, 0.5, 1.0, 1.5]
    assert [c.turns[0].output_tokens for c in dataset.conversations] == [2, 2, 2, 2]


def test_levels_get_blocks_of_their_own() -> None:
    workload = WorkloadConfig(kind="trace", dataset_path=str(SAMPLES / "tunebench-sample.jsonl"), num_requests=3)
    counter = ApproxTokenizer()
    first, again, other = (build_dataset(workload, counter, variant=v) for v in (0, 0, 1))
    assert [c.turns[0].user for c in first.conversations] == [c.turns[0].user for c in again.conversations]
    assert first.conversations[0].turns[0].user[:200] != other.conversations[0].turns[0].user[:200]
    assert len(first.conversations) == 3 and first.notes[0].startswith("trace tunebench-sample.jsonl (tunebench)")


def test_the_trace_pattern_needs_a_trace_and_a_trace_needs_its_file() -> None:
    with pytest.raises(ValidationError, match="load pattern 'trace' .* needs workload kind 'trace'"):
        RunConfig(load=LoadConfig(pattern="trace"))
    with pytest.raises(ValidationError, match="workload kind 'trace' needs dataset_path"):
        WorkloadConfig(kind="trace")
    with pytest.raises(ValidationError, match="trace_end_s must be after trace_start_s"):
        WorkloadConfig(kind="trace", dataset_path="t.jsonl", trace_start_s=5.0, trace_end_s=5.0)


def _replay(tmp_path: Path, trace: Path, extra: str = "") -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    profile = tmp_path / "p.toml"
    profile.write_text(f'name = "replay"\n[workload]\nkind = "trace"\ndataset_path = "{trace}"\n{extra}'
                       '[load]\npattern = "trace"\nspeedup = 4\n' + ("workers = 2\n" if "workers" in tmp_path.name else ""))
    out, db = tmp_path / "r.json", str(tmp_path / "runs.db")
    with FakeOpenAIServer(FakeBehaviour()) as srv:
        code = main(["run", str(profile), "--endpoint", srv.base_url, "--json", str(out), "--no-telemetry", "--db", db])
        sent = srv.requests
    data = json.loads(out.read_text()) if out.exists() else {}
    records: list[dict[str, Any]] = []
    if data.get("run_id"):
        with RunStore(db) as store:
            records = store.request_records(data["run_id"])
    data["_sent"] = sent
    return code, data, records


@pytest.mark.parametrize("workers", ["one", "workers"])
def test_a_trace_is_replayed_at_its_own_times_speedup_times_faster(workers: str, tmp_path: Path) -> None:
    tmp_path = tmp_path / workers
    tmp_path.mkdir()
    trace = read_trace(SAMPLES / "mooncake-sample.jsonl")
    code, data, records = _replay(tmp_path, SAMPLES / "mooncake-sample.jsonl")
    assert code == 0, data.get("reason")
    level = data["levels"][0]
    assert level["label"] == "trace x4" and level["summary"]["completed"] == 40
    scheduled = sorted(r["extra"]["scheduled_s"] for r in records)
    assert scheduled == pytest.approx([r.at_s / 4 for r in trace.requests], abs=1e-3)  # float32 seconds
    assert level["summary"]["steady_note"] == "a trace's arrivals follow the trace, not a steady rate"
    assert level["summary"]["trace_prefix_reuse"] == pytest.approx(trace.reuse().prefix_token_reuse)
    with RunStore(str(tmp_path / "runs.db")) as store:  # stored as a figure, beside the engine's hit rate
        stored = store.get_run(data["run_id"])
    assert stored.metrics["trace_prefix_reuse"] == pytest.approx(0.554, abs=1e-3)
    notes = " | ".join(data["notes"])
    assert "115 blocks of 512 tokens, 60 distinct" in notes and "the trace implies 55.4% of prompt tokens" in notes
    assert "level trace x4: the engine reported no prefix-cache counters" in notes  # the fake has none


def test_a_bad_trace_line_refuses_the_run_before_anything_is_sent(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lines = (SAMPLES / "mooncake-sample.jsonl").read_text().splitlines()
    lines[30] = lines[30].replace('"output_length"', '"output_len"')
    bad = _write(tmp_path, "bad.jsonl", lines)
    code, data, records = _replay(tmp_path, bad)
    err = capsys.readouterr()
    err = err.out + err.err
    assert code != 0 and f"{bad}: line 31: no 'output_length'" in err, err
    assert data["_sent"] == 0 and records == [] and not data.get("levels")
    assert "Traceback" not in err
