"""Comparing runs: what differs in their configuration, how each figure moved against a baseline
(raw values, the change as a person says it: x1.9 throughput, -64% TTFT, and whether that is
better, worse, within the noise or not to be trusted), and their telemetry on one time axis.

The figures, their names, directions and reliability come from ``app.analysis.summary`` and
``app.analysis.metric_catalog``; every face (CLI, GUI, HTML report) shows a :class:`Comparison` as it is,
so they cannot disagree.

A column is a run or, when the run was one of a set of repeats (tag ``repeat:<id>``, written by
``app.campaign``), the whole set: its value is the mean over the repeats with a 95% confidence
interval, and a change against a baseline set is "no significant difference" unless Welch's
t-test says otherwise at the 5% level (``app.analysis.stats``; docs/metrics.md says why).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.analysis import metric_catalog as catalog
from app.analysis.stats import aggregate, significant
from app.analysis.summary import judge_levels, level_extras, numbers
from app.quality.task_accuracy import SUMMARY_KEY as TASK_EVAL_KEY
from db.store import RunDetail, RunStore, StoreError

_REPEAT_SUFFIX = re.compile(r" \(repeat \d+/\d+\)$")  # app.campaign names repeats "<name> (repeat i/N)"
REPEAT_TAG = "repeat:"
"""Runs of one configuration repeated (``app.campaign``) share the tag ``repeat:<id>``."""
CAMPAIGN_TAG = "campaign:"
"""Runs of one campaign (repeats, later a ladder or a tune) share ``campaign:<id>``."""
NODE_TAG = "node:"
"""The tag of a run on a cluster: ``node:HOST/ID``, the node it ran on (``app.fleet``)."""

EngineTermsOf = Callable[[str, Mapping[str, Any]], Mapping[str, str] | None]
"""An engine kind and a run's stored features -> each feature in that engine's own terms (None:
none to show). The faces pass ``engine_adapters.registry.engine_terms_for``: the store knows no
engine by name."""


def repeat_group(tags: Iterable[str]) -> str | None:
    """The repeat set a run belongs to (its ``repeat:<id>`` tag), or None."""
    return next((t for t in tags if t.startswith(REPEAT_TAG)), None)


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
    """The comparable numbers of a run: the store's figures (``app.analysis.summary``, the runner's
    definitions), engine-side and per-level figures from its recorded levels (also for runs
    stored before they were kept), startup facts, and any other number in its summary (an
    imported tool's own figures)."""
    # A set's mean (repeat) and the task accuracy (compared with its noise: app.quality) are not figures here.
    own = {k: v for k, v in run.summary.items() if k not in ("repeat", TASK_EVAL_KEY)}
    out = {k: v for k, raw in flatten(own).items() if (v := _number(raw)) is not None}
    if (v := _number(run.engine_info.get("startup_s"))) is not None:
        out["startup_s"] = v
    kv = run.engine_info.get("kv_cache")
    if isinstance(kv, Mapping) and (v := _number(kv.get("kv_cache_tokens"))) is not None:
        out["kv_cache_tokens"] = v
    stored = numbers(run.metrics)
    out.update(stored)
    for key, value in level_extras(run.levels, stored.get("duration_s")).items():
        out.setdefault(key, value)
    for key in catalog.NOT_SHOWN:
        out.pop(key, None)
    return out


def run_unreliable(run: RunDetail, figures: Mapping[str, float] | None = None) -> dict[str, str]:
    """The run's client figures that cannot be trusted -> why (judged again from its levels, so
    runs stored before the judgement existed are judged too)."""
    figures = run_metrics(run) if figures is None else figures
    judged = dict(run.metrics.get("unreliable") or {}) if isinstance(run.metrics.get("unreliable"), Mapping) else {}
    judged.update(judge_levels(run.levels, {**figures, **numbers(run.metrics, catalog.NOT_SHOWN)}))
    return {k: str(v) for k, v in judged.items() if k in figures}


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


def hardware_model(hardware: Mapping[str, Any]) -> str:
    """What a run's figures depend on of its machine: its GPU models, or its CPU without a GPU."""
    gpus = hardware.get("gpus") or []
    names = sorted({str(g.get("name")) for g in gpus if isinstance(g, Mapping)})
    return ", ".join(names) if names else f"CPU {hardware.get('cpu_model') or 'unknown'}"


def unfair_hardware(hardware: Iterable[Mapping[str, Any]]) -> str | None:
    """Why runs are not a fair comparison (they ran on different GPU models, or CPUs), or None.
    Compare and the ladder say it; a cluster's nodes may differ."""
    models = sorted({hardware_model(h) for h in hardware if h})
    if len(models) < 2:
        return None
    return f"not a fair comparison: the runs ran on different hardware ({'; '.join(models)})"


@dataclass
class MetricDelta:
    """One figure across the compared columns, against the baseline column."""

    name: str  # the catalogue key (``ttft_ms_p50``; ``L1.ttft_ms_p50`` for level 1)
    values: list[float | None]
    delta: list[float | None]
    delta_pct: list[float | None]
    direction: catalog.Direction = "neutral"
    unreliable: list[str | None] = field(default_factory=list)
    """Why the column's figure cannot be trusted (None: it can)."""
    n: list[int] = field(default_factory=list)
    """Runs behind each value (a repeat set: its mean over n runs)."""
    ci: list[tuple[float, float] | None] = field(default_factory=list)
    """95% confidence interval of the mean (a repeat set of 2 or more)."""
    samples: list[list[float]] = field(default_factory=list)
    significant: list[bool | None] = field(default_factory=list)
    """Whether the change against the baseline exceeds the noise (None: not tested)."""
    headline: bool = False
    baseline: int = 0

    def __post_init__(self) -> None:
        k = len(self.values)
        self.unreliable = self.unreliable or [None] * k
        self.n = self.n or [0 if v is None else 1 for v in self.values]
        self.ci = self.ci or [None] * k
        self.samples = self.samples or [[] if v is None else [v] for v in self.values]
        self.significant = self.significant or [None] * k

    @property
    def metric(self) -> catalog.Metric:
        return catalog.metric(self.name)

    @property
    def label(self) -> str:
        """Human name: ``TTFT p50``."""
        return self.metric.name

    @property
    def unit(self) -> str:
        return self.metric.unit

    @property
    def factor(self) -> list[float | None]:
        """value / baseline value per column."""
        ref = self.values[self.baseline]
        return [None if v is None or not ref else v / ref for v in self.values]

    def is_unreliable(self, i: int) -> bool:
        return self.unreliable[i] is not None or self.unreliable[self.baseline] is not None

    def verdict(self, i: int) -> str:
        """Column ``i`` against the baseline: 'better', 'worse', 'same' (within the noise of
        repeats), 'unreliable' (either figure cannot be trusted) or '' (no judgement: unchanged,
        unknown, a neutral figure, or the baseline itself)."""
        if i == self.baseline:
            return ""
        if self.is_unreliable(i) and self.values[i] is not None:
            return "unreliable"
        word = catalog.verdict(self.name, self.delta[i])
        if word and self.significant[i] is False:
            return "same"
        return word

    def change(self, i: int) -> str:
        """``x1.90`` (higher is better) or ``-64%`` (lower is better, or neutral) vs the baseline."""
        if i == self.baseline:
            return ""
        return catalog.change_text(self.name, self.values[self.baseline], self.values[i])

    def value_text(self, i: int) -> str:
        """The raw figure in its unit, with its confidence interval when it is a repeat mean."""
        m = self.metric
        text = m.format(self.values[i])
        ci = self.ci[i]
        if ci is not None and self.values[i] is not None:
            text += f" \u00b1{m.format(ci[1] - (self.values[i] or 0.0))}"
        return text

    def note(self, i: int) -> str:
        """What a person is told beside the value: the change and the verdict in words."""
        verdict = self.verdict(i)
        if verdict == "unreliable":
            reason = self.unreliable[i] or f"the baseline's figure: {self.unreliable[self.baseline]}"
            return f"unreliable: {reason}"
        change = self.change(i)
        if verdict == "same":
            return f"{change}, no significant difference" if change else "no significant difference"
        return f"{change} {verdict}".strip()


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
    """One run per column (a repeat set's first run stands for it: configuration, series)."""
    baseline: int
    config_diff: list[tuple[str, list[Any]]]
    metrics: list[MetricDelta]
    series: list[AlignedSeries] = field(default_factory=list)
    bin_s: float = 1.0
    members: list[list[int]] = field(default_factory=list)
    """Run ids behind each column (one, or the runs of a repeat set)."""
    engine_terms: dict[str, list[str | None]] = field(default_factory=dict)
    """Per differing ``features.*`` setting, what each run's engine was given for it in its own
    words (``--kv-cache-dtype fp8``, ``-ctk q8_0 -ctv q8_0``); None: the engine's default."""
    unfair: str | None = None
    """Why the columns are not a fair comparison (``unfair_hardware``), or None."""

    def __post_init__(self) -> None:
        self.members = self.members or [[r.id] for r in self.runs]

    def labels(self) -> list[str]:
        """Column titles: ``#12 prefix on`` or, for a repeat set, ``#12 prefix on (mean of 3)``."""
        return [f"#{r.id} {_REPEAT_SUFFIX.sub('', r.name)} (mean of {len(m)})" if len(m) > 1 else f"#{r.id} {r.name}"
                for r, m in zip(self.runs, self.members, strict=True)]

    def headline(self) -> list[MetricDelta]:
        return [m for m in self.metrics if m.headline]

    def metric(self, key: str) -> MetricDelta | None:
        return next((m for m in self.metrics if m.name == key), None)

    def reliable_key(self, key: str) -> str:
        """``key``, or the engine-side figure that stands in for it when any column's ``key``
        is unreliable (what charts and tiles show: never a figure its run flagged)."""
        row = self.metric(key)
        alt = catalog.metric(key).engine_alternative
        if row is not None and any(r is not None for r in row.unreliable) and alt and self.metric(alt) is not None:
            return alt
        return key

    CHART_KEYS = ("output_tok_per_s", "ttft_ms_p50", "itl_ms_p50")
    """The bar charts every face draws (after :meth:`reliable_key`)."""

    def chart_metrics(self, keys: Sequence[str] = CHART_KEYS) -> list[MetricDelta]:
        """The rows to draw as bars: each key, or its engine stand-in (see :meth:`reliable_key`)."""
        rows = [self.metric(self.reliable_key(k)) for k in keys]
        return [r for r in rows if r is not None]

    def rows(self) -> list[dict[str, Any]]:
        """The metric table as every face shows it: human name with unit, direction, and per
        column the raw value (with its CI), the change and verdict in words, and the reason when
        the figure cannot be trusted. ``cls`` is ``better``/``worse``/``same`` for colouring,
        ``unreliable`` for greying, or empty."""
        out = []
        for m in self.metrics:
            cells = []
            for i in range(len(m.values)):
                verdict = m.verdict(i)
                own = m.unreliable[i]
                if i == self.baseline:
                    note = f"unreliable: {own}" if own else ""
                else:
                    note = m.note(i) if m.values[i] is not None else ""
                cells.append({"value": m.value_text(i), "note": note, "change": m.change(i), "verdict": verdict,
                              "cls": "unreliable" if own or verdict == "unreliable" else verdict,
                              "reason": own})
            out.append({"key": m.name, "name": m.metric.label, "label": m.label, "unit": m.unit,
                        "direction": m.metric.direction_text, "headline": m.headline, "cells": cells})
        return out

    def to_dict(self) -> dict[str, Any]:
        def clean(arr: np.ndarray) -> list[float | None]:
            return [None if not math.isfinite(x) else round(float(x), 6) for x in arr]

        return {
            "baseline_id": self.runs[self.baseline].id,
            "unfair": self.unfair,
            "runs": [{"id": r.id, "uid": r.uid, "name": r.name, "status": r.status, "model": r.model,
                      "engine_version": r.engine_version, "started_at": r.started_at, "members": members}
                     for r, members in zip(self.runs, self.members, strict=True)],
            "config_diff": [{"key": k, "values": v, **({"engine_terms": self.engine_terms[k]}
                                                         if k in self.engine_terms else {})}
                            for k, v in self.config_diff],
            "metrics": [{"name": m.name, "label": m.label, "unit": m.unit, "direction": m.direction,
                         "headline": m.headline, "values": m.values, "delta": m.delta, "delta_pct": m.delta_pct,
                         "factor": m.factor, "change": [m.change(i) for i in range(len(m.values))],
                         "verdict": [m.verdict(i) for i in range(len(m.values))], "unreliable": m.unreliable,
                         "n": m.n, "ci": [list(c) if c else None for c in m.ci], "significant": m.significant}
                        for m in self.metrics],
            "series": {"bin_s": self.bin_s, "items": [
                {"source": s.source, "name": s.name, "t_s": clean(s.t_s), "values": [clean(v) for v in s.values]}
                for s in self.series]},
        }


@dataclass
class _Column:
    run: RunDetail
    members: list[RunDetail]
    figures: list[dict[str, float]]
    unreliable: list[dict[str, str]]


def _column(store: RunStore, run: RunDetail, expand: bool) -> _Column:
    members = [run]
    group = repeat_group(run.tags) if expand else None
    if group is not None:
        ids = sorted(r.id for r in store.list_runs(tag=group) if r.status == "completed")
        members = [store.get_run(i) for i in ids] or [run]
    figures = [run_metrics(m) for m in members]
    return _Column(members[0], members, figures, [run_unreliable(m, f) for m, f in zip(members, figures, strict=True)])


def _metric_rows(columns: Sequence[_Column], base: int) -> list[MetricDelta]:
    keys = sorted(set().union(*(f.keys() for c in columns for f in c.figures)), key=catalog.order_key)
    flagged = {k for c in columns for u in c.unreliable for k in u}
    rows: list[MetricDelta] = []
    for key in keys:
        samples = [[f[key] for f in c.figures if key in f] for c in columns]
        aggs = [aggregate(s) for s in samples]
        values = [a.mean if a is not None else None for a in aggs]
        reasons: list[str | None] = []
        for c in columns:
            bad = [u[key] for u in c.unreliable if key in u]
            if not bad:
                reasons.append(None)
            elif len(c.members) > 1:
                reasons.append(f"in {len(bad)} of {len(c.members)} repeats: {bad[0]}")
            else:
                reasons.append(bad[0])
        ref = values[base]
        delta = [None if v is None or ref is None else v - ref for v in values]
        pct = [None if d is None or not ref else 100.0 * d / abs(ref) for d in delta]
        sig = [None if i == base else significant(samples[i], samples[base]) for i in range(len(columns))]
        rows.append(MetricDelta(
            key, values, delta, pct, catalog.metric(key).direction, reasons,
            [len(s) for s in samples],
            [(a.ci_low, a.ci_high) if a is not None and a.ci_low is not None and a.ci_high is not None else None
             for a in aggs], samples, sig, baseline=base))
    available = [m.name for m in rows]
    lead = catalog.headline_keys(available, flagged)
    by_key = {m.name: m for m in rows}
    for key in lead:
        by_key[key].headline = True
    return [by_key[k] for k in lead] + [m for m in rows if not m.headline]


def compare_runs(store: RunStore, refs: Sequence[int | str], baseline: int | str | None = None, *,
                 series: bool = True, max_points: int = 600, repeats: bool = True,
                 engine_terms_of: EngineTermsOf | None = None) -> Comparison:
    """Compare runs; ``baseline`` is one of ``refs`` (default: the first). With ``repeats``, a
    run that is one of a set of repeats stands for the whole set (unless two of the compared
    runs are of the same set: then they are compared as runs). ``engine_terms_of`` renders each
    differing feature in each engine's own terms (without it, none are shown)."""
    if len(refs) < 2:
        raise StoreError("compare needs at least two runs")
    ids = [store.resolve(r) for r in refs]
    if len(set(ids)) != len(ids):
        raise StoreError("the same run is named twice")
    base_id = ids[0] if baseline is None else store.resolve(baseline)
    if base_id not in ids:
        raise StoreError(f"the baseline (run {base_id}) must be one of the compared runs")
    runs = [store.get_run(i) for i in ids]
    groups = [repeat_group(r.tags) for r in runs]
    expand = repeats and len({g for g in groups if g}) == len([g for g in groups if g])
    return _build(store, runs, ids.index(base_id), expand, series, max_points, engine_terms_of)


def single_run_comparison(store: RunStore, ref: int | str, *, series: bool = True,
                          engine_terms_of: EngineTermsOf | None = None) -> Comparison:
    """One run (or its repeat set) on its own: the same tables and charts, without deltas."""
    return _build(store, [store.get_run(ref)], 0, True, series, 600, engine_terms_of)


def engine_terms(runs: Sequence[RunDetail], keys: Sequence[str],
                 engine_terms_of: EngineTermsOf | None) -> dict[str, list[str | None]]:
    """Each differing feature in each run's engine's own terms, as ``engine_terms_of`` renders
    them from the run's stored features (a run it cannot render has none)."""
    if engine_terms_of is None:
        return {}
    rendered = [engine_terms_of(str((run.config.get("engine") or {}).get("kind", "vllm")),
                                run.config.get("features") or {}) for run in runs]
    out: dict[str, list[str | None]] = {}
    for key in keys:
        if key.startswith("features."):
            feature = key.removeprefix("features.")
            terms = [r.get(feature) if r is not None else None for r in rendered]
            if any(terms):
                out[key] = terms
    return out


def _build(store: RunStore, runs: list[RunDetail], base: int, expand: bool, series: bool,
           max_points: int, engine_terms_of: EngineTermsOf | None) -> Comparison:
    columns = [_column(store, r, expand) for r in runs]
    settings = [run_settings(c.run) for c in columns]
    keys = sorted(set().union(*settings))
    diff = [(k, [s.get(k) for s in settings]) for k in keys if len({repr(s.get(k)) for s in settings}) > 1]
    comparison = Comparison([c.run for c in columns], base, diff, _metric_rows(columns, base),
                            members=[[m.id for m in c.members] for c in columns],
                            engine_terms=engine_terms([c.run for c in columns], [k for k, _v in diff],
                                                         engine_terms_of),
                            unfair=unfair_hardware(m.hardware or {} for c in columns for m in c.members))
    if series:
        comparison.series, comparison.bin_s = align_series(store, comparison.runs, max_points)
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
