"""The HTML report for customers: one self-contained page (inline SVG charts, nothing fetched)
with the runs, their configuration differences, metric deltas against a baseline, headline bar
charts and telemetry overlays. One run gives the same page without deltas."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from xml.sax.saxutils import escape as xml_escape

import numpy as np
from pydantic import ValidationError

from app.analysis import metric_catalog as catalog
from app.analysis.compare import Comparison, compare_runs, single_run_comparison
from app.compare_bundle import CompareExtras, compare_extras
from app.config import RunConfig
from app.cost.prices import PriceTable
from app.cost.text import COST_COLUMNS, cost_rows, sources_text
from app.distributions import aligned
from app.export.quoting import templates
from app.headline import Headline
from app.load.metrics import LevelSummary
from app.planner.live import LimitFigures, Roofline, limit_figures, plan_for_run, roofline
from app.run_findings import suggestion_text
from app.store import RunStore
from engine_adapters.registry import engine_terms_for

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
BUG_COLOUR = "#d62728"
"""A measurement above its physical ceiling (drawn hollow: a bug in the plan or the measurement)."""
REPORT_METRICS = ("output_tok_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
                  "tpot_ms_mean", "e2e_ms_p99", "error_rate_pct")


def format_value(value: float | None) -> str:
    """About four significant figures, thousands separated, no trailing zeros after the point."""
    if value is None or not math.isfinite(value):
        return "–"
    size = abs(value)
    if size >= 1e9 or (0 < size < 1e-3):
        return f"{value:.3g}"
    text = f"{value:,.0f}" if size >= 1000 else f"{value:.{1 if size >= 100 else 2 if size >= 1 else 3}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _delta_text(delta: float | None, pct: float | None) -> str:
    """``+3.9 (+0.2%)``; ``±0`` when unchanged; empty when unknown."""
    if delta is None:
        return ""
    if delta == 0:
        return "±0"
    text = ("+" if delta > 0 else "−") + format_value(abs(delta))
    return text + (f" ({pct:+.1f}%)" if pct is not None else "")


def _svg_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def bar_chart_svg(title: str, labels: Sequence[str], values: Sequence[float | None], width: int = 420) -> str:
    """Horizontal bars, one per run; labels are XML-escaped."""
    row_h, left, top = 22, 150, 28
    height = top + row_h * len(labels) + 10
    finite = [v for v in values if v is not None and math.isfinite(v)]
    vmax = max(finite) if finite else 1.0
    vmax = vmax if vmax > 0 else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><text x="4" y="16" font-weight="bold">{xml_escape(title)}</text>']
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row_h
        short = label if len(label) <= 22 else label[:21] + "…"
        parts.append(f'<text x="4" y="{y + 14}">{xml_escape(short)}</text>')
        if value is not None and math.isfinite(value):
            w = max(1.0, (width - left - 70) * max(value, 0) / vmax)
            parts.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
                         f'fill="{PALETTE[i % len(PALETTE)]}"/>')
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + 14}">{xml_escape(format_value(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart_svg(title: str, t_s: np.ndarray, series: Sequence[np.ndarray], labels: Sequence[str],
                   width: int = 640, height: int = 236) -> str:
    """Overlaid lines on a shared time axis (seconds since each run started); legend below."""
    left, right, top, bottom = 60, 10, 24, 46 + 14 * max(0, (len(labels) - 1) // 4)
    height += bottom - 46
    pw, ph = width - left - right, height - top - bottom
    finite = np.concatenate([s[np.isfinite(s)] for s in series]) if series else np.empty(0)
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    lo = min(lo, 0.0)
    hi = hi if hi > lo else lo + 1.0
    tmax = float(t_s[-1]) if t_s.size else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="4" y="14" font-weight="bold">{xml_escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
             f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{xml_escape(format_value(hi))}</text>',
             f'<text x="{left - 4}" y="{top + ph}" text-anchor="end">{xml_escape(format_value(lo))}</text>',
             f'<text x="{left + pw}" y="{top + ph + 14}" text-anchor="end">{xml_escape(format_value(tmax))} s</text>',
             f'<text x="{left}" y="{top + ph + 14}">0 s</text>']
    for i, values in enumerate(series):
        points, segments = [], []
        for t, v in zip(t_s, values, strict=True):
            if math.isfinite(v):
                points.append(f"{left + pw * t / tmax:.1f},{top + ph * (1 - (v - lo) / (hi - lo)):.1f}")
            elif points:
                segments.append(points)
                points = []
        if points:
            segments.append(points)
        for seg in segments:
            parts.append(f'<polyline fill="none" stroke="{PALETTE[i % len(PALETTE)]}" stroke-width="1.5" '
                         f'points="{" ".join(seg)}"/>')
    for i, label in enumerate(labels):
        parts.append(f'<text x="{left + 150 * (i % 4)}" y="{top + ph + 30 + 14 * (i // 4)}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}">{xml_escape(label[:24])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def xy_chart_svg(title: str, curves: Sequence[tuple[str, Sequence[float], Sequence[float], bool]], x_label: str,
                 y_label: str, width: int = 420, height: int = 260, markers: bool = False) -> str:
    """Lines on their own x values (a CDF, a sweep's levels); a dashed line is a figure its run
    flagged unreliable. Legend below, labels XML-escaped."""
    left, right, top, bottom = 56, 12, 24, 46 + 14 * ((len(curves) + 1) // 2)
    height += bottom - 46
    pw, ph = width - left - right, height - top - bottom
    xs = [x for _, cx, _, _ in curves for x in cx if math.isfinite(x)]
    ys = [y for _, _, cy, _ in curves for y in cy if math.isfinite(y)]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y0, y1 = (min(min(ys), 0.0), max(ys)) if ys else (0.0, 1.0)
    x1, y1 = (x1 if x1 > x0 else x0 + 1.0), (y1 if y1 > y0 else y0 + 1.0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="4" y="14" font-weight="bold">{xml_escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
             f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{xml_escape(format_value(y1))}</text>',
             f'<text x="{left - 4}" y="{top + ph}" text-anchor="end">{xml_escape(format_value(y0))}</text>',
             f'<text x="{left}" y="{top + ph + 14}">{xml_escape(format_value(x0))}</text>',
             f'<text x="{left + pw}" y="{top + ph + 14}" text-anchor="end">{xml_escape(format_value(x1))}</text>',
             f'<text x="{left + pw / 2:.0f}" y="{top + ph + 14}" text-anchor="middle">{xml_escape(x_label)}</text>',
             f'<text x="12" y="{top + ph / 2:.0f}" transform="rotate(-90 12 {top + ph / 2:.0f})" '
             f'text-anchor="middle">{xml_escape(y_label)}</text>']
    for i, (label, cx, cy, dashed) in enumerate(curves):
        colour = PALETTE[i % len(PALETTE)]
        points = [(left + pw * (x - x0) / (x1 - x0), top + ph * (1 - (y - y0) / (y1 - y0)))
                  for x, y in zip(cx, cy, strict=True) if math.isfinite(x) and math.isfinite(y)]
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
                     f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in points)}"/>')
        if markers:
            parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points]
        parts.append(f'<text x="{left + 200 * (i % 2)}" y="{top + ph + 30 + 14 * (i // 2)}" fill="{colour}">'
                     f'{xml_escape(label[:30])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def roofline_svg(title: str, roof: Roofline, points: Sequence[tuple[str, LimitFigures]], width: int = 460,
                 height: int = 300) -> str:
    """Log-log roofline: arithmetic intensity (FLOPs per byte moved) against achieved FLOP/s, the
    hardware's bandwidth slope and compute roof, and one marked point per level (``class="level"``).
    A point whose rate is above its ceiling is drawn hollow and red: a bug, not a record."""
    left, right, top, bottom = 62, 12, 24, 60
    pw, ph = width - left - right, height - top - bottom
    height += 14 * max(0, (len(points) - 1) // 2)  # legend rows below the plot
    xs = [p.arithmetic_intensity_flop_per_byte for _, p in points]
    ys = [p.achieved_flop_per_s for _, p in points]
    ridge = roof.ridge_flop_per_byte
    x_lo = 10 ** math.floor(math.log10(min([*xs, ridge or max(xs, default=1.0), 1.0]) / 2))
    x_hi = 10 ** math.ceil(math.log10(max([*xs, (ridge or 1.0) * 4, 10.0]) * 2))
    top_y = roof.peak_flop_per_s or roof.bandwidth_bytes_per_s * x_hi
    y_hi = 10 ** math.ceil(math.log10(max([*ys, top_y]) * 1.5))
    y_lo = 10 ** math.floor(math.log10(max(min([*ys, roof.bandwidth_bytes_per_s * x_lo]), 1.0) / 2))

    def px(x: float) -> float:
        return left + pw * (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo))

    def py(y: float) -> float:
        return top + ph * (1 - (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="4" y="14" font-weight="bold">{xml_escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>']
    for e in range(round(math.log10(x_lo)), round(math.log10(x_hi)) + 1):
        parts.append(f'<line x1="{px(10.0**e):.1f}" y1="{top}" x2="{px(10.0**e):.1f}" y2="{top + ph}" stroke="#eee"/>'
                     f'<text x="{px(10.0**e):.1f}" y="{top + ph + 14}" text-anchor="middle">1e{e}</text>')
    for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1):
        parts.append(f'<line x1="{left}" y1="{py(10.0**e):.1f}" x2="{left + pw}" y2="{py(10.0**e):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{py(10.0**e) + 4:.1f}" text-anchor="end">1e{e}</text>')
    parts += [f'<text x="{left + pw / 2:.0f}" y="{top + ph + 28}" text-anchor="middle">arithmetic intensity '
              '(FLOP/byte)</text>',
              f'<text x="12" y="{top + ph / 2:.0f}" transform="rotate(-90 12 {top + ph / 2:.0f})" '
              'text-anchor="middle">achieved FLOP/s</text>']
    # The roof: bandwidth x intensity up to the ridge, then the compute roof (clipped to the plot).
    knee = min(ridge, x_hi) if ridge else x_hi
    roof_points = [(x_lo, roof.bandwidth_bytes_per_s * x_lo), (knee, roof.attainable_flop_per_s(knee))]
    if ridge and ridge < x_hi:
        roof_points.append((x_hi, roof.attainable_flop_per_s(x_hi)))
    clipped = [(px(x), py(min(max(y, y_lo), y_hi))) for x, y in roof_points]
    parts.append('<polyline class="roof" fill="none" stroke="#555" stroke-width="1.5" '
                 f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in clipped)}"/>')
    colours = [c for c in PALETTE if c != BUG_COLOUR]
    for i, (label, p) in enumerate(points):
        colour = BUG_COLOUR if p.fraction is None else colours[i % len(colours)]
        x, y = px(p.arithmetic_intensity_flop_per_byte), py(p.achieved_flop_per_s)
        style = f'fill="none" stroke="{colour}" stroke-width="2"' if p.fraction is None else f'fill="{colour}"'
        parts.append(f'<circle class="level" cx="{x:.1f}" cy="{y:.1f}" r="4" {style}>'
                     f'<title>{xml_escape(f"{label}: {p.text()}; {p.detail()}")}</title></circle>')
        parts.append(f'<text x="{left + 200 * (i % 2)}" y="{top + ph + 44 + 14 * (i // 2)}" fill="{colour}">'
                     f'{xml_escape(f"{label[:16]}: {p.text()}")}</text>')
    parts.append(f'<text x="{left + 4}" y="{top + 12}" fill="#555">{xml_escape(roof.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _roofline_charts(comparison: Comparison) -> tuple[list[dict[str, str]], list[str]]:
    """One roofline per run with a plan (its model's architecture and its hardware), a point per
    level; runs without one get a note saying why."""
    charts: list[dict[str, str]] = []
    notes: list[str] = []
    for label, run in zip(comparison.labels(), comparison.runs, strict=True):
        if run.imported or not run.config:
            continue  # another tool's result: no tunebench configuration to plan
        try:
            config = RunConfig.model_validate(run.config)
            summaries = [(lv.label or f"level {lv.idx}", LevelSummary.model_validate(lv.summary))
                         for lv in run.levels if lv.summary]
        except ValidationError:
            continue  # a configuration or level summary of an older tunebench: nothing to plan
        plan, why = plan_for_run(config, run.hardware)
        if plan is None:
            notes.append(f"{label}: {why}")
            continue
        points = [(name, f) for name, s in summaries if (f := limit_figures(plan, s)) is not None]
        if not points:
            continue
        charts.append({"name": f"Roofline {label}", "uri": _svg_uri(roofline_svg(f"Roofline: {label}", roofline(plan),
                                                                                 points))})
        notes += [f"{label} {name}: {p.flag}" for name, p in points if p.flag]
    return charts, notes


def _headline_items(items: Sequence[Headline]) -> list[dict[str, object]]:
    """The A/B headline of each compared run (``app.headline``), for the card at the top."""
    return [{"sentence": h.sentence(),
             "quality": h.quality.text if h.quality is not None else "",
             "quality_greyed": h.quality is not None and h.quality.greyed,
             "figures": [{"text": f.values_text(), "change": f.factor if f.verdict != "same"
                          else "no significant difference", "verdict": f.verdict, "note": f.note}
                         for f in h.figures]} for h in items]


def _findings_section(comparison: Comparison, extras: CompareExtras) -> list[dict[str, object]]:
    """Each run's findings (``app.run_findings``): why it differs from the baseline, then what it
    measured, warnings first, each with its evidence and the next trial; none without a store."""
    labels = comparison.labels()
    others = [i for i in range(len(comparison.runs)) if i != comparison.baseline]
    why = dict(zip(others, extras.why, strict=False))
    out: list[dict[str, object]] = []
    for i, found in enumerate(extras.findings):
        out.append({"label": labels[i], "why": [f.explanation for f in why.get(i, [])],
                    "findings": [{"rule": f.rule, "severity": f.severity, "confidence": f.confidence,
                                  "explanation": f.explanation, "evidence": [e.text() for e in f.evidence],
                                  "suggestion": suggestion_text(f.suggestion) if f.suggestion else ""}
                                 for f in found]})
    return out


def _cost_section(comparison: Comparison,
                  extras: CompareExtras) -> tuple[str | None, list[str], list[list[str]], list[str]]:
    """The before/after in money (a baseline and one other run: ``app.headline.money_line``), then
    every run's cost table as Compare shows it (``app.cost.cost_rows``; at goodput too where the
    extras were counted from the store) and its notes: whose prices and SLO, and why a figure is
    missing or deserves caution."""
    costs, lines, good_note = extras.costs, extras.money_lines, extras.good_slo_text
    columns, rows = list(COST_COLUMNS), cost_rows(comparison, costs)
    if len(comparison.runs) == 1:  # nothing to be cheaper than
        columns.pop(2)
        rows = [row[:2] + row[3:] for row in rows]
    labels = comparison.labels()
    notes = [f"Prices: {source}." for source in [sources_text(costs)] if source] + ([good_note] if good_note else [])
    notes += [f"{label}: cost {cost.note}." for label, cost in zip(labels, costs, strict=True) if cost.note]
    return (lines[0] if len(comparison.runs) == 2 else None), columns, rows, notes


def _distribution_charts(extras: CompareExtras) -> tuple[list[dict[str, str]], list[str]]:
    """TTFT/ITL CDFs (from the stored requests, where the extras were counted from the store)
    and, for sweeps, throughput against latency."""
    charts: list[dict[str, str]] = []
    notes: list[str] = []
    if extras.distributions:
        for attr, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL")):
            curves = []
            for d in extras.distributions:
                cdf = getattr(d, attr)
                if cdf is None:
                    continue
                flagged = d.unreliable.get(attr)
                curves.append((f"#{d.run_id}" + (" (unreliable)" if flagged else ""), list(cdf.x), list(cdf.p * 100),
                               bool(flagged)))
                if flagged:
                    notes.append(f"#{d.run_id} {name}: {flagged}")
            if curves:
                charts.append({"name": f"{name} distribution", "uri": _svg_uri(xy_chart_svg(
                    f"{name} distribution (client)", curves, f"{name} (ms)", "% at or below"))})
    for sweep in extras.sweeps:
        curves = [(f"#{c.run_id}", [p.x for p in c.points], [p.y for p in c.points], False) for c in sweep.curves]
        charts.append({"name": f"{sweep.x_label} vs {sweep.y_label}", "uri": _svg_uri(xy_chart_svg(
            f"Throughput vs {catalog.metric(sweep.y_key).name} across the levels", curves, sweep.x_label,
            sweep.y_label, markers=True))})
    return charts, notes


def render_report(comparison: Comparison, title: str | None = None, max_series: int = 12,
                  store: RunStore | None = None, prices: PriceTable | None = None) -> str:
    """A self-contained HTML page: the A/B headline (and, for two runs, its cost at ``prices``,
    default: the shipped list), runs, configuration differences, metric deltas, each run's cost,
    charts; with ``store``, also the cost at goodput, the TTFT/ITL distributions and each run's
    findings."""
    runs = comparison.runs
    labels = comparison.labels()
    extras = compare_extras(comparison, store, prices)
    offsets = extras.load_start_s
    # Figures, names, verdicts and reliability as Compare has them (app.analysis.compare / app.analysis.metric_catalog);
    # a chart never draws a figure its run flagged unreliable: the engine's own stands in for it.
    bars = [{"name": m.metric.label, "uri": _svg_uri(bar_chart_svg(m.metric.label, labels, m.values))}
            for m in {m.name: m for m in comparison.chart_metrics(REPORT_METRICS)}.values()
            if any(v for v in m.values)]  # a chart of zeros (no errors anywhere) says nothing
    preferred = ("client.", "engine.", "gpu")
    ordered = sorted(comparison.series, key=lambda s: (not s.key.startswith(preferred), s.key))
    # Each run's series from the start of its load (engine starts differ in length).
    lines = [{"name": s.key, "uri": _svg_uri(line_chart_svg(f"{s.key} (bin {comparison.bin_s:g} s)", s.t_s,
                                                            [aligned(v, offsets[i], comparison.bin_s)
                                                             for i, v in enumerate(s.values)], labels))}
             for s in ordered[:max_series] if any(np.isfinite(v).any() for v in s.values)]
    dist_charts, dist_notes = _distribution_charts(extras)
    cost_line, cost_columns, cost_table, cost_notes = _cost_section(comparison, extras)
    roofline_charts, roofline_notes = _roofline_charts(comparison)
    metrics = [{"name": row["name"] + (f" — {row['direction']}" if len(runs) > 1 else ""), "key": row["key"],
                "cells": [{"value": c["value"], "delta": c["note"], "verdict": c["cls"], "reason": c["reason"]}
                          for c in row["cells"]]} for row in comparison.rows()]
    return templates().get_template("report.html.j2").render(
        title=title or (f"tunebench comparison of {len(runs)} runs" if len(runs) > 1
                        else f"tunebench report: {labels[0]}"),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        runs=[{"label": labels[i], "r": r, "started": datetime.fromtimestamp(r.started_at, UTC)
               .strftime("%Y-%m-%d %H:%M"), "color": PALETTE[i % len(PALETTE)],
               "baseline": i == comparison.baseline and len(runs) > 1} for i, r in enumerate(runs)],
        diff=[{"key": k, "values": ["–" if v is None else json.dumps(v) if not isinstance(v, str) else v
                                    for v in vals], "terms": comparison.engine_terms.get(k)}
              for k, vals in comparison.config_diff],
        metrics=metrics, bars=bars, lines=lines, baseline_label=labels[comparison.baseline],
        headlines=_headline_items(extras.headlines), cost_line=cost_line, cost_columns=cost_columns,
        cost_rows=cost_table, cost_notes=cost_notes, distributions=dist_charts, distribution_notes=dist_notes,
        rooflines=roofline_charts, roofline_notes=roofline_notes, findings=_findings_section(comparison, extras))


def report_comparison(store: RunStore, refs: Sequence[int | str], baseline: int | str | None = None) -> Comparison:
    """What a report shows: the runs compared against ``baseline`` (default: the first), or one
    run on its own (the same tables and charts, without deltas)."""
    if len(refs) > 1:
        return compare_runs(store, refs, baseline, engine_terms_of=engine_terms_for)
    return single_run_comparison(store, refs[0], engine_terms_of=engine_terms_for)
