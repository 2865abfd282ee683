"""A run database made by the code before campaigns had a stored form of their own
(``tests/data/store-before-campaigns.db``, made by ``tests/data/make_store_before_campaigns.py``)
still shows what that code showed of it (``store-before-campaigns.expected.json``): its ladders, its
tunes and its repeat set, every figure and status. A migration of the stored form must keep this
test passing unchanged. Keys the code has added since are allowed; a value changed or lost is not.
Costs are left out: they follow the dated default price list, not the stored form."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.hostile import cli
from tests.pg_server import PgServer

DATA = Path(__file__).resolve().parents[1] / "data"
EXPECTED = json.loads((DATA / "store-before-campaigns.expected.json").read_text())
LEFT_OUT = {"cost"}


def _kept(expected: Any, actual: Any, where: str = "") -> list[str]:
    """Where ``actual`` does not keep ``expected`` (new keys in ``actual`` are fine)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: {actual!r} is not an object"]
        return [p for key, value in expected.items() if key not in LEFT_OUT
                for p in ([f"{where}.{key}: missing"] if key not in actual else _kept(value, actual[key], f"{where}.{key}"))]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{where}: {actual!r} instead of {expected!r}"]
        return [p for i, (e, a) in enumerate(zip(expected, actual, strict=True)) for p in _kept(e, a, f"{where}[{i}]")]
    if isinstance(expected, float) and isinstance(actual, int | float) and not isinstance(actual, bool):
        return [] if math.isclose(expected, actual, rel_tol=1e-12, abs_tol=1e-12) else [f"{where}: {actual} != {expected}"]
    return [] if expected == actual else [f"{where}: {actual!r} != {expected!r}"]


@pytest.fixture(scope="module")
def old_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("old") / "runs.db"
    shutil.copyfile(DATA / "store-before-campaigns.db", path)  # the kept file is never written
    return path


def _json(*argv: str) -> Any:
    out = cli(*argv).check()
    assert out.code == 0, out
    return json.loads(out.out)


def test_the_fixture_holds_each_kind_of_campaign() -> None:
    ladders, tunes = EXPECTED["ladders"].values(), EXPECTED["tunes"].values()
    assert EXPECTED["runs"] == 28 and len(EXPECTED["repeat_set"]["runs"]) == 3
    assert any(r["status"] == "skipped" for s in ladders for r in s["rows"])
    assert any(r["runs"] == 2 for s in ladders for r in s["rows"])
    assert {t["status"] for t in tunes} == {"completed", "cancelled"}


@pytest.mark.parametrize("ladder_id", sorted(EXPECTED["ladders"]))
def test_a_stored_ladder_shows_what_it_showed(old_db: Path, ladder_id: str) -> None:
    shown = _json("ladders", "show", ladder_id, "--db", str(old_db), "--json")
    assert not (lost := _kept(EXPECTED["ladders"][ladder_id], shown)), lost[:10]


@pytest.mark.parametrize("tune_id", sorted(EXPECTED["tunes"]))
def test_a_stored_tune_shows_what_it_showed(old_db: Path, tune_id: str) -> None:
    shown = _json("tunes", "show", tune_id, "--db", str(old_db), "--json")
    assert not (lost := _kept(EXPECTED["tunes"][tune_id], shown)), lost[:10]


def test_a_stored_repeat_set_compares_as_it_did(old_db: Path) -> None:
    runs = [str(r) for r in EXPECTED["repeat_set"]["runs"]]
    shown = _json("compare", *runs, "--db", str(old_db), "--json", "--no-series")
    assert not (lost := _kept(EXPECTED["repeat_set"]["compare"], shown)), lost[:10]


def test_the_runs_are_all_there(old_db: Path) -> None:
    listed = _json("runs", "list", "--db", str(old_db), "--json")
    assert len(listed) == EXPECTED["runs"]


