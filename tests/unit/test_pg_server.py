"""The throwaway PostgreSQL server of the tests (tests/pg_server.py): it starts, hands out
databases SQLAlchemy can use, listens on 127.0.0.1 only, survives a stop/start with its data,
dies with the process that started it, and says how to install PostgreSQL when it is missing."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy

from tests import pg_server
from tests.pg_server import PgServer, PgServerMissing, start_pg_server

_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    server = start_pg_server(tmp_path_factory.mktemp("pg"))
    try:
        yield server
    finally:
        server.close()


def _listening_addresses(port: int) -> list[str]:
    """Addresses of the TCP sockets listening on ``port`` (IPv4 and IPv6), from /proc/net."""
    found: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        lines = Path(table).read_text().splitlines()[1:] if Path(table).exists() else []
        for line in lines:
            fields = line.split()
            address_hex, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            if len(address_hex) == 8:  # IPv4, little-endian
                found.append(".".join(str(b) for b in reversed(bytes.fromhex(address_hex))))
            else:
                found.append(f"ipv6:{address_hex}")
    return found


DURABILITY_QUERY = "show fsync; show synchronous_commit; show full_page_writes"


def test_a_test_server_skips_syncing_and_a_crash_safe_one_syncs(pg: PgServer, tmp_path: Path) -> None:
    """The suite's servers trade crash safety for speed; a benchmark's is crash safe (it may lose
    the last commits on a power loss, as SQLite's WAL with synchronous=NORMAL may)."""
    assert pg.psql(DURABILITY_QUERY).splitlines() == ["off", "off", "off"]
    with start_pg_server(tmp_path, crash_safe=True) as safe:
        assert safe.psql(DURABILITY_QUERY).splitlines() == ["on", "off", "on"]


def test_server_starts_and_accepts_a_connection(pg: PgServer) -> None:
    assert pg.running and pg.host == "127.0.0.1" and pg.user == "tb"
    assert pg.psql("select current_user, current_database()") == "tb\tpostgres"
    with psycopg.connect(host=pg.host, port=pg.port, user="tb", dbname="postgres") as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert (pg.data_dir / "postmaster.pid").read_text().splitlines()[0] == str(pg.pid)


def test_psql_returns_every_result_as_text(pg: PgServer) -> None:
    out = pg.psql("create temp table t(a int, b text); insert into t values (1, 'x'), (2, null); "
                  "select a, b from t order by a; select 'end'")
    assert out == "1\tx\n2\t\nend"


def test_url_names_the_server_the_user_and_the_database(pg: PgServer) -> None:
    assert pg.url() == f"postgresql+psycopg://tb@127.0.0.1:{pg.port}/postgres"
    assert pg.url("db1", password="p@ss:w/rd") == f"postgresql+psycopg://tb:p%40ss%3Aw%2Frd@127.0.0.1:{pg.port}/db1"
    engine = sqlalchemy.create_engine(pg.url(password="ignored"))  # trust: a password is accepted
    try:
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("select current_user")).scalar() == "tb"
    finally:
        engine.dispose()


def test_create_database_gives_distinct_databases_usable_through_sqlalchemy(pg: PgServer) -> None:
    urls = [pg.create_database(), pg.create_database(), pg.create_database("tb_named")]
    assert len(set(urls)) == 3 and urls[2].endswith("/tb_named")
    for url in urls:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sqlalchemy.text("select 1")).scalar() == 1
                assert conn.execute(sqlalchemy.text("select current_database()")).scalar() == url.rsplit("/", 1)[1]
        finally:
            engine.dispose()
    names = set(pg.psql("select datname from pg_database").splitlines())
    assert {url.rsplit("/", 1)[1] for url in urls} <= names


def test_listens_on_127_0_0_1_only(pg: PgServer) -> None:
    assert pg.psql("select inet_server_addr()") == "127.0.0.1"
    assert pg.psql("show listen_addresses") == "127.0.0.1"
    assert pg.psql("show unix_socket_directories") == ""  # no Unix socket either
    assert _listening_addresses(pg.port) == ["127.0.0.1"]


