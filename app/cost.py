"""Capacity and cost from measured runs: what a million tokens cost at a measured throughput, and
how many replicas, GPUs and dollars a given traffic needs at an SLO.

Everything here is arithmetic on what a stored run measured; nothing is modelled. The formulas,
where prices come from and the extrapolation rule are in ``docs/capacity.md``. Prices are a
shipped table of typical list prices (``assets/prices.toml``, dated) that the user overrides;
every figure carries which of the two it used, because a cost from a default price is an
estimate, not a quote.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
from pydantic import ValidationError

from app.analysis.compare import Comparison
from app.analysis.summary import RequestArrays, level_summary_figures, numbers
from app.config import RunConfig
from app.errors import UserError
from app.money import check_price, short_text
from app.recording import run_columns
from app.slo import Slo, SloError, parse_slo
from app.tuner.slo import MAX_ERROR_FRACTION, METRIC_NAMES, Verdict, bound_text, judge
from app.tuner.space import Percentile
from db.errors import StoreError
from db.records import LevelInfo, RunDetail
from engine_adapters.config import Features
from engine_adapters.cpu_binding import OMP_BIND_ENV, parse_cpu_list
from engine_adapters.gpu_specs import find_gpu_spec
from engine_adapters.runtimes import is_cpu_build

if TYPE_CHECKING:
    from app.events import RunStarted
    from app.ladder.state import LadderState
    from app.store import RunStore
    from app.tuner.state import TuneState

TOKENS_PER_MILLION = 1_000_000
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86_400
HOURS_PER_DAY = 24
DAYS_PER_MONTH = 30
"""A month, for the monthly figures: 30 days, stated wherever the figure is shown."""
CPU_PRICE_KEYS = ("cpu", "cpu_core")
"""``--price`` names of the per-core-hour price (CPU runs)."""
PRICES_ASSET = "prices.toml"
PERCENTILES: tuple[str, ...] = get_args(Percentile)
DEFAULT_HEADROOM = 0.3

Unit = Literal["GPU", "core"]


# --- prices ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Price:
    """The price one figure was computed with, and where it came from."""

    key: str
    """The price list's or the user's name for it ("H100", "cpu")."""
    usd_per_hour: float
    """Per GPU-hour, or per core-hour for a CPU run."""
    unit: Unit
    yours: bool
    as_of: str
    """The default table's date (kept for yours too: it dates the table that was overridden)."""
    from_profile: bool = False
    """From the run's profile (``[prices]``), not from the command or the window."""

    @property
    def source(self) -> str:
        if self.from_profile:
            return "the run's profile price"
        return "your price" if self.yours else f"default price, as of {self.as_of}"

    def text(self) -> str:
        return f"{self.usd_per_hour:,.2f} $/{self.unit}-h ({self.source})"


