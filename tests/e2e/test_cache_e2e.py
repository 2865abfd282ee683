"""Cold by default, on the real vLLM CPU engine with prefix caching on: the same profile run twice
on one engine sees the same prefix-cache hit rate (it was 6% then 75% before each level got a
cache salt of its own); prefix sharing inside a level is untouched; warm on purpose is warm."""

from __future__ import annotations

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.runner import Runner, RunResult
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.launcher import EngineProcess

pytestmark = pytest.mark.e2e

# The profile: random prompts of 512 tokens (four blocks of the CPU build's 128), 32-token
# outputs, concurrency 16. 96 requests keep it short; each run sends the same seeded prompts.
REPEATED = WorkloadConfig(num_requests=96, input_len=LengthSpec(mean=512), output_len=LengthSpec(mean=32))
LOAD = LoadConfig(concurrency=16)


def run_on(engine: EngineProcess, workload: WorkloadConfig, load: LoadConfig) -> RunResult:
    config = RunConfig(name="cache e2e", engine=engine.engine, features=engine.features, workload=workload, load=load)
    result = Runner(config, Bus(), engine=engine, telemetry=False).run()
    assert result.status == "completed", result.reason
    return result


def hit_rate(result: RunResult) -> float:
    engine = result.levels[0].summary.engine
    assert engine.prefix_cache_hit_rate is not None, "the engine's prefix-cache counters were not read"
    return engine.prefix_cache_hit_rate


def test_the_same_profile_twice_on_one_engine_starts_cold_both_times(demo_engine: EngineProcess) -> None:
    first, second = run_on(demo_engine, REPEATED, LOAD), run_on(demo_engine, REPEATED, LOAD)
    rates = [hit_rate(first), hit_rate(second)]
    tok_s = [r.levels[0].summary.output_tok_per_s for r in (first, second)]
    print(f"\nsame profile twice: prefix-cache hit rate {rates[0]:.1%} then {rates[1]:.1%}; "
          f"output {tok_s[0]:,.0f} then {tok_s[1]:,.0f} tok/s")
    assert [r.levels[0].summary.errors for r in (first, second)] == [0, 0]
    assert abs(rates[0] - rates[1]) <= 0.02, rates
    # Random prompts share no block with each other: cold means next to no hits, both times
    # (without salts the second run hit 384 of each prompt's 512 tokens: 75%).
    assert max(rates) < 0.05, rates
    assert all(any(n.startswith("prefix cache: cold:") for n in r.notes) for r in (first, second))

    # Warm on purpose: the level's prompts primed first, so each hits its three whole blocks that
    # precede the last token (384 of 512), as the unsalted second run did.
    warm = run_on(demo_engine, REPEATED.model_copy(update={"cache": "warm"}), LOAD)
    print(f"warm (primed): prefix-cache hit rate {hit_rate(warm):.1%}, "
          f"output {warm.levels[0].summary.output_tok_per_s:,.0f} tok/s")
    assert hit_rate(warm) >= 0.7, hit_rate(warm)
    assert warm.levels[0].summary.completed == 96  # the priming pass is not measured
    assert any("warm (primed)" in n for n in warm.notes), warm.notes


def test_a_shared_prefix_still_hits_within_a_level(demo_engine: EngineProcess) -> None:
    """All requests of a level carry the same salt, so a shared system prompt is computed once
    and then hit by the others (seen: 90.8% both times, as 31 of 32 requests hit 512 of 544)."""
    workload = WorkloadConfig(kind="shared_prefix", num_requests=32, shared_prefix_tokens=512,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
    rates = [hit_rate(run_on(demo_engine, workload, LoadConfig(concurrency=4))) for _ in range(2)]
    print(f"\nshared 512-token prefix, twice: prefix-cache hit rate {rates[0]:.1%} then {rates[1]:.1%}")
    assert min(rates) > 0.6, rates  # 28 x 512 / (32 x 544) = 82% even if the first four all miss
    assert abs(rates[0] - rates[1]) <= 0.1, rates  # the second run is cold too: no run-wide hits
