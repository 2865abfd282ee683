"""Stand-ins for a tune's engines and runs (unit tests of ``app.tuner``, the tuner benchmark): an
engine source that "launches" by flags (and can refuse to start some), and a runner whose figures
follow a small queueing model of the engine knobs and the load, published as a real run's events
so the real recorder stores them.

The model: ``active = min(concurrency, max_num_seqs)`` sequences decode together; output tok/s =
``active x 50`` (x 1.5 with prefix caching); mean TPOT = ``10 + 2 x active`` ms; TTFT grows with the
requests queued beyond ``max_num_seqs`` and is lower with prefix caching.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from app.bus import Bus
from app.campaign import engine_key
from app.config import RunConfig
from app.errors import EngineFailed
from app.events import EngineReady, LevelFinished, LevelStarted, RunFinished, RunStarted
from app.load.metrics import LevelSummary, Stats
from app.runner import LevelResult, RunResult

REQUESTS = 16
DURATION_S = 4.0


def model_figures(config: RunConfig) -> dict[str, float]:
    """(tok/s, mean TPOT, TTFT p99, TPOT p99) of a configuration at its load."""
    f, c = config.features, config.load.concurrency
    seqs = f.max_num_seqs or 256
    active = min(c, seqs)
    queued = max(0, c - seqs)
    boost = 1.5 if f.prefix_caching else 1.0
    tpot = 10.0 + 2.0 * active
    ttft = (40.0 if f.prefix_caching else 100.0) * (1.0 + queued / active) + 5.0 * c
    return {"tok_s": active * 50.0 * boost, "tpot_mean": tpot, "tpot_p99": tpot * 1.2, "ttft_p99": ttft}


class FakeEngine:
    def __init__(self, key: str, n: int) -> None:
        self.key, self.stopped, self.n = key, False, n
        self.base_url = f"http://127.0.0.1:{9100 + n}"
        self.pid = 200_000 + n

    def is_running(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True


class FakeEngines:
    """An engine source that relaunches only when engine flags change; ``refuse(config)`` returns a
    diagnosis for configurations whose engine "does not start"."""

    def __init__(self, refuse: Callable[[RunConfig], str | None] | None = None, start_s: float = 0.0) -> None:
        self.engine: FakeEngine | None = None
        self.launched: list[RunConfig] = []
        self.refuse = refuse
        self.start_s = start_s
        self.launches = 0

    def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> Any:
        key = engine_key(config)
        if self.engine is not None and self.engine.key == key and self.engine.is_running():
            return self.engine
        if self.engine is not None:
            self.engine.stop()
        self.launched.append(config)
        self.launches += 1
        if self.start_s:
            time.sleep(self.start_s)
        reason = self.refuse(config) if self.refuse is not None else None
        if reason is not None:
            self.engine = None
            raise EngineFailed(reason)
        self.engine = FakeEngine(key, len(self.launched))
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()


class FakeTuneRunner:
    """Runs nothing: publishes RunStarted ... RunFinished with the model's figures. ``calls`` logs
    each run's (knobs, concurrency); ``hook(config)`` may raise (a crash) or return a failure reason."""

    calls: ClassVar[list[tuple[int | None, bool | None, int]]] = []
    hook: ClassVar[Callable[[RunConfig], str | None] | None] = None
    run_s: ClassVar[float] = 0.0

    def __init__(self, config: RunConfig, bus: Bus, **kwargs: Any) -> None:
        self.config, self.bus, self.kwargs = config, bus, kwargs

    @classmethod
    def reset(cls) -> None:
        cls.calls, cls.hook, cls.run_s = [], None, 0.0

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        cfg = self.config
        FakeTuneRunner.calls.append((cfg.features.max_num_seqs, cfg.features.prefix_caching, cfg.load.concurrency))
        failure = FakeTuneRunner.hook(cfg) if FakeTuneRunner.hook is not None else None
        if FakeTuneRunner.run_s:
            time.sleep(FakeTuneRunner.run_s)
        m = model_figures(cfg)
        run_id, t0 = uuid.uuid4().hex, time.time()
        c = cfg.load.concurrency
        self.bus.emit(RunStarted(run_id=run_id, name=cfg.name, tags=list(cfg.tags), config=cfg, engine_kind="vllm",
                                 model=cfg.engine.model, engine_version="0.32.0",
                                 hardware={"cpu_model": "Test CPU"}, started_wall_s=t0))
        engine = self.kwargs.get("engine")
        self.bus.emit(EngineReady(run_id=run_id, base_url=getattr(engine, "base_url", "http://127.0.0.1:1"),
                                  startup_s=30.0))
        self.bus.emit(LevelStarted(run_id=run_id, index=0, label=f"c{c}", mode="closed", concurrency=c,
                                   started_wall_s=t0, num_requests=REQUESTS))
        out_tokens = int(m["tok_s"] * DURATION_S)
        summary = LevelSummary(
            requests=REQUESTS, completed=REQUESTS, duration_s=DURATION_S, input_tokens=100 * REQUESTS,
            output_tokens=out_tokens, request_throughput_rps=REQUESTS / DURATION_S, output_tok_per_s=m["tok_s"],
            total_tok_per_s=m["tok_s"] + 100 * REQUESTS / DURATION_S,
            ttft_ms=Stats(count=REQUESTS, mean=m["ttft_p99"] / 2, median=m["ttft_p99"] / 2, p90=m["ttft_p99"] * 0.9,
                          p95=m["ttft_p99"] * 0.95, p99=m["ttft_p99"]),
            tpot_ms=Stats(count=REQUESTS, mean=m["tpot_mean"], median=m["tpot_mean"], p90=m["tpot_p99"],
                          p95=m["tpot_p99"], p99=m["tpot_p99"]),
            peak_concurrency=c)
        self.bus.emit(LevelFinished(run_id=run_id, index=0, label=f"c{c}", summary=summary))
        result = RunResult(run_id=run_id, name=cfg.name, config=cfg, started_wall_s=t0, engine_version="0.32.0",
                           model=cfg.engine.model, startup_s=30.0,
                           levels=[LevelResult(index=0, label=f"c{c}", mode="closed", concurrency=c,
                                               started_wall_s=t0, summary=summary)])
        if cancel is not None and cancel.is_set():
            result.status, result.reason = "cancelled", "cancelled"
        elif failure is not None:
            result.status, result.reason = "failed", failure
        result.ended_wall_s = time.time()
        self.bus.emit(RunFinished(run_id=run_id, status=result.status, reason=result.reason,
                                  ended_wall_s=result.ended_wall_s, summary=result.summary()))
        return result
