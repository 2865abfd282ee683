"""The engine of runs: one headless object that the CLI and the GUI both drive.

``Runner(config, bus).run(cancel)`` launches the engine (or attaches to an endpoint or a running
engine), waits until it is ready, runs the load levels, and publishes everything on the bus as
the typed events of ``app.events``, in the order documented there: ``RunStarted``,
``PhaseChanged``/``LogLine``, ``EngineReady``, ``LevelStarted``, ``RequestDone``..., ``Progress``
(~2 Hz), ``LevelFinished``, ``RunFinished``. It always stops the engine it started, also on error or
cancel. Failures end as ``run_finished`` with status ``failed``/``cancelled`` and a reason; only
programming errors escape ``run()`` (after the engine is stopped and ``run_finished`` is sent).

Why one module: a run's life (launch or attach, readiness, feature checks, levels,
engine counters, telemetry, the result) is one sequence with one cancel path and one place that
decides its status; the pieces it drives live elsewhere (``app.load``, ``app.telemetry``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, Field

from app import urls
from app.bus import Bus
from app.config import RunConfig
from app.engines import is_group, launch_engine, launch_group
from app.errors import UserError
from app.events import (
    AnyEvent,
    EngineReady,
    LevelFinished,
    LogLine,
    PhaseChanged,
    QualityMeasured,
    RequestDone,
    RunFinished,
    RunStarted,
    RunStatus,
    SampleStreamed,
)
from app.load.aggregate import LevelAccumulator
from app.load.cache import CachePlan
from app.load.client import ClientOptions, OnSample, OnSamplePiece
from app.load.datasets import BuildCancelled, Dataset, build_dataset, cancel_check, read_inputs
from app.load.executor import LevelOutcome, LiveStats, StopRule, planned_conversations
from app.load.metrics import (
    EngineDeltas,
    LevelSummary,
    RequestRecord,
    engine_deltas,
)
from app.load.patterns import LevelPlan, plan_levels
from app.load.procs import ClientPool, ClientProcessError
from app.load.tokens import TokenCounter, choose_token_counter
from app.load.traces import Trace, check_replay
from app.planner.plan import kv_plan_check
from app.quality.lm_eval_run import TaskEvalRequest, run_task_eval
from app.quality.probe import ProbeError, QualityFigures, Reference, run_probe
from app.quality.task_accuracy import SUMMARY_KEY as TASK_EVAL_KEY
from app.quality.task_accuracy import TaskEval
from app.verification import RunEffects
from app.workload import WorkloadConfig
from engine_adapters.base import Phase
from engine_adapters.bounded_http import FetchError, fetch
from engine_adapters.cpu_binding import client_cpus, format_cpu_list
from engine_adapters.hardware import probe_hardware
from engine_adapters.launcher import EngineProcess, EngineStartError
from engine_adapters.pd_group import DisaggregatedGroup, PoolLauncher, pool_deltas
from engine_adapters.prometheus import METRICS_MAX_BYTES, MetricMap, Scrape, restarted
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model
from engine_adapters.secrets import mask_env, mask_obj, mask_text, mask_url, remember_secret

Launched = TypeVar("Launched", EngineProcess, DisaggregatedGroup)
SETTLE_S = 3.0
WARMUP_VARIANT = 9_999  # dataset variant (seed) of warm-up requests; levels use their index
CANCELLED_CLIENT_CLOSE_S = 0.5
"""How long a cancelled run waits for its client processes to exit before ending them: a level
they ran is already stopped, and one still starting (importing for a second or two on a busy
machine) has nothing to lose."""


def check_endpoint(url: str | None) -> str | None:
    """``--endpoint`` as given, or a UserError saying what is wrong with it (an empty URL must
    never fall through to launching an engine)."""
    if url is None:
        return None
    return urls.check_endpoint(url)  # the one URL validator (app.urls)


class LevelResult(BaseModel):
    index: int
    label: str
    mode: str
    concurrency: int | None = None
    rate_rps: float | None = None
    started_wall_s: float
    summary: LevelSummary
    requests: list[RequestRecord] = Field(default_factory=list)
    """Empty unless the runner was asked to keep them (``keep_requests``): the store has every record."""


class RunResult(BaseModel):
    """Everything one run produced: what ``--json`` writes and the store keeps."""

    run_id: str
    name: str
    config: RunConfig
    argv: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    engine_version: str | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)
    endpoint: str | None = None
    engine_pid: int | None = None
    model: str | None = None
    status: RunStatus = "completed"
    reason: str | None = None
    started_wall_s: float
    ended_wall_s: float | None = None
    startup_s: float | None = None
    kv_cache: dict[str, float] = Field(default_factory=dict)
    feature_checks: list[dict[str, Any]] = Field(default_factory=list)
    lengths_exact: bool = True
    length_source: str = ""
    notes: list[str] = Field(default_factory=list)
    levels: list[LevelResult] = Field(default_factory=list)
    task_eval: TaskEval | None = None
    """Task accuracy measured by lm-eval after the levels (``Runner(task_eval=...)``)."""
    quality: QualityFigures | None = None
    """The quality probe's figures (``[quality]``), measured after the last level."""
    disaggregated: dict[str, Any] = Field(default_factory=dict)
    """A disaggregated prefill/decode group's engines (role, URL, argv) and router, and per level
    what each one's counters gained (:data:`DISAGGREGATED_KEY` of the summary)."""

    def summary(self) -> dict[str, Any]:
        """The ``run_finished`` summary: per level, the flat figures (and the task accuracy, when
        measured; a P/D group's per-pool figures)."""
        levels: dict[str, Any] = {"levels": [{"index": lv.index, "label": lv.label, **lv.summary.flat()}
                                             for lv in self.levels]}
        if self.disaggregated:
            levels[DISAGGREGATED_KEY] = self.disaggregated
        return levels if self.task_eval is None else {**levels, TASK_EVAL_KEY: self.task_eval.model_dump(mode="json")}