def parse_price(text: str) -> tuple[str, float]:
    """``'H100=2.49'`` -> ``('H100', 2.49)``; ``'cpu=0.05'`` is the per-core-hour price."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep:
        raise UserError(f"--price {short_text(text)}: expected NAME=USD_PER_HOUR, e.g. --price 'H100=2.49' "
                        "(or 'cpu=0.05' per core-hour)")
    if not name:
        raise UserError(f"--price {short_text(text)}: the GPU name before '=' is empty (e.g. --price 'H100=2.49')")
    return name, check_price(value, f"--price {short_text(name)}")


def _words(name: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", name.lower()))


def price_key_matches(key: str, gpu_name: str) -> bool:
    """Whether a price-list key names this GPU: every word of the key is a word of the name
    ("A100 80GB" and "NVIDIA A100-SXM4-80GB"), or both are the same card in the spec table
    (``engine_adapters.gpu_specs``: "H100 SXM" and "NVIDIA H100 80GB HBM3"). The words rule is
    there because the spec table lists only the cards the planner knows (no A10G) and resolves a
    family ("H100") to one variant, while a price is usually quoted per family."""
    words = _words(key)
    if words and words <= _words(gpu_name):
        return True
    spec = find_gpu_spec(key)
    return spec is not None and spec == find_gpu_spec(gpu_name)


@dataclass(frozen=True)
class PriceTable:
    """The default prices with the user's on top (``with_prices``)."""

    gpu_hour_usd: Mapping[str, float]
    cpu_core_hour_usd: float | None
    as_of: str
    source: str
    your_gpu_hour_usd: Mapping[str, float] = field(default_factory=dict)
    your_cpu_core_hour_usd: float | None = None
    profile_gpu_hour_usd: Mapping[str, float] = field(default_factory=dict)
    """The run's profile prices (``[prices]``): under yours, over the defaults (``for_run``)."""
    profile_cpu_core_hour_usd: float | None = None

    def for_run(self, run: RunDetail) -> PriceTable:
        """This table with the prices the run's profile recorded (``RunConfig.prices``) between
        yours and the defaults; a stored price that is not one is refused in one line."""
        stored = (run.config or {}).get("prices") or {}
        if not isinstance(stored, Mapping):
            raise UserError(f"run {run.id} records its prices as {short_text(str(stored))}, not a table")
        gpus: dict[str, float] = {}
        cpu = None
        for name, value in stored.items():
            usd = check_price(value, f"run {run.id}: the price of {short_text(str(name))} in its profile")
            if str(name).lower() in CPU_PRICE_KEYS:
                cpu = usd
            else:
                gpus[str(name)] = usd
        return replace(self, profile_gpu_hour_usd=gpus, profile_cpu_core_hour_usd=cpu)

    def with_prices(self, texts: Iterable[str]) -> PriceTable:
        """This table with ``--price NAME=USD`` entries (the last of a name wins)."""
        gpus = dict(self.your_gpu_hour_usd)
        cpu = self.your_cpu_core_hour_usd
        for text in texts:
            name, usd = parse_price(text)
            if name.lower() in CPU_PRICE_KEYS:
                cpu = usd
            else:
                gpus[name] = usd
        return replace(self, your_gpu_hour_usd=gpus, your_cpu_core_hour_usd=cpu)

    def gpu(self, gpu_name: str) -> Price:
        """The price of one hour of this GPU: yours before the default; of several keys that
        match, the most specific (most words)."""
        layers = ((self.your_gpu_hour_usd, True, False), (self.profile_gpu_hour_usd, True, True),
                  (self.gpu_hour_usd, False, False))
        for table, yours, from_profile in layers:
            keys = [k for k in table if price_key_matches(k, gpu_name)]
            if keys:
                key = max(keys, key=lambda k: len(_words(k)))
                return Price(key, table[key], "GPU", yours, self.as_of, from_profile)
        example = re.sub(r"^nvidia\s+", "", gpu_name.strip(), flags=re.IGNORECASE) or "NAME"
        raise UserError(f"no price for the GPU '{gpu_name}' (it is not in the default price list): pass "
                        f"--price 'NAME=USD_PER_HOUR', e.g. --price '{example}=2.00'")

    def cpu(self) -> Price:
        """The price of one core-hour (a logical CPU, as clouds sell vCPUs)."""
        if self.your_cpu_core_hour_usd is not None:
            return Price("cpu", self.your_cpu_core_hour_usd, "core", True, self.as_of)
        if self.profile_cpu_core_hour_usd is not None:
            return Price("cpu", self.profile_cpu_core_hour_usd, "core", True, self.as_of, True)
        if self.cpu_core_hour_usd is None:
            raise UserError("no per-core price: pass --price 'cpu=USD_PER_CORE_HOUR', e.g. --price 'cpu=0.05'")
        return Price("cpu", self.cpu_core_hour_usd, "core", False, self.as_of)

    def unused(self, used: Price | None) -> list[str]:
        """Your prices that priced nothing (a typo in a name shows up here)."""
        names = [k for k in self.your_gpu_hour_usd
                 if used is None or not (used.yours and not used.from_profile and used.key == k)]
        if self.your_cpu_core_hour_usd is not None and (used is None or used.unit != "core" or used.from_profile):
            names.append("cpu")
        return names


def _price_table(data: Mapping[str, Any], where: str) -> PriceTable:
    as_of, source = data.get("as_of"), data.get("source")
    gpus, cpu = data.get("gpu_hour_usd"), data.get("cpu")
    if not isinstance(as_of, str) or not isinstance(source, str) or not isinstance(gpus, Mapping) \
            or not isinstance(cpu, Mapping):
        raise UserError(f"{where}: needs as_of, source, [gpu_hour_usd] and [cpu]")
    return PriceTable({str(k): check_price(v, f"{where}: gpu_hour_usd.{k}") for k, v in gpus.items()},
                      check_price(cpu.get("core_hour_usd"), f"{where}: cpu.core_hour_usd"), as_of, source)


