"""The request summary: the one definition of every figure computed from request records, used by
the runner (``app.load.aggregate.summarize``, for the live result, the CLI table and ``--json``) and
by the store (``app.store.RunStore.metrics_of``, for History, Compare and every export), so a figure
has the same value under the same name wherever it is shown.

The store keeps the figures of each finished run (``app.store.RunStore.metrics_of``), computed
here: it stores, it does not compute. The names, units and directions of the figures are in
``app.analysis.metric_catalog``.

Definitions (docs/metrics.md has the long form):

- **Duration** of a level: from the level's start until its last request ended. The runner
  measures it (monotonic clock) and records it with the level; a level whose end was never
  recorded (an interrupted run) gets it from wall-clock times (level start, request ends); a
  run with no level start at all (an import) from the span of its requests. A run's duration is
  the sum of its levels' durations, so time between levels (settling, warm-up) never dilutes it.
- **Throughput**: tokens or requests of *completed* requests / duration.
- **Latencies** over completed requests; ITL pools every token of every request; TPOT =
  (E2E - TTFT) / (output tokens - 1) for requests with more than one token. Percentiles are
  numpy's linear interpolation (as ``vllm bench serve``).
- **Failed** requests are those not completed and not cancelled; the error rate is failed /
  (requests - cancelled).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.analysis.metric_catalog import unreliable_figures
from db.records import RequestArrays

PERCENTILES = (50, 90, 95, 99)


def distribution(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """count, mean, p50, p90, p95, p99, max, min, std of the finite values (empty when none)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {}
    pcts = np.percentile(arr, PERCENTILES)
    out = {"count": float(arr.size), "mean": float(arr.mean())}
    out.update({f"p{p}": float(v) for p, v in zip(PERCENTILES, pcts, strict=True)})
    out.update({"max": float(arr.max()), "min": float(arr.min()), "std": float(arr.std())})
    return out


_SHOWN_STATS = ("mean", *(f"p{p}" for p in PERCENTILES))


def _stats(prefix: str, values: np.ndarray, out: dict[str, float]) -> None:
    # float32, as the runner's accumulators (app.load.aggregate) and the store's ITL chunks keep
    # values: the same inputs give the same percentiles on every face.
    dist = distribution(np.asarray(values).astype(np.float32))
    for stat in _SHOWN_STATS:
        if stat in dist:
            out[f"{prefix}_{stat}"] = dist[stat]


def request_span_s(req: RequestArrays) -> float | None:
    """First send -> last end over the requests (for runs without a level start)."""
    starts = req.start_wall[np.isfinite(req.start_wall)] if len(req) else np.empty(0)
    if starts.size == 0:
        return None
    return float(np.nanmax(request_ends(req)) - starts.min())


def request_ends(req: RequestArrays) -> np.ndarray:
    """Wall-clock end of each request (its start when it has no E2E, e.g. failed)."""
    return req.start_wall + np.nan_to_num(req.e2e_ms, nan=0.0) / 1000.0


