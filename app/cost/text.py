"""Cost and capacity in words: dollars, counts, the capacity answer and the cost table as the CLI,
the GUI and the reports show them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from app.analysis.compare import Comparison
from app.cost.arithmetic import DAYS_PER_MONTH, CostFigure
from app.cost.capacity import CapacityPlan, JudgedLevel
from app.cost.runs import RunCost, cost_factor, throughput_per_unit_factor
from app.slo import parse_slo
from app.tuner.slo import MAX_ERROR_FRACTION, METRIC_NAMES


def slo_text(slo: str, percentile: str) -> str:
    """``'ttft_ms<=500'`` as "TTFT p99 <= 500 ms", with the error budget the verdict applies."""
    bounds = ", ".join(f"{METRIC_NAMES.get(m, m)} {percentile} {op} {limit:g} ms" for m, op, limit in parse_slo(slo))
    return f"{bounds}, at most {MAX_ERROR_FRACTION:.0%} of requests failed"


def _cost_text(figure: CostFigure | None) -> str:
    if figure is None:
        return "-"
    return usd_text(figure.usd) if figure.usd is not None else f"- ({figure.reason})"


def _level_line(j: JudgedLevel) -> str:
    lv = j.level
    tok = lv.figures.get("output_tok_per_s")
    measured = (f"{number_text(lv.concurrency)} in flight" if lv.concurrency is not None else "concurrency not recorded") + (
        f", {tok:,.1f} output tok/s" if tok is not None else "")
    return f"level {lv.idx} ({lv.label}): {measured}: " + ("meets the SLO" if j.verdict.meets else
                                                           f"misses it ({j.verdict.reason})")


def capacity_text(plan: CapacityPlan) -> str:
    """The capacity answer as ``tunebench capacity`` prints it and the Capacity boxes show it."""
    d = plan.deployment
    lines = [f"capacity of run {plan.run_id} ({plan.run_name}) at the SLO: {slo_text(plan.slo, plan.percentile)}"]
    lines += [f"  {_level_line(j)}" for j in plan.levels]
    if plan.unreachable is not None:
        lines.append(f"  {plan.unreachable}")
        lines += [f"  note: {n}" for n in plan.notes]
        return "\n".join(lines)
    assert plan.sized_on is not None and plan.price is not None and plan.replicas is not None
    assert plan.units is not None and plan.running is not None
    lv = plan.sized_on.level
    unit = d.unit
    lines.append(f"  sized on level {lv.idx} ({lv.label}), the highest concurrency that met the SLO")
    lines.append(f"  replica: {count_text(d.units_per_replica, unit)} of {d.device} ({d.counted})")
    lines.append(f"  price: {plan.price.text()}")
    per_replica = []
    if plan.users_per_replica is not None:
        per_replica.append(f"{number_text(plan.users_per_replica)} concurrent users")
    if plan.output_tok_per_s_per_replica is not None:
        per_replica.append(f"{plan.output_tok_per_s_per_replica:,.1f} output tok/s")
    if per_replica:
        lines.append(f"  one replica at the SLO: {', '.join(per_replica)}")
    headroom = f"with {plan.headroom:.0%} headroom"
    if plan.replicas_for_users is not None:
        lines.append(f"  for {plan.users:,} concurrent users {headroom}: {count_text(plan.replicas_for_users, 'replica')}")
    if plan.replicas_for_tokens is not None and plan.tokens_per_day is not None:
        lines.append(f"  for {plan.tokens_per_day:,.0f} output tokens a day {headroom}: "
                     f"{count_text(plan.replicas_for_tokens, 'replica')}")
    nodes = (f" on {count_text(plan.nodes, 'node')} of {d.units_per_node} GPUs" if plan.nodes is not None
             and d.units_per_node is not None else "")
    lines.append(f"  answer: {count_text(plan.replicas, 'replica')} = {count_text(plan.units, unit)}{nodes}")
    source = plan.price.source
    lines.append(f"  running ({source}): {number_text(plan.running.unit_hours_per_day)} {unit}-hours a day = "
                 f"{usd_text(plan.running.usd_per_day)} a day, {usd_text(plan.running.usd_per_month)} a month "
                 f"({DAYS_PER_MONTH} days)")
    good = f"; good output ({plan.good_output_slo}): " if plan.good_output_slo else "; good output: "
    lines.append(f"  per 1M tokens at level {lv.idx} ({source}): output {_cost_text(plan.usd_per_million_output)}; "
                 f"total {_cost_text(plan.usd_per_million_total)}{good}{_cost_text(plan.usd_per_million_good_output)}")
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def usd_text(usd: float | None) -> str:
    """``$1,234.56``, ``$0.77``; under ten cents, three significant figures so that a CPU run's
    cost keeps its ratio (``$0.0114``, ``$0.0120``, ``$0.00420``), never $0.00; ``-`` when unknown."""
    if usd is None:
        return "-"
    if usd >= 0.1:
        return f"${usd:,.2f}"
    if usd <= 0:
        return f"${usd:.2f}"
    decimals = 2 - math.floor(math.log10(usd))
    if f"{usd:.{decimals}f}".startswith("0.1"):  # 0.09996 rounds up to 0.100: say $0.10
        return "$0.10"
    return f"${usd:.{decimals}f}"


def number_text(value: float) -> str:
    """A count as a whole number when it is one (``12``), else to two decimals (``2.50``)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def count_text(value: float, noun: str) -> str:
    """``1 GPU``, ``3 replicas``, ``2.50 cores``."""
    return f"{number_text(value)} {noun}{'' if value == 1 else 's'}"


