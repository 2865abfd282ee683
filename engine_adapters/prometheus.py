"""The one reader of an engine's Prometheus text: canonical readings, and what two readings say.

Every consumer goes through here: the live telemetry collector (rates between scrapes), the
runner (a level's counters, after minus before), and the adapters' feature checks (is a counter
above zero). So a hit rate, an acceptance rate or a latency mean is computed one way, from one
parse, whichever screen shows it.

- :class:`MetricMap` turns a page into a :class:`Scrape` in canonical names (an engine's names
  come from its adapter's :class:`~engine_adapters.base.MetricNames`), summing label sets.
- :func:`delta` gives the counters and histograms of the interval between two scrapes; a counter
  absent from the older scrape counts from zero (engines create some counters lazily, on first
  use: vLLM's speculative counters appear with the first draft).
- :func:`interval_figures` derives the ratios and means of an interval, as fractions and seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from engine_adapters.base import MetricNames

START_TIME_METRIC = "process_start_time_seconds"
METRICS_MAX_BYTES = 64 * 2**20
"""The most of one /metrics page read: a bound against a broken or hostile server."""


@dataclass
class Scrape:
    """One /metrics reading in canonical names (sums over label sets)."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, tuple[float, float]] = field(default_factory=dict)  # (sum, count)
    start_time_s: float | None = None


def _averaged(canonical: str) -> bool:
    """Gauges that are fractions or lengths are averaged over label sets (e.g. data-parallel
    engines); counts are summed."""
    return canonical.endswith(("_ratio", "_length"))


def _sample_name(line: str) -> str:
    end = len(line)
    for sep in ("{", " "):
        pos = line.find(sep)
        if 0 <= pos < end:
            end = pos
    return line[:end]


def select_lines(text: str, wanted: set[str]) -> str:
    """Only the sample lines of ``wanted`` names: the parser is pure Python and a vLLM page is
    mostly histogram buckets nobody reads here."""
    keep = [line for line in text.splitlines() if line and line[0] != "#" and _sample_name(line) in wanted]
    return "\n".join(keep) + "\n"


def raw_samples(text: str, wanted: set[str]) -> dict[str, list[float]]:
    """Sample name -> its values (one per label set); NaN and infinities dropped. Raises
    ValueError on malformed text."""
    raw: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(select_lines(text, wanted)):
        for sample in family.samples:
            value = float(sample.value)
            if not (math.isnan(value) or math.isinf(value)):
                raw.setdefault(sample.name, []).append(value)
    return raw


def labelled_samples(text: str, wanted: set[str]) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of the ``wanted`` names, one per label set, NaN and infinities
    dropped: for exporters whose label sets are the subject (one GPU per ``gpu`` label). Raises
    ValueError on malformed text."""
    out = []
    for family in text_string_to_metric_families(select_lines(text, wanted)):
        for sample in family.samples:
            value = float(sample.value)
            if not (math.isnan(value) or math.isinf(value)):
                out.append((sample.name, dict(sample.labels), value))
    return out


def metric_total(text: str, name: str) -> float | None:
    """Sum of one sample name over its label sets; None when absent or unreadable (a feature check
    asks "did this counter move", and an unreadable page answers "unknown")."""
    try:
        values = raw_samples(text, {name}).get(name)
    except ValueError:
        return None
    return sum(values) if values else None


class MetricMap:
    """Engine names -> canonical names, for one engine's ``MetricNames``."""

    def __init__(self, names: MetricNames) -> None:
        self.names = names
        self.wanted: set[str] = {START_TIME_METRIC}
        for table in (names.gauges, names.counters):
            for aliases in table.values():
                self.wanted.update(aliases)
        for aliases in names.histograms.values():
            for alias in aliases:
                self.wanted.update((alias + "_sum", alias + "_count"))

    def select(self, text: str) -> str:
        return select_lines(text, self.wanted)

    def parse(self, text: str) -> Scrape:
        """Canonical values from Prometheus text; the first alias present wins. Raises ValueError
        on malformed text."""
        raw = raw_samples(text, self.wanted)
        scrape = Scrape()
        if START_TIME_METRIC in raw:
            scrape.start_time_s = max(raw[START_TIME_METRIC])
        for canonical, aliases in self.names.gauges.items():
            values = _first(raw, aliases)
            if values is not None:
                scrape.gauges[canonical] = sum(values) / len(values) if _averaged(canonical) else sum(values)
        for canonical, aliases in self.names.counters.items():
            values = _first(raw, aliases)
            if values is not None:
                scrape.counters[canonical] = sum(values)
        for canonical, aliases in self.names.histograms.items():
            for alias in aliases:
                if alias + "_sum" in raw and alias + "_count" in raw:
                    scrape.histograms[canonical] = (sum(raw[alias + "_sum"]), sum(raw[alias + "_count"]))
                    break
        return scrape


def _first(raw: dict[str, list[float]], aliases: Iterable[str]) -> list[float] | None:
    for alias in aliases:
        if alias in raw:
            return raw[alias]
    return None


def restarted(old: Scrape, new: Scrape) -> bool:
    """Whether the engine restarted between two scrapes: its start time changed, or a counter or
    histogram count went back (a delta across a restart would be negative or huge)."""
    if old.start_time_s is not None and new.start_time_s is not None and new.start_time_s != old.start_time_s:
        return True
    if any(new.counters[c] < v for c, v in old.counters.items() if c in new.counters):
        return True
    return any(new.histograms[h][1] < v[1] for h, v in old.histograms.items() if h in new.histograms)


def delta(old: Scrape, new: Scrape) -> Scrape:
    """The interval between two scrapes: counter and histogram increments (no gauges). Only what
    the newer scrape has; what the older lacks counts from zero."""
    out = Scrape(start_time_s=new.start_time_s)
    for name, value in new.counters.items():
        out.counters[name] = value - old.counters.get(name, 0.0)
    for name, (total, count) in new.histograms.items():
        old_total, old_count = old.histograms.get(name, (0.0, 0.0))
        out.histograms[name] = (total - old_total, count - old_count)
    return out


def interval_figures(interval: Scrape) -> dict[str, float]:
    """What an interval (a :func:`delta`) says, in plain units: ``prefix_cache_hit_ratio``,
    ``spec_acceptance_ratio`` (fractions, at most 1), ``spec_mean_acceptance_length`` (tokens per
    draft, counting the bonus token), and ``<histogram>_mean`` (seconds for ``*_s``). A figure
    whose denominator did not move is absent: unknown, not zero."""
    c = interval.counters
    out: dict[str, float] = {}
    if c.get("prefix_cache_queries") and "prefix_cache_hits" in c:
        out["prefix_cache_hit_ratio"] = min(1.0, c["prefix_cache_hits"] / c["prefix_cache_queries"])
    if c.get("spec_decode_draft_tokens") and "spec_decode_accepted_tokens" in c:
        out["spec_acceptance_ratio"] = min(1.0, c["spec_decode_accepted_tokens"] / c["spec_decode_draft_tokens"])
    if c.get("spec_decode_drafts") and "spec_decode_accepted_tokens" in c:
        out["spec_mean_acceptance_length"] = 1.0 + c["spec_decode_accepted_tokens"] / c["spec_decode_drafts"]
    for name, (total, count) in interval.histograms.items():
        if count > 0:
            out[f"{name}_mean"] = total / count
    return out
