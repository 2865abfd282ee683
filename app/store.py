"""The run store as tunebench uses it: ``db.store``'s, keeping with each finished run the figures
``app.analysis.summary`` defines (the store itself computes none). Everything of ``db.store`` is
here under the same names, so callers import the store from one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.analysis.summary import stored_metrics
from db import store as _db_store
from db.records import LevelInfo, RequestArrays
from db.store import (
    BUSY_TIMEOUT_S,
    DB_ENV,
    FINAL_STATUSES,
    ImportedRun,
    RunDetail,
    RunInfo,
    SampleIn,
    SeriesBlock,
    StoreError,
    StoreLocation,
    StoreMissing,
    StoreUnreachable,
    alembic_config,
    create_at_revision,
    default_db_path,
    location_text,
    store_location,
    writer_alive,
)

__all__ = [
    "BUSY_TIMEOUT_S", "DB_ENV", "FINAL_STATUSES", "ImportedRun", "LevelInfo", "RunDetail", "RunInfo", "RunStore",
    "SampleIn", "SeriesBlock", "StoreError", "StoreLocation", "StoreMissing", "StoreUnreachable", "alembic_config",
    "create_at_revision", "default_db_path", "location_text", "store_location", "writer_alive",
]


class RunStore(_db_store.RunStore):
    """The run database, keeping each finished run's figures (``app.analysis.summary``)."""

    def metrics_of(self, requests: RequestArrays, levels: Sequence[LevelInfo]) -> dict[str, Any]:
        return stored_metrics(requests, levels)