@lru_cache(maxsize=1)
def default_prices() -> PriceTable:
    """The shipped price list (``assets/prices.toml``)."""
    where = f"the shipped price list assets/{PRICES_ASSET}"
    try:
        data = tomllib.loads((resources.files("assets") / PRICES_ASSET).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{where} cannot be read: {exc}") from None
    return _price_table(data, where)


def price_table(prices: Iterable[str] = ()) -> PriceTable:
    """The default prices with ``--price NAME=USD`` entries on top."""
    return default_prices().with_prices(prices)


# --- cost figures ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostFigure:
    """A cost in USD, or None and why it could not be computed."""

    usd: float | None
    reason: str | None = None


def usd_per_million_tokens(units: float, usd_per_unit_hour: float, tok_per_s: float | None) -> CostFigure:
    """What a million tokens cost on ``units`` GPUs (or cores) producing ``tok_per_s`` together:
    ``units * usd_per_unit_hour / (tok_per_s * 3600) * 1e6``."""
    if tok_per_s is None or not math.isfinite(tok_per_s):
        return CostFigure(None, "no throughput was measured")
    if tok_per_s <= 0:
        return CostFigure(None, "the measured throughput is zero")
    if not units > 0 or not (math.isfinite(usd_per_unit_hour) and usd_per_unit_hour > 0):
        return CostFigure(None, "no GPUs or cores, or no price")
    return CostFigure(units * usd_per_unit_hour / (tok_per_s * SECONDS_PER_HOUR) * TOKENS_PER_MILLION)


def good_output_tok_per_s(goodput_rps: float | None, output_tok_per_s: float | None,
                          requests_per_s: float | None) -> float | None:
    """Output tokens per second of the requests that met the SLO: goodput (req/s) x the mean
    output tokens of a completed request (the level records no goodput token rate, so good
    requests are taken to be as long as the average completed one)."""
    if goodput_rps is None or output_tok_per_s is None or not requests_per_s or requests_per_s <= 0:
        return None
    return goodput_rps * output_tok_per_s / requests_per_s


def _ceil(x: float) -> int:
    """Round up, ignoring float noise (50 users x 1.1 = 55.00000000000001 is 55 replicas, not 56)."""
    return math.ceil(round(x, 9))


def check_headroom(headroom: float) -> float:
    if not (math.isfinite(headroom) and 0 <= headroom <= 10):
        raise UserError(f"the headroom must be a fraction from 0 to 10 (0.3 = 30% spare), got {headroom:g}")
    return headroom


def replicas_for_users(users: int, users_per_replica: float, headroom: float) -> int:
    """``ceil(users * (1 + headroom) / users_per_replica)``."""
    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise UserError(f"the number of users must be a whole number of at least 1, got {users}")
    if not users_per_replica > 0:
        raise ValueError(f"users per replica must be positive, got {users_per_replica}")
    return _ceil(users * (1 + check_headroom(headroom)) / users_per_replica)


def replicas_for_tokens_per_day(tokens_per_day: float, output_tok_per_s_per_replica: float, headroom: float) -> int:
    """``ceil(tokens_per_day / 86400 * (1 + headroom) / output_tok_per_s_per_replica)``."""
    if not (math.isfinite(tokens_per_day) and tokens_per_day > 0):
        raise UserError(f"the output tokens per day must be a number above 0, got {tokens_per_day:g}")
    if not output_tok_per_s_per_replica > 0:
        raise ValueError(f"output tok/s per replica must be positive, got {output_tok_per_s_per_replica}")
    return _ceil(tokens_per_day / SECONDS_PER_DAY * (1 + check_headroom(headroom)) / output_tok_per_s_per_replica)


def nodes_for(gpus: int, gpus_per_node: int | None) -> int | None:
    """``ceil(gpus / gpus_per_node)``; None when the GPUs per node are not known."""
    return _ceil(gpus / gpus_per_node) if gpus_per_node and gpus_per_node > 0 else None


@dataclass(frozen=True)
class RunningCost:
    """What ``units`` GPUs (or cores) cost to keep running."""

    unit_hours_per_day: float
    usd_per_day: float
    usd_per_month: float
    """30 days (``DAYS_PER_MONTH``)."""


def running_cost(units: float, usd_per_unit_hour: float) -> RunningCost:
    hours = units * HOURS_PER_DAY
    per_day = hours * usd_per_unit_hour
    return RunningCost(hours, per_day, per_day * DAYS_PER_MONTH)


# --- what a run used ------------------------------------------------------------------------------

def run_config(run: RunDetail) -> RunConfig:
    """The configuration a stored run was measured with; a run imported from another tool has
    none, so nothing says how many GPUs it used; a stored one that no longer validates (a price
    edited by hand) names its first bad value."""
    problem = "it records no engine configuration (GPUs, parallelism)"
    try:
        if run.config:
            return RunConfig.model_validate(run.config)
    except ValidationError as exc:
        if not run.imported:
            first = exc.errors()[0]
            problem = f"{'.'.join(str(p) for p in first['loc']) or 'its top level'}: {first['msg']}"
    where = f"was imported from {run.imported_from or 'another tool'}" if run.imported else \
        "has no valid stored configuration"
    raise UserError(f"run {run.id} {where}: {problem}, so its capacity and cost cannot be counted")


@dataclass(frozen=True)
class Deployment:
    """What one measured configuration runs on: a replica's GPUs (TP x PP) or cores, and how
    many replicas (data parallel) the measurement drove together."""

    kind: Literal["gpu", "cpu"]
    device: str
    """The GPU's name as the run recorded it, or the CPU model."""
    units_per_replica: float
    data_parallel: int
    units_per_node: int | None
    """GPUs per machine, where the run's hardware lists them (None for a CPU run)."""
    counted: str
    """How the GPUs or cores were counted, in words."""
    notes: tuple[str, ...] = ()

    @property
    def unit(self) -> Unit:
        return "GPU" if self.kind == "gpu" else "core"

    @property
    def units_measured(self) -> float:
        """GPUs (or cores) the measured throughput came from: every replica's."""
        return self.units_per_replica * self.data_parallel


def _engine_cores(run: RunDetail, runtime_env: Mapping[str, str]) -> tuple[int, str]:
    """The cores a CPU engine ran on. Most honest first: the cores its compute threads were bound
    to (``VLLM_CPU_OMP_THREADS_BIND`` in the engine's recorded environment, which tunebench sets
    for a managed CPU engine, leaving the load client's core out); else the machine's logical
    CPUs, since unbound threads may use them all."""
    for env in (run.env, runtime_env):
        bind = env.get(OMP_BIND_ENV) if isinstance(env, Mapping) else None
        cores = parse_cpu_list(bind) if isinstance(bind, str) else None
        if cores:
            return len(cores), f"the cores the engine's threads were bound to, {OMP_BIND_ENV}={bind}"
    logical = run.hardware.get("cpu_count_logical")
    if isinstance(logical, int) and not isinstance(logical, bool) and logical > 0:
        return logical, "the machine's logical CPUs: the engine's threads were not bound, so it may use them all"
    raise UserError(f"run {run.id} records neither the cores its engine was bound to nor the machine's CPU "
                    "count: its cost cannot be counted")


def _recorded_gpus(run: RunDetail, gpu: str | None, missing: str) -> list[str]:
    """The GPU names the run recorded; ``--gpu`` only for a run that records none (which then
    needs it: ``missing`` says so)."""
    listed = [str(g["name"]) for g in run.hardware.get("gpus") or [] if isinstance(g, Mapping) and g.get("name")]
    if listed and gpu:
        raise UserError(f"run {run.id} recorded its GPUs ({listed[0]}): --gpu is only for a run that names none")
    if not listed and not gpu:
        raise UserError(f"run {run.id} {missing}")
    return listed


def imported_deployment(run: RunDetail, gpu: str | None, gpus_per_replica: int) -> Deployment:
    """What an imported run ran on, as the user says (``--gpus-per-replica``, ``--gpu`` where
    its record names no GPU): the other tool recorded no engine configuration to count from."""
    if isinstance(gpus_per_replica, bool) or not isinstance(gpus_per_replica, int) or gpus_per_replica < 1:
        raise UserError(f"--gpus-per-replica must be a whole number of at least 1, got {gpus_per_replica!r}")
    listed = _recorded_gpus(run, gpu, f"was imported from {run.imported_from or 'another tool'} and records no "
                                      "GPU: pass --gpu NAME too, the card it ran on")
    plural = "s" if gpus_per_replica > 1 else ""
    return Deployment("gpu", listed[0] if listed else str(gpu), gpus_per_replica, 1, len(listed) or None,
                      f"{gpus_per_replica} GPU{plural} per replica, as you said (--gpus-per-replica): the run was "
                      f"imported from {run.imported_from or 'another tool'}, which records no parallelism",
                      ("one replica measured: the imported run says nothing of data parallelism",))


def run_deployment(run: RunDetail, gpu: str | None = None, gpus_per_replica: int | None = None) -> Deployment:
    """The GPUs (``Features.gpu_count`` = TP x PP x DP) or cores a stored run used. ``gpu`` names
    the card for a run whose record lists none (an engine measured over the network);
    ``gpus_per_replica`` says what an imported run, which records no parallelism, ran on."""
    if gpus_per_replica is not None:
        if not run.imported:
            raise UserError(f"run {run.id} records its own parallelism: --gpus-per-replica is only for an "
                            "imported run")
        return imported_deployment(run, gpu, gpus_per_replica)
    config = run_config(run)  # an imported run has none: refused, saying so
    features: Features = config.features
    dp = features.data_parallel_size
    if is_cpu_build(config.engine.runtime, run.engine_version):
        if gpu:
            raise UserError(f"run {run.id} ran on a CPU engine: --gpu does not apply")
        cores, counted = _engine_cores(run, config.engine.runtime.env)
        return Deployment("cpu", str(run.hardware.get("cpu_model") or "CPU"), cores / dp, dp, None,
                          counted + (f", {dp} data-parallel replicas" if dp > 1 else ""))
    listed = _recorded_gpus(run, gpu, "records no GPU (an engine on another machine?): pass --gpu NAME, the card "
                                      "it ran on")
    notes: list[str] = []
    used = listed[:features.gpu_count]
    if len(set(used)) > 1:
        notes.append(f"the machine has several GPU models ({', '.join(sorted(set(used)))}): priced as {used[0]}")
    counted = (f"TP {features.tensor_parallel_size} x PP {features.pipeline_parallel_size} = "
               f"{features.gpus_per_replica} GPU{'s' if features.gpus_per_replica > 1 else ''} per replica"
               + (f", {dp} data-parallel replicas measured together" if dp > 1 else ""))
    return Deployment("gpu", listed[0] if listed else str(gpu), features.gpus_per_replica, dp,
                      len(listed) or None, counted, tuple(notes))


# --- the measured levels --------------------------------------------------------------------------

@dataclass(frozen=True)
class LevelPoint:
    """One measured load level: how many requests it kept in flight and its figures."""

    idx: int
    label: str
    concurrency: float | None
    """Requests in flight over every replica: the closed loop's concurrency, or for an open loop
    request rate x mean E2E (Little's law); None when the level recorded neither."""
    concurrency_from: str
    figures: Mapping[str, float]
    """Catalogue keys (``output_tok_per_s``, ``ttft_ms_p99``...): the store's figures."""
    goodput_slo: str | None
    """The SLO the run counted goodput under (its own, not necessarily the one asked now)."""


def _level_figures(run: RunDetail, level: LevelInfo | None, idx: int, several: bool) -> dict[str, float]:
    stored = numbers(run.metrics)
    prefix = f"L{idx}."
    figures = {k[len(prefix):]: v for k, v in stored.items() if k.startswith(prefix)}
    if not figures and not several:
        figures = {k: v for k, v in stored.items() if not re.match(r"L\d+\.", k)}
    for key, value in level_summary_figures(level.summary if level else None).items():
        figures.setdefault(key, value)  # the store's figures first: those Compare and the reports show
    return figures


def _concurrency(params: Mapping[str, Any], figures: Mapping[str, float]) -> tuple[float | None, str]:
    conc = params.get("concurrency")
    if params.get("mode", "closed") == "closed" and isinstance(conc, int) and not isinstance(conc, bool) and conc > 0:
        return float(conc), "closed loop"
    rps, e2e_ms = figures.get("requests_per_s"), figures.get("e2e_ms_mean")
    if rps and e2e_ms and rps > 0 and e2e_ms > 0:
        return rps * e2e_ms / 1000.0, "open loop: request rate x mean E2E"
    return None, ""


def _imported_levels(run: RunDetail) -> list[LevelPoint]:
    """An imported run's levels (a GuideLLM benchmark each, or the one a ``vllm bench serve`` file
    holds): the tool's own load settings are not this tool's, so the requests in flight are
    counted by Little's law from what was measured, and the run has no SLO of its own."""
    levels: list[LevelInfo | None] = list(run.levels) or [None]
    out = []
    for lv in levels:
        idx = lv.idx if lv is not None else 0
        figures = _level_figures(run, lv, idx, len(levels) > 1)
        conc, how = _concurrency({"mode": "imported"}, figures)
        out.append(LevelPoint(idx, (lv.label if lv is not None else "") or "the imported benchmark", conc,
                              how.replace("open loop", "imported"), figures, None))
    return out


def run_levels(run: RunDetail) -> list[LevelPoint]:
    """The run's levels with their figures; a run that recorded no level row (a single closed
    loop) is one level at its configured concurrency."""
    if run.imported:
        return _imported_levels(run)
    load = run_config(run).load
    run_slo = load.slo
    if not run.levels:
        params: dict[str, Any] = {"mode": "closed", "concurrency": load.concurrency} if load.pattern == "closed" else {}
        figures = _level_figures(run, None, 0, several=False)
        conc, how = _concurrency(params, figures)
        return [LevelPoint(0, f"concurrency {load.concurrency}" if params else "level 0", conc, how, figures,
                           run_slo)]
    out = []
    several = len(run.levels) > 1
    for lv in run.levels:
        figures = _level_figures(run, lv, lv.idx, several)
        conc, how = _concurrency(lv.params, figures)
        slo = (lv.summary or {}).get("slo")
        out.append(LevelPoint(lv.idx, lv.label or f"level {lv.idx}", conc, how, figures,
                              slo if isinstance(slo, str) else run_slo))
    return out


@dataclass(frozen=True)
class JudgedLevel:
    level: LevelPoint
    verdict: Verdict


def _worst_ratio(j: JudgedLevel) -> float:
    return max(j.verdict.ratios.values(), default=math.inf)


# --- capacity -------------------------------------------------------------------------------------

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


def slo_text(slo: str, percentile: str) -> str:
    """``'ttft_ms<=500'`` as "TTFT p99 <= 500 ms", with the error budget the verdict applies."""
    bounds = ", ".join(f"{METRIC_NAMES.get(m, m)} {percentile} {op} {limit:g} ms" for m, op, limit in parse_slo(slo))
    return f"{bounds}, at most {MAX_ERROR_FRACTION:.0%} of requests failed"


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


RECOUNTABLE = ("ttft_ms", "tpot_ms", "e2e_ms")
"""SLO metrics a stored request carries (queueing is kept only in the level's summary)."""


@dataclass(frozen=True)
class GoodCount:
    """A level's requests that met an SLO, counted one by one from the stored requests."""

    requests: int
    output_tokens: int
    output_tok_per_s: float


def _good_mask(requests: RequestArrays, bounds: list[Slo]) -> np.ndarray | None:
    """Which stored requests completed and met every bound, by the runner's goodput rule
    (``app.load.metrics.meets_slo``: TPOT = (E2E - TTFT) / (output tokens - 1), 0 for a one-token
    output); None when a bound is on a figure the stored requests lack (queueing)."""
    if any(metric not in RECOUNTABLE for metric, _op, _limit in bounds):
        return None
    out = requests.output_tokens.astype(float)
    ttft, e2e = requests.ttft_ms.astype(float), requests.e2e_ms.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), 0.0)
    values = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}
    good = requests.ok.astype(bool)
    for metric, op, limit in bounds:
        v = values[metric]
        with np.errstate(invalid="ignore"):
            good &= (v <= limit) if op == "<=" else (v < limit)  # NaN (no value) meets nothing
    return good