def summarize_requests(req: RequestArrays, duration_s: float | None = None) -> dict[str, float]:
    """Latency percentiles, throughput and errors of a set of requests (names are catalogue keys).
    ``duration_s`` is the measured duration (see the module docstring); None falls back to the
    span of the requests."""
    out: dict[str, float] = {}
    total = len(req)
    if total == 0:
        return out
    ok = req.ok
    cancelled = req.cancelled & ~ok
    failed = ~ok & ~cancelled
    finished = total - int(cancelled.sum())
    out["requests_total"] = float(total)
    out["requests_completed"] = float(ok.sum())
    out["requests_failed"] = float(failed.sum())
    out["requests_cancelled"] = float(cancelled.sum())
    out["error_rate_pct"] = 100.0 * float(failed.sum()) / finished if finished else 0.0
    _stats("ttft_ms", req.ttft_ms[ok], out)
    _stats("e2e_ms", req.e2e_ms[ok], out)
    if req.itl_flat.size:
        itl_ok = req.itl_flat if ok.all() else req.itl_flat[np.repeat(ok, np.diff(req.itl_bounds))]
        _stats("itl_ms", itl_ok, out)
    multi = ok & (req.output_tokens > 1) & np.isfinite(req.e2e_ms) & np.isfinite(req.ttft_ms)
    if multi.any():
        _stats("tpot_ms", (req.e2e_ms[multi] - req.ttft_ms[multi]) / (req.output_tokens[multi] - 1), out)
    if req.queue_ms is not None:
        _stats("queue_ms", req.queue_ms[~cancelled], out)
    out["output_tokens_total"] = float(np.nansum(req.output_tokens[ok]))
    out["input_tokens_total"] = float(np.nansum(req.input_tokens[ok]))
    if duration_s is None:
        duration_s = request_span_s(req)
    if duration_s is not None and duration_s > 0:
        out["duration_s"] = float(duration_s)
        out["output_tok_per_s"] = out["output_tokens_total"] / duration_s
        out["total_tok_per_s"] = (out["output_tokens_total"] + out["input_tokens_total"]) / duration_s
        out["requests_per_s"] = float(ok.sum()) / duration_s
    return out


# --- what the runner recorded with each level --------------------------------------------------------

class LevelLike(Protocol):
    """A stored level (``db.store.LevelInfo``): what this module needs of it."""

    idx: int
    label: str
    started_at: float | None
    summary: dict[str, Any] | None


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


_ENGINE_KEYS = ("engine_ttft_ms_mean", "engine_itl_ms_mean", "engine_e2e_ms_mean", "engine_queue_ms_mean",
                "prefix_cache_hit_rate", "spec_acceptance_rate", "spec_mean_acceptance_length",
                "engine_tokens_per_step_mean", "preemptions")
_NESTED = {"ttft_ms": "ttft_ms", "itl_ms": "itl_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_ms", "queue_ms": "queue_ms",
           "ttfat_ms": "ttfat_ms", "reasoning_itl_ms": "reasoning_itl_ms", "answer_itl_ms": "answer_itl_ms"}
_STAT_NAMES = {"mean": "mean", "median": "p50", "p90": "p90", "p95": "p95", "p99": "p99"}


def level_summary_figures(summary: Mapping[str, Any] | None) -> dict[str, float]:
    """A level summary as the runner records it (``LevelSummary``, nested) as catalogue keys.
    Engine-side figures, client lag, goodput and queueing exist only here (they do not come from
    request rows); ``engine_output_tok_per_s`` is the engine's token counter over the level's
    duration."""
    if not summary:
        return {}
    out: dict[str, float] = {}
    for src, dst in (("output_tok_per_s", "output_tok_per_s"), ("total_tok_per_s", "total_tok_per_s"),
                     ("request_throughput_rps", "requests_per_s"), ("goodput_rps", "goodput_rps"),
                     ("duration_s", "duration_s"), ("requests", "requests_total"), ("errors", "requests_failed"),
                     ("cancelled", "requests_cancelled"), ("completed", "requests_completed"),
                     ("input_tokens", "input_tokens_total"),
                     ("reasoning_tokens", "reasoning_tokens_total"), ("answer_tokens", "answer_tokens_total"),
                     ("trace_prefix_reuse", "trace_prefix_reuse"),
                     ("tokens_match_engine", "tokens_match_engine")):
        if (v := _num(summary.get(src))) is not None:
            out[dst] = v
    for name, base in _NESTED.items():
        stats = summary.get(name)
        if isinstance(stats, Mapping):
            for stat, suffix in _STAT_NAMES.items():
                if (v := _num(stats.get(stat))) is not None:
                    out[f"{base}_{suffix}"] = v
    if summary.get("reasoning_tokens") is not None and (v := _num(summary.get("reasoning_unfinished"))) is not None:
        out["requests_reasoning_unfinished"] = v
    lag = summary.get("client_lag_ms")
    if isinstance(lag, Mapping) and (v := _num(lag.get("p99"))) is not None:
        out["client_lag_ms_p99"] = v
    out.update(_delivery_figures(summary))
    engine = summary.get("engine")
    if isinstance(engine, Mapping):
        for key in _ENGINE_KEYS:
            if (v := _num(engine.get(key))) is not None:
                out[key] = v
        tokens, duration = _num(engine.get("generation_tokens")), out.get("duration_s")
        if tokens is not None and duration:
            out["engine_output_tok_per_s"] = tokens / duration
    return out


