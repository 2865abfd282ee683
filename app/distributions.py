"""Distributions behind the summary figures: TTFT and ITL as cumulative distributions per run,
and throughput against latency across a sweep's levels (GuideLLM's report has both).

Computed from the store (request rows, recorded levels) for the GUI's Compare view and the HTML
report, in a worker or the CLI; pure NumPy, no Qt. Reliability follows the comparison: a
distribution of a client figure its run flagged carries the reason, and a sweep plots the
engine's own figure wherever any level flagged the client's (as every chart does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from app.analysis import metric_catalog as catalog
from app.analysis.compare import Comparison
from app.analysis.summary import level_summary_figures
from app.store import RunStore

CDF_POINTS = 200


@dataclass
class Cdf:
    """Quantiles of one figure: ``x[i]`` is the value below which a fraction ``p[i]`` falls."""

    x: np.ndarray
    p: np.ndarray
    n: int

    def quantile(self, q: float) -> float:
        return float(np.interp(q, self.p, self.x))


@dataclass
class RunDistributions:
    run_id: int
    label: str
    ttft_ms: Cdf | None = None
    itl_ms: Cdf | None = None
    unreliable: dict[str, str] = field(default_factory=dict)
    """``ttft_ms`` / ``itl_ms`` -> why the client's distribution cannot be trusted."""


def cdf(values: np.ndarray, points: int = CDF_POINTS) -> Cdf | None:
    """The empirical CDF at ``points`` evenly spaced probabilities (None without finite values)."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return None
    p = np.linspace(0.0, 1.0, min(points, max(finite.size, 2)))
    return Cdf(np.quantile(finite, p), p, int(finite.size))


def run_distributions(store: RunStore, comparison: Comparison) -> list[RunDistributions]:
    """TTFT and ITL distributions of each compared run's completed requests."""
    out = []
    labels = comparison.labels()
    for i, run in enumerate(comparison.runs):
        req = store.requests(run.id)
        ok = np.asarray(req.ok, dtype=bool) if len(req) else np.zeros(0, bool)
        dist = RunDistributions(run.id, labels[i])
        dist.ttft_ms = cdf(np.asarray(req.ttft_ms)[ok]) if len(req) else None
        if len(req) and req.itl_flat.size:
            counts = np.diff(req.itl_bounds)
            mask = np.repeat(ok, counts.astype(np.int64))
            dist.itl_ms = cdf(np.asarray(req.itl_flat, dtype=np.float64)[mask])
        for key, name in (("ttft_ms_p50", "ttft_ms"), ("itl_ms_p50", "itl_ms")):
            row = comparison.metric(key)
            if row is not None and row.unreliable[i]:
                dist.unreliable[name] = row.unreliable[i] or ""
        out.append(dist)
    return out


@dataclass
class SweepPoint:
    level: str
    x: float
    y: float
    flagged: bool = False


@dataclass
class SweepCurve:
    run_id: int
    label: str
    points: list[SweepPoint]


@dataclass
class Sweep:
    """Throughput (x) against a latency (y) across load levels, per run with two levels or more."""

    x_key: str
    y_key: str
    curves: list[SweepCurve]

    @property
    def x_label(self) -> str:
        return catalog.metric(self.x_key).label

    @property
    def y_label(self) -> str:
        return catalog.metric(self.y_key).label


def sweeps(comparison: Comparison, y_keys: Sequence[str] = ("ttft_ms_p50", "itl_ms_p50"),
           x_key: str = "output_tok_per_s") -> list[Sweep]:
    """One :class:`Sweep` per latency figure; empty when no compared run has two levels. A client
    figure any level flagged gives way to the engine's own stand-in for every point."""
    labels = comparison.labels()
    per_run = []
    for i, run in enumerate(comparison.runs):
        levels = [lv for lv in run.levels if lv.summary]
        if len(levels) < 2:
            continue
        figures = [(lv.label or f"level {lv.idx}", level_summary_figures(lv.summary)) for lv in levels]
        per_run.append((run.id, labels[i], [(name, f, catalog.unreliable_figures(f)) for name, f in figures]))
    if not per_run:
        return []

    def reliable(key: str) -> str:
        alt = catalog.metric(key).engine_alternative
        flagged = any(key in bad for _, _, judged in per_run for _, _, bad in judged)
        have_alt = alt is not None and all(alt in f for _, _, judged in per_run for _, f, _ in judged)
        return alt if flagged and alt is not None and have_alt else key

    x = reliable(x_key)
    out = []
    for y_key in y_keys:
        y = reliable(y_key)
        curves = []
        for run_id, label, judged in per_run:
            points = [SweepPoint(name, f[x], f[y], x in bad or y in bad)
                      for name, f, bad in judged if x in f and y in f]
            if points:
                curves.append(SweepCurve(run_id, label, points))
        if curves:
            out.append(Sweep(x, y, curves))
    return out


def load_start_offsets(comparison: Comparison) -> list[float]:
    """Seconds from each compared run's start to its first level's start (its engine's start and
    feature checks come before): 0 when unknown."""
    out = []
    for run in comparison.runs:
        starts = [lv.started_at for lv in run.levels if lv.started_at is not None]
        out.append(max(min(starts) - run.started_at, 0.0) if starts else 0.0)
    return out


def aligned(values: np.ndarray, offset_s: float, bin_s: float) -> np.ndarray:
    """A run's binned series (``app.analysis.compare.align_series``) shifted so that bin 0 is the start
    of its load: runs whose engines took different times to start line up."""
    shift = int(round(offset_s / bin_s)) if bin_s > 0 else 0
    if shift <= 0:
        return values
    out = np.full_like(values, np.nan)
    out[:max(len(values) - shift, 0)] = values[shift:]
    return out
