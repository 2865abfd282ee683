"""A stored run's findings as the faces show them (the workbench's Findings panel, Compare's
"why B differs from A", the presentation's one sentence, the HTML report): ``app.analysis.findings``
read with the planner's ceiling (``app.planner.stored.level_limits``), and the few choices of what
to show first, made once here so every face makes them the same way."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.analysis.compare import Comparison
from app.analysis.findings import RULES, Finding, change_parts, explain, load_run
from app.planner.stored import level_limits
from app.store import RunStore


def stored_findings(store: RunStore, ref: int | str, reference: int | str | None = None) -> list[Finding]:
    """Every finding of the stored run ``ref`` (against ``reference`` too), warnings first (read
    it in a worker: it reads the run's telemetry and may plan its ceiling)."""
    run = load_run(store, ref, level_limits)
    against = load_run(store, reference, level_limits) if reference is not None else None
    return explain(run, against)


def is_change(finding: Finding) -> bool:
    """A finding against a reference run (``changed_*``): why one run differs from another."""
    registered = RULES.get(finding.rule)
    return registered is not None and registered.against_reference


def changes(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that say why the run differs from its reference, the mechanisms (prefix hits,
    acceptance, the batch, KV memory) before the outcomes (throughput, TTFT): the rules' order."""
    return [f for f in findings if is_change(f)]


def own(findings: Sequence[Finding]) -> list[Finding]:
    """The findings about the run itself (not against a reference)."""
    return [f for f in findings if not is_change(f)]


def headline_finding(findings: Sequence[Finding]) -> Finding | None:
    """The one finding a presenter reads out: the first warning (None when the run raised none)."""
    return next((f for f in findings if f.severity == "warning"), None)


def first_sentence(text: str) -> str:
    """What a presenter reads out of an explanation: its first sentence (the reason; the rest is
    the detail a customer asks for afterwards)."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", text.strip(), maxsplit=1)[0]


def top_change(findings: Sequence[Finding]) -> Finding | None:
    """The first reason a run differs from its reference (None when nothing moved)."""
    found = changes(findings)
    return found[0] if found else None


def why_lines(findings: Sequence[Finding]) -> list[tuple[str, Finding | None]]:
    """Compare's lines saying why a run differs from its reference: the runs and the settings
    that differ, once, then each mechanism that moved (with its finding, for its evidence), in
    the rules' order. Each ``changed_*`` explanation carries the settings itself, for a reader of
    one finding alone."""
    parts = [(p, f) for f in changes(findings) if (p := change_parts(f)) is not None]
    if not parts:
        return []
    first = parts[0][0]
    head = f"{first.runs}: {first.configuration}" if first.configuration else \
        f"{first.runs}, with the same configuration:"
    return [(head, None)] + [(p.mechanism, f) for p, f in parts]


def suggestion_text(suggestion: Mapping[str, Any]) -> str:
    """``features.kv_cache_dtype = "fp8"``: the next trial as the profile keys it sets."""
    return ", ".join(f"{key} = {json.dumps(value)}" for key, value in suggestion.items())


def compared_findings(store: RunStore, comparison: Comparison) -> tuple[list[list[Finding]], list[list[Finding]]]:
    """Each compared run's own findings (in the comparison's order), and for each run but the
    baseline (in the order of ``app.headline.headlines``) why it differs from the baseline."""
    baseline_id = comparison.runs[comparison.baseline].id
    each: list[list[Finding]] = []
    why: list[list[Finding]] = []
    for i, run in enumerate(comparison.runs):
        found = stored_findings(store, run.id, baseline_id if i != comparison.baseline else None)
        each.append(own(found))
        if i != comparison.baseline:
            why.append(changes(found))
    return each, why
