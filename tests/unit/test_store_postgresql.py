"""The store on a real PostgreSQL server (a throwaway one per session, tests/pg_server.py): what
only a server can do to a run: go away mid-run, be written by two processes at once, refuse a
database that is not tunebench's. The backend-neutral store tests run on both backends
(the ``store_at`` fixture)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from app.bus import Bus
from app.cli import main
from app.recording import RunRecorder, unspill
from app.store import RunStore, SampleIn, StoreError
from db import tune_store
from db.models import Campaign, Run
from engine_adapters.process_group import pid_namespace
from tests.pg_server import PgServer
from tests.spawned import run_at_once
from tests.unit.test_store_recording import _finish, _request, _start

REQUESTS_PER_RUN = 10_000
RUNS_PER_PROCESS = 50


def test_a_server_away_for_five_seconds_mid_run_loses_no_request(pg_server: PgServer) -> None:
    url = pg_server.create_database()
    with RunStore(url) as store:
        bus = Bus()
        recorder = RunRecorder(bus, store, flush_interval_s=0.2)
        _start(bus)
        for i in range(100):
            _request(bus, i)
        recorder.flush()
        sent = [100]
        stop = threading.Event()

        def keep_sending() -> None:  # requests keep finishing through the outage
            while not stop.is_set():
                _request(bus, sent[0])
                sent[0] += 1
                time.sleep(0.01)

        sender = threading.Thread(target=keep_sending)
        sender.start()
        try:
            time.sleep(0.5)
            pg_server.stop("fast")  # open connections are cut, as when a server restarts
            time.sleep(5.0)
        finally:
            pg_server.start()  # from this thread: the server lives as long as the thread that started it
            time.sleep(1.0)
            stop.set()
            sender.join()
        _finish(bus)
        recorder.close()
        assert any("went away" in e for e in recorder.errors), recorder.errors
        assert not recorder.unstored, recorder.unstored
        run = store.get_run(recorder.run_id)  # type: ignore[arg-type]
        assert run.status == "completed" and run.n_requests == sent[0]
        assert sorted(store.requests(run.id).ttft_ms.tolist()) == [10.0 + i for i in range(sent[0])]


def test_a_server_away_past_the_limit_spills_the_run_and_unspill_stores_it(
        pg_server: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_server.create_database()
    store = RunStore(url)
    bus = Bus()
    recorder = RunRecorder(bus, store, flush_interval_s=0.2, outage_limit_s=1.0)
    try:
        _start(bus)
        for i in range(10):
            _request(bus, i)
        recorder.flush()
        pg_server.stop("fast")
        for i in range(10, 25):
            _request(bus, i)
        bus.sample("host", {"cpu_util_pct": 50.0})
        _finish(bus, output_tok_per_s=1.0)
        recorder.close(timeout_s=60)
    finally:
        pg_server.start()
    (problem,) = recorder.unstored.values()
    spill = Path(problem.split(" are kept in ")[1].split(";")[0])
    assert spill.exists() and "tunebench db unspill" in problem
    assert main(["db", "unspill", str(spill), "--db", url]) == 0
    assert f"removed {spill}" in capsys.readouterr().out
    with RunStore(url) as again:
        run = again.get_run(recorder.run_id)  # type: ignore[arg-type]
        assert run.status == "completed" and run.n_requests == 25 and run.n_samples >= 1
        assert sorted(again.requests(run.id).ttft_ms.tolist()) == [10.0 + i for i in range(25)]
        assert not spill.exists()
        with pytest.raises(StoreError, match="cannot read the spill file"):
            unspill(spill, again)
    store.close()


def _write_runs(url: str, name: str) -> None:
    with RunStore(url) as store:
        for r in range(RUNS_PER_PROCESS):
            run_id = store.create_run(name=f"{name}-{r}")
            records = [{"level": 0, "start_wall": 1.9e9 + i, "ttft_ms": float(i), "e2e_ms": float(i) + 5,
                        "input_tokens": 16, "output_tokens": 4, "itl_ms": [1.0, 2.0, 3.0]}
                       for i in range(REQUESTS_PER_RUN)]
            for start in range(0, REQUESTS_PER_RUN, 2_500):  # a recording's flushes
                store.write_batch(run_id, requests=records[start:start + 2_500],
                                  samples=[SampleIn("host", float(start), 1.9e9 + start, {"x": 1.0})])
            store.finish_run(run_id, "completed")


def test_two_processes_write_fifty_runs_each_into_one_database(pg_server: PgServer) -> None:
    url = pg_server.create_database()
    RunStore(url).close()
    run_at_once(_write_runs, [(url, f"p{i}") for i in range(2)], timeout_s=300)
    with RunStore(url) as store:
        runs = store.list_runs()
        assert len(runs) == 2 * RUNS_PER_PROCESS and len({r.id for r in runs}) == len(runs)
        assert len({r.uid for r in runs}) == len(runs)
        assert {r.name for r in runs} == {f"p{i}-{r}" for i in range(2) for r in range(RUNS_PER_PROCESS)}
        assert all(r.status == "completed" and r.metrics["requests_total"] == REQUESTS_PER_RUN for r in runs)
        assert store.requests(runs[0].id).ttft_ms.tolist() == [float(i) for i in range(REQUESTS_PER_RUN)]


def test_a_run_another_host_or_container_is_recording_stays_running(pg_server: PgServer) -> None:
    """Only where its writer's pid means something can one tell a run's writer died: on another
    host, or in another container of this host (one host name with --net=host, other pids)."""
    url = pg_server.create_database()
    here = pid_namespace()
    elsewhere = {"another host": "gpu-box-7/1234abcd/4026531836",
                 "another container here": f"{here.rsplit('/', 1)[0]}/4026539999"}
    host_name, boot, namespace_here = here.split("/")
    gone = {"this one": here, "this host before its reboot": f"{host_name}/{'0' * 8}/{namespace_here}"}
    with RunStore(url) as store:
        ids = {}
        for name, namespace in {**elsewhere, **gone}.items():
            ids[name] = store.create_run(name=name)
            with store.engine.begin() as conn:  # its writer: a pid that is long gone (here)
                conn.execute(update(Run).where(Run.id == ids[name]).values(
                    host=namespace.split("/")[0], writer_pid=2**22 + 7, writer_create_time=1.0,
                    writer_namespace=namespace))
    with RunStore(url) as store:
        assert sorted(store.interrupted_on_open) == sorted(ids[name] for name in gone)
        assert [store.get_run(ids[name]).status for name in elsewhere] == ["running", "running"]
        (info,) = store.list_runs(host="gpu-box-7")
        assert info.id == ids["another host"] and store.list_runs(host="elsewhere") == []


def test_a_tune_another_host_is_running_is_not_taken_for_dead(pg_server: PgServer) -> None:
    url = pg_server.create_database()
    with RunStore(url) as store:
        tune_store.create_tune(store, "t-1", name="t", profile="p", strategy="grid", slo="", doc={})
        assert tune_store.get_tune(store, "t-1").writer_is_alive  # this process
        with store.engine.begin() as conn:
            conn.execute(update(Campaign).where(Campaign.id == "t-1").values(writer_pid=2**22 + 7, writer_create_time=1.0))
        assert not tune_store.get_tune(store, "t-1").writer_is_alive  # a dead process of this host
        with store.engine.begin() as conn:
            conn.execute(update(Campaign).where(Campaign.id == "t-1").values(writer_namespace="gpu-box-7/1234abcd/1"))
        assert tune_store.get_tune(store, "t-1").writer_is_alive  # only gpu-box-7 can tell


def test_runs_record_their_author_and_host(pg_server: PgServer, monkeypatch: pytest.MonkeyPatch) -> None:
    url = pg_server.create_database()
    monkeypatch.setenv("TUNEBENCH_AUTHOR", "ada")
    with RunStore(url) as store:
        run_id = store.create_run(name="r", hardware={"hostname": "h", "gpus": [{"name": "NVIDIA H200"}] * 2})
        run = store.get_run(run_id)
        assert run.author == "ada" and run.host and run.gpu_model == "NVIDIA H200"
        assert [r.id for r in store.list_runs(author="ada", gpu_model="H200")] == [run_id]
        assert store.list_runs(author="bob") == []


def test_a_database_of_another_program_is_refused(pg_server: PgServer) -> None:
    url = pg_server.create_database()
    pg_server.psql("CREATE TABLE invoices (id int)", database=url.rsplit("/", 1)[1])
    with pytest.raises(StoreError, match="not a tunebench run database .*invoices"):
        RunStore(url)


def test_a_missing_database_and_a_password_are_reported_in_one_line(
        pg_server: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_server.url("no_such_db", password="Hunter2Secret")
    assert main(["runs", "list", "--db", url]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Hunter2Secret" not in err
    assert 'database "no_such_db" does not exist' in err and "CREATE DATABASE no_such_db" in err
    good = pg_server.create_database()
    with_password = good.replace(f"{pg_server.user}@", f"{pg_server.user}:Hunter2Secret@")
    with RunStore(with_password) as store:
        run_id = store.create_run(name="p", endpoint="http://x:Hunter2Secret@127.0.0.1:1/v1")
        store.finish_run(run_id, "completed")
        assert "Hunter2Secret" not in store.where
    assert main(["runs", "list", "--db", with_password]) == 0
    out, err = capsys.readouterr()
    assert "Hunter2Secret" not in out + err
    dump = pg_server.psql("SELECT row_to_json(r)::text FROM runs r", database=good.rsplit("/", 1)[1])
    assert "Hunter2Secret" not in dump and dump


@pytest.fixture()
def password_role(pg_server: PgServer) -> tuple[str, str]:
    """A role that must give its password (scram), owning a database of its own: (role, database)."""
    role, database, password = "tb_pw", f"tb_pw_{os.getpid()}_{time.monotonic_ns()}", "S3cret-pw"
    hba = pg_server.data_dir / "pg_hba.conf"
    rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    if rule not in hba.read_text():
        hba.write_text(rule + hba.read_text())  # before the trust rules: the first match decides
        pg_server.psql("SELECT pg_reload_conf()")
    if not pg_server.psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'"):
        pg_server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    pg_server.psql(f"CREATE DATABASE {database} OWNER {role}")
    _until_passwords_are_asked(pg_server, role, database)
    return role, database


def _until_passwords_are_asked(pg_server: PgServer, role: str, database: str, timeout_s: float = 30.0) -> None:
    """``pg_reload_conf()`` only signals the server: the new rule applies a moment later. Until a
    wrong password is refused, a connection may still be trusted."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(host=pg_server.host, port=pg_server.port, user=role, password="not-the-password",
                            dbname=database, connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            if "password authentication failed" in str(exc):
                return
            raise
        assert time.monotonic() < deadline, f"the server did not ask {role} for a password within {timeout_s:g} s"
        time.sleep(0.05)


