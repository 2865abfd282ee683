"""One trial against the SLO: each bound of ``'ttft_ms<=500,tpot_ms<=50'`` applied to the trial's
percentile of that metric (p99 by default: "TTFT p99 <= 500 ms"), plus an error budget.

The grammar is ``app.slo``'s (one definition). Goodput per request (``LevelSummary.goodput_rps``)
counts the requests that met every bound; a tune judges a whole load level by its percentile, the
way an SLO is stated to customers, and names the bound that failed first ("TTFT p99 hit 612 ms,
limit 500 ms").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.slo import Slo, parse_run_slo

METRIC_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E", "queue_ms": "Queue"}
MAX_ERROR_FRACTION = 0.01
"""A level where more requests than this failed does not meet the SLO, whatever its latencies."""


@dataclass
class Verdict:
    """Whether a trial met the SLO; per bound, its value and value / limit."""

    meets: bool
    values: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    worst: str | None = None
    """The bound closest to (or furthest past) its limit: the binding one."""
    reason: str | None = None
    """Why it failed, in words; None when it met the SLO."""


def bound_text(metric: str, percentile: str, value: float | None, limit: float, op: str = "<=") -> str:
    name = f"{METRIC_NAMES.get(metric, metric)} {percentile}"
    shown = "-" if value is None else f"{value:,.1f} ms"
    return f"{name} {shown} (limit {op} {limit:g} ms)"


def judge(figures: Mapping[str, float], slo: str | list[Slo], percentile: str = "p99",
          max_error_fraction: float = MAX_ERROR_FRACTION) -> Verdict:
    """The verdict on one measured load level (its catalogue figures) under the SLO's per-request
    bounds (a tune's quality bounds judge the configuration, not a load level)."""
    bounds = parse_run_slo(slo).requests if isinstance(slo, str) else slo  # quality bounds: app.quality.bounds
    verdict = Verdict(meets=True)
    failures: list[str] = []
    total = figures.get("requests_total") or 0.0
    failed = figures.get("requests_failed") or 0.0
    if total <= 0:
        return Verdict(meets=False, reason="no request was measured")
    if failed / total > max_error_fraction:
        failures.append(f"{failed:,.0f} of {total:,.0f} requests failed")
    for metric, op, limit in bounds:
        value = figures.get(f"{metric}_{percentile}")
        if value is None or not math.isfinite(value):
            failures.append(f"no {METRIC_NAMES.get(metric, metric)} {percentile} measured")
            verdict.ratios[metric] = math.inf
            continue
        verdict.values[metric] = value
        verdict.ratios[metric] = value / limit if limit > 0 else math.inf
        ok = value <= limit if op == "<=" else value < limit
        if not ok:
            failures.append(f"{METRIC_NAMES.get(metric, metric)} {percentile} hit {value:,.1f} ms (limit {op} "
                            f"{limit:g} ms)")
    if verdict.ratios:
        verdict.worst = max(verdict.ratios, key=lambda k: verdict.ratios[k])
    if failures:
        verdict.meets, verdict.reason = False, "; ".join(failures)
    return verdict


def per_gpu(figures: Mapping[str, float], gpus: int) -> float | None:
    """Output tok/s per GPU (per device: on a CPU engine, per host)."""
    value = figures.get("output_tok_per_s")
    return None if value is None else value / max(1, gpus)


def per_user(figures: Mapping[str, float]) -> float | None:
    """Output tok/s each user sees: 1000 / mean TPOT (ms)."""
    tpot = figures.get("tpot_ms_mean")
    return 1000.0 / tpot if tpot and tpot > 0 and math.isfinite(tpot) else None
