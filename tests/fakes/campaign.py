"""What the ladder's and the tuner's stand-ins share (``tests.fakes.ladder``, ``tests.fakes.tuner``):
the host their planner sees, an engine source that "launches" by engine flags
(``app.campaign.EngineSource``), and a runner skeleton that publishes a real run's events (so the
real recorder stores them) around the one level each face measures its own way."""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from app.bus import Bus
from app.campaign import engine_key
from app.config import RunConfig
from app.errors import EngineFailed
from app.events import EngineReady, LevelFinished, LevelStarted, RunFinished, RunStarted
from app.load.metrics import LevelSummary
from app.runner import LevelResult, RunResult
from engine_adapters.base import FeatureCheck
from engine_adapters.hardware import HardwareInfo

if TYPE_CHECKING:
    import pytest

AVX512 = HardwareInfo(cpu_model="Test CPU", cpu_count_logical=2, cpu_flags=["avx2", "avx512f"], ram_total_bytes=2**34)
AVX2_ONLY = HardwareInfo(cpu_model="Test CPU", cpu_count_logical=2, cpu_flags=["avx2"], ram_total_bytes=2**34)
HOST_BANDWIDTH_BYTES_PER_S = 1e10


def on_known_host(monkeypatch: pytest.MonkeyPatch, campaign_run: ModuleType) -> None:
    """A host memory bandwidth of 10 GB/s (the planner measures it otherwise) and an AVX-512 CPU
    without a GPU, as the planner and ``campaign_run`` (the campaign's run module) probe them."""
    import app.planner.host as host
    import app.planner.plan as plan

    monkeypatch.setattr(host, "host_bandwidth_bytes_per_s", lambda refresh=False: (HOST_BANDWIDTH_BYTES_PER_S, "test"))
    monkeypatch.setattr(campaign_run, "probe_hardware", lambda: AVX512)
    monkeypatch.setattr(plan, "probe_hardware", lambda: AVX512)


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
    """An engine source that relaunches only when engine flags change; ``refuse(config)`` returns a
    diagnosis for configurations whose engine "does not start"; ``start_s`` is each launch's time."""

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


class FakeRunner(ABC):
    """Runs nothing: publishes RunStarted, EngineReady, one level and RunFinished. A face says how
    the run begins (:meth:`begin`: may raise, a crash; returns a failure reason), which features
    it verifies and what its one level measures (:meth:`measure`)."""

    requests: ClassVar[int] = 8
    hardware: ClassVar[dict[str, Any]] = {"cpu_model": "Test CPU"}
    """What RunStarted says of the machine."""
    result_hardware: ClassVar[dict[str, Any]] = {}
    """What the RunResult says of the machine."""

    def __init__(self, config: RunConfig, bus: Bus, **kwargs: Any) -> None:
        self.config, self.bus, self.kwargs = config, bus, kwargs

    def begin(self) -> str | None:
        return None

    def feature_checks(self) -> list[FeatureCheck]:
        return []

    @abstractmethod
    def measure(self, run_id: str, t0: float, cancel: threading.Event | None) -> LevelSummary:
        """What its one level measures: each face (FakeLadderRunner, FakeTuneRunner) its own way."""

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        failure = self.begin()
        cfg = self.config
        run_id, t0 = uuid.uuid4().hex, time.time()
        engine = self.kwargs.get("engine")
        checks = self.feature_checks()
        c = cfg.load.concurrency
        self.bus.emit(RunStarted(run_id=run_id, name=cfg.name, tags=list(cfg.tags), config=cfg, engine_kind="vllm",
                                 model=cfg.engine.model, engine_version="0.32.0", hardware=dict(self.hardware),
                                 started_wall_s=t0))
        self.bus.emit(EngineReady(run_id=run_id, base_url=getattr(engine, "base_url", "http://127.0.0.1:1"),
                                  startup_s=30.0, feature_checks=checks))
        self.bus.emit(LevelStarted(run_id=run_id, index=0, label=f"c{c}", mode="closed", concurrency=c,
                                   started_wall_s=t0, num_requests=self.requests))
        summary = self.measure(run_id, t0, cancel)
        self.bus.emit(LevelFinished(run_id=run_id, index=0, label=f"c{c}", summary=summary))
        result = RunResult(run_id=run_id, name=cfg.name, config=cfg, started_wall_s=t0, engine_version="0.32.0",
                           model=cfg.engine.model, startup_s=30.0, hardware=dict(self.result_hardware),
                           feature_checks=[asdict(x) for x in checks],
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