def recount_good(requests: RequestArrays, idx: int, bounds: list[Slo], duration_s: float | None) -> GoodCount | None:
    """The requests of level ``idx`` that completed and met every bound (``_good_mask``), and
    their output tokens per second of the level; None when a bound is on a figure the stored
    requests lack, or the level has no duration or no stored request."""
    mask = _good_mask(requests, bounds)
    if mask is None or not duration_s or duration_s <= 0:
        return None
    in_level = requests.level == idx
    if not in_level.any():
        return None
    good = mask & in_level
    tokens = int(np.nansum(requests.output_tokens.astype(float)[good]))
    return GoodCount(int(good.sum()), tokens, tokens / duration_s)


def good_tokens(requests: RequestArrays, bounds: list[Slo], level: int | None = None) -> tuple[float, float] | None:
    """Output tokens of the completed requests that met every bound, and of all completed ones
    (of one level, or of the whole run); None where a bound is on queueing (not stored per request)."""
    mask = _good_mask(requests, bounds)
    if mask is None:
        return None
    ok = requests.ok.astype(bool)
    if level is not None:
        ok &= requests.level == level
    out = requests.output_tokens.astype(float)
    return float(np.nansum(out[mask & ok])), float(np.nansum(out[ok]))


def no_share_reason(bounds: list[Slo]) -> str:
    """Why no good-output share could be counted under ``bounds``."""
    if any(metric not in RECOUNTABLE for metric, _op, _limit in bounds):
        return "queue_ms is not stored per request, so good output cannot be re-counted under this SLO"
    return "no completed request is stored"


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


