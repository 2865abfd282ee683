"""The goodput SLO grammar (``'ttft_ms<=500,tpot_ms<50'``), in a module of its own so the
configuration (``app.workload``, which validates it) and the figures (``app.load.metrics``,
which apply it) both import it without importing each other."""

from __future__ import annotations

import re

SLO_METRICS = ("ttft_ms", "ttfat_ms", "tpot_ms", "e2e_ms", "queue_ms")
"""What a request is held to: ``ttfat_ms`` is the time to its first answer token (a reasoning
model's TTFT; a request that never answered misses it)."""
_SLO_RE = re.compile(r"^\s*(?P<key>[a-z0-9_]+)\s*(?P<op><=|<)\s*(?P<value>[0-9]*\.?[0-9]+)\s*$")

Slo = tuple[str, str, float]
"""(metric, ``<=`` or ``<``, limit in the metric's unit)."""


class SloError(ValueError):
    """An SLO string that does not parse (message names the bad part). A ``ValueError``, so a
    pydantic validator reports it as a field error."""


def parse_slo(text: str) -> list[Slo]:
    """``'ttft_ms<=500,tpot_ms<50'`` -> [(metric, op, limit)]."""
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _SLO_RE.match(part)
        if not match:
            raise SloError(f"SLO {part.strip()!r} is not like 'ttft_ms<=500' (metric, <= or <, number)")
        if match["key"] not in SLO_METRICS:
            raise SloError(f"SLO metric '{match['key']}' is unknown (known: {', '.join(SLO_METRICS)})")
        out.append((match["key"], match["op"], float(match["value"])))
    if not out:
        raise SloError("empty SLO")
    return out
