"""Stand-ins for a ladder's engines and runs (unit and GUI tests of ``app.ladder``): engines that
are "launched" and reused by their flags (``tests.fakes.campaign``), and a runner that publishes a
real run's events (so the real recorder stores it) with figures scripted per step."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.bus import Bus
from app.config import RunConfig
from app.events import RequestDone
from app.load.metrics import EngineDeltas, LevelSummary, RequestRecord, Stats
from engine_adapters.base import FeatureCheck
from tests.fakes.campaign import FakeEngines, FakeRunner

__all__ = ["FakeEngines", "FakeLadderRunner", "Script"]

DURATION_S = 2.0
REQUESTS = 8
INPUT_TOKENS = 100


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


class FakeLadderRunner(FakeRunner):
    """Runs nothing: publishes RunStarted ... RunFinished with the scripted figures."""

    requests = REQUESTS
    hardware = {"cpu_model": "Test CPU", "cpu_count_logical": 2, "ram_total_bytes": 8 * 2**30}
    result_hardware = {"cpu_model": "Test CPU"}
    scripts: ClassVar[dict[str, Script]] = {}
    calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, config: RunConfig, bus: Bus, **kwargs: Any) -> None:
        super().__init__(config, bus, **kwargs)
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

    def begin(self) -> str | None:
        self.script = self._script()
        return "scripted failure" if self.script.status != "completed" else None

    def feature_checks(self) -> list[FeatureCheck]:
        return self._checks(self.script)

    def measure(self, run_id: str, t0: float, cancel: threading.Event | None) -> LevelSummary:
        script = self.script
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
        return LevelSummary(requests=REQUESTS, completed=REQUESTS, duration_s=DURATION_S,
                            input_tokens=INPUT_TOKENS * REQUESTS, output_tokens=per_request * REQUESTS,
                            request_throughput_rps=REQUESTS / DURATION_S, output_tok_per_s=out,
                            total_tok_per_s=out + INPUT_TOKENS * REQUESTS / DURATION_S,
                            ttft_ms=Stats(count=REQUESTS, mean=script.ttft_ms, median=script.ttft_ms),
                            itl_ms=Stats(count=REQUESTS, mean=5.0, median=5.0),
                            peak_concurrency=self.config.load.concurrency,
                            engine=EngineDeltas(engine_tokens_per_step_mean=script.tokens_per_step,
                                                generation_tokens=per_request * REQUESTS))
