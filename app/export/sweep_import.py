"""Trade-off points from other tools, drawn on a tune's Pareto chart beside the measured ones:
``vllm bench sweep`` results (its ``summary.csv``, the per-combination ``summary.json`` files, a
per-run ``run=N.json`` or the output directory holding them) and AIConfigurator's Pareto output
(a CSV with ``tokens/s/gpu`` and ``tokens/s/user`` columns). A measured front can then be laid
over a predicted one.

Axes as the tuner's (``app.tuner.state``): output tok/s per GPU against tok/s per user. A vLLM
result gives tok/s per user as 1000 / mean TPOT when it has TPOT (as the tuner measures it), else
as ``vllm bench sweep plot_pareto`` does (output throughput / concurrency); GPUs are
``tensor_parallel_size x pipeline_parallel_size x data_parallel_size`` of the combination.
Nothing is written until the whole file (or directory) has been read and checked.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import UserError, read_user_text
from app.export.checks import ImportProblem
from app.export.importers import MAX_IMPORT_BYTES, _vllm_bench_metrics

VLLM_SWEEP, AICONFIGURATOR = "vllm bench sweep", "AIConfigurator"
MAX_POINTS = 100_000
_RESULT_KEYS = frozenset({
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "duration", "completed",
    "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
    "run_number", "burstiness", "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
    "start_times", "latencies", "request_goodput:", "rtfx"})
"""Keys of a ``vllm bench serve`` result: what is left of a sweep row is its parameters."""
_GPU_KEYS = (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"), ("data_parallel_size", "dp"))


@dataclass
class SweepPoint:
    """One configuration at one load, as another tool measured or predicted it."""

    source: str
    label: str
    tok_s_per_gpu: float
    tok_s_per_user: float
    load_kind: str = "concurrency"
    load_value: float | None = None
    figures: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> float | None:
    """A finite number from JSON or CSV text (``inf``, blanks and words are not)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    try:
        v = float(str(value).strip())
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _get(row: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        for k in (key, key.replace("_", "-"), key.replace("-", "_")):
            if k in row and row[k] not in (None, ""):
                return row[k]
    return None


def _gpus(row: dict[str, Any]) -> float:
    total = _number(_get(row, "num_gpus", "gpu_count", "num_total_gpus"))
    if total:
        return total
    world = 1.0
    for keys in _GPU_KEYS:
        if (v := _number(_get(row, *keys))) and v > 0:
            world *= v
    return world


def _params(row: dict[str, Any]) -> dict[str, Any]:
    """The sweep's parameters of a row: what is not a bench result figure."""
    out = {}
    for k, v in row.items():
        if not k or k in _RESULT_KEYS or k.startswith(("mean_", "median_", "std_", "p9", "p5", "p2", "p1")) \
                or k.endswith(("_ms", "_throughput")) or isinstance(v, list | dict):
            continue
        if k in ("max_concurrency", "request_rate") or v not in (None, ""):
            out[k] = v
    return out


def _vllm_point(row: dict[str, Any], where: str) -> SweepPoint | None:
    """A ``vllm bench serve`` result row of a sweep (a point), or None when it has no throughput."""
    numeric = {k: (_number(v) if not isinstance(v, list | dict) else v) for k, v in row.items()}
    numeric = {k: v for k, v in numeric.items() if v is not None}
    throughput = _number(row.get("output_throughput"))
    if throughput is None:
        return None
    try:
        figures = _vllm_bench_metrics(numeric)
    except ImportProblem as exc:
        raise UserError(f"{where}: {exc}") from None
    gpus = _gpus(row)
    concurrency = _number(_get(row, "max_concurrency"))
    rate = _number(_get(row, "request_rate"))
    users = concurrency or rate or _number(_get(row, "max_concurrent_requests"))
    tpot = figures.get("tpot_ms_mean")
    per_user = 1000.0 / tpot if tpot and tpot > 0 else (throughput / users if users else None)
    if per_user is None:
        return None
    params = _params(row)
    shown = {k: v for k, v in params.items() if k not in ("run_number",)}
    label = ", ".join(f"{k} {v}" for k, v in shown.items()) or "vllm bench sweep"
    kind, value = ("concurrency", concurrency) if concurrency else ("rate", rate)
    return SweepPoint(VLLM_SWEEP, label, throughput / gpus, per_user, kind, value, figures, shown)


def _aiconfigurator_point(row: dict[str, Any]) -> SweepPoint | None:
    per_gpu, per_user = _number(row.get("tokens/s/gpu")), _number(row.get("tokens/s/user"))
    if per_gpu is None or per_user is None:
        return None
    figures: dict[str, float] = {}
    for src, dst in (("ttft", "ttft_ms_mean"), ("tpot", "tpot_ms_mean"), ("request_latency", "e2e_ms_mean"),
                     ("tokens/s", "output_tok_per_s")):
        if (v := _number(row.get(src))) is not None:
            figures[dst] = v
    settings = {k: row[k] for k in ("backend", "parallel", "tp", "pp", "dp", "gemm", "kvcache", "bs", "concurrency",
                                    "num_total_gpus", "system", "version") if row.get(k) not in (None, "")}
    parts = [str(settings[k]) for k in ("backend", "parallel") if k in settings]
    parts += [f"{k} {settings[k]}" for k in ("gemm", "kvcache", "bs") if k in settings]
    concurrency = _number(row.get("concurrency"))
    return SweepPoint(AICONFIGURATOR, " ".join(parts) or "AIConfigurator", per_gpu, per_user, "concurrency",
                      concurrency, figures, settings)


def _csv_points(text: str, path: Path) -> list[SweepPoint]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    rows = list(reader)
    if "tokens/s/gpu" in header and "tokens/s/user" in header:
        points = [_aiconfigurator_point(r) for r in rows]
    elif "output_throughput" in header:
        points = [_vllm_point({k: v for k, v in r.items() if k}, f"{path}: row {i + 1}") for i, r in enumerate(rows)]
    else:
        raise UserError(f"{path}: not a vllm bench sweep summary.csv (no output_throughput column) or an "
                        "AIConfigurator Pareto CSV (no tokens/s/gpu and tokens/s/user columns)")
    return [p for p in points if p is not None]


def _json_points(text: str, path: Path) -> list[SweepPoint]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None
    rows = data if isinstance(data, list) else [data]
    if not all(isinstance(r, dict) for r in rows):
        raise UserError(f"{path}: expected a vllm bench result (an object) or a sweep summary (a list of them)")
    points = [_vllm_point(r, f"{path}: result {i + 1}") for i, r in enumerate(rows)]
    return [p for p in points if p is not None]


def _file_points(path: Path) -> list[SweepPoint]:
    text = read_user_text(path, "file", max_bytes=MAX_IMPORT_BYTES)
    if path.suffix.lower() == ".csv" or (text.lstrip()[:1] not in ("{", "[")):
        return _csv_points(text, path)
    return _json_points(text, path)


def parse_sweep(path: str | Path) -> list[SweepPoint]:
    """The points of a sweep result: a file, or a ``vllm bench sweep`` output directory (its
    ``summary.json`` files; ``run=N.json`` files where a combination has no summary yet)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("summary.json"))
        summarized = {f.parent for f in files}
        files += sorted(f for f in p.rglob("run=*.json") if f.parent not in summarized)
        if not files:
            csvs = sorted(p.glob("*.csv"))
            files = csvs[:1]
        if not files:
            raise UserError(f"{p}: no vllm bench sweep results (summary.json, run=N.json or summary.csv) in it")
        points = [pt for f in files for pt in _file_points(f)]
    else:
        points = _file_points(p)
    if not points:
        raise UserError(f"{p}: no point with both a throughput and a per-user rate")
    if len(points) > MAX_POINTS:
        raise UserError(f"{p}: {len(points):,} points; at most {MAX_POINTS:,}")
    return points


def import_into_tune(store: Any, tune_id: str, path: str | Path, label: str | None = None) -> int:
    """Store a sweep's points with a tune (drawn on its chart, never picked); returns how many."""
    from app.tuner.slo import judge
    from db import tune_store

    points = parse_sweep(path)
    tune = tune_store.get_tune(store, tune_id)
    start = max((t["index"] for t in tune.trials), default=-1) + 1
    percentile = str(tune.doc.get("percentile") or "p99")
    rows: list[tuple[int, dict[str, Any]]] = []
    for i, pt in enumerate(points):
        ratios: dict[str, float] = {}
        if pt.figures.get("requests_total"):
            ratios = {k: v for k, v in judge(pt.figures, tune.slo, percentile).ratios.items() if math.isfinite(v)}
        name = f"{label}: {pt.label}" if label else pt.label
        rows.append((start + i, {"candidate": -1, "source": pt.source, "status": "imported", "knobs": pt.settings,
                                 "load_kind": pt.load_kind, "load_value": pt.load_value, "figures": pt.figures,
                                 "reason": f"imported from {Path(path).name}",
                                 "doc": {"label": name, "tok_s_per_gpu": pt.tok_s_per_gpu,
                                         "tok_s_per_user": pt.tok_s_per_user, "ratios": ratios}}))
    tune_store.put_trials(store, tune_id, rows)
    return len(points)
