"""A level's figures built up one request at a time, in bounded memory.

A long run must not keep every request as Python objects (a 10-minute soak at 1,000 streams is
some 700,000 requests and 70 million inter-token latencies). Each metric is a
:class:`Distribution`: its values are kept exactly, as a float32 array, up to a limit (2 million
ITLs, 1 million of each per-request figure: at most 28 MB for a whole level), which no ordinary run
reaches in a level; past it they are folded into a log-scale histogram whose percentiles are within 0.05% of
the exact ones, while count, mean, std, min and max stay exact. The store keeps every value
either way (``app.recording`` streams each record to it). The requests' times, which the proof
of the load delivered and the steady window need (``app.load.delivery.LevelTimes``), add 33
bytes a request: 23 MB for those 700,000.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from app.load.delivery import LevelTarget, LevelTimes, delivered, steady_window
from app.load.metrics import EngineDeltas, LevelSummary, RequestRecord, Stats, meets_slo, parse_slo

CHUNK_VALUES = 65_536
"""Values are appended into fixed-size chunks: memory grows smoothly, never by doubling."""
EXACT_PER_REQUEST = 1_000_000
EXACT_PER_TOKEN = 2_000_000
BINS_PER_OCTAVE = 1024
"""Histogram resolution past the exact limit: bin width 2**(1/1024) - 1 = 0.07%, so a percentile
(the bin's geometric centre) is within 0.034% of the exact value."""
MAX_ERROR_EXAMPLES = 5


class Distribution:
    """The values of one metric (see the module docstring for the memory bound)."""

    __slots__ = ("exact_limit", "_chunks", "_fill", "count", "_sum", "_sumsq", "_min", "_max", "_bins",
                 "_nonpositive")

    def __init__(self, exact_limit: int = EXACT_PER_REQUEST) -> None:
        self.exact_limit = exact_limit
        self._chunks: list[np.ndarray] = []
        self._fill = 0  # values in the last chunk
        self.count = 0
        self._sum = 0.0
        self._sumsq = 0.0
        self._min = math.inf
        self._max = -math.inf
        self._bins: dict[int, int] | None = None  # histogram mode: bin -> count
        self._nonpositive = 0  # histogram mode: values <= 0 (an ITL of a token that came in the first chunk)

    @property
    def exact(self) -> bool:
        return self._bins is None

    def add(self, value: float) -> None:
        self.extend(np.array((value,), dtype=np.float32))

    def extend(self, values: Sequence[float] | np.ndarray) -> None:
        arr = np.asarray(values, dtype=np.float32)
        if arr.size == 0:
            return
        wide = arr.astype(np.float64)
        self.count += int(arr.size)
        self._sum += float(wide.sum())
        self._sumsq += float(np.dot(wide, wide))
        self._min = min(self._min, float(wide.min()))
        self._max = max(self._max, float(wide.max()))
        if self._bins is not None:
            self._bin(arr)
            return
        if self.count > self.exact_limit:
            self._to_histogram()
            self._bin(arr)
            return
        start = 0
        while start < arr.size:
            if not self._chunks or self._fill == CHUNK_VALUES:
                self._chunks.append(np.empty(CHUNK_VALUES, dtype=np.float32))
                self._fill = 0
            take = min(CHUNK_VALUES - self._fill, arr.size - start)
            self._chunks[-1][self._fill:self._fill + take] = arr[start:start + take]
            self._fill += take
            start += take

    def values(self) -> np.ndarray:
        """The exact values (empty once folded into the histogram)."""
        if not self._chunks:
            return np.empty(0, dtype=np.float32)
        parts = self._chunks[:-1] + [self._chunks[-1][:self._fill]]
        return np.concatenate(parts)

    def _to_histogram(self) -> None:
        exact = self.values()
        self._chunks, self._fill, self._bins = [], 0, {}
        self._bin(exact)

    def _bin(self, arr: np.ndarray) -> None:
        assert self._bins is not None
        positive = arr[arr > 0]
        self._nonpositive += int(arr.size - positive.size)
        if positive.size:
            keys, counts = np.unique(np.floor(np.log2(positive.astype(np.float64)) * BINS_PER_OCTAVE).astype(np.int64),
                                     return_counts=True)
            bins = self._bins
            for key, n in zip(keys.tolist(), counts.tolist(), strict=True):
                bins[key] = bins.get(key, 0) + n

    def stats(self) -> Stats:
        """As ``Stats.of`` computes them (numpy's linear-interpolation percentiles), on the float32
        values in place: a float64 copy of millions of ITLs would double the memory of a level."""
        if self.count == 0:
            return Stats()
        if self._bins is None:
            arr = self.values()
            p50, p90, p95, p99 = (float(x) for x in np.percentile(arr, [50, 90, 95, 99]))
            mean = float(arr.mean(dtype=np.float64))
            std = float(arr.std(dtype=np.float64))
            return Stats(count=int(arr.size), mean=mean, median=p50, p90=p90, p95=p95, p99=p99,
                         max=float(arr.max()), min=float(arr.min()), std=std)
        mean = self._sum / self.count
        std = math.sqrt(max(self._sumsq / self.count - mean * mean, 0.0))
        p50, p90, p95, p99 = (self._percentile(q) for q in (50, 90, 95, 99))
        return Stats(count=self.count, mean=mean, median=p50, p90=p90, p95=p95, p99=p99, max=self._max,
                     min=self._min, std=std)

    def _percentile(self, q: float) -> float:
        assert self._bins is not None
        rank = q / 100 * (self.count - 1)  # the value at this 0-based rank, as np.percentile reads it
        seen = self._nonpositive
        if rank < seen:
            return min(0.0, self._max)
        for key in sorted(self._bins):
            seen += self._bins[key]
            if rank < seen:
                centre = 2.0 ** ((key + 0.5) / BINS_PER_OCTAVE)
                return min(max(centre, self._min), self._max)
        return self._max


class LevelAccumulator:
    """Running totals and distributions of one level; :meth:`summary` gives its LevelSummary
    (the one definition of a level's figures: :func:`summarize` goes through here)."""

    def __init__(self, slo: str | None = None) -> None:
        self.slo = slo
        self._slos = parse_slo(slo) if slo else None
        self.requests = 0
        self.completed = 0
        self.errors = 0
        self.cancelled = 0
        self.good = 0
        self.input_tokens = 0  # of completed requests (the engine's count where it reported one)
        self.output_tokens = 0  # of every request: the engine generated them, failed ones too
        self.completed_output_tokens = 0
        self.error_kinds: dict[str, int] = {}
        self.error_examples: list[str] = []
        self.sources: set[str] = set()
        self.ttft_ms = Distribution()
        self.itl_ms = Distribution(EXACT_PER_TOKEN)
        self.tpot_ms = Distribution()
        self.e2e_ms = Distribution()
        self.queue_ms = Distribution()
        self.ttfat_ms = Distribution()
        self.reasoning_itl_ms = Distribution(EXACT_PER_TOKEN)
        self.answer_itl_ms = Distribution(EXACT_PER_TOKEN)
        self.reasoning_tokens: int | None = None  # of completed requests; None: none reasoned
        self.reasoning_unfinished = 0
        self.times = LevelTimes()

    def add(self, r: RequestRecord) -> None:
        """Count one record (``itl_ms`` may be a list or a float32 array)."""
        self.requests += 1
        self.times.add(r)
        self.output_tokens += r.output_tokens
        if r.output_tokens:
            self.sources.add(r.tokens_source)
        if r.error_kind == "cancelled":
            self.cancelled += 1
            return
        self.queue_ms.add(r.queue_ms)
        if not r.ok:
            self.errors += 1
            kind = r.error_kind or "error"
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
            if r.error and r.error not in self.error_examples and len(self.error_examples) < MAX_ERROR_EXAMPLES:
                self.error_examples.append(r.error)
            return
        self.completed += 1
        self.completed_output_tokens += r.output_tokens
        self.input_tokens += r.input_tokens if r.input_tokens is not None else r.input_tokens_counted
        if r.ttft_ms is not None:
            self.ttft_ms.add(r.ttft_ms)
        if r.tpot_ms is not None:
            self.tpot_ms.add(r.tpot_ms)
        if r.e2e_ms is not None:
            self.e2e_ms.add(r.e2e_ms)
        if len(r.itl_ms):
            self.itl_ms.extend(r.itl_ms)
        if r.ttfat_ms is not None:
            self.ttfat_ms.add(r.ttfat_ms)
        if r.reasoning_tokens is not None:
            self._add_reasoning(r)
        if self._slos is not None and meets_slo(r, self._slos):
            self.good += 1

    def _add_reasoning(self, r: RequestRecord) -> None:
        """A reasoning request's tokens and ITLs by phase: ``itl_ms[i]`` is the gap before token
        ``i + 1``, so the reasoning's are those before its last token, the answer's those after
        its first (the gap between the two phases is in neither)."""
        reasoning = r.reasoning_tokens or 0
        self.reasoning_tokens = (self.reasoning_tokens or 0) + reasoning
        if r.reasoning_unfinished:
            self.reasoning_unfinished += 1
        itl = r.itl_ms
        if reasoning > 1:
            self.reasoning_itl_ms.extend(itl[:reasoning - 1])
        if not r.reasoning_unfinished and len(itl) > reasoning:
            self.answer_itl_ms.extend(itl[reasoning:])

    def summary(self, duration_s: float, *, peak_concurrency: int = 0, lengths_exact: bool = True,
                engine: EngineDeltas | None = None, stop_reason: str = "completed",
                client_lag_ms: Sequence[float] | np.ndarray = (), target: LevelTarget | None = None,
                planned_requests: int | None = None) -> LevelSummary:
        """The level's figures; with its ``target``, also what the client delivered of it and the
        steady window (``app.load.delivery``)."""
        dur = max(duration_s, 1e-9)
        sources = set(self.sources)
        out = LevelSummary(
            requests=self.requests, completed=self.completed, errors=self.errors, cancelled=self.cancelled,
            error_kinds=dict(self.error_kinds), error_examples=list(self.error_examples), duration_s=duration_s,
            input_tokens=self.input_tokens, output_tokens=self.output_tokens,
            request_throughput_rps=self.completed / dur, output_tok_per_s=self.completed_output_tokens / dur,
            total_tok_per_s=(self.completed_output_tokens + self.input_tokens) / dur,
            ttft_ms=self.ttft_ms.stats(), itl_ms=self.itl_ms.stats(), tpot_ms=self.tpot_ms.stats(),
            e2e_ms=self.e2e_ms.stats(), queue_ms=self.queue_ms.stats(), peak_concurrency=peak_concurrency,
            client_lag_ms=Stats.of(np.asarray(client_lag_ms, dtype=float)),
            tokens_source=sources.pop() if len(sources) == 1 else ("mixed" if sources else "usage"),
            lengths_exact=lengths_exact, engine=engine or EngineDeltas(), stop_reason=stop_reason)
        if self.reasoning_tokens is not None:  # TTFAT is TTFT where nothing reasoned: not shown twice
            out.ttfat_ms = self.ttfat_ms.stats()
            out.reasoning_tokens = self.reasoning_tokens
            out.answer_tokens = self.completed_output_tokens - self.reasoning_tokens
            out.reasoning_unfinished = self.reasoning_unfinished
            out.reasoning_itl_ms, out.answer_itl_ms = self.reasoning_itl_ms.stats(), self.answer_itl_ms.stats()
        if self.slo:
            out.slo, out.good_requests, out.goodput_rps = self.slo, self.good, self.good / dur
        if engine is not None and engine.generation_tokens is not None:
            out.tokens_match_engine = int(round(engine.generation_tokens)) == self.output_tokens
        if target is not None:
            out.delivered = delivered(self.times, target, planned_requests)
            out.steady, out.steady_note = steady_window(self.times, target, duration_s, planned_requests)
        return out


def summarize(records: Iterable[RequestRecord], duration_s: float, *, slo: str | None = None,
              peak_concurrency: int = 0, lengths_exact: bool = True,
              engine: EngineDeltas | None = None, stop_reason: str = "completed",
              client_lag_ms: Sequence[float] = ()) -> LevelSummary:
    """The figures of one level from its request records (see docs/metrics.md). The runner
    builds them one record at a time (:class:`LevelAccumulator`); this is the same
    computation over a list."""
    acc = LevelAccumulator(slo)
    for r in records:
        acc.add(r)
    return acc.summary(duration_s, peak_concurrency=peak_concurrency, lengths_exact=lengths_exact, engine=engine,
                       stop_reason=stop_reason, client_lag_ms=client_lag_ms)


# --- what a person should know about a level ---------------------------------------------------
