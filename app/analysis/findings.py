"""Findings: every run explained from what it measured. Tuning is a loop (measure, understand,
change one thing, measure again); this is the "understand" step, as a senior engineer reads a
run: the engine's counters (KV-cache use, the waiting queue, preemptions, prefix hits,
speculative acceptance, the batch it ran), the client's timings and the proof of the load it
delivered, and the planner's ceiling.

:func:`explain` is a pure function of a stored run (:class:`RunEvidence`, what the store gives
back) and of a reference run, so every old run can be explained too. Each rule is a small
function in one registry (:data:`RULES`); each names the engine counters it reads, so which
engines support it is derived from the adapters' metric tables (:func:`supported_engines`), never
listed by hand. The explanations are in the seeds' terms: decode is memory-bound, and every
feature attacks bytes moved, idle compute or KV-cache memory.

A rule that has no evidence says nothing: a healthy run raises no warning, and :func:`explain`
says so in one finding (``no_warning``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ValidationError

from app.analysis.compare import flatten, run_metrics
from app.analysis.metric_catalog import unreliable_figures
from app.analysis.summary import level_summary_figures
from app.config import RunConfig
from db.records import RunDetail, SeriesBlock
from engine_adapters.config import GGUF_WEIGHT_BITS, GGUF_WEIGHTS_ENGINE
from engine_adapters.hardware import HardwareInfo

if TYPE_CHECKING:
    from app.planner.live import LimitFigures
    from engine_adapters.base import MetricNames

Severity = Literal["info", "warning"]
Confidence = Literal["low", "medium", "high"]
ENGINE_SOURCE = "engine"
"""The stored series of the engine's /metrics (``app.telemetry``)."""

# --- thresholds (each the line between "fine" and "worth a change") ------------------------------
KV_FULL_PCT = 90.0
"""KV-cache use at or above this is full: a new sequence needs blocks another must give back."""
MIN_SHARE_OF_LEVEL = 0.10
"""A condition must hold for this share of a level's engine samples to count (one spike is noise)."""
PREFIX_EXPECTED_MIN = 0.20
"""The workload must be able to reuse at least this share of its prompt tokens..."""
PREFIX_HIT_LOW = 0.05
"""...for a hit rate below this to be a finding."""
PREFIX_BLOCK_TOKENS = 16
"""vLLM's default KV block on a GPU: a shared prefix shorter than one block is never hit."""
CPU_PREFIX_BLOCK_TOKENS = 128
"""vLLM's CPU build's default KV block (its attention kernels want multiples of 32)."""
SPEC_ACCEPTANCE_LOW = 0.5
"""Below half the drafted tokens accepted, verifying drafts costs about what it returns."""
SPEC_ACCEPTANCE_OFF = 0.3
"""Below this, speculation is best switched off on this workload."""
QUEUE_SHARE_OF_TTFT = 0.5
QUEUE_MIN_MS = 50.0
"""TTFT is dominated by queueing when the engine's queue time is half of it and at least this long."""
PREFILL_SHARE_OF_E2E = 0.5
LONG_PROMPT_TOKENS = 1024
DECODE_SHARE_OF_E2E = 0.8
SMALL_BATCH = 8.0
FAR_BELOW_CEILING = 0.30
NEAR_CEILING = 0.70
MATERIAL_CHANGE = 0.10
"""A figure moved when it changed by a tenth (of itself, or of the 0-1 range for a rate)."""


class Evidence(BaseModel):
    """One figure a finding rests on, with its unit and where in the run it shows."""

    figure: str
    value: float
    unit: str = ""
    window: str = ""

    def text(self) -> str:
        unit = f" {self.unit}" if self.unit and self.unit != "%" else self.unit
        shown = f"{self.value:,.0f}" if abs(self.value) >= 1000 else f"{self.value:,.3g}"
        return f"{self.figure} {shown}{unit}" + (f" ({self.window})" if self.window else "")


class Finding(BaseModel):
    """What a rule saw in a run, why it matters, and the one change to try next (profile keys ->
    values, already checked to make a valid configuration; None when no change is known to help)."""

    rule: str
    severity: Severity
    evidence: list[Evidence]
    explanation: str
    confidence: Confidence
    suggestion: dict[str, Any] | None = None


# --- what a rule reads ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunEvidence:
    """A stored run as the findings read it: its record, its telemetry and, where the planner
    could plan it, each level's measured rate against the ceiling (``app.planner.stored``)."""

    run: RunDetail
    series: Mapping[str, SeriesBlock] = field(default_factory=dict)
    limits: Mapping[int, LimitFigures] = field(default_factory=dict)
    no_limit: str | None = None


class RunSource(Protocol):
    """What :func:`load_run` needs of a store (``app.store.RunStore``)."""

    def get_run(self, ref: int | str) -> RunDetail: ...

    def samples(self, ref: int | str) -> dict[str, SeriesBlock]: ...


LimitsOf = Callable[[RunDetail], tuple[Mapping[int, "LimitFigures"], str | None]]
"""A run -> its levels against the ceiling and why none (the faces pass
``app.planner.stored.level_limits``)."""


def load_run(store: RunSource, ref: int | str, limits_of: LimitsOf | None = None) -> RunEvidence:
    """A stored run and its telemetry (and its ceiling, with ``limits_of``), ready for :func:`explain`."""
    run = store.get_run(ref)
    limits, why = limits_of(run) if limits_of is not None else ({}, None)
    return RunEvidence(run, store.samples(run.id), limits, why)


@dataclass(frozen=True)
class Level:
    """One load level: its figures (catalogue keys), its summary and its place in the run."""

    idx: int
    label: str
    figures: dict[str, float]
    summary: Mapping[str, Any]
    start_wall: float | None
    end_wall: float | None
    window: str