DISAGGREGATED_KEY = "disaggregated"
WARM_UP_PROMPT = " ".join(f"w{i}" for i in range(200))
"""The P/D group's warm-up prompt: more than one KV block of the CPU build (128 tokens), so the
decode engine pulls blocks from the prefill engine (its handshake) before the timed load."""


class _Stop(Exception):
    """Ends a run early with a status and a reason (not an error of the program)."""

    def __init__(self, status: RunStatus, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _stop_if(cancel: threading.Event, reason: str) -> None:
    """Ends the run ``cancelled`` when cancel is set: asked between phases, so a cancel never
    starts the next one (a level, the warm-up, a priming pass)."""
    if cancel.is_set():
        raise _Stop("cancelled", reason)


METADATA_MAX_BYTES = 2**20
"""/version and /v1/models answer in well under a KiB."""
METADATA_DEADLINE_S = 5.0
"""At most this long for one GET of an endpoint's /version, /v1/models or /metrics."""


def _http_get(url: str, headers: dict[str, str], deadline_s: float = METADATA_DEADLINE_S,
              max_bytes: int = METRICS_MAX_BYTES) -> str:
    """The body of a GET, read whole within ``deadline_s`` and ``max_bytes``. Any failure
    (refused, not HTTP, a status other than 2xx, too slow, too large) is a URLError, so callers
    handle one family."""
    reply = fetch(url, deadline_s=deadline_s, max_bytes=max_bytes, headers=headers)
    if not reply.ok:
        raise FetchError(f"HTTP {reply.status} from {mask_url(url)}")
    return reply.text


def _get_json(url: str, headers: dict[str, str], deadline_s: float = METADATA_DEADLINE_S) -> Any:
    """A GET's body as JSON. JSON nested deeper than the parser recurses (a broken or hostile
    server) is a ValueError like any other bad JSON, not a RecursionError."""
    text = _http_get(url, headers, deadline_s, METADATA_MAX_BYTES)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"the JSON from {url} is nested too deeply") from None


