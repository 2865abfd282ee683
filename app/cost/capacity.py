"""The answer of ``tunebench capacity``: the replicas, GPUs (or cores), nodes and cost a traffic
needs at an SLO, sized on the highest-concurrency level of a run that met it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, get_args

from app.analysis.summary import RequestArrays
from app.cost.arithmetic import (
    DAYS_PER_MONTH,
    SECONDS_PER_DAY,
    CostFigure,
    RunningCost,
    check_headroom,
    good_output_tok_per_s,
    nodes_for,
    replicas_for_tokens_per_day,
    replicas_for_users,
    running_cost,
    usd_per_million_tokens,
)
from app.cost.deployment import Deployment, LevelPoint, run_deployment, run_levels
from app.cost.goodput import recount_good
from app.cost.prices import Price, PriceTable
from app.errors import UserError
from app.slo import Slo, SloError, parse_slo
from app.tuner.slo import MAX_ERROR_FRACTION, Verdict, bound_text, judge
from app.tuner.space import Percentile
from db.records import RunDetail

PERCENTILES: tuple[str, ...] = get_args(Percentile)
DEFAULT_HEADROOM = 0.3


@dataclass(frozen=True)
class JudgedLevel:
    level: LevelPoint
    verdict: Verdict


def _worst_ratio(j: JudgedLevel) -> float:
    return max(j.verdict.ratios.values(), default=math.inf)


@dataclass
class CapacityPlan:
    """The answer of ``tunebench capacity``: the level it is sized on and the figures, or why
    there is none (``unreachable``)."""

    run_id: int
    run_name: str
    slo: str
    percentile: str
    headroom: float
    deployment: Deployment
    levels: list[JudgedLevel]
    users: int | None = None
    tokens_per_day: float | None = None
    unreachable: str | None = None
    sized_on: JudgedLevel | None = None
    price: Price | None = None
    users_per_replica: float | None = None
    output_tok_per_s_per_replica: float | None = None
    replicas_for_users: int | None = None
    replicas_for_tokens: int | None = None
    replicas: int | None = None
    units: float | None = None
    """GPUs (or cores) of every replica."""
    nodes: int | None = None
    running: RunningCost | None = None
    usd_per_million_output: CostFigure | None = None
    usd_per_million_total: CostFigure | None = None
    usd_per_million_good_output: CostFigure | None = None
    good_output_slo: str | None = None
    """Whose SLO the good tokens met: "your SLO" or the run's."""
    extrapolated: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The same figures as the text, for ``--json`` (no NaN or infinity)."""
        def level(j: JudgedLevel) -> dict[str, Any]:
            lv = j.level
            return {"idx": lv.idx, "label": lv.label, "concurrency": lv.concurrency,
                    "concurrency_from": lv.concurrency_from, "meets_slo": j.verdict.meets, "reason": j.verdict.reason,
                    "output_tok_per_s": lv.figures.get("output_tok_per_s"),
                    "total_tok_per_s": lv.figures.get("total_tok_per_s"),
                    "slo_values": {k: v for k, v in j.verdict.values.items() if math.isfinite(v)}}

        out: dict[str, Any] = {
            "run": {"id": self.run_id, "name": self.run_name}, "slo": self.slo, "percentile": self.percentile,
            "max_error_fraction": MAX_ERROR_FRACTION, "headroom": self.headroom, "users": self.users,
            "tokens_per_day": self.tokens_per_day, "reachable": self.unreachable is None,
            "unreachable": self.unreachable,
            "deployment": {**asdict(self.deployment), "unit": self.deployment.unit, "notes": list(self.deployment.notes)},
            "levels": [level(j) for j in self.levels],
            "sized_on": None if self.sized_on is None else level(self.sized_on),
            "price": None if self.price is None else {**asdict(self.price), "source": self.price.source},
        }
        for name in ("users_per_replica", "output_tok_per_s_per_replica", "replicas_for_users", "replicas_for_tokens",
                     "replicas", "units", "nodes", "good_output_slo", "extrapolated", "notes"):
            out[name] = getattr(self, name)
        out["running"] = None if self.running is None else {**asdict(self.running), "days_per_month": DAYS_PER_MONTH}
        source = None if self.price is None else self.price.source  # every cost says whose price it used
        if out["running"] is not None:
            out["running"]["price_source"] = source
        for name in ("usd_per_million_output", "usd_per_million_total", "usd_per_million_good_output"):
            figure = getattr(self, name)
            out[name] = None if figure is None else {**asdict(figure), "price_source": source}
        return out


def _unreachable(judged: list[JudgedLevel], bounds: list[Slo], percentile: str) -> str:
    """Why no level met the SLO, naming the level that came closest and its binding bound."""
    candidates = [j for j in judged if j.verdict.ratios]
    if not candidates:
        reason = judged[0].verdict.reason if judged else "the run has no measured level"
        return f"not reachable with this configuration ({reason})"
    best = min(candidates, key=_worst_ratio)
    v, limits = best.verdict, {metric: (op, limit) for metric, op, limit in bounds}
    if v.worst in v.values and v.ratios[v.worst] >= 1:
        op, limit = limits[v.worst]
        at = f" at {bound_text(v.worst, percentile, v.values[v.worst], limit, op)}"
    else:
        at = f": {v.reason}"
    return f"not reachable with this configuration (best level: {best.level.label}{at})"


def plan_capacity(run: RunDetail, slo: str, prices: PriceTable, *, users: int | None = None,
                  tokens_per_day: float | None = None, headroom: float = DEFAULT_HEADROOM,
                  percentile: str = "p99", gpu: str | None = None, gpus_per_replica: int | None = None,
                  requests: RequestArrays | None = None) -> CapacityPlan:
    """Replicas, GPUs (or cores), nodes and cost for ``users`` concurrent users and/or
    ``tokens_per_day`` output tokens, sized on the highest-concurrency level of ``run`` that met
    ``slo`` at ``percentile`` (``app.tuner.slo.judge``: each bound on that percentile, and the
    error budget); with the run's stored ``requests``, the good-output cost is re-counted under
    ``slo`` request by request."""
    try:
        bounds = parse_slo(slo)
    except SloError as exc:
        raise UserError(f"--slo: {exc}") from None
    if percentile not in PERCENTILES:
        raise UserError(f"the SLO percentile must be one of {', '.join(PERCENTILES)}, got {percentile!r}")
    if users is None and tokens_per_day is None:
        raise UserError("say what to size for: --users N (concurrent users) and/or --tokens-per-day T")
    if users is not None and (isinstance(users, bool) or users < 1):
        raise UserError(f"the number of users must be a whole number of at least 1, got {users}")
    if tokens_per_day is not None and not (math.isfinite(tokens_per_day) and tokens_per_day > 0):
        raise UserError(f"the output tokens per day must be a number above 0, got {tokens_per_day:g}")
    check_headroom(headroom)
    try:
        deployment = run_deployment(run, gpu, gpus_per_replica)
    except UserError as exc:
        if run.imported and gpus_per_replica is None:
            raise UserError(f"{exc}: say what it ran on with --gpus-per-replica N (and --gpu NAME where its "
                            "record names no GPU)") from None
        raise
    prices = prices.for_run(run)
    judged = [JudgedLevel(lv, judge(lv.figures, bounds, percentile)) for lv in run_levels(run)]
    plan = CapacityPlan(run.id, run.name, slo, percentile, headroom, deployment, judged, users, tokens_per_day,
                        notes=list(deployment.notes))
    if run.status != "completed":
        plan.notes.append(f"the run is {run.status}: its levels may be incomplete")
    meeting = [j for j in judged if j.verdict.meets]
    if not meeting:
        plan.unreachable = _unreachable(judged, bounds, percentile)
        return plan
    sized = max(meeting, key=lambda j: (j.level.concurrency or -1.0, j.level.figures.get("output_tok_per_s", 0.0)))
    if users is not None and sized.level.concurrency is None:
        raise UserError(f"run {run.id}: the levels that met the SLO recorded no concurrency, so users per replica "
                        "are unknown (size with --tokens-per-day)")
    plan.sized_on = sized
    level, dp = sized.level, deployment.data_parallel
    price = prices.gpu(deployment.device) if deployment.kind == "gpu" else prices.cpu()
    plan.price = price
    if unused := prices.unused(price):
        plan.notes.append(f"--price for {', '.join(unused)} priced nothing: the run's "
                          f"{'GPU is ' + deployment.device if deployment.kind == 'gpu' else 'engine ran on CPU cores'}")
    output_tok_per_s = level.figures.get("output_tok_per_s")
    measured = f"level {level.idx}, {level.label}"
    replicas: list[int] = []
    if users is not None:
        assert level.concurrency is not None
        plan.users_per_replica = level.concurrency / dp
        plan.replicas_for_users = replicas_for_users(users, plan.users_per_replica, headroom)
        replicas.append(plan.replicas_for_users)
        if users > level.concurrency:
            plan.notes.append(f"extrapolation from concurrency {level.concurrency:g} ({measured}): {users:,} users "
                              "exceed what was measured at the SLO; the answer scales that level linearly in replicas")
            plan.extrapolated = True
    if tokens_per_day is not None:
        if not output_tok_per_s or output_tok_per_s <= 0:
            raise UserError(f"run {run.id}: {measured} met the SLO but measured no output throughput: cannot size "
                            "for tokens per day")
        plan.output_tok_per_s_per_replica = output_tok_per_s / dp
        plan.replicas_for_tokens = replicas_for_tokens_per_day(tokens_per_day, plan.output_tok_per_s_per_replica,
                                                               headroom)
        replicas.append(plan.replicas_for_tokens)
        if tokens_per_day / SECONDS_PER_DAY > output_tok_per_s:
            plan.notes.append(f"extrapolation from {output_tok_per_s:,.1f} output tok/s ({measured}): "
                              f"{tokens_per_day / SECONDS_PER_DAY:,.1f} tok/s exceed what was measured at the SLO; "
                              "the answer scales that level linearly in replicas")
            plan.extrapolated = True
    plan.replicas = max(replicas)
    if plan.replicas > dp and not plan.extrapolated:
        plan.notes.append(f"{plan.replicas} replicas from the {dp} measured together ({measured}): the headroom "
                          "takes the answer past the measurement, linear in replicas")
    plan.units = plan.replicas * deployment.units_per_replica
    plan.nodes = nodes_for(math.ceil(plan.units), deployment.units_per_node) if deployment.kind == "gpu" else None
    plan.running = running_cost(plan.units, price.usd_per_hour)
    units, usd = deployment.units_measured, price.usd_per_hour
    plan.usd_per_million_output = usd_per_million_tokens(units, usd, output_tok_per_s)
    plan.usd_per_million_total = usd_per_million_tokens(units, usd, level.figures.get("total_tok_per_s"))
    plan.usd_per_million_good_output, plan.good_output_slo = _good_cost(level, bounds, units, usd, requests)
    return plan


def _good_cost(level: LevelPoint, bounds: list[Slo], units: float, usd_per_unit_hour: float,
               requests: RequestArrays | None = None) -> tuple[CostFigure, str | None]:
    """$ per 1M output tokens of the requests that met the SLO: re-counted request by request
    under the SLO asked now when the stored requests allow it, else as the run counted them
    under the SLO it was given."""
    recount = recount_good(requests, level.idx, bounds, level.figures.get("duration_s")) \
        if requests is not None else None
    if recount is not None:
        whose = "your SLO, re-counted per request"
        figure = usd_per_million_tokens(units, usd_per_unit_hour, recount.output_tok_per_s)
        if figure.usd is None:
            return CostFigure(None, "no request met your SLO"), whose
        return figure, whose
    good = good_output_tok_per_s(level.figures.get("goodput_rps"), level.figures.get("output_tok_per_s"),
                                 level.figures.get("requests_per_s"))
    if good is None or level.goodput_slo is None:
        return CostFigure(None, "the run counted no goodput: it ran without an SLO (load.slo)"), None
    try:
        same = sorted(parse_slo(level.goodput_slo)) == sorted(bounds)
    except SloError:
        same = False
    whose = "your SLO" if same else f"the run's SLO '{level.goodput_slo}'"
    figure = usd_per_million_tokens(units, usd_per_unit_hour, good)
    if figure.usd is None:
        return CostFigure(None, f"no request met {whose}"), whose
    return figure, whose