# --- cost of compared runs ------------------------------------------------------------------------

@dataclass(frozen=True)
class RunCost:
    """What a million tokens cost at one compared run's measured throughput (the figure Compare
    shows for it), or why that cannot be said: a compare shows every run, priced or not."""

    run_id: int
    output: CostFigure
    total: CostFigure
    price: Price | None = None
    units: float | None = None
    """GPUs (or cores) the measured throughput came from."""
    unit: Unit | None = None
    device: str | None = None
    note: str | None = None
    """Why the figure deserves caution (its throughput is flagged unreliable)."""
    good_output: CostFigure | None = None
    """$ per 1M output tokens of the requests that met ``good_slo`` (None: no SLO was asked)."""
    good_slo: str | None = None

    @property
    def reason(self) -> str | None:
        """Why there is no $ per 1M output tokens (None: there is one)."""
        return self.output.reason if self.output.usd is None else None

    def price_text(self, with_source: bool = True) -> str:
        """``4 GPUs x 2.49 $/GPU-h (default price, as of 2026-12)``; without the source where the
        table says it once."""
        if self.price is None or self.units is None:
            return "-"
        count = f"{self.units:g} {self.unit}{'s' if self.units != 1 else ''}"
        price = self.price.text() if with_source else f"{self.price.usd_per_hour:,.2f} $/{self.unit}-h"
        return f"{count} x {price}"

    def to_dict(self) -> dict[str, Any]:
        """The ``cost`` object of a run in ``compare --json`` (None where not known)."""
        return {"usd_per_1m_output_tokens": self.output.usd, "usd_per_1m_total_tokens": self.total.usd,
                "price_usd_per_hour": None if self.price is None else self.price.usd_per_hour,
                "price_source": None if self.price is None else self.price.source,
                "units": self.units, "unit": self.unit, "reason": self.reason, "note": self.note,
                "usd_per_1m_good_output_tokens": None if self.good_output is None else self.good_output.usd,
                "good_output_reason": None if self.good_output is None else self.good_output.reason,
                "good_slo": self.good_slo}


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