class Runner:
    """Runs one configuration; see the module docstring for the event order."""

    def __init__(self, config: RunConfig, bus: Bus, *, endpoint: str | None = None, api_key: str | None = None,
                 engine: EngineProcess | None = None, telemetry: bool = True, keep_requests: bool = False,
                 gpu_metrics_url: str | None = None, node: dict[str, Any] | None = None,
                 clients: Callable[..., ClientPool] | None = None, task_eval: TaskEvalRequest | None = None,
                 quality_reference: Reference | None = None, pool_launcher: PoolLauncher | None = None) -> None:
        self.config = config
        self.pool_launcher = pool_launcher
        """Where a P/D group's pool engines start (``app.fleet`` spreads them over nodes); None: here."""
        quality = config.quality
        if task_eval is None and quality is not None and quality.enabled and quality.tasks:
            task_eval = TaskEvalRequest(tasks=list(quality.tasks))  # the profile's [quality] tasks
        self.task_eval = task_eval  # lm-eval's tasks, scored after the levels, apart from the timed load
        self.quality_reference = quality_reference
        """What the quality probe compares with (a stored run, a ladder's baseline, a tune's reference
        configuration); None: the run is its own reference, and its figures are the control."""
        self.node = dict(node) if node else None
        """Which cluster node the run ran on (``app.fleet``): stored with its hardware."""
        self.bus = bus
        self.endpoint = check_endpoint(endpoint)
        # A DCGM exporter's /metrics: GPU telemetry from the machine the engine runs on.
        self.gpu_metrics_url = check_endpoint(gpu_metrics_url)
        self.keep_requests = keep_requests  # every record in the result too (memory grows with the run)
        self.api_key = api_key
        remember_secret(api_key)  # masked wherever a server or an error message echoes it
        self.engine = engine
        self.telemetry = telemetry
        self.run_id = uuid.uuid4().hex
        self.adapter = get_adapter(config.engine.kind)
        self._metric_map = MetricMap(self.adapter.metric_names)
        self.result = RunResult(run_id=self.run_id, name=config.name, config=config, started_wall_s=time.time())
        self._own_engine: EngineProcess | None = None
        self._own_group: DisaggregatedGroup | None = None
        self._counter_bases: list[str] | None = None
        """Where a level's engine counters come from when not the load's URL (a P/D group's decode engines)."""
        self._started_sent = False
        self._pending: list[AnyEvent] = []
        self._pending_lock = threading.Lock()
        self._engine_died = threading.Event()
        self._probes_end_s: float | None = None  # set when attaching to an endpoint
        self._collector: Any = None
        # The client's workers: processes here, or (``clients``) workers elsewhere, as app.fleet's on K nodes.
        self._pool = (clients or ClientPool)(config.load.workers, on_note=self._note)
        self._effects = RunEffects(bus)  # what the run shows of features (max_num_seqs held under load)
        self._named_counter: TokenCounter | None = None  # workload.tokenizer, loaded before anything starts
        self._trace: Trace | None = None  # a trace workload's trace, read and checked before anything starts

    # -- public ---------------------------------------------------------------------------------

    @property
    def client_pids(self) -> list[int]:
        """The load client's processes (never this one: see app.load.procs)."""
        return list(self._pool.pids)

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        """Blocking; call from a worker thread. Returns the result whatever happened."""
        cancel = cancel or threading.Event()
        result = self.result
        result.started_wall_s = time.time()
        try:
            # A tokenizer the user named must load: refused here, before a process or an engine starts.
            # So must a trace, every line of it.
            try:
                self._named_counter, self._trace = read_inputs(self.config.workload, cancel_check(cancel.is_set))
            except BuildCancelled:
                raise _Stop("cancelled", "cancelled while the trace was read") from None
            if self._trace is not None:
                check_replay(self._trace, self.config.load)
            self._pool.start()  # spawning the client overlaps the engine's start
            base_url, headers = self._prepare_engine(cancel)
            self._start_telemetry(base_url)
            self._run_levels(base_url, headers, cancel)
            self._evaluate_tasks(base_url, cancel)
            self._probe_quality(base_url, headers, cancel)
        except _Stop as stop:
            result.status, result.reason = stop.status, stop.reason
        except (UserError, ClientProcessError) as exc:
            result.status, result.reason = "failed", str(exc)
        except BaseException as exc:  # a programming error: clean up, report, re-raise
            result.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            result.reason = f"internal error: {type(exc).__name__}: {exc}"
            self._finish(cancel)
            raise
        self._finish(cancel)
        return result

    # -- events ---------------------------------------------------------------------------------

    def _emit(self, event: AnyEvent) -> None:
        """Publish, holding engine phase/log events back until ``run_started`` went out (the
        event types mask secrets as they are built: app.events)."""
        with self._pending_lock:
            if not self._started_sent:
                self._pending.append(event)
                return
        self.bus.emit(event)

    def _send_run_started(self) -> None:
        r = self.result
        self.bus.emit(RunStarted(
            run_id=self.run_id, name=self.config.name, tags=list(self.config.tags), config=self.config,
            engine_kind=self.config.engine.kind, model=r.model or self.config.engine.model, argv=r.argv,
            env=mask_env(r.env), engine_version=r.engine_version, hardware=r.hardware, endpoint=r.endpoint,
            engine_pid=r.engine_pid, started_wall_s=r.started_wall_s))
        with self._pending_lock:
            self._started_sent = True
            pending, self._pending = self._pending, []
        for event in pending:
            self.bus.emit(event)

    def _on_phase(self, phase: Phase, detail: str) -> None:
        self._emit(PhaseChanged(run_id=self.run_id, phase=phase, detail=detail))

    def _on_log(self, line: str) -> None:
        self._emit(LogLine(run_id=self.run_id, line=line))

    def _note(self, message: str) -> None:
        self.result.notes.append(message)
        self._emit(LogLine.note(message, run_id=self.run_id))

    # -- engine ---------------------------------------------------------------------------------

    def _prepare_engine(self, cancel: threading.Event) -> tuple[str, dict[str, str]]:
        r = self.result
        r.hardware = probe_hardware().model_dump(mode="json")
        if self.node is not None:
            r.hardware["node"] = self.node
        if self.endpoint is not None:
            return self._attach(self.endpoint)
        if self.engine is None and is_group(self.config):
            return self._prepare_group(cancel)
        engine = self.engine
        if engine is None:
            engine = self._own_engine = self._launch(launch_engine)
        self._announce(engine, engine.base_url)
        if self._own_engine is not None:
            try:
                ready = engine.wait_ready(cancel=cancel)
            except EngineStartError as exc:
                if cancel.is_set():
                    raise _Stop("cancelled", "cancelled while the engine was starting") from None
                raise _Stop("failed", str(exc.diagnosis or exc)) from None
            r.startup_s, r.kv_cache = ready.startup_s, dict(ready.kv_cache)
        else:
            if engine.ready_info is None:  # handed over while still starting
                try:
                    engine.wait_ready(cancel=cancel)
                except EngineStartError as exc:
                    raise _Stop("cancelled" if cancel.is_set() else "failed", str(exc.diagnosis or exc)) from None
            if engine.ready_info is not None:
                r.startup_s, r.kv_cache = engine.ready_info.startup_s, dict(engine.ready_info.kv_cache)
        checks = engine.verify_features()
        r.feature_checks = [asdict(c) for c in checks]
        self._emit(EngineReady(run_id=self.run_id, base_url=engine.base_url, startup_s=r.startup_s,
                               kv_cache=r.kv_cache, feature_checks=list(checks)))
        self._kv_beside_plan(r.kv_cache.get("kv_cache_tokens"))
        self.api_key = engine.api_key
        return engine.base_url, engine.auth_headers()

    def _prepare_group(self, cancel: threading.Event) -> tuple[str, dict[str, str]]:
        """A disaggregated prefill/decode group: every pool engine, then the router, then one
        request through it (the decode engines' first handshake), before any timed load. The load
        goes to the router; a level's engine counters are the decode engines' (they generate the
        output), and every engine's and the router's own are kept per level beside them."""
        r = self.result
        group = self._own_group = self._launch(partial(launch_group, launch_member=self.pool_launcher))
        decode = group.pool("decode")
        first = group.first_decode
        self._announce(first, group.base_url)
        try:
            r.startup_s = group.wait_ready(cancel=cancel)
        except EngineStartError as exc:
            if cancel.is_set():
                raise _Stop("cancelled", "cancelled while the P/D group was starting") from None
            raise _Stop("failed", str(exc.diagnosis or exc)) from None
        if first.ready_info is not None:
            r.kv_cache = dict(first.ready_info.kv_cache)
        self.api_key = group.api_key
        headers = group.auth_headers()
        r.disaggregated = {"engines": [{"role": m.role, "index": m.index, "url": m.process.base_url,
                                        "argv": mask_obj(list(m.process.argv)),
                                        **({"ray_node_id": m.node_id} if m.node_id else {})} for m in group.members],
                           "router_argv": mask_obj(group.router_argv),
                           "levels": []}
        self._counter_bases = [p.base_url for p in decode]
        model = self._model_name(first.base_url, headers)
        try:
            failed = group.warm_up(model, WARM_UP_PROMPT, cancel=cancel)
        except EngineStartError as exc:
            raise _Stop("cancelled" if cancel.is_set() else "failed", f"P/D warm-up: {exc}") from None
        self._note(f"P/D group ready in {r.startup_s:.1f} s: {len(group.pool('prefill'))} prefill + {len(decode)} "
                   f"decode engine(s) behind the router at {group.base_url}; warm-up request through it "
                   + (f"succeeded after {len(failed)} failed tr{'y' if len(failed) == 1 else 'ies'} "
                      f"({'; '.join(failed)})" if failed else "succeeded at the first try"))
        checks = group.verify_features(model)
        r.feature_checks = [asdict(c) for c in checks]
        self._emit(EngineReady(run_id=self.run_id, base_url=group.base_url, startup_s=r.startup_s,
                               kv_cache=r.kv_cache, feature_checks=list(checks)))
        self._kv_beside_plan(r.kv_cache.get("kv_cache_tokens"))
        return group.base_url, headers

    def _kv_beside_plan(self, engine_kv_tokens: float | None) -> None:
        """The engine's own KV capacity beside the planner's, with the plan's error (the issue's
        check: within 5% on the CPU demo). A plan that cannot be made says nothing."""
        if not engine_kv_tokens:
            return
        try:
            line = kv_plan_check(self.config, engine_kv_tokens)
        except Exception as exc:  # noqa: BLE001 - the plan is a side note; it must not sink the run
            line = f"no KV plan to compare with ({type(exc).__name__}: {exc})"
        if line:
            self._note(line)

    def _launch(self, launch: Callable[..., Launched]) -> Launched:
        """Start the engine (``launch_engine``) or the P/D group (``launch_group``) with this
        run's log, phase and exit callbacks. A configuration refused before anything started
        still announces the run, so that its failure is recorded."""
        try:
            return launch(self.config, on_log=self._on_log, on_phase=self._on_phase,
                          on_exit=lambda code, diag: self._engine_died.set())
        except UserError:
            self._send_run_started()
            raise

    def _announce(self, engine: EngineProcess, endpoint: str) -> None:
        """Note what the launched engine runs (the group's first decode engine: the one the
        client binds beside), then send ``run_started``: the load goes to ``endpoint``."""
        r = self.result
        r.argv, r.env = list(engine.argv), mask_env(dict(engine.env_added))
        r.endpoint, r.engine_pid = endpoint, engine.pid
        self._bind_client(engine)
        try:
            r.engine_version = self.adapter.installed_version(engine.engine)
        except (RuntimeErrorMessage, OSError) as exc:
            self._note(f"engine version unknown: {exc}")
        self._send_run_started()

    def _bind_client(self, engine: EngineProcess) -> None:
        """The client on the cores the engine's compute threads leave free (a CPU engine
        tunebench launched pins them; see engine_adapters.cpu_binding)."""
        cpus = client_cpus(engine.env_added)
        if cpus:
            self._pool.bind(cpus)
            self._note(f"load client bound to core(s) {format_cpu_list(cpus)}, the engine's compute threads "
                       f"to the others")

    def _probe_time_left_s(self) -> float:
        """What is left of the time the probes of an attached endpoint share (/version, the model
        list, the cache-salt probe): together they take at most the profile's request timeout."""
        if self._probes_end_s is None:
            return METADATA_DEADLINE_S
        return max(0.0, self._probes_end_s - time.monotonic())

    def _attach(self, base_url: str) -> tuple[str, dict[str, str]]:
        r = self.result
        r.endpoint = base_url
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._probes_end_s = time.monotonic() + self.config.load.request_timeout_s
        try:
            r.engine_version = _get_json(base_url + "/version", headers,
                                         min(METADATA_DEADLINE_S, self._probe_time_left_s())).get("version")
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            pass
        self._send_run_started()
        self._emit(EngineReady(run_id=self.run_id, base_url=base_url))
        return base_url, headers

    def _start_telemetry(self, base_url: str) -> None:
        if not self.telemetry:
            return
        try:
            from app.telemetry import TelemetryCollector  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return
        engine = self.engine or self._own_engine
        pid = engine.pid if engine else self.result.engine_pid  # a P/D group: its first decode engine
        try:
            first, *others = self._counter_bases or [base_url]  # a P/D group: every decode engine adds up
            self._collector = TelemetryCollector(
                self.bus, metrics_url=first + self.adapter.metrics_path,
                also_metrics_urls=[url + self.adapter.metrics_path for url in others],
                api_key=self.api_key, metric_names=self.adapter.metric_names, engine_pid=pid,
                gpu_metrics_url=self.gpu_metrics_url)
            self._collector.start()
        except Exception as exc:  # another package's failure must not sink the run
            self._collector = None
            self._note(f"telemetry not started: {type(exc).__name__}: {exc}")

    def _finish(self, cancel: threading.Event) -> None:
        r = self.result
        self._pool.close(timeout_s=CANCELLED_CLIENT_CLOSE_S if cancel.is_set() else 5.0)
        self._effects.close()
        if self._collector is not None:
            try:
                self._collector.stop()
            except Exception as exc:
                self._note(f"telemetry did not stop cleanly: {exc}")
        if self._own_engine is not None:
            if self._engine_died.is_set() and r.status == "completed":
                r.status, r.reason = "failed", f"the engine exited: {self._own_engine.diagnosis or 'unknown cause'}"
            self._own_engine.stop()
        if self._own_group is not None:
            if self._engine_died.is_set() and r.status == "completed":
                r.status, r.reason = "failed", self._own_group.gone() or "an engine of the P/D group exited"
            for line in self._own_group.stop():
                self._on_log(f"P/D group stopped: {line}")
        if not self._started_sent:
            self._send_run_started()
        r.ended_wall_s = time.time()
        r.reason = None if r.reason is None else mask_text(r.reason)  # shown, stored and written
        self.bus.emit(RunFinished(run_id=self.run_id, status=r.status, reason=r.reason, ended_wall_s=r.ended_wall_s,
                                  summary=r.summary()))

    # -- load -----------------------------------------------------------------------------------

    def _model_name(self, base_url: str, headers: dict[str, str]) -> str:
        w, e = self.config.workload, self.config.engine
        if w.model_name:
            return w.model_name
        try:
            data = _get_json(base_url + "/v1/models", headers, self._probe_time_left_s()).get("data") or []
            if data and isinstance(data[0], dict) and data[0].get("id"):
                return str(data[0]["id"])
        except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
            self._note(f"could not list models at {base_url}: {exc}")
        if e.served_model_name:
            return e.served_model_name
        try:
            return resolve_model(e.model)
        except RuntimeErrorMessage:
            return e.model

    def _token_counter(self, model: str) -> TokenCounter:
        """The named tokenizer (``workload.tokenizer``, loaded in ``run``), else the first of the
        engine's that is local, else the approximate counter; the notes say which and why."""
        if self._named_counter is not None:
            self._note(f"prompt lengths in the model's tokens: {self._named_counter.source} (workload.tokenizer)")
            return self._named_counter
        e = self.config.engine
        try:
            resolved: str | None = resolve_model(e.model)
        except RuntimeErrorMessage:
            resolved = None
        counter, why = choose_token_counter(e.tokenizer, resolved, model)
        self._note(why)
        return counter

    def _scrape(self, base_url: str, headers: dict[str, str]) -> Scrape | None:
        """The engine's counters now (a P/D group's: its decode engines', summed); None when a
        /metrics cannot be read (the level then has no engine figures: unknown, not zero)."""
        try:
            scrapes = [self._metric_map.parse(_http_get(base + self.adapter.metrics_path, headers))
                       for base in self._counter_bases or [base_url]]
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return scrapes[0] if len(scrapes) == 1 else _summed(scrapes)

    def _settled(self, base_url: str, headers: dict[str, str], before: Scrape | None = None,
                 client_tokens: int | None = None, cancel: threading.Event | None = None) -> Scrape | None:
        """Counters once the engine has recorded everything sent so far: it counts a step just
        after streaming it, so poll briefly until the generation counter matches the client's
        count, or stops moving for a second. A cancel stops the polling (one scrape): a cancelled
        run ends at once, its last level's engine figures as they stand."""
        deadline = time.monotonic() + SETTLE_S
        after = self._scrape(base_url, headers)
        stable_since = time.monotonic()
        while after is not None and time.monotonic() < deadline and not (cancel is not None and cancel.is_set()):
            if (before is not None and client_tokens is not None
                    and after.counters.get("generation_tokens", 0.0) - before.counters.get("generation_tokens", 0.0)
                    == client_tokens):
                break
            time.sleep(0.2)
            again = self._scrape(base_url, headers)
            if again is None:
                break
            if again != after:
                stable_since = time.monotonic()
            elif time.monotonic() - stable_since >= 1.0:
                break
            after = again
        return after

    def _run_levels(self, base_url: str, headers: dict[str, str], cancel: threading.Event) -> None:
        cfg, r = self.config, self.result
        w, load = cfg.workload, cfg.load
        model = self._model_name(base_url, headers)
        r.model = model
        counter = self._token_counter(model)
        r.lengths_exact, r.length_source = counter.exact, counter.source
        opts = ClientOptions(base_url=base_url, model=model, api=w.api, headers=headers, ignore_eos=w.ignore_eos,
                             temperature=w.temperature, continuous_usage=load.continuous_usage,
                             request_timeout_s=load.request_timeout_s, keep_text=w.kind == "multi_turn",
                             keep_alive=self.adapter.client_keep_alive, request_ids=self.run_id[:12])
        cache = CachePlan.for_run(w.cache, cfg.engine.kind, r.engine_version, opts, attached=self.endpoint is not None,
                                  deadline_s=self._probe_time_left_s(), cancel=cancel)
        _stop_if(cancel, "cancelled before the first level")
        for note in cache.notes():
            self._note(note)
        rule = StopRule(load.max_requests, load.duration_s, load.max_error_fraction)
        live = LiveStats(self.bus, self.run_id)
        plans = plan_levels(load)
        index_offset = 0
        for plan in plans:
            _stop_if(cancel, "cancelled before the level started" if plan.index else "cancelled before the first level")
            dataset = self._build(w, counter, plan.index, cancel)
            for note in dataset.notes:
                self._note(note)
            level_opts = cache.level_options(opts)  # cold: a salt of this level's own
            warmed = plan.index == 0 and load.warmup_requests > 0
            if warmed:
                # Prompts of their own, so warm-up does not fill the cache with the level's prompts.
                warm_set = self._build(w, counter, WARMUP_VARIANT, cancel)
                self._warmup(plan, w.seed, cache.level_options(opts), warm_set, load.warmup_requests, cancel)
                _stop_if(cancel, "cancelled during warm-up")
            primed = cache.prime(plan, dataset, level_opts, rule, self._note, run=self._pool.run_level,
                                 cancel=cancel, seed=w.seed)  # warm mode only: the level's prompts, once
            if primed:
                _stop_if(cancel, "cancelled while the prefix cache was primed")
            before = (self._settled(base_url, headers, cancel=cancel) if warmed or primed
                      else self._scrape(base_url, headers))
            pools_before = self._own_group.pool_figures() if self._own_group is not None else None
            _stop_if(cancel, "cancelled before the level started")
            started_wall = time.time()
            self._emit(plan.started_event(self.run_id, started_wall, rule.max_requests or len(dataset.conversations)))
            acc = LevelAccumulator(load.slo)
            samples: list[dict[str, Any]] = []
            sample_ended, sample_piece = self._sample_stream(plan, samples)
            outcome = self._run_one(plan, dataset, level_opts, rule, live, cancel, w.seed, index_offset, acc,
                                    on_sample=sample_ended, on_sample_piece=sample_piece)
            index_offset += acc.requests
            deltas: EngineDeltas | None = None
            if before is not None:
                after = self._settled(base_url, headers, before, outcome.output_tokens, cancel=cancel)
                if after is not None and restarted(before, after):
                    self._note(f"level {plan.label}: the engine's counters went back (it restarted?): "
                               "no engine figures for this level")
                elif after is not None:
                    deltas = engine_deltas(before, after)
            if self._own_group is not None and pools_before is not None:
                self.result.disaggregated["levels"].append({"index": plan.index, "label": plan.label, "pools": pool_deltas(
                    pools_before, self._own_group.pool_figures())})
            summary = acc.summary(outcome.duration_s, peak_concurrency=outcome.peak_concurrency,
                                  lengths_exact=dataset.lengths_exact, engine=deltas, stop_reason=outcome.stop_reason,
                                  client_lag_ms=outcome.client_lag_ms, target=plan.target,
                                  planned_requests=planned_conversations(dataset, rule))
            if self._trace is not None:  # what the trace implies, beside what the engine measured
                summary.trace_prefix_reuse = self._trace.reuse().prefix_token_reuse
                self._note(_trace_reuse_note(plan.label, summary.trace_prefix_reuse, deltas))
            level = LevelResult(index=plan.index, label=plan.label, mode=plan.mode, concurrency=plan.concurrency,
                                rate_rps=plan.rate_rps, started_wall_s=started_wall, summary=summary,
                                requests=outcome.records)
            r.levels.append(level)
            shown = LevelSummary.model_validate(mask_obj(summary.model_dump(mode="json")))  # error texts masked
            self._emit(LevelFinished(run_id=self.run_id, index=plan.index, label=plan.label, summary=shown,
                                     sample=samples[0] if samples else None))
            if outcome.stop_reason == "cancelled":
                raise _Stop("cancelled", "cancelled")
            if self._engine_gone(grace_s=3.0 if outcome.stop_reason.startswith("error budget") else 0.0):
                if self._own_group is not None:
                    raise _Stop("failed", self._own_group.gone() or "an engine of the P/D group exited")
                engine = self._own_engine or self.engine
                raise _Stop("failed", f"the engine exited: {(engine.diagnosis if engine else None) or 'unknown cause'}")
            if outcome.stop_reason.startswith("error budget"):
                raise _Stop("failed", f"level '{plan.label}': {outcome.stop_reason}")
            if summary.completed == 0:  # however few were sent: a run with no success is no success
                first = f"; first error: {summary.error_examples[0]}" if summary.error_examples else ""
                raise _Stop("failed", f"level '{plan.label}': no request succeeded ({summary.errors} failed){first}")
        replies = (cfg.workload.api, sum(lv.summary.completed for lv in r.levels),
                   sum(lv.summary.reasoning_tokens or 0 for lv in r.levels))
        r.feature_checks = self._effects.refine(r.feature_checks, cfg.features,
                                                max((lv.summary.peak_concurrency for lv in r.levels), default=0), self._note,
                                                replies=replies)

    def _probe_quality(self, base_url: str, headers: dict[str, str], cancel: threading.Event) -> None:
        """The quality probe, after the last level so the speed figures never see it. A probe that
        cannot measure says why in one line; the run and its speed figures stand."""
        quality = self.config.quality
        if quality is None or not quality.enabled:
            return
        _stop_if(cancel, "cancelled before the quality probe")
        r = self.result
        started = time.monotonic()
        # The model as configured identifies it (another precision or file of it is the same model);
        # attached to an endpoint, the name it serves.
        model_id = r.model or "" if self.endpoint is not None else self.config.engine.model
        try:
            figures = run_probe(quality, self.config.engine.kind, base_url, headers, r.model or "",
                                self.quality_reference, cancel.is_set,
                                quality.top_logprobs_for(self.config.engine.model), model_id=model_id)
        except ProbeError as exc:
            figures = QualityFigures(error=str(exc), engine=self.config.engine.kind, model=model_id,
                                     batch=quality.batch, wall_s=time.monotonic() - started)
            self._note(f"quality not measured: {exc}")
        _stop_if(cancel, "cancelled during the quality probe")
        figures.accuracy = self._accuracy_against_reference()
        r.quality = figures
        if figures.measured:
            self._note(_quality_note(figures))
        self._emit(QualityMeasured(run_id=self.run_id, quality=figures.model_dump(mode="json")))

    def _accuracy_against_reference(self) -> dict[str, Any] | None:
        """The first task's accuracy beside the reference's (a run without a reference is its own,
        so its drop is 0): what ``accuracy_drop`` bounds. Both are lm-eval's stored figures."""
        found = self.result.task_eval
        if found is None or not found.results:
            return None
        first = found.results[0]
        reference = self.quality_reference
        reference_value = first.value if reference is None else reference.accuracy
        return {"task": first.task, "metric": first.metric, "value": first.value, "stderr": first.stderr,
                "reference_value": reference_value}

    def _evaluate_tasks(self, base_url: str, cancel: threading.Event) -> None:
        """lm-eval's tasks against the engine, once the load is over (so it never perturbs the
        speed figures). What it cannot measure is a note; the run stays as its levels made it."""
        if self.task_eval is None:
            return
        _stop_if(cancel, "cancelled before the task evaluation")
        e = self.config.engine
        try:
            local = [resolve_model(e.model)] + ([e.tokenizer] if e.tokenizer else [])
        except RuntimeErrorMessage:
            local = [e.tokenizer] if e.tokenizer else []
        tokenizer = next((str(Path(p).expanduser()) for p in local if Path(p).expanduser().is_dir()), None)
        self._note(f"lm-eval: scoring {', '.join(self.task_eval.tasks)} after the load"
                   + (f", {self.task_eval.limit} documents each" if self.task_eval.limit else ""))
        found = run_task_eval(self.task_eval, base_url=base_url, model=self.result.model or e.model,
                              api_key=self.api_key, prompt_logprobs=self.adapter.prompt_logprobs,
                              engine=self.adapter.display_name, tokenizer=tokenizer, cancel=cancel)
        self.result.task_eval = found
        for accuracy in found.results:
            self._note(f"lm-eval: {accuracy.text()}, {accuracy.wall_s:.1f} s")
        for error in found.errors:
            self._note(f"lm-eval: {error}")
        _stop_if(cancel, "cancelled during the task evaluation")

    def _build(self, workload: WorkloadConfig, counter: TokenCounter, variant: int,
               cancel: threading.Event) -> Dataset:
        """A level's (or the warm-up's) prompts. Generating a large workload takes long, so the
        build asks ``cancel`` between prompts; a cancel ends the run there, before any request."""
        try:
            dataset = build_dataset(workload, counter, variant=variant, cancelled=cancel.is_set, trace=self._trace)
        except BuildCancelled:
            raise _Stop("cancelled", "cancelled while the workload was built") from None
        _stop_if(cancel, "cancelled while the workload was built")
        return dataset

    def _engine_gone(self, grace_s: float = 0.0) -> bool:
        """Whether the engine died. Connection errors can end a level a moment before the
        killed engine is reaped, so after failures wait up to ``grace_s`` to know; once gone,
        wait for its exit to be diagnosed."""
        engine = self._own_engine or self.engine
        deadline = time.monotonic() + grace_s
        while True:
            if self._engine_died.is_set():
                return True
            if self._own_group is not None:
                if self._own_group.gone() is not None:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
                continue
            if engine is None or engine.proc is None:
                return False
            if not engine.is_running():
                engine.wait_exited(timeout_s=15)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _sample_stream(self, plan: LevelPlan, samples: list[dict[str, Any]]) -> tuple[OnSample, OnSamplePiece]:
        """The level's sample request: kept in ``samples`` when it ends, and published as it
        streams and when it ends (``SampleStreamed``: what a live race follows)."""

        def streamed(part: dict[str, Any], ended: bool = False) -> None:
            self._emit(SampleStreamed(run_id=self.run_id, level=plan.index, label=plan.label, part=part, ended=ended))

        def sample_ended(sample: dict[str, Any]) -> None:
            samples.append(sample)
            streamed(sample, ended=True)

        return sample_ended, streamed

    def _run_one(self, plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, live: LiveStats,
                 cancel: threading.Event, seed: int, index_offset: int, acc: LevelAccumulator,
                 on_sample: OnSample | None = None, on_sample_piece: OnSamplePiece | None = None) -> LevelOutcome:
        """One measured level in the client process(es): each record is published (and so
        stored) and counted as it arrives; only the result's copy, if asked for, keeps it."""
        kept: list[RequestRecord] = []

        def on_record(rec: RequestRecord) -> None:
            rec.itl_ms = rec.itl_ms.tolist() if isinstance(rec.itl_ms, np.ndarray) else rec.itl_ms
            acc.add(rec)
            self.bus.emit(RequestDone(run_id=self.run_id, record=rec))
            if self.keep_requests:
                kept.append(rec)

        outcome = self._pool.run_level(plan, dataset, opts, rule, live=live, cancel=cancel, seed=seed,
                                       on_record=on_record, index_offset=index_offset, on_sample=on_sample,
                                       on_sample_piece=on_sample_piece)
        outcome.records = kept
        return outcome

    def _warmup(self, plan: LevelPlan, seed: int, opts: ClientOptions, dataset: Dataset, n: int,
                cancel: threading.Event) -> None:
        """Warm-up requests at the first level's concurrency, from the same client process(es)
        (it warms them too); excluded from every figure."""
        warm_plan = LevelPlan(-1, "warm-up", "closed", concurrency=min(plan.concurrency or 1, n))
        counts = [0, 0]

        def count(rec: RequestRecord) -> None:
            counts[0] += 1
            counts[1] += 0 if rec.ok else 1

        self._pool.run_level(warm_plan, dataset, opts, StopRule(max_requests=n, max_error_fraction=1.0),
                             live=LiveStats(None), cancel=cancel, seed=seed, on_record=count)
        self._note(f"warm-up: {counts[0]} requests ({counts[1]} failed), excluded from the figures")


