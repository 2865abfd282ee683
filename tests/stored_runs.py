"""Measured runs written straight into a store, for the tests of what is read back from one
(costs, capacity): a completed vLLM run whose levels are closed loops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.store import RunStore

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
