"""A run's data out: everything stored as one JSON document (re-importable by
:mod:`app.export.importers`), or one CSV row per request for spreadsheets and pandas."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from app.store import RunStore
from engine_adapters.secrets import mask_lines, mask_obj

DATA_FORMATS: tuple[str, ...] = ("html", "json", "csv")
EXPORT_FORMAT = "tunebench-run"
EXPORT_VERSION = 1
CSV_COLUMNS = ("seq", "level", "start_wall", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens", "itl_ms", "error")


def run_to_json(store: RunStore, ref: int | str) -> dict[str, Any]:
    """Everything stored about a run, as one JSON document (re-importable)."""
    run = store.get_run(ref)
    samples = {src: {"names": b.names, "t_mono": b.t_mono.tolist(), "t_wall": b.t_wall.tolist(),
                     "values": [[None if not math.isfinite(v) else v for v in row] for row in b.values.tolist()]}
               for src, b in store.samples(run.id).items()}
    return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "run": mask_obj(_finite(run.model_dump(mode="json"))),
            "requests": store.request_records(run.id), "samples": samples, "log": mask_lines(store.log_lines(run.id))}


def run_to_json_text(store: RunStore, ref: int | str) -> str:
    """:func:`run_to_json` as text."""
    return json.dumps(run_to_json(store, ref), indent=1, default=str) + "\n"


def _finite(value: Any) -> Any:
    """``value`` with non-finite floats replaced by None (NaN is not JSON: jq and browsers refuse it).
    The run's own fields only: request values come from SQL columns (NaN is stored as NULL)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _csv_cell(value: Any) -> Any:
    """Spreadsheets run cells starting with = + - @ as formulas: keep text inert."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def run_to_csv(store: RunStore, ref: int | str) -> str:
    """One row per request (ITLs space-separated), for spreadsheets and pandas."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for rec in store.request_records(ref):
        row = dict(rec, itl_ms=" ".join(f"{x:g}" for x in rec["itl_ms"]))
        writer.writerow([_csv_cell(row.get(c)) if row.get(c) is not None else "" for c in CSV_COLUMNS])
    return out.getvalue()