def test_passwords_come_from_the_url_pgpassword_pgpass_or_a_service_file(
        pg_server: PgServer, password_role: tuple[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    role, database = password_role
    plain = f"postgresql://{role}@{pg_server.host}:{pg_server.port}/{database}"
    for var in ("PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "PGSERVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))  # never the user's own ~/.pgpass

    assert main(["runs", "list", "--db", plain.replace(f"{role}@", f"{role}:Wrong-guess@")]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "Wrong-guess" not in err
    assert "password authentication failed" in err and "PGPASSWORD, ~/.pgpass" in err

    assert main(["runs", "list", "--db", plain.replace(f"{role}@", f"{role}:S3cret-pw@")]) == 0
    assert "S3cret-pw" not in "".join(capsys.readouterr())

    monkeypatch.setenv("PGPASSWORD", "S3cret-pw")
    assert main(["runs", "list", "--db", plain]) == 0
    monkeypatch.delenv("PGPASSWORD")

    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"{pg_server.host}:{pg_server.port}:{database}:{role}:S3cret-pw\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    assert main(["runs", "list", "--db", plain]) == 0

    services = tmp_path / "pg_service.conf"
    services.write_text(f"[team]\nhost={pg_server.host}\nport={pg_server.port}\ndbname={database}\nuser={role}\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    with RunStore("postgresql:///?service=team") as store:
        store.finish_run(store.create_run(name="through the service file"), "completed")
    with RunStore(plain) as store:
        assert [r.name for r in store.list_runs()] == ["through the service file"]
    capsys.readouterr()


def test_an_idle_connection_to_a_restarted_server_is_replaced_before_use(
        pg_server: PgServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """History, read again after the server restarted, gets a fresh connection: no error shown."""
    url = pg_server.create_database()
    with RunStore(url) as store:
        store.finish_run(store.create_run(name="before the restart"), "completed")
        assert len(store.list_runs()) == 1  # its connection goes back to the pool
        pg_server.stop("fast")
        pg_server.start()
        monkeypatch.setattr("db.schema.IDLE_PING_S", 0.0)  # as if idle for long
        assert [r.name for r in store.list_runs()] == ["before the restart"]


def test_two_processes_ending_one_run_pack_its_telemetry_once(pg_server: PgServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes that found one run orphaned both end it: the second waits for the first,
    where packing the telemetry at once would keep every sample twice."""
    url = pg_server.create_database()
    with RunStore(url) as store:
        run_id = store.create_run(name="found orphaned twice")
        for t in range(3):
            store.write_batch(run_id, samples=[SampleIn("host", float(t), 1.9e9 + t, {"x": float(t)})])
    import db.writes

    packing, go_on = threading.Event(), threading.Event()
    real_encode = db.writes.encode_series

    def first_one_pauses(block: Any) -> bytes:  # the first process stops between reading and writing
        if not packing.is_set():
            packing.set()
            go_on.wait(30)
        return real_encode(block)

    monkeypatch.setattr(db.writes, "encode_series", first_one_pauses)

    def end_it() -> None:
        with RunStore(url, mark_interrupted=False) as other:
            other.finish_run(run_id, "interrupted", "its writer died")

    first = threading.Thread(target=end_it)
    first.start()
    assert packing.wait(30)
    second = threading.Thread(target=end_it)
    second.start()
    time.sleep(1.0)  # the second reads and packs now, unless it waits for the first
    go_on.set()
    first.join(60)
    second.join(60)
    with RunStore(url, mark_interrupted=False) as store:
        assert store.samples(run_id)["host"].column("x").tolist() == [0.0, 1.0, 2.0]
