"""Running a ladder: :class:`Ladder` drives :class:`app.campaign.Campaign` and keeps the
staircase: each step built on the one before and checked just before it runs (skipped, with why,
when it cannot take effect here), verified by the engine, set against the planner's ceiling, and
stored as a campaign. The rules ("fair by construction", "against the physics") are in
docs/ladder.md; the campaign model in docs/architecture.md.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from app.analysis import metric_catalog as catalog
from app.analysis.compare import unfair_hardware
from app.bus import Bus
from app.campaign import Campaign, MachineFacts, Step, StepResult, engine_key, with_quality_references
from app.campaign_state import ClusterOptions
from app.config import RunConfig
from app.engines import check_config
from app.errors import UserError
from app.events import CampaignUpdated, LogLine
from app.executor import Fleet
from app.ladder.spec import (
    LadderError,
    LadderSpec,
    LadderStepSpec,
    apply_step,
    config_diff,
    default_ladder,
    describe_change,
    ladder_base,
    setting_label,
)
from app.ladder.state import (
    KEPT_STEPS,
    TAG,
    LadderState,
    SettingChange,
    StepCheck,
    StepRow,
    compute_factors,
    verification_of,
)
from app.quality.bounds import changes_quality
from app.quality.config import QualityConfig
from app.quality.probe import Reference
from app.quality.stored import stored_reference
from app.runner import Runner, RunResult
from engine_adapters.base import FlagSet, ValidationIssue, feature_status
from engine_adapters.hardware import GpuInfo, HardwareInfo, probe_hardware
from engine_adapters.secrets import mask_obj

if TYPE_CHECKING:
    from app.executor import EngineSource, Recorder, RunnerLike

BATCH_VERIFIED_RATIO = 1.5
"""A load step that raises the concurrency is verified when the engine's tokens per step grew at
least this much over the previous step's (the engine really ran bigger batches)."""


def workload_text(config: RunConfig) -> str:
    """The one workload every step runs, in words (shown on screen and in the report)."""
    w = config.workload
    share = "" if w.shared_prefix_fraction >= 1 else f" on {w.shared_prefix_fraction:.0%} of requests"
    return (f"one shared-prefix workload for every step: a {w.shared_prefix_tokens:,}-token shared prefix{share} + "
            f"{w.input_len.mean:,}-token prompts, {w.output_len.mean:,}-token outputs, {w.num_requests:,} requests "
            f"per step; each step starts on a cold prefix cache")


def target_hardware(gpu: str, count: int) -> HardwareInfo:
    """A machine with ``count`` of the named card (``engine_adapters.gpu_specs``), to check a GPU
    ladder on a machine that has none: the checks then judge the card the ladder is written for."""
    from engine_adapters.gpu_specs import GPU_SPECS, find_gpu_spec

    spec = find_gpu_spec(gpu)
    if spec is None:
        raise LadderError(f"unknown GPU '{gpu}': known are {', '.join(s.name for s in GPU_SPECS)}")
    here = probe_hardware()
    capability = (9, 0) if spec.supports_fp8 else (8, 0)
    return here.model_copy(update={"gpus": [GpuInfo(index=i, name=spec.name, memory_total_bytes=spec.memory_bytes,
                                                    compute_capability=capability) for i in range(count)],
                                   "nvml_error": None, "driver_version": "(planned)"})


def _field_of(key: str) -> str:
    section, _, rest = key.partition(".")
    return rest if section == "features" else key


def skip_reason(issues: Sequence[ValidationIssue], changed: Sequence[str]) -> str | None:
    """Why a step cannot run here: any error, or a warning on a setting the step changes (its
    change cannot take effect on this machine); None when it can run."""
    errors = [i for i in issues if i.severity == "error"]
    fields = [_field_of(k) for k in changed]
    touching = [i for i in issues if i.severity == "warning"
                and any(f == i.field or f.startswith(i.field + ".") or i.field.startswith(f + ".") for f in fields)]
    chosen = errors or touching
    if not chosen:
        return None
    return "; ".join(f"{i.field}: {i.message}" for i in chosen)


