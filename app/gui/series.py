"""Live time series for the dashboard: preallocated NumPy ring buffers fed from bus Samples,
and the plot layout (which sample values go on which plot). No Qt here, so the data side is
unit-tested and benchmarked on its own."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from app.bus import Sample

HISTORY_S = 3600.0
RATE_HZ = 10.0
DEFAULT_CAPACITY = int(HISTORY_S * RATE_HZ)


class Ring:
    """A fixed-capacity (t, v) series. Every point is written twice (at i and i + capacity), so
    the last ``n`` points are always one contiguous slice: ``view`` never copies."""

    __slots__ = ("capacity", "_t", "_v", "_head", "_n", "version", "total")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._t = np.zeros(2 * capacity, dtype=np.float64)
        self._v = np.zeros(2 * capacity, dtype=np.float64)
        self._head = 0
        self._n = 0
        self.version = 0
        self.total = 0  # points ever appended: the absolute index of the next point

    def append(self, t: float, v: float) -> None:
        i = self._head
        self._t[i] = self._t[i + self.capacity] = t
        self._v[i] = self._v[i + self.capacity] = v
        self._head = (i + 1) % self.capacity
        self._n = min(self._n + 1, self.capacity)
        self.version += 1
        self.total += 1

    def extend(self, t: np.ndarray, v: np.ndarray) -> None:
        """Append many points at once (vectorised; keeps only the newest ``capacity``)."""
        t = np.asarray(t, dtype=np.float64)[-self.capacity:]
        v = np.asarray(v, dtype=np.float64)[-self.capacity:]
        idx = (self._head + np.arange(len(t))) % self.capacity
        self._t[idx] = self._t[idx + self.capacity] = t
        self._v[idx] = self._v[idx + self.capacity] = v
        self._head = (self._head + len(t)) % self.capacity
        self._n = min(self._n + len(t), self.capacity)
        self.version += 1
        self.total += len(t)

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        start = self._head - self._n if self._n < self.capacity else self._head
        return self._t[start:start + self._n], self._v[start:start + self._n]

    def last(self) -> float | None:
        return float(self._v[(self._head - 1) % self.capacity]) if self._n else None

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        self._head = self._n = 0
        self.version += 1
        self.total = 0


_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def peak_decimate(t: np.ndarray, v: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep each block's min and max (so spikes survive) when there are more points than pixels."""
    ds = len(t) // max(max_points // 2, 1)
    if ds < 2:
        return t, v
    n = len(t) // ds * ds
    blocks = v[len(t) - n:].reshape(-1, ds)
    out_v = np.empty(2 * blocks.shape[0])
    out_v[0::2] = blocks.min(axis=1)
    out_v[1::2] = blocks.max(axis=1)
    out_t = np.repeat(t[len(t) - n::ds], 2)
    return out_t, out_v