def _summed(scrapes: list[Scrape]) -> Scrape:
    """Several engines' counters as one (a P/D pool of several engines): counters, histograms and
    gauges added; the latest start time, so a restart of any one shows."""
    out = Scrape(start_time_s=max((s.start_time_s for s in scrapes if s.start_time_s is not None), default=None))
    for scrape in scrapes:
        for name, value in scrape.counters.items():
            out.counters[name] = out.counters.get(name, 0.0) + value
        for name, value in scrape.gauges.items():
            out.gauges[name] = out.gauges.get(name, 0.0) + value
        for name, (total, count) in scrape.histograms.items():
            old_total, old_count = out.histograms.get(name, (0.0, 0.0))
            out.histograms[name] = (old_total + total, old_count + count)
    return out


def _quality_note(figures: QualityFigures) -> str:
    """The probe's figures in one line, with what they were measured against."""
    against = figures.reference.get("kind", "self")
    agreed, kld = figures.agreement, figures.kld
    parts = [f"quality probe ({figures.prompts} prompts x {figures.output_tokens} tokens, batch {figures.batch}, "
             f"{figures.wall_s or 0:.1f} s) against {'itself (the control)' if against == 'self' else against}"]
    if agreed is not None:
        parts.append(f"{agreed.token_share:.1%} of tokens identical, {agreed.exact_match:.0%} of outputs exact")
    if kld is not None:
        parts.append(f"mean KLD {kld.mean:.3g}" + (f" +/- {kld.error:.2g}" if kld.error is not None else "")
                     + ("" if kld.exact else f" (a lower bound: top-{figures.top_logprobs})"))
    return "; ".join(parts)


def _trace_reuse_note(label: str, implied: float | None, deltas: EngineDeltas | None) -> str:
    """The prefix reuse a replayed trace implies, beside the hit rate the engine measured."""
    said = f"{implied:.1%} of prompt tokens" if implied is not None else "no reuse (it names no blocks)"
    measured = deltas.prefix_cache_hit_rate if deltas is not None else None
    engine = (f"the engine measured {measured:.1%} prefix-cache hits" if measured is not None
              else "the engine reported no prefix-cache counters")
    return f"level {label}: {engine}; the trace implies {said}"