def test_stop_refuses_connections_and_start_keeps_the_data(pg: PgServer,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    url = pg.create_database()
    database = url.rsplit("/", 1)[1]
    pg.psql("create table kept(v text); insert into kept values ('before the stop')", database)
    port, pid = pg.port, pg.pid
    pytest_root = tmp_path_factory.getbasetemp().parent
    if os.geteuid() == 0:  # as another pytest session does to /tmp/pytest-of-root when it starts
        pytest_root.chmod(stat.S_IMODE(pytest_root.stat().st_mode) & ~stat.S_IXOTH)
        assert pytest_root not in pg.data_dir.resolve().parents  # the server's files are elsewhere
    assert pg.psql("checkpoint; select v from kept", database) == "before the stop"  # it opens them by path

    pg.stop()
    assert not pg.running and pg.pid is None
    assert not (pg.data_dir / "postmaster.pid").exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host=pg.host, port=port, user="tb", dbname=database, connect_timeout=2)
    pg.stop()  # idempotent

    pg.start()
    assert pg.running and pg.port == port and pg.pid != pid
    assert pg.psql("select v from kept", database) == "before the stop"
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("select count(*) from kept")).scalar() == 1
    finally:
        engine.dispose()


def test_stop_rejects_an_unknown_mode(pg: PgServer) -> None:
    with pytest.raises(ValueError, match="smart"):
        pg.stop("abrupt")
    assert pg.running


def test_the_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A test process killed without cleanup (no fixture teardown, no atexit) leaves no server."""
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(_REPO)!r})
        from pathlib import Path
        from tests.pg_server import start_pg_server
        server = start_pg_server(Path({str(tmp_path)!r}))
        print(server.port, flush=True)
        os._exit(0)  # like SIGKILL: skips atexit and every finaliser
    """)
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    port = int(result.stdout.split()[-1])
    pid_file = tmp_path / "pgdata" / "postmaster.pid"
    try:
        deadline = time.monotonic() + 30
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_file.exists(), "the server outlived the process that started it"
        assert "database system is shut down" in (tmp_path / "postgres.log").read_text()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(host="127.0.0.1", port=port, user="tb", dbname="postgres", connect_timeout=2)
    finally:
        if pid_file.exists():  # the test failed: stop the orphan by its data directory
            server = PgServer(bin_dir=pg_server.find_pg_bin_dir(), data_dir=tmp_path / "pgdata",
                              port=port, log_file=tmp_path / "postgres.log")
            subprocess.run(pg_server._as_server_user(server._pg_ctl_stop_argv("immediate")), check=False)


def test_missing_binaries_raise_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No skip: a machine without PostgreSQL fails the tests and says what to install."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(pg_server, "PG_LIB_ROOT", tmp_path / "no-postgresql")
    with pytest.raises(PgServerMissing, match="initdb") as missing:
        start_pg_server(tmp_path / "server")
    assert "apt-get install postgresql" in str(missing.value)
    assert not (tmp_path / "server").exists()  # nothing is created before the binaries are found


def test_a_partial_installation_names_the_missing_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "postgresql" / "17" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("initdb", "pg_ctl"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(pg_server, "PG_LIB_ROOT", tmp_path / "postgresql")
    with pytest.raises(PgServerMissing, match=r"missing: postgres \(") as missing:
        pg_server.find_pg_bin_dir()
    assert "apt-get install postgresql" in str(missing.value)


def test_the_newest_installation_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for version in ("9.6", "15", "16"):
        bin_dir = tmp_path / "postgresql" / version / "bin"
        bin_dir.mkdir(parents=True)
        for name in pg_server.REQUIRED_BINARIES:
            (bin_dir / name).write_text("#!/bin/sh\n")
            (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(pg_server, "PG_LIB_ROOT", tmp_path / "postgresql")
    assert pg_server.find_pg_bin_dir() == tmp_path / "postgresql" / "16" / "bin"


def test_a_port_clash_moves_to_another_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        ports = iter([taken_port])
        real_free_port = pg_server._free_port
        monkeypatch.setattr(pg_server, "_free_port", lambda: next(ports, None) or real_free_port())
        with start_pg_server(tmp_path) as server:
            assert server.port != taken_port
            assert server.psql("select 1") == "1"
        assert not server.running
    assert "Address already in use" in (tmp_path / "postgres.log").read_text()
