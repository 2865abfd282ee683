"""The SQLite store: migrations, crash consistency, queries, editing, comparison."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from alembic.script import ScriptDirectory

from app.analysis.compare import compare_runs
from app.store import RunStore, SampleIn, StoreError, alembic_config, create_at_revision, default_db_path
from tests.spawned import run_at_once


def _head() -> str | None:
    """The newest migration (later revisions must not break these tests)."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _requests(n: int, ttft_ms: float, start: float = 1.9e9) -> list[dict[str, object]]:
    return [{"level": i % 2, "start_wall": start + i * 0.1, "ttft_ms": ttft_ms, "e2e_ms": ttft_ms + 70.0,
             "input_tokens": 32, "output_tokens": 8, "itl_ms": [10.0] * 7} for i in range(n)]


def _run(store: RunStore, name: str, ttft_ms: float, prefix: bool, **kw: object) -> int:
    run_id = store.create_run(name=name, engine_kind="vllm", model="tunebench:demo", engine_version="0.32.0",
                              config={"name": name, "features": {"prefix_caching": prefix, "max_num_seqs": 8}},
                              t0_mono=100.0, started_at=1.9e9, **kw)
    samples = [SampleIn("client", 100.0 + t, 1.9e9 + t, {"output_tok_per_s": 100.0 * (2 if prefix else 1)})
               for t in np.arange(0, 10, 0.5)]
    store.write_batch(run_id, requests=_requests(20, ttft_ms), samples=samples)
    store.finish_run(run_id, "completed", None, {"runner_metric": 1.0})
    return run_id


