"""`tunebench import` is all or nothing: every value is checked before anything is written, all
runs of a file are written in one transaction, and a bad value is one line naming its field."""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from app.errors import UserError
from app.export import import_results, run_to_json
from app.store import RunStore, SampleIn, StoreError


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    with RunStore(tmp_path / "r.db") as s:
        yield s


def _recorded(store: RunStore) -> int:
    """A run as the recorder leaves it: two levels, requests with extras, telemetry, a log."""
    run_id = store.create_run(name="recorded", tags=["cpu"], engine_kind="vllm", engine_version="0.32.0",
                              model="tunebench:demo", config={"name": "recorded", "load": {"concurrency": 2}},
                              t0_mono=100.0, started_at=1.9e9, hardware={"cpu_model": "x", "ram_total_bytes": 2**34})
    for idx in (0, 1):
        store.start_level(run_id, idx, f"c={idx + 1}", {"concurrency": idx + 1}, 1.9e9 + 10 * idx)
        store.write_batch(run_id, requests=[
            {"level": idx, "start_wall": 1.9e9 + 10 * idx + i, "ttft_ms": 30.0 + i, "e2e_ms": 90.0 + i,
             "input_tokens": 64, "output_tokens": 4, "itl_ms": [10.0, 11.0, 12.0], "error": None,
             "client_lag_ms": 0.5} for i in range(3)])
        store.finish_level(run_id, idx, {"output_tok_per_s": 40.0 + idx}, 1.9e9 + 10 * idx + 9)
    store.write_batch(run_id, samples=[SampleIn("client", 100.0 + t, 1.9e9 + t, {"output_tok_per_s": 10.0 + t})
                                       for t in range(5)], log_lines=["INFO ready"])
    store.finish_run(run_id, "completed", None, {"note": "kept"}, 1.9e9 + 20)
    return run_id


