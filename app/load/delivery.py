"""Proof of the load delivered, and the level's steady state, from its requests' times.

A level's figures are the engine's only if the client sent what it was told to. In an open loop
the proof is the send lag (when each request went out against when it was due) and the rate
achieved; in a closed loop it is the concurrency held. Latencies measured from the send time
hide a stall that held requests back in the client (coordinated omission), so an open loop's are
also measured from the time each request was due.

A level's throughput over its whole length includes the ramp-up (the first replies not back yet,
or a closed loop's workers still starting) and the drain (the last requests finishing alone).
The steady window leaves both out: a closed loop's is where the requests in flight are within
``STEADY_TOLERANCE`` of the target; an open loop's runs from one median E2E after the first send
(the first replies are back) to the last send, while arrivals keep their rate. A ramp of rates
has none, nor has a trace's replay (its arrivals are the trace's).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from app.load.metrics import LoadDelivered, RequestRecord, Stats, SteadyWindow
from app.workload import Arrival, LoadPattern, arrival_of

SEND_LAG_BOUND_MS = 50.0
"""A level whose client-side send lag p99 (due -> sent, apart from waiting for the in-flight cap)
is above this fell behind: its requests went out late enough to change what the engine saw."""
STEADY_TOLERANCE = 0.10
"""A closed loop is steady while its requests in flight are within 10% of the target."""
MIN_STEADY_SHARE = 0.25
"""A steady window shorter than a quarter of the level is no steady state worth reporting."""
TOKEN_BIN_S = 0.05
"""Output tokens are counted in time bins this wide, to count the ones inside a window."""


@dataclass(frozen=True)
class LevelTarget:
    """What a level was told to deliver (from its ``LevelPlan``)."""

    mode: str  # closed | open
    concurrency: int | None = None  # closed: in flight; open: the cap, if any
    rate_rps: float | None = None
    arrival: Arrival = LoadPattern.POISSON  # open loop only
    ramp_up_s: float = 0.0  # closed: the workers start evenly over this long

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrival", arrival_of(self.arrival))  # its name is taken too


class LevelTimes:
    """The times of a level's requests, one record at a time, as compact float32 columns (20
    bytes a request) and a histogram of when output tokens arrived."""

    def __init__(self) -> None:
        self.scheduled_s, self.start_s, self.end_s = array("f"), array("f"), array("f")
        self.queue_ms, self.cap_wait_ms = array("f"), array("f")
        self.ok = array("b")
        self.ttft_ms, self.tpot_ms, self.e2e_ms = array("f"), array("f"), array("f")
        self._token_bins = np.zeros(0, dtype=np.float64)

    def add(self, r: RequestRecord) -> None:
        """Count one record (a cancelled request never counts: it was not part of the load)."""
        if r.error_kind == "cancelled":
            return
        nan = math.nan
        self.scheduled_s.append(r.scheduled_s)
        self.start_s.append(r.start_s)
        self.end_s.append(r.start_s + r.e2e_ms / 1e3 if r.e2e_ms is not None else nan)
        self.queue_ms.append(r.queue_ms)
        self.cap_wait_ms.append(r.cap_wait_ms)
        self.ok.append(1 if r.ok else 0)
        self.ttft_ms.append(r.ttft_ms if r.ok and r.ttft_ms is not None else nan)
        self.tpot_ms.append(r.tpot_ms if r.ok and r.tpot_ms is not None else nan)
        self.e2e_ms.append(r.e2e_ms if r.ok and r.e2e_ms is not None else nan)
        if r.ok and r.output_tokens and r.ttft_ms is not None:
            self._add_tokens(r)

    def _add_tokens(self, r: RequestRecord) -> None:
        """The request's output tokens at the times they arrived: the first at its TTFT, the
        others one inter-token latency apart (weighted so they sum to its token count)."""
        gaps = np.asarray(r.itl_ms, dtype=np.float64)
        times = r.start_s + (r.ttft_ms or 0.0) / 1e3 + np.concatenate(([0.0], np.cumsum(gaps) / 1e3))
        idx = np.maximum((times / TOKEN_BIN_S).astype(np.int64), 0)
        top = int(idx.max()) + 1
        if top > self._token_bins.size:
            grown = np.zeros(max(top, 2 * self._token_bins.size), dtype=np.float64)
            grown[:self._token_bins.size] = self._token_bins
            self._token_bins = grown
        np.add.at(self._token_bins, idx, r.output_tokens / times.size)

    def __len__(self) -> int:
        return len(self.start_s)

    def tokens_between(self, start_s: float, end_s: float) -> float:
        """Output tokens of completed requests that arrived inside ``[start_s, end_s]`` (the
        edge bins counted by the share of them inside)."""
        bins = self._token_bins
        if bins.size == 0 or end_s <= start_s:
            return 0.0
        edges = np.arange(bins.size + 1) * TOKEN_BIN_S
        inside = np.clip(np.minimum(edges[1:], end_s) - np.maximum(edges[:-1], start_s), 0.0, TOKEN_BIN_S)
        return float(np.dot(bins, inside / TOKEN_BIN_S))

    def column(self, name: str) -> np.ndarray:
        return np.frombuffer(getattr(self, name), dtype=np.float32).astype(np.float64)


def _stats(values: np.ndarray) -> Stats:
    return Stats.of(values[np.isfinite(values)])


def _in_flight_average(starts: np.ndarray, ends: np.ndarray, t0: float, t1: float) -> float:
    """Requests in flight, averaged over ``[t0, t1]``: the time each spent in flight inside it
    over the window's length (Little's law, exactly)."""
    if t1 <= t0:
        return 0.0
    ends = np.where(np.isfinite(ends), ends, t1)
    overlap = np.clip(np.minimum(ends, t1) - np.maximum(starts, t0), 0.0, None)
    return float(overlap.sum() / (t1 - t0))


def delivered(times: LevelTimes, target: LevelTarget, planned_requests: int | None = None) -> LoadDelivered:
    """What the client delivered of ``target``, and whether it fell behind."""
    out = LoadDelivered(mode=target.mode, lag_bound_ms=SEND_LAG_BOUND_MS)
    if len(times) == 0:
        return out
    starts, scheduled = times.column("start_s"), times.column("scheduled_s")
    queue, cap_wait = times.column("queue_ms"), times.column("cap_wait_ms")
    send_lag = np.maximum(queue - cap_wait, 0.0)
    out.send_lag_ms = _stats(send_lag)
    if target.mode == "open":
        out.intended_rate_rps = target.rate_rps
        n = starts.size
        if n > 1:
            sched_span, sent_span = float(scheduled.max() - scheduled.min()), float(starts.max() - starts.min())
            out.scheduled_rate_rps = (n - 1) / sched_span if sched_span > 0 else None
            out.achieved_rate_rps = (n - 1) / sent_span if sent_span > 0 else None
        if target.concurrency:
            out.cap_wait_ms = _stats(cap_wait)
            out.intended_concurrency = target.concurrency
        out.ttft_intended_ms = _stats(times.column("ttft_ms") + queue)
        out.e2e_intended_ms = _stats(times.column("e2e_ms") + queue)
        lag_p99 = out.send_lag_ms.p99
        if lag_p99 is not None and lag_p99 > SEND_LAG_BOUND_MS:
            out.fell_behind = True
            out.reason = (f"the client fell behind: its requests went out {lag_p99:,.0f} ms late at p99 "
                          f"(bound {SEND_LAG_BOUND_MS:,.0f} ms)"
                          + (f", {out.achieved_rate_rps:,.2f} req/s of {out.scheduled_rate_rps:,.2f} scheduled"
                             if out.achieved_rate_rps and out.scheduled_rate_rps else ""))
        return out
    wanted = target.concurrency or 1
    if planned_requests is not None:
        wanted = max(1, min(wanted, planned_requests))
    out.intended_concurrency = wanted
    # While it was sending at its target: after the ramp-up, until the last request went out (or,
    # when every request went out at once, until the first came back).
    ends = times.column("end_s")
    first_end = float(np.nanmin(ends)) if np.isfinite(ends).any() else float(starts.max())
    t0, t1 = float(starts.min()) + target.ramp_up_s, max(float(starts.max()), first_end)
    if t1 - t0 <= 0:
        return out
    out.achieved_concurrency = _in_flight_average(starts, ends, t0, t1)
    if out.achieved_concurrency < (1 - STEADY_TOLERANCE) * wanted:
        out.fell_behind = True
        out.reason = (f"the client fell behind: it kept {out.achieved_concurrency:,.1f} requests in flight of the "
                      f"{wanted:,} asked")
    return out


def steady_window(times: LevelTimes, target: LevelTarget, duration_s: float,
                  planned_requests: int | None = None) -> tuple[SteadyWindow | None, str | None]:
    """The level's steady window and its figures, or None and why it has none."""
    if len(times) < 2 or duration_s <= 0:
        return None, "too few requests for a steady state"
    starts, ends = times.column("start_s"), times.column("end_s")
    e2e = times.column("e2e_ms")
    if target.mode == "open":
        if target.arrival.unsteady is not None:
            return None, target.arrival.unsteady
        settle_s = float(np.nanmedian(e2e)) / 1e3 if np.isfinite(e2e).any() else 0.0
        t0, t1 = float(starts.min()) + settle_s, float(starts.max())
        rule = "from one median E2E after the first send (the first replies back) to the last send"
    else:
        wanted = max(1, min(target.concurrency or 1, planned_requests or len(times)))
        threshold = math.ceil((1 - STEADY_TOLERANCE) * wanted - 1e-9)
        t0, t1 = _held(starts, ends, threshold)
        rule = f"while at least {threshold:,} of the {wanted:,} requests asked were in flight (within 10%)"
    if not (t1 > t0) or (t1 - t0) < MIN_STEADY_SHARE * duration_s:
        held = max(t1 - t0, 0.0)
        return None, f"the load held its target for {held:,.1f} s of the level's {duration_s:,.1f} s"
    started_inside = (starts >= t0) & (starts <= t1)
    done = np.frombuffer(times.ok, dtype=np.int8).astype(bool)
    ended_inside = done & np.isfinite(ends) & (ends >= t0) & (ends <= t1)
    length = t1 - t0
    window = SteadyWindow(
        start_s=t0, end_s=t1, rule=rule, requests=int((started_inside & done).sum()),
        mean_in_flight=_in_flight_average(starts, ends, t0, t1),
        output_tok_per_s=times.tokens_between(t0, t1) / length,
        request_throughput_rps=float(ended_inside.sum()) / length,
        ttft_ms=_stats(times.column("ttft_ms")[started_inside]),
        tpot_ms=_stats(times.column("tpot_ms")[started_inside]),
        e2e_ms=_stats(e2e[started_inside]))
    return window, None


def _held(starts: np.ndarray, ends: np.ndarray, threshold: int) -> tuple[float, float]:
    """The first moment at least ``threshold`` requests were in flight, and the last moment
    they still were (the requests in flight as a step function of their sends and ends)."""
    ends = np.where(np.isfinite(ends), ends, starts)
    t = np.concatenate((starts, ends))
    step = np.concatenate((np.ones(starts.size), -np.ones(ends.size)))
    order = np.lexsort((-step, t))  # at equal times a send counts before an end
    t, level = t[order], np.cumsum(step[order])
    at_target = np.flatnonzero(level >= threshold)
    if at_target.size == 0:
        return 0.0, 0.0
    first, last = int(at_target[0]), int(at_target[-1])
    return float(t[first]), float(t[last + 1]) if last + 1 < t.size else float(t[last])