def test_default_path_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    monkeypatch.delenv("TUNEBENCH_DB")
    monkeypatch.setenv("TUNEBENCH_DATA_DIR", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "runs.db"


def test_opens_in_wal_mode_at_the_newest_revision(tmp_path: Path) -> None:
    with RunStore(tmp_path / "r.db") as store:
        assert store.schema_revision() == _head()
    conn = sqlite3.connect(tmp_path / "r.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migration_from_the_first_schema_keeps_runs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    create_at_revision(path, "0001")
    conn = sqlite3.connect(path)
    assert "imported_from" not in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
    conn.execute("INSERT INTO runs (uid, name, notes, status, created_at, started_at, finished_at, engine_kind, "
                 "model, config, env, hardware, engine_info, summary, metrics, imported, dropped_items) VALUES "
                 "('old-1', 'from 0001', '', 'completed', 1.0, 1.0, 2.0, 'vllm', 'm', '{}', '{}', '{}', '{}', "
                 "'{}', '{\"output_tok_per_s\": 12.5}', 0, 0)")
    conn.execute("INSERT INTO requests (run_id, seq, level, ttft_ms) VALUES (1, 0, 0, 42.0)")
    conn.commit()
    conn.close()
    with RunStore(path) as store:
        assert store.schema_revision() == _head()
        (run,) = store.list_runs()
        assert (run.uid, run.name, run.metrics, run.imported_from) == ("old-1", "from 0001", {"output_tok_per_s": 12.5},
                                                                       None)
        assert store.get_run("old-1").n_requests == 1
        new = store.create_run(name="after upgrade", imported_from="x.json")
        assert store.get_run(new).imported_from == "x.json"
    indexes = {r[1] for r in sqlite3.connect(path).execute("PRAGMA index_list(runs)")}
    assert {"ix_runs_started_at", "ix_runs_status"} <= indexes


def _legacy_run(conn: sqlite3.Connection, run_id: int, n: int) -> list[dict[str, object]]:
    """A run as revision 0002 stored it: one ``requests`` row per request, latencies as float32
    in chunks, other fields as zlib JSON, raw telemetry. Returns the records as written."""
    conn.execute("INSERT INTO runs (id, uid, name, notes, status, created_at, started_at, finished_at, t0_mono, "
                 "engine_kind, model, config, env, hardware, engine_info, summary, metrics, imported, dropped_items) "
                 "VALUES (?, ?, ?, '', 'completed', 1.0, 1.9e9, 1.9e9 + 60, 100.0, 'vllm', 'm', "
                 "'{\"features\": {\"prefix_caching\": true}}', '{}', '{}', '{}', '{}', "
                 "'{\"output_tok_per_s\": 12.5}', 0, 0)", (run_id, f"uid-{run_id}", f"old {run_id}"))
    conn.execute("INSERT INTO run_tags (run_id, tag) VALUES (?, 'old')", (run_id,))
    records: list[dict[str, object]] = []
    for chunk_start in range(0, n, 7):
        chunk = []
        for seq in range(chunk_start, min(n, chunk_start + 7)):
            rec = {"seq": seq, "level": seq % 2, "start_wall": 1.9e9 + seq * 0.25, "ttft_ms": 20.0 + seq * 0.5,
                   "e2e_ms": None if seq == 3 else 300.125 + seq, "input_tokens": 32, "output_tokens": 4 + seq % 3,
                   "itl_ms": [10.5, 12.25, 0.125 * (seq + 1)][: 1 + seq % 3], "error": "HTTP 500" if seq == 5 else None,
                   "extra": {"queue_ms": 0.5 + seq, "finish_reason": "length", "http_status": 500 if seq == 5 else 200}}
            conn.execute("INSERT INTO requests (run_id, seq, level, start_wall, ttft_ms, e2e_ms, input_tokens, "
                         "output_tokens, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (run_id, seq, rec["level"], rec["start_wall"], rec["ttft_ms"], rec["e2e_ms"],
                          rec["input_tokens"], rec["output_tokens"], rec["error"]))
            chunk.append(rec)
        extras = zlib.compress(json.dumps({"keys": ["queue_ms", "finish_reason", "http_status"],
                                           "rows": [list(r["extra"].values()) for r in chunk]}).encode())  # type: ignore[attr-defined]
        conn.execute('INSERT INTO request_chunks (run_id, seq_start, n, counts, "values", extras) '
                     "VALUES (?, ?, ?, ?, ?, ?)",
                     (run_id, chunk_start, len(chunk),
                      np.array([len(r["itl_ms"]) for r in chunk], "<i4").tobytes(),  # type: ignore[arg-type]
                      np.array([x for r in chunk for x in r["itl_ms"]], "<f4").tobytes(), extras))  # type: ignore[attr-defined]
        records.extend(chunk)
    t = np.arange(4.0)
    conn.execute("INSERT INTO sample_chunks (run_id, source, n, names, t_mono, t_wall, data) "
                 "VALUES (?, 'gpu0', 4, '[\"util_pct\"]', ?, ?, ?)",
                 (run_id, (100.0 + t).tobytes(), (1.9e9 + t).tobytes(), (t * 10.0 + 0.1).tobytes()))
    conn.execute("INSERT INTO log_chunks (run_id, seq, n_lines, data) VALUES (?, 0, 2, ?)",
                 (run_id, zlib.compress(b"INFO one\nINFO two")))
    return records


def test_migration_to_compact_chunks_keeps_every_value(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    create_at_revision(path, "0002")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        written = {run_id: _legacy_run(conn, run_id, n) for run_id, n in ((1, 19), (2, 3))}
        conn.commit()
    with RunStore(path) as store:
        assert store.schema_revision() == _head()
        assert [(r.id, r.name, r.tags, r.metrics) for r in store.list_runs()] == [
            (2, "old 2", ["old"], {"output_tok_per_s": 12.5}), (1, "old 1", ["old"], {"output_tok_per_s": 12.5})]
        for run_id, records in written.items():
            assert store.request_records(run_id) == records
            run = store.get_run(run_id)
            assert (run.n_requests, run.n_samples, run.n_log_lines) == (len(records), 4, 2)
            assert run.config == {"features": {"prefix_caching": True}}
            block = store.samples(run_id)["gpu0"]
            assert block.t_mono.tolist() == [100.0, 101.0, 102.0, 103.0]
            assert block.column("util_pct").tolist() == [0.1, 10.1, 20.1, 30.1]
            assert store.log_lines(run_id) == ["INFO one", "INFO two"]
        req = store.requests(1)
        assert req.errors[5] == "HTTP 500" and not req.ok[5] and int(req.ok.sum()) == 18
        store.finish_run(store.create_run(name="new"), "completed")  # and it takes new runs
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "requests" not in tables


def test_not_a_database_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the run database .*bad.db"):
        RunStore(bad)
    assert bad.read_bytes().startswith(b"this is not sqlite")  # left untouched


_WRITER = """
import sys, time
from app.store import RunStore, SampleIn
store = RunStore(sys.argv[1])
run_id = store.create_run(name="doomed", t0_mono=0.0, started_at=1.9e9)
store.write_batch(run_id, samples=[SampleIn("host", float(i), 1.9e9 + i, {"x": float(i)}) for i in range(5)],
                  requests=[{"ttft_ms": 5.0, "e2e_ms": 9.0, "start_wall": 1.9e9 + 4, "output_tokens": 3}])
print(run_id, flush=True)
time.sleep(60)
"""


def test_run_of_a_killed_writer_is_interrupted_at_next_open(store_at: str) -> None:
    path = store_at
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        run_id = int(proc.stdout.readline())  # type: ignore[union-attr]
        with RunStore(path) as store:  # the writer is alive: its run stays running
            assert store.get_run(run_id).status == "running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    with RunStore(path) as store:
        run = store.get_run(run_id)
        assert store.interrupted_on_open == [run_id]
        assert run.status == "interrupted" and f"pid {proc.pid}" in (run.reason or "")
        assert run.n_samples == 5 and run.n_requests == 1
        assert run.finished_at == pytest.approx(1.9e9 + 4.009)  # its last activity, not the time we noticed
        assert run.metrics["requests_total"] == 1


def _append(path: str, name: str, n: int) -> None:
    store = RunStore(path)
    run_id = store.create_run(name=name)
    for i in range(n):
        store.write_batch(run_id, requests=_requests(50, float(i)), samples=[SampleIn("host", float(i), 0.0, {"x": 1.0})])
    store.finish_run(run_id, "completed")
    store.close()


def test_two_processes_write_the_same_store(store_at: str) -> None:
    path = store_at
    RunStore(path).close()
    run_at_once(_append, [(path, f"p{i}", 40) for i in range(2)], timeout_s=60)
    with RunStore(path) as store:
        runs = store.list_runs()
        assert sorted(r.name for r in runs) == ["p0", "p1"]
        assert all(store.get_run(r.id).n_requests == 2000 for r in runs)


def test_list_filters_resolve_edit_delete(store_at: str) -> None:
    with RunStore(store_at) as store:
        a = _run(store, "off", 50.0, False, tags=["cpu", "baseline"])
        b = _run(store, "on", 30.0, True, tags=["cpu"])
        c = store.create_run(name="other", engine_kind="sglang", model="llama-70b", started_at=1.0)
        store.finish_run(c, "failed", "the engine exited: out of memory")
        assert [r.id for r in store.list_runs(tag="baseline")] == [a]
        assert {r.id for r in store.list_runs(engine="vllm")} == {a, b}
        assert [r.id for r in store.list_runs(model="70b")] == [c]
        assert [r.id for r in store.list_runs(status="failed")] == [c]
        assert {r.id for r in store.list_runs(since=1.5e9)} == {a, b}
        assert [r.id for r in store.list_runs(until=1.5e9)] == [c]
        assert [r.id for r in store.list_runs(model="%")] == []  # LIKE wildcards are literal
        assert store.resolve(str(b)) == b and store.resolve("on") == b
        assert store.resolve(store.get_run(a).uid[:8]) == a
        with pytest.raises(StoreError, match="no run 'nope'"):
            store.resolve("nope")
        assert store.tag(a, add=["keep", "cpu"]) == ["baseline", "cpu", "keep"]
        assert store.tag(a, remove=["baseline"]) == ["cpu", "keep"]
        store.rename(a, "prefix off")
        store.set_notes(a, "first try")
        run = store.get_run(a)
        assert (run.name, run.notes) == ("prefix off", "first try")
        store.delete(b)
        assert [r.id for r in store.list_runs(engine="vllm")] == [a]
        with pytest.raises(StoreError):
            store.get_run(b)
        assert store.requests(b).ttft_ms.size == 0 and store.samples(b) == {}


def test_metrics_per_level_and_itl_percentiles(store_at: str) -> None:
    with RunStore(store_at) as store:
        run_id = store.create_run(name="m")
        recs = _requests(10, 20.0)
        recs[3] = dict(recs[3], itl_ms=[100.0] * 7)
        recs.append({"level": 0, "error": "HTTP 500", "itl_ms": [1000.0]})  # failed: excluded from latencies
        store.write_batch(run_id, requests=recs)
        store.finish_run(run_id, "completed")
        m = store.get_run(run_id).metrics
        assert m["requests_total"] == 11 and m["requests_failed"] == 1
        assert m["itl_ms_p50"] == 10.0 and m["itl_ms_mean"] == pytest.approx((9 * 7 * 10 + 7 * 100) / 70)
        assert m["tpot_ms_mean"] == pytest.approx(10.0)
        assert m["L0.requests_total"] == 6 and m["L1.requests_total"] == 5
        assert m["L1.itl_ms_p99"] == pytest.approx(100.0, rel=0.1)


def test_compare_diff_deltas_and_aligned_series(store_at: str) -> None:
    with RunStore(store_at) as store:
        off = _run(store, "off", 50.0, False)
        on = _run(store, "on", 30.0, True)
        c = compare_runs(store, [off, on], baseline=off)
        diff = dict(c.config_diff)
        assert diff == {"features.prefix_caching": [False, True]}  # only what differs
        ttft = next(m for m in c.metrics if m.name == "ttft_ms_p50")
        assert ttft.values == [50.0, 30.0] and ttft.delta == [0.0, -20.0]
        assert ttft.delta_pct[1] == pytest.approx(-40.0) and ttft.verdict(1) == "better"
        assert next(m for m in c.metrics if m.name == "runner_metric").values == [1.0, 1.0]
        (series,) = c.series
        assert series.key == "client.output_tok_per_s" and series.t_s[0] == 0.5
        assert np.nanmax(series.values[0]) == 100.0 and np.nanmax(series.values[1]) == 200.0
        c2 = compare_runs(store, [off, on], baseline=on)
        assert next(m for m in c2.metrics if m.name == "ttft_ms_p50").delta_pct[0] == pytest.approx(66.666, rel=1e-3)
        assert c.to_dict()["baseline_id"] == off
        with pytest.raises(StoreError, match="at least two"):
            compare_runs(store, [off])
        with pytest.raises(StoreError, match="baseline"):
            compare_runs(store, [off, on], baseline=store.create_run(name="x"))


def test_secrets_are_masked_even_if_the_caller_forgot(tmp_path: Path) -> None:
    with RunStore(tmp_path / "r.db") as store:
        run_id = store.create_run(name="s", env={"HF_TOKEN": "hf_abc", "VLLM_API_KEY": "k", "PATH": "/bin"},
                                  argv=["vllm", "serve", "--api-key", "k", "--hf-token=hf_abc", "--port", "1"])
        run = store.get_run(run_id)
        assert run.env == {"HF_TOKEN": "***", "VLLM_API_KEY": "***", "PATH": "/bin"}
        assert run.argv == ["vllm", "serve", "--api-key", "***", "--hf-token=***", "--port", "1"]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("r.db*"))
    assert raw and b"hf_abc" not in raw


def test_samples_with_varying_keys_merge_by_name(store_at: str) -> None:
    with RunStore(store_at) as store:
        run_id = store.create_run(name="s")
        store.write_batch(run_id, samples=[SampleIn("gpu0", 1.0, 1.0, {"a_pct": 1.0})])
        store.write_batch(run_id, samples=[SampleIn("gpu0", 2.0, 2.0, {"b_bytes": 5.0, "a_pct": 2.0}),
                                           SampleIn("host", 2.0, 2.0, {"c": float("nan")})])
        store.finish_run(run_id, "completed")
        blocks = store.samples(run_id)
        gpu = blocks["gpu0"]
        assert gpu.names == ["a_pct", "b_bytes"] and gpu.column("a_pct").tolist() == [1.0, 2.0]
        assert np.isnan(gpu.column("b_bytes")[0]) and gpu.column("b_bytes")[1] == 5.0
        assert np.isnan(blocks["host"].column("c")[0])
        assert store.get_run(run_id).n_samples == 3


def test_finish_rejects_unknown_status(store_at: str) -> None:
    with RunStore(store_at) as store:
        run_id = store.create_run(name="s")
        with pytest.raises(StoreError, match="cannot finish as 'running'"):
            store.finish_run(run_id, "running")


def test_request_fields_beyond_the_columns_survive_mixed_shapes(store_at: str) -> None:
    with RunStore(store_at) as store:
        run_id = store.create_run(name="x")
        store.write_batch(run_id, requests=[
            {"ttft_ms": 1.0, "queue_ms": 0.5, "finish_reason": "length"},
            {"ttft_ms": 2.0, "finish_reason": "stop", "queue_ms": 0.7},  # same fields, other order
            {"ttft_ms": 3.0, "http_status": 500, "error": "HTTP 500"},  # other fields
            {"ttft_ms": 4.0},
        ])
        store.write_batch(run_id, requests=[{"ttft_ms": 5.0}])  # a batch without extra fields
        records = store.request_records(run_id)
        assert [r.get("extra") for r in records] == [
            {"queue_ms": 0.5, "finish_reason": "length"}, {"queue_ms": 0.7, "finish_reason": "stop"},
            {"http_status": 500}, None, None]
        assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
        assert store.requests(run_id).errors == [None, None, "HTTP 500", None, None]


def test_migrations_build_exactly_the_models_schema(store_at: str) -> None:
    """No drift between db/models.py and db/migrations: autogenerate finds nothing to do."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from db.models import Base

    with RunStore(store_at) as store, store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_latencies_are_kept_to_a_thousandth_and_typed_values_exactly() -> None:
    """Measured latencies keep 10 significant bits of their microseconds (at most 0.1% off);
    whole microseconds, odd values and an empty list come back exactly."""
    from db.codecs import decode_itl, encode_itl

    rng = np.random.default_rng(7)
    measured = np.concatenate([rng.gamma(8, 2, 5000), rng.uniform(0, 2, 500), rng.lognormal(3, 3, 500)])
    back = decode_itl(encode_itl(measured))
    assert np.all(np.abs(back - measured) <= np.maximum(measured * 2.0**-10, 0.0005))
    assert abs(back[:5000].mean() - measured[:5000].mean()) < measured[:5000].mean() * 1e-5  # not biased
    typed = np.array([10.0, 50.0, 0.125, 12.345, 0.0, 99999.999])
    assert decode_itl(encode_itl(typed)).tolist() == typed.tolist()
    odd = np.array([16.123456, -1.0, np.inf, 1e300, 2.0**70, 7.5])
    assert decode_itl(encode_itl(odd))[1:5].tolist() == [-1.0, np.inf, 1e300, 2.0**70]
    assert np.isnan(decode_itl(encode_itl(np.array([np.nan, 1.0]))))[0]
    assert decode_itl(encode_itl(np.empty(0))).size == 0
    assert len(encode_itl(rng.gamma(8, 2, 63 * 111))) < 63 * 111 * 1.35  # about 10 bits a latency


def test_request_fields_keep_their_types_and_times_their_microseconds(store_at: str) -> None:
    with RunStore(store_at) as store:
        run_id = store.create_run(name="x")
        records = [{"level": 1, "start_wall_s": 1.9e9 + i / 3, "ttft_ms": 12.3456789, "e2e_ms": None,
                    "output_tokens": "7", "ok": i != 2, "error_kind": "http" if i == 2 else None,
                    "scheduled_s": i / 3, "index": i, "flag": True, "note": {"a": [1, 2]}, "big": 2**70,
                    "ratio": 1 / 3} for i in range(4)]
        store.write_batch(run_id, requests=records)
        got = store.request_records(run_id)
    assert [r["error"] for r in got] == [None, None, "http", None]
    first = got[0]
    assert (first["level"], first["ttft_ms"], first["e2e_ms"], first["output_tokens"]) == (1, 12.346, None, 7)
    assert [r["start_wall"] for r in got] == [round(1.9e9 + i / 3, 6) for i in range(4)]
    assert first["extra"] == {"scheduled_s": 0.0, "index": 0, "flag": True, "note": {"a": [1, 2]}, "big": 2**70,
                              "ratio": 1 / 3, "error_kind": None}
    assert got[3]["extra"]["scheduled_s"] == round(1 / 1, 6) and got[1]["extra"]["scheduled_s"] == 0.333333


def test_downgrade_to_row_per_request_and_back_keeps_runs(tmp_path: Path) -> None:
    from alembic import command

    from db.schema import open_engine

    path = tmp_path / "r.db"
    with RunStore(path) as store:
        a = _run(store, "a", 40.0, True)
        store.write_batch(a, requests=[{"ttft_ms": 1.5, "itl_ms": [16.123456], "note": "x"}])  # a lossy latency
        before = store.request_records(a), store.samples(a)["client"].values.tolist()
    engine = open_engine(path, 5.0)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0003")
    engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM requests").fetchone() == (21,)
    with RunStore(path) as store:
        assert store.schema_revision() == _head()
        assert (store.request_records(a), store.samples(a)["client"].values.tolist()) == before


def test_figures_that_are_not_finite_are_stored_as_they_are(store_at: str) -> None:
    """A level without a percentile (NaN) or an unbounded ratio (Infinity): PostgreSQL's own JSON
    types refuse both, so JSON is kept as text there as in SQLite."""
    with RunStore(store_at) as store:
        run_id = store.create_run(name="nan", config={"ratio": float("inf")})
        store.start_level(run_id, 0, "c=1", {"concurrency": 1}, 1.9e9)
        store.finish_level(run_id, 0, {"ttft_ms_p99": float("nan")}, 1.9e9 + 1)
        store.finish_run(run_id, "completed", None, {"speedup": float("-inf")})
        run = store.get_run(run_id)
        assert run.config["ratio"] == float("inf") and run.summary["speedup"] == float("-inf")
        assert np.isnan(run.levels[0].summary["ttft_ms_p99"])  # type: ignore[index]


def test_a_batch_retried_after_its_commit_arrived_is_written_once(store_at: str) -> None:
    """A connection lost while the commit's answer was on its way back: the store did write the
    batch, the writer tries again at the same places, and finds it there."""
    with RunStore(store_at) as store:
        uid = "retried-run"
        run_id = store.create_run(uid=uid, name="r")
        assert store.create_run(uid=uid, name="r") == run_id  # the retried create: the same run
        store.write_batch(run_id, requests=_requests(3, 1.0), log_lines=["first"])
        places = dict(store._seq)  # what the writer knew before the batch whose answer was lost
        batch = {"requests": _requests(4, 2.0), "log_lines": ["second", "third"]}
        store.write_batch(run_id, **batch)  # type: ignore[arg-type]
        store._seq.update(places)
        store.write_batch(run_id, **batch)  # type: ignore[arg-type]  # the retry
        store.write_batch(run_id, requests=_requests(1, 3.0))
        store.finish_run(run_id, "completed")
        run = store.get_run(run_id)
        assert run.n_requests == 8 and run.n_log_lines == 3
        assert store.requests(run_id).ttft_ms.tolist() == [1.0] * 3 + [2.0] * 4 + [3.0]
        assert store.log_lines(run_id) == ["first", "second", "third"]
        store._seq.update({(run_id, "requests"): 0})  # a different batch where one is stored: a real conflict
        with pytest.raises(StoreError):
            store.write_batch(run_id, requests=_requests(2, 9.0))
