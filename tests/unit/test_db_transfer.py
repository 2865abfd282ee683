"""`tunebench db copy|upgrade|check` and ``db.transfer``: runs and tunes moved between SQLite and
PostgreSQL row for row, a copy that can be repeated, and a check that finds damaged runs."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import JSON, select, text

from app.cli import main
from app.cli.db_cmds import Progress
from app.store import ImportedRun, LevelInfo, RunStore, SampleIn, create_at_revision
from db import tune_store
from db.models import Base
from db.schema import head_revision
from db.transfer import CopyReport, check_store, copy_runs
from tests.pg_server import PgServer

T0 = 1.9e9


def _request(i: int, **extra: Any) -> dict[str, Any]:
    return {"ttft_ms": 1.0 + i, "e2e_ms": 5.0 + i, "input_tokens": 3, "output_tokens": 4, "itl_ms": [1.0, 2.0, 3.0],
            "start_wall": T0 + i, "level": 0, **extra}


def _recorded(store: RunStore, name: str, *, status: str = "completed") -> int:
    """A run as a recording writes it: two flushes, two levels (the second never finished), tags,
    events (one without a payload), an engine log and a final status with metrics."""
    run_id = store.create_run(name=name, tags=["cpu", "copy"], notes="notes\nin two lines", engine_kind="vllm",
                              model="tunebench:demo", engine_version="0.9", config={"b": 1, "a": {"z": 2, "y": [1]}},
                              argv=["vllm", "serve"], env={"HF_HOME": "/x"}, hardware={"gpus": [{"name": "H200"}]},
                              endpoint="http://127.0.0.1:8000", started_at=T0, t0_mono=10.0)
    store.start_level(run_id, 0, "c=1", {"concurrency": 1}, started_at=T0)
    store.write_batch(run_id, requests=[_request(0), _request(1, error="HTTP 500", http_status=500)],
                      samples=[SampleIn("client", 10.0, T0, {"x": 1.0}), SampleIn("gpu", 10.0, T0, {"util": 0.5})],
                      log_lines=["a", "b"], events=[(T0, "phase", {"to": "x"}), (T0 + 1, "ready", None)])
    store.write_batch(run_id, requests=[_request(2)], samples=[SampleIn("client", 11.0, T0 + 1, {"x": 2.0})],
                      log_lines=["c"], dropped_items=3)
    store.finish_level(run_id, 0, {"ttft_ms_p50": 2.0, "speedup": float("inf")}, finished_at=T0 + 2)  # not JSON to PostgreSQL
    store.start_level(run_id, 1, "c=2", {"concurrency": 2}, started_at=T0 + 2)  # summary stays SQL NULL
    if status != "running":
        store.finish_run(run_id, status, "the engine stopped" if status == "failed" else None, {"runner": 1.0},
                         finished_at=T0 + 5)
    return run_id


def _imported(store: RunStore) -> int:
    (run_id,) = store.import_runs([ImportedRun(
        name="imported", imported_from="bench.json", started_at=T0, finished_at=T0 + 9, model="m",
        requests=[_request(i) for i in range(5)], samples=[SampleIn("client", 1.0, T0, {"x": 3.0})],
        log_lines=["imported line"], levels=[LevelInfo(idx=0, label="rate=1", summary={"n": 5})],
        extra_metrics={"their_figure": 1.5})])
    return run_id


def _tune(store: RunStore, trial_runs: list[int | None]) -> None:
    tune_store.create_tune(store, "tune-1", name="tune one", profile="demo", strategy="grid", slo="ttft_p95<500",
                           doc={"space": {"max_num_seqs": [8, 16]}, "pick": None})
    tune_store.put_trials(store, "tune-1", [
        (i, {"candidate": i, "status": "completed", "knobs": {"max_num_seqs": 8 * (i + 1)}, "load_value": 4.0,
             "run_id": run_id, "figures": {"ttft_ms_p95": 100.0 + i}, "started_at": T0, "finished_at": T0 + 1})
        for i, run_id in enumerate(trial_runs)])
    tune_store.update_tune(store, "tune-1", status="completed", doc={"pick": 0})


def _source(path: Path) -> tuple[RunStore, dict[str, int]]:
    store = RunStore(path)
    ids = {"completed": _recorded(store, "completed run"), "failed": _recorded(store, "failed run", status="failed"),
           "imported": _imported(store), "running": _recorded(store, "running run", status="running")}
    _tune(store, [ids["completed"], ids["running"], None])
    return store, ids


def _dump(store: RunStore) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, with the store's own keys replaced by what they stand for (a run
    id by the run's uid; a sample chunk's or an event's id by its place among its run's rows) and
    SQL NULL told from JSON null in JSON columns."""
    out: dict[str, list[dict[str, Any]]] = {}
    with store.engine.connect() as conn:
        uid_of = dict(conn.execute(text("SELECT id, uid FROM runs")).all())
        for name, table in Base.metadata.tables.items():
            flags = [c.is_(None).label(f"{c.name} is SQL NULL") for c in table.columns if isinstance(c.type, JSON)]
            rows = []
            for row in conn.execute(select(table, *flags).order_by(*table.primary_key.columns)).mappings():
                values = {k: bytes(v) if isinstance(v, memoryview) else bool(v) if k.endswith("SQL NULL") else v
                          for k, v in row.items()}
                if name == "runs":
                    del values["id"]
                elif "run_id" in values:
                    values["run_id"] = uid_of.get(values["run_id"])
                    values.pop("id", None)
                rows.append(values)
            if name not in ("campaigns", "campaign_runs"):  # by run (a stable sort: a run's rows keep their order)
                rows.sort(key=lambda r: str(r.get("uid") or r.get("run_id")))
            out[name] = rows
    return out