def test_the_campaigns_move_into_one_stored_form_and_back(tmp_path: Path) -> None:
    """Revision 0007 carries every ladder (from its runs' summaries) and every tune (from its own
    tables) into ``campaigns`` and ``campaign_runs``; its downgrade writes both old forms back,
    and upgrading again shows the same."""
    from alembic import command

    from app.store import RunStore, alembic_config
    from db import campaign_store
    from db.schema import open_engine

    path = tmp_path / "runs.db"
    shutil.copyfile(DATA / "store-before-campaigns.db", path)
    with RunStore(path) as store:
        campaigns = {c.id: c for c in campaign_store.list_campaigns(store, mark_interrupted=False)}
        assert {i for i, c in campaigns.items() if c.kind == "ladder"} == set(EXPECTED["ladders"])
        assert {i for i, c in campaigns.items() if c.kind == "tune"} == set(EXPECTED["tunes"])
        for ladder_id, shown in EXPECTED["ladders"].items():
            linked = campaigns[ladder_id].run_ids_by_step()
            assert {r["index"]: r["run_ids"] for r in shown["rows"] if r["run_ids"]} == linked
        assert not any("ladder" in store.get_run(r.id).summary for r in store.list_runs())
    engine = open_engine(path, 5.0)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0006")
    with engine.connect() as conn:
        tunes = conn.exec_driver_sql("SELECT count(*) FROM tunes").scalar()
        trials = conn.exec_driver_sql("SELECT count(*) FROM tune_trials").scalar()
        with_ladder = conn.exec_driver_sql("SELECT count(*) FROM runs WHERE summary LIKE '%\"ladder\"%'").scalar()
    engine.dispose()
    assert tunes == len(EXPECTED["tunes"]) and trials == sum(len(t["trials"]) for t in EXPECTED["tunes"].values())
    assert with_ladder == sum(len(r["run_ids"]) for s in EXPECTED["ladders"].values() for r in s["rows"])
    for ladder_id in EXPECTED["ladders"]:  # upgraded again on open
        test_a_stored_ladder_shows_what_it_showed(path, ladder_id)
    for tune_id in EXPECTED["tunes"]:
        test_a_stored_tune_shows_what_it_showed(path, tune_id)


def test_the_campaigns_move_over_on_postgresql_too(tmp_path: Path, pg_server: PgServer) -> None:
    """The fixture's rows at revision 0006, loaded into PostgreSQL at 0006, then opened: the same
    revision 0007 carries them over there, and every ladder and tune shows what it showed."""
    from sqlalchemy import Boolean, MetaData, insert

    from app.store import RunStore, create_at_revision
    from db.schema import open_engine, store_location

    path = tmp_path / "runs.db"
    shutil.copyfile(DATA / "store-before-campaigns.db", path)
    create_at_revision(path, "0006")
    url = pg_server.create_database()
    create_at_revision(url, "0006")
    source, target = open_engine(store_location(path), 5.0), open_engine(store_location(url), 5.0)
    try:
        tables = MetaData()
        tables.reflect(target)
        with source.connect() as sconn, target.begin() as tconn:
            for table in tables.sorted_tables:
                if table.name == "alembic_version":
                    continue
                columns = [c.name for c in table.columns]
                rows = sconn.exec_driver_sql(f"SELECT {', '.join(columns)} FROM {table.name}").all()
                if rows:
                    tconn.execute(insert(table), [{c: bool(v) if isinstance(table.c[c].type, Boolean) and v is not None
                                                   else v for c, v in zip(columns, row, strict=True)} for row in rows])
    finally:
        source.dispose()
        target.dispose()
    with RunStore(url) as store:
        assert store.schema_revision() >= "0007"  # 0007 ran (later revisions may follow it)
    for ladder_id in EXPECTED["ladders"]:
        shown = _json("ladders", "show", ladder_id, "--db", url, "--json")
        assert not (lost := _kept(EXPECTED["ladders"][ladder_id], shown)), lost[:10]
    for tune_id in EXPECTED["tunes"]:
        shown = _json("tunes", "show", tune_id, "--db", url, "--json")
        assert not (lost := _kept(EXPECTED["tunes"][tune_id], shown)), lost[:10]