class Decimator:
    """Peak decimation of a growing :class:`Ring`, kept up to date incrementally: blocks of a
    power-of-two size aligned to absolute sample numbers are reduced once and cached, so a
    refresh only reduces the blocks completed since the last one (not the whole hour)."""

    def __init__(self) -> None:
        self.ds = 0
        self.first = 0  # absolute block number of the first cached block
        self.t = np.empty(0)
        self.lo = np.empty(0)
        self.hi = np.empty(0)
        self._total = -1

    def __call__(self, ring: Ring, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        t, v = ring.view()
        n = len(t)
        want = n // max(max_points // 2, 1)
        if want < 2:
            return t, v
        ds = 1 << (want - 1).bit_length()  # next power of two: stable while the run grows
        total = ring.total
        if ds != self.ds or total < self._total:
            self.ds, self.first = ds, 0
            self.t = self.lo = self.hi = np.empty(0)
        self._total = total
        start = total - n  # absolute index of t[0]
        k0 = -(-start // ds)  # first complete block in view
        k1 = total // ds  # blocks before this are complete
        if k1 <= k0:
            return t, v
        cached_end = self.first + len(self.t)
        if self.first < k0 or cached_end < k0:  # drop blocks that left the ring
            keep = max(k0 - self.first, 0)
            self.t, self.lo, self.hi = self.t[keep:], self.lo[keep:], self.hi[keep:]
            self.first = max(self.first, k0) if cached_end >= k0 else k0
            cached_end = self.first + len(self.t)
        if not len(self.t):
            self.first = cached_end = k0
        if cached_end < k1:
            a, b = cached_end * ds - start, k1 * ds - start
            blocks = v[a:b].reshape(-1, ds)
            self.t = np.concatenate([self.t, t[a:b:ds]])
            self.lo = np.concatenate([self.lo, blocks.min(axis=1)])
            self.hi = np.concatenate([self.hi, blocks.max(axis=1)])
        head = k0 * ds - start
        tail = k1 * ds - start
        body_t = np.repeat(self.t, 2)
        body_v = np.empty(2 * len(self.lo))
        body_v[0::2], body_v[1::2] = self.lo, self.hi
        return (np.concatenate([t[:head], body_t, t[tail:]]), np.concatenate([v[:head], body_v, v[tail:]]))


def nice_ceil(value: float) -> float:
    """The next 'round' number at or above ``value`` (at most 25% above): axis limits that move
    in steps, so the axes are not redrawn on every refresh."""
    if value <= 0 or not np.isfinite(value):
        return 1.0
    magnitude = 10.0 ** np.floor(np.log10(value))
    for step in _NICE:
        if step * magnitude >= value:
            return float(step * magnitude)
    return float(10 * magnitude)


SeriesKey = tuple[str, str]  # (source, value name), e.g. ("engine", "kv_cache_usage_pct")


class SeriesStore:
    """Every (source, value) seen on the bus, as a ring buffer on one time axis (seconds since
    the first sample of the run)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.series: dict[SeriesKey, Ring] = {}
        self.t0: float | None = None
        self.t0_wall: float | None = None
        """The wall clock at ``t0``: events dated by the wall clock (a level's start) are placed by it."""

    def ingest(self, samples: Iterable[Sample]) -> int:
        n = 0
        for sample in samples:
            if self.t0 is None:
                self.t0, self.t0_wall = sample.t_mono, sample.t_wall
            t = sample.t_mono - self.t0
            for name, value in sample.values.items():
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    continue
                ring = self.series.get((sample.source, name))
                if ring is None:
                    ring = self.series[(sample.source, name)] = Ring(self.capacity)
                ring.append(t, number)
                n += 1
        return n

    def last(self, source: str, name: str) -> float | None:
        ring = self.series.get((source, name))
        return ring.last() if ring is not None else None

    def clear(self) -> None:
        self.series.clear()
        self.t0 = self.t0_wall = None

    def gpu_sources(self) -> list[str]:
        return sorted({s for s, _ in self.series if GPU_SOURCE.fullmatch(s)})


GPU_SOURCE = re.compile(r"gpu\d+")


@dataclass(frozen=True)
class Trace:
    """One curve: a sample value, its legend label, the factor to display units and its colour.
    ``source`` ``"gpu*"`` means one curve per GPU. Colours are fixed per series (an index into
    the theme's palette; :data:`ENGINE`, :data:`CLIENT`, :data:`HOST` everywhere), so a series
    keeps its colour from run to run whatever arrives first. ``per_core`` values (percent of one
    core) are divided by the machine's core count, to share a scale with machine-wide ones."""

    source: str
    name: str
    label: str
    scale: float = 1.0
    colour: int = 0
    per_core: bool = False


ENGINE, CLIENT, HOST, RED, PURPLE, TEAL, BROWN = range(7)
"""Palette slots (``Theme.curves``): the engine's series blue, the client's orange, the host's green."""


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    unit: str
    traces: tuple[Trace, ...]
    gpu: bool | None = None  # True: only with a GPU; False: only without; None: always
    short: str = ""  # the title where room is short (presentation mode)


GIB = 2.0**30
PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("tokens", "Output tokens", "tok/s",
             (Trace("engine", "generation_tok_per_s", "engine", 1.0, ENGINE),
              Trace("client", "output_tok_per_s", "client", 1.0, CLIENT)), short="Throughput"),
    # The client's view beside the engine's own: when they part, the client is late (see client
    # lag). TTFT (hundreds of ms) and ITL (a few ms) get a plot each, so neither is drawn flat.
    PlotSpec("latency", "Time to first token", "ms",
             (Trace("engine", "ttft_mean_ms", "engine mean", 1.0, ENGINE),
              Trace("client", "ttft_ms_p50", "client p50", 1.0, CLIENT)), short="TTFT"),
    PlotSpec("itl", "Inter-token latency", "ms",
             (Trace("engine", "itl_mean_ms", "engine mean", 1.0, ENGINE),
              Trace("client", "itl_ms_p50", "client p50", 1.0, CLIENT)), short="ITL"),
    PlotSpec("kv", "KV cache", "%",
             (Trace("engine", "kv_cache_usage_pct", "usage", 1.0, ENGINE),
              Trace("engine", "prefix_cache_hit_rate_pct", "prefix hits", 1.0, TEAL),
              Trace("engine", "spec_acceptance_rate_pct", "drafts accepted", 1.0, PURPLE))),
    # Tokens per engine step beside the running requests: continuous batching made visible (the
    # decode batch tracks "running"; prefill chunks push it above).
    PlotSpec("requests", "Requests and batch", "",
             (Trace("engine", "requests_running", "running", 1.0, ENGINE),
              Trace("engine", "requests_waiting", "waiting", 1.0, RED),
              Trace("client", "requests_in_flight", "in flight", 1.0, CLIENT),
              Trace("engine", "tokens_per_step_mean", "tokens/step", 1.0, PURPLE))),
    # Both in percent of the whole machine: the engine's reading (percent of one core) is divided
    # by the core count, so an engine busy on both cores of two reads 100, like the host.
    PlotSpec("cpu", "CPU, all cores", "%", (Trace("host", "cpu_pct", "host", 1.0, HOST),
                                            Trace("host", "engine_cpu_pct", "engine", 1.0, ENGINE, per_core=True))),
    PlotSpec("host_memory", "Host memory", "GiB",
             (Trace("host", "memory_used_bytes", "host used", 1 / GIB, HOST),
              Trace("host", "engine_rss_bytes", "engine RSS", 1 / GIB, ENGINE)), gpu=False),
    PlotSpec("gpu_memory", "GPU memory", "GiB", (Trace("gpu*", "memory_used_bytes", "used", 1 / GIB, HOST),), gpu=True),
    PlotSpec("bandwidth", "Memory bandwidth", "GB/s",
             (Trace("gpu*", "dram_bw_bytes_per_s", "DRAM", 1e-9, HOST),), gpu=True),
    PlotSpec("gpu_util", "GPU utilization", "%", (Trace("gpu*", "gpu_util_pct", "util", 1.0, HOST),), gpu=True),
)
PLOTS_BY_KEY = {p.key: p for p in PLOTS}


def plots_for(has_gpu: bool) -> list[PlotSpec]:
    return [p for p in PLOTS if p.gpu is None or p.gpu == has_gpu]


def series_label(source: str, name: str) -> str:
    """A stored series as a person reads it: ``Output tokens: client (tok/s)``; the key itself
    for a series no plot shows."""
    for plot in PLOTS:
        for trace in plot.traces:
            if trace.name == name and (trace.source == source or (trace.source == "gpu*" and GPU_SOURCE.fullmatch(source))):
                who = f"{source} {trace.label}" if trace.source == "gpu*" else trace.label
                return f"{plot.title}: {who}" + (f" ({plot.unit})" if plot.unit else "")
    return f"{source}.{name}"


@dataclass(frozen=True)
class TileSpec:
    """A big number: live it shows the client's rolling figure (``source``/``name``), with the
    engine's own live figure under it (``engine_name``); after a run, the catalogue figure
    ``key`` of the run's summary (or its engine-side stand-in when the run flagged it)."""

    key: str
    label: str
    source: str
    name: str
    fmt: str
    figure: str = ""
    engine_name: str = ""
    engine_fmt: str = "{:,.0f}"
    only_when_measured: bool = False
    """Hidden until the run has the figure (TTFAT: only a model that reasons has one of its own)."""


TILES: tuple[TileSpec, ...] = (
    TileSpec("tok_s", "Output tok/s", "client", "output_tok_per_s", "{:,.0f}", "output_tok_per_s",
             "generation_tok_per_s"),
    TileSpec("ttft", "TTFT p50 (ms)", "client", "ttft_ms_p50", "{:,.0f}", "ttft_ms_p50", "ttft_mean_ms"),
    TileSpec("ttfat", "TTFAT p50 (ms)", "client", "ttfat_ms_p50", "{:,.0f}", "ttfat_ms_p50", only_when_measured=True),
    TileSpec("itl", "ITL p50 (ms)", "client", "itl_ms_p50", "{:,.1f}", "itl_ms_p50", "itl_mean_ms", "{:,.1f}"),
    TileSpec("done", "Requests done", "client", "requests_done", "{:,.0f}", "requests_completed"),
    TileSpec("errors", "Errors", "client", "errors", "{:,.0f}", "requests_failed"),
)
