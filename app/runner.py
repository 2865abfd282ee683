"""The engine of runs: one headless object that the CLI and the GUI both drive.

``Runner(config, bus).run(cancel)`` launches the engine (or attaches to an endpoint or a running
engine), waits until it is ready, runs the load levels, and publishes everything on the bus in
the order ``app.bus`` documents: ``run_started``, ``phase``/``log``, ``engine_ready``,
``level_started``, ``request``..., ``progress`` and ``client`` samples (~2 Hz),
``level_finished``, ``run_finished``. It always stops the engine it started, also on error or
cancel. Failures end as ``run_finished`` with status ``failed``/``cancelled`` and a reason; only
programming errors escape ``run()`` (after the engine is stopped and ``run_finished`` is sent).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.bus import Bus
from app.config import RunConfig
from app.engines import launch_engine
from app.errors import UserError
from app.load.client import ClientOptions
from app.load.datasets import Dataset, build_dataset
from app.load.executor import LevelOutcome, LiveStats, StopRule, run_level
from app.load.metrics import (
    EngineDeltas,
    LevelSummary,
    RequestRecord,
    engine_deltas,
    parse_engine_counters,
    summarize,
)
from app.load.patterns import LevelPlan, plan_levels
from app.load.tokens import TokenCounter, load_token_counter
from engine_adapters.base import Phase
from engine_adapters.hardware import probe_hardware
from engine_adapters.launcher import EngineProcess, EngineStartError
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model

RunStatus = Literal["completed", "failed", "cancelled", "interrupted"]
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SETTLE_S = 3.0
WARMUP_VARIANT = 9_999  # dataset variant (seed) of warm-up requests; levels use their index


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Environment with secret values replaced, for records and events."""
    return {k: ("***" if any(w in k.upper() for w in SECRET_WORDS) else v) for k, v in env.items()}


class LevelResult(BaseModel):
    index: int
    label: str
    mode: str
    concurrency: int | None = None
    rate_rps: float | None = None
    started_wall_s: float
    summary: LevelSummary
    requests: list[RequestRecord] = Field(default_factory=list)


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

    def summary(self) -> dict[str, Any]:
        """The ``run_finished`` summary: per level, the flat figures."""
        return {"levels": [{"index": lv.index, "label": lv.label, **lv.summary.flat()} for lv in self.levels]}