@dataclass
class Context:
    """What every rule gets: the run, its levels, its parsed configuration (None for an import or
    an older configuration), the findings so far and the reference run's context."""

    evidence: RunEvidence
    levels: list[Level]
    figures: dict[str, float]
    config: RunConfig | None
    found: list[Finding] = field(default_factory=list)
    reference: Context | None = None

    @property
    def run(self) -> RunDetail:
        return self.evidence.run

    @property
    def on_gpu(self) -> bool:
        return bool(self.run.hardware.get("gpus"))

    @property
    def holds_fp8_kv_cache(self) -> bool:
        """Whether the run's machine can keep a vLLM KV cache in FP8 (llama.cpp runs q8_0 for it
        anywhere; a run stored without its hardware: assumed so)."""
        if not self.run.hardware or _feature(self, "engine.kind") == GGUF_WEIGHTS_ENGINE:
            return True
        try:
            hardware = HardwareInfo.model_validate(self.run.hardware)
        except ValidationError:
            return True
        return hardware.holds_fp8_kv_cache(cpu_engine=not self.on_gpu)

    def engine(self, level: Level, *names: str) -> list[np.ndarray]:
        """The engine's samples of ``names`` inside the level (rows aligned: one scrape per row;
        NaN where a value was not exposed). Empty arrays when the engine series is absent."""
        block = self.evidence.series.get(ENGINE_SOURCE)
        if block is None or block.t_wall.size == 0:
            return [np.empty(0) for _ in names]
        inside = np.ones(block.t_wall.size, dtype=bool)
        if level.start_wall is not None:
            inside &= block.t_wall >= level.start_wall
        if level.end_wall is not None:
            inside &= block.t_wall <= level.end_wall
        return [block.column(n)[inside] if n in block.names else np.full(int(inside.sum()), np.nan) for n in names]

    def suggest(self, changes: Mapping[str, Any]) -> dict[str, Any] | None:
        """``changes`` when they make a valid configuration of this run (so the trial can run as it
        stands), else None."""
        if self.config is None or not changes:
            return None
        doc = self.config.model_dump(mode="json")
        for path, value in changes.items():
            node: Any = doc
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or leaf not in node:
                return None  # not a setting of this configuration
            node[leaf] = value
        try:
            RunConfig.model_validate(doc)
        except ValidationError:
            return None
        return dict(changes)


def _window(label: str, start: float | None, end: float | None, run_start: float, several: bool) -> str:
    where = f"level {label}" if several else ""
    if start is not None and end is not None:
        span = f"{start - run_start:,.1f}-{end - run_start:,.1f} s into the run"
        return f"{where}, {span}" if where else span
    return where or "whole run"


def _levels(run: RunDetail, figures: Mapping[str, float]) -> list[Level]:
    stored = sorted((lv for lv in run.levels if lv.summary), key=lambda lv: lv.idx)
    if not stored:
        return [Level(0, "", dict(figures), {}, None, None, "whole run")]
    out: list[Level] = []
    several = len(stored) > 1
    for i, lv in enumerate(stored):
        end = lv.finished_at
        if end is None:
            end = stored[i + 1].started_at if i + 1 < len(stored) else run.finished_at
        label = lv.label or str(lv.idx)
        out.append(Level(lv.idx, label, level_summary_figures(lv.summary), lv.summary or {}, lv.started_at, end,
                         _window(label, lv.started_at, end, run.started_at, several)))
    return out


def stored_config(run: RunDetail) -> RunConfig | None:
    """The configuration a stored run was measured with: as stored, or less the top-level
    sections a later tunebench dropped (a run recorded with ``ladder = None`` in its configuration);
    None for an import or one that does not validate otherwise."""
    if run.imported or not run.config:
        return None
    try:
        return RunConfig.model_validate(run.config)
    except ValidationError:
        pass
    try:
        return RunConfig.model_validate({k: v for k, v in run.config.items() if k in RunConfig.model_fields})
    except ValidationError:
        return None


def _context(evidence: RunEvidence) -> Context:
    run = evidence.run
    figures = run_metrics(run)
    return Context(evidence, _levels(run, figures), figures, stored_config(run))


