"""The metric catalogue: every figure tunebench shows, defined once (key, human name, unit,
direction, group) with the rule that judges whether a run's value can be trusted.

Why here: the CLI table (``app/cli/run_cmds.py``), Compare (``app/analysis/compare.py``), the GUI
(``app/gui/history.py``) and the HTML report (``app/export``) all name, order, colour and judge
figures; the figures themselves are computed from request rows in ``app/analysis/summary.py``, the
other half of "one metrics module". Nothing here imports Qt, SQLAlchemy or the rest of ``app``.

Reliability. The load client measures TTFT, ITL, TPOT and E2E with its own clock. When its event
loop is starved of CPU (an engine spinning on the same cores), it reads tokens late and in bunches:
TTFT and E2E come out too high, ITL percentiles collapse to 0 and TPOT too low. A run records how
late its loop woke (``client_lag_ms``); :func:`unreliable_figures` turns that into a reason per
client figure, and :func:`headline_keys` puts the engine's own figure (its latency histograms,
its token counter) in the client figure's place, labelled "(engine)". An unreliable figure is
shown greyed with its reason and never called better or worse.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower", "neutral"]
Group = Literal["throughput", "latency", "engine", "errors", "run", "client"]
Reliability = Literal["client_timing", "client_itl", "tokens", "none"]


@dataclass(frozen=True)
class Metric:
    key: str
    name: str  # what a person reads: "TTFT p50"
    unit: str  # "ms", "tok/s", "req/s", "%", "s", "tokens", ""
    direction: Direction
    group: Group
    reliability: Reliability = "none"
    engine_alternative: str | None = None  # the engine-side key that replaces it when unreliable
    scale: float = 1.0  # shown value = stored value x scale (a rate 0..1 shown in %)
    digits: int = 1
    description: str = ""
    short: str = ""  # a narrow table's header ("out tok/s"); the name when empty

    @property
    def header(self) -> str:
        return self.short or self.name

    @property
    def label(self) -> str:
        """Name with unit: ``TTFT p50 (ms)``."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    @property
    def direction_text(self) -> str:
        return {"higher": "higher is better", "lower": "lower is better", "neutral": "neither better nor worse"}[
            self.direction]

    def format(self, value: float | None) -> str:
        """The value in the metric's unit and precision, thousands separated; ``-`` when unknown."""
        if value is None or not math.isfinite(value):
            return "-"
        shown = value * self.scale
        digits = self.digits if abs(shown) < 1000 else 0
        return f"{shown:,.{digits}f}"


