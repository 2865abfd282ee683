"""What a request and a load level measured, and how figures are computed from it.

Definitions are in ``docs/metrics.md``; they follow ``vllm bench serve`` (percentiles by linear
interpolation, TPOT = (E2E - TTFT) / (output tokens - 1), goodput = requests meeting every SLO
per second) and say where they differ (ITL is per token, not per chunk).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

from app.analysis import metric_catalog
from app.analysis.summary import distribution, level_summary_figures
from app.slo import SLO_METRICS, SloError, parse_slo  # noqa: F401 - re-exported: figures apply SLOs
from engine_adapters import prometheus
from engine_adapters.prometheus import Scrape

ErrorKind = str  # connect | http | timeout | stream | malformed | cancelled


class RequestRecord(BaseModel):
    """One request as the client saw it. Times are milliseconds; ``*_s`` offsets are seconds from
    the start of its level (monotonic clock), ``start_wall_s`` dates it."""

    level: int
    index: int
    conversation: int = 0
    turn: int = 0
    scheduled_s: float
    start_s: float
    start_wall_s: float
    queue_ms: float
    ttft_ms: float | None = None
    itl_ms: list[float] = Field(default_factory=list)
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    input_tokens: int | None = None  # the engine's prompt_tokens when it reports usage
    input_tokens_counted: int = 0  # what the dataset counted (exact only with a local tokenizer)
    output_tokens: int = 0
    expected_output_tokens: int = 0
    chunks: int = 0
    tokens_source: str = "usage"  # usage = per-chunk usage counts; chunks = one token per chunk (fallback)
    finish_reason: str | None = None
    ok: bool = False
    error: str | None = None
    error_kind: ErrorKind | None = None
    http_status: int | None = None
    request_id: str | None = None
    """The ``X-Request-Id`` it was sent with (``app.load.client.request_id``), to find it in the engine's logs."""
    cap_wait_ms: float = 0.0
    """Of ``queue_ms``, the time it waited for the level's in-flight cap (open loop with
    ``max_concurrency``): held back by the engine's slowness, not by the client."""
    ttfat_ms: float | None = None
    """Send -> the first answer token: the first ``content`` delta, after any reasoning deltas
    (``reasoning_content`` or ``reasoning``). Equal to TTFT for a model that does not reason; none
    when no answer came."""
    reasoning_tokens: int | None = None
    """Output tokens spent reasoning: the engine's ``completion_tokens_details.reasoning_tokens``
    where it reports them, else counted from the deltas. None: no reasoning seen."""
    reasoning_unfinished: bool = False
    """It reasoned and never answered within its ``max_tokens``: counted as such, not as an answer."""

    @property
    def answer_tokens(self) -> int:
        return self.output_tokens - (self.reasoning_tokens or 0)


class Stats(BaseModel):
    """Distribution of one metric (milliseconds)."""

    count: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    min: float | None = None
    std: float | None = None

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Stats:
        """The distribution as ``app.analysis.summary.distribution`` defines it (the store uses the same)."""
        d = distribution(values)
        if not d:
            return cls()
        return cls(count=int(d["count"]), mean=d["mean"], median=d["p50"], p90=d["p90"], p95=d["p95"],
                   p99=d["p99"], max=d["max"], min=d["min"], std=d["std"])


class EngineDeltas(BaseModel):
    """Engine counters over one level (``/metrics`` after minus before); None = not exposed."""

    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    spec_decode_drafts: float | None = None
    spec_decode_draft_tokens: float | None = None
    spec_decode_accepted_tokens: float | None = None
    spec_acceptance_rate: float | None = None
    spec_mean_acceptance_length: float | None = None
    requests_finished: float | None = None
    preemptions: float | None = None
    # Means of the engine's own latency histograms over the level (server side: no network,
    # no client scheduling). Comparing them with the client's figures shows client distortion.
    engine_ttft_ms_mean: float | None = None
    engine_itl_ms_mean: float | None = None
    engine_e2e_ms_mean: float | None = None
    engine_queue_ms_mean: float | None = None
    # Mean tokens the engine scheduled per step over the level (prefill + decode): the batch it
    # really ran. Continuous batching raises it with concurrency.
    engine_tokens_per_step_mean: float | None = None


