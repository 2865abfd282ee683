"""Faults in the run database file: each ends in one line that names the file and what to do
(exit 2 from the CLI), never a traceback, and no stored run is lost or changed."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.store import RunStore, SampleIn, StoreError
from tests.fuzz.hostile import closed_port


def _fill(path: Path, runs: int = 2) -> None:
    with RunStore(path) as store:
        for k in range(runs):
            run_id = store.create_run(name=f"run{k}", started_at=1.9e9 + k, t0_mono=0.0)
            store.write_batch(run_id, requests=[
                {"level": 0, "start_wall": 1.9e9 + i, "ttft_ms": 10.0 + i, "e2e_ms": 90.0, "output_tokens": 4,
                 "itl_ms": [10.0, 11.5, 12.25]} for i in range(20)],
                samples=[SampleIn("client", float(t), 1.9e9 + t, {"x": float(t)}) for t in range(5)],
                log_lines=[f"line {k}"])
            store.finish_run(run_id, "completed")


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "store" / "runs.db"
    path.parent.mkdir()
    _fill(path)
    return path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI in this process: a traceback would fail the test as an exception."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tunebench: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def _runs(path: Path) -> list[tuple[str, int, list[float]]]:
    """What is stored, read afresh (name, requests, first latencies)."""
    with RunStore(path) as store:
        return [(r.name, store.get_run(r.id).n_requests, store.requests(r.id).itl_flat[:3].tolist())
                for r in store.list_runs()]


@contextlib.contextmanager
def _read_only(*paths: Path) -> Iterator[None]:
    """Files or directories nobody can write: permission bits, and for root (whom they do not
    stop) the immutable attribute."""
    modes = {p: p.stat().st_mode & 0o777 for p in paths}
    as_root = os.geteuid() == 0
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)
        if as_root and subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
            for q in paths:
                subprocess.run(["chattr", "-i", str(q)], capture_output=True)
                q.chmod(modes[q])
            pytest.skip("running as root where chattr +i is not possible: cannot make a file read-only")
    try:
        yield
    finally:
        for p in paths:
            if as_root:
                subprocess.run(["chattr", "-i", str(p)], check=True)
            p.chmod(modes[p])


def test_read_only_file_refuses_writes_and_still_reads(db: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    before = _runs(db)
    exported = tmp_path / "run.json"
    assert _cli(capsys, "export", "1", "-f", "json", "-o", str(exported), "--db", str(db))[0] == 0
    with _read_only(db):
        for argv in (("runs", "delete", "1"), ("runs", "rename", "1", "new"), ("runs", "tag", "1", "t"),
                     ("import", str(exported))):
            code, _, err = _cli(capsys, *argv, "--db", str(db))
            assert code == 2, (argv, err)
            _one_line_error(err, str(db), "read-only")
        code, out, _ = _cli(capsys, "runs", "list", "--db", str(db))
        assert code == 0 and "run0" in out and "run1" in out
    assert _runs(db) == before


def test_read_only_directory_is_one_line(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _runs(db)
    with _read_only(db.parent):
        for argv in (("runs", "list"), ("runs", "delete", "1")):
            code, _, err = _cli(capsys, *argv, "--db", str(db))
            assert code == 2
            _one_line_error(err, str(db), "writable")
        new = db.parent / "new.db"
        code, _, err = _cli(capsys, "runs", "list", "--db", str(new))  # a reader makes no store: it says there is none
        assert code == 2
        _one_line_error(err, "new.db", "there is no run database")
        with pytest.raises(StoreError, match="writable") as making:  # what would make one says why it cannot
            RunStore(new)
        _one_line_error(f"tunebench: error: {making.value}", "new.db", "writable")
    assert _runs(db) == before


_HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE runs SET notes = 'held' WHERE id = 1")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def test_database_locked_past_the_busy_timeout(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    before = _runs(db)
    exported = tmp_path / "run.json"
    assert _cli(capsys, "export", "1", "-f", "json", "-o", str(exported), "--db", str(db))[0] == 0
    monkeypatch.setattr("db.store.BUSY_TIMEOUT_S", 0.2)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        for argv in (("runs", "delete", "1"), ("runs", "rename", "1", "x"), ("import", str(exported))):
            code, _, err = _cli(capsys, *argv, "--db", str(db))
            assert code == 2, (argv, err)
            _one_line_error(err, str(db), "locked by another process")
        assert _cli(capsys, "runs", "list", "--db", str(db))[0] == 0  # readers are not blocked (WAL)
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0
    assert _runs(db) == before
    assert _cli(capsys, "runs", "delete", "1", "--db", str(db))[0] == 0  # once released, it works


def _page_of(path: Path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        return int(root)


def _damage(path: Path, page: int) -> None:
    """Garbage over one page (pages count from 1)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(bytes((i * 131 + 7) % 256 for i in range(size)))


