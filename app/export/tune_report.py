"""A tune as a customer sees it: the Pareto chart (output tok/s per GPU against tok/s per user,
every trial, the SLO frontier, the SLO's TPOT line, the pick, imported fronts), the trials table,
the pick with the constraint that bound it and its confirmation, and the pick's launch scripts.

``tunebench tunes report ID -o FILE`` and the GUI's Tune tab call :func:`render_tune_report`; the
CLI table, the GUI table and the report's table share :func:`trial_table`; every launch format of
the pick comes from :func:`pick_launch_script` (the adapter's own argv, ``app.export.launch``).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape as xml_escape

from app.config import RunConfig
from app.cost import CostFigure, RunCost, usd_text
from app.errors import UserError
from app.export.launch import SCRIPT_FORMATS, LaunchSpec, render_launch
from app.export.quoting import templates
from app.export.report import format_value
from app.quality.probe import quality_cell
from app.tuner.run import confirmation_text
from app.tuner.state import Trial, TuneState, chart_points, pareto_front, slo_frontier, tpot_floor
from engine_adapters.runtimes import MANAGED_RUNTIMES

PASSED, FAILED, FRONTIER, PICK, MUTED = "#188038", "#d93025", "#188038", "#f9ab00", "#888888"
IMPORT_COLOURS = ("#1a73e8", "#9334e6", "#e8710a", "#12b5cb")
COST_COLUMNS = ("$/1M out", "$/1M good")
"""``$/1M out``: per 1M output tokens at the trial's throughput; ``$/1M good``: per 1M output
tokens of the requests that met the tune's SLO (``app.cost.trial_costs``)."""
COLUMNS = ("#", "configuration", "load", "status", "tok/s per GPU", "tok/s per user", "TTFT p99 ms", "TPOT p99 ms",
           *COST_COLUMNS, "engine", "run", "note")


def _cell(value: float | None) -> str:
    return "\u2013" if value is None or not math.isfinite(value) else format_value(value)


def _usd_cell(figure: CostFigure | None) -> str:
    """The cost, ``n/a`` where it could not be counted (the table's note says why), a dash where
    nothing was asked (no SLO to count good output under)."""
    if figure is None:
        return "\u2013"
    return usd_text(figure.usd) if figure.usd is not None else "n/a"


def trial_table(state: TuneState, costs: Mapping[int, RunCost] | None = None) -> list[dict[str, str]]:
    """One row per trial, measured first (what the CLI, the GUI and the report show); the cost
    cells from ``costs`` (``app.cost.trial_costs``), a dash where a trial is not priced."""
    costs = costs or {}
    rows = []
    for t in sorted(state.trials, key=lambda t: (not t.measured, t.index)):
        engine = "" if t.engine_reused is None else "reused" if t.engine_reused else \
            f"launched ({_cell(t.startup_s)} s)" if t.startup_s is not None else "launched"
        pick = state.pick is not None and state.pick.trial == t.index and t.measured
        rows.append({"#": str(t.index + 1), "configuration": t.label or "-", "load": t.load_label,
                     "status": ("PICK " if pick else "") + (t.source if not t.measured else t.status),
                     "tok/s per GPU": _cell(t.tok_s_per_gpu), "tok/s per user": _cell(t.tok_s_per_user),
                     "TTFT p99 ms": _cell(t.figures.get("ttft_ms_p99")),
                     "TPOT p99 ms": _cell(t.figures.get("tpot_ms_p99")),
                     "$/1M out": _usd_cell(costs[t.index].output) if t.index in costs else "\u2013",
                     "$/1M good": _usd_cell(costs[t.index].good_output) if t.index in costs else "\u2013",
                     "engine": engine,
                     "run": "" if t.run_id is None else str(t.run_id),
                     "note": t.reason if t.reason and t.status not in ("passed", "imported") else ""})
    return rows


def pick_text(state: TuneState) -> str:
    """The pick in one paragraph (the CLI's last lines, the GUI's pick box, the report)."""
    p = state.pick
    if p is None:
        return (f"No configuration met the SLO ({state.slo} at {state.percentile}) at any load tried."
                if state.measured else "No trial has run yet.")
    text = (f"The pick: {p.label} at {p.load_label}: {_cell(p.tok_s_per_gpu)} output tok/s per GPU, "
            f"{_cell(p.tok_s_per_user)} tok/s per user, meeting {state.slo} at {state.percentile}. "
            f"Bound by: {p.binding}.")
    if p.confirmation is not None:
        text += " " + confirmation_text(p.confirmation)[0].upper() + confirmation_text(p.confirmation)[1:] + "."
    return text + quality_text(state)