# --- the registry -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """A rule: its stable name, what it detects and reads (for the docs and ``--rules``), the engine
    counters it needs (canonical names; each inner tuple: any one of them), and its check."""

    name: str
    detects: str
    reads: str
    engine_metrics: tuple[tuple[str, ...], ...]
    check: Callable[[Context], list[Finding]]
    against_reference: bool = False
    """It compares the run with a reference run (and says nothing without one)."""


RULES: dict[str, Rule] = {}


def rule(name: str, detects: str, reads: str, engine_metrics: tuple[tuple[str, ...], ...] = (), *,
         against_reference: bool = False) -> Callable[[Callable[[Context], list[Finding]]],
                                                      Callable[[Context], list[Finding]]]:
    def register(check: Callable[[Context], list[Finding]]) -> Callable[[Context], list[Finding]]:
        RULES[name] = Rule(name, detects, reads, engine_metrics, check, against_reference)
        return check
    return register


def supported_engines(rule_: Rule, engines: Mapping[str, MetricNames]) -> list[str]:
    """The engines whose metric tables map every counter the rule reads (all of them when it
    reads only the client's figures or the plan)."""
    out = []
    for kind, names in engines.items():
        known = set(names.gauges) | set(names.counters) | set(names.histograms)
        if all(any(n in known for n in group) for group in rule_.engine_metrics):
            out.append(kind)
    return out


def explain(run: RunEvidence, reference: RunEvidence | None = None) -> list[Finding]:
    """Every finding of ``run`` (against ``reference`` too, when given): warnings first. A run that
    raises no warning gets one ``no_warning`` finding saying so."""
    ctx = _context(run)
    ctx.reference = _context(reference) if reference is not None else None
    for registered in RULES.values():
        ctx.found.extend(registered.check(ctx))
    found = sorted(ctx.found, key=lambda f: f.severity != "warning")
    if not any(f.severity == "warning" for f in found):
        found.insert(0, _healthy(ctx))
    return found


def _healthy(ctx: Context) -> Finding:
    checked = sum(1 for r in RULES.values() if ctx.reference is not None or not r.against_reference)
    return Finding(rule="no_warning", severity="info", evidence=[], confidence="medium", suggestion=None,
                   explanation=f"no warning: {_which_run(ctx)} is healthy on what it measured ({checked} rules "
                               "checked; a rule without the figures it reads says nothing)")


# --- helpers ------------------------------------------------------------------------------------------

def _which_run(ctx: Context) -> str:
    """``run 12``; a run not stored yet (its findings while it runs) is ``the run so far``."""
    return f"run {ctx.run.id}" if ctx.run.id else "the run so far"


def _ev(figure: str, value: float | None, unit: str, window: str) -> list[Evidence]:
    return [] if value is None or not math.isfinite(value) else [Evidence(figure=figure, value=value, unit=unit,
                                                                           window=window)]


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _percent(fraction: float) -> str:
    """``50%``; a share under 1% with two decimals (a tiny model on a CPU: 0.19%, not 0%)."""
    return f"{100 * fraction:.0f}%" if fraction >= 0.01 else f"{100 * fraction:.2f}%"


def _merge(levels: Iterable[tuple[Level, list[Evidence]]]) -> list[Evidence]:
    return [e for _lv, evs in levels for e in evs]


def _warning(rule_name: str, hits: list[tuple[Level, list[Evidence]]], change: dict[str, Any] | None,
             explanation: str, confidence: Confidence = "high") -> list[Finding]:
    """A rule's one warning, with the evidence of every level it hit."""
    return [Finding(rule=rule_name, severity="warning", evidence=_merge(hits), confidence=confidence,
                    suggestion=change, explanation=explanation)]


def _feature(ctx: Context, path: str) -> Any:
    """A setting of the run's configuration by its profile key (None without one)."""
    return flatten(ctx.config.model_dump(mode="json")).get(path) if ctx.config is not None else None


# --- the rules --------------------------------------------------------------------------------------

@rule("kv_bound", "the KV cache is full while requests wait or are preempted: the batch is bound by KV memory",
      "engine KV-cache use and waiting requests over time, preemptions per level",
      (("kv_cache_usage_ratio",), ("requests_waiting", "preemptions")))
def kv_bound(ctx: Context) -> list[Finding]:
    hits: list[tuple[Level, list[Evidence]]] = []
    for lv in ctx.levels:
        kv, waiting = ctx.engine(lv, "kv_cache_usage_pct", "requests_waiting")
        seen = np.isfinite(kv)
        if not seen.any():
            continue
        full = seen & (kv >= KV_FULL_PCT)
        queued = full & np.isfinite(waiting) & (waiting >= 1)
        full_share, queued_share = float(full.sum()) / seen.sum(), float(queued.sum()) / seen.sum()
        preempted = lv.figures.get("preemptions") or 0.0
        if full_share >= MIN_SHARE_OF_LEVEL and (queued_share >= MIN_SHARE_OF_LEVEL or preempted > 0):
            evs = _ev("KV cache use, peak", float(np.nanmax(kv)), "%", lv.window)
            evs += _ev("time with the KV cache full", 100 * full_share, "%", lv.window)
            if waiting[np.isfinite(waiting)].size:
                evs += _ev("requests waiting, peak", float(np.nanmax(waiting)), "", lv.window)
            evs += _ev("preemptions", preempted, "", lv.window) if preempted else []
            hits.append((lv, evs))
    if not hits:
        return []
    change: dict[str, Any] | None = None
    fp8_here = ctx.holds_fp8_kv_cache
    if _feature(ctx, "features.kv_cache_dtype") == "auto" and fp8_here:
        change = ctx.suggest({"features.kv_cache_dtype": "fp8"})
    if change is None and ctx.config is not None and ctx.config.features.max_model_len:
        change = ctx.suggest({"features.max_model_len": max(16, ctx.config.features.max_model_len // 2)})
    if change is None and ctx.on_gpu and ctx.config is not None:
        utilization = ctx.config.features.gpu_memory_utilization
        if utilization is None or utilization < 0.95:
            change = ctx.suggest({"features.gpu_memory_utilization": 0.95})
        else:
            change = ctx.suggest({"features.tensor_parallel_size": 2 * ctx.config.features.tensor_parallel_size})
    return _warning("kv_bound", hits, change,
                    "The KV cache was full while requests waited or were preempted: the batch is bound by KV-cache "
                    "memory, not by compute. Each running sequence holds its context in the cache, so no more "
                    "sequences fit; decode reads the weights once per step for a batch smaller than the load "
                    "offers. More room per token helps: an FP8 KV cache (half the bytes per token), a shorter "
                    "maximum length, more memory for the cache, or more GPUs."
                    + ("" if fp8_here else " This machine cannot keep the KV cache in FP8 (vLLM's CPU build needs "
                                           "AVX-512 or AMX), so that is not the trial suggested."))


def _expected_reuse(ctx: Context, lv: Level) -> float | None:
    """The share of prompt tokens the workload could serve from a prefix cache."""
    if (trace := lv.figures.get("trace_prefix_reuse")) is not None:
        return trace
    if ctx.config is None:
        return None
    w = ctx.config.workload
    reuse = 0.0
    if w.kind == "multi_turn" and w.turns > 1:  # turn k resends the k-1 turns before it
        reuse = 1.0 - sum(1.0 / k for k in range(1, w.turns + 1)) / w.turns
    if w.shared_prefix_tokens > 0:
        reuse = max(reuse, w.shared_prefix_fraction * w.shared_prefix_tokens
                    / (w.shared_prefix_tokens + w.input_len.mean))
    return reuse


def _hit_share(lv: Level) -> tuple[float | None, str]:
    """The prefix-cache hit share: hits over queries, else (an engine that counts no queries, such
    as llama.cpp) the cached prompt tokens over the prompt tokens the client sent."""
    if (rate := lv.figures.get("prefix_cache_hit_rate")) is not None:
        return rate, "prefix-cache hit rate"
    hits, sent = _cached_tokens(lv), lv.figures.get("input_tokens_total")
    if hits is not None and sent:
        return min(1.0, hits / sent), "prompt tokens served from the prefix cache"
    return None, ""


def _engine_count(lv: Level, name: str) -> float | None:
    """An engine counter's growth over the level (its summary's ``engine`` deltas)."""
    engine = lv.summary.get("engine")
    value = engine.get(name) if isinstance(engine, Mapping) else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _cached_tokens(lv: Level) -> float | None:
    return _engine_count(lv, "prefix_cache_hits")


def _run_hit_share(ctx: Context) -> float | None:
    """The run's hit share (:func:`_hit_share` over every level: hits and prompt tokens summed)."""
    if (rate := ctx.figures.get("prefix_cache_hit_rate")) is not None:
        return rate
    hits = [_cached_tokens(lv) for lv in ctx.levels]
    sent = [lv.figures.get("input_tokens_total") for lv in ctx.levels]
    if not hits or any(h is None for h in hits) or any(s is None for s in sent):
        return None
    total = sum(s for s in sent if s is not None)
    return min(1.0, sum(h for h in hits if h is not None) / total) if total else None


def _cache_block_tokens(ctx: Context) -> int:
    """The tokens of one KV-cache block the run's engine caches by default."""
    return CPU_PREFIX_BLOCK_TOKENS if _feature(ctx, "engine.kind") == "vllm" and not ctx.on_gpu \
        else PREFIX_BLOCK_TOKENS


@rule("prefix_cold", "prefix hits near 0 though the workload shares prefixes",
      "engine prefix-cache hits (and queries) per level, the workload's shared prefix, cache mode and the feature",
      (("prefix_cache_hits",),))
def prefix_cold(ctx: Context) -> list[Finding]:
    hits: list[tuple[Level, list[Evidence]]] = []
    for lv in ctx.levels:
        expected = _expected_reuse(ctx, lv)
        share, what = _hit_share(lv)
        if expected is None or share is None or expected < PREFIX_EXPECTED_MIN or share >= PREFIX_HIT_LOW:
            continue
        hits.append((lv, _ev(what, 100 * share, "%", lv.window)
                     + _ev("prompt tokens the workload shares", 100 * expected, "%", lv.window)))
    if not hits:
        return []
    causes: list[str] = []
    change: dict[str, Any] | None = None
    confidence: Confidence = "medium"
    shared = _feature(ctx, "workload.shared_prefix_tokens")
    if _feature(ctx, "features.prefix_caching") is False:
        causes.append("prefix caching is switched off")
        change, confidence = ctx.suggest({"features.prefix_caching": True}), "high"
    elif isinstance(shared, int) and 0 < shared < (block := _cache_block_tokens(ctx)):
        causes.append(f"the shared prefix ({shared} tokens) is shorter than one cache block "
                      f"({block} tokens): only whole blocks are cached")
    if not causes and _feature(ctx, "workload.cache") == "cold":
        causes.append("each level starts cold (a fresh cache salt per level, where the engine takes one), so only "
                      "requests of the same level can share and the first of each pays in full")
    if change is None and _feature(ctx, "workload.cache") == "cold":
        change = ctx.suggest({"workload.cache": "warm"})
    if not causes:
        causes.append("the engine evicted the prefix before it was reused (a full KV cache), or does not cache it")
    return _warning("prefix_cold", hits, change,
                    "Prefix hits were near 0 though the workload shares prefixes: prefill computed again tokens it "
                    "could have read from the KV cache (idle reuse left on the table). Likely: " + "; ".join(causes)
                    + ".", confidence)


@rule("spec_low_acceptance", "low speculative acceptance: drafting costs more than it returns",
      "engine draft and accepted-token counters per level (acceptance rate, acceptance length)",
      (("spec_decode_accepted_tokens",), ("spec_decode_draft_tokens", "spec_decode_drafts")))
def spec_low_acceptance(ctx: Context) -> list[Finding]:
    hits: list[tuple[Level, list[Evidence]]] = []
    rates: list[float] = []
    for lv in ctx.levels:
        rate, length = lv.figures.get("spec_acceptance_rate"), lv.figures.get("spec_mean_acceptance_length")
        if rate is not None and rate < SPEC_ACCEPTANCE_LOW:
            rates.append(rate)
            hits.append((lv, _ev("draft acceptance rate", 100 * rate, "%", lv.window)
                         + _ev("tokens per verification step", length, "tokens", lv.window)
                         + _ev("tokens drafted", _engine_count(lv, "spec_decode_draft_tokens"), "tokens", lv.window)
                         + _ev("drafted tokens accepted", _engine_count(lv, "spec_decode_accepted_tokens"), "tokens",
                               lv.window)))
    if not hits:
        return []
    tokens = _feature(ctx, "features.speculative.num_speculative_tokens")
    if max(rates) < SPEC_ACCEPTANCE_OFF or not isinstance(tokens, int) or tokens <= 1:
        change = ctx.suggest({"features.speculative.method": "off"})
    else:
        change = ctx.suggest({"features.speculative.num_speculative_tokens": max(1, tokens // 2)})
    return _warning("spec_low_acceptance", hits, change,
                    "Few drafted tokens were accepted: speculative decoding spends the idle compute of each step "
                    "verifying drafts the model rejects, and pays for drafting, so it costs about as much as it "
                    "returns on this workload. Fewer draft tokens per step, or speculation off, is the next trial: "
                    "each step then verifies fewer rejected drafts, so output throughput should rise.")


@rule("client_limited", "the client was the bottleneck, or the load was not delivered",
      "the client's loop lag, send lag, delivered vs asked rate or concurrency, token counts vs the engine's")
def client_limited(ctx: Context) -> list[Finding]:
    hits: list[tuple[Level, list[Evidence]]] = []
    reasons: list[str] = []
    for lv in ctx.levels:
        flags = unreliable_figures(lv.figures)
        if not flags and lv.figures.get("client_fell_behind") != 1:
            continue
        reasons.extend(r for r in dict.fromkeys(flags.values()) if r not in reasons)
        f = lv.figures
        evs = _ev("client loop lag p99", f.get("client_lag_ms_p99"), "ms", lv.window)
        evs += _ev("send lag p99", f.get("send_lag_ms_p99"), "ms", lv.window)
        evs += _ev("rate asked", f.get("intended_rate_rps"), "req/s", lv.window)
        evs += _ev("rate sent", f.get("achieved_rate_rps"), "req/s", lv.window)
        evs += _ev("concurrency asked", f.get("intended_concurrency"), "", lv.window)
        evs += _ev("concurrency held", f.get("achieved_concurrency"), "", lv.window)
        hits.append((lv, evs))
    if not hits:
        return []
    workers = _feature(ctx, "load.workers")
    change = ctx.suggest({"load.workers": min(64, 2 * workers)}) if isinstance(workers, int) else None
    why = "; ".join(reasons) if reasons else "the client fell behind the load it was told to send"
    return _warning("client_limited", hits, change,
                    "The client, not the engine, set these figures: " + why + ". Throughput and latency here are "
                    "a limit of the load generator; rerun with more client processes (or on a machine with free "
                    "cores) before changing the engine.")


@rule("queueing_ttft", "TTFT dominated by queueing: the load is past the knee",
      "the engine's queue-time and TTFT histograms per level", (("queue_s",), ("ttft_s",)))
def queueing_ttft(ctx: Context) -> list[Finding]:
    hits: list[tuple[Level, list[Evidence]]] = []
    for lv in ctx.levels:
        queue, ttft = lv.figures.get("engine_queue_ms_mean"), lv.figures.get("engine_ttft_ms_mean")
        if queue is None or not ttft or queue < QUEUE_MIN_MS or queue / ttft < QUEUE_SHARE_OF_TTFT:
            continue
        hits.append((lv, _ev("queue time mean (engine)", queue, "ms", lv.window)
                     + _ev("TTFT mean (engine)", ttft, "ms", lv.window)
                     + _ev("queueing share of TTFT", 100 * queue / ttft, "%", lv.window)))
    if not hits:
        return []
    change: dict[str, Any] | None = None
    if ctx.config is not None:
        load = ctx.config.load
        if load.pattern.closed_loop and load.concurrency > 1:
            change = ctx.suggest({"load.concurrency": load.concurrency // 2})
        elif load.pattern.takes_rate and not load.pattern.unsteady and load.rate_rps:  # a steady open loop
            change = ctx.suggest({"load.rate_rps": round(0.7 * load.rate_rps, 3)})
    return _warning("queueing_ttft", hits, change,
                    "Most of the time to first token was spent waiting in the engine's queue, not computing: the "
                    "load is past the knee, where more requests only lengthen the queue. Size the deployment with "
                    "capacity (tunebench capacity) at the load before the knee, or add replicas.")


@rule("prefill_bound", "prefill-bound: long prompts take most of the request time (chunked prefill off makes it worse)",
      "TTFT and E2E means (engine's where it has them), prompt tokens per request, the chunked-prefill setting")
def prefill_bound(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for lv in ctx.levels:
        f = lv.figures
        ttft = f.get("engine_ttft_ms_mean", f.get("ttft_ms_mean"))
        e2e = f.get("engine_e2e_ms_mean", f.get("e2e_ms_mean"))
        done = f.get("requests_completed")
        prompt = f["input_tokens_total"] / done if done and f.get("input_tokens_total") else None
        if ttft is None or not e2e or prompt is None:
            continue
        share = ttft / e2e
        evs = (_ev("TTFT share of request time", 100 * share, "%", lv.window)
               + _ev("prompt tokens per request", prompt, "tokens", lv.window))
        if share >= PREFILL_SHARE_OF_E2E and prompt >= LONG_PROMPT_TOKENS:
            chunked_off = _feature(ctx, "features.chunked_prefill") is False
            out.append(Finding(
                rule="prefill_bound", severity="warning" if chunked_off else "info", evidence=evs,
                confidence="medium",
                suggestion=ctx.suggest({"features.chunked_prefill": True}) if chunked_off else None,
                explanation="Prefill dominates: long prompts take most of each request's time. Prefill is "
                            "compute-bound (every prompt token at once), unlike decode"
                            + (", and with chunked prefill off a long prompt stalls every decoding sequence for "
                               "its whole length; chunked prefill interleaves it with decode steps." if chunked_off
                               else "; prefix caching (fewer tokens to prefill) or more compute helps, not fewer "
                                    "bytes.")))
        elif share <= 1 - DECODE_SHARE_OF_E2E:
            out.append(Finding(
                rule="decode_bound", severity="info", evidence=evs, confidence="medium", suggestion=None,
                explanation="Decode dominates: most of each request's time is spent generating tokens one step at a "
                            "time, each step reading the weights and the KV cache from memory. This is the "
                            "memory-bound phase: fewer bytes per step (FP8 weights or KV), a larger batch, or "
                            "speculative decoding (idle compute) move it."))
        if out:
            break  # one level is enough to say which phase dominates
    return out


def _limit_hits(ctx: Context, test: Callable[[LimitFigures], bool]) -> list[tuple[Level, LimitFigures]]:
    return [(lv, lim) for lv in ctx.levels if (lim := ctx.evidence.limits.get(lv.idx)) is not None
            and lim.fraction is not None and test(lim)]


def _limit_evidence(lv: Level, lim: LimitFigures) -> list[Evidence]:
    assert lim.fraction is not None
    return (_ev("output throughput", lim.measured_tok_per_s, "tok/s", lv.window)
            + _ev("decode ceiling at this batch", lim.ceiling_tok_per_s, "tok/s", lv.window)
            + _ev("share of the ceiling", 100 * lim.fraction, "%", lv.window)
            + _ev("batch", lim.batch, "sequences", lv.window))


@rule("small_batch_overhead", "far below the decode ceiling at a small batch: launch overhead, or the engine "
      "is not the bottleneck", "the planner's decode ceiling at the batch the engine ran, the CUDA-graphs setting")
def small_batch_overhead(ctx: Context) -> list[Finding]:
    hits = _limit_hits(ctx, lambda lim: lim.fraction is not None and lim.fraction < FAR_BELOW_CEILING
                       and lim.batch <= SMALL_BATCH)
    if not hits:
        return []
    graphs_off = ctx.on_gpu and _feature(ctx, "features.cuda_graphs") is False
    cause = ("CUDA graphs are off, so every decode step pays the launch of each kernel from Python: at a small "
             "batch that overhead, not the bytes moved, sets the pace" if graphs_off else
             "at a small batch each step is short, so per-step overheads (kernel launches, scheduling, sampling, "
             "the HTTP path) weigh more than the bytes moved; or the engine is not the bottleneck at all")
    return [Finding(  # a warning only with a change known to help: otherwise what the run is, not a fault
        rule="small_batch_overhead", severity="warning" if graphs_off else "info",
        evidence=_merge((lv, _limit_evidence(lv, lim))
                                                                         for lv, lim in hits),
        confidence="high" if graphs_off else "low",
        suggestion=ctx.suggest({"features.cuda_graphs": True}) if graphs_off else None,
        explanation="Far below the decode ceiling at a small batch: memory bandwidth is not what limits this run. "
                    + cause[0].upper() + cause[1:] + ".")]


@rule("near_ceiling", "near the bandwidth ceiling: only fewer bytes or more GPUs help now",
      "the planner's decode ceiling at the batch the engine ran, the weights' and KV cache's precision")
def near_ceiling(ctx: Context) -> list[Finding]:
    hits = _limit_hits(ctx, lambda lim: lim.fraction is not None and lim.fraction >= NEAR_CEILING)
    if not hits:
        return []
    change: dict[str, Any] | None = None
    if ctx.on_gpu and ctx.config is not None:
        f = ctx.config.features
        if f.weights_dtype in ("auto", "bf16", "fp16"):  # the engine's own 8-bit weights: GGUF Q8_0 on llama.cpp
            gguf = ctx.config.engine.kind == GGUF_WEIGHTS_ENGINE
            change = ctx.suggest({"features.weights_dtype": next(iter(GGUF_WEIGHT_BITS)) if gguf else "fp8"})
        if change is None and f.kv_cache_dtype == "auto":
            change = ctx.suggest({"features.kv_cache_dtype": "fp8"})
        if change is None:
            change = ctx.suggest({"features.tensor_parallel_size": 2 * f.tensor_parallel_size})
    return [Finding(
        rule="near_ceiling", severity="info", evidence=_merge((lv, _limit_evidence(lv, lim)) for lv, lim in hits),
        confidence="high", suggestion=change,
        explanation="Near the bandwidth ceiling: each decode step already moves the weights and the KV cache about "
                    "as fast as memory allows. Scheduling changes cannot help now; only fewer bytes per token "
                    "(FP8 or INT4 weights, an FP8 KV cache) or more GPUs (more bandwidth) raise it.")]


@rule("never_steady", "never steady: the figures come from the ramp-up and drain, so run longer",
      "each level's steady window (or why it has none) and the load pattern")
def never_steady(ctx: Context) -> list[Finding]:
    if ctx.config is not None and ctx.config.load.pattern.unsteady:
        return []  # no steady state by design: a ramp or a trace's own arrivals
    hits: list[tuple[Level, list[Evidence]]] = []
    notes: list[str] = []
    for lv in ctx.levels:
        note = lv.summary.get("steady_note")
        if lv.summary.get("steady") is None and isinstance(note, str):
            notes.append(f"{lv.window}: {note}")
            hits.append((lv, _ev("level duration", lv.figures.get("duration_s"), "s", lv.window)
                         + _ev("requests", lv.figures.get("requests_total"), "", lv.window)))
    if not hits:
        return []
    change: dict[str, Any] | None = None
    if ctx.config is not None:
        if ctx.config.load.duration_s:
            change = ctx.suggest({"load.duration_s": 2 * ctx.config.load.duration_s})
        else:
            change = ctx.suggest({"workload.num_requests": 2 * ctx.config.workload.num_requests})
    return _warning("never_steady", hits, change,
                    "The load never held its target long enough: the figures average the ramp-up and the drain, "
                    "when the batch was smaller than asked, so they understate what the engine sustains. Run "
                    "longer. (" + "; ".join(notes) + ")")


def _precision_up(value: str) -> str:
    """One step up in precision: a 4-bit GGUF block type to the 8-bit one, any other reduced
    precision (FP8, 8-bit blocks) to the model's own."""
    widest = max(GGUF_WEIGHT_BITS, key=GGUF_WEIGHT_BITS.__getitem__)
    return widest if value in GGUF_WEIGHT_BITS and value != widest else "auto"


def _quality_step_up(ctx: Context) -> dict[str, Any] | None:
    """One step up in precision for the run's lowest-precision setting (the weights first at a
    tie; a reduced type outside the GGUF table counts as 8 bits). None for a run without a
    configuration or one at the model's own precision (an AWQ or GPTQ checkpoint is its own)."""
    if ctx.config is None:
        return None
    f = ctx.config.features
    reduced = [(path, value) for path, value in (("features.weights_dtype", f.weights_dtype),
                                                 ("features.kv_cache_dtype", f.kv_cache_dtype))
               if value in GGUF_WEIGHT_BITS or value.startswith("fp8")]
    eight_bits = max(GGUF_WEIGHT_BITS.values())
    for path, value in sorted(reduced, key=lambda r: GGUF_WEIGHT_BITS.get(r[1], eight_bits)):
        if (change := ctx.suggest({path: _precision_up(value)})) is not None:
            return change
    return None


def _section(figures: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = figures.get(key)
    return value if isinstance(value, Mapping) else {}


def _share_of(section: Any) -> float | None:
    value = section.get("token_share") if isinstance(section, Mapping) else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _mean_of(section: Any) -> float | None:
    value = section.get("mean") if isinstance(section, Mapping) else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


@rule("quality_lost", "quality lost beyond its noise floor: the outputs moved from the reference's more than the "
      "reference's own repeat does", "the quality probe's agreement and mean KL divergence against its reference, "
      "and the reference's noise floor (the same figures of the reference against itself)")
def quality_lost(ctx: Context) -> list[Finding]:
    q = ctx.run.quality
    if not isinstance(q, Mapping) or not q.get("measured") or q.get("within_noise") is not False:
        return []  # not measured, the reference itself, no floor to judge by, or within it
    floor = _section(q, "noise_floor")
    where = "quality probe"
    share, kld = _share_of(q.get("agreement")), _mean_of(q.get("kld"))
    evs = _ev("tokens identical to the reference", None if share is None else 100 * share, "%", where)
    evs += _ev("tokens identical on the reference's repeat (noise floor)",
               None if (floor_share := _share_of(floor.get("agreement"))) is None else 100 * floor_share, "%", where)
    evs += _ev("mean KL divergence from the reference", kld, "nats", where)
    evs += _ev("mean KL divergence on the reference's repeat (noise floor)", _mean_of(floor.get("kld")), "nats", where)
    ref = _section(q, "reference")
    name = f"run {ref['run_id']}" if ref.get("run_id") is not None else str(ref.get("label") or "the reference")
    return [Finding(
        rule="quality_lost", severity="warning", evidence=evs, confidence="medium", suggestion=_quality_step_up(ctx),
        explanation=f"Quality was lost beyond the noise floor: this run's outputs differ from {name}'s more than "
                    "the reference differs from itself on a repeat. Fewer bytes per weight or per KV-cache value "
                    "(lower precision) move fewer bytes each step, and change what the model computes; "
                    "one step up in precision is the next trial, if the loss matters for this use.")]


_EXPLAINS_THE_REST = {
    "client_limited": "the client: its own limits, not the engine's, set the figures",
    "kv_bound": "KV memory: the batch could not grow, so each weight read served few sequences",
    "queueing_ttft": "the queue: requests waited for a slot rather than decoding",
    "prefix_cold": "prefill: prompt tokens computed again instead of read from the cache",
    "spec_low_acceptance": "speculation: verifying rejected drafts spends the step",
    "prefill_bound": "prefill: long prompts take the steps that decode would use",
    "small_batch_overhead": "per-step overhead at a small batch",
    "never_steady": "the ramp: part of the level ran below its target batch",
}


@rule("ceiling_share", "the measured share of the planner's decode ceiling, and which limit explains the rest",
      "the planner's plan for the run's configuration and hardware, the engine's batch, the other findings")
def ceiling_share(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    warned = [f.rule for f in ctx.found if f.severity == "warning" and f.rule in _EXPLAINS_THE_REST]
    for lv in ctx.levels:
        lim = ctx.evidence.limits.get(lv.idx)
        if lim is None:
            continue
        if lim.fraction is None:
            rest = f"the measurement is above the physics ({lim.flag}): a bug in the plan or the measurement"
        elif lim.fraction >= NEAR_CEILING:
            rest = "memory bandwidth itself: the run is close to the physics"
        elif warned:
            rest = "; ".join(_EXPLAINS_THE_REST.get(r, r) for r in warned)
        elif lim.batch <= SMALL_BATCH:
            rest = "the small batch: per-step overheads weigh more than the bytes moved"
        else:
            rest = "what the bytes model leaves out: attention and sampling compute, scheduling, kernel efficiency"
        share = "above the ceiling" if lim.fraction is None else _percent(min(lim.fraction, 1.0))
        out.append(Finding(
            rule="ceiling_share", severity="info", evidence=_limit_evidence(lv, lim) if lim.fraction is not None
            else _ev("output throughput", lim.measured_tok_per_s, "tok/s", lv.window), confidence="medium",
            suggestion=None,
            explanation=f"Measured {lim.measured_tok_per_s:,.0f} tok/s, {share} of the {lim.ceiling_tok_per_s:,.0f} "
                        f"tok/s decode ceiling at a batch of {lim.batch:,.1f} sequences, from the "
                        f"{lim.batch_source}. The ceiling is "
                        f"memory bandwidth over the bytes each step reads (weights once, plus each sequence's KV "
                        f"cache). The rest is explained by {rest}."))
    return out


# --- against a reference run ------------------------------------------------------------------------

_FAMILY = {
    "weights_dtype": "fewer weight bytes read per decode step",
    "kv_cache_dtype": "fewer KV-cache bytes per token: more sequences fit and each step reads less",
    "prefix_caching": "shared prompt tokens read from the cache instead of prefilled",
    "speculative.method": "idle compute spent verifying drafted tokens",
    "speculative.num_speculative_tokens": "tokens drafted per verification step",
    "cuda_graphs": "kernel launches recorded once instead of every step",
    "chunked_prefill": "long prefills interleaved with decode steps",
    "max_num_seqs": "the cap on the batch",
    "max_num_batched_tokens": "the tokens one step may schedule",
    "max_model_len": "KV memory reserved per sequence",
    "gpu_memory_utilization": "memory left for the KV cache",
    "tensor_parallel_size": "GPUs sharing each step (more bandwidth)",
    "data_parallel_size": "model replicas",
}


def _config_changes(ctx: Context, ref: Context) -> list[str]:
    """Differing settings, each with the mechanism it acts through."""
    mine, theirs = flatten(ctx.run.config), flatten(ref.run.config)
    out = []
    for key in sorted(set(mine) | set(theirs)):
        if key == "name" or key.startswith(("description", "tags", "prices")) or mine.get(key) == theirs.get(key):
            continue
        why = _FAMILY.get(key.removeprefix("features."))
        out.append(f"{key} {theirs.get(key)!r} -> {mine.get(key)!r}" + (f" ({why})" if why else ""))
    return out


def _peak_kv(ctx: Context) -> float | None:
    values = [_finite(ctx.engine(lv, "kv_cache_usage_pct")[0]) for lv in ctx.levels]
    joined = np.concatenate(values) if values else np.empty(0)
    return float(joined.max()) if joined.size else None


@dataclass(frozen=True)
class _Mechanism:
    rule: str
    figure: str
    unit: str
    scale: float
    value: Callable[[Context], float | None]
    says: Callable[[float, float], str]
    rate: bool = False  # a 0-1 rate: moved by a tenth of the range, not of itself
    engine_metrics: tuple[tuple[str, ...], ...] = ()


def _prefill_text(a: float, b: float) -> str:
    work = (1 - b) / (1 - a) if a < 1 else math.inf
    saved = f"prefill did {100 * (1 - work):.0f}% less work" if work <= 1 else f"prefill did {work:.1f}x the work"
    return f"prefix hits {a:.2f} -> {b:.2f}: {saved} (prompt tokens read from the KV cache instead of computed)"


_MECHANISMS: tuple[_Mechanism, ...] = (
    _Mechanism("changed_prefix_hits", "prefix-cache hit share", "%", 100.0, _run_hit_share, _prefill_text, rate=True,
               engine_metrics=(("prefix_cache_hits",),)),
    _Mechanism("changed_acceptance", "draft acceptance rate", "%", 100.0,
               lambda c: c.figures.get("spec_acceptance_rate"),
               lambda a, b: f"draft acceptance {100 * a:.0f}% -> {100 * b:.0f}%: each verification step keeps "
                            f"{'more' if b > a else 'fewer'} drafted tokens for the same bytes read", rate=True,
               engine_metrics=(("spec_decode_accepted_tokens",), ("spec_decode_draft_tokens",))),
    _Mechanism("changed_batch", "tokens per engine step", "tokens", 1.0,
               lambda c: c.figures.get("engine_tokens_per_step_mean"),
               lambda a, b: f"the batch {a:,.1f} -> {b:,.1f} tokens per step: each read of the weights serves "
                            f"{b / a:.2f}x the tokens" if a else f"the batch {a:,.1f} -> {b:,.1f} tokens per step",
               engine_metrics=(("tokens_per_step",),)),
    _Mechanism("changed_kv_peak", "KV cache use, peak", "%", 1.0, _peak_kv,
               lambda a, b: f"peak KV-cache use {a:.0f}% -> {b:.0f}%: {'more' if b > a else 'less'} of the cache "
                            "held by running sequences", engine_metrics=(("kv_cache_usage_ratio",),)),
    _Mechanism("changed_preemptions", "preemptions", "", 1.0, lambda c: c.figures.get("preemptions"),
               lambda a, b: f"preemptions {a:,.0f} -> {b:,.0f}: "
                            + ("sequences evicted for lack of KV memory, their work redone" if b > a else
                               "fewer sequences evicted for lack of KV memory"),
               engine_metrics=(("preemptions",),)),
    _Mechanism("changed_throughput", "output throughput", "tok/s", 1.0,
               lambda c: c.figures.get("steady_output_tok_per_s", c.figures.get("output_tok_per_s")),
               lambda a, b: f"output throughput {a:,.0f} -> {b:,.0f} tok/s (x{b / a:.2f})" if a else
               f"output throughput {a:,.0f} -> {b:,.0f} tok/s"),
    _Mechanism("changed_ttft", "TTFT p50", "ms", 1.0,
               lambda c: c.figures.get("steady_ttft_ms_p50", c.figures.get("ttft_ms_p50")),
               lambda a, b: f"TTFT p50 {a:,.0f} -> {b:,.0f} ms"),
)


def _moved(m: _Mechanism, a: float, b: float) -> bool:
    if m.rate:
        return abs(b - a) >= MATERIAL_CHANGE
    if a == 0:
        return b != 0
    return abs(b - a) / abs(a) >= MATERIAL_CHANGE


def _against_reference(m: _Mechanism) -> Callable[[Context], list[Finding]]:
    def check(ctx: Context) -> list[Finding]:
        ref = ctx.reference
        if ref is None:
            return []
        a, b = m.value(ref), m.value(ctx)
        if a is None or b is None or not _moved(m, a, b):
            return []
        changes = _config_changes(ctx, ref)
        because = (CONFIGURATION_CLAUSE + "; ".join(changes)) if changes else SAME_CONFIGURATION
        return [Finding(
            rule=m.rule, severity="info", confidence="medium" if changes else "low", suggestion=None,
            evidence=[Evidence(figure=f"{m.figure} in run {ref.run.id}", value=a * m.scale, unit=m.unit,
                               window="reference"),
                      Evidence(figure=f"{m.figure} in run {ctx.run.id}", value=b * m.scale, unit=m.unit,
                               window="this run")],
            explanation=f"{_why_prefix(ctx.run.id, ref.run.id)}{m.says(a, b)}{because}.")]
    return check


CONFIGURATION_CLAUSE = "; configuration: "
SAME_CONFIGURATION = "; the configurations are the same"


def _why_prefix(run_id: int, ref_id: int) -> str:
    return f"Why run {run_id} differs from run {ref_id}: "


@dataclass(frozen=True)
class ChangeParts:
    """A ``changed_*`` finding's explanation in its parts: which runs, the mechanism that moved
    (``prefix hits 0.00 -> 0.85: prefill did 85% less work ...``) and the settings that differ
    (``features.prefix_caching False -> True (...)``; empty when the configurations are the same),
    which every change between the same two runs repeats."""

    runs: str
    mechanism: str
    configuration: str


def change_parts(finding: Finding) -> ChangeParts | None:
    """The parts of a ``changed_*`` finding's explanation (None for another finding)."""
    registered = RULES.get(finding.rule)
    if registered is None or not registered.against_reference:
        return None
    head, sep, rest = finding.explanation.partition(": ")
    if not sep or not head.startswith("Why run "):
        return None
    body = rest.removesuffix(".")
    if body.endswith(SAME_CONFIGURATION):
        return ChangeParts(head, body.removesuffix(SAME_CONFIGURATION), "")
    mechanism, _sep, configuration = body.partition(CONFIGURATION_CLAUSE)
    return ChangeParts(head, mechanism, configuration)


for _m in _MECHANISMS:
    rule(_m.rule, f"against a reference run: {_m.figure} moved", f"{_m.figure} of both runs, their configurations",
         _m.engine_metrics, against_reference=True)(_against_reference(_m))


def finding_dicts(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """The findings as JSON: rule, severity, evidence, explanation, confidence, suggestion."""
    return [f.model_dump(mode="json") for f in findings]

