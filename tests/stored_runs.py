"""Runs in a store, for the tests of what is read back from one: a measured run written straight
into it (costs, capacity: a completed vLLM run whose levels are closed loops), or a run on a real
engine recorded into one or more stores at once, as the recorder stores it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.bus import Bus
from app.config import RunConfig
from app.recording import RunRecorder
from app.runner import Runner
from app.store import RunStore
from engine_adapters.launcher import EngineProcess

STARTED_AT = 1.9e9


def store_measured_run(store: RunStore, name: str, config: dict[str, Any], levels: Sequence[tuple[int, dict[str, Any]]],
                       *, hardware: dict[str, Any], level_s: float, env: dict[str, str] | None = None) -> int:
    """One run, its levels one after another from ``STARTED_AT``, each ``level_s`` long: a
    concurrency and the level's summary (``LevelSummary`` as JSON)."""
    run_id = store.create_run(name=name, engine_kind="vllm", engine_version="0.11.0", started_at=STARTED_AT,
                              config={"name": name, **config}, hardware=hardware, env=env)
    for i, (concurrency, summary) in enumerate(levels):
        store.start_level(run_id, i, f"concurrency {concurrency}", {"mode": "closed", "concurrency": concurrency},
                          started_at=STARTED_AT + level_s * i)
        store.finish_level(run_id, i, summary, STARTED_AT + level_s * (i + 1))
    store.finish_run(run_id, "completed")
    return run_id


def record_run(stores: Sequence[RunStore], engine: EngineProcess, config: RunConfig, *, telemetry: bool) -> list[int]:
    """``config`` run on ``engine``, recorded into every store at once; its id in each."""
    bus = Bus()
    recorders = [RunRecorder(bus, store) for store in stores]
    try:
        result = Runner(config, bus, engine=engine, telemetry=telemetry).run()
    finally:
        for recorder in recorders:
            recorder.close()
    assert result.status == "completed", result.reason
    assert all(r.recorded and not r.errors for r in recorders), [r.errors for r in recorders]
    return [r.recorded[-1] for r in recorders]
