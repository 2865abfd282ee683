"""The one machinery for many runs: :class:`Campaign` runs a sequence of :class:`Step`s (a named
configuration repeated N times) for repeats, the ladder and the tuner alike, with engine reuse
(relaunched only when engine flags change), cold caches, recording, each step's mean and 95% CI,
a ``prepare`` hook that builds or skips each step just before it runs, a resume point and steps
side by side. It only proposes runs and takes in their outcomes: where and how they run (slots,
threads, cancel, a cluster's placements) is :mod:`app.executor`'s. The campaign model is
described in docs/architecture.md ("Campaigns"); docs/campaigns-plan.md says what is left.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.analysis.compare import CAMPAIGN_TAG, REPEAT_TAG
from app.analysis.stats import Aggregate, aggregate
from app.analysis.summary import numbers
from app.bus import Bus
from app.config import RunConfig
from app.engines import is_group, launch_engine
from app.errors import EngineFailed, UserError
from app.events import LogLine, PhaseChanged
from app.executor import EngineSource, Executor, Fleet, Places, Recorder, RunnerLike, Slot
from app.executor import RemoteSlot as RemoteSlot  # (kept importable from here)
from app.load.datasets import read_inputs
from app.quality.probe import Reference
from app.runner import Runner, RunResult
from engine_adapters.base import FlagSet, Phase
from engine_adapters.hardware import HardwareInfo
from engine_adapters.launcher import EngineProcess, EngineStartError

CampaignStatus = Literal["completed", "failed", "cancelled"]
StepStatus = Literal["completed", "failed", "cancelled", "skipped"]


def engine_key(config: RunConfig) -> str:
    """Two configurations can share a running engine when engine and features are equal."""
    return config.engine.model_dump_json() + config.features.model_dump_json()


def with_quality_references(factory: Callable[..., RunnerLike],
                            references: Mapping[str, Reference]) -> Callable[..., RunnerLike]:
    """``factory``, handing each run the quality reference kept under its name, when there is one
    (its probe compares the run's outputs with it); ``references`` is read at each run."""

    def make(config: RunConfig, bus: Bus, **kwargs: Any) -> RunnerLike:
        reference = references.get(config.name)
        if reference is not None:
            kwargs["quality_reference"] = reference
        return factory(config, bus, **kwargs)

    return make


class EngineKeeper:
    """One engine at a time, kept while the engine flags stay the same; :meth:`close` stops it."""

    def __init__(self) -> None:
        self._engine: EngineProcess | None = None
        self._key: str | None = None
        self.launches = 0

    def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> EngineProcess | None:
        """None for a P/D group: its run launches the group and stops it at the end (the kept
        engine is stopped first: the group needs the machine)."""
        if is_group(config):
            if self._engine is not None:
                bus.emit(LogLine.note("a P/D group runs next, launched by its run: stopping the kept engine"))
            self.close()
            return None
        key = engine_key(config)
        if self._engine is not None and self._key == key and self._engine.is_running():
            bus.emit(LogLine.note(f"reusing the running engine at {self._engine.base_url}"))
            return self._engine
        if self._engine is not None:
            bus.emit(LogLine.note("the kept engine's flags differ from this run's: stopping it"))
        self.close()

        def on_phase(phase: Phase, detail: str) -> None:
            bus.emit(PhaseChanged(phase=phase, detail=detail))

        def on_log(line: str) -> None:
            bus.emit(LogLine(line=line))

        engine = launch_engine(config, on_log=on_log, on_phase=on_phase)
        self.launches += 1
        try:
            engine.wait_ready(cancel=cancel)
        except EngineStartError as exc:
            engine.stop()
            raise EngineFailed(str(exc.diagnosis or exc)) from None
        except BaseException:
            engine.stop()
            raise
        self._engine, self._key = engine, key
        return engine

    @property
    def engine(self) -> EngineProcess | None:
        """The kept engine while it runs."""
        engine = self._engine
        return engine if engine is not None and engine.is_running() else None

    def close(self) -> str | None:
        """Stop the kept engine; says how it stopped (None when there was none). Its shutdown
        (phases, and the tracebacks its workers print as they are torn down) is no longer
        published: it would land in the next run's log and phase bar."""
        engine, self._engine, self._key = self._engine, None, None
        if engine is None:
            return None
        engine.on_log = engine.on_phase = None
        return engine.stop()


@dataclass
class MachineFacts:
    """This machine's hardware and the installed engine's flags, learnt once for a whole campaign
    (the GUI passes what it probed already): every step is checked against them."""

    hardware: HardwareInfo | None = None
    flags: FlagSet | None = None
    discover_flags: bool = True
    known: bool = False

    def learn(self, base: RunConfig, probe: Callable[[], HardwareInfo],
              discover: Callable[[RunConfig, HardwareInfo], FlagSet | None]) -> None:
        """Probe what is not known yet (``probe`` and ``discover`` come from the owner's module, so
        a test stands in for them there)."""
        if self.known:
            return
        if self.hardware is None:
            self.hardware = probe()
        if self.flags is None and self.discover_flags:
            self.flags = discover(base, self.hardware)
        self.known = True


@dataclass
class Step:
    """One configuration of a campaign, run ``repeats`` times."""

    name: str
    config: RunConfig
    repeats: int = 1


@dataclass
class StepResult:
    step: Step
    repeat_tag: str
    index: int = 0
    runs: list[RunResult] = field(default_factory=list)
    stored_ids: list[int] = field(default_factory=list)
    aggregate: dict[str, Aggregate] = field(default_factory=dict)
    """Mean and 95% CI of each figure over the step's completed runs."""
    status: StepStatus = "completed"
    reason: str | None = None
    engine_reused: bool | None = None
    """Whether the step's first run got the engine the previous run used (None: no engine of ours)."""


Prepare = Callable[[int, Step, Sequence[StepResult]], "Step | str"]
"""``prepare(index, step, outcomes so far)``: the step to run, or why it cannot run here."""


@dataclass
class CampaignResult:
    campaign_id: str
    steps: list[StepResult] = field(default_factory=list)
    status: CampaignStatus = "completed"
    reason: str | None = None

    @property
    def runs(self) -> list[RunResult]:
        return [r for s in self.steps for r in s.runs]

    @property
    def last_run(self) -> RunResult | None:
        runs = self.runs
        return runs[-1] if runs else None

    def to_dict(self) -> dict[str, Any]:
        """What ``--json`` writes for a campaign: every run's result and each step's aggregate."""
        return {"campaign_id": self.campaign_id, "status": self.status, "reason": self.reason,
                "steps": [{"name": s.step.name, "repeat_tag": s.repeat_tag, "repeats": s.step.repeats,
                           "status": s.status, "reason": s.reason, "stored_ids": s.stored_ids,
                           "engine_reused": s.engine_reused,
                           "aggregate": {k: a.to_dict() for k, a in s.aggregate.items()},
                           "runs": [r.model_dump(mode="json") for r in s.runs]} for s in self.steps]}


def result_figures(result: RunResult) -> dict[str, float]:
    """A run's figures from the runner's own result (used when nothing is stored): a one-level
    run's figures, or ``L<idx>.``-prefixed figures of each level."""
    if len(result.levels) == 1:
        return result.levels[0].summary.figures()
    return {f"L{lv.index}.{k}": v for lv in result.levels for k, v in lv.summary.figures().items()}


def aggregate_figures(per_run: Sequence[dict[str, float]]) -> dict[str, Aggregate]:
    """Mean and 95% CI per figure over runs (figures missing from a run are left out of it)."""
    keys = sorted(set().union(*per_run)) if per_run else []
    out = {}
    for key in keys:
        agg = aggregate([f[key] for f in per_run if key in f])
        if agg is not None:
            out[key] = agg
    return out


class Campaign:
    """Runs steps in order (see the module docstring); ``run(cancel)`` blocks. It only proposes
    runs and takes in their outcomes: :class:`app.executor.Executor` runs them."""

    def __init__(self, steps: Sequence[Step], bus: Bus, *, endpoint: str | None = None, api_key: str | None = None,
                 engines: EngineSource | None = None, recorder: Recorder | None = None, telemetry: bool = True,
                 stop_on_failure: bool = True, campaign_id: str | None = None,
                 runner_factory: Callable[..., RunnerLike] = Runner, prepare: Prepare | None = None,
                 on_step_start: Callable[[int, Step], None] | None = None,
                 on_step_done: Callable[[int, StepResult], None] | None = None,
                 extra_tags: Sequence[str] = (), new_engines: Callable[[], EngineSource] | None = None,
                 fleet: Fleet | None = None, on_slot_bus: Callable[[Bus], None] | None = None) -> None:
        if not steps:
            raise UserError("a campaign needs at least one step")
        for step in steps:
            if step.repeats < 1:
                raise UserError(f"step '{step.name}': repeats must be at least 1 (got {step.repeats})")
        self.steps = list(steps)
        self.bus = bus
        self.endpoint = endpoint
        self.fleet = fleet
        """Where steps run when not on this machine: each slot is a placement on a cluster."""
        self._own_keeper = engines is None and endpoint is None and fleet is None
        self.engines: EngineSource | None = EngineKeeper() if self._own_keeper else engines
        self.recorder = recorder
        self.stop_on_failure = stop_on_failure
        self.campaign_id = campaign_id or uuid.uuid4().hex[:12]
        self.prepare = prepare
        self.on_step_start = on_step_start
        self.on_step_done = on_step_done
        self.extra_tags = list(extra_tags)
        self.places = Places(bus, recorder=recorder, engines=self.engines, new_engines=new_engines or EngineKeeper,
                             endpoint=endpoint, api_key=api_key, fleet=fleet, telemetry=telemetry,
                             runner_factory=runner_factory, on_slot_bus=on_slot_bus)
        """Where its runs run: the owner's engines one at a time; side by side, slots of their own."""

    def run(self, cancel: threading.Event | None = None, *, start_at: int = 0, max_parallel: int = 1,
            slot: Slot | None = None) -> CampaignResult:
        """``start_at``: the first step to run (a resumed campaign keeps the steps before it).
        ``max_parallel``: how many runs may run at once, each in a slot of its own (its own
        engines, bus and recorder); every step is then prepared before the first one starts.
        ``slot``: one at a time, in this slot (a tune's configuration: the executor's)."""
        if max_parallel < 1:
            raise UserError(f"steps at once must be at least 1 (got {max_parallel})")
        cancel = cancel or threading.Event()
        result = CampaignResult(self.campaign_id)
        try:
            if max_parallel == 1:
                in_order = _InOrder(self, start_at, cancel, result)
                Executor(self.places, slot=slot).run(in_order, in_order.work, cancel)
                in_order.finish()
            else:
                side = _SideBySide(self, start_at, cancel, result)
                Executor(self.places, max_parallel=max_parallel).run(side, side.work, cancel)
                side.finish()
        finally:
            if self._own_keeper and isinstance(self.engines, EngineKeeper):
                self.engines.close()
        return result

    def _prepared(self, index: int, step: Step, result: CampaignResult) -> Step | None:
        """The step to run, or None when it cannot run here (then it is done, ``skipped``)."""
        prepared = self.prepare(index, step, list(result.steps)) if self.prepare is not None else step
        if isinstance(prepared, str):
            self._done(index, StepResult(step, self._repeat_tag(index), index, status="skipped", reason=prepared),
                       result)
            return None
        if prepared.repeats < 1:
            raise UserError(f"step '{prepared.name}': repeats must be at least 1 (got {prepared.repeats})")
        return prepared

    def _started(self, index: int, step: Step) -> None:
        if self.on_step_start is not None:
            self.on_step_start(index, step)

    def _done(self, index: int, outcome: StepResult, result: CampaignResult) -> None:
        result.steps.append(outcome)
        if self.on_step_done is not None:
            self.on_step_done(index, outcome)

    def _merged(self, index: int, step: Step, numbered: list[tuple[int, StepResult]],
                cancel: threading.Event) -> StepResult:
        """One step's outcome from its runs (by repeat number), which ran in different slots."""
        out = StepResult(step, self._repeat_tag(index), index)
        parts = [part for _, part in sorted(numbered, key=lambda pair: pair[0])]
        for part in parts:
            out.runs.extend(part.runs)
            out.stored_ids.extend(part.stored_ids)
        failed = next((p for p in parts if p.status == "failed"), None)
        if failed is not None:
            out.status, out.reason = "failed", failed.reason
        elif any(p.status == "cancelled" for p in parts) or len(parts) < step.repeats:
            out.status, out.reason = "cancelled", "cancelled" if cancel.is_set() else "not every run could run"
        out.engine_reused = parts[0].engine_reused if len(parts) == 1 else None
        self._aggregate(out)
        return out

    def _repeat_tag(self, index: int) -> str:
        return f"{REPEAT_TAG}{self.campaign_id}-{index}"

    def _config(self, step: Step, repeat_tag: str, i: int) -> RunConfig:
        name = step.config.name if step.repeats == 1 else f"{step.config.name} (repeat {i + 1}/{step.repeats})"
        tags = [t for t in step.config.tags if not t.startswith((REPEAT_TAG, CAMPAIGN_TAG))]
        tags += [CAMPAIGN_TAG + self.campaign_id, repeat_tag, *(t for t in self.extra_tags if t not in tags)]
        return step.config.model_copy(update={"name": name, "tags": tags})

    def _run_step(self, index: int, step: Step, cancel: threading.Event, slot: Slot,
                  only_repeat: int | None = None) -> StepResult:
        """The step's runs in this slot: every repeat, or ``only_repeat`` (then the caller merges
        the step's parts and aggregates them)."""
        out = StepResult(step, self._repeat_tag(index), index)
        try:  # a named tokenizer that does not load, or a bad trace, refuses the step before its engine starts
            read_inputs(step.config.workload)
        except UserError as exc:
            out.status, out.reason = "failed", str(exc)
            return out
        for i in range(step.repeats) if only_repeat is None else (only_repeat,):
            if cancel.is_set():
                out.status, out.reason = "cancelled", "cancelled"
                break
            slot.bus.emit(LogLine.note(f"campaign {self.campaign_id}, step {index + 1}/{len(self.steps)} "
                                       f"'{step.name}': run {i + 1} of {step.repeats}"))
            try:
                ran = slot.run(self._config(step, out.repeat_tag, i), cancel)
            except (EngineFailed, UserError) as exc:
                out.status, out.reason = ("cancelled", "cancelled") if cancel.is_set() else ("failed", str(exc))
                break
            if i == 0:
                out.engine_reused = ran.engine_reused
            out.runs.extend(ran.runs)
            out.stored_ids.extend(ran.stored_ids)
            run = ran.runs[-1]
            if run.status != "completed":
                out.status, out.reason = ("cancelled" if run.status == "cancelled" else "failed"), run.reason
                break
        if only_repeat is None:
            self._aggregate(out)
        return out

    def _aggregate(self, out: StepResult) -> None:
        """Mean and CI per figure over the step's completed runs; stored into each run's summary."""
        store = self.recorder.store if self.recorder is not None else None
        completed_ids = [i for i, r in zip(out.stored_ids, out.runs, strict=False) if r.status == "completed"]
        if store is not None and completed_ids:
            per_run = [{k: v for k, v in numbers(store.get_run(i).metrics).items()} for i in completed_ids]
        else:
            per_run = [result_figures(r) for r in out.runs if r.status == "completed"]
        out.aggregate = aggregate_figures(per_run)
        if store is None or len(completed_ids) < 2:
            return
        summary = {"repeat": {"tag": out.repeat_tag, "n": len(completed_ids), "runs": completed_ids,
                              "figures": {k: a.to_dict() for k, a in out.aggregate.items()}}}
        for run_id in out.stored_ids:
            store.update_run(run_id, summary=summary)


class _InOrder:
    """One step after another, each prepared just before it runs (so it can build on the one
    that ran before it) and run whole (every repeat, the engine kept between them)."""

    def __init__(self, campaign: Campaign, start_at: int, cancel: threading.Event, result: CampaignResult) -> None:
        self.campaign, self.cancel, self.result = campaign, cancel, result
        self.next = start_at
        self.over = False

    def ask(self) -> tuple[int, Step] | None:
        campaign, result = self.campaign, self.result
        while not self.over and self.next < len(campaign.steps):
            index, self.next = self.next, self.next + 1
            if self.cancel.is_set():
                result.status, result.reason = "cancelled", "cancelled"
                return None
            prepared = campaign._prepared(index, campaign.steps[index], result)
            if prepared is not None:
                campaign._started(index, prepared)
                return index, prepared
        return None

    def work(self, trial: tuple[int, Step], slot: Slot, cancel: threading.Event) -> StepResult:
        return self.campaign._run_step(*trial, cancel, slot)

    def tell(self, trial: tuple[int, Step], outcome: StepResult) -> None:
        self.campaign._done(trial[0], outcome, self.result)
        if outcome.status in ("failed", "cancelled"):  # (a step is skipped before it runs)
            self.result.status = "cancelled" if outcome.status == "cancelled" else "failed"
            self.result.reason = outcome.reason
            self.over = outcome.status == "cancelled" or self.campaign.stop_on_failure

    def finish(self) -> None:
        """Cancelled with steps left to run: the campaign was cancelled, whatever the last step did."""
        if self.cancel.is_set() and not self.over and self.next < len(self.campaign.steps):
            self.result.status, self.result.reason = "cancelled", "cancelled"


class _SideBySide:
    """Every step prepared first, in order; then each ready run (a step's repeats spread over the
    slots too) goes to the next free slot. A step is done when its last run is; the outcomes come
    back in step order."""

    def __init__(self, campaign: Campaign, start_at: int, cancel: threading.Event, result: CampaignResult) -> None:
        self.campaign, self.cancel, self.result = campaign, cancel, result
        self.prepared = [(index, ready_step) for index, step in enumerate(campaign.steps) if index >= start_at
                         and (ready_step := campaign._prepared(index, step, result)) is not None]
        self.ready = deque((index, step, i) for index, step in self.prepared for i in range(step.repeats))
        self.parts: dict[int, list[tuple[int, StepResult]]] = {index: [] for index, _ in self.prepared}
        self.stop = False

    def ask(self) -> tuple[int, Step, int] | None:
        if self.stop or not self.ready:
            return None
        index, step, repeat = trial = self.ready.popleft()
        campaign = self.campaign
        campaign.bus.emit(LogLine.note(f"campaign {campaign.campaign_id}: step {index + 1}/{len(campaign.steps)} "
                                       f"'{step.name}'" + (f" run {repeat + 1}" if step.repeats > 1 else "")
                                       + " starts in a slot"))
        if repeat == 0:
            campaign._started(index, step)
        return trial

    def work(self, trial: tuple[int, Step, int], slot: Slot, cancel: threading.Event) -> StepResult:
        index, step, repeat = trial
        return self.campaign._run_step(index, step, cancel, slot, only_repeat=repeat)

    def tell(self, trial: tuple[int, Step, int], outcome: StepResult) -> None:
        index, step, repeat = trial
        self.parts[index].append((repeat, outcome))
        if len(self.parts[index]) == step.repeats:
            self.campaign._done(index, self.campaign._merged(index, step, self.parts[index], self.cancel),
                                self.result)
        if outcome.status == "failed" and self.campaign.stop_on_failure:
            self.stop = True

    def finish(self) -> None:
        """Steps that began but could not finish every run are done too; then the campaign's status."""
        campaign, result = self.campaign, self.result
        for index, step in self.prepared:
            if self.parts[index] and len(self.parts[index]) < step.repeats:
                campaign._done(index, campaign._merged(index, step, self.parts[index], self.cancel), result)
        result.steps.sort(key=lambda s: s.index)
        failed = next((s for s in result.steps if s.status == "failed"), None)
        if self.cancel.is_set():
            result.status, result.reason = "cancelled", "cancelled"
        elif failed is not None:
            result.status, result.reason = "failed", failed.reason


def repeat_lines(step: StepResult, keys: Sequence[str] | None = None) -> list[str]:
    """One line per headline figure of a repeated step: ``Output throughput: 1,234.5 ± 56.7 tok/s
    (95% CI, 3 runs)``; the same words in the CLI and the GUI."""
    from app.analysis import metric_catalog as catalog

    chosen = list(keys) if keys is not None else [k for k in catalog.HEADLINE if k in step.aggregate]
    lines = []
    for key in chosen:
        agg = step.aggregate.get(key)
        if agg is None:
            continue
        m = catalog.metric(key)
        spread = (f" \u00b1 {m.format(agg.half_width)}" if agg.half_width is not None and math.isfinite(agg.half_width)
                  else "")
        lines.append(f"{m.name}: {m.format(agg.mean)}{spread} {m.unit} (95% CI, {agg.n} run{'s' if agg.n != 1 else ''})"
                     .replace("  ", " "))
    return lines


def run_repeats(config: RunConfig, repeats: int, bus: Bus, cancel: threading.Event | None = None, *,
                engines: EngineSource | None = None, db_path: str | None = None, endpoint: str | None = None,
                api_key: str | None = None, record: bool = True, telemetry: bool = True, fleet: Fleet | None = None,
                max_parallel: int = 1, on_slot_bus: Callable[[Bus], None] | None = None) -> CampaignResult:
    """``config`` run ``repeats`` times, each on a cold cache, recorded to the run database, with
    the engine kept between repeats (what ``--repeat`` and the GUI's Repeats box do). With a
    ``fleet``, each repeat is a trial on the cluster, up to ``max_parallel`` at once."""
    recorder = None
    if record:
        from app.recording import record_to_default_store

        recorder = record_to_default_store(bus, db_path)
    try:
        campaign = Campaign([Step(config.name, config, repeats)], bus, endpoint=endpoint, api_key=api_key,
                            engines=engines, recorder=recorder, telemetry=telemetry, fleet=fleet,
                            on_slot_bus=on_slot_bus)
        return campaign.run(cancel, max_parallel=max(1, min(max_parallel, repeats)))
    finally:
        if recorder is not None:
            recorder.close()