def quality_text(state: TuneState) -> str:
    """How quality weighed on the pick, in sentences (empty where it played no part): the pick's
    quality against the reference, the configurations the quality bounds excluded, the pick speed
    alone would have made, or that the pick is blind to quality."""
    q = state.quality
    parts = []
    pick = next((c for c in state.candidates if state.pick is not None and c.index == state.pick.candidate), None)
    if pick is not None and pick.quality and pick.quality.get("measured") and q.get("reference"):
        parts.append(f"Quality against {q['reference']}: {quality_cell(pick.quality)}.")
    if q.get("excluded"):
        parts.append(f"The quality bounds ({q.get('bounds')}) excluded: {'; '.join(q['excluded'])}.")
    if q.get("pick_without_quality"):
        parts.append(f"Speed alone would have picked {q['pick_without_quality']}: the quality term changed the pick.")
    if q.get("blind"):
        parts.append(f"Blind to quality: {q['blind']}.")
    return "".join(" " + part for part in parts)


def pick_launch_script(state: TuneState, fmt: str = "bash", engine_version: str | None = None) -> str:
    """The pick's launch script in ``fmt`` (bash, docker, compose, k8s)."""
    if fmt not in SCRIPT_FORMATS:
        raise UserError(f"unknown launch format '{fmt}' (choose from {', '.join(SCRIPT_FORMATS)})")
    if state.pick is None or not state.pick.config:
        raise UserError(f"tune {state.tune_id} has no pick to export (no configuration met the SLO)")
    config = RunConfig.model_validate(state.pick.config)
    runtime = config.engine.runtime
    version = engine_version
    if version is None and runtime.kind == "managed" and runtime.managed in MANAGED_RUNTIMES:
        version = MANAGED_RUNTIMES[runtime.managed].version
    source = f"the pick of tunebench tune {state.tune_id} ({state.pick.label} at {state.pick.load_label}, SLO {state.slo})"
    candidate = next((c for c in state.candidates if c.index == state.pick.candidate), None)
    quality = candidate.quality if candidate is not None else None
    return render_launch(LaunchSpec(config, source, version, quality=quality), fmt)


# --- the chart ---------------------------------------------------------------------------------------