def _write(tmp_path: Path, doc: Any, name: str = "run.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _refused(store: RunStore, path: Path, *fragments: str) -> str:
    """The import fails with one line containing ``fragments`` and stores nothing."""
    before = [r.id for r in store.list_runs()]
    with pytest.raises(UserError) as info:
        import_results(store, path)
    message = str(info.value)
    assert "\n" not in message and all(f in message for f in fragments), message
    assert [r.id for r in store.list_runs()] == before
    return message


def test_export_import_round_trip_keeps_the_run(store: RunStore, tmp_path: Path) -> None:
    original = _recorded(store)
    doc = run_to_json(store, original)
    (copy_id,) = import_results(store, _write(tmp_path, doc))
    a, b = store.get_run(original), store.get_run(copy_id)
    assert b.imported and b.status == "completed" and b.t0_mono == a.t0_mono == 100.0
    assert [(lv.idx, lv.label, lv.params, lv.summary) for lv in b.levels] == \
        [(lv.idx, lv.label, lv.params, lv.summary) for lv in a.levels]
    assert b.metrics["L1.ttft_ms_p50"] == a.metrics["L1.ttft_ms_p50"] and b.summary["note"] == "kept"
    assert store.request_records(copy_id) == store.request_records(original)  # extras kept, not nested
    sa, sb = store.samples(original)["client"], store.samples(copy_id)["client"]
    assert sb.t_mono.tolist() == sa.t_mono.tolist() and sb.values.tolist() == sa.values.tolist()
    assert store.log_lines(copy_id) == ["INFO ready"] and b.hardware == a.hardware
    again = run_to_json(store, copy_id)
    assert again["requests"] == doc["requests"] and again["samples"] == doc["samples"]


def test_a_bad_sample_time_leaves_no_half_imported_run(store: RunStore, tmp_path: Path) -> None:
    """Found by a bad-input run: samples.t_mono = ["x"] printed an error, exited 2 and left a completed* run."""
    doc = run_to_json(store, _recorded(store))
    doc["samples"]["client"]["t_mono"][0] = "x"
    _refused(store, _write(tmp_path, doc), "could not import", "samples.client.t_mono[0]", '"x"')


_HUGE = 10**400


def _with(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("value", [_HUGE, 2**70, float("inf"), float("-inf"), float("nan")],
                         ids=["400 digits", "2**70", "inf", "-inf", "nan"])
@pytest.mark.parametrize("path, field", [
    (["requests", 0, "itl_ms", 1], "requests[0].itl_ms[1]"),
    (["requests", 1, "ttft_ms"], "requests[1].ttft_ms"),
    (["requests", 1, "e2e_ms"], "requests[1].e2e_ms"),
    (["requests", 2, "input_tokens"], "requests[2].input_tokens"),
    (["requests", 2, "output_tokens"], "requests[2].output_tokens"),
    (["requests", 0, "level"], "requests[0].level"),
    (["requests", 0, "start_wall"], "requests[0].start_wall"),
    (["run", "levels", 1, "idx"], "run.levels[1].idx"),
    (["samples", "client", "t_wall", 2], "samples.client.t_wall[2]"),
])
def test_absurd_numbers_in_a_tunebench_export_name_their_field(store: RunStore, tmp_path: Path, path: list[Any],
                                                               field: str, value: Any) -> None:
    doc = run_to_json(store, _recorded(store))
    _refused(store, _write(tmp_path, _with(doc, path, value)), "could not import", field)


_VLLM = {"date": "20261128-101500", "model_id": "m", "duration": 2.0, "completed": 2, "failed": 0,
         "output_throughput": 15.0, "ttfts": [0.1, 0.2], "itls": [[0.01, 0.02], [0.01]], "latencies": [0.3, 0.4],
         "input_lens": [10, 10], "output_lens": [3, 2], "start_times": [5.0, 5.5], "errors": ["", ""]}


@pytest.mark.parametrize("value", [_HUGE, 2**70, float("inf"), float("nan")], ids=["400 digits", "2**70", "inf", "nan"])
@pytest.mark.parametrize("path, field", [
    (["itls", 1, 0], "itls[1][0]"), (["latencies", 0], "latencies[0]"), (["ttfts", 1], "ttfts[1]"),
    (["input_lens", 0], "input_lens[0]"), (["output_lens", 1], "output_lens[1]"), (["completed"], "completed"),
    (["failed"], "failed"), (["start_times", 0], "start_times[0]"),
])
def test_absurd_numbers_in_a_vllm_bench_result_name_their_field(store: RunStore, tmp_path: Path, path: list[Any],
                                                                field: str, value: Any) -> None:
    _refused(store, _write(tmp_path, _with(_VLLM, path, value)), "could not import", field)


def test_absurd_numbers_in_guidellm_name_their_field(store: RunStore, tmp_path: Path) -> None:
    doc = {"benchmarks": [{"start_time": 1.9e9, "end_time": 1.9e9 + 5, "metrics": {},
                           "requests": {"successful": [{"start_time": 1.9e9, "time_to_first_token_ms": 5.0,
                                                        "request_latency": 0.5, "prompt_tokens": 2**70,
                                                        "output_tokens": 4}]}}]}
    _refused(store, _write(tmp_path, doc), "benchmarks[0].requests.successful[0].prompt_tokens")


def test_deep_nesting_is_one_line(store: RunStore, tmp_path: Path) -> None:
    _refused(store, _write(tmp_path, "[" * 100_000), "not valid JSON")
    _refused(store, _write(tmp_path, '{"ttfts": [], "output_throughput": 1, "label": ' + "[" * 500 + "]" * 500 + "}"),
             "could not import", "settings.label", "nested more than")


def test_a_document_failing_late_keeps_none_of_the_earlier_ones(store: RunStore, tmp_path: Path) -> None:
    """`vllm bench serve --append-result` files: the third result is bad, the first two stay out."""
    bad = _with(_VLLM, ["ttfts", 0], "soon")
    path = _write(tmp_path, "\n".join(json.dumps(d) for d in (_VLLM, _VLLM, bad)))
    _refused(store, path, "document 3 of 3", "ttfts[0]")


def test_a_store_failure_rolls_back_every_run_of_the_file(store: RunStore, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while writing (here: the second run) undoes the first: one transaction."""
    path = _write(tmp_path, json.dumps(_VLLM) + "\n" + json.dumps(_VLLM))
    original = RunStore._insert_imported
    calls = []

    def second_fails(self: RunStore, conn: Any, run: Any) -> int:
        calls.append(run)
        if len(calls) == 2:
            raise StoreError("disk full")
        return original(self, conn, run)

    monkeypatch.setattr(RunStore, "_insert_imported", second_fails)
    _refused(store, path, "could not import", "disk full")
    assert len(calls) == 2


def test_a_named_pipe_is_refused_at_once(store: RunStore, tmp_path: Path) -> None:
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            import_results(store, fifo)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            failure.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():
        with open(fifo, "w") as writer:  # let the reader finish so the test run can end
            writer.write("{}")
        pytest.fail("importing a named pipe blocked")
    assert isinstance(failure[0], UserError) and "named pipe" in str(failure[0])
    assert store.list_runs() == []


def test_cli_import_failure_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _with(_VLLM, ["itls", 0, 0], _HUGE))
    db = tmp_path / "cli.db"
    code = main(["import", str(path), "--db", str(db)])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "itls[0][0]" in err and "401-digit" in err
    with RunStore(db) as s:
        assert s.list_runs() == []


_NUMBERS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
                     st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=3))
_FIELDS = ("ttfts", "latencies", "input_lens", "output_lens", "start_times", "completed", "duration", "itls")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(field=st.sampled_from(_FIELDS), value=_NUMBERS, index=st.integers(0, 1))
def test_any_value_imports_or_is_refused_in_one_line(store: RunStore, tmp_path: Path, field: str, value: Any,
                                                     index: int) -> None:
    """Whatever sits in a numeric field, the import stores a run or says one line and stores
    nothing: never a traceback, never half a run."""
    doc = copy.deepcopy(_VLLM)
    if isinstance(doc[field], list):
        doc[field][index] = value
    else:
        doc[field] = value
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(doc))
    before = len(store.list_runs())
    try:
        ids = import_results(store, path)
    except UserError as exc:
        assert "\n" not in str(exc)
        assert len(store.list_runs()) == before
        return
    run = store.get_run(ids[0])
    assert run.status == "completed" and run.n_requests == 2
    store.delete(ids[0])
