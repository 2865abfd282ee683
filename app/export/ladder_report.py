"""The HTML report of an acceleration ladder: the customer's leave-behind. One self-contained page
(inline SVG, nothing fetched): the staircase, a table per step (figures, factors against the
baseline and the previous step, % of the physical limit, verification), the configuration
change of every step, the hardware and versions, and the final step's launch script.

``tunebench ladders report ID -o FILE`` and the GUI's Ladder tab both call
:func:`render_ladder_report`; the staircase picture is :func:`staircase_svg`.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape as xml_escape

from app.config import RunConfig
from app.cost import RunCost, good_slo_of, step_slo_whose, usd_text
from app.errors import UserError
from app.export.launch import LaunchSpec, render_launch
from app.export.quoting import templates
from app.export.report import format_value
from app.ladder.state import LadderState, StepRow, factor_text, limit_text
from engine_adapters.base import feature_status_text
from engine_adapters.runtimes import MANAGED_RUNTIMES

OUTPUT_COLOUR, LOSS_COLOUR, MUTED = "#1f77b4", "#d62728", "#888888"


def _uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def staircase_svg(rows: Sequence[StepRow], width: int = 820, height: int = 380) -> str:
    """Output tok/s per step, with its total tok/s, the factor against the baseline and the
    previous step above each bar (total tok/s is written, not drawn: prompts often outweigh
    outputs tenfold and would flatten the output bars), a loss in red, a skipped step greyed
    with its word, and the reference figure (when there is one) as a dashed mark labelled "ref"."""
    left, right, top, bottom = 64, 12, 40, 74
    pw, ph = width - left - right, height - top - bottom
    values = [v for r in rows for v in (r.output_tok_per_s, r.reference_tok_per_s)
              if v is not None and math.isfinite(v)]
    vmax = max(values) if values else 1.0
    vmax = vmax * 1.3 if vmax > 0 else 1.0
    slot = pw / max(1, len(rows))
    bar = min(60.0, slot * 0.3)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="4" y="16" font-weight="bold">Output tok/s per step (total tok/s in '
             f'brackets)</text>',
             f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#999"/>',
             f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{xml_escape(format_value(vmax))}</text>',
             f'<text x="{left - 4}" y="{top + ph}" text-anchor="end">0</text>']

    def y_of(value: float) -> float:
        return top + ph * (1 - max(value, 0.0) / vmax)

    for i, row in enumerate(rows):
        x0 = left + i * slot + (slot - bar) / 2
        name = row.name if len(row.name) <= 26 else row.name[:25] + "\u2026"
        parts.append(f'<text x="{left + i * slot + slot / 2:.1f}" y="{top + ph + 16}" text-anchor="middle">'
                     f'{xml_escape(f"{i + 1}. {name}")}</text>')
        if not row.ran:
            word = row.status if row.status != "completed" else "no figures"
            parts.append(f'<text x="{left + i * slot + slot / 2:.1f}" y="{top + ph - 8}" text-anchor="middle" '
                         f'fill="{MUTED}">{xml_escape(word)}</text>')
            continue
        out = row.output_tok_per_s or 0.0
        colour = LOSS_COLOUR if row.loss else OUTPUT_COLOUR
        parts.append(f'<rect x="{x0:.1f}" y="{y_of(out):.1f}" width="{bar:.1f}" height="{top + ph - y_of(out):.1f}" '
                     f'fill="{colour}"/>')
        label_y = y_of(out) - 44
        lines = [(format_value(out), colour, "bold")]
        if row.total_tok_per_s is not None:
            lines.append((f"(total {format_value(row.total_tok_per_s)})", MUTED, "normal"))
        if row.index == _first_ran(rows):
            lines.append(("baseline", "#333", "normal"))
        else:
            lines.append((f"{factor_text(row.factor_baseline)} vs baseline", "#333", "normal"))
            lines.append((("loss " if row.loss else "") + f"{factor_text(row.factor_previous)} vs previous",
                          LOSS_COLOUR if row.loss else "#333", "bold" if row.loss else "normal"))
        cx = x0 + bar / 2
        for k, (text, fill, weight) in enumerate(lines):
            parts.append(f'<text x="{cx:.1f}" y="{label_y + 12 * k:.1f}" text-anchor="middle" font-weight="{weight}" '
                         f'fill="{fill}">{xml_escape(text)}</text>')
        if row.reference_tok_per_s is not None:
            ry = y_of(row.reference_tok_per_s)
            parts.append(f'<line x1="{x0 - 4:.1f}" y1="{ry:.1f}" x2="{x0 + bar + 4:.1f}" y2="{ry:.1f}" '
                         f'stroke="#555" stroke-dasharray="4,3"/>')
            parts.append(f'<text x="{x0 + bar + 6:.1f}" y="{ry + 4:.1f}" fill="#555">'
                         f'ref {xml_escape(format_value(row.reference_tok_per_s))}</text>')
    parts.append(f'<text x="{left}" y="{height - 22}" fill="{MUTED}">factors of output tok/s: against the baseline '
                 f'(the first step that ran) and the previous step that ran</text>')
    parts.append(f'<text x="{left}" y="{height - 8}" fill="{MUTED}">red: slower than the previous step (a loss, as '
                 f'measured); dashed: the reference figure, not measured here</text>')
    parts.append("</svg>")
    return "".join(parts)


def _first_ran(rows: Sequence[StepRow]) -> int | None:
    return next((r.index for r in rows if r.ran), None)


def _cell(value: float | None) -> str:
    return "\u2013" if value is None or not math.isfinite(value) else format_value(value)


def _shown(value: Any) -> str:
    if value is None:
        return "default"
    return value if isinstance(value, str) else json.dumps(value)


def _hardware_text(hw: dict[str, Any]) -> str:
    gpus = [g for g in hw.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        names = sorted({str(g.get("name")) for g in gpus})
        return f"{len(gpus)} x {', '.join(names)}, driver {hw.get('driver_version') or '?'}"
    ram = hw.get("ram_total_bytes") or 0
    return (f"no GPU; CPU {hw.get('cpu_model') or '?'} x{hw.get('cpu_count_logical') or '?'}, "
            f"{ram / 2**30:.0f} GiB RAM") if hw else "unknown"


def launch_script(row: StepRow, fmt: str = "bash", engine_version: str | None = None) -> str:
    """A step's launch script, from the configuration the step ran (or would run) with."""
    if not row.config:
        raise UserError(f"step '{row.name}' has no configuration to export")
    config = RunConfig.model_validate(row.config)
    version = engine_version
    runtime = config.engine.runtime
    if version is None and runtime.kind == "managed" and runtime.managed in MANAGED_RUNTIMES:
        version = MANAGED_RUNTIMES[runtime.managed].version
    return render_launch(LaunchSpec(config, f"step {row.index + 1} '{row.name}' of a tunebench ladder", version,
                                    quality=row.quality), fmt)


