"""Stand-ins for a tune's engines and runs (unit tests of ``app.tuner``, the tuner benchmark): an
engine source that "launches" by flags and can refuse to start some (``tests.fakes.campaign``), and
a runner whose figures follow a small queueing model of the engine knobs and the load, published
as a real run's events so the real recorder stores them.

The model: ``active = min(concurrency, max_num_seqs)`` sequences decode together; output tok/s =
``active x 50`` (x 1.5 with prefix caching); mean TPOT = ``10 + 2 x active`` ms; TTFT grows with the
requests queued beyond ``max_num_seqs`` and is lower with prefix caching.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from app.config import RunConfig
from app.load.metrics import LevelSummary, Stats
from tests.fakes.campaign import FakeEngines, FakeRunner

__all__ = ["FakeEngines", "FakeTuneRunner", "model_figures"]

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


class FakeTuneRunner(FakeRunner):
    """Runs nothing: publishes RunStarted ... RunFinished with the model's figures. ``calls`` logs
    each run's (knobs, concurrency); ``hook(config)`` may raise (a crash) or return a failure reason."""

    requests = REQUESTS
    hardware: ClassVar[dict[str, Any]] = {"cpu_model": "Test CPU", "cpu_count_logical": 2}
    """What a stored trial run records of its machine: two cores, so that its cost can be counted."""
    calls: ClassVar[list[tuple[int | None, bool | None, int]]] = []
    hook: ClassVar[Callable[[RunConfig], str | None] | None] = None
    run_s: ClassVar[float] = 0.0

    @classmethod
    def reset(cls) -> None:
        cls.calls, cls.hook, cls.run_s = [], None, 0.0

    def begin(self) -> str | None:
        cfg = self.config
        FakeTuneRunner.calls.append((cfg.features.max_num_seqs, cfg.features.prefix_caching, cfg.load.concurrency))
        failure = FakeTuneRunner.hook(cfg) if FakeTuneRunner.hook is not None else None
        if FakeTuneRunner.run_s:
            time.sleep(FakeTuneRunner.run_s)
        return failure

    def measure(self, run_id: str, t0: float, cancel: threading.Event | None) -> LevelSummary:
        m, c = model_figures(self.config), self.config.load.concurrency
        out_tokens = int(m["tok_s"] * DURATION_S)
        return LevelSummary(
            requests=REQUESTS, completed=REQUESTS, duration_s=DURATION_S, input_tokens=100 * REQUESTS,
            output_tokens=out_tokens, request_throughput_rps=REQUESTS / DURATION_S, output_tok_per_s=m["tok_s"],
            total_tok_per_s=m["tok_s"] + 100 * REQUESTS / DURATION_S,
            ttft_ms=Stats(count=REQUESTS, mean=m["ttft_p99"] / 2, median=m["ttft_p99"] / 2, p90=m["ttft_p99"] * 0.9,
                          p95=m["ttft_p99"] * 0.95, p99=m["ttft_p99"]),
            tpot_ms=Stats(count=REQUESTS, mean=m["tpot_mean"], median=m["tpot_mean"], p90=m["tpot_p99"],
                          p95=m["tpot_p99"], p99=m["tpot_p99"]),
            peak_concurrency=c)