def _same_runs(a: RunStore, b: RunStore, uid: str) -> None:
    """The run ``uid`` reads back the same from both stores, through the store's own readers."""
    ra, rb = a.get_run(uid), b.get_run(uid)
    assert ra.model_dump(exclude={"id"}) == rb.model_dump(exclude={"id"})
    assert list(ra.config) == list(rb.config)  # JSON objects keep their order
    assert (ra.tags, ra.levels, ra.metrics) == (rb.tags, rb.levels, rb.metrics)
    qa, qb = a.requests(ra.id), b.requests(rb.id)
    for field in ("level", "start_wall", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens", "ok", "itl_flat",
                  "itl_bounds"):
        np.testing.assert_array_equal(getattr(qa, field), getattr(qb, field))
    assert qa.errors == qb.errors
    assert a.request_records(ra.id) == b.request_records(rb.id)
    sa, sb = a.samples(ra.id), b.samples(rb.id)
    assert sa.keys() == sb.keys()
    for source in sa:
        assert sa[source].names == sb[source].names
        for field in ("t_mono", "t_wall", "values"):
            np.testing.assert_array_equal(getattr(sa[source], field), getattr(sb[source], field))
    assert a.log_lines(ra.id) == b.log_lines(rb.id)


def test_sqlite_to_postgresql_to_sqlite_keeps_every_row(tmp_path: Path, pg_server: PgServer) -> None:
    src, ids = _source(tmp_path / "first.db")
    running_uid = src.get_run(ids["running"]).uid
    progress: list[tuple[int, int, str]] = []
    with src, RunStore(pg_server.create_database()) as pg, RunStore(tmp_path / "second.db") as last:
        first = copy_runs(src, pg, on_progress=lambda *step: progress.append(step))
        assert first == CopyReport(copied=3, skipped_running=1, campaigns_copied=1, running=[running_uid])
        assert [(done, total) for done, total, _ in progress] == [(1, 4), (2, 4), (3, 4), (4, 4)]
        assert copy_runs(pg, last) == CopyReport(copied=3, campaigns_copied=1)

        for uid in (src.get_run(ids[k]).uid for k in ("completed", "failed", "imported")):
            _same_runs(src, pg, uid)
            _same_runs(src, last, uid)
        expected = _dump(src)
        expected["runs"] = [r for r in expected["runs"] if r["uid"] != running_uid]
        for name in ("run_tags", "levels", "request_chunks", "sample_chunks", "log_chunks", "run_events"):
            expected[name] = [r for r in expected[name] if r["run_id"] != running_uid]
        trial_runs = [t["run_id"] for t in expected["campaign_runs"]]
        assert trial_runs == [src.get_run(ids["completed"]).uid, running_uid, None]
        expected["campaign_runs"][1]["run_id"] = None  # its run was not copied
        assert _dump(pg) == expected
        assert _dump(last) == expected
        tune = tune_store.get_tune(last, "tune-1")
        assert [t["run_id"] for t in tune.trials] == [last.get_run(src.get_run(ids["completed"]).uid).id, None, None]
        assert (tune.status, tune.doc) == ("completed", {"space": {"max_num_seqs": [8, 16]}, "pick": 0})


