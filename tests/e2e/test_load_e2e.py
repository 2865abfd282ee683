"""The load generator on the real vLLM CPU engine: prefix caching shows in hit rate and TTFT,
continuous batching shows in a concurrency sweep, the client's token count equals the engine's
exactly (with and without n-gram speculation), and `tunebench run` launches, measures and stops
its own engine. Short runs on shared engines: few requests, short outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.bus import Bus, Event
from app.config import RunConfig
from app.events import LevelFinished, PhaseChanged, Progress, RunFinished, RunStarted
from app.runner import Runner, RunResult
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, SpeculativeConfig
from engine_adapters.launcher import EngineProcess, group_members

pytestmark = pytest.mark.e2e


def run_on(engine: EngineProcess, workload: WorkloadConfig, load: LoadConfig, bus: Bus | None = None) -> RunResult:
    config = RunConfig(name="e2e", engine=engine.engine, features=engine.features, workload=workload, load=load)
    result = Runner(config, bus or Bus(), engine=engine, telemetry=False, keep_requests=True).run()
    assert result.status == "completed", result.reason
    return result


def check_records(result: RunResult) -> None:
    """Every request ok, per-token ITL, token counts equal to the engine's counter delta."""
    for level in result.levels:
        s = level.summary
        assert s.errors == 0, s.error_examples
        assert s.tokens_source == "usage"  # vLLM sends per-chunk usage: tokens, not chunks, are counted
        assert len(level.requests) == s.completed > 0  # every record kept (keep_requests), so each is checked
        for rec in level.requests:
            assert rec.output_tokens == rec.expected_output_tokens  # ignore_eos: the asked length
            assert len(rec.itl_ms) == rec.output_tokens - 1
        assert s.engine.generation_tokens is not None
        assert s.output_tokens == int(s.engine.generation_tokens), (s.output_tokens, s.engine.generation_tokens)
        assert s.tokens_match_engine is True


def test_prefix_caching_raises_hit_rate_and_lowers_ttft(engine_pool, demo_engine: EngineProcess) -> None:  # type: ignore[no-untyped-def]
    workload = WorkloadConfig(kind="shared_prefix", num_requests=24, shared_prefix_tokens=1536,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=4))
    load = LoadConfig(concurrency=1, warmup_requests=1)
    off = run_on(engine_pool.get(Features(prefix_caching=False)), workload, load)
    on = run_on(demo_engine, workload, load)
    s_off, s_on = off.levels[0].summary, on.levels[0].summary
    engine_ttft = [s.engine.engine_ttft_ms_mean for s in (s_off, s_on)]
    print(f"\nTTFT p50 prefix caching off {s_off.ttft_ms.median:.1f} ms, on {s_on.ttft_ms.median:.1f} ms; engine TTFT "
          f"mean {engine_ttft}; hit rate off {s_off.engine.prefix_cache_hit_rate}, on {s_on.engine.prefix_cache_hit_rate}")
    assert on.lengths_exact and s_on.input_tokens >= 24 * (1536 + 32)
    # 23 of the 24 requests find the 1,536-token prefix cached (the level's own salt: the first
    # computes it): 23 x 1,536 of 24 x 1,568 prompt tokens = 94%
    assert s_on.engine.prefix_cache_hit_rate is not None and s_on.engine.prefix_cache_hit_rate > 0.85
    assert not s_off.engine.prefix_cache_hit_rate  # None (no queries) or 0
    # The benefit, as a factor and from the engine's own TTFT histogram (a client starved by the
    # engine's threads times late): seen 64 -> 31 ms (2.1x; the first request computes the prefix,
    # and a 2-layer model's TTFT is mostly fixed cost). Losing half the benefit (about 1.0x) fails.
    # 24 requests, not 12: the figure is a mean, and one request held up ~200 ms on a loaded core
    # moves a mean of 12 by ~17 ms, enough to take 2.1x below 1.5x.
    assert engine_ttft[0] is not None and engine_ttft[1] is not None
    assert engine_ttft[1] * 1.5 <= engine_ttft[0], engine_ttft
    check_records(on)
    check_records(off)