_STATS = (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"))
_CLIENT_LATENCY = (
    ("ttft_ms", "TTFT", "engine_ttft_ms_mean", "send -> first token, as the client saw it"),
    ("itl_ms", "ITL", "engine_itl_ms_mean", "gap between tokens, per token, as the client saw it"),
    ("tpot_ms", "TPOT", "engine_itl_ms_mean", "(E2E - TTFT) / (output tokens - 1) per request"),
    ("e2e_ms", "E2E", "engine_e2e_ms_mean", "send -> last token, as the client saw it"),
)


def _client_latency(base: str, short: str, digits: int, what: str, alt: str | None = None) -> list[Metric]:
    """A latency the client measures, at each statistic (an ITL's percentiles need a client that
    kept up with every token: ``client_itl``)."""
    return [Metric(f"{base}_{stat}", f"{short} {word}", "ms", "lower", "latency",
                   "client_itl" if base.endswith("itl_ms") and stat != "mean" else "client_timing", alt,
                   digits=digits, description=what) for stat, word in _STATS]


def _catalogue() -> tuple[Metric, ...]:
    out: list[Metric] = [
        Metric("output_tok_per_s", "Output throughput", "tok/s", "higher", "throughput", "tokens",
               "engine_output_tok_per_s",
               description="output tokens of completed requests / measured duration", short="out tok/s"),
        Metric("total_tok_per_s", "Total throughput", "tok/s", "higher", "throughput", "tokens",
               description="input + output tokens of completed requests / measured duration"),
        Metric("requests_per_s", "Request throughput", "req/s", "higher", "throughput", digits=2,
               description="completed requests / measured duration", short="req/s"),
        Metric("goodput_rps", "Goodput", "req/s", "higher", "throughput", "client_timing", digits=2,
               description="completed requests meeting every SLO / measured duration", short="goodput/s"),
        Metric("engine_output_tok_per_s", "Output throughput (engine)", "tok/s", "higher", "engine",
               description="the engine's generation-token counter over the measured duration",
               short="out tok/s (engine)"),
    ]
    for base, short, alt, what in _CLIENT_LATENCY:
        out += _client_latency(base, short, 2 if base in ("itl_ms", "tpot_ms") else 1, what, alt)
    for stat, word in _STATS:
        out.append(Metric(f"queue_ms_{stat}", f"Client queue {word}", "ms", "lower", "latency", "client_timing",
                          digits=2, description="due -> sent: waiting in the client, apart from TTFT",
                          short=f"queue {word}"))
    for base, short, digits, what in (  # the engine's own latency histograms, over the measured duration
            ("ttft_ms", "TTFT", 1, "the engine's own TTFT histogram (no network, no client scheduling)"),
            ("itl_ms", "ITL", 2, "the engine's own inter-token latency histogram"),
            ("e2e_ms", "E2E", 1, "the engine's own end-to-end request latency histogram"),
            ("queue_ms", "Queue", 1, "time requests waited in the engine's scheduler")):
        out.append(Metric(f"engine_{base}_mean", f"{short} mean (engine)", "ms", "lower", "engine", digits=digits,
                          description=what))
    out += [
        Metric("prefix_cache_hit_rate", "Prefix cache hit rate", "%", "higher", "engine", scale=100.0,
               description="prefix-cache hits / queries (tokens)", short="cache hit %"),
        Metric("trace_prefix_reuse", "Prefix reuse the trace implies", "%", "neutral", "run", scale=100.0,
               description="a replayed trace: prompt tokens in whole blocks whose whole prefix came before, over all "
                           "prompt tokens (a cache that never evicts); read beside the prefix cache hit rate",
               short="trace reuse %"),
        Metric("spec_acceptance_rate", "Draft acceptance rate", "%", "higher", "engine", scale=100.0,
               description="accepted / proposed draft tokens", short="spec acc %"),
        Metric("spec_mean_acceptance_length", "Acceptance length", "tokens", "higher", "engine", digits=2,
               description="tokens produced per verification step"),
        # The batch the engine ran: neither good nor bad by itself (it follows the load).
        Metric("engine_tokens_per_step_mean", "Tokens per step (engine)", "tokens", "neutral", "engine",
               description="tokens scheduled per engine step, prefill and decode"),
        Metric("preemptions", "Preemptions", "", "lower", "engine", digits=0,
               description="requests the engine evicted for lack of KV cache"),
        Metric("requests_failed", "Failed requests", "", "lower", "errors", digits=0),
        Metric("error_rate_pct", "Error rate", "%", "lower", "errors"),
        Metric("requests_cancelled", "Cancelled requests", "", "neutral", "errors", digits=0),
        Metric("requests_total", "Requests", "", "neutral", "run", digits=0),
        Metric("requests_completed", "Completed requests", "", "neutral", "run", digits=0),
        Metric("output_tokens_total", "Output tokens", "tokens", "neutral", "run", digits=0),
        Metric("input_tokens_total", "Input tokens", "tokens", "neutral", "run", digits=0),
        Metric("duration_s", "Measured duration", "s", "neutral", "run",
               description="sum of the levels' durations (level start -> its last request ended)"),
        # Startup depends more on what this machine has cached (page cache, compile cache) than on
        # the configuration: a second start of the same engine is often twice as fast. Coloured,
        # it would call the second run of every A/B "better", so it is shown but never judged.
        Metric("startup_s", "Engine startup", "s", "neutral", "run",
               description="launch -> ready; dominated by this machine's caches"),
        Metric("kv_cache_tokens", "KV cache capacity", "tokens", "higher", "engine", digits=0,
               description="tokens the engine's KV cache can hold"),
        # What the client delivered of the load (app.load.delivery): the proof the figures are the engine's.
        Metric("send_lag_ms_p99", "Send lag p99", "ms", "lower", "client",
               description="due -> sent, apart from waiting for the in-flight cap: how late the client sent",
               short="send lag p99"),
        Metric("intended_rate_rps", "Rate asked", "req/s", "neutral", "client", digits=2,
               description="open loop: the arrival rate the level was told to send"),
        Metric("achieved_rate_rps", "Rate sent", "req/s", "neutral", "client", digits=2,
               description="open loop: the rate the requests really went out at"),
        Metric("intended_concurrency", "Concurrency asked", "", "neutral", "client", digits=0,
               description="closed loop: requests to keep in flight (open loop: the cap)"),
        Metric("achieved_concurrency", "Concurrency held", "", "neutral", "client",
               description="closed loop: requests in flight, time-averaged while sending at the target"),
        # The level's steady window (app.load.delivery): ramp-up and drain left out.
        Metric("steady_output_tok_per_s", "Output throughput (steady)", "tok/s", "higher", "throughput", "tokens",
               "engine_output_tok_per_s",
               description="output tokens that arrived inside the steady window / its length",
               short="out tok/s steady"),
        Metric("steady_requests_per_s", "Request throughput (steady)", "req/s", "higher", "throughput", digits=2,
               description="requests completed inside the steady window / its length", short="req/s steady"),
        Metric("steady_duration_s", "Steady window", "s", "neutral", "run",
               description="how long the load held its target"),
        # How late the client's loop woke: a measure of the measurement, not of the engine.
        Metric("client_lag_ms_p99", "Client loop lag p99", "ms", "neutral", "client",
               description="how late the load client's event loop woke (starved client when high)",
               short="lag p99"),
    ]
    for base, short, digits, what in (("ttft_ms", "TTFT", 1, "due -> first token, the stall a cap held back included"),
                                      ("e2e_ms", "E2E", 1, "due -> last token")):
        for stat in ("p50", "p99"):  # open loop, from the time each request was due (app.load.delivery)
            out.append(Metric(f"{base[:-3]}_intended_ms_{stat}", f"{short} {stat} from due", "ms", "lower", "latency",
                              "client_timing", digits=digits, description=f"open loop: {what}"))
    # Reasoning models (docs/metrics.md, "Reasoning models"): the answer's first token, and each
    # phase's tokens and gaps. TTFAT equals TTFT for a model that does not reason.
    for base, short, digits, what in (
            ("ttfat_ms", "TTFAT", 1, "send -> first answer token (after the reasoning), as the client saw it"),
            ("reasoning_itl_ms", "Reasoning ITL", 2, "gap between reasoning tokens, per token"),
            ("answer_itl_ms", "Answer ITL", 2, "gap between answer tokens, per token")):
        out += _client_latency(base, short, digits, what)
    for phase, what in (("reasoning", "spent reasoning"), ("answer", "that were the answer")):
        out.append(Metric(f"{phase}_tokens_total", f"{phase.capitalize()} tokens", "tokens", "neutral", "run",
                          digits=0, description=f"output tokens of completed requests {what}"))
    out.append(Metric("requests_reasoning_unfinished", "Reasoning unfinished", "", "lower", "errors", digits=0,
                      description="requests that reasoned to max_tokens and never answered"))
    for base, short, digits in (("ttft_ms", "TTFT", 1), ("tpot_ms", "TPOT", 2), ("e2e_ms", "E2E", 1)):
        for stat in ("p50", "p99"):  # over the level's steady window
            out.append(Metric(f"steady_{base}_{stat}", f"{short} {stat} (steady)", "ms", "lower", "latency",
                              "client_timing", digits=digits))
    return tuple(out)


CATALOGUE: tuple[Metric, ...] = _catalogue()
NOT_SHOWN = frozenset({"tokens_match_engine", "client_fell_behind"})
"""Recorded to judge reliability (1 = the client's token count equals the engine's; 1 = the
client fell behind the load it was told to send), not figures."""
BY_KEY: dict[str, Metric] = {m.key: m for m in CATALOGUE}

HEADLINE: tuple[str, ...] = (
    "output_tok_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "tpot_ms_mean",
    "e2e_ms_p50", "e2e_ms_p99", "error_rate_pct",
)
"""The figures a comparison leads with, in this order (before engine-side substitutes are applied)."""
STEADY_OF: dict[str, str] = {
    "output_tok_per_s": "steady_output_tok_per_s", "requests_per_s": "steady_requests_per_s",
    "ttft_ms_p50": "steady_ttft_ms_p50", "ttft_ms_p99": "steady_ttft_ms_p99",
    "e2e_ms_p50": "steady_e2e_ms_p50", "e2e_ms_p99": "steady_e2e_ms_p99",
}
"""A headline figure's steady-window twin (``app.load.delivery``): where the runs have one, a
comparison leads with it (its name says "(steady)"), the whole-level figure right after."""

_FIRST = (*HEADLINE, "goodput_rps", "total_tok_per_s", "engine_output_tok_per_s", "engine_ttft_ms_mean",
          "engine_itl_ms_mean", "engine_e2e_ms_mean", "engine_queue_ms_mean", "prefix_cache_hit_rate", "trace_prefix_reuse",
          "spec_acceptance_rate", "spec_mean_acceptance_length", "engine_tokens_per_step_mean", "preemptions",
          "startup_s", "kv_cache_tokens")
ORDER: tuple[str, ...] = (*_FIRST, *(m.key for m in CATALOGUE if m.key not in _FIRST))
"""Display order: the headline, the engine's own figures, then the rest of the catalogue."""


def split_key(key: str) -> tuple[str | None, str]:
    """``L1.ttft_ms_p50`` -> (``L1``, ``ttft_ms_p50``); a run-level key has no level."""
    if key.startswith("L") and "." in key and key[1:key.index(".")].isdigit():
        level, base = key.split(".", 1)
        return level, base
    return None, key


def metric(key: str) -> Metric:
    """The catalogue entry of a key (``L<i>.`` prefixes allowed); unknown keys get a neutral
    entry named by the key, so an imported tool's extra figure is shown but never judged."""
    level, base = split_key(key)
    found = BY_KEY.get(base)
    if found is None:
        return Metric(key, key, "", "neutral", "run")
    if level is None:
        return found
    return Metric(key, f"{found.name} [{level}]", found.unit, found.direction, found.group, found.reliability,
                  None if found.engine_alternative is None else f"{level}.{found.engine_alternative}",
                  found.scale, found.digits, found.description, found.short)


def order_key(key: str) -> tuple[int, int, str]:
    """Sort key: run-level figures before per-level ones, catalogue order, then by name."""
    level, base = split_key(key)
    rank = ORDER.index(base) if base in ORDER else len(ORDER) + (0 if base in BY_KEY else 1)
    return (0 if level is None else 1), rank, key


def verdict(key: str, delta: float | None) -> str:
    """'better', 'worse' or '' (unknown, unchanged or a neutral figure) for a change of ``delta``."""
    m = metric(key)
    if delta is None or delta == 0 or m.direction == "neutral" or not math.isfinite(delta):
        return ""
    return "better" if (delta > 0) == (m.direction == "higher") else "worse"


def change_text(key: str, base: float | None, value: float | None) -> str:
    """How a figure moved, as a person says it: ``x1.90`` for a figure where higher is better
    (throughput), ``-64%`` for one where lower is better (latency) or a neutral one."""
    if base is None or value is None or not (math.isfinite(base) and math.isfinite(value)):
        return ""
    m = metric(key)
    if m.direction == "higher" and base > 0 and value >= 0:
        return f"\u00d7{value / base:.2f}"
    if base == 0:
        return "" if value == 0 else "new"
    return f"{100.0 * (value - base) / abs(base):+.0f}%"


# --- reliability --------------------------------------------------------------------------------

STARVED_MIN_LAG_MS = 5.0


def client_starved(lag_p99_ms: float | None, itl_p50_ms: float | None) -> bool:
    """The client's event loop woke later than a token gap (and than 5 ms): its TTFT/ITL are
    late and bunched. The single definition; ``app.load.metrics.client_starved`` asks here."""
    if lag_p99_ms is None or not math.isfinite(lag_p99_ms):
        return False
    itl = itl_p50_ms if itl_p50_ms is not None and math.isfinite(itl_p50_ms) else 0.0
    return lag_p99_ms > max(itl, STARVED_MIN_LAG_MS)


def unreliable_figures(figures: Mapping[str, float | None], *, level_label: str = "",
                       keys: Iterable[str] | None = None) -> dict[str, str]:
    """Client figures of one level (or a one-level run) that cannot be trusted -> the reason.

    ``figures`` holds the level's flat figures (catalogue keys), including ``client_lag_ms_p99``
    and, when the engine's counter was read, ``tokens_match_engine`` (1 or 0)."""
    where = f" at {level_label}" if level_label else ""
    lag, itl_p50 = figures.get("client_lag_ms_p99"), figures.get("itl_ms_p50")
    starved = client_starved(lag, itl_p50)
    bunched = itl_p50 is not None and itl_p50 == 0 and (figures.get("output_tokens_total") or 2) > 1
    tokens_differ = figures.get("tokens_match_engine") == 0
    behind, send_lag = figures.get("client_fell_behind") == 1, figures.get("send_lag_ms_p99")
    out: dict[str, str] = {}
    for key in (figures.keys() if keys is None else keys):
        m = BY_KEY.get(key)
        if m is None:
            continue
        if behind and (m.reliability in ("client_timing", "client_itl") or m.group == "throughput"):
            late = f" (send lag p99 {send_lag:,.0f} ms)" if send_lag is not None else ""
            out[key] = (f"the client fell behind{where}{late}: it did not deliver the load it was told to, so this "
                        "is the client's limit, not the engine's")
        elif m.reliability in ("client_timing", "client_itl") and starved:
            out[key] = (f"client starved of CPU{where} (loop lag p99 {lag:,.0f} ms): its times are late and "
                        "bunched; the engine-side figure is the one to trust")
        elif m.reliability == "client_itl" and bunched:
            out[key] = (f"tokens arrived bunched{where} (ITL p50 0 ms): the client read several tokens at once, "
                        "so ITL percentiles are not gaps between tokens")
        elif m.reliability == "tokens" and tokens_differ:
            out[key] = f"client and engine token counts differ{where}: the engine's count is the one to trust"
    return out


def headline_keys(available: Iterable[str], unreliable: Iterable[str], *, level: str | None = None) -> list[str]:
    """The figures to lead with, in order: each headline figure (its steady-window twin first,
    where there is one: ``STEADY_OF``), except that one flagged
    unreliable is preceded by its engine-side substitute (when the engine gave one). The
    unreliable client figure stays in the list (it is shown greyed, with its reason)."""
    have, bad = set(available), set(unreliable)
    prefix = f"{level}." if level else ""
    out: list[str] = []
    for base in HEADLINE:
        for name in (STEADY_OF.get(base), base):
            if name is None:
                continue
            key = prefix + name
            alt = BY_KEY[name].engine_alternative
            alt_key = prefix + alt if alt else None
            if key in bad and alt_key and alt_key in have and alt_key not in out:
                out.append(alt_key)
            if key in have and key not in out:
                out.append(key)
    return out