class _Stop(Exception):
    """Ends a run early with a status and a reason (not an error of the program)."""

    def __init__(self, status: RunStatus, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _http_get(url: str, headers: dict[str, str], timeout_s: float = 5.0) -> str:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - URL from config/engine
        return str(resp.read().decode("utf-8", "replace"))


class Runner:
    """Runs one configuration; see the module docstring for the event order."""

    def __init__(self, config: RunConfig, bus: Bus, *, endpoint: str | None = None, api_key: str | None = None,
                 engine: EngineProcess | None = None, telemetry: bool = True) -> None:
        self.config = config
        self.bus = bus
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.api_key = api_key
        self.engine = engine
        self.telemetry = telemetry
        self.run_id = uuid.uuid4().hex
        self.adapter = get_adapter(config.engine.kind)
        self.result = RunResult(run_id=self.run_id, name=config.name, config=config, started_wall_s=time.time())
        self._own_engine: EngineProcess | None = None
        self._started_sent = False
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._pending_lock = threading.Lock()
        self._engine_died = threading.Event()
        self._collector: Any = None

    # -- public ---------------------------------------------------------------------------------

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        """Blocking; call from a worker thread. Returns the result whatever happened."""
        cancel = cancel or threading.Event()
        result = self.result
        result.started_wall_s = time.time()
        try:
            base_url, headers = self._prepare_engine(cancel)
            self._start_telemetry(base_url)
            self._run_levels(base_url, headers, cancel)
        except _Stop as stop:
            result.status, result.reason = stop.status, stop.reason
        except UserError as exc:
            result.status, result.reason = "failed", str(exc)
        except BaseException as exc:  # a programming error: clean up, report, re-raise
            result.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            result.reason = f"internal error: {type(exc).__name__}: {exc}"
            self._finish(cancel)
            raise
        self._finish(cancel)
        return result

    # -- events ---------------------------------------------------------------------------------

    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        """Publish, holding engine phase/log events back until ``run_started`` went out."""
        with self._pending_lock:
            if not self._started_sent and kind != "run_started":
                self._pending.append((kind, payload))
                return
        self.bus.event(kind, payload)

    def _send_run_started(self) -> None:
        r = self.result
        self.bus.event("run_started", {
            "run_id": self.run_id, "name": self.config.name, "tags": list(self.config.tags),
            "config": self.config.model_dump(mode="json"), "engine_kind": self.config.engine.kind,
            "model": r.model or self.config.engine.model, "argv": r.argv, "env": r.env,
            "engine_version": r.engine_version, "hardware": r.hardware, "endpoint": r.endpoint, "engine_pid": r.engine_pid,
            "started_wall_s": r.started_wall_s})
        with self._pending_lock:
            self._started_sent = True
            pending, self._pending = self._pending, []
        for kind, payload in pending:
            self.bus.event(kind, payload)

    def _on_phase(self, phase: Phase, detail: str) -> None:
        self._emit("phase", {"run_id": self.run_id, "phase": phase.value, "detail": detail})

    def _on_log(self, line: str) -> None:
        self._emit("log", {"run_id": self.run_id, "line": line})

    def _note(self, message: str) -> None:
        self.result.notes.append(message)
        self._emit("log", {"run_id": self.run_id, "line": f"tunebench: {message}"})

    # -- engine ---------------------------------------------------------------------------------

    def _prepare_engine(self, cancel: threading.Event) -> tuple[str, dict[str, str]]:
        r = self.result
        r.hardware = probe_hardware().model_dump(mode="json")
        if self.endpoint is not None:
            return self._attach(self.endpoint)
        engine = self.engine
        if engine is None:
            try:
                engine = launch_engine(self.config, on_log=self._on_log, on_phase=self._on_phase,
                                       on_exit=lambda code, diag: self._engine_died.set())
            except UserError:
                self._send_run_started()
                raise
            self._own_engine = engine
        r.argv = list(engine.argv)
        r.env = mask_env(dict(engine.env_added))
        r.endpoint = engine.base_url
        r.engine_pid = engine.pid
        try:
            r.engine_version = self.adapter.installed_version(engine.engine)
        except (RuntimeErrorMessage, OSError) as exc:
            self._note(f"engine version unknown: {exc}")
        self._send_run_started()
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
        checks = [asdict(c) for c in engine.verify_features()]
        r.feature_checks = checks
        self._emit("engine_ready", {"run_id": self.run_id, "base_url": engine.base_url, "startup_s": r.startup_s,
                                    "kv_cache": r.kv_cache, "feature_checks": checks})
        self.api_key = engine.api_key
        return engine.base_url, engine.auth_headers()

    def _attach(self, base_url: str) -> tuple[str, dict[str, str]]:
        r = self.result
        r.endpoint = base_url
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            r.engine_version = json.loads(_http_get(base_url + "/version", headers)).get("version")
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            pass
        self._send_run_started()
        self._emit("engine_ready", {"run_id": self.run_id, "base_url": base_url, "startup_s": None,
                                    "kv_cache": {}, "feature_checks": []})
        return base_url, headers

    def _start_telemetry(self, base_url: str) -> None:
        if not self.telemetry:
            return
        try:
            from app.telemetry import TelemetryCollector  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return
        engine = self.engine or self._own_engine
        try:
            self._collector = TelemetryCollector(
                self.bus, metrics_url=base_url + self.adapter.metrics_path, api_key=self.api_key,
                metric_names=self.adapter.metric_names, engine_pid=engine.pid if engine else None)
            self._collector.start()
        except Exception as exc:  # another package's failure must not sink the run
            self._collector = None
            self._note(f"telemetry not started: {type(exc).__name__}: {exc}")

    def _finish(self, cancel: threading.Event) -> None:
        r = self.result
        if self._collector is not None:
            try:
                self._collector.stop()
            except Exception as exc:
                self._note(f"telemetry did not stop cleanly: {exc}")
        if self._own_engine is not None:
            if self._engine_died.is_set() and r.status == "completed":
                r.status, r.reason = "failed", f"the engine exited: {self._own_engine.diagnosis or 'unknown cause'}"
            self._own_engine.stop()
        if not self._started_sent:
            self._send_run_started()
        r.ended_wall_s = time.time()
        self.bus.event("run_finished", {"run_id": self.run_id, "status": r.status, "reason": r.reason,
                                        "ended_wall_s": r.ended_wall_s, "summary": r.summary()})

    # -- load -----------------------------------------------------------------------------------

    def _model_name(self, base_url: str, headers: dict[str, str]) -> str:
        w, e = self.config.workload, self.config.engine
        if w.model_name:
            return w.model_name
        try:
            data = json.loads(_http_get(base_url + "/v1/models", headers)).get("data") or []
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
        w, e = self.config.workload, self.config.engine
        try:
            resolved: str | None = resolve_model(e.model)
        except RuntimeErrorMessage:
            resolved = None
        return load_token_counter(w.tokenizer, e.tokenizer, resolved, model)

    def _scrape(self, base_url: str, headers: dict[str, str]) -> dict[str, float]:
        try:
            text = _http_get(base_url + self.adapter.metrics_path, headers)
        except (urllib.error.URLError, OSError):
            return {}
        return parse_engine_counters(text, self.adapter.metric_names.counters, self.adapter.metric_names.histograms)

    def _settled(self, base_url: str, headers: dict[str, str], before: dict[str, float] | None = None,
                 client_tokens: int | None = None) -> dict[str, float]:
        """Counters once the engine has recorded everything sent so far: it counts a step just
        after streaming it, so poll briefly until the generation counter matches the client's
        count, or stops moving for a second."""
        deadline = time.monotonic() + SETTLE_S
        after = self._scrape(base_url, headers)
        stable_since = time.monotonic()
        while after and time.monotonic() < deadline:
            if (before is not None and client_tokens is not None
                    and after.get("generation_tokens", 0.0) - before.get("generation_tokens", 0.0) == client_tokens):
                break
            time.sleep(0.2)
            again = self._scrape(base_url, headers)
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
        if not counter.exact:
            self._note(f"prompt lengths are approximate: {counter.source}")
        opts = ClientOptions(base_url=base_url, model=model, api=w.api, headers=headers, ignore_eos=w.ignore_eos,
                             temperature=w.temperature, continuous_usage=load.continuous_usage,
                             request_timeout_s=load.request_timeout_s, keep_text=w.kind == "multi_turn")
        rule = StopRule(load.max_requests, load.duration_s, load.max_error_fraction)
        live = LiveStats(self.bus, self.run_id)
        plans = plan_levels(load)
        index_offset = 0
        for plan in plans:
            if cancel.is_set():
                raise _Stop("cancelled", "cancelled")
            dataset = build_dataset(w, counter, variant=plan.index)
            for note in dataset.notes:
                self._note(note)
            warmed = plan.index == 0 and load.warmup_requests > 0
            if warmed:
                # Prompts of their own, so warm-up does not fill the cache with the level's prompts.
                warm_set = build_dataset(w, counter, variant=WARMUP_VARIANT)
                self._warmup(plan, w.seed, opts, warm_set, load.warmup_requests, cancel)
                if cancel.is_set():
                    raise _Stop("cancelled", "cancelled during warm-up")
            before = self._settled(base_url, headers) if warmed else self._scrape(base_url, headers)
            started_wall = time.time()
            self._emit("level_started", {"run_id": self.run_id, **plan.event_fields(), "started_wall_s": started_wall,
                                         "num_requests": rule.max_requests or len(dataset.conversations)})
            outcome = self._run_one(plan, dataset, opts, rule, live, cancel, w.seed, index_offset)
            index_offset += len(outcome.records)
            deltas: EngineDeltas | None = None
            if before:
                after = self._settled(base_url, headers, before, sum(x.output_tokens for x in outcome.records))
                deltas = engine_deltas(before, after) if after else None
            summary = summarize(outcome.records, outcome.duration_s, slo=load.slo,
                                peak_concurrency=outcome.peak_concurrency, lengths_exact=dataset.lengths_exact,
                                engine=deltas, stop_reason=outcome.stop_reason,
                                client_lag_ms=outcome.client_lag_ms)
            level = LevelResult(index=plan.index, label=plan.label, mode=plan.mode, concurrency=plan.concurrency,
                                rate_rps=plan.rate_rps, started_wall_s=started_wall, summary=summary,
                                requests=outcome.records)
            r.levels.append(level)
            self._emit("level_finished", {"run_id": self.run_id, "index": plan.index, "label": plan.label,
                                          "summary": summary.model_dump(mode="json"), "flat": summary.flat()})
            if outcome.stop_reason == "cancelled":
                raise _Stop("cancelled", "cancelled")
            if self._engine_gone(grace_s=3.0 if outcome.stop_reason.startswith("error budget") else 0.0):
                engine = self._own_engine or self.engine
                raise _Stop("failed", f"the engine exited: {(engine.diagnosis if engine else None) or 'unknown cause'}")
            if outcome.stop_reason.startswith("error budget"):
                raise _Stop("failed", f"level '{plan.label}': {outcome.stop_reason}")

    def _engine_gone(self, grace_s: float = 0.0) -> bool:
        """Whether the engine died. Connection errors can end a level a moment before the
        killed engine is reaped, so after failures wait up to ``grace_s`` to know; once gone,
        wait for its exit to be diagnosed."""
        engine = self._own_engine or self.engine
        deadline = time.monotonic() + grace_s
        while True:
            if self._engine_died.is_set():
                return True
            if engine is None or engine.proc is None:
                return False
            if not engine.is_running():
                engine.wait_exited(timeout_s=15)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _publish_record(self, rec: RequestRecord) -> None:
        self.bus.event("request", {"run_id": self.run_id, **rec.model_dump(mode="json")})

    def _run_one(self, plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, live: LiveStats,
                 cancel: threading.Event, seed: int, index_offset: int) -> LevelOutcome:
        workers = self.config.load.workers
        if workers > 1:
            return run_level_in_processes(plan, dataset, opts, rule, workers, live=live, cancel=cancel, seed=seed,
                                          on_record=self._publish_record, index_offset=index_offset)
        return asyncio.run(run_level(plan, dataset, opts, rule, live=live, on_record=self._publish_record,
                                     cancel=cancel, seed=seed, index_offset=index_offset))

    def _warmup(self, plan: LevelPlan, seed: int, opts: ClientOptions, dataset: Dataset, n: int,
                cancel: threading.Event) -> None:
        """Warm-up requests at the first level's concurrency; excluded from every figure."""
        warm_plan = LevelPlan(-1, "warm-up", "closed", concurrency=min(plan.concurrency or 1, n))
        warm = asyncio.run(run_level(warm_plan, dataset, opts, StopRule(max_requests=n, max_error_fraction=1.0),
                                     live=LiveStats(None), cancel=cancel, seed=seed))
        failed = sum(1 for x in warm.records if not x.ok)
        self._note(f"warm-up: {len(warm.records)} requests ({failed} failed), excluded from the figures")


# --- several client processes ---------------------------------------------------------------------

def _worker_level(k: int, plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, seed: int,
                  t_start: float, progress: Any, cancel_flag: Any) -> LevelOutcome:
    """Worker ``k``'s share of a level (runs in a child process). Each record is sent to the
    parent as it completes, like progress, so the run is stored as it goes; the returned outcome
    carries no records (the parent already has them)."""

    class _Cancel:
        def is_set(self) -> bool:
            return bool(cancel_flag.value)

    live = LiveStats(None)

    async def main() -> LevelOutcome:
        delay = t_start - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

        async def report() -> None:
            while True:
                await asyncio.sleep(0.25)
                progress.put(("progress", k, (live.tokens, live.in_flight)))

        def send(rec: RequestRecord) -> None:
            progress.put(("record", k, rec))

        reporter = asyncio.create_task(report())
        try:
            return await run_level(plan, dataset, opts, rule, live=live, cancel=_Cancel(),  # type: ignore[arg-type]
                                   seed=seed, on_record=send)
        finally:
            reporter.cancel()
            progress.put(("progress", k, (live.tokens, 0)))

    outcome = asyncio.run(main())
    outcome.records = []
    return outcome


def split_plan(plan: LevelPlan, dataset: Dataset, rule: StopRule, workers: int,
               k: int) -> tuple[LevelPlan, Dataset, StopRule]:
    """Worker ``k``'s share: every ``workers``-th conversation, its share of the concurrency or rate."""
    share = Dataset(dataset.conversations[k::workers] or dataset.conversations[:1], dataset.lengths_exact,
                    dataset.length_source)
    conc = plan.concurrency
    if conc is not None:
        conc = max(1, conc // workers + (1 if k < conc % workers else 0))
    rate = plan.rate_rps / workers if plan.rate_rps is not None else None
    start = plan.ramp_start_rps / workers if plan.ramp_start_rps is not None else None
    sub = LevelPlan(plan.index, plan.label, plan.mode, concurrency=conc, rate_rps=rate, arrival=plan.arrival,
                    burstiness=plan.burstiness, ramp_start_rps=start)
    if rule.max_requests is not None:
        max_req: int | None = rule.max_requests // workers + (1 if k < rule.max_requests % workers else 0)
    elif rule.duration_s is None:
        max_req = len(share.conversations)
    else:
        max_req = None
    return sub, share, StopRule(max_req, rule.duration_s, rule.max_error_fraction)


def run_level_in_processes(plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, workers: int, *,
                           live: LiveStats, cancel: threading.Event, seed: int,
                           on_record: Callable[[RequestRecord], None] | None = None,
                           index_offset: int = 0) -> LevelOutcome:
    """A level split over client processes (when one core cannot keep up): each runs its share
    on its own event loop from a common start time; token progress comes every 0.25 s and each
    record as it completes (numbered in the order it arrives here, published and stored at once).
    Offsets are comparable because every process reads the same monotonic clock. Peak
    concurrency is the sum of the workers' peaks (an upper bound)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        progress = manager.Queue()
        cancel_flag = manager.Value("b", 0)
        t_start = time.perf_counter() + 3.0  # children need time to start (spawn imports tunebench)
        live.start_level(plan.index, rule.max_requests or len(dataset.conversations))
        base_tokens = live.tokens
        latest: dict[int, tuple[int, int]] = {}  # worker -> (tokens, in flight)
        records: list[RequestRecord] = []

        def drain() -> None:
            while not progress.empty():
                kind, k, payload = progress.get_nowait()
                if kind == "progress":
                    latest[k] = payload
                    continue
                rec: RequestRecord = payload
                rec.index = index_offset + len(records)
                records.append(rec)
                if rec.ttft_ms is not None:
                    live.on_first(rec.ttft_ms)
                live.on_record(rec)  # done, errors, ITL
                if on_record is not None:
                    on_record(rec)

        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = []
            for k in range(workers):
                sub, share, sub_rule = split_plan(plan, dataset, rule, workers, k)
                futures.append(pool.submit(_worker_level, k, sub, share, opts, sub_rule, seed + k, t_start,
                                           progress, cancel_flag))
            next_tick = time.perf_counter() + 0.5
            while not all(f.done() for f in futures):
                if cancel.is_set():
                    cancel_flag.value = 1
                drain()
                if latest:
                    live.tokens = base_tokens + sum(tokens for tokens, _ in latest.values())
                    live.in_flight = sum(in_flight for _, in_flight in latest.values())
                if time.perf_counter() >= next_tick:
                    live.publish()
                    next_tick += 0.5
                time.sleep(0.05)
            outcomes = [f.result() for f in futures]
            drain()  # a worker's last records were queued before its result
    live.in_flight = 0
    live.tokens = base_tokens + sum(x.output_tokens for x in records)
    reasons = [o.stop_reason for o in outcomes if o.stop_reason != "completed"]
    return LevelOutcome(records, max(o.duration_s for o in outcomes), sum(o.peak_concurrency for o in outcomes),
                        reasons[0] if reasons else "completed", [x for o in outcomes for x in o.client_lag_ms])