def _no_cost_reason(exc: UserError) -> str:
    """The one line ``run_deployment`` or the price list refused with, in a compare's words
    (compare has no ``--gpu``: a GPU-less run stays unpriced there)."""
    text = str(exc)
    if "records no GPU" in text:
        return "the run records no GPU (an engine on another machine?)"
    return re.sub(r"^run \d+ ", "the run ", text)


def run_cost(run: RunDetail, prices: PriceTable, output_tok_per_s: float | None,
             total_tok_per_s: float | None, *, unreliable: str | None = None) -> RunCost:
    """$ per 1M output and total tokens of ``run`` at the given throughput (GPUs measured x price
    / tokens per hour, ``usd_per_million_tokens``); never raises for a run that cannot be priced
    (imported, no GPU recorded, a GPU without a price): the figures say why instead."""
    try:
        deployment = run_deployment(run)
        own = prices.for_run(run)
        price = own.gpu(deployment.device) if deployment.kind == "gpu" else own.cpu()
    except UserError as exc:
        why = CostFigure(None, _no_cost_reason(exc))
        return RunCost(run.id, why, why)
    units = deployment.units_measured
    note = f"from a throughput flagged unreliable: {unreliable}" if unreliable else None
    return RunCost(run.id, usd_per_million_tokens(units, price.usd_per_hour, output_tok_per_s),
                   usd_per_million_tokens(units, price.usd_per_hour, total_tok_per_s), price, units,
                   deployment.unit, deployment.device, note)


def started_run(started: RunStarted) -> RunDetail:
    """The run ``started`` announces, as the recorder will store it (``app.recording.run_columns``):
    a running run's cost is counted from the same configuration, hardware and environment as the
    stored run's, so the two can only differ by the throughput they are priced at."""
    return RunDetail(id=0, uid=started.run_id, status="running", started_at=started.started_wall_s,
                     **run_columns(started))