def render_ladder_report(state: LadderState, *, title: str | None = None,
                         versions: dict[str, str] | None = None, costs: Mapping[int, RunCost] | None = None,
                         slo_whose: str | None = None) -> str:
    """The ladder as one HTML page (see the module docstring); with ``costs``
    (``app.cost.step_costs``), a $ per 1M output tokens column and the price it used, and a $ per
    1M good output tokens column where their good output was counted under an SLO (``slo_whose``)."""
    rows = state.rows
    first = _first_ran(rows)
    steps = []
    for row in rows:
        checks = [f"{c.feature} = {c.requested}: {feature_status_text(c.model_dump())}" for c in row.checks]
        engine = ("\u2013" if row.engine_reused is None and row.status != "completed" else
                  "reused" if row.engine_reused else f"launched ({_cell(row.startup_s)} s)")
        steps.append({
            "n": row.index + 1, "name": row.name, "note": row.note, "status": row.status, "reason": row.reason or "",
            "change": row.change, "loss": row.loss, "ran": row.ran,
            "out": _cell(row.output_tok_per_s) + (f" \u00b1 {_cell(row.output_ci_tok_per_s)}"
                                                  if row.output_ci_tok_per_s is not None else ""),
            "f_base": factor_text(row.factor_baseline) if row.index != first else "baseline",
            "f_prev": factor_text(row.factor_previous),
            "total": _cell(row.total_tok_per_s), "t_base": factor_text(row.total_factor_baseline) if row.index != first
            else "baseline", "t_prev": factor_text(row.total_factor_previous),
            "ttft": f"{_cell(row.ttft_ms)} ({row.ttft_label})" if row.ttft_ms is not None else "\u2013",
            "itl": f"{_cell(row.itl_ms)} ({row.itl_label})" if row.itl_ms is not None else "\u2013",
            "limit": limit_text(row), "ceiling": (f"{_cell(row.ceiling_tok_per_s)} tok/s at a batch of "
                                                  f"{_cell(row.ceiling_batch)}" if row.ceiling_tok_per_s else ""),
            "ceiling_note": row.ceiling_note or "", "hit": _cell(None if row.prefix_cache_hit_rate is None
                                                                 else 100 * row.prefix_cache_hit_rate),
            "engine": engine, "verification": row.verification, "checks": checks,
            "reference": (f"{_cell(row.reference_tok_per_s)} tok/s ({row.reference_label})"
                          if row.reference_tok_per_s is not None else ""),
            "runs": ", ".join(map(str, row.run_ids)),
            "cost": _cost_cell((costs or {}).get(row.index)),
            "good_cost": _good_cell((costs or {}).get(row.index)),
            "changes": [{"label": c.label, "setting": c.setting, "before": _shown(c.before), "after": _shown(c.after)}
                        for c in row.changes],
        })
    final = state.final_row
    script = ""
    if final is not None:
        try:
            script = launch_script(final, "bash", state.engine_version)
        except UserError as exc:
            script = f"# not exported: {exc}"
    versions = dict(versions or {})
    versions.setdefault("tunebench", _tunebench_version())
    return templates().get_template("ladder_report.html.j2").render(
        title=title or f"tunebench acceleration ladder: {state.name}",
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        started=datetime.fromtimestamp(state.started_wall_s, UTC).strftime("%Y-%m-%d %H:%M UTC"),
        state=state, steps=steps, staircase=_uri(staircase_svg(rows)), priced=costs is not None,
        price_note=_price_note(costs or {}), good_slo=good_slo_of((costs or {}).values()),
        slo_whose=slo_whose or step_slo_whose(),
        hardware=_hardware_text(state.hardware), versions=versions, final=final, script=script)


def _cost_cell(cost: RunCost | None) -> str:
    if cost is None:
        return "\u2013"
    return usd_text(cost.output.usd) if cost.output.usd is not None else f"n/a ({cost.reason})"


def _good_cell(cost: RunCost | None) -> str:
    if cost is None or cost.good_output is None:
        return "\u2013"
    good = cost.good_output
    return usd_text(good.usd) if good.usd is not None else f"n/a ({good.reason})"


def _price_note(costs: Mapping[int, RunCost]) -> str:
    """What the cost column was priced at: ``1 core x 0.05 $/core-h (default price, as of 2026-12)``."""
    return "; ".join(dict.fromkeys(c.price_text() for c in costs.values() if c.price is not None))


def _tunebench_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tunebench")
    except PackageNotFoundError:
        return "unknown"
