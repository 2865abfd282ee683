"""Live engine metrics: scrape the engine's Prometheus ``/metrics`` and publish rates. Parsing,
canonical names and interval figures are ``engine_adapters.prometheus``'s (one reader for the
collector, the runner and the feature checks); the tables live with the adapters.

Rates come from counter deltas between two scrapes. A counter that goes DOWN means the engine
restarted (or a label set vanished): that interval yields no rates at all -- never a negative
or a huge one -- and the next interval starts from the new values. A changed
``process_start_time_seconds`` is read as a restart too, which catches a restart whose new
counters already passed the old ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from engine_adapters.base import MetricNames
from engine_adapters.prometheus import MetricMap, Scrape, delta, interval_figures, restarted

__all__ = ["ENGINE_QUANTITIES", "EngineScraper", "MetricMap", "RateDeriver", "Scrape", "ScrapeError",
           "gauge_output", "histogram_output", "metrics_url_from", "support"]

# The headline engine quantities (beside them: raw counters as ``<name>_total`` and interval
# latency means as ``ttft_mean_ms``, ``itl_mean_ms``, ``e2e_mean_ms``, ``queue_mean_ms``).
ENGINE_QUANTITIES: tuple[str, ...] = (
    "requests_running", "requests_waiting", "kv_cache_usage_pct", "generation_tok_per_s", "prompt_tok_per_s",
    "prefix_cache_hit_rate_pct", "spec_acceptance_rate_pct", "spec_mean_acceptance_length",
)

# Canonical gauge -> (published value name, scale), where the gauge is not published under its own
# name as it is (``gauge_output``): ratios (0-1) become percentages.
GAUGE_OUTPUTS: dict[str, tuple[str, float]] = {
    "kv_cache_usage_ratio": ("kv_cache_usage_pct", 100.0),
    "prefix_cache_hit_ratio": ("prefix_cache_hit_rate_pct", 100.0),
    "spec_acceptance_ratio": ("spec_acceptance_rate_pct", 100.0),
}

# Value derived from counter deltas -> the canonical counters it needs.
DERIVED_FROM_COUNTERS: dict[str, tuple[str, ...]] = {
    "generation_tok_per_s": ("generation_tokens",),
    "prompt_tok_per_s": ("prompt_tokens",),
    "prefix_cache_hit_rate_pct": ("prefix_cache_hits", "prefix_cache_queries"),
    "spec_acceptance_rate_pct": ("spec_decode_accepted_tokens", "spec_decode_draft_tokens"),
    "spec_mean_acceptance_length": ("spec_decode_accepted_tokens", "spec_decode_drafts"),
}


def gauge_output(canonical: str) -> tuple[str, float]:
    return GAUGE_OUTPUTS.get(canonical, (canonical, 1.0))


def histogram_output(canonical: str) -> str:
    """The mean over the last interval: ``ttft_s`` -> ``ttft_mean_ms`` (times in milliseconds),
    ``tokens_per_step`` -> ``tokens_per_step_mean``."""
    return f"{canonical[:-2]}_mean_ms" if _is_time(canonical) else f"{canonical}_mean"


def _is_time(canonical: str) -> bool:
    return canonical.endswith("_s")


def support(names: MetricNames, scrape: Scrape) -> tuple[list[str], dict[str, str]]:
    """(published value names this engine supports, unsupported name -> why)."""
    supported: list[str] = []
    unsupported: dict[str, str] = {}
    why = "not exposed by this engine (feature off, or another engine version)"

    def mark(name: str, present: bool) -> None:
        if present:
            if name not in supported:
                supported.append(name)
            unsupported.pop(name, None)
        elif name not in supported:
            unsupported[name] = why

    for canonical in names.gauges:
        mark(gauge_output(canonical)[0], canonical in scrape.gauges)
    for canonical in names.counters:
        mark(f"{canonical}_total", canonical in scrape.counters)
    for name, needs in DERIVED_FROM_COUNTERS.items():
        if all(c in names.counters for c in needs):
            mark(name, all(c in scrape.counters for c in needs))
    for canonical in names.histograms:
        mark(histogram_output(canonical), canonical in scrape.histograms)
    return supported, unsupported


@dataclass
class _Previous:
    t_mono: float
    scrape: Scrape


class RateDeriver:
    """Turns successive scrapes into published values: gauges, raw ``*_total`` counters, rates
    and interval means (the interval's figures come from ``engine_adapters.prometheus``, as a
    level's do). Keeps only the previous scrape (bounded memory)."""

    def __init__(self, min_interval_s: float = 0.05) -> None:
        self.min_interval_s = min_interval_s
        self._prev: _Previous | None = None
        self.resets = 0

    def update(self, scrape: Scrape, t_mono: float) -> tuple[dict[str, float], str | None]:
        """(values, reset notice or None)."""
        values: dict[str, float] = {}
        for canonical, value in scrape.gauges.items():
            name, scale = gauge_output(canonical)
            values[name] = value * scale
        for canonical, value in scrape.counters.items():
            values[f"{canonical}_total"] = value
        prev, notice = self._prev, None
        if prev is not None:
            if restarted(prev.scrape, scrape):
                self.resets += 1
                notice = "engine counters went back (engine restarted?): rates restart from the next interval"
            elif t_mono - prev.t_mono < self.min_interval_s:
                return values, None  # too close to the last scrape: keep the older baseline
            else:
                values.update(_published(delta(prev.scrape, scrape), t_mono - prev.t_mono))
        self._prev = _Previous(t_mono, scrape)
        return values, notice


def _published(interval: Scrape, dt_s: float) -> dict[str, float]:
    """An interval's rates and figures under their published names and units."""
    out: dict[str, float] = {}
    for name, counter in (("generation_tok_per_s", "generation_tokens"), ("prompt_tok_per_s", "prompt_tokens")):
        if counter in interval.counters:
            out[name] = interval.counters[counter] / dt_s
    figures = interval_figures(interval)
    for canonical in ("prefix_cache_hit_ratio", "spec_acceptance_ratio", "spec_mean_acceptance_length"):
        if canonical in figures:
            name, scale = gauge_output(canonical)
            out[name] = figures[canonical] * scale
    for canonical in interval.histograms:
        if f"{canonical}_mean" in figures:
            out[histogram_output(canonical)] = figures[f"{canonical}_mean"] * (1000.0 if _is_time(canonical) else 1.0)
    return out


def metrics_url_from(endpoint: str, metrics_path: str = "/metrics") -> str:
    """``http://host:port`` -> ``http://host:port/metrics``; a URL with a path is kept as is.
    Raises ValueError for something that is not an http(s) URL."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {endpoint!r} (expected e.g. http://127.0.0.1:8000)")
    path = parts.path if parts.path not in ("", "/") else metrics_path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class ScrapeError(Exception):
    """A scrape that produced no reading (unreachable, timeout, HTTP error, bad text)."""


class EngineScraper:
    """Fetches and parses one /metrics page with a hard timeout; with ``also``, the pages of the
    engines whose figures add to the first's (a P/D group's decode pool), read at once and parsed
    as one (counters summed, fractions averaged, as over an engine's label sets)."""

    def __init__(self, url: str, names: MetricNames, api_key: str | None = None, timeout_s: float = 2.0,
                 also: Sequence[str] = ()) -> None:
        self.url = url
        self.urls = [url, *also]
        self.map = MetricMap(names)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def fetch(self, session: aiohttp.ClientSession) -> Scrape:
        return self.parse(await self.fetch_text(session))

    async def fetch_text(self, session: aiohttp.ClientSession) -> str:
        """The page as text (every page, read at once and joined); kept apart from parsing so a
        caller can timestamp the answer itself. One page that fails fails the reading."""
        pages = await asyncio.gather(*(self._page(session, url) for url in self.urls), return_exceptions=True)
        for page in pages:
            if isinstance(page, BaseException):
                raise page
        return "\n".join(str(page) for page in pages)

    async def _page(self, session: aiohttp.ClientSession, url: str) -> str:
        try:
            async with session.get(url, headers=self.headers, timeout=self.timeout) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status} from {url}")
                return await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ScrapeError(f"{type(exc).__name__}: {exc}".rstrip(": ") + f" ({url})") from exc

    def parse(self, text: str) -> Scrape:
        try:
            return self.map.parse(text)
        except ValueError as exc:
            raise ScrapeError(f"unreadable metrics text from {self.url}: {exc}") from exc