def live_cost_basis(started: RunStarted, prices: PriceTable) -> RunCost:
    """What a running run is priced on: its GPUs (or cores) and their price, from its
    ``RunStarted`` (no throughput yet: ``live_cost`` adds it); why not, where it cannot be priced."""
    return run_cost(started_run(started), prices, None, None)


def live_cost(basis: RunCost, output_tok_per_s: float | None) -> CostFigure:
    """$ per 1M output tokens at a live output throughput on ``basis`` (``live_cost_basis``)."""
    if basis.price is None or basis.units is None:
        return CostFigure(None, basis.output.reason)
    return usd_per_million_tokens(basis.units, basis.price.usd_per_hour, output_tok_per_s)


def with_good_output(cost: RunCost, tokens: tuple[float, float] | None, slo: str, bounds: list[Slo]) -> RunCost:
    """``cost`` with its $ per 1M good output tokens under ``slo``: the cost per output token
    over the share of output tokens (``good_tokens``: good, all) that met the SLO, so that it can
    never disagree with the cost beside it."""
    if cost.output.usd is None:
        figure = CostFigure(None, cost.output.reason)
    elif tokens is None or tokens[1] <= 0:
        figure = CostFigure(None, no_share_reason(bounds))
    elif tokens[0] <= 0:
        figure = CostFigure(None, "no request met the SLO")
    else:
        figure = CostFigure(cost.output.usd * tokens[1] / tokens[0])
    return replace(cost, good_output=figure, good_slo=slo)


def trial_costs(store: RunStore, state: TuneState, prices: PriceTable) -> dict[int, RunCost]:
    """Each measured trial with a stored run: $ per 1M output and total tokens at the trial's
    throughput, and per 1M good output tokens under the tune's SLO (its requests re-counted one
    by one). A trial whose run was deleted is left out."""
    try:
        bounds = parse_slo(state.slo) if state.slo else []
    except SloError:
        bounds = []
    out: dict[int, RunCost] = {}
    for t in state.trials:
        if not t.measured or t.run_id is None or t.status in ("pending", "running"):
            continue
        try:
            run = store.get_run(t.run_id)
            requests = store.requests(t.run_id) if bounds else None
        except StoreError:
            continue
        cost = run_cost(run, prices, t.figures.get("output_tok_per_s"), t.figures.get("total_tok_per_s"))
        if bounds and requests is not None:
            level = run.levels[0].idx if run.levels else None
            cost = with_good_output(cost, good_tokens(requests, bounds, level), state.slo, bounds)
        out[t.index] = cost
    return out


def step_costs(store: RunStore, state: LadderState, prices: PriceTable, slo: str | None = None) -> dict[int, RunCost]:
    """Each ladder step that ran: $ per 1M tokens at the step's throughput (the staircase's
    figure, a repeated step's mean), priced on the GPUs (or cores) of its stored run; and per 1M
    good output tokens under ``slo`` (default: the SLO every step was measured under, the
    profile's ``load.slo``), the share pooled over a repeated step's runs, as its throughput is."""
    rows = [r for r in state.rows if r.run_ids and r.output_tok_per_s is not None]
    runs = {r.index: store.get_run(r.run_ids[0]) for r in rows}
    good_slo, _whose = comparison_slo(runs.values(), slo)
    bounds = parse_slo(good_slo) if good_slo is not None else []
    out: dict[int, RunCost] = {}
    for r in rows:
        cost = run_cost(runs[r.index], prices, r.output_tok_per_s, r.total_tok_per_s)
        if good_slo is not None:
            cost = with_good_output(cost, pooled_good_tokens(store, r.run_ids, bounds), good_slo, bounds)
        out[r.index] = cost
    return out


def good_slo_of(costs: Iterable[RunCost]) -> str | None:
    """The SLO that costs' good output was counted under (``step_costs``), None when none was."""
    return next((c.good_slo for c in costs if c.good_slo), None)


def comparison_costs(runs: Iterable[RunDetail], output_tok_per_s: Iterable[float | None],
                     total_tok_per_s: Iterable[float | None], prices: PriceTable,
                     unreliable: Iterable[str | None] | None = None) -> list[RunCost]:
    """``run_cost`` of each compared run at the throughput the comparison shows for its column
    (a repeat set's mean), so the cost cannot disagree with the table above it."""
    runs, outs, totals = list(runs), list(output_tok_per_s), list(total_tok_per_s)
    flags = list(unreliable) if unreliable is not None else [None] * len(runs)
    return [run_cost(r, prices, o, t, unreliable=u) for r, o, t, u in zip(runs, outs, totals, flags, strict=True)]


def compared_costs(comparison: Comparison, prices: PriceTable) -> list[RunCost]:
    """``comparison_costs`` of every column of a compare: each at the output and total tok/s the
    comparison shows for it, flagged where the comparison flags that throughput."""
    k = len(comparison.runs)

    def row(key: str) -> tuple[list[float | None], list[str | None]]:
        m = comparison.metric(key)
        return (list(m.values), list(m.unreliable)) if m is not None else ([None] * k, [None] * k)

    (output, flags), (total, _flags) = row("output_tok_per_s"), row("total_tok_per_s")
    return comparison_costs(comparison.runs, output, total, prices, flags)