class LoadDelivered(BaseModel):
    """What the client delivered of the load it was told to send (``app.load.delivery``): the
    proof that a level's figures are the engine's, not the client's limit."""

    mode: str = "closed"  # closed | open
    intended_rate_rps: float | None = None
    """Open loop: the rate asked for."""
    scheduled_rate_rps: float | None = None
    """Open loop: the rate of the seeded schedule itself over the requests sent (random arrivals
    differ from the asked rate by chance, not by the client's fault)."""
    achieved_rate_rps: float | None = None
    """Open loop: the rate the requests really went out at."""
    intended_concurrency: int | None = None
    """Closed loop: the concurrency asked for (or the level's request count, when smaller)."""
    achieved_concurrency: float | None = None
    """Closed loop: requests in flight, averaged over time while the level was sending at its target."""
    send_lag_ms: Stats = Field(default_factory=Stats)
    """Due -> sent, apart from waiting for the in-flight cap: the client's own lateness."""
    cap_wait_ms: Stats = Field(default_factory=Stats)
    """Open loop with a cap: the time requests waited for a free slot."""
    ttft_intended_ms: Stats = Field(default_factory=Stats)
    """Open loop: TTFT from the time each request was due, not from when it was sent (no coordinated omission)."""
    e2e_intended_ms: Stats = Field(default_factory=Stats)
    """Open loop: E2E from the time each request was due."""
    lag_bound_ms: float = 0.0
    fell_behind: bool = False
    reason: str | None = None
    """Why the client fell behind, in words."""


class LoadFigures(BaseModel):
    """The throughput and latencies a stretch of load achieved: what a whole level and its steady
    window both report, under the same names."""

    request_throughput_rps: float = 0.0
    output_tok_per_s: float = 0.0
    ttft_ms: Stats = Field(default_factory=Stats)
    tpot_ms: Stats = Field(default_factory=Stats)
    e2e_ms: Stats = Field(default_factory=Stats)