COST_COLUMNS = ("run", "$ / 1M output tok", "vs baseline", "$ / 1M total tok", "$ / 1M good output tok", "priced at")
"""The columns of a compare's cost table, in the window and the HTML report (``cost_rows``)."""


def figure_text(figure: CostFigure | None) -> str:
    """A cost cell: ``$0.77``, ``n/a: why``, or a dash where the figure was not asked for."""
    if figure is None:
        return "\u2013"
    return usd_text(figure.usd) if figure.usd is not None else f"n/a: {figure.reason}"


def cost_rows(comparison: Comparison, costs: Sequence[RunCost]) -> list[list[str]]:
    """The cost table's cells (``COST_COLUMNS``), lower being better."""
    base = costs[comparison.baseline]
    rows = []
    for i, (label, cost) in enumerate(zip(comparison.labels(), costs, strict=True)):
        factor = "baseline" if i == comparison.baseline else cost_factor_text(base, cost)
        rows.append([label, figure_text(cost.output), factor, usd_text(cost.total.usd), figure_text(cost.good_output),
                     cost.price_text(with_source=False)])
    return rows


def cost_factor_text(base: RunCost, other: RunCost) -> str:
    """The change in cost as a person says it, lower being better: ``x3.1 cheaper``, ``x1.4 more
    expensive``, ``about the same cost`` (within 5%); empty when either cost is unknown."""
    factor = cost_factor(base, other)
    if factor is None:
        return ""
    if f"{factor:.1f}" == "1.0" and f"{1 / factor:.1f}" == "1.0":
        return "about the same cost"
    return f"x{factor:.1f} cheaper" if factor > 1 else f"x{1 / factor:.1f} more expensive"


def sources_text(costs: Iterable[RunCost]) -> str:
    """Whose prices the figures used: ``default price, as of 2026-12`` or both, in order."""
    return " / ".join(dict.fromkeys(c.price.source for c in costs if c.price is not None))


def before_after_cost_text(change: str, base: RunCost, other: RunCost, base_tok_per_s: float | None,
                           other_tok_per_s: float | None, quality: str = "") -> str:
    """The before/after line in money: ``prefix caching off -> on: 2.4x the throughput per GPU,
    $1.84 -> $0.77 per 1M output tokens (default price, as of 2026-12)``; or why there is no cost.
    ``quality`` (``quality kept 99.6%``, ``app.quality.text``) goes beside the price."""
    missing = [c for c in (base, other) if c.output.usd is None]
    if missing:
        return f"{change}: cost n/a (" + "; ".join(f"#{c.run_id}: {c.output.reason}" for c in missing) + ")"
    per_unit = throughput_per_unit_factor(base, other, base_tok_per_s, other_tok_per_s)
    units = base.unit if base.unit == other.unit else "GPU or core"
    throughput = f"{per_unit:.1f}x the throughput per {units}, " if per_unit is not None else ""
    return (f"{change}: {throughput}{usd_text(base.output.usd)} \u2192 {usd_text(other.output.usd)} per 1M output "
            f"tokens ({sources_text((base, other))})" + (f", {quality}" if quality else ""))