def test_concurrency_sweep_shows_continuous_batching(demo_engine: EngineProcess) -> None:
    bus = Bus()
    sub = bus.subscribe(kinds=[LevelFinished, Progress])
    # Long outputs: each stream must outlast the API server's admission of the others (on 2 cores
    # it shares a core with this client), or the engine never sees 16 at once (64-token outputs
    # once gave 6 tokens per step at concurrency 16).
    result = run_on(demo_engine, WorkloadConfig(num_requests=32, input_len=LengthSpec(mean=64),
                                                output_len=LengthSpec(mean=256)),
                    LoadConfig(pattern="sweep", levels=[1, 4, 16], slo="ttft_ms<=2000,tpot_ms<=100"), bus)
    tok_s = [lv.summary.output_tok_per_s for lv in result.levels]
    tpot = [lv.summary.tpot_ms.mean or 0.0 for lv in result.levels]
    engine_itl = [lv.summary.engine.engine_itl_ms_mean or 0.0 for lv in result.levels]
    per_step = [lv.summary.engine.engine_tokens_per_step_mean or 0.0 for lv in result.levels]
    lag = [lv.summary.client_lag_ms.p99 for lv in result.levels]
    print(f"\nsweep 1/4/16: output tok/s {[round(x) for x in tok_s]}, engine tokens per step "
          f"{[round(x, 1) for x in per_step]}, client TPOT mean ms {[round(x, 2) for x in tpot]}, "
          f"engine ITL mean ms {[round(x, 2) for x in engine_itl]}, client loop lag p99 ms {lag}")
    # Continuous batching, seen where it happens: the engine packs the streams' decodes into each
    # step. At concurrency 1 a step carries one decode token (plus the prompt's share: 64 prompt
    # tokens over ~256 steps, about 1.25); at 16 it carries up to 16. Counted by the engine, so it does
    # not depend on timing the way throughput does on 2 shared cores (seen 1.4x to 5.8x here).
    # A client starved by the engine's spinning threads cannot keep every stream in flight (loop
    # lag of 1.4 s seen at concurrency 4), so the batch at 16 varied from 8.4 to 19.7 tokens per
    # step across runs here; one request at a time would stay near 1.2 at every level.
    assert 1.0 <= per_step[0] < 2.0, per_step
    assert per_step[2] > 3 * per_step[0], per_step
    assert tok_s[2] > tok_s[0], tok_s  # and batching pays: more tokens per second at 16 than at 1
    # ...while each stream's TPOT rises: a step carrying 16 decodes takes longer (seen 1.4 -> 3.8 ms).
    # Measured on the engine's side (its own histogram over the level): on these 2 cores the client
    # can be starved and read several tokens at once, so client TPOT is printed, not asserted.
    assert engine_itl[2] > engine_itl[0] > 0, engine_itl
    assert [lv.summary.peak_concurrency for lv in result.levels] == [1, 4, 16]
    assert all(lv.summary.good_requests is not None for lv in result.levels)
    check_records(result)
    items = sub.drain()
    assert sum(1 for i in items if isinstance(i, Event) and isinstance(i.payload, LevelFinished)) == 3
    assert any(isinstance(i, Event) and isinstance(i.payload, Progress) and i.payload.output_tok_per_s > 0
               for i in items)


def test_token_count_equals_engine_with_ngram_speculation(engine_pool, demo_engine: EngineProcess) -> None:  # type: ignore[no-untyped-def]
    spec = engine_pool.get(Features(prefix_caching=True, speculative=SpeculativeConfig(method="ngram")))
    workload = WorkloadConfig(kind="code", num_requests=8, input_len=LengthSpec(mean=256),
                              output_len=LengthSpec(mean=48), api="chat")
    # verified by effect: the startup probe saw drafts proposed and accepted (its echo alone is
    # only "accepted by the engine")
    verified = {c.key: c for c in spec.verify_features()}["speculative.method"]
    assert verified.status == "verified", verified
    result = run_on(spec, workload, LoadConfig(concurrency=4))
    check_records(result)
    s = result.levels[0].summary
    # the level's own spec-decode counters: drafts proposed and tokens accepted (code repeats itself)
    assert s.engine.spec_decode_drafts and s.engine.spec_decode_drafts > 0, s.engine
    assert s.engine.spec_decode_accepted_tokens and s.engine.spec_decode_accepted_tokens > 0, s.engine
    chunks = sum(r.chunks for r in result.levels[0].requests)
    print(f"\nngram: {s.output_tokens} tokens in {chunks} chunks, drafts {s.engine.spec_decode_drafts}, "
          f"acceptance {s.engine.spec_acceptance_rate}, mean acceptance length {s.engine.spec_mean_acceptance_length}")
    assert chunks < s.output_tokens  # accepted drafts arrive several tokens per chunk
    plain = run_on(demo_engine, workload, LoadConfig(concurrency=4))
    check_records(plain)