class SteadyWindow(LoadFigures):
    """The part of a level where the load was at its target (``app.load.delivery.steady_window``),
    and the level's figures over it: ramp-up and drain left out."""

    start_s: float
    end_s: float
    rule: str
    """How the window was found, in words."""
    requests: int = 0
    """Completed requests that started inside the window (their latencies are the window's)."""
    mean_in_flight: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class LevelSummary(LoadFigures):
    """Figures of one load level (warm-up excluded)."""

    requests: int = 0
    completed: int = 0
    errors: int = 0
    cancelled: int = 0
    error_kinds: dict[str, int] = Field(default_factory=dict)
    error_examples: list[str] = Field(default_factory=list)
    duration_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tok_per_s: float = 0.0
    itl_ms: Stats = Field(default_factory=Stats)
    queue_ms: Stats = Field(default_factory=Stats)
    ttfat_ms: Stats = Field(default_factory=Stats)
    """Time to the first answer token (``RequestRecord.ttfat_ms``): TTFT's match for a reasoning model."""
    reasoning_tokens: int | None = None
    """Output tokens of completed requests spent reasoning (None: no request reasoned)."""
    answer_tokens: int | None = None
    """Output tokens of completed requests that were the answer (with ``reasoning_tokens``)."""
    reasoning_unfinished: int = 0
    """Requests that reasoned to their ``max_tokens`` and never answered."""
    reasoning_itl_ms: Stats = Field(default_factory=Stats)
    answer_itl_ms: Stats = Field(default_factory=Stats)
    trace_prefix_reuse: float | None = None
    """A replayed trace's level: the share of prompt tokens a prefix cache can hit, as the trace's
    block ids imply (``app.load.traces.TraceReuse``), to read beside the engine's hit rate."""
    slo: str | None = None
    good_requests: int | None = None
    goodput_rps: float | None = None
    peak_concurrency: int = 0
    client_lag_ms: Stats = Field(default_factory=Stats)  # event-loop lateness: client starved of CPU?
    tokens_source: str = "usage"  # usage | chunks | mixed
    lengths_exact: bool = True
    engine: EngineDeltas = Field(default_factory=EngineDeltas)
    tokens_match_engine: bool | None = None
    stop_reason: str = "completed"
    delivered: LoadDelivered | None = None
    steady: SteadyWindow | None = None
    steady_note: str | None = None
    """Why the level has no steady window, when it has none."""

    def figures(self) -> dict[str, float]:
        """The level's figures under their catalogue keys (``ttft_ms_p50``, ``requests_per_s``,
        ``engine_ttft_ms_mean``...): the names Compare, the store and the reports use."""
        return level_summary_figures(self.model_dump(mode="json"))

    def unreliable(self) -> dict[str, str]:
        """Client figures of this level that cannot be trusted -> why (``app.analysis.metric_catalog``)."""
        return metric_catalog.unreliable_figures(self.figures())

    def flat(self) -> dict[str, float | int | str | bool | None]:
        """One level as flat columns (``ttft_ms_p99``, ``ttft_ms_p50`` = ``ttft_ms_median``,
        ``engine_prefix_cache_hit_rate``...)."""
        out: dict[str, float | int | str | bool | None] = {}
        for key, value in self.model_dump().items():
            if isinstance(value, dict) and key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "queue_ms", "client_lag_ms"):
                base = key[: -len("_ms")]
                for stat, v in value.items():
                    out[f"{base}_{stat}" if stat == "count" else f"{base}_ms_{stat}"] = v
                out[f"{base}_ms_p50"] = value["median"]  # the same figure under its percentile name
            elif key == "engine":
                out.update({f"engine_{k}": v for k, v in value.items()})
            elif isinstance(value, (dict, list)):
                continue
            else:
                out[key] = value
        return out


# --- SLOs and goodput ---------------------------------------------------------------------------

# The grammar (parse_slo, SloError, SLO_METRICS) lives in app.slo, which app.workload imports too.


def meets_slo(record: RequestRecord, slos: Sequence[tuple[str, str, float]]) -> bool:
    """A completed request meets the SLOs when every bound holds (TPOT of a 1-token output is 0,
    as in vllm bench serve)."""
    if not record.ok:
        return False
    for key, op, limit in slos:
        value = getattr(record, key)
        if value is None:
            value = 0.0 if key == "tpot_ms" else None
        if value is None or not (value <= limit if op == "<=" else value < limit):
            return False
    return True


# --- engine /metrics ----------------------------------------------------------------------------