@pytest.mark.parametrize("table", ["runs", "request_chunks", "sample_chunks"])
def test_corrupt_page_is_reported_as_damage(db: Path, tmp_path: Path, table: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)
    _damage(copy, _page_of(copy, table))
    damaged = copy.read_bytes()
    failures = 0
    for argv in (("runs", "list"), ("runs", "show", "1"), ("runs", "show", "2", "--json"), ("compare", "1", "2"),
                 ("runs", "delete", "2")):
        code, _, err = _cli(capsys, *argv, "--db", str(copy))
        assert code in (0, 2), (argv, err)
        if code == 2:
            failures += 1
            _one_line_error(err, str(copy), "is damaged (", "restore it from a backup")
    assert failures  # each of these tables is read by some command
    assert copy.read_bytes() == damaged  # a damaged file is never written to
    assert len(_runs(db)) == 2  # the original is intact


def test_a_damaged_blob_is_caught_by_its_checksum(db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        for column in ("itl", "columns"):
            (blob,) = conn.execute(f"SELECT {column} FROM request_chunks WHERE run_id = 1").fetchone()  # noqa: S608
            flipped = bytearray(blob)
            flipped[len(flipped) // 2] ^= 0x10
            conn.execute(f"UPDATE request_chunks SET {column} = ? WHERE run_id = 1", (bytes(flipped),))  # noqa: S608
            conn.commit()
            with RunStore(copy) as store, pytest.raises(StoreError, match="is damaged .*restore it from a backup"):
                store.requests(1)
            conn.execute(f"UPDATE request_chunks SET {column} = ? WHERE run_id = 1", (blob,))  # noqa: S608
            conn.commit()
    with RunStore(copy) as store:
        assert store.requests(1).itl_flat[:3].tolist() == [10.0, 11.5, 12.25]


def test_unclean_stop_on_a_damaged_file_is_reported_on_open(db: Path, tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)
    with contextlib.closing(sqlite3.connect(copy)) as conn:  # run 2's writer died mid-run
        conn.execute("UPDATE runs SET status = 'running', writer_pid = ? WHERE id = 2", (int(dead.stdout),))
        conn.commit()
    healthy = tmp_path / "healthy.db"
    shutil.copy(copy, healthy)
    _damage(copy, _page_of(copy, "log_chunks"))
    with pytest.raises(StoreError, match=f"{copy} is damaged .*restore it from a backup"):
        RunStore(copy)
    with contextlib.closing(sqlite3.connect(copy)) as conn:  # not marked: nothing written to it
        assert conn.execute("SELECT status FROM runs WHERE id = 2").fetchone() == ("running",)
    with RunStore(healthy) as store:
        assert store.interrupted_on_open == [2] and store.get_run(2).status == "interrupted"


def test_a_database_another_tunebench_is_creating_is_not_refused(tmp_path: Path) -> None:
    """Another process's migration may have committed only ``alembic_version`` so far (seen in a
    test that polls the file while its writer starts): that file is ours, being created."""
    path = tmp_path / "starting.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.commit()
    with RunStore(path) as store:
        assert store.schema_revision() is not None and store.list_runs() == []


def test_unrelated_sqlite_database_is_refused_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "contacts.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE contacts (name TEXT)")
        conn.execute("INSERT INTO contacts VALUES ('ada')")
        conn.commit()
    content = other.read_bytes()
    code, _, err = _cli(capsys, "runs", "list", "--db", str(other))
    assert code == 2
    _one_line_error(err, str(other), "not a tunebench run database", "contacts")
    assert other.read_bytes() == content and [p.name for p in tmp_path.glob("contacts*")] == ["contacts.db"]
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # an empty database becomes a store
    assert _cli(capsys, "runs", "list", "--db", str(empty))[0] == 0


def test_newer_schema_is_refused(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
        conn.commit()
    code, _, err = _cli(capsys, "runs", "list", "--db", str(db))
    assert code == 2
    _one_line_error(err, str(db), "'9999'", "newer tunebench")


@pytest.mark.parametrize("name", ["my?runs.db", "my#runs.db", "my%3Fruns.db", "file:runs.db"])
def test_path_is_a_path_not_a_url(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    _fill(folder / name, runs=1)
    code, out, _ = _cli(capsys, "runs", "list", "--db", str(folder / name))
    assert code == 0 and "run0" in out
    assert {p.name for p in folder.iterdir()} <= {name, f"{name}.migrate.lock"}


@pytest.mark.parametrize("url", ["mysql://tb:Hunter2Secret@127.0.0.1/runs", "sqlite://",
                                 "postgresql+asyncpg://tb:Hunter2Secret@127.0.0.1/runs",
                                 "postgresql://tb:Hunter2Secret@127.0.0.1:5432"])
def test_a_url_that_names_no_store_is_refused_before_anything_is_made(
        tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Such a URL once became directories named after it in the working directory, password and all."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    code, out, err = _cli(capsys, "runs", "list", "--db", url)
    assert code == 2 and out == ""
    _one_line_error(err, "postgresql://USER@HOST:5432/DATABASE" if url.startswith(("mysql", "sqlite"))
                    else "PostgreSQL")
    assert "Hunter2Secret" not in err
    monkeypatch.setenv("TUNEBENCH_DB", url)
    code, _, err = _cli(capsys, "runs", "list")
    assert code == 2 and "Hunter2Secret" not in err
    _one_line_error(err)
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize(("url", "said"), [
    ("postgresql://admin:Hunter2Secret/db", "is the host missing"),  # the host forgotten: the password is a "port"
    ("postgresql://127.0.0.1:abc/db", "is the host missing"),
    ("postgresql://tb:Hunter2Secret@127.0.0.1/db?port=abc", "has an option that does not parse"),
    ("postgresql://tb:Hunter2@Secret@127.0.0.1/db", "'@' in its password: write it as %40"),
    ("postgresql://tb:Hunter2Secret@127.0.0.1:99999/db", "a port is 1 to 65535"),
    ("postgresql://tb:Hunter2Secret@127.0.0.1:1/db?sslmode=bogus", 'invalid sslmode value: "bogus"'),
    ("postgresql://", "names no database"),
])
def test_a_malformed_postgresql_url_is_one_line_without_its_password(
        url: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "runs", "list", "--db", url)
    assert code == 2 and out == ""
    _one_line_error(err, said)
    assert "Hunter2" not in err and "Secret" not in err


def test_an_unreachable_postgresql_store_is_one_line_naming_the_host(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    port = closed_port()
    url = f"postgresql://tb:Hunter2Secret@127.0.0.1:{port}/tunebench"
    code, out, err = _cli(capsys, "runs", "list", "--db", url)
    assert code == 2 and out == ""
    _one_line_error(err, f"cannot connect to the run database postgresql+psycopg://tb:***@127.0.0.1:{port}/tunebench",
                    "is the server running")
    assert "Hunter2Secret" not in err
    assert not [p for p in tmp_path.rglob("*") if "postgres" in p.name or "Hunter2Secret" in p.name]


def test_an_sqlite_url_names_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(tmp_path / "runs.db", runs=1)
    code, out, _ = _cli(capsys, "runs", "list", "--db", f"sqlite:///{tmp_path / 'runs.db'}")
    assert code == 0 and "run0" in out


def test_numbers_beyond_sqlite_integers_are_refused(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "runs", "show", str(2**70), "--db", str(db))
    assert code == 2
    _one_line_error(err, f"no run '{2**70}'")
    with RunStore(db) as store:
        with pytest.raises(StoreError, match="out of range"):
            store.list_runs(limit=10**30)
        with pytest.raises(StoreError, match="too large"):
            store.requests(2**70)
        with pytest.raises(StoreError, match="output_tokens .* out of range"):
            store.write_batch(1, requests=[{"ttft_ms": 1.0}, {"ttft_ms": 2.0, "output_tokens": 2**70}])
        with pytest.raises(StoreError, match="itl_ms holds 'x'"):
            store.write_batch(1, requests=[{"ttft_ms": 1.0, "itl_ms": [1.0, "x"]}])
        with pytest.raises(StoreError, match="not a number"):
            store.write_batch(1, samples=[SampleIn("host", "later", 1.0, {"x": 1.0})])  # type: ignore[arg-type]
        assert store.get_run(1).n_requests == 20 and store.get_run(1).n_samples == 5  # nothing half-written
