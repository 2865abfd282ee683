"""Run-level quality bounds (``agreement>=0.99``, ``kld_mean<=0.01``, ``accuracy_drop<=1``: the
grammar is ``app.slo``'s) applied to a run's quality figures, and which configuration changes can
cost quality at all (precision and speculative decoding), so a ladder and a tune know when to
measure it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.slo import Slo, holds

QUALITY_FEATURES = ("weights_dtype", "kv_cache_dtype", "speculative")
"""The features whose change can change a model's outputs: numeric precision (weights, KV cache)
and speculative decoding (exact in theory, but its verification runs other kernels)."""
POINTS = 100.0
"""Accuracy is stored as a fraction; its drop is bounded in points."""


def changes_quality(paths: Iterable[str]) -> bool:
    """Whether changing these feature paths (``kv_cache_dtype``, ``speculative.method``) can
    change the outputs."""
    return any(path.split(".", 1)[0] in QUALITY_FEATURES for path in paths)


def quality_value(figures: Mapping[str, Any], metric: str) -> float | None:
    """A quality bound's metric read from a run's ``quality`` (``QualityFigures`` as JSON);
    None where it was not measured. ``accuracy_drop`` reads ``accuracy``'s ``value`` and
    ``reference_value`` (fractions), in points."""
    agreement = figures.get("agreement") or {}
    kld = figures.get("kld") or {}
    accuracy = figures.get("accuracy") or {}
    if metric == "agreement":
        return agreement.get("token_share")
    if metric == "exact_match":
        return agreement.get("exact_match")
    if metric == "same_top":
        return kld.get("same_top")
    if metric == "kld_mean":
        return kld.get("mean")
    if metric == "kld_p99":
        return kld.get("p99")
    if metric == "accuracy_drop":
        value, reference = accuracy.get("value"), accuracy.get("reference_value")
        return None if value is None or reference is None else POINTS * (float(reference) - float(value))
    raise ValueError(f"unknown quality metric {metric}")


def quality_failures(figures: Mapping[str, Any] | None, bounds: Iterable[Slo]) -> list[str]:
    """Each bound the figures miss, in words ("agreement 0.62, bound >= 0.99"); a figure that was
    not measured misses its bound (a pick is never made blind to a bound that was asked)."""
    out = []
    for metric, op, limit in bounds:
        if not figures or not figures.get("measured"):
            why = (figures or {}).get("error") or "no quality probe ran"
            out.append(f"{metric} not measured ({why})")
            continue
        value = quality_value(figures, metric)
        if value is None:
            out.append(f"{metric} not measured")
        elif not holds(float(value), op, limit):
            out.append(f"{metric} {value:.4g}, bound {op} {limit:g}")
    return out