def _delivery_figures(summary: Mapping[str, Any]) -> dict[str, float]:
    """What the client delivered of a level's load, and its steady window (``app.load.delivery``)."""
    out: dict[str, float] = {}
    delivered = summary.get("delivered")
    if isinstance(delivered, Mapping):
        for src, dst in (("fell_behind", "client_fell_behind"), ("intended_rate_rps", "intended_rate_rps"),
                         ("achieved_rate_rps", "achieved_rate_rps"),
                         ("intended_concurrency", "intended_concurrency"),
                         ("achieved_concurrency", "achieved_concurrency")):
            if (v := _num(delivered.get(src))) is not None:
                out[dst] = v
        for name, stats_of in (("send_lag_ms", ("p99",)), ("ttft_intended_ms", ("p50", "p99")),
                               ("e2e_intended_ms", ("p50", "p99"))):
            stats = delivered.get(name)
            if isinstance(stats, Mapping):
                for stat in stats_of:
                    if (v := _num(stats.get("median" if stat == "p50" else stat))) is not None:
                        out[f"{name}_{stat}"] = v
    steady = summary.get("steady")
    if isinstance(steady, Mapping):
        for src, dst in (("output_tok_per_s", "steady_output_tok_per_s"),
                         ("request_throughput_rps", "steady_requests_per_s")):
            if (v := _num(steady.get(src))) is not None:
                out[dst] = v
        start, end = _num(steady.get("start_s")), _num(steady.get("end_s"))
        if start is not None and end is not None:
            out["steady_duration_s"] = end - start
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            stats = steady.get(name)
            if isinstance(stats, Mapping):
                for stat in ("p50", "p99"):
                    if (v := _num(stats.get("median" if stat == "p50" else stat))) is not None:
                        out[f"steady_{name}_{stat}"] = v
    return out


def _weighted(levels: Sequence[Mapping[str, Any]], key: str, weight: Any) -> float | None:
    """Mean of an engine mean over levels, weighted by what it averaged (None if any is unknown)."""
    total = wsum = 0.0
    for lv in levels:
        engine = lv.get("engine") if isinstance(lv.get("engine"), Mapping) else None
        value = _num(engine.get(key)) if engine else None
        w = weight(engine) if engine else None
        if value is None or w is None:
            continue
        total += value * w
        wsum += w
    return total / wsum if wsum > 0 else None


