"""The SLO grammar (``'ttft_ms<=500,tpot_ms<50'``), in a module of its own so the
configuration (``app.workload``, which validates it) and the figures (``app.load.metrics``,
which apply it) both import it without importing each other.

Two kinds of bound share it. A per-request bound (``ttft_ms<=500``) holds each request to an upper
limit: goodput counts the requests that met them all, and a tune judges a load level by their
percentile. A run-level quality bound (``agreement>=0.99``, ``kld_mean<=0.01``, ``accuracy_drop<=1``)
holds a configuration's quality figures (``app.quality``) and only a tune's SLO takes it
(:func:`parse_run_slo`); a per-request SLO refuses it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SLO_METRICS = ("ttft_ms", "ttfat_ms", "tpot_ms", "e2e_ms", "queue_ms")
"""What a request is held to: ``ttfat_ms`` is the time to its first answer token (a reasoning
model's TTFT; a request that never answered misses it)."""
QUALITY_METRICS = ("agreement", "exact_match", "same_top", "kld_mean", "kld_p99", "accuracy_drop")
"""What a configuration's quality is held to, against the tune's reference configuration:
``agreement`` (tokens identical before the first divergence, 0..1), ``exact_match`` (whole outputs
identical, 0..1), ``same_top`` (positions whose top token is the reference's, 0..1), ``kld_mean``
and ``kld_p99`` (KL divergence, nats), ``accuracy_drop`` (task accuracy lost, in points)."""
_SLO_RE = re.compile(r"^\s*(?P<key>[a-z0-9_]+)\s*(?P<op><=|<|>=|>)\s*(?P<value>[0-9]*\.?[0-9]+)\s*$")
UPPER_OPS = ("<=", "<")

Slo = tuple[str, str, float]
"""(metric, operator, limit in the metric's unit): ``<=`` or ``<`` for a per-request bound,
any of ``<=``, ``<``, ``>=``, ``>`` for a quality bound."""


class SloError(ValueError):
    """An SLO string that does not parse (message names the bad part). A ``ValueError``, so a
    pydantic validator reports it as a field error."""


@dataclass(frozen=True)
class RunSlo:
    """A tune's SLO: per-request bounds and run-level quality bounds."""

    requests: list[Slo] = field(default_factory=list)
    quality: list[Slo] = field(default_factory=list)

    @property
    def request_text(self) -> str:
        """The per-request bounds as a per-request SLO (what goodput counts with)."""
        return slo_text(self.requests)


def slo_text(bounds: list[Slo]) -> str:
    return ",".join(f"{metric}{op}{limit:g}" for metric, op, limit in bounds)


def _bounds(text: str, quality_allowed: bool) -> list[Slo]:
    out = []
    known = SLO_METRICS + (QUALITY_METRICS if quality_allowed else ())
    for part in text.split(","):
        if not part.strip():
            continue
        match = _SLO_RE.match(part)
        if not match:
            raise SloError(f"SLO {part.strip()!r} is not like 'ttft_ms<=500' (metric, <= or <, number)"
                           + (" or 'agreement>=0.99'" if quality_allowed else ""))
        key, op = match["key"], match["op"]
        if key in QUALITY_METRICS and not quality_allowed:
            raise SloError(f"'{key}' is a run-level quality bound: a tune's --slo takes it, not a per-request SLO")
        if key not in known:
            raise SloError(f"SLO metric '{key}' is unknown (known: {', '.join(known)})")
        if key in SLO_METRICS and op not in UPPER_OPS:
            raise SloError(f"SLO {part.strip()!r}: a per-request bound is an upper limit (<= or <)")
        out.append((key, op, float(match["value"])))
    if not out:
        raise SloError("empty SLO")
    return out


def parse_slo(text: str) -> list[Slo]:
    """A per-request SLO: ``'ttft_ms<=500,tpot_ms<50'`` -> [(metric, op, limit)]."""
    return _bounds(text, quality_allowed=False)


def parse_run_slo(text: str) -> RunSlo:
    """A tune's SLO: per-request bounds and quality bounds, in any order
    (``'ttft_ms<=500,agreement>=0.99'``)."""
    bounds = _bounds(text, quality_allowed=True)
    return RunSlo(requests=[b for b in bounds if b[0] in SLO_METRICS],
                  quality=[b for b in bounds if b[0] in QUALITY_METRICS])


def holds(value: float, op: str, limit: float) -> bool:
    return {"<=": value <= limit, "<": value < limit, ">=": value >= limit, ">": value > limit}[op]
