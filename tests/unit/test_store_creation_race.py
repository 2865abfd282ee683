"""A store opened while another process is creating it: the opener never sees a schema made
halfway. The creator is paused inside its migration (deterministically, not by luck of timing)
while this process opens the same file."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.store import RunStore, StoreError
from db.schema import foreign_tables, head_revision

REPO = Path(__file__).resolve().parents[2]
CREATOR = """
import sys, time
from pathlib import Path
from sqlalchemy import event
from db import schema

path, ready, go, marker = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
engine = schema.open_engine(path, 30.0)

def pause(conn, cursor, statement, parameters, context, executemany):
    if marker in " ".join(statement.split()) and not ready.exists():
        ready.write_text("paused")
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

event.listen(engine, "after_cursor_execute", pause)
schema.migrate(engine, path)
engine.dispose()
print("created")
"""
PAUSE_POINTS = ["CREATE TABLE requests", "CREATE TABLE log_chunks", "DROP TABLE request_chunks",
                "CREATE TABLE campaign_runs"]
"""Statements after which the creator stops: among the first revision's tables (made one by one),
in a table rebuild between its copy and its rename, and in the last revision."""


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the creator ended before its pause point: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("the creator never reached its pause point")
        time.sleep(0.02)


@pytest.mark.parametrize("marker", PAUSE_POINTS)
def test_a_store_opened_mid_creation_waits_for_the_whole_schema(tmp_path: Path, marker: str) -> None:
    path, ready, go = tmp_path / "runs.db", tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", CREATOR, str(path), str(ready), str(go), marker],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outcome: dict[str, object] = {}

    def open_store() -> None:
        try:
            with RunStore(path) as store:
                outcome["revision"], outcome["runs"] = store.schema_revision(), store.list_runs()
        except StoreError as exc:
            outcome["error"] = str(exc)

    try:
        _wait_for(ready, proc)
        opener = threading.Thread(target=open_store)
        opener.start()
        opener.join(1.5)  # the old code refused the half-made file at once
        assert "error" not in outcome, outcome["error"]
        go.write_text("go")
        opener.join(60)
        assert not opener.is_alive()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "created" in out, err
    finally:
        go.write_text("go")
        if proc.poll() is None:
            proc.kill()
    assert "error" not in outcome, outcome["error"]
    assert outcome == {"revision": head_revision(), "runs": []}


def test_only_tables_tunebench_never_makes_are_foreign() -> None:
    assert foreign_tables({"alembic_version", "runs", "requests", "request_chunks", "_alembic_tmp_runs"}) == set()
    assert foreign_tables({"runs", "contacts", "_alembic_tmp_contacts"}) == {"contacts", "_alembic_tmp_contacts"}


def test_a_failed_migration_leaves_no_schema_behind(tmp_path: Path) -> None:
    """The upgrade is one transaction: a migration that fails halfway leaves the file as it was."""
    path = tmp_path / "runs.db"
    script = CREATOR.replace('ready.write_text("paused")', 'raise RuntimeError("migration broke")')
    proc = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "r"), str(tmp_path / "g"),
                           "CREATE TABLE log_chunks"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "migration broke" in proc.stderr
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()
    assert tables == set()


NEW_STORE_ROUNDS = 25
OPENERS = 4


def test_a_new_store_opened_by_several_workers_at_once_opens_for_all(tmp_path: Path) -> None:
    """A window's tabs open the new store from workers of their own at once. Before the file was
    put in WAL mode under the migration lock, about one round in twenty failed here with
    "database is locked" (a rollback-journal deadlock, which no busy timeout waits out)."""
    errors: list[str] = []
    for round_index in range(NEW_STORE_ROUNDS):
        path = tmp_path / f"runs-{round_index}.db"
        barrier = threading.Barrier(OPENERS)

        def open_store(where: Path = path, start: threading.Barrier = barrier) -> None:
            start.wait()
            try:
                with RunStore(where) as store:
                    store.list_runs()
            except StoreError as exc:
                errors.append(str(exc))

        openers = [threading.Thread(target=open_store) for _ in range(OPENERS)]
        for t in openers:
            t.start()
        for t in openers:
            t.join(120)
    assert errors == []
    conn = sqlite3.connect(tmp_path / "runs-0.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