class Ladder:
    """One ladder over a configuration; :meth:`plan` checks it without launching, :meth:`run`
    runs it (blocking; from a worker thread) and returns the final :class:`LadderState`."""

    def __init__(self, config: RunConfig, bus: Bus, *, spec: LadderSpec | None = None, profile: str = "",
                 engines: EngineSource | None = None, recorder: Recorder | None = None, telemetry: bool = True,
                 runner_factory: Callable[..., RunnerLike] | None = None, hardware: HardwareInfo | None = None,
                 flags: FlagSet | None = None, discover_flags: bool = True, ladder_id: str | None = None,
                 gpu: str | None = None, max_parallel: int = 1,
                 new_engines: Callable[[], EngineSource] | None = None, fleet: Fleet | None = None,
                 on_slot_bus: Callable[[Bus], None] | None = None) -> None:
        self.spec = spec or default_ladder(config)
        self.base = ladder_base(config, self.spec)
        self.bus = bus
        self.profile = profile
        self.engines = engines
        self.recorder = recorder
        self.telemetry = telemetry
        self._references: dict[str, Reference] = {}
        """Run name -> the reference its quality probe compares with (the baseline step's outputs)."""
        self.runner_factory: Callable[..., RunnerLike] = with_quality_references(runner_factory or Runner,
                                                                                 self._references)
        self._baseline_outputs: Reference | None = None
        self._baseline_index: int | None = None
        self.quality = self._quality_config(config)
        """The probe the baseline and each precision or speculative step run, or None."""
        self.ladder_id = ladder_id or uuid.uuid4().hex[:12]
        self.gpu = gpu or self.spec.gpu
        self.max_parallel = max_parallel
        """Steps at once: each then builds on the step before it in the plan, not on the last that ran."""
        self.new_engines = new_engines
        self.fleet = fleet
        """A cluster's slots: each step is a trial placed there (``app.fleet``)."""
        self.on_slot_bus = on_slot_bus
        self.machine = MachineFacts(hardware, flags, discover_flags)
        self._last_ran: RunConfig | None = None
        self._last_index: int | None = None  # steps side by side: the step the next one is built on
        self._configs: dict[int, RunConfig] = {}
        self._hardware: list[dict[str, Any]] = []  # what each completed run ran on
        self._lock = threading.Lock()
        self.campaign: Campaign | None = None
        self.campaign_result: Any = None
        self._resumed: LadderState | None = None
        self.cluster: ClusterOptions | None = None
        """The cluster options it runs with, kept in its state (``tunebench resume`` reuses them)."""
        self.state = self._new_state()

    # -- quality ----------------------------------------------------------------------------------

    def _quality_config(self, config: RunConfig) -> QualityConfig | None:
        """On for the baseline and the steps that change precision or speculative decoding, where
        there is such a step or the profile asks for it; off where the profile says no."""
        asked = config.quality
        if asked is not None and not asked.enabled:
            return None
        if asked is not None or any(changes_quality(step.features) for step in self.spec.steps):
            return asked or QualityConfig()
        return None

    def _probes(self, index: int) -> bool:
        """Whether step ``index`` runs the probe: the baseline (the first to run, the reference),
        every step where the profile asks for it, else the steps that change precision or
        speculative decoding."""
        if self.quality is None:
            return False
        return (self._baseline_index in (None, index) or self.base.quality is not None
                or changes_quality(self.spec.steps[index].features))

    def _with_quality(self, index: int, config: RunConfig) -> RunConfig:
        """The step's configuration with the probe, and the baseline's outputs handed to its runs."""
        if not self._probes(index):  # a step built on one that probed does not inherit its probe
            return config.model_copy(update={"quality": self.base.quality})
        assert self.quality is not None
        if self._baseline_index is None:
            self._baseline_index = index
        elif index != self._baseline_index:
            if self._baseline_outputs is None:
                self._baseline_outputs = self._stored_baseline()
            self._references[config.name] = self._baseline_outputs
        return config.model_copy(update={"quality": self.quality})

    def _stored_baseline(self) -> Reference:
        """The baseline's outputs: kept from its run in this session, else from the store (a resumed
        ladder), else why there are none."""
        row = self.state.rows[self._baseline_index or 0]
        label = f"step {row.index + 1} ({row.name})"
        if row.run_ids and self.recorder is not None:
            reference = stored_reference(self.recorder.store, str(row.run_ids[0]))
            reference.kind, reference.label = "ladder baseline", label
            return reference
        return Reference(kind="ladder baseline", label=label,
                         problem=f"the baseline, {label}, kept no outputs to compare with (it has not run, "
                                 "or runs beside this step)")

    def _take_quality(self, row: StepRow, outcome: StepResult) -> None:
        measured = next((r.quality for r in outcome.runs if r.quality is not None), None)
        if measured is None:
            return
        row.quality = measured.shown()
        if row.index == self._baseline_index and measured.measured:
            self._baseline_outputs = Reference.of_figures(measured.model_dump(mode="json"), "ladder baseline",
                                                   run_id=row.run_ids[0] if row.run_ids else None,
                                                   label=f"step {row.index + 1} ({row.name})")

    # -- names ------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.spec.name or f"{self.base.name}: acceleration ladder"

    def run_name(self, index: int, step: LadderStepSpec) -> str:
        return f"{self.name} [{index + 1}/{len(self.spec.steps)}] {step.name}"

    def _new_state(self) -> LadderState:
        rows = [StepRow(index=i, name=s.name, note=s.note) for i, s in enumerate(self.spec.steps)]
        return LadderState(ladder_id=self.ladder_id, name=self.name, profile=self.profile, started_wall_s=time.time(),
                           workload=workload_text(self.base), model=self.base.engine.model, rows=rows,
                           spec=self.spec.model_dump(mode="json", exclude_none=True),
                           base_config=mask_obj(self.base.model_dump(mode="json", exclude_none=True)),
                           cluster=self.cluster)

    @classmethod
    def resume(cls, stored: LadderState, bus: Bus, **options: Any) -> Ladder:
        """A stored ladder that did not finish every step, to go on where it stopped: the steps
        before the first one left unfinished are kept (their runs and figures), that one and every
        later one run again (a step builds on the one before it). ``options``: as for the
        constructor."""
        if stored.status == "running":
            raise UserError(f"ladder {stored.ladder_id} is still running (pid {stored.writer_pid}): nothing to resume")
        if next((r for r in stored.rows if r.status not in KEPT_STEPS), None) is None:
            raise UserError(f"ladder {stored.ladder_id} ran every step: nothing to resume")
        if not stored.spec or not stored.base_config:
            raise UserError(f"ladder {stored.ladder_id} was stored before ladders kept what a resume needs: run it "
                            f"again (tunebench ladder {stored.profile or 'PROFILE'})")
        try:
            config, spec = RunConfig.model_validate(stored.base_config), LadderSpec.model_validate(stored.spec)
        except ValidationError as exc:
            raise UserError(f"ladder {stored.ladder_id} cannot be resumed: its stored configuration is not valid any "
                            f"more: {exc.errors()[0]['msg']}") from None
        ladder = cls(config, bus, spec=spec, profile=stored.profile, ladder_id=stored.ladder_id, **options)
        ladder._resumed = stored
        return ladder

    # -- checks -----------------------------------------------------------------------------------

    def _ensure_checked(self, for_plan: bool = False) -> None:
        """Hardware probed and the engine's flags discovered once (the GUI passes its own)."""
        def probe() -> HardwareInfo:
            here = probe_hardware()
            tp = self.base.features.gpu_count
            cpu = self.base.engine.runtime.kind == "managed" and "cpu" in self.base.engine.runtime.managed
            return target_hardware(self.gpu, tp) if for_plan and self.gpu and not here.has_gpu and not cpu else here

        self.machine.learn(self.base, probe, lambda base, hardware: check_config(base, hardware=hardware).flags)

    def build_step(self, index: int, previous: RunConfig) -> tuple[RunConfig | None, str | None]:
        """Step ``index`` built on ``previous`` (the last step that ran): its configuration, or
        None and why it cannot run here."""
        step = self.spec.steps[index]
        tags = [t for t in self.base.tags if not t.startswith(TAG)]
        try:
            config = apply_step(previous, step, name=self.run_name(index, step), tags=tags)
        except LadderError as exc:
            return None, str(exc)
        self._ensure_checked()
        report = check_config(config, discover_flags=False, hardware=self.machine.hardware, flags=self.machine.flags)
        changed = [k for k, _a, _b in config_diff(previous, config)] if index else []
        return config, skip_reason(report.issues, changed)

    def _fill_planned(self, row: StepRow, previous: RunConfig | None, config: RunConfig, ran_before: RunConfig | None,
                      index: int) -> None:
        diff = config_diff(previous, config) if index else []
        row.changes = [SettingChange(setting=k, label=setting_label(k), before=a, after=b) for k, a, b in diff]
        row.change = describe_change(diff) if index else "the starting point"
        row.concurrency = config.load.concurrency if config.load.pattern.closed_loop else None
        row.gpus = config.features.gpu_count
        row.engine_restart = ran_before is None or engine_key(ran_before) != engine_key(config)
        row.config = mask_obj(config.model_dump(mode="json", exclude_none=True))
        row.reference_tok_per_s, row.reference_label = self._reference(index, config)

    def plan(self) -> LadderState:
        """Every step built and checked without launching anything, with its planned ceiling at
        its concurrency (``tunebench ladder PROFILE --dry-run``; a GPU ladder on a machine
        without a GPU is checked and planned for the ladder's ``gpu``)."""
        self._ensure_checked(for_plan=True)
        state = self._new_state()
        previous = self.base
        ran_before: RunConfig | None = None
        for index, row in enumerate(state.rows):
            config, reason = self.build_step(index, previous)
            if config is not None:
                self._fill_planned(row, previous, config, ran_before, index)
            if reason is not None:
                row.status, row.reason = "skipped", reason
                continue
            assert config is not None
            self._ceiling(row, config, float(config.load.concurrency), None)
            previous = ran_before = config
        state.planned_for = self._planned_for(self.base)
        state.reference = self._reference_source()
        return state

    # -- running ----------------------------------------------------------------------------------

    def run(self, cancel: threading.Event | None = None) -> LadderState:
        cancel = cancel or threading.Event()
        self._ensure_checked()
        planned = self.plan()
        if all(r.status == "skipped" for r in planned.rows):
            raise LadderError(f"no step of the ladder can run on this machine: step '{planned.rows[0].name}': "
                              f"{planned.rows[0].reason}")
        from engine_adapters.process_group import process_identity

        state = self.state = self._new_state()
        state.writer_pid, state.writer_create_time = process_identity()
        state.planned_for = planned.planned_for
        state.reference = planned.reference
        for row, plan_row in zip(state.rows, planned.rows, strict=True):
            row.change, row.changes, row.concurrency = plan_row.change, plan_row.changes, plan_row.concurrency
            row.engine_restart, row.config = plan_row.engine_restart, plan_row.config
            row.reference_tok_per_s, row.reference_label = plan_row.reference_tok_per_s, plan_row.reference_label
        start_at = self._keep_resumed(state) if self._resumed is not None else 0
        self._publish(store=False)
        steps = [Step(s.name, self.base, self.spec.repeats) for s in self.spec.steps]
        self.campaign = Campaign(steps, self.bus, engines=self.engines, recorder=self.recorder,
                                 telemetry=self.telemetry, stop_on_failure=False, campaign_id=self.ladder_id,
                                 runner_factory=self.runner_factory, prepare=self._prepare,
                                 on_step_start=self._step_started, on_step_done=self._step_done,
                                 extra_tags=[TAG + self.ladder_id], new_engines=self.new_engines, fleet=self.fleet,
                                 on_slot_bus=self.on_slot_bus)
        try:
            result = self.campaign_result = self.campaign.run(cancel, start_at=start_at,
                                                              max_parallel=self.max_parallel)
        except BaseException as exc:
            self._end("interrupted", f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyboardInterrupt)
                      else "interrupted")
            raise
        if result.status == "cancelled" or cancel.is_set():
            self._end("cancelled", "cancelled")
        elif not state.completed_rows:
            failed = [r for r in state.rows if r.status in ("failed", "skipped")]
            self._end("failed", "; ".join(f"step '{r.name}': {r.reason}" for r in failed) or "no step ran")
        else:
            failed = [r for r in state.rows if r.status == "failed"]
            self._end("completed", "; ".join(f"step '{r.name}' failed: {r.reason}" for r in failed) or None)
        return state

    def _keep_resumed(self, state: LadderState) -> int:
        """Take over the resumed ladder's kept steps and claim it; the first step to run again."""
        resumed = self._resumed
        assert resumed is not None
        start_at = next(i for i, r in enumerate(resumed.rows) if r.status not in KEPT_STEPS)
        state.rows[:start_at] = [r.model_copy(deep=True) for r in resumed.rows[:start_at]]
        state.replaced_run_ids = resumed.replaced_run_ids + [i for r in resumed.rows[start_at:] for i in r.run_ids]
        state.started_wall_s, state.revision = resumed.started_wall_s, resumed.revision
        state.engine_launches, state.engine_version = resumed.engine_launches, resumed.engine_version
        state.hardware, state.model = resumed.hardware or state.hardware, resumed.model or state.model
        kept_baseline = next((r for r in state.rows[:start_at] if r.status == "completed" and r.quality), None)
        if kept_baseline is not None:  # its outputs come back from the store when a step needs them
            self._baseline_index = kept_baseline.index
        previous = self.base
        for index in range(start_at):  # the kept steps rebuilt: the next one builds on the last that ran
            if resumed.rows[index].status == "completed":
                config, _reason = self.build_step(index, previous)
                if config is not None:
                    previous = self._last_ran = config
        self.bus.emit(LogLine.note(f"resuming ladder {self.ladder_id}: {start_at} step(s) kept, running from step "
                                   f"{start_at + 1} ({state.rows[start_at].name})"))
        if self.recorder is not None:
            from app.ladder.stored import claim_ladder

            claim_ladder(self.recorder.store, self.ladder_id)
        return start_at

    def _prepare(self, index: int, step: Step, outcomes: Sequence[StepResult]) -> Step | str:
        row = self.state.rows[index]
        previous = self._last_ran or self.base
        config, reason = self.build_step(index, previous)
        if config is not None:
            self._fill_planned(row, previous, config, self._last_ran, index)
        if reason is not None or config is None:
            row.status, row.reason = "skipped", reason or "cannot be built"
            return row.reason
        config = self._with_quality(index, config)
        self._configs[index] = config
        if self.max_parallel > 1:  # every step is prepared before any runs: the next builds on this one
            row.built_on, self._last_ran, self._last_index = self._last_index, config, index
        return Step(step.name, config, self.spec.repeats)

    def _step_started(self, index: int, step: Step) -> None:
        row = self.state.rows[index]
        row.status, row.reason = "running", None
        self._publish(store=True)

    def _step_done(self, index: int, outcome: StepResult) -> None:
        row = self.state.rows[index]
        if outcome.status == "skipped":
            row.status, row.reason = "skipped", outcome.reason
            self._publish(store=True)
            return
        row.status = "completed" if outcome.status == "completed" else outcome.status
        row.reason = outcome.reason
        row.run_ids = list(outcome.stored_ids)
        row.runs = len(outcome.runs)
        row.engine_reused = outcome.engine_reused
        self.state.engine_launches += 0 if outcome.engine_reused else 1 if outcome.runs else 0
        first = outcome.runs[0] if outcome.runs else None
        if first is not None:
            row.startup_s = None if outcome.engine_reused else first.startup_s
            self.state.engine_version = self.state.engine_version or first.engine_version
            self.state.hardware = self.state.hardware or dict(first.hardware)
            self.state.model = first.model or self.state.model
        self._take_quality(row, outcome)
        if outcome.status == "completed":
            self._figures(row, outcome)
            self._last_ran = self._configs[index]
            self._hardware.extend(r.hardware for r in outcome.runs if r.status == "completed")
            self.state.unfair = unfair_hardware(self._hardware)
        self._say_what_it_was_built_on()
        compute_factors(self.state.rows)
        self._publish(store=True)

    def _say_what_it_was_built_on(self) -> None:
        """Steps side by side: a step built on one that then did not run says so (its change
        against the last step that ran is more than its own)."""
        for row in self.state.rows:
            base = None if row.built_on is None else self.state.rows[row.built_on]
            if base is not None and base.status in ("failed", "cancelled", "interrupted") and row.status == "completed":
                row.reason = f"built on step {base.index + 1} ({base.name}), which {base.status}"

    def _figures(self, row: StepRow, outcome: StepResult) -> None:
        agg = outcome.aggregate

        def mean(key: str) -> float | None:
            a = agg.get(key)
            return None if a is None else a.mean

        unreliable: set[str] = set()
        for run in outcome.runs:
            if len(run.levels) == 1:
                unreliable |= set(run.levels[0].summary.unreliable())
        row.output_tok_per_s = mean("output_tok_per_s")
        out = agg.get("output_tok_per_s")
        row.output_ci_tok_per_s = out.half_width if out is not None and out.n > 1 else None
        row.total_tok_per_s = mean("total_tok_per_s")
        row.prefix_cache_hit_rate = mean("prefix_cache_hit_rate")
        row.tokens_per_step = mean("engine_tokens_per_step_mean")
        for attr, key in (("ttft", "ttft_ms_p50"), ("itl", "itl_ms_p50")):
            alt = catalog.metric(key).engine_alternative
            use = alt if key in unreliable and alt and mean(alt) is not None else key
            setattr(row, f"{attr}_ms", mean(use))
            setattr(row, f"{attr}_label", catalog.metric(use).name)
        last: RunResult | None = outcome.runs[-1] if outcome.runs else None
        checks = [StepCheck(feature=str(c.get("key")), requested=str(c.get("requested")), status=feature_status(c),
                            evidence=str(c.get("evidence") or "")) for c in (last.feature_checks if last else [])]
        batch = self._batch_check(row)
        if batch is not None:
            checks.append(batch)
        row.checks = checks
        row.verification = verification_of(checks)
        config = self._configs[row.index]
        from app.planner.live import running_batch

        closed = float(config.load.concurrency) if config.load.pattern.closed_loop else None
        measured_batch, _source = running_batch(row.tokens_per_step, closed)
        self._ceiling(row, config, measured_batch or float(config.load.concurrency), mean("spec_acceptance_rate"))

    def _batch_check(self, row: StepRow) -> StepCheck | None:
        """A step that raised the concurrency: did the engine run bigger batches? (its tokens per
        step against the previous step's)."""
        change = next((c for c in row.changes if c.setting == "load.concurrency"), None)
        if change is None or not isinstance(change.before, int) or not isinstance(change.after, int) \
                or change.after <= change.before:
            return None
        before = next((r for r in reversed(self.state.rows[:row.index]) if r.ran), None)
        requested = f"concurrency {change.before} -> {change.after}"
        if before is None or before.tokens_per_step is None or row.tokens_per_step is None:
            return StepCheck(feature="load.concurrency", requested=requested, status="unknown",
                             evidence="the engine's tokens per step were not read")
        ratio = row.tokens_per_step / before.tokens_per_step if before.tokens_per_step else float("inf")
        seen = (f"the engine ran {row.tokens_per_step:,.1f} tokens per step, {ratio:.1f}x the previous step's "
                f"{before.tokens_per_step:,.1f}")
        return StepCheck(feature="load.concurrency", requested=requested,
                         status="verified" if ratio >= BATCH_VERIFIED_RATIO else "not active",
                         evidence=seen if ratio >= BATCH_VERIFIED_RATIO else seen + ": the batches did not grow")

    # -- the physics and the reference ------------------------------------------------------------

    def _plan_gpu(self) -> str | None:
        """The card to plan for: this machine's GPU when it has one, else the ladder's own."""
        return None if probe_hardware().has_gpu else self.gpu

    def _ceiling(self, row: StepRow, config: RunConfig, batch: float, acceptance: float | None) -> None:
        from app.planner import PlannerError, make_plan
        from app.planner.live import limit_at
        from app.planner.plan import decode_ceiling

        try:
            plan = make_plan(config, gpu=self._plan_gpu(), batches=[max(1, round(batch))], acceptance_rate=acceptance)
        except (PlannerError, UserError) as exc:
            row.ceiling_note = f"no ceiling: {exc}"
            return
        row.ceiling_batch = batch
        row.ceiling_tok_per_s = decode_ceiling(plan, batch)
        figures = limit_at(plan, row.output_tok_per_s, batch, batch_source="")  # the one "% of limit" rule
        if figures is not None:
            row.percent_of_limit, row.ceiling_note = figures.fraction, figures.flag

    def _planned_for(self, config: RunConfig) -> str:
        from app.planner import PlannerError
        from app.planner.plan import resolve_hardware

        try:
            hw = resolve_hardware(config, self._plan_gpu(), None)
        except (PlannerError, UserError) as exc:
            return f"not planned: {exc}"
        return f"{hw.name} x{hw.count}" + (" (planned: no such GPU here)" if hw.kind == "gpu"
                                            and not probe_hardware().has_gpu else "")

    def _reference_applies(self, config: RunConfig) -> bool:
        """The seeds' figures are for their model on an H800-class card: shown when the step's
        model is that model (or its BF16 original) and the card has the same bandwidth and FP8
        compute as the seeds' one."""
        from app.planner.seeds import SEED_GPU, SEED_MODEL
        from engine_adapters.gpu_specs import find_gpu_spec

        if self.spec.reference != "seeds" or config.engine.model not in (SEED_MODEL, SEED_MODEL.removesuffix("-FP8")):
            return False
        here = probe_hardware()
        name = here.gpus[0].name if here.gpus else self.gpu
        card, seeds = (find_gpu_spec(name) if name else None), find_gpu_spec(SEED_GPU)
        return card is not None and seeds is not None and (card.memory_bandwidth_bytes_per_s, card.fp8_dense_tflops) \
            == (seeds.memory_bandwidth_bytes_per_s, seeds.fp8_dense_tflops)

    def _reference(self, index: int, config: RunConfig) -> tuple[float | None, str | None]:
        from app.planner.seeds import SEED_GPU, SEED_ROWS

        row = self.spec.steps[index].seed_row
        if row is None or not self._reference_applies(config):
            return None, None
        seed = SEED_ROWS[row]
        return seed.claimed_tok_per_s, f"reference: the seeds' table, {seed.step} ({SEED_GPU})"

    def _reference_source(self) -> str | None:
        if self.spec.reference != "seeds":
            return None
        from app.planner.seeds import SEED_GPU, SEED_MODEL

        return f"the seeds' stacking table ({SEED_MODEL} on one {SEED_GPU}; claimed figures, not measured here)"

    # -- publishing -------------------------------------------------------------------------------

    def _end(self, status: Any, reason: str | None) -> None:
        self.state.status, self.state.reason = status, reason
        self.state.ended_wall_s = time.time()
        for row in self.state.rows:
            if row.status == "running":
                row.status = "interrupted" if status == "interrupted" else "cancelled"
            elif row.status == "pending" and status in ("cancelled", "interrupted"):
                row.reason = row.reason or f"not run: the ladder was {status}"
        self._publish(store=True)

    def _publish(self, store: bool) -> None:
        """The state on the bus, and into the store (the campaign and its runs)."""
        with self._lock:
            self.state.revision += 1
            snapshot = self.state.model_copy(deep=True)
        if store and self.recorder is not None:
            from app.ladder.stored import save_ladder

            try:
                save_ladder(self.recorder.store, snapshot)
            except Exception as exc:  # the store's own error: said once, the ladder goes on
                errors = getattr(self.recorder, "errors", None)
                note = f"ladder state not stored: {exc}"
                if isinstance(errors, list) and note not in errors:
                    errors.append(note)
        self.bus.emit(CampaignUpdated(state=snapshot))


def run_ladder(config: RunConfig, bus: Bus, cancel: threading.Event | None = None, *, spec: LadderSpec | None = None,
               profile: str = "", engines: EngineSource | None = None, db_path: str | None = None, record: bool = True,
               telemetry: bool = True, hardware: HardwareInfo | None = None, flags: FlagSet | None = None,
               runner_factory: Callable[..., RunnerLike] | None = None, fleet: Fleet | None = None,
               max_parallel: int = 1, on_slot_bus: Callable[[Bus], None] | None = None) -> LadderState:
    """A ladder recorded to the run database (what the GUI's Ladder tab does; it passes the
    hardware and flags it probed once, and a cluster's ``fleet`` when one is chosen)."""
    recorder = None
    if record:
        from app.recording import record_to_default_store

        recorder = record_to_default_store(bus, db_path)
    try:
        return Ladder(config, bus, spec=spec, profile=profile, engines=engines, recorder=recorder, telemetry=telemetry,
                      hardware=hardware, flags=flags, discover_flags=flags is None,
                      runner_factory=runner_factory, fleet=fleet, max_parallel=max_parallel,
                      on_slot_bus=on_slot_bus).run(cancel)
    finally:
        if recorder is not None:
            recorder.close()
