"""A stored run's findings as the faces show them (the workbench's Findings panel, Compare's
"why B differs from A", the presentation's one sentence, the HTML report): ``app.analysis.findings``
read with the planner's ceiling (``app.planner.stored.level_limits``), and the few choices of what
to show first, made once here so every face makes them the same way."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from app.analysis.compare import Comparison
from app.analysis.findings import ENGINE_SOURCE, RULES, Finding, RunEvidence, change_parts, explain, load_run
from app.events import LevelFinished, LevelStarted, RunStarted, Sample
from app.planner.stored import level_limits
from app.store import LevelInfo, RunDetail, RunStore, SeriesBlock


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


class LiveFindings:
    """A running run's findings from what the bus has said so far: its configuration and hardware
    (``RunStarted``), each level's start and, once it ended, its summary (``LevelFinished``), and the
    engine's samples. :func:`explain` reads them as it reads the stored run, so the findings during
    a run are those its record gives for what it has measured so far (a KV cache full while the
    first level still runs, before any level has ended). Fed on the GUI thread, read in a worker:
    :meth:`evidence` takes a copy under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: RunStarted | None = None
        self._levels: dict[int, LevelInfo] = {}
        self._samples: list[Sample] = []
        self.changed = False
        """Something new since the last :meth:`evidence`."""

    def begin(self, started: RunStarted) -> None:
        with self._lock:
            self._started = started
            self._levels, self._samples, self.changed = {}, [], True

    def level_started(self, level: LevelStarted) -> None:
        with self._lock:
            self._levels[level.index] = LevelInfo(idx=level.index, label=level.label, started_at=level.started_wall_s)
            self.changed = True

    def level_finished(self, finished: LevelFinished, wall_s: float) -> None:
        with self._lock:
            info = self._levels.get(finished.index) or LevelInfo(idx=finished.index, label=finished.label)
            self._levels[finished.index] = info.model_copy(update={
                "finished_at": wall_s, "summary": finished.summary.model_dump(mode="json")})
            self.changed = True

    def ingest(self, samples: Iterable[Sample]) -> None:
        engine = [s for s in samples if s.source == ENGINE_SOURCE]
        if engine:
            with self._lock:
                self._samples.extend(engine)
                self.changed = True

    def evidence(self) -> RunEvidence | None:
        """The run so far as :func:`explain` reads a stored one (None before it started)."""
        with self._lock:
            started, samples, levels = self._started, list(self._samples), list(self._levels.values())
            self.changed = False
        if started is None:
            return None
        run = RunDetail(id=0, uid=started.run_id, name=started.name, status="running",
                        started_at=started.started_wall_s, engine_kind=started.engine_kind, model=started.model,
                        config=started.config.model_dump(mode="json"), hardware=dict(started.hardware),
                        levels=sorted(levels, key=lambda lv: lv.idx))
        names = sorted({name for s in samples for name in s.values})
        block = SeriesBlock(ENGINE_SOURCE, names, np.array([s.t_mono for s in samples], dtype=float),
                            np.array([s.t_wall for s in samples], dtype=float),
                            np.array([[s.values.get(n, np.nan) for n in names] for s in samples], dtype=float)
                            .reshape(len(samples), len(names)))
        limits, why = level_limits(run)  # the ceiling of each ended level, as for the stored run
        return RunEvidence(run, {ENGINE_SOURCE: block} if samples else {}, limits, why)

    def findings(self) -> list[Finding]:
        """:func:`explain` on the run so far (empty before it started). Call it in a worker."""
        evidence = self.evidence()
        return explain(evidence) if evidence is not None else []