def test_copying_again_copies_nothing_twice(tmp_path: Path, store_at: str) -> None:
    src, ids = _source(tmp_path / "src.db")
    with src, RunStore(store_at) as dst:
        assert copy_runs(src, dst).copied == 3
        before = _dump(dst)
        again = copy_runs(src, dst)
        assert again == CopyReport(skipped_existing=3, skipped_running=1, campaigns_skipped=1,
                                   running=[src.get_run(ids["running"]).uid])
        assert _dump(dst) == before


def test_a_running_run_is_left_behind_until_it_ends(tmp_path: Path, store_at: str) -> None:
    with RunStore(tmp_path / "src.db") as src, RunStore(store_at) as dst:
        run_id = _recorded(src, "still recording", status="running")
        uid = src.get_run(run_id).uid
        assert copy_runs(src, dst) == CopyReport(skipped_running=1, running=[uid])
        assert dst.list_runs() == []
        src.finish_run(run_id, "completed")
        assert copy_runs(src, dst) == CopyReport(copied=1)
        _same_runs(src, dst, uid)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_copy_names_both_stores_and_never_the_password(tmp_path: Path, pg_server: PgServer,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src, ids = _source(tmp_path / "src.db")
    src.close()
    database = pg_server.create_database().rsplit("/", 1)[1]
    url = pg_server.url(database, password="Hunter2Secret")
    code, out, err = _cli(capsys, "db", "copy", str(tmp_path / "src.db"), url)
    assert code == 0, err
    shown = f"postgresql+psycopg://tb:***@127.0.0.1:{pg_server.port}/{database}"
    assert out == (f"copied 3 runs from {tmp_path / 'src.db'} to {shown} (0 already there, 1 still running: "
                   f"not copied); 1 campaign (ladders, tunes; 0 already there)\n")
    assert err.splitlines() == [f"copying: {n}/4 runs ({25 * n}%)" for n in range(1, 5)]  # not a terminal
    code, out, err = _cli(capsys, "db", "copy", url, str(tmp_path / "back.db"), "--json")
    assert code == 0, err
    assert json.loads(out) == {"source": shown, "destination": str(tmp_path / "back.db"), "copied": 3,
                               "skipped_existing": 0, "skipped_running": 0, "campaigns_copied": 1, "campaigns_skipped": 0,
                               "campaigns_running": 0, "running": []}
    code, out, err = _cli(capsys, "db", "copy", str(tmp_path / "src.db"), url)
    assert (code, out) == (0, f"copied 0 runs from {tmp_path / 'src.db'} to {shown} (3 already there, 1 still "
                              f"running: not copied); 0 campaigns (ladders, tunes; 1 already there)\n")
    code, out, err = _cli(capsys, "db", "copy", url, url.replace("Hunter2Secret", "other"))
    assert code == 2 and "both the source and the destination" in err
    code, out, err = _cli(capsys, "db", "copy", str(tmp_path / "src.db"),
                          pg_server.url("no_such_database", password="Hunter2Secret"))
    assert code == 2 and err.startswith("tunebench: error: ") and len(err.splitlines()) == 1
    code, out, err = _cli(capsys, "db", "check", "--db", url)
    assert code == 0, err
    assert "Hunter2Secret" not in "".join(capsys.readouterr()) + out + err


def test_progress_is_a_bar_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress(stream)
    for done in range(1, 5):
        progress(done, 4, "uid")
    progress.finish()
    assert stream.getvalue() == ("\r[#####...............] 1/4 runs\r[##########..........] 2/4 runs"
                                 "\r[###############.....] 3/4 runs\r[####################] 4/4 runs\n")


def test_check_passes_a_sound_store_and_names_a_damaged_run(store_at: str, capsys: pytest.CaptureFixture[str]) -> None:
    with RunStore(store_at) as store:
        good = _recorded(store, "good")
        bad = _recorded(store, "bad")
        _recorded(store, "running", status="running")
        bad_uid = store.get_run(bad).uid
    code, out, err = _cli(capsys, "db", "check", "--db", store_at)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1:] == [f"revision:  {head_revision()} (newest: {head_revision()})", "runs:      2 completed, 1 running",
                         "problems:  none"]
    with RunStore(store_at) as store, store.engine.begin() as conn:
        conn.execute(text("UPDATE request_chunks SET columns = :blob WHERE run_id = :run"), {"blob": b"\x00", "run": bad})
    code, out, err = _cli(capsys, "db", "check", "--db", store_at)
    assert code == 1, err
    assert "problems:  1" in out
    (problem,) = [line for line in out.splitlines() if line.startswith("  - ")]
    assert problem.startswith(f"  - run {bad} ({bad_uid}): its stored requests, telemetry or log do not decode")
    code, out, _ = _cli(capsys, "db", "check", "--db", store_at, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and len(doc["problems"]) == 1
    assert doc["runs_by_status"] == {"completed": 2, "running": 1}
    with RunStore(store_at) as store:
        assert check_store(store).problems == doc["problems"]
        assert store.get_run(good).status == "completed"


def test_upgrade_reports_the_revision_it_came_from(store_at: str, capsys: pytest.CaptureFixture[str]) -> None:
    head = head_revision()
    create_at_revision(store_at, "0005")
    code, out, err = _cli(capsys, "db", "upgrade", "--db", store_at)
    assert code == 0, err
    assert out.endswith(f": schema at revision {head} (was 0005)\n")
    code, out, err = _cli(capsys, "db", "upgrade", "--db", store_at)
    assert (code, out.split(": ", 1)[1]) == (0, f"schema at revision {head} (was {head}: already current)\n")


def test_upgrade_of_a_new_store_and_of_a_foreign_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "db", "upgrade", "--db", str(tmp_path / "new.db"))
    assert (code, out) == (0, f"{tmp_path / 'new.db'}: schema at revision {head_revision()} (was none: a new store)\n")
    import sqlite3

    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE accounts (id INTEGER)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    code, out, err = _cli(capsys, "db", "upgrade", "--db", str(foreign))
    assert code == 2 and "not a tunebench run database" in err and out == ""
    assert foreign.read_bytes() == before  # refused untouched


def test_a_run_of_many_chunks_is_copied_in_batches(store_at: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from db import transfer

    monkeypatch.setattr(transfer, "BATCH_ROWS", 4)
    with RunStore(store_at) as src, RunStore(tmp_path / "dst.db") as dst:
        run_id = src.create_run(name="many flushes", started_at=T0)
        for i in range(10):
            src.write_batch(run_id, requests=[_request(i)], log_lines=[f"line {i}"],
                            events=[(T0 + i, "tick", {"i": i})])
        src.finish_run(run_id, "completed")
        assert copy_runs(src, dst) == CopyReport(copied=1)
        uid = src.get_run(run_id).uid
        _same_runs(src, dst, uid)
        assert [e["payload"] for e in dst.get_run(uid).events] == [{"i": i} for i in range(10)]
        assert _dump(dst)["request_chunks"] == _dump(src)["request_chunks"]
