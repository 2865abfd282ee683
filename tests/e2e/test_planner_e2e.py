"""The planner against the real vLLM CPU engine (the CPU demo's checks): the KV capacity it
plans is the one the engine reports, within 5%, and every measured rate of a short concurrency
sweep stays under its decode ceiling at the batch the engine really ran."""

from __future__ import annotations

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.planner.live import limit_figures
from app.planner.plan import make_plan
from app.runner import Runner
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.launcher import EngineProcess

pytestmark = pytest.mark.e2e


def test_planned_kv_matches_the_engine_and_rates_stay_under_the_ceiling(demo_engine: EngineProcess) -> None:
    config = RunConfig(name="planner e2e", engine=demo_engine.engine, features=demo_engine.features,
                       workload=WorkloadConfig(num_requests=16, input_len=LengthSpec(mean=64),
                                               output_len=LengthSpec(mean=32)),
                       load=LoadConfig(pattern="sweep", levels=[1, 8]))
    plan = make_plan(config)
    assert demo_engine.ready_info is not None
    engine_tokens = demo_engine.ready_info.kv_cache["kv_cache_tokens"]
    assert plan.memory.kv_tokens == pytest.approx(engine_tokens, rel=0.05), (plan.memory.kv_tokens, engine_tokens)

    result = Runner(config, Bus(), engine=demo_engine, telemetry=False).run()
    assert result.status == "completed", result.reason
    # the run sets the engine's figure beside the plan's, with the plan's error
    assert any(n.startswith("KV cache planned") and "plan error" in n for n in result.notes), result.notes
    for level in result.levels:
        figures = limit_figures(plan, level.summary)
        assert figures is not None, level.label
        assert figures.flag is None and figures.fraction is not None and 0 < figures.fraction <= 1, figures.detail()
        assert level.concurrency is not None and figures.batch <= level.concurrency + 1e-9  # never more than the requests
