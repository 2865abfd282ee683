"""Trace replay on the real vLLM CPU engine (prefix caching on): the shipped Mooncake sample,
replayed at its own times, gets the prefix-cache hits its block ids imply, within 10 points; the
same trace with every block id made unique gets next to none. Trace blocks are 512 tokens, four of
the CPU build's 128-token cache blocks, so every shared block is one the engine can hit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.load.traces import read_trace
from app.runner import Runner, RunResult
from app.workload import LoadConfig, WorkloadConfig
from engine_adapters.launcher import EngineProcess

pytestmark = pytest.mark.e2e

SAMPLE = Path(__file__).resolve().parent.parent.parent / "assets" / "traces" / "mooncake-sample.jsonl"
SPEEDUP = 2.0  # the sample's 24 s in 12: arrivals still far apart next to a prefill on this engine


def replay(engine: EngineProcess, trace: Path) -> tuple[RunResult, float]:
    config = RunConfig(name="trace e2e", engine=engine.engine, features=engine.features,
                       workload=WorkloadConfig(kind="trace", dataset_path=str(trace)),
                       load=LoadConfig(pattern="trace", speedup=SPEEDUP))
    result = Runner(config, Bus(), engine=engine, telemetry=False, keep_requests=True).run()
    assert result.status == "completed", result.reason
    summary = result.levels[0].summary
    assert summary.completed == 40 and summary.errors == 0
    assert summary.engine is not None and summary.engine.prefix_cache_hit_rate is not None, "no prefix-cache counters"
    return result, summary.engine.prefix_cache_hit_rate


def test_a_mooncake_trace_hits_the_prefix_cache_as_its_blocks_imply(demo_engine: EngineProcess,
                                                                     tmp_path: Path) -> None:
    trace = read_trace(SAMPLE)
    implied = trace.reuse().prefix_token_reuse
    assert implied is not None and 0.4 < implied < 0.7, implied  # the sample's own: 55.4%
    result, measured = replay(demo_engine, SAMPLE)
    print(f"\nMooncake sample x{SPEEDUP:g}: the trace implies {implied:.1%}, the engine measured {measured:.1%}")
    assert abs(measured - implied) <= 0.10, (measured, implied)
    assert result.levels[0].summary.figures()["trace_prefix_reuse"] == pytest.approx(implied)
    note = next(n for n in result.notes if n.startswith("level trace"))
    assert f"the engine measured {measured:.1%} prefix-cache hits; the trace implies {implied:.1%}" in note, note
    # The client sent at the trace's times: the same schedule, twice as fast.
    sent = sorted(r.scheduled_s for r in result.levels[0].requests)
    assert sent == pytest.approx([r.at_s / SPEEDUP for r in trace.requests], abs=1e-3)

    unique = tmp_path / "unique.jsonl"
    unique.write_text("".join(json.dumps({"timestamp": r.at_s * 1e3, "input_length": r.input_tokens,
                                          "output_length": r.output_tokens, "hash_ids": list(r.blocks)}) + "\n"
                              for r in trace.with_unique_blocks().requests))
    assert read_trace(unique).reuse().prefix_token_reuse == 0.0
    _, none = replay(demo_engine, unique)
    print(f"the same trace, every block its own: the engine measured {none:.1%}")
    assert none <= 0.03, none
