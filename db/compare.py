"""Comparing N runs: what differs in their configuration, how each metric moved against a
baseline (absolute and %), and their telemetry on one time axis for overlays."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from db.store import RunDetail, RunStore, StoreError
from db.summary import lower_is_better

HEADLINE_METRICS = (
    "output_tok_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
    "tpot_ms_mean", "e2e_ms_p50", "e2e_ms_p99", "error_rate_pct", "requests_total", "startup_s", "kv_cache_tokens",
)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists stay whole (a list of tags is one value)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def run_metrics(run: RunDetail) -> dict[str, float]:
    """The comparable numbers of a run: the runner's summary, overridden by the store's own
    request-derived metrics (same definitions for every run), plus startup facts."""
    out = {k: v for k, raw in flatten(run.summary).items() if (v := _number(raw)) is not None}
    for key in ("startup_s",):
        if (v := _number(run.engine_info.get(key))) is not None:
            out[key] = v
    kv = run.engine_info.get("kv_cache")
    if isinstance(kv, Mapping) and (v := _number(kv.get("kv_cache_tokens"))) is not None:
        out["kv_cache_tokens"] = v
    out.update({k: v for k, raw in run.metrics.items() if (v := _number(raw)) is not None})
    return out


def run_settings(run: RunDetail) -> dict[str, Any]:
    """What a run was configured with, flattened, plus what it ran on (its name, description and
    tags label the run; they are not settings)."""
    settings = {k: v for k, v in flatten(run.config).items() if k not in ("name", "description", "tags")}
    settings["engine.version"] = run.engine_version
    settings["model"] = run.model
    hw = run.hardware or {}
    gpus = hw.get("gpus") or []
    settings["hardware.gpus"] = ", ".join(str(g.get("name")) for g in gpus if isinstance(g, Mapping)) or "none"
    settings["hardware.cpu"] = hw.get("cpu_model")
    settings["hardware.driver"] = hw.get("driver_version")
    if run.imported:
        settings["imported_from"] = run.imported_from
    return settings


@dataclass
class MetricDelta:
    name: str
    values: list[float | None]
    delta: list[float | None]
    delta_pct: list[float | None]
    lower_is_better: bool | None

    def verdict(self, i: int) -> str:
        """'better', 'worse' or '' for run i against the baseline."""
        d = self.delta[i]
        if d is None or d == 0 or self.lower_is_better is None:
            return ""
        return "better" if (d < 0) == self.lower_is_better else "worse"


@dataclass
class AlignedSeries:
    """One telemetry value of every run on a shared time axis (seconds since each run started)."""

    source: str
    name: str
    t_s: np.ndarray
    values: list[np.ndarray]

    @property
    def key(self) -> str:
        return f"{self.source}.{self.name}"


@dataclass
class Comparison:
    runs: list[RunDetail]
    baseline: int
    config_diff: list[tuple[str, list[Any]]]
    metrics: list[MetricDelta]
    series: list[AlignedSeries] = field(default_factory=list)
    bin_s: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        def clean(arr: np.ndarray) -> list[float | None]:
            return [None if not math.isfinite(x) else round(float(x), 6) for x in arr]

        return {
            "baseline_id": self.runs[self.baseline].id,
            "runs": [{"id": r.id, "uid": r.uid, "name": r.name, "status": r.status, "model": r.model,
                      "engine_version": r.engine_version, "started_at": r.started_at} for r in self.runs],
            "config_diff": [{"key": k, "values": v} for k, v in self.config_diff],
            "metrics": [{"name": m.name, "values": m.values, "delta": m.delta, "delta_pct": m.delta_pct,
                         "lower_is_better": m.lower_is_better} for m in self.metrics],
            "series": {"bin_s": self.bin_s, "items": [
                {"source": s.source, "name": s.name, "t_s": clean(s.t_s), "values": [clean(v) for v in s.values]}
                for s in self.series]},
        }


def _metric_order(name: str) -> tuple[int, int, str]:
    level = 1 if name.startswith("L") and "." in name else 0
    base = name.split(".", 1)[1] if level else name
    rank = HEADLINE_METRICS.index(base) if base in HEADLINE_METRICS else len(HEADLINE_METRICS)
    return level, rank, name


def compare_runs(store: RunStore, refs: Sequence[int | str], baseline: int | str | None = None, *,
                 series: bool = True, max_points: int = 600) -> Comparison:
    """Compare runs; ``baseline`` is one of ``refs`` (default: the first)."""
    if len(refs) < 2:
        raise StoreError("compare needs at least two runs")
    ids = [store.resolve(r) for r in refs]
    if len(set(ids)) != len(ids):
        raise StoreError("the same run is named twice")
    base_id = ids[0] if baseline is None else store.resolve(baseline)
    if base_id not in ids:
        raise StoreError(f"the baseline (run {base_id}) must be one of the compared runs")
    runs = [store.get_run(i) for i in ids]
    base = ids.index(base_id)

    settings = [run_settings(r) for r in runs]
    keys = sorted(set().union(*settings))
    diff = [(k, [s.get(k) for s in settings]) for k in keys
            if len({repr(s.get(k)) for s in settings}) > 1]

    metrics_per_run = [run_metrics(r) for r in runs]
    names = sorted(set().union(*metrics_per_run), key=_metric_order)
    rows = []
    for name in names:
        values = [m.get(name) for m in metrics_per_run]
        ref = values[base]
        delta = [None if v is None or ref is None else v - ref for v in values]
        pct = [None if d is None or not ref else 100.0 * d / abs(ref) for d in delta]
        rows.append(MetricDelta(name, values, delta, pct, lower_is_better(name)))

    comparison = Comparison(runs, base, diff, rows)
    if series:
        comparison.series, comparison.bin_s = align_series(store, runs, max_points)
    return comparison


def align_series(store: RunStore, runs: Sequence[RunDetail], max_points: int = 600) -> tuple[list[AlignedSeries], float]:
    """Bin every run's samples on one grid of seconds since its start (mean per bin)."""
    blocks = [store.samples(r.id) for r in runs]
    starts: list[float] = []
    longest = 0.0
    for run, per_source in zip(runs, blocks, strict=True):
        firsts = [b.t_mono[0] for b in per_source.values() if b.t_mono.size]
        t0 = run.t0_mono if run.t0_mono is not None else (min(firsts) if firsts else 0.0)
        starts.append(t0)
        for b in per_source.values():
            if b.t_mono.size:
                longest = max(longest, float(b.t_mono[-1] - t0))
    if longest <= 0:
        return [], 1.0
    bin_s = 1.0
    while longest / bin_s > max_points:
        bin_s *= 2
    n_bins = int(longest // bin_s) + 1
    t_s = (np.arange(n_bins) + 0.5) * bin_s

    keys = sorted({(src, name) for per_source in blocks for src, b in per_source.items() for name in b.names})
    out = []
    for src, name in keys:
        per_run = []
        for per_source, t0 in zip(blocks, starts, strict=True):
            binned = np.full(n_bins, np.nan)
            block = per_source.get(src)
            if block is not None and name in block.names:
                col = block.column(name)
                idx = ((block.t_mono - t0) // bin_s).astype(np.int64)
                ok = np.isfinite(col) & (idx >= 0) & (idx < n_bins)
                sums = np.bincount(idx[ok], weights=col[ok], minlength=n_bins)
                counts = np.bincount(idx[ok], minlength=n_bins)
                with np.errstate(invalid="ignore", divide="ignore"):
                    binned = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
            per_run.append(binned)
        out.append(AlignedSeries(src, name, t_s, per_run))
    return out, bin_s
