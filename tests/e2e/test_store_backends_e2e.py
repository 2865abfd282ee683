"""One real engine run, recorded into an SQLite file and a PostgreSQL database at once: both
stores give the same figures, in Compare, in `runs show` and in the CLI's compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.analysis.compare import compare_runs
from app.cli import main
from app.config import RunConfig
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import Features
from engine_adapters.launcher import EngineProcess
from engine_adapters.registry import engine_terms_for
from tests.pg_server import PgServer
from tests.stored_runs import record_run

pytestmark = pytest.mark.e2e

WORKLOAD = WorkloadConfig(kind="shared_prefix", num_requests=8, shared_prefix_tokens=256,
                          input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
LOAD = LoadConfig(concurrency=2, warmup_requests=1)


def _run_into_both(stores: list[RunStore], engine: EngineProcess, name: str) -> list[int]:
    config = RunConfig(name=name, engine=engine.engine, features=engine.features, workload=WORKLOAD, load=LOAD)
    return record_run(stores, engine, config, telemetry=False)


def _without_ids(doc: dict[str, object]) -> dict[str, object]:
    runs = [{k: v for k, v in r.items() if k != "id"} for r in doc["runs"]]  # type: ignore[attr-defined]
    return {**doc, "baseline_id": None, "runs": runs}


def test_sqlite_and_postgresql_store_one_real_run_alike(engine_pool, demo_engine: EngineProcess,  # type: ignore[no-untyped-def]
                                                        pg_server: PgServer, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    file, url = str(tmp_path / "runs.db"), pg_server.create_database()
    with RunStore(file) as sqlite_store, RunStore(url) as pg_store:
        stores = [sqlite_store, pg_store]
        off = _run_into_both(stores, engine_pool.get(Features(prefix_caching=False)), "prefix off")
        on = _run_into_both(stores, demo_engine, "prefix on")
        comparisons = [compare_runs(store, [o, n], engine_terms_of=engine_terms_for)
                       for store, o, n in zip(stores, off, on, strict=True)]
        docs = [_without_ids(c.to_dict()) for c in comparisons]
        assert docs[0] == docs[1]
        ttft = comparisons[1].metric("ttft_ms_p50")
        assert ttft is not None and all(v is not None for v in ttft.values)
        for store, run_id in zip(stores, on, strict=True):
            assert store.get_run(run_id).metrics["requests_total"] == WORKLOAD.num_requests
        pairs = [(s.get_run(o).uid, s.get_run(n).uid) for s, o, n in zip(stores, off, on, strict=True)]
        assert pairs[0] == pairs[1]  # the same runs, by their uid
    shown = []
    for where in (file, url):
        assert main(["compare", pairs[0][0], pairs[0][1], "--db", where, "--json"]) == 0
        shown.append(_without_ids(json.loads(capsys.readouterr().out)))
    assert shown[0] == shown[1]
    print(f"\nthe same two runs in SQLite and PostgreSQL: {len(docs[0]['metrics'])} compared figures alike; "  # type: ignore[arg-type]
          f"TTFT p50 {ttft.values[0]:.1f} -> {ttft.values[1]:.1f} ms")