def test_cli_run_launches_measures_and_stops_its_engine(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('name = "e2e cli"\n[features]\nprefix_caching = false\n'
                       '[workload]\nnum_requests = 4\n[workload.input_len]\nmean = 16\n'
                       '[workload.output_len]\nmean = 8\n[load]\nconcurrency = 2\n')
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "app.cli", "run", str(profile), "--json", str(out), "--json-requests",
                           "--no-telemetry"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "engine ready at" in proc.stdout and "engine 32: equal" in proc.stdout and "stored as run" in proc.stdout
    data = json.loads(out.read_text())
    assert data["status"] == "completed" and data["argv"] and "--no-enable-prefix-caching" in data["argv"]
    assert data["env"].get("VLLM_API_KEY") == "***" and data["engine_version"]
    assert data["feature_checks"] and data["kv_cache"]
    requests = data["levels"][0]["requests"]
    assert len(requests) == 4 and all(r["ok"] for r in requests)
    # The engine it started is gone, its whole process group with it.
    assert data["engine_pid"] and not group_members(data["engine_pid"])


def test_engine_that_fails_to_start_ends_the_run_with_its_diagnosis(tmp_path: Path) -> None:
    # A model folder without config.json passes validation (the path exists); the engine refuses it.
    config = RunConfig(name="e2e fail", engine=EngineConfig(model=str(tmp_path)), workload=WorkloadConfig(num_requests=2))
    bus = Bus()
    sub = bus.subscribe(kinds=[RunStarted, PhaseChanged, RunFinished])
    result = Runner(config, bus, telemetry=False).run()
    assert result.status == "failed" and result.levels == []
    assert "model was not found" in (result.reason or ""), result.reason
    evs = [e for e in sub.drain() if isinstance(e, Event)]
    assert evs[0].kind == "run_started" and evs[-1].kind == "run_finished"
    assert any(isinstance(e.payload, PhaseChanged) and e.payload.phase == "failed" for e in evs)
    assert isinstance(evs[-1].payload, RunFinished) and evs[-1].payload.reason == result.reason
    assert result.engine_pid and not group_members(result.engine_pid)


def test_requests_the_engine_rejects_are_errors_with_its_reason(demo_engine: EngineProcess) -> None:
    # Longer than the model's context: vLLM answers 400; the run keeps the records and stops on
    # its error budget with the engine's own words.
    config = RunConfig(name="e2e 400", engine=demo_engine.engine, features=demo_engine.features,
                       workload=WorkloadConfig(num_requests=6, output_len=LengthSpec(mean=100_000)),
                       load=LoadConfig(concurrency=2))
    result = Runner(config, Bus(), engine=demo_engine, telemetry=False, keep_requests=True).run()
    assert result.status == "failed" and "error budget exceeded" in (result.reason or "")
    s = result.levels[0].summary
    assert s.errors >= 5 and s.error_kinds == {"http": s.errors}
    # The budget can cut the last request short before its answer: cancelled, not an error.
    answered = [r for r in result.levels[0].requests if r.error_kind != "cancelled"]
    assert len(answered) == s.errors and s.errors + s.cancelled == len(result.levels[0].requests)
    assert all(r.http_status == 400 and "HTTP 400" in (r.error or "") for r in answered)
    assert demo_engine.is_running()  # the runner never stops an engine it was handed
