"""Stand-ins for a ladder's engines and runs (unit and GUI tests of ``app.ladder``): engines that
are "launched" and reused by their flags, and a runner that publishes a real run's events (so
the real recorder stores it) with figures scripted per step."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from app.bus import Bus
from app.campaign import engine_key
from app.config import RunConfig
from app.events import EngineReady, LevelFinished, LevelStarted, RequestDone, RunFinished, RunStarted
from app.load.metrics import EngineDeltas, LevelSummary, RequestRecord, Stats
from app.runner import LevelResult, RunResult
from engine_adapters.base import FeatureCheck

DURATION_S = 2.0
REQUESTS = 8
INPUT_TOKENS = 100


class FakeEngine:
    def __init__(self, key: str, n: int) -> None:
        self.key, self.stopped, self.n = key, False, n
        self.base_url = f"http://127.0.0.1:{9000 + n}"
        self.pid = 100_000 + n

    def is_running(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True


class FakeEngines:
    """An engine source (``app.campaign.EngineSource``) that relaunches only when flags change."""

    def __init__(self) -> None:
        self.engine: FakeEngine | None = None
        self.launched: list[RunConfig] = []

    def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> Any:
        key = engine_key(config)
        if self.engine is not None and self.engine.key == key and self.engine.is_running():
            return self.engine
        if self.engine is not None:
            self.engine.stop()
        self.launched.append(config)
        self.engine = FakeEngine(key, len(self.launched))
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()


@dataclass
class Script:
    """What a step's run measures (matched by a substring of the run's name)."""

    output_tok_per_s: float
    tokens_per_step: float | None = None
    not_active: tuple[str, ...] = ()
    status: str = "completed"
    ttft_ms: float = 50.0
    delay_s: float = 0.0
    progress: list[float] = field(default_factory=list)


class FakeLadderRunner:
    """Runs nothing: publishes RunStarted ... RunFinished with the scripted figures."""

    scripts: ClassVar[dict[str, Script]] = {}
    calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, config: RunConfig, bus: Bus, **kwargs: Any) -> None:
        self.config, self.bus, self.kwargs = config, bus, kwargs
        FakeLadderRunner.calls.append({"config": config, **kwargs})

    def _script(self) -> Script:
        for needle, script in self.scripts.items():
            if needle in self.config.name:
                return script
        raise AssertionError(f"no script for run {self.config.name!r}")

    def _checks(self, script: Script) -> list[FeatureCheck]:
        f = self.config.features
        wanted: list[tuple[str, str]] = []
        if f.prefix_caching is not None:
            wanted.append(("prefix_caching", str(f.prefix_caching)))
        if f.kv_cache_dtype != "auto":
            wanted.append(("kv_cache_dtype", f.kv_cache_dtype))
        if f.speculative.method != "off":
            wanted.append(("speculative", f.speculative.method))
        return [FeatureCheck(key, value, "not active" if key in script.not_active else "verified",
                             "scripted by the test") for key, value in wanted]

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        script = self._script()
        run_id, t0 = uuid.uuid4().hex, time.time()
        engine = self.kwargs.get("engine")
        checks = self._checks(script)
        self.bus.emit(RunStarted(run_id=run_id, name=self.config.name, tags=list(self.config.tags), config=self.config,
                                 engine_kind="vllm", model=self.config.engine.model, engine_version="0.32.0",
                                 hardware={"cpu_model": "Test CPU", "cpu_count_logical": 2,
                                           "ram_total_bytes": 8 * 2**30}, started_wall_s=t0))
        self.bus.emit(EngineReady(run_id=run_id, base_url=getattr(engine, "base_url", "http://127.0.0.1:1"),
                                  startup_s=30.0, feature_checks=checks))
        concurrency = self.config.load.concurrency
        self.bus.emit(LevelStarted(run_id=run_id, index=0, label=f"c{concurrency}", mode="closed",
                                   concurrency=concurrency, started_wall_s=t0, num_requests=REQUESTS))
        if script.delay_s:
            deadline = time.monotonic() + script.delay_s
            while time.monotonic() < deadline and not (cancel and cancel.is_set()):
                time.sleep(0.02)
        per_request = round(script.output_tok_per_s * DURATION_S / REQUESTS)
        for k in range(REQUESTS):
            record = RequestRecord(level=0, index=k, scheduled_s=0.0, start_s=0.0, start_wall_s=t0, queue_ms=0.1,
                                   ttft_ms=script.ttft_ms, itl_ms=[5.0] * (per_request - 1), tpot_ms=5.0,
                                   e2e_ms=DURATION_S * 1000, input_tokens=INPUT_TOKENS, output_tokens=per_request,
                                   expected_output_tokens=per_request, ok=True, finish_reason="length")
            self.bus.emit(RequestDone(run_id=run_id, record=record))
        out = per_request * REQUESTS / DURATION_S
        summary = LevelSummary(requests=REQUESTS, completed=REQUESTS, duration_s=DURATION_S,
                               input_tokens=INPUT_TOKENS * REQUESTS, output_tokens=per_request * REQUESTS,
                               request_throughput_rps=REQUESTS / DURATION_S, output_tok_per_s=out,
                               total_tok_per_s=out + INPUT_TOKENS * REQUESTS / DURATION_S,
                               ttft_ms=Stats(count=REQUESTS, mean=script.ttft_ms, median=script.ttft_ms),
                               itl_ms=Stats(count=REQUESTS, mean=5.0, median=5.0), peak_concurrency=concurrency,
                               engine=EngineDeltas(engine_tokens_per_step_mean=script.tokens_per_step,
                                                   generation_tokens=per_request * REQUESTS))
        self.bus.emit(LevelFinished(run_id=run_id, index=0, label=f"c{concurrency}", summary=summary))
        result = RunResult(run_id=run_id, name=self.config.name, config=self.config, started_wall_s=t0,
                           engine_version="0.32.0", model=self.config.engine.model, startup_s=30.0,
                           hardware={"cpu_model": "Test CPU"}, feature_checks=[asdict(c) for c in checks],
                           levels=[LevelResult(index=0, label=f"c{concurrency}", mode="closed", concurrency=concurrency,
                                               started_wall_s=t0, summary=summary)])
        if cancel is not None and cancel.is_set():
            result.status, result.reason = "cancelled", "cancelled"
        elif script.status != "completed":
            result.status, result.reason = "failed", "scripted failure"  # type: ignore[assignment]
        result.ended_wall_s = time.time()
        self.bus.emit(RunFinished(run_id=run_id, status=result.status, reason=result.reason,
                                  ended_wall_s=result.ended_wall_s, summary=result.summary()))
        return result