def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def pareto_svg(state: TuneState, width: int = 760, height: int = 440) -> str:
    """The trade-off: each trial a point (green met the SLO, red missed it), the SLO frontier, the
    TPOT bound as a vertical line, the pick ringed, imported points by source (hollow)."""
    left, right, top, bottom = 70, 20, 30, 60
    pw, ph = width - left - right, height - top - bottom
    trials = [t for t in state.trials if t.tok_s_per_user is not None and t.tok_s_per_gpu is not None]
    floor = tpot_floor(state.slo) if state.slo else None
    xs = [t.tok_s_per_user for t in trials if t.tok_s_per_user is not None] + ([floor] if floor else [])
    ys = [t.tok_s_per_gpu for t in trials if t.tok_s_per_gpu is not None]
    x_hi = max(xs, default=1.0) * 1.08 or 1.0
    y_hi = max(ys, default=1.0) * 1.08 or 1.0

    def px(x: float) -> float:
        return left + pw * x / x_hi

    def py(y: float) -> float:
        return top + ph * (1 - y / y_hi)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="4" y="16" font-weight="bold">Output tok/s per GPU against tok/s per user '
             f'(1000 / mean TPOT)</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>']
    for v in _ticks(0.0, x_hi):
        parts.append(f'<line x1="{px(v):.1f}" y1="{top + ph}" x2="{px(v):.1f}" y2="{top + ph + 4}" stroke="#999"/>'
                     f'<text x="{px(v):.1f}" y="{top + ph + 16}" text-anchor="middle">{xml_escape(format_value(v))}</text>')
    for v in _ticks(0.0, y_hi):
        parts.append(f'<line x1="{left - 4}" y1="{py(v):.1f}" x2="{left}" y2="{py(v):.1f}" stroke="#999"/>'
                     f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{xml_escape(format_value(v))}</text>')
    parts.append(f'<text x="{left + pw / 2:.0f}" y="{height - 26}" text-anchor="middle">tok/s per user</text>'
                 f'<text x="14" y="{top + ph / 2:.0f}" text-anchor="middle" transform="rotate(-90 14 '
                 f'{top + ph / 2:.0f})">output tok/s per GPU</text>')
    if floor:
        parts.append(f'<line x1="{px(floor):.1f}" y1="{top}" x2="{px(floor):.1f}" y2="{top + ph}" stroke="{FAILED}" '
                     f'stroke-dasharray="5,4"/><text x="{px(floor) + 4:.1f}" y="{top + 12}" fill="{FAILED}">'
                     f'TPOT SLO: {xml_escape(format_value(floor))} tok/s per user</text>')
    frontier = slo_frontier(state.trials)
    if len(frontier) >= 1:
        pts = " ".join(f"{px(t.tok_s_per_user or 0):.1f},{py(t.tok_s_per_gpu or 0):.1f}" for t in frontier)
        parts.append(f'<polyline fill="none" stroke="{FRONTIER}" stroke-width="2" points="{pts}"/>')
    sources = sorted({t.source for t in trials if not t.measured})
    for i, source in enumerate(sources):  # imported fronts: hollow markers and their own front
        colour = IMPORT_COLOURS[i % len(IMPORT_COLOURS)]
        mine = [t for t in trials if t.source == source]
        front = [mine[j] for j in pareto_front(chart_points(mine))]
        if len(front) > 1:
            pts = " ".join(f"{px(t.tok_s_per_user or 0):.1f},{py(t.tok_s_per_gpu or 0):.1f}" for t in front)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="4,3" '
                         f'points="{pts}"/>')
        for t in mine:
            x, y = px(t.tok_s_per_user or 0), py(t.tok_s_per_gpu or 0)
            parts.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="none" stroke="{colour}" '
                         f'transform="rotate(45 {x:.1f} {y:.1f})"><title>{xml_escape(source)}: '
                         f'{xml_escape(t.label)}</title></rect>')
    for t in trials:
        if not t.measured:
            continue
        colour = PASSED if t.status == "passed" else FAILED if t.status == "failed" else MUTED
        x, y = px(t.tok_s_per_user or 0), py(t.tok_s_per_gpu or 0)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{colour}" fill-opacity="0.8"><title>'
                     f'{xml_escape(t.label)} at {xml_escape(t.load_label)}: {t.status}</title></circle>')
        if state.pick is not None and state.pick.trial == t.index:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="{PICK}" stroke-width="3"/>'
                         f'<text x="{x + 11:.1f}" y="{y - 8:.1f}" font-weight="bold">pick</text>')
    legend = [(PASSED, "met the SLO"), (FAILED, "missed the SLO"), (FRONTIER, "SLO frontier"), (PICK, "pick")]
    legend += [(IMPORT_COLOURS[i % len(IMPORT_COLOURS)], f"{s} (imported)") for i, s in enumerate(sources)]
    for i, (colour, text) in enumerate(legend):
        x = left + 140 * (i % 5)
        y = height - 8 - 0 * (i // 5)
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="{y}">{xml_escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _space_rows(state: TuneState) -> list[dict[str, str]]:
    space = state.space or {}
    sources = space.get("sources") or {}
    rows = [{"what": k, "values": ", ".join(map(str, v)), "source": str(sources.get(k, ""))}
            for k, v in (space.get("knobs") or {}).items()]
    load = space.get("load") or {}
    if load:
        rows.append({"what": f"load ({load.get('kind')})", "values": ", ".join(f"{v:g}" for v in load.get("values", [])),
                     "source": str(sources.get("load", ""))})
    return rows


def cost_note(costs: Mapping[int, RunCost]) -> str:
    """What the cost columns were priced at and under which SLO, or why they are empty."""
    priced = [c for c in costs.values() if c.price is not None]
    if not priced:
        reasons = list(dict.fromkeys(c.reason for c in costs.values() if c.reason))
        return "costs: not priced" + (f" ({'; '.join(reasons)})" if reasons else "")
    slo = next((c.good_slo for c in priced if c.good_slo), None)
    prices = "; ".join(dict.fromkeys(c.price_text() for c in priced))
    text = f"costs at {prices}"
    if slo:
        text += f"; $/1M good: per 1M output tokens of the requests that met {slo}"
        missing = list(dict.fromkeys(c.good_output.reason for c in priced
                                     if c.good_output is not None and c.good_output.reason))
        if missing:
            text += f" (n/a: {'; '.join(missing)})"
    unpriced = list(dict.fromkeys(c.reason for c in costs.values() if c.reason))
    if unpriced:
        text += f"; n/a: {'; '.join(unpriced)}"
    return text


def render_tune_report(state: TuneState, *, title: str | None = None,
                       costs: Mapping[int, RunCost] | None = None) -> str:
    """The tune as one self-contained HTML page (see the module docstring); with ``costs``
    (``app.cost.trial_costs``), the trials' cost columns and the price they used."""
    script = ""
    if state.pick is not None:
        try:
            script = pick_launch_script(state, "bash")
        except UserError as exc:
            script = f"# not exported: {exc}"
    cands = [{"n": c.index + 1, "label": c.label, "status": c.status, "reason": c.reason or "",
              "binding": c.binding or ""} for c in state.candidates]
    return templates().get_template("tune_report.html.j2").render(
        title=title or f"tunebench tune: {state.name}",
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        started=datetime.fromtimestamp(state.started_wall_s, UTC).strftime("%Y-%m-%d %H:%M UTC")
        if state.started_wall_s else "-",
        state=state, chart=_uri(pareto_svg(state)), columns=COLUMNS, rows=trial_table(state, costs), pick=pick_text(state),
        cost_note=cost_note(costs) if costs is not None else "",
        script=script, candidates=cands, space=_space_rows(state), elapsed=_cell(state.elapsed_s / 60.0))


def imported_sources(trials: Sequence[Trial]) -> list[str]:
    return sorted({t.source for t in trials if not t.measured})


def state_summary(state: TuneState) -> dict[str, Any]:
    """Counts for a one-line listing."""
    measured = state.measured
    return {"trials": len(measured), "passed": sum(t.status == "passed" for t in measured),
            "candidates": len(state.candidates), "pruned": sum(c.status == "pruned" for c in state.candidates)}