def engine_deltas(before: Scrape, after: Scrape) -> EngineDeltas:
    """A level's engine figures: the interval between two scrapes of the same engine, read by
    ``engine_adapters.prometheus`` exactly as the live collector reads it."""
    interval = prometheus.delta(before, after)
    figures = prometheus.interval_figures(interval)
    d = EngineDeltas(**{k: interval.counters.get(k) for k in (
        "generation_tokens", "prompt_tokens", "prefix_cache_queries", "prefix_cache_hits", "spec_decode_drafts",
        "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "requests_finished", "preemptions")})
    d.prefix_cache_hit_rate = figures.get("prefix_cache_hit_ratio")
    d.spec_acceptance_rate = figures.get("spec_acceptance_ratio")
    d.spec_mean_acceptance_length = figures.get("spec_mean_acceptance_length")
    for key, field_name in (("ttft_s", "engine_ttft_ms_mean"), ("itl_s", "engine_itl_ms_mean"),
                            ("e2e_s", "engine_e2e_ms_mean"), ("queue_s", "engine_queue_ms_mean")):
        if f"{key}_mean" in figures:
            setattr(d, field_name, figures[f"{key}_mean"] * 1e3)
    d.engine_tokens_per_step_mean = figures.get("tokens_per_step_mean")
    return d


# --- a level ------------------------------------------------------------------------------------

def format_figure(value: float | None, digits: int = 1) -> str:
    """A figure for a table or note: thousands separated, ``-`` when unknown."""
    return "-" if value is None else f"{value:,.{digits}f}"


def client_starved(s: LevelSummary) -> bool:
    """The client's event loop woke later than a token gap: its TTFT/ITL are late and bunched
    (the rule is ``app.analysis.metric_catalog.client_starved``)."""
    return metric_catalog.client_starved(s.client_lag_ms.p99, s.itl_ms.median)


def level_notes(s: LevelSummary) -> list[str]:
    """Caveats and engine-side figures beside a level's table row, for every face (CLI, GUI,
    reports): the same words wherever the level is shown."""
    notes = []
    if s.tokens_match_engine is not None:
        notes.append(f"client tokens {s.output_tokens} vs engine {s.engine.generation_tokens:.0f}: "
                     + ("equal" if s.tokens_match_engine else "DIFFERENT"))
    if s.tokens_source != "usage":
        notes.append(f"tokens counted from {s.tokens_source} (engine sent no per-chunk usage)")
    if not s.lengths_exact:
        notes.append("prompt lengths approximate (no local tokenizer)")
    if client_starved(s):
        notes.append(f"client starved of CPU (loop lag p99 {s.client_lag_ms.p99:.0f} ms > ITL p50 "
                     f"{format_figure(s.itl_ms.median)} ms): client TTFT/ITL are late and bunched; trust the engine-side means")
    notes += delivery_notes(s)
    if s.engine.engine_itl_ms_mean is not None:
        notes.append(f"engine-side means: TTFT {format_figure(s.engine.engine_ttft_ms_mean)}, ITL "
                     f"{format_figure(s.engine.engine_itl_ms_mean, 2)}")
    if s.engine.engine_tokens_per_step_mean is not None:
        notes.append(f"engine batch: {s.engine.engine_tokens_per_step_mean:.1f} tokens per step")
    if s.error_examples:
        notes.append("errors: " + "; ".join(s.error_examples[:3]))
    if s.stop_reason != "completed":
        notes.append(f"stopped: {s.stop_reason}")
    return notes


def delivery_notes(s: LevelSummary) -> list[str]:
    """What the client delivered of the level's load, and its steady window, in words."""
    notes: list[str] = []
    d = s.delivered
    if d is not None:
        if d.fell_behind and d.reason:
            notes.append(f"{d.reason}: its figures are the client's limit, not the engine's")
        elif d.mode == "open" and d.achieved_rate_rps is not None:
            asked = f" of {d.scheduled_rate_rps:,.2f} scheduled" if d.scheduled_rate_rps else ""
            notes.append(f"load delivered: {d.achieved_rate_rps:,.2f} req/s sent{asked}, send lag p99 "
                         f"{format_figure(d.send_lag_ms.p99)} ms")
        elif d.mode == "closed" and d.achieved_concurrency is not None:
            notes.append(f"load delivered: {d.achieved_concurrency:,.1f} of {d.intended_concurrency} in flight")
        if d.mode == "open" and d.ttft_intended_ms.p99 is not None:
            held = (f": the cap of {d.intended_concurrency} held requests back"
                    if (d.cap_wait_ms.p99 or 0.0) > 1.0 else "")
            notes.append(f"TTFT from due p50/p99 {format_figure(d.ttft_intended_ms.median)}/"
                         f"{format_figure(d.ttft_intended_ms.p99)} ms, as sent {format_figure(s.ttft_ms.median)}/"
                         f"{format_figure(s.ttft_ms.p99)} ms{held}")
    if s.steady is not None:
        notes.append(f"steady {s.steady.start_s:,.1f}-{s.steady.end_s:,.1f} s: {s.steady.output_tok_per_s:,.1f} out tok/s "
                     f"(whole level {s.output_tok_per_s:,.1f})")
    elif s.steady_note:
        notes.append(f"no steady window: {s.steady_note}")
    return notes
