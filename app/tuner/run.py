"""Running a tune: :class:`Tuner` searches a space of engine configurations for the one with the
most output tok/s per GPU under the SLO, one :class:`app.campaign.Campaign` per configuration:
pruned before launch, goodput per configuration (loads lowest first, stopping at the first missed
SLO), grid or Bayesian search, infeasible configurations recorded, resumable from the store.
One module because the search loop, its resume and its stopping rules share one state and one
cancel path. The design is in docs/tuner.md.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from app.bus import Bus
from app.campaign import (
    Campaign,
    EngineKeeper,
    MachineFacts,
    Step,
    StepResult,
    aggregate_figures,
    with_quality_references,
)
from app.config import RunConfig
from app.engines import check_config
from app.errors import UserError
from app.events import CampaignUpdated, LogLine
from app.executor import EngineSource, Executor, Fleet, Places, Recorder, RunnerLike, Slot
from app.quality.bounds import QUALITY_FEATURES, changes_quality, quality_failures
from app.quality.config import QualityConfig
from app.quality.probe import Reference
from app.quality.stored import stored_reference
from app.runner import Runner, RunResult
from app.slo import SloError, parse_run_slo, slo_text
from app.tuner.slo import judge, per_gpu, per_user
from app.tuner.space import SearchSpace, apply_knobs, candidates, knob, knob_text, normalized, trial_config
from app.tuner.state import DONE_TRIALS, Candidate, Confirmation, Pick, Trial, TuneState
from engine_adapters.base import FlagSet, ValidationIssue
from engine_adapters.hardware import HardwareInfo, probe_hardware
from engine_adapters.secrets import mask_obj

TAG = "tune:"
"""Every run of a tune carries ``tune:<id>`` (and the campaign's tags)."""
DEFAULT_BAYES_CANDIDATES = 20
MAX_DUPLICATE_ASKS = 20
"""The sampler proposed known configurations this many times in a row: try an untried one."""
INFEASIBLE_CONSTRAINT = 1.0


def _engine_died(reason: str | None) -> bool:
    return bool(reason) and ("engine exited" in (reason or "") or "engine could not start" in (reason or ""))


def _figures(run: RunResult) -> dict[str, float]:
    return run.levels[0].summary.figures() if run.levels else {}


def prune_reason(config: RunConfig, changed: Sequence[str], issues: Sequence[ValidationIssue]) -> str | None:
    """Why a configuration cannot run here (an error, or a warning on a knob it sets: that setting
    would have no effect); None when it can."""
    fields = [knob(name).path for name in changed]
    errors = [i for i in issues if i.severity == "error"]
    touching = [i for i in issues if i.severity == "warning" and any(
        f == i.field or i.field.startswith(f + ".") or f.startswith(i.field + ".") for f in fields)]
    chosen = errors or touching
    return "; ".join(f"{i.field}: {i.message}" for i in chosen) if chosen else None


class Tuner:
    """One tune (see the module docstring): :meth:`plan` prunes without launching; :meth:`run`
    (blocking, from a worker thread) searches and returns the final :class:`TuneState`."""

    def __init__(self, config: RunConfig, bus: Bus, *, slo: str, space: SearchSpace, strategy: str = "grid",
                 max_candidates: int | None = None, budget_s: float | None = None, repeats: int = 0,
                 profile: str = "", name: str | None = None, recorder: Recorder | None = None, store: Any = None,
                 engines: EngineSource | None = None, runner_factory: Callable[..., RunnerLike] | None = None,
                 telemetry: bool = True, hardware: HardwareInfo | None = None, flags: FlagSet | None = None,
                 discover_flags: bool = True, plan_gpu: str | None = None, tune_id: str | None = None,
                 seed: int = 0, clock: Callable[[], float] = time.monotonic, fleet: Fleet | None = None,
                 max_parallel: int = 1, on_slot_bus: Callable[[Bus], None] | None = None,
                 new_engines: Callable[[], EngineSource] | None = None) -> None:
        if strategy not in ("grid", "bayes"):
            raise UserError(f"unknown strategy '{strategy}' (grid or bayes)")
        if max_candidates is not None and max_candidates < 1:
            raise UserError(f"--trials must be at least 1 (got {max_candidates})")
        if budget_s is not None and budget_s <= 0:
            raise UserError("--budget must be positive")
        if repeats == 1 or repeats < 0:
            raise UserError(f"--repeats must be 0 (off) or at least 2 to give a confidence interval (got {repeats})")
        if max_parallel < 1:
            raise UserError(f"--parallel must be at least 1 (got {max_parallel})")
        self.base = config
        self.bus = bus
        self.space = space
        self.slo = slo
        try:
            self.run_slo = parse_run_slo(slo)
        except SloError as exc:
            raise UserError(f"--slo: {exc}") from None
        if not self.run_slo.requests:
            raise UserError("--slo: a tune needs at least one per-request bound (e.g. ttft_ms<=500) beside its "
                            "quality bounds")
        self.quality = self._quality_config(config, space)
        """The probe each candidate runs once (with its first load), or None: quality not measured."""
        self._reference: Reference | None = None
        self._references: dict[str, Reference] = {}
        """Trial name -> the reference its probe compares with."""
        self.recorder = recorder
        self.store = store if store is not None else (recorder.store if recorder is not None else None)
        self.engines = engines
        self.runner_factory: Callable[..., RunnerLike] = with_quality_references(runner_factory or Runner,
                                                                                 self._references)
        self.telemetry = telemetry
        self.plan_gpu = plan_gpu
        self.clock = clock
        self.fleet = fleet
        """Where trials run when not on this machine: each configuration's search is a campaign on the cluster."""
        self.max_parallel = max_parallel
        """How many configurations are searched at once, each with its own bus, recorder and engines."""
        self.on_slot_bus = on_slot_bus
        """Called with each configuration's own bus when they run side by side, so a face can follow it."""
        self.new_engines = new_engines or EngineKeeper
        """Each side-by-side search's own engine source on this machine."""
        self._lock = threading.RLock()  # the state, the store and the sampler, shared by the searches at once
        self._places: Places | None = None  # where the searches run (set when the tune runs)
        self.machine = MachineFacts(hardware, flags, discover_flags)
        self._rng = random.Random(seed)
        self.seed = seed
        self._keeper: EngineSource | None = None
        self._session_start = 0.0
        self._elapsed_before = 0.0
        self._stopped: set[int] = set()
        """Candidates whose search stops at the next load (the SLO missed, the budget out, cancelled)."""
        self._budget_out = False
        self._launches_before = 0
        self._resumed = False
        self._stale: dict[tuple[int, float], int] = {}
        self.state = TuneState(
            tune_id=tune_id or uuid.uuid4().hex[:12], name=name or f"{profile or config.name}: tune under {slo}",
            profile=profile, slo=slo, percentile=space.percentile, strategy=strategy, started_wall_s=time.time(),
            budget_candidates=max_candidates, budget_s=budget_s, repeats=repeats,
            space=space.model_dump(mode="json"), base_config=mask_obj(config.model_dump(mode="json", exclude_none=True)))

    # -- resuming -------------------------------------------------------------------------------

    @classmethod
    def resume(cls, stored: Any, bus: Bus, *, max_candidates: int | None = None, budget_s: float | None = None,
               **kwargs: Any) -> Tuner:
        """A tune read back from the store (``db.tune_store.StoredTune``), to go on where it
        stopped: completed trials are kept, the rest run again. A new budget replaces the old."""
        if stored.status == "completed":
            raise UserError(f"tune {stored.id} is complete: nothing to resume")
        if stored.status == "running" and stored.writer_is_alive:
            raise UserError(f"tune {stored.id} is still running (process {stored.writer_pid})")
        doc = dict(stored.doc)
        try:
            config = RunConfig.model_validate(doc.get("base_config") or {})
            space = SearchSpace.model_validate(doc.get("space") or {})
        except Exception as exc:  # a stored tune from an incompatible version
            raise UserError(f"tune {stored.id} cannot be resumed: its stored configuration is not valid any more: "
                            f"{exc}") from None
        tuner = cls(config, bus, slo=stored.slo, space=space, strategy=stored.strategy,
                    max_candidates=max_candidates if max_candidates is not None else doc.get("budget_candidates"),
                    budget_s=budget_s if budget_s is not None else doc.get("budget_s"),
                    repeats=int(doc.get("repeats") or 0), profile=stored.profile, name=stored.name, tune_id=stored.id,
                    **kwargs)
        st = tuner.state
        st.started_wall_s = float(doc.get("started_wall_s") or stored.created_at)
        st.notes = list(doc.get("notes") or [])
        tuner._elapsed_before = float(doc.get("elapsed_s") or 0.0)
        tuner._launches_before = int(doc.get("engine_launches") or 0)
        st.trials = [Trial.from_stored(t) for t in stored.trials]
        tuner._resumed = True
        return tuner

    @property
    def _request_slo(self) -> str:
        """The SLO a trial's requests are counted against (goodput): the per-request bounds, as
        given where the SLO has no quality bound."""
        return self.run_slo.request_text if self.run_slo.quality else self.slo

    # -- quality --------------------------------------------------------------------------------

    def _quality_config(self, config: RunConfig, space: SearchSpace) -> QualityConfig | None:
        """The probe the candidates run: on where the SLO bounds quality, the space changes
        precision or speculative decoding, or the profile asks for it; off where the profile says no."""
        asked = config.quality
        bounds = self.run_slo.quality
        if asked is not None and not asked.enabled:
            if bounds:
                raise UserError(f"--slo bounds quality ({slo_text(bounds)}) but the profile turns the quality probe "
                                "off ([quality] enabled = false)")
            return None
        if bounds or asked is not None or changes_quality(knob(name).path for name in space.knobs):
            return asked or QualityConfig()
        return None

    @staticmethod
    def _precision(config: RunConfig) -> dict[str, Any]:
        dumped = config.features.model_dump(mode="json")
        return {name: dumped.get(name) for name in QUALITY_FEATURES}

    def _reference_candidate(self) -> Candidate | None:
        """The tune's reference configuration: the first candidate that keeps the profile's own
        precision and speculative decoding."""
        own = self._precision(self.base)
        return next((c for c in self.state.candidates if c.status != "pruned"
                     and self._precision(apply_knobs(self.base, c.knobs)) == own), None)

    def _start_quality(self) -> Candidate | None:
        """Says how quality weighs on the pick (and where it does not: blind), and returns the
        reference candidate, searched before the others so they compare with its outputs."""
        st = self.state
        bounds = self.run_slo.quality
        changing = sorted({knob(n).path for n in self.space.knobs if changes_quality([knob(n).path])})
        info: dict[str, Any] = {"bounds": slo_text(bounds) if bounds else ""}
        if changing and not bounds:
            info["blind"] = (f"the space changes {', '.join(changing)} but the SLO bounds no quality: the pick is made "
                             "on speed alone, blind to what it costs in quality (add e.g. agreement>=0.99 to --slo)")
            self._note("tune: " + info["blind"])
        reference = self._reference_candidate() if self.quality is not None else None
        if self.quality is not None and reference is None:
            if bounds:
                raise UserError("--slo bounds quality, but no configuration of the space keeps the profile's own "
                                f"{', '.join(QUALITY_FEATURES)}: there is no reference to measure quality against")
            self._note("tune: quality not measured: no configuration of the space keeps the profile's own precision "
                       "(the reference)")
            self.quality = None
        if reference is not None:
            info["reference"] = reference.label or "the profile's own configuration"
            info["reference_candidate"] = reference.index
            if reference.status != "pending" and self._reference is None:
                self._reference = self._stored_reference(reference)
        st.quality = {**{k: v for k, v in st.quality.items() if k not in ("blind", "reference")}, **info}
        return reference

    def _stored_reference(self, cand: Candidate) -> Reference:
        """A resumed tune's reference: the outputs its reference candidate's first trial stored."""
        first = min((t for t in self.state.trials if t.measured and t.candidate == cand.index and t.run_id is not None),
                    key=lambda t: t.load_value or 0.0, default=None)
        if first is None or first.run_id is None:
            return Reference(kind="tune reference", label=cand.label,
                             problem="the reference configuration's outputs were not stored")
        reference = stored_reference(self.store, str(first.run_id))
        reference.kind, reference.label = "tune reference", cand.label
        return reference

    def _take_quality(self, cand: Candidate, trial: Trial, run: RunResult) -> None:
        """A candidate's quality, measured with its first load: kept, the reference's outputs
        remembered, and the bounds it misses named."""
        figures = run.quality
        if figures is None or cand.quality is not None:
            return
        cand.quality = figures.shown()
        if cand.index == self.state.quality.get("reference_candidate"):
            self._reference = Reference.of_figures(figures.model_dump(mode="json"), "tune reference",
                                                   run_id=trial.run_id, label=cand.label)
        failures = quality_failures(cand.quality, self.run_slo.quality)
        if failures:
            cand.quality_excluded = "; ".join(failures)
            self._note(f"tune: {cand.label or 'the profile as is'}: excluded by the quality bounds: "
                       f"{cand.quality_excluded}")

    # -- planning -------------------------------------------------------------------------------

    def _ensure_checked(self) -> None:
        self.machine.learn(self.base, probe_hardware, lambda base, hardware: check_config(base, hardware=hardware).flags)

    def _plan_problem(self, config: RunConfig) -> tuple[str | None, str | None]:
        """(why the memory plan says it cannot run, or None; a note when no plan can be made)."""
        from app.planner import PlannerError, make_plan

        try:
            plan = make_plan(config, gpu=self.plan_gpu, batches=[1])
        except (PlannerError, UserError) as exc:
            return None, f"not planned: {exc}"
        if not plan.memory.fits:
            return "the memory plan says it does not fit: " + "; ".join(plan.warnings[:1]), None
        too_long = [w for w in plan.warnings if w.startswith("max_model_len")]
        if too_long:
            return f"the memory plan says the engine would refuse to start: {too_long[0]}", None
        return None, None

    def plan(self) -> TuneState:
        """Every configuration listed and judged without launching anything."""
        self._ensure_checked()
        previous = {c.index: c for c in self.state.candidates}
        cands: list[Candidate] = []
        plan_note: str | None = None
        for i, knobs in enumerate(candidates(self.space)):
            cand = Candidate(index=i, knobs=knobs, label=knob_text(knobs))
            config = apply_knobs(self.base, knobs)
            f = config.features
            cand.gpus = f.gpu_count
            report = check_config(config, discover_flags=False, hardware=self.machine.hardware, flags=self.machine.flags)
            reason = prune_reason(config, list(knobs), report.issues)
            if reason is None:
                reason, note = self._plan_problem(config)
                plan_note = plan_note or note
            if reason is not None:
                cand.status, cand.reason = "pruned", reason
            elif i in previous and previous[i].status not in ("pruned",):
                cand.status, cand.best_trial, cand.binding = previous[i].status, previous[i].best_trial, \
                    previous[i].binding
                cand.quality, cand.quality_excluded = previous[i].quality, previous[i].quality_excluded
            cands.append(cand)
        self.state.candidates = cands
        if plan_note and plan_note not in self.state.notes:
            self.state.notes.append(plan_note)
        self._restore_candidates()
        return self.state

    def _restore_candidates(self) -> None:
        """Candidates whose search the kept trials already finished (a resumed tune)."""
        kept = [t for t in self.state.trials if t.measured and t.status in DONE_TRIALS]
        for t in self.state.trials:  # running or cancelled when the tune stopped: they run again
            if t.measured and t.status not in DONE_TRIALS and t.load_value is not None:
                self._stale[(t.candidate, t.load_value)] = t.index
        self.state.trials = sorted(kept + [t for t in self.state.trials if not t.measured], key=lambda t: t.index)
        top = max(self.space.load.values)
        for cand in self.state.candidates:
            mine = sorted((t for t in kept if t.candidate == cand.index), key=lambda t: t.load_value or 0.0)
            if not mine or cand.status == "pruned":
                continue
            passed = [t for t in mine if t.status == "passed"]
            cand.best_trial = passed[-1].index if passed else None
            stopped = next((t for t in mine if t.status != "passed"), None)
            if stopped is not None:
                cand.status = "infeasible" if stopped.status == "infeasible" and not passed else "done"
                cand.binding = f"{stopped.reason} at {stopped.load_label}"
            elif passed and math.isclose(passed[-1].load_value or 0.0, top):
                cand.status = "done"
                cand.binding = self._top_binding(passed[-1])
            else:
                cand.status = "pending"  # goes on from its next load

    # -- running --------------------------------------------------------------------------------

    def run(self, cancel: threading.Event | None = None) -> TuneState:
        cancel = cancel or threading.Event()
        self._session_start = self.clock()
        self.plan()
        runnable = [c for c in self.state.candidates if c.status != "pruned"]
        if not runnable:
            first = self.state.candidates[0] if self.state.candidates else None
            raise UserError("no engine configuration of the space can run here"
                            + (f": {first.label}: {first.reason}" if first is not None else ""))
        self.state.status, self.state.reason, self.state.ended_wall_s = "running", None, None
        self._persist_tune(create=not self._resumed, claim=self._resumed)
        for (cand_index, value), index in self._stale.items():  # marked, so the table does not say "running"
            self._save_trial(Trial(index=index, candidate=cand_index, load_value=value, status="cancelled",
                                   knobs=self.state.candidates[cand_index].knobs if cand_index < len(
                                       self.state.candidates) else {},
                                   load_kind=self.space.load.kind, reason="stopped before it ended; runs again"),
                             publish=False)
        self._keeper = self.engines if self.engines is not None else EngineKeeper()
        self._places = Places(self.bus, recorder=self.recorder, engines=self._keeper, new_engines=self.new_engines,
                              fleet=self.fleet, telemetry=self.telemetry, runner_factory=self.runner_factory,
                              on_slot_bus=self.on_slot_bus)
        self._note(f"tune {self.state.tune_id}: {len(self.state.candidates)} engine configuration(s), "
                   f"{len(runnable)} can run here; loads {self.space.load.label(self.space.load.values[0])} to "
                   f"{self.space.load.label(self.space.load.values[-1])}; SLO {self.slo} at {self.space.percentile}")
        status, reason = "completed", None
        try:
            reference = self._start_quality()
            if reference is not None and reference.status == "pending":  # first: the others compare with it
                once = [reference]
                self._dispatch(cancel, lambda: (once.pop(), None) if once else None, lambda cand, token: None)
            if self.state.strategy == "grid":
                self._grid(cancel)
            else:
                self._bayes(cancel)
            self._choose_pick()
            if self.state.repeats >= 2 and self.state.pick is not None and not cancel.is_set():
                self._confirm(cancel)
            if cancel.is_set():
                status, reason = "cancelled", "cancelled"
            elif self.state.pick is None:
                excluded = self.state.quality.get("excluded") or []
                reason = "no configuration met the SLO at any load tried" + (
                    f" ({len(excluded)} excluded by the quality bounds)" if excluded else "")
            elif self._budget_out:
                reason = "the budget ran out before every configuration was tried"
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
            self._end(status, reason)
            raise
        finally:
            close = getattr(self._keeper, "close", None) if self.engines is None else None
            if close is not None:
                close()  # the engines this tune started: none is left behind
        self._end(status, reason)
        return self.state

    def _budget_left(self, within: bool = False) -> bool:
        """Whether another candidate may start (``within``: another trial of the running one;
        only the time budget applies)."""
        st = self.state
        if st.budget_s is not None and self._elapsed() >= st.budget_s:
            return False
        if st.budget_candidates is not None and not within:
            tried = sum(1 for c in st.candidates if c.status in ("searching", "done", "infeasible", "cut"))
            if tried >= st.budget_candidates:
                return False
        return True

    def _elapsed(self) -> float:
        return self._elapsed_before + (self.clock() - self._session_start)

    def _grid(self, cancel: threading.Event) -> None:
        def take() -> tuple[Candidate, Any] | None:
            cand = next((c for c in self.state.candidates if c.status == "pending"), None)
            if cand is None:
                return None
            if not self._budget_left():
                self._budget_out = True
                return None
            return cand, None

        self._dispatch(cancel, take, lambda cand, token: None)

    def _dispatch(self, cancel: threading.Event, take: Callable[[], tuple[Candidate, Any] | None],
                  finish: Callable[[Candidate, Any], None]) -> None:
        """Searches the candidates ``take`` hands out (under the lock), up to ``max_parallel`` at
        once, each in a slot of its own (the executor's); ``finish`` hears of each searched one
        (under the lock). An error in one search stops the others from starting more and is
        raised here."""
        assert self._places is not None
        Executor(self._places, max_parallel=self.max_parallel, fresh_slots=True).run(
            _Searches(self, take, finish), lambda got, slot, cancel: self._search(got[0], slot, cancel), cancel)

    def _objective(self, cand: Candidate) -> tuple[float, float]:
        """(value to maximise, constraint: <= 0 met the SLO at some load) of a searched candidate."""
        mine = [t for t in self.state.trials if t.measured and t.candidate == cand.index]
        passed = [t.tok_s_per_gpu or 0.0 for t in mine if t.status == "passed"]
        if passed:
            return max(passed), -1.0
        measured = [t for t in mine if t.status == "failed" and t.ratios]
        if measured:
            first = min(measured, key=lambda t: t.load_value or 0.0)
            excess = max(first.ratios.values()) - 1.0
            return first.tok_s_per_gpu or 0.0, max(excess, 1e-6) if math.isfinite(excess) else INFEASIBLE_CONSTRAINT
        return 0.0, INFEASIBLE_CONSTRAINT

    def _bayes(self, cancel: threading.Event) -> None:
        import optuna
        from optuna.distributions import CategoricalDistribution
        from optuna.samplers import TPESampler
        from optuna.trial import TrialState, create_trial

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        st = self.state
        names = list(self.space.knobs)
        dists: dict[str, Any] = {n: CategoricalDistribution(self.space.knobs[n]) for n in names}
        runnable = [c for c in st.candidates if c.status != "pruned"]
        if st.budget_candidates is None and st.budget_s is None:
            st.budget_candidates = min(len(runnable), DEFAULT_BAYES_CANDIDATES)
        # constant_liar: a configuration searched now counts as a poor one, so the searches at once differ
        sampler = TPESampler(seed=self.seed, n_startup_trials=max(2, min(10, len(runnable) // 3)), constant_liar=True)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        by_key = {repr(sorted(c.knobs.items())): c for c in st.candidates}

        def params_of(cand: Candidate) -> dict[str, Any]:
            return {n: cand.knobs.get(n, self.space.knobs[n][0]) for n in names}

        for cand in st.candidates:  # a resumed tune: what it learnt so far
            if cand.status in ("done", "infeasible"):
                value, constraint = self._objective(cand)
                study.add_trial(create_trial(params=params_of(cand), distributions=dists, value=value,
                                             constraints={"slo": constraint}))
        duplicates = 0

        def take() -> tuple[Candidate, Any] | None:
            nonlocal duplicates
            while not cancel.is_set():
                if not any(c.status == "pending" for c in st.candidates):
                    return None
                if not self._budget_left():
                    self._budget_out = True
                    return None
                trial = study.ask(dists) if names else None
                knobs = normalized(dict(trial.params)) if trial is not None else {}
                found = by_key.get(repr(sorted(knobs.items())))
                if found is not None and found.status == "pending":
                    duplicates = 0
                    return found, trial
                if trial is not None:
                    if found is not None and found.status == "searching":  # being searched now: the liar stands in
                        study.tell(trial, state=TrialState.FAIL)
                    else:
                        value, constraint = (0.0, INFEASIBLE_CONSTRAINT) if found is None or found.status == "pruned" \
                            else self._objective(found)
                        trial.set_constraint("slo", constraint)
                        study.tell(trial, value)
                duplicates += 1
                if duplicates >= MAX_DUPLICATE_ASKS:
                    untried = [c for c in st.candidates if c.status == "pending"]
                    study.enqueue_trial(params_of(self._rng.choice(untried)))
                    duplicates = 0
            return None

        def finish(cand: Candidate, trial: Any) -> None:
            if trial is not None:
                value, constraint = self._objective(cand)
                trial.set_constraint("slo", constraint)
                study.tell(trial, value)

        self._dispatch(cancel, take, finish)

    # -- one configuration: its goodput -----------------------------------------------------------

    def _top_binding(self, trial: Trial) -> str:
        worst = max(trial.ratios, key=lambda k: trial.ratios[k]) if trial.ratios else None
        head = f"no SLO bound reached up to {trial.load_label} (the top of the load range)"
        if worst is None:
            return head
        from app.tuner.slo import METRIC_NAMES

        return (f"{head}; closest: {METRIC_NAMES.get(worst, worst)} {self.space.percentile} at "
                f"{trial.ratios[worst]:.0%} of its limit")

    def _search(self, cand: Candidate, slot: Slot, cancel: threading.Event) -> None:
        """One candidate over the load range, lowest load first, until the SLO is missed: a
        campaign of its own, in ``slot`` (its own bus, recorder and engines when searches run
        side by side)."""
        st = self.state
        load = self.space.load
        with self._lock:
            done = {t.load_value for t in st.trials if t.measured and t.candidate == cand.index
                    and t.status == "passed"}
            levels = [v for v in load.values if not any(math.isclose(v, d or 0.0) for d in done)]
            cand.status = "searching"
            self._stopped.discard(cand.index)
            n = len(st.candidates)
            steps: list[Step] = []
            for v in levels:
                name = f"{st.name} [{cand.index + 1}/{n}] {cand.label} @ {load.label(v)}"
                config = trial_config(self.base, cand.knobs, load.kind, v, slo=self._request_slo, name=name,
                                      tags=[t for t in self.base.tags if not t.startswith(TAG)])
                if self.quality is not None and cand.quality is None and not steps:  # once, with its first load
                    config = config.model_copy(update={"quality": self.quality})
                    if cand.index != st.quality.get("reference_candidate"):
                        self._references[name] = self._reference or Reference(
                            kind="tune reference", problem="the reference configuration's outputs were not measured")
                steps.append(Step(name, config))
            if not steps:
                self._finish_candidate(cand)
                return
            self._publish()
        trials: dict[int, Trial] = {}

        def prepare(i: int, step: Step, outcomes: Sequence[StepResult]) -> Step | str:
            with self._lock:
                if cand.index in self._stopped:
                    return "not run: the SLO was already missed at a lower load"
                if not self._budget_left(within=True):
                    self._budget_out = True
                    self._stopped.add(cand.index)
                    cand.status = "cut" if trials else "pending"
                    return "not run: the budget ran out"
                trial = self._new_trial(cand, load.kind, levels[i])
                trials[i] = trial
                self._note(f"tune: [{cand.index + 1}/{n}] {cand.label} @ {trial.load_label}")
                self._save_trial(trial)
                return step

        def done_step(i: int, outcome: StepResult) -> None:
            with self._lock:
                trial = trials.get(i)
                if trial is None:
                    return
                self._evaluate(cand, trial, outcome)
                self._save_trial(trial)
                self._note(f"tune: [{cand.index + 1}/{n}] {cand.label} @ {trial.load_label}: "
                           f"{self._trial_text(trial)}")
                self._persist_tune()

        campaign = Campaign(steps, slot.bus, engines=slot.engines, recorder=slot.recorder, telemetry=self.telemetry,
                            stop_on_failure=False, campaign_id=f"{st.tune_id}-c{cand.index}",
                            runner_factory=self.runner_factory, prepare=prepare, on_step_done=done_step,
                            extra_tags=[TAG + st.tune_id], fleet=self.fleet)
        campaign.run(cancel, slot=slot)
        with self._lock:
            if cancel.is_set() and cand.status == "searching":
                cand.status = "pending"  # resumable: its cancelled trial runs again
            self._finish_candidate(cand)

    def _new_trial(self, cand: Candidate, kind: str, value: float) -> Trial:
        st = self.state
        old = next((t for t in st.trials if t.measured and t.candidate == cand.index and t.load_value is not None
                    and math.isclose(t.load_value, value)), None)
        if old is not None:
            st.trials.remove(old)
        stale = next((i for (c, v), i in self._stale.items() if c == cand.index and math.isclose(v, value)), None)
        used = [t.index for t in st.trials] + list(self._stale.values())
        index = old.index if old is not None else stale if stale is not None else max(used, default=-1) + 1
        trial = Trial(index=index, candidate=cand.index, knobs=dict(cand.knobs), load_kind=kind, load_value=value,
                      status="running", label=cand.label, started_at=time.time())
        st.trials.append(trial)
        st.trials.sort(key=lambda t: t.index)
        return trial

    def _evaluate(self, cand: Candidate, trial: Trial, outcome: StepResult) -> None:
        trial.finished_at = time.time()
        trial.engine_reused = outcome.engine_reused
        if outcome.stored_ids:
            trial.run_id = outcome.stored_ids[-1]
        run = outcome.runs[-1] if outcome.runs else None
        if run is not None:
            self._take_quality(cand, trial, run)
            trial.startup_s = run.startup_s
            trial.figures = _figures(run)
            trial.tok_s_per_gpu = per_gpu(trial.figures, cand.gpus)
            trial.tok_s_per_user = per_user(trial.figures)
        if outcome.status == "cancelled":
            trial.status, trial.reason = "cancelled", "cancelled"
            self._stopped.add(cand.index)
            return
        if run is None:  # the engine did not start
            trial.status, trial.reason = "infeasible", f"the engine could not start: {outcome.reason}"
        elif run.status != "completed":
            trial.status = "infeasible" if _engine_died(run.reason) else "error"
            trial.reason = run.reason or outcome.reason or run.status
        else:
            verdict = judge(trial.figures, self.run_slo.requests, self.space.percentile)
            trial.ratios = {k: v for k, v in verdict.ratios.items() if math.isfinite(v)}
            trial.status = "passed" if verdict.meets else "failed"
            trial.reason = verdict.reason
        if trial.status == "passed":
            cand.best_trial = trial.index
            return
        self._stopped.add(cand.index)
        cand.binding = f"{trial.reason} at {trial.load_label}"
        if trial.status == "infeasible" and cand.best_trial is None:
            cand.status, cand.reason = "infeasible", trial.reason

    def _finish_candidate(self, cand: Candidate) -> None:
        if cand.status == "searching":
            cand.status = "done"
            if cand.binding is None and cand.best_trial is not None:
                best = next(t for t in self.state.trials if t.index == cand.best_trial)
                cand.binding = self._top_binding(best)
        self._persist_tune()

    @staticmethod
    def _trial_text(t: Trial) -> str:
        figs = t.figures
        parts = [t.status.upper() if t.status in ("passed", "failed") else t.status]
        if t.tok_s_per_gpu is not None:
            parts.append(f"{t.tok_s_per_gpu:,.0f} tok/s per GPU")
        if t.tok_s_per_user is not None:
            parts.append(f"{t.tok_s_per_user:,.1f} tok/s per user")
        for key in ("ttft_ms_p99", "tpot_ms_p99"):
            if key in figs:
                parts.append(f"{key.split('_')[0].upper()} p99 {figs[key]:,.1f} ms")
        text = ", ".join(parts)
        return text + (f" ({t.reason})" if t.reason and t.status != "passed" else "")

    # -- the pick ---------------------------------------------------------------------------------

    def _choose_pick(self) -> None:
        st = self.state
        passed = [t for t in st.measured if t.status == "passed" and t.tok_s_per_gpu is not None]
        excluded = [c for c in st.candidates if c.quality_excluded is not None]
        st.quality["excluded"] = [c.label for c in excluded]
        kept = [t for t in passed if st.candidates[t.candidate].quality_excluded is None]
        st.quality.pop("pick_without_quality", None)
        if not kept:
            st.pick = None
            return

        def rank(t: Trial) -> tuple[float, float, float]:
            """Most per GPU; then fastest per user; then the lowest load (the same yield with headroom)."""
            return t.tok_s_per_gpu or 0.0, t.tok_s_per_user or 0.0, -(t.load_value or 0.0)

        best = max(kept, key=rank)
        fastest = max(passed, key=rank)
        if fastest.candidate != best.candidate:
            st.quality["pick_without_quality"] = st.candidates[fastest.candidate].label
            self._note(f"tune: the quality bounds changed the pick: speed alone would pick "
                       f"{st.candidates[fastest.candidate].label} ({fastest.tok_s_per_gpu or 0:,.0f} tok/s per GPU), "
                       f"excluded for {st.candidates[fastest.candidate].quality_excluded}")
        cand = st.candidates[best.candidate]
        binding = cand.binding or "-"
        top = next((t for t in st.measured if t.index == cand.best_trial), None)
        if top is not None and top.index != best.index:
            binding += (f"; {top.load_label} also met the SLO but gave {top.tok_s_per_gpu or 0:,.0f} tok/s per GPU, "
                        f"no more than {best.load_label}")
        config = trial_config(self.base, cand.knobs, best.load_kind, best.load_value or 1.0,  # type: ignore[arg-type]
                              slo=self._request_slo,
                              name=f"{st.name}: the pick ({cand.label} @ {best.load_label})")
        st.pick = Pick(candidate=cand.index, trial=best.index, knobs=dict(cand.knobs), label=cand.label,
                       load_label=best.load_label, run_id=best.run_id, tok_s_per_gpu=best.tok_s_per_gpu,
                       tok_s_per_user=best.tok_s_per_user, binding=binding,
                       config=mask_obj(config.model_dump(mode="json", exclude_none=True)))
        self._persist_tune()

    def _confirm(self, cancel: threading.Event) -> None:
        """The pick run ``repeats`` more times (each on a cold cache, the engine reused): the mean
        and 95% CI of its figures, and whether each rerun met the SLO."""
        st = self.state
        pick = st.pick
        assert pick is not None
        config = RunConfig.model_validate(pick.config).model_copy(update={"name": f"{st.name}: the pick, confirmed"})
        self._note(f"tune: confirming the pick ({pick.label} @ {pick.load_label}) with {st.repeats} reruns")
        campaign = Campaign([Step("confirm the pick", config, st.repeats)], self.bus, engines=self._keeper,
                            recorder=self.recorder, telemetry=self.telemetry, stop_on_failure=False,
                            campaign_id=f"{st.tune_id}-confirm", runner_factory=self.runner_factory,
                            extra_tags=[TAG + st.tune_id], fleet=self.fleet, on_slot_bus=self.on_slot_bus)
        result = campaign.run(cancel, max_parallel=min(self.max_parallel, st.repeats) if self.fleet is not None
                              else 1)
        outcome = result.steps[0] if result.steps else None
        if outcome is None:
            return
        completed = [r for r in outcome.runs if r.status == "completed"]
        figures = [_figures(r) for r in completed]
        gpus = st.candidates[pick.candidate].gpus
        for f in figures:
            if (v := per_gpu(f, gpus)) is not None:
                f["tok_s_per_gpu"] = v
            if (u := per_user(f)) is not None:
                f["tok_s_per_user"] = u
        agg = aggregate_figures(figures)
        pick.confirmation = Confirmation(
            n=len(completed), run_ids=list(outcome.stored_ids),
            meets_slo=[judge(f, self.run_slo.requests, self.space.percentile).meets for f in figures],
            figures={k: a.to_dict() for k, a in agg.items()},
            reason=None if outcome.status == "completed" else outcome.reason)
        self._note("tune: " + confirmation_text(pick.confirmation))
        self._persist_tune()

    # -- store and publishing ---------------------------------------------------------------------

    def _note(self, line: str) -> None:
        self.bus.emit(LogLine(line=f"tunebench: {line}"))

    def _store_error(self, exc: Exception) -> None:
        note = f"tune state not stored: {exc}"
        if note not in self.state.notes:
            self.state.notes.append(note)
            self._note(note)

    def _persist_tune(self, create: bool = False, claim: bool = False) -> None:
        with self._lock:
            self._persist_tune_locked(create, claim)

    def _persist_tune_locked(self, create: bool, claim: bool) -> None:
        st = self.state
        st.elapsed_s = self._elapsed() if self._session_start else st.elapsed_s
        launches = getattr(self._keeper, "launches", None)
        if isinstance(launches, int):
            side = self._places.launches if self._places is not None else 0  # the searches' own keepers
            st.engine_launches = self._launches_before + launches + side
        if self.store is not None:
            from db import tune_store
            from db.errors import StoreError

            try:
                if create:
                    tune_store.create_tune(self.store, st.tune_id, name=st.name, profile=st.profile,
                                           strategy=st.strategy, slo=st.slo, doc=st.doc())
                else:
                    tune_store.update_tune(self.store, st.tune_id, doc=st.doc(), claim=claim, status=st.status,
                                           reason=st.reason)
                if create:
                    for trial in st.trials:
                        self._save_trial(trial, publish=False)
            except StoreError as exc:
                self._store_error(exc)
        self._publish()

    def _save_trial(self, trial: Trial, publish: bool = True) -> None:
        with self._lock:
            self._save_trial_locked(trial, publish)

    def _save_trial_locked(self, trial: Trial, publish: bool) -> None:
        if self.store is not None:
            from db import tune_store
            from db.errors import StoreError

            try:
                tune_store.put_trial(self.store, self.state.tune_id, trial.index, candidate=trial.candidate,
                                     source=trial.source, status=trial.status, knobs=trial.knobs,
                                     load_kind=trial.load_kind, load_value=trial.load_value, run_id=trial.run_id,
                                     figures=trial.figures, reason=trial.reason, started_at=trial.started_at,
                                     finished_at=trial.finished_at, doc=trial.doc())
            except StoreError as exc:
                self._store_error(exc)
        if publish:
            self._publish()

    def _publish(self) -> None:
        """The state on the bus (a copy: the tune goes on changing its own)."""
        with self._lock:  # in revision order, whichever search publishes
            self.state.revision += 1
            self.bus.emit(CampaignUpdated(state=self.state.model_copy(deep=True)))

    def _end(self, status: Any, reason: str | None) -> None:
        st = self.state
        st.status, st.reason = status, reason
        st.ended_wall_s = time.time()
        for cand in st.candidates:
            if cand.status == "searching":
                cand.status = "pending"
        self._persist_tune()


def confirmation_text(c: Confirmation) -> str:
    """``the pick confirmed: 3 reruns, all met the SLO; 1,234 ± 56 tok/s per GPU (95% CI)``."""
    if c.n == 0:
        return f"the pick was not confirmed: {c.reason or 'no rerun completed'}"
    met = sum(c.meets_slo)
    verdict = "all met the SLO" if met == c.n else f"{met} of {c.n} met the SLO"
    parts = [f"the pick rerun {c.n} times: {verdict}"]
    for key, unit in (("tok_s_per_gpu", "tok/s per GPU"), ("tok_s_per_user", "tok/s per user"),
                      ("ttft_ms_p99", "ms TTFT p99"), ("tpot_ms_p99", "ms TPOT p99")):
        agg = c.figures.get(key)
        if not agg:
            continue
        half = None if agg.get("ci_high") is None else agg["ci_high"] - agg["mean"]
        parts.append(f"{agg['mean']:,.1f}" + (f" \u00b1 {half:,.1f}" if half is not None else "") + f" {unit}")
    return "; ".join(parts) + " (95% CI)"


class _Searches:
    """A tune as the executor sees it: each trial is one candidate searched over its loads; ``take``
    and ``finish`` (the grid's or the Bayesian search's) run under the tune's lock."""

    def __init__(self, tuner: Tuner, take: Callable[[], tuple[Candidate, Any] | None],
                 finish: Callable[[Candidate, Any], None]) -> None:
        self.tuner, self.take, self.finish = tuner, take, finish

    def ask(self) -> tuple[Candidate, Any] | None:
        with self.tuner._lock:
            got = None if self.tuner._budget_out else self.take()
            if got is not None:
                got[0].status = "searching"
            return got

    def tell(self, got: tuple[Candidate, Any], outcome: None) -> None:
        with self.tuner._lock:
            self.finish(*got)