YOUR_SLO = "your SLO"
"""Whose SLO good output was counted under when the user gave one (``--slo``)."""


def step_slo_whose(asked: str | None = None) -> str:
    """Whose SLO a ladder's good output is counted under (``step_costs``): the one asked, else
    the one its steps were measured under."""
    return YOUR_SLO if asked else "the steps' SLO"


def comparison_slo(runs: Iterable[RunDetail], asked: str | None) -> tuple[str | None, str]:
    """The SLO a compare prices good output under, and whose it is: the one asked (``--slo``),
    else the one every compared run was measured under (``load.slo``); (None, why) when neither,
    since good output under different SLOs is no comparison."""
    if asked:
        try:
            parse_slo(asked)
        except SloError as exc:
            raise UserError(f"--slo: {exc}") from None
        return asked, YOUR_SLO
    own = set()
    for run in runs:
        try:
            own.add(run_config(run).load.slo)
        except UserError:
            own.add(None)
    if len(own) == 1 and (slo := own.pop()):
        return slo, "the runs' SLO"
    return None, ("the runs were measured under different SLOs or none" if len(own) > 1
                  else "the runs were measured without an SLO")


def compared_good_costs(store: RunStore, comparison: Comparison, costs: list[RunCost], slo: str) -> list[RunCost]:
    """``costs`` (``compared_costs``) with each column's $ per 1M good output tokens under ``slo``:
    the share of output that met it is pooled over the column's runs (a repeat set's members),
    as the column's throughput is."""
    bounds = parse_slo(slo)
    return [with_good_output(cost, pooled_good_tokens(store, members, bounds), slo, bounds)
            for cost, members in zip(costs, comparison.members, strict=True)]


def pooled_good_tokens(store: RunStore, run_ids: Iterable[int], bounds: list[Slo]) -> tuple[float, float] | None:
    """``good_tokens`` (good, all) summed over runs measured as one (a repeat set, a repeated
    step); None when any of them cannot be counted under ``bounds``."""
    counted = [good_tokens(store.requests(run_id), bounds) for run_id in run_ids]
    if not counted or any(c is None for c in counted):
        return None
    return sum(c[0] for c in counted if c), sum(c[1] for c in counted if c)


def priced_at_goodput(store: RunStore, comparison: Comparison, costs: list[RunCost],
                      asked: str | None = None) -> tuple[list[RunCost], str]:
    """``costs`` with their good-output cost under ``asked`` or the runs' shared SLO
    (``comparison_slo``), and the sentence that says whose SLO it was, or why there is none."""
    slo, whose = comparison_slo(comparison.runs, asked)
    if slo is None:
        return costs, f"No good-output cost: {whose}."
    return compared_good_costs(store, comparison, costs, slo), f"Good output: the requests that met {whose} '{slo}'."


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


def cost_factor(base: RunCost, other: RunCost) -> float | None:
    """Baseline cost / this cost per 1M output tokens: above 1, this run is cheaper."""
    if base.output.usd is None or other.output.usd is None or other.output.usd <= 0:
        return None
    return base.output.usd / other.output.usd


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


def unused_prices(prices: PriceTable, costs: Iterable[RunCost]) -> list[str]:
    """Your ``--price`` names that priced none of the runs (a typo shows up here)."""
    used = [c.price for c in costs if c.price is not None and c.price.yours and not c.price.from_profile]
    names = [k for k in prices.your_gpu_hour_usd if not any(p.unit == "GPU" and p.key == k for p in used)]
    if prices.your_cpu_core_hour_usd is not None and not any(p.unit == "core" for p in used):
        names.append("cpu")
    return names


def throughput_per_unit_factor(base: RunCost, other: RunCost, base_tok_per_s: float | None,
                               other_tok_per_s: float | None) -> float | None:
    """Output tok/s per GPU (or core) of ``other`` over the baseline's: the throughput factor a
    price applies to, fair across runs on different numbers of GPUs."""
    if not (base.units and other.units and base_tok_per_s and other_tok_per_s) or base_tok_per_s <= 0:
        return None
    return (other_tok_per_s / other.units) / (base_tok_per_s / base.units)


def before_after_cost_text(change: str, base: RunCost, other: RunCost, base_tok_per_s: float | None,
                           other_tok_per_s: float | None) -> str:
    """The before/after line in money: ``prefix caching off -> on: 2.4x the throughput per GPU,
    $1.84 -> $0.77 per 1M output tokens (default price, as of 2026-12)``; or why there is no cost."""
    missing = [c for c in (base, other) if c.output.usd is None]
    if missing:
        return f"{change}: cost n/a (" + "; ".join(f"#{c.run_id}: {c.output.reason}" for c in missing) + ")"
    per_unit = throughput_per_unit_factor(base, other, base_tok_per_s, other_tok_per_s)
    units = base.unit if base.unit == other.unit else "GPU or core"
    throughput = f"{per_unit:.1f}x the throughput per {units}, " if per_unit is not None else ""
    return (f"{change}: {throughput}{usd_text(base.output.usd)} \u2192 {usd_text(other.output.usd)} per 1M output "
            f"tokens ({sources_text((base, other))})")