def _engine_sum(summaries: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [_num((s.get("engine") or {}).get(key)) if isinstance(s.get("engine"), Mapping) else None
              for s in summaries]
    return None if not values or any(v is None for v in values) else float(sum(v for v in values if v is not None))


def _pooled_level_figures(summaries: Sequence[Mapping[str, Any]], duration_s: float | None) -> dict[str, float]:
    """Engine-side and runner-only figures of a run with several levels, pooled correctly
    (means weighted by what they average, rates from summed counters)."""
    out: dict[str, float] = {}

    def finished(e: Mapping[str, Any]) -> float | None:
        return _num(e.get("requests_finished"))

    def decode_tokens(e: Mapping[str, Any]) -> float | None:
        gen, req = _num(e.get("generation_tokens")), _num(e.get("requests_finished"))
        return None if gen is None or req is None else max(gen - req, 0.0)

    for key, weight in (("engine_ttft_ms_mean", finished), ("engine_e2e_ms_mean", finished),
                        ("engine_queue_ms_mean", finished), ("engine_itl_ms_mean", decode_tokens)):
        if (v := _weighted(summaries, key, weight)) is not None:
            out[key] = v
    hits, queries = _engine_sum(summaries, "prefix_cache_hits"), _engine_sum(summaries, "prefix_cache_queries")
    if hits is not None and queries:
        out["prefix_cache_hit_rate"] = hits / queries
    acc, draft = _engine_sum(summaries, "spec_decode_accepted_tokens"), _engine_sum(summaries, "spec_decode_draft_tokens")
    if acc is not None and draft:
        out["spec_acceptance_rate"] = acc / draft
    drafts = _engine_sum(summaries, "spec_decode_drafts")
    if acc is not None and drafts:
        out["spec_mean_acceptance_length"] = 1.0 + acc / drafts
    if (pre := _engine_sum(summaries, "preemptions")) is not None:
        out["preemptions"] = pre
    gen = _engine_sum(summaries, "generation_tokens")
    if gen is not None and duration_s:
        out["engine_output_tok_per_s"] = gen / duration_s
    good = [_num(s.get("good_requests")) for s in summaries]
    if good and all(g is not None for g in good) and duration_s:
        out["goodput_rps"] = sum(g for g in good if g is not None) / duration_s
    lags = [v for s in summaries if (v := level_summary_figures(s).get("client_lag_ms_p99")) is not None]
    if lags:
        out["client_lag_ms_p99"] = max(lags)  # the worst level: what starvation is judged on
    matches = [_num(s.get("tokens_match_engine")) for s in summaries]
    if matches and all(m is not None for m in matches):
        out["tokens_match_engine"] = float(all(matches))
    delivery = [_delivery_figures(s) for s in summaries]
    behind = [d["client_fell_behind"] for d in delivery if "client_fell_behind" in d]
    if behind:
        out["client_fell_behind"] = max(behind)  # one level the client could not deliver taints the run's figures
    send_lags = [d["send_lag_ms_p99"] for d in delivery if "send_lag_ms_p99" in d]
    if send_lags:
        out["send_lag_ms_p99"] = max(send_lags)
    windows = [(d["steady_output_tok_per_s"], d["steady_requests_per_s"], d["steady_duration_s"]) for d in delivery
               if {"steady_output_tok_per_s", "steady_requests_per_s", "steady_duration_s"} <= d.keys()]
    if delivery and len(windows) == len(delivery) and (steady_s := sum(w[2] for w in windows)) > 0:
        # Every level was steady for a while: the run's steady rates pool the windows.
        out["steady_output_tok_per_s"] = sum(w[0] * w[2] for w in windows) / steady_s
        out["steady_requests_per_s"] = sum(w[1] * w[2] for w in windows) / steady_s
        out["steady_duration_s"] = steady_s
    return out


def level_extras(levels: Sequence[LevelLike], duration_s: float | None) -> dict[str, float]:
    """Run-level figures that only the recorded levels hold (engine side, client lag, goodput,
    queueing): one level's as they are, several pooled (``_pooled_level_figures``)."""
    summaries = [lv.summary for lv in levels if lv.summary]
    if not summaries:
        return {}
    if len(levels) == 1:
        return level_summary_figures(summaries[0])
    return _pooled_level_figures(summaries, duration_s)


def level_duration_s(req: RequestArrays, level: LevelLike | None) -> float | None:
    """A level's duration (module docstring): recorded, else level start -> last end, else span."""
    if level is not None:
        recorded = _num((level.summary or {}).get("duration_s"))
        if recorded is not None and recorded > 0:
            return recorded
        if level.started_at is not None and len(req):
            ends = request_ends(req)
            if np.isfinite(ends).any():
                return max(float(np.nanmax(ends)) - level.started_at, 0.0) or None
    return request_span_s(req)


@dataclass
class RunFigures:
    """A run's figures (catalogue keys; per level as ``L<idx>.<key>`` when it has several) and
    the client figures judged unreliable, with the reason."""

    figures: dict[str, float]
    unreliable: dict[str, str]


def level_label(level: LevelLike | None, idx: int) -> str:
    return f"level {level.label or idx}" if level is not None else f"level {idx}"


def judge_levels(levels: Sequence[LevelLike], figures: Mapping[str, float]) -> dict[str, str]:
    """Unreliable client figures of a run: per level from that level's own record; a run-level
    figure pools every level, so it is unreliable when any level's is."""
    out: dict[str, str] = {}
    several = len(levels) > 1
    for lv in levels:
        level_figs = level_summary_figures(lv.summary)
        if not level_figs:
            continue
        label = level_label(lv, lv.idx) if several else ""
        flags = unreliable_figures(level_figs, level_label=label)
        for key, reason in flags.items():
            if several:
                out[f"L{lv.idx}.{key}"] = reason
            if key not in out:
                out[key] = reason
    # Also judge the pooled figures themselves (e.g. an ITL p50 of 0 over the whole run).
    for key, reason in unreliable_figures(figures).items():
        out.setdefault(key, reason)
    return {k: v for k, v in out.items() if k in figures}


def run_figures(req: RequestArrays, levels: Sequence[LevelLike] = ()) -> RunFigures:
    """Every figure of a run from its request rows and its recorded levels, and their reliability.

    A level the runner finished carries its own figures (same definitions, computed as the run
    went, at full precision): when they describe the same requests as the stored rows (same
    count), they are used as they are, so the CLI table, ``--json`` and Compare show the very same
    numbers. Request rows give what the runner could not: figures
    pooled over several levels, levels it never finished (an interrupted run) and imports."""
    by_idx = {lv.idx: lv for lv in levels}
    idxs = sorted({int(x) for x in req.level[np.isfinite(req.level)]} | set(by_idx)) if len(req) else sorted(by_idx)
    durations: dict[int, float | None] = {}
    per_level: dict[int, dict[str, float]] = {}
    for idx in idxs:
        sel = req.select(req.level == idx) if len(req) else req
        durations[idx] = level_duration_s(sel, by_idx.get(idx))
        level_figs = summarize_requests(sel, durations[idx])
        runner = level_summary_figures(by_idx[idx].summary if idx in by_idx else None)
        if runner.get("requests_total") == level_figs.get("requests_total", runner.get("requests_total")):
            level_figs.update(runner)  # the runner's figures of the very same requests win
        else:  # the rows are not the requests it summarised (some were lost): the rows decide
            for key, value in runner.items():
                level_figs.setdefault(key, value)
        per_level[idx] = level_figs
    if len(idxs) == 1:
        figures = dict(per_level[idxs[0]])
    else:
        known = [d for d in durations.values() if d is not None]
        run_duration = sum(known) if known and len(known) == len(durations) else None
        figures = summarize_requests(req, run_duration)
        for key, value in level_extras(levels, figures.get("duration_s")).items():
            figures.setdefault(key, value)
        for idx in idxs:
            figures.update({f"L{idx}.{k}": v for k, v in per_level[idx].items()})
    return RunFigures(figures, judge_levels(levels, figures))


def stored_metrics(req: RequestArrays, levels: Sequence[LevelLike] = ()) -> dict[str, Any]:
    """What the store keeps as a run's metrics: the figures, plus ``unreliable`` (key -> reason)."""
    result = run_figures(req, levels)
    out: dict[str, Any] = dict(result.figures)
    if result.unreliable:
        out["unreliable"] = result.unreliable
    return out


def numbers(values: Mapping[str, Any], keys: Iterable[str] | None = None) -> dict[str, float]:
    """The finite numbers of a mapping (bools and text dropped)."""
    wanted = None if keys is None else set(keys)
    return {k: float(v) for k, v in values.items()
            if (wanted is None or k in wanted) and not isinstance(v, bool) and isinstance(v, int | float)
            and math.isfinite(v)}

