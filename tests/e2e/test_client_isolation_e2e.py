"""The load client is never the bottleneck on the CPU demo: it runs in a process of its own, on the
core the engine's compute threads leave free, and its means agree with the engine's own
histograms (issue: client TTFT p50 121 ms against the engine's 20 ms, from a starved client).

The client's TTFT also counts HTTP and the API server's tokenization, which the engine's
histogram does not (+11 to +19 ms was seen from an unstarved client): hence 30 ms, and 10% on E2E.
Other programs on this shared 2-core machine can starve any process now and then: a run that misses
the bounds is measured again (up to three runs) only when its own lag probe says it was starved. A
client the engine starves misses them in every run, and fails."""

from __future__ import annotations

import os

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.load.metrics import client_starved
from app.runner import Runner
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.cpu_binding import OMP_BIND_ENV, client_cpus
from engine_adapters.launcher import EngineProcess

pytestmark = pytest.mark.e2e

TTFT_SLACK_MS = 30.0
E2E_SLACK = 0.10
ATTEMPTS = 3


def test_client_means_agree_with_the_engines_histograms(demo_engine: EngineProcess) -> None:
    if len(os.sched_getaffinity(0)) >= 2:  # the demo engine's compute threads are pinned off the client's core
        assert OMP_BIND_ENV in demo_engine.env_added and client_cpus(demo_engine.env_added)
    workload = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=512, num_requests=64,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=32))
    config = RunConfig(name="e2e client isolation", engine=demo_engine.engine, features=demo_engine.features,
                       workload=workload, load=LoadConfig(concurrency=4, warmup_requests=4))
    seen = []
    for _ in range(ATTEMPTS):
        runner = Runner(config, Bus(), engine=demo_engine, telemetry=False)
        result = runner.run()
        assert result.status == "completed", result.reason
        assert runner.client_pids and os.getpid() not in runner.client_pids  # the client is another process
        s = result.levels[0].summary
        e = s.engine
        assert e.engine_ttft_ms_mean is not None and e.engine_e2e_ms_mean is not None
        assert s.ttft_ms.mean is not None and s.e2e_ms.mean is not None
        figures = (f"client TTFT {s.ttft_ms.mean:.1f} ms vs engine {e.engine_ttft_ms_mean:.1f}; client E2E "
                   f"{s.e2e_ms.mean:.1f} ms vs engine {e.engine_e2e_ms_mean:.1f}; lag p99 {s.client_lag_ms.p99:.1f} ms")
        print("\n" + figures)
        seen.append(figures)
        agree = (abs(s.ttft_ms.mean - e.engine_ttft_ms_mean) <= TTFT_SLACK_MS
                 and abs(s.e2e_ms.mean - e.engine_e2e_ms_mean) <= E2E_SLACK * e.engine_e2e_ms_mean)
        if agree:
            return
        # Only a run that says it was starved may be measured again; a client that was fed and
        # still disagrees measures wrong.
        assert client_starved(s), figures
    pytest.fail("the client was starved in every run: " + " | ".join(seen))
