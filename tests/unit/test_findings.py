"""Findings (app.analysis.findings): each rule provoked by a run built from recorded engine /metrics
(vLLM 0.32 and llama.cpp pages in tests/data, their values moved as a loaded engine moves them,
read by the adapters' own metric tables and the live collector's rate deriver), stored as the
recorder stores a run; a healthy run raises no warning; the store gives the same findings as the
run held in memory; and ``tunebench explain``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.analysis.findings import (
    RULES,
    Finding,
    RunEvidence,
    explain,
    load_run,
    stored_config,
    supported_engines,
)
from app.analysis.summary import stored_metrics
from app.cli import main
from app.config import RunConfig
from app.load.metrics import (
    EngineDeltas,
    LevelSummary,
    LoadDelivered,
    RequestRecord,
    Stats,
    SteadyWindow,
    engine_deltas,
)
from app.planner.plan import decode_ceiling, make_plan
from app.planner.stored import level_limits
from app.store import LevelInfo, RunDetail, RunStore, SampleIn, SeriesBlock
from app.telemetry.engine_metrics import RateDeriver
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from db.records import RequestArrays
from engine_adapters import llamacpp, vllm
from engine_adapters.base import MetricNames
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.prometheus import MetricMap, Scrape
from engine_adapters.registry import METRICS

DATA = Path(__file__).parents[1] / "data"
REPO = Path(__file__).parents[2]
RECORDED = {"vllm": (DATA / "vllm-0.32.0-metrics.txt").read_text(encoding="utf-8"),
            "llamacpp": (DATA / "llamacpp-xllamacpp-2026.10.11549-metrics-after.txt").read_text(encoding="utf-8")}
TABLES: dict[str, MetricNames] = {"vllm": vllm.METRIC_NAMES, "llamacpp": llamacpp.METRIC_NAMES}
H100 = {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85_899_345_920}]}
LLAMA_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
START_WALL, T0_MONO, DURATION_S, STEP_S = 1.9e9, 1000.0, 20.0, 0.5
LEVEL_START_S = 2.0  # the level starts this long after the run (engine start, warm-up)

# --- a recorded engine, moving -----------------------------------------------------------------------

@dataclass
class Engine:
    """What a loaded engine's /metrics show: counters grow at these rates, gauges hold these
    values (``kv_full_from`` to the end of the level the KV cache is at ``kv_full_pct``)."""

    kind: str = "vllm"
    tok_per_s: float = 800.0
    prompt_tok_per_s: float = 800.0
    req_per_s: float = 6.0
    hit_ratio: float = 0.0
    ttft_s: float = 0.05
    queue_s: float = 0.005
    e2e_s: float = 1.3
    itl_s: float = 0.01
    tokens_per_step: float = 8.0
    preempt_per_s: float = 0.0
    kv_pct: float = 40.0
    kv_full_pct: float | None = None
    waiting: float = 0.0
    running: float = 8.0
    drafts_per_s: float = 0.0
    draft_tok_per_s: float = 0.0
    accepted_tok_per_s: float = 0.0

    def values(self, t: float) -> dict[str, float]:
        """Canonical name -> value at ``t`` seconds into the level (counters since its start)."""
        kv = self.kv_full_pct if self.kv_full_pct is not None else self.kv_pct
        steps = self.tok_per_s / self.tokens_per_step * t
        done = self.req_per_s * t
        out = {"generation_tokens": self.tok_per_s * t, "prompt_tokens": self.prompt_tok_per_s * t,
               "prefix_cache_queries": self.prompt_tok_per_s * t,
               "prefix_cache_hits": self.hit_ratio * self.prompt_tok_per_s * t,
               "preemptions": self.preempt_per_s * t, "requests_running": self.running,
               "requests_waiting": self.waiting, "kv_cache_usage_ratio": kv / 100.0,
               "ttft_s": (self.ttft_s * done, done), "queue_s": (self.queue_s * done, done),
               "e2e_s": (self.e2e_s * done, done), "itl_s": (self.itl_s * self.tok_per_s * t, self.tok_per_s * t),
               "tokens_per_step": (self.tokens_per_step * steps, steps)}
        if self.drafts_per_s:
            out |= {"spec_decode_drafts": self.drafts_per_s * t, "spec_decode_draft_tokens": self.draft_tok_per_s * t,
                    "spec_decode_accepted_tokens": self.accepted_tok_per_s * t}
        if self.kind == "llamacpp":  # it counts the prompt tokens it computed, the cached ones apart
            out["prompt_tokens"] = (1 - self.hit_ratio) * self.prompt_tok_per_s * t
        return out

def page(kind: str, values: Mapping[str, Any]) -> str:
    """The recorded /metrics page of ``kind`` with ``values`` (canonical names) written in, under the
    engine's own names (its adapter's table: the first alias); a name the page lacks is added."""
    table, lines = TABLES[kind], RECORDED[kind].splitlines()
    wanted: dict[str, float] = {}
    for canonical, value in values.items():
        for group in (table.gauges, table.counters, table.histograms):
            if canonical in group:
                name = group[canonical][0]
                if group is table.histograms:
                    wanted[name + "_sum"], wanted[name + "_count"] = value
                else:
                    wanted[name] = value
    seen: set[str] = set()
    for i, line in enumerate(lines):
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if line.startswith("#") or name not in wanted:
            continue
        lines[i] = f"{line.rsplit(' ', 1)[0]} {0.0 if name in seen else wanted[name]!r}"  # one label set holds it
        seen.add(name)
    lines += [f"{name} {value!r}" for name, value in wanted.items() if name not in seen]
    return "\n".join(lines) + "\n"

def scrapes(engine: Engine) -> list[tuple[float, Scrape]]:
    reader = MetricMap(TABLES[engine.kind])
    times = np.arange(0.0, DURATION_S + STEP_S / 2, STEP_S)
    return [(float(t), reader.parse(page(engine.kind, engine.values(float(t))))) for t in times]

# --- a run as the recorder stores it ---------------------------------------------------------------

def llama_config(**features: Any) -> RunConfig:
    load = features.pop("load", LoadConfig(concurrency=8))
    workload = features.pop("workload", WorkloadConfig(input_len=LengthSpec(mean=128), output_len=LengthSpec(mean=128)))
    kind = features.pop("kind", "vllm")
    return RunConfig(name="findings", engine=EngineConfig(kind=kind, model=LLAMA_8B, runtime=RuntimeConfig(
        kind="executable", executable="vllm" if kind == "vllm" else "llama-server")),
        features=Features(**features), workload=workload, load=load)

def ceiling(config: RunConfig, batch: float) -> float:
    return decode_ceiling(make_plan(config, gpu="H100 SXM"), batch)

@dataclass
class Recorded:
    """What the recorder publishes of one single-level run."""

    config: RunConfig
    engine: Engine = field(default_factory=Engine)
    output_tok_per_s: float | None = None  # None: half the ceiling at the engine's batch
    requests: int = 40
    input_tokens: int = 128
    output_tokens: int = 128
    ttft_ms: float = 50.0
    e2e_ms: float = 1300.0
    client_lag_ms: float = 1.0
    delivered: LoadDelivered | None = None
    steady: bool = True
    hardware: dict[str, Any] = field(default_factory=lambda: dict(H100))
    name: str = "run"

    def rate(self) -> float:
        if self.output_tok_per_s is not None:
            return self.output_tok_per_s
        return 0.5 * ceiling(self.config, min(self.engine.tokens_per_step, float(self.config.load.concurrency)))

    def summary(self, deltas: EngineDeltas) -> LevelSummary:
        n, d = self.requests, DURATION_S
        steady = SteadyWindow(start_s=1.0, end_s=d - 1.0, rule="while 8 of the 8 requests asked were in flight",
                              requests=n - 8, output_tok_per_s=self.rate(), request_throughput_rps=n / d,
                              ttft_ms=Stats.of([self.ttft_ms] * n), e2e_ms=Stats.of([self.e2e_ms] * n))
        return LevelSummary(
            requests=n, completed=n, duration_s=d, input_tokens=n * self.input_tokens,
            output_tokens=n * self.output_tokens, request_throughput_rps=n / d, output_tok_per_s=self.rate(),
            total_tok_per_s=self.rate() + n * self.input_tokens / d, ttft_ms=Stats.of([self.ttft_ms] * n),
            itl_ms=Stats.of([10.0] * n), e2e_ms=Stats.of([self.e2e_ms] * n), queue_ms=Stats.of([0.2] * n),
            peak_concurrency=self.config.load.concurrency, client_lag_ms=Stats.of([self.client_lag_ms] * n),
            engine=deltas, tokens_match_engine=True,
            delivered=self.delivered or LoadDelivered(mode="closed", intended_concurrency=self.config.load.concurrency,
                                                      achieved_concurrency=self.config.load.concurrency - 0.1,
                                                      send_lag_ms=Stats.of([0.3] * n)),
            steady=steady if self.steady else None,
            steady_note=None if self.steady else f"the load held its target for 1.0 s of the level's {d:.1f} s")

    def records(self, level: int = 0, start_s: float = LEVEL_START_S) -> list[dict[str, Any]]:
        return [RequestRecord(level=level, index=i, scheduled_s=0.4 * i, start_s=0.4 * i,
                              start_wall_s=START_WALL + start_s + 0.4 * i, queue_ms=0.2, ttft_ms=self.ttft_ms,
                              itl_ms=[10.0] * (self.output_tokens - 1), e2e_ms=self.e2e_ms,
                              input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                              ok=True).model_dump() for i in range(self.requests)]

    def pieces(self, start_s: float = LEVEL_START_S) -> tuple[LevelSummary, list[SampleIn]]:
        """The level's summary and the engine samples the collector took during it."""
        deriver, samples = RateDeriver(), []
        taken = scrapes(self.engine)
        for t, scrape in taken:
            values, _reset = deriver.update(scrape, T0_MONO + start_s + t)
            samples.append(SampleIn("engine", T0_MONO + start_s + t, START_WALL + start_s + t, values))
        return self.summary(engine_deltas(taken[0][1], taken[-1][1])), samples


def store_run(store: RunStore, rec: Recorded, *more_levels: Recorded) -> int:
    """The run as ``app.recording.RunRecorder`` writes it: the row, each level (``rec`` first, then
    ``more_levels``, a settling pause apart) with its requests and samples, the end."""
    run_id = store.create_run(name=rec.name, config=rec.config.model_dump(mode="json"), engine_kind=rec.engine.kind,
                              engine_version="0.32.0", model=LLAMA_8B, hardware=rec.hardware, started_at=START_WALL,
                              t0_mono=T0_MONO)
    start_s = LEVEL_START_S
    for idx, level in enumerate((rec, *more_levels)):
        summary, samples = level.pieces(start_s)
        concurrency = level.config.load.concurrency
        store.start_level(run_id, idx, f"c={concurrency}", {"mode": "closed", "concurrency": concurrency},
                          START_WALL + start_s)
        store.write_batch(run_id, requests=level.records(idx, start_s), samples=samples)
        store.finish_level(run_id, idx, summary.model_dump(mode="json"), START_WALL + start_s + DURATION_S)
        start_s += DURATION_S + LEVEL_START_S
    store.finish_run(run_id, "completed", None, {}, START_WALL + start_s)
    return run_id


def in_memory(rec: Recorded, run_id: int = 1) -> RunEvidence:
    """The same run held in memory, as the runner published it (no store in between)."""
    summary, samples = rec.pieces()
    level = LevelInfo(idx=0, label="c=8", params={"mode": "closed", "concurrency": 8},
                      started_at=START_WALL + LEVEL_START_S, finished_at=START_WALL + LEVEL_START_S + DURATION_S,
                      summary=summary.model_dump(mode="json"))
    records = rec.records()
    arrays = RequestArrays.from_columns(
        level=[r["level"] for r in records], start_wall=[r["start_wall_s"] for r in records],
        ttft_ms=[r["ttft_ms"] for r in records], e2e_ms=[r["e2e_ms"] for r in records],
        input_tokens=[r["input_tokens"] for r in records], output_tokens=[r["output_tokens"] for r in records],
        ok=[r["ok"] for r in records], errors=[r["error"] for r in records], itl_ms=[r["itl_ms"] for r in records])
    names = sorted({k for s in samples for k in s.values})
    block = SeriesBlock("engine", names, np.array([s.t_mono for s in samples]), np.array([s.t_wall for s in samples]),
                        np.array([[s.values.get(n, np.nan) for n in names] for s in samples], dtype=float))
    detail = RunDetail(id=run_id, uid="mem", name=rec.name, status="completed", started_at=START_WALL,
                       finished_at=START_WALL + LEVEL_START_S + DURATION_S + 1.0, engine_kind=rec.engine.kind,
                       model=LLAMA_8B, config=rec.config.model_dump(mode="json"), hardware=rec.hardware,
                       metrics=stored_metrics(arrays, [level]), levels=[level], t0_mono=T0_MONO)
    limits, why = level_limits(detail)
    return RunEvidence(detail, {"engine": block}, limits, why)

@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "runs.db")

def explained(store: RunStore, rec: Recorded, reference: Recorded | None = None) -> list[Finding]:
    ref_id = store_run(store, reference) if reference is not None else None
    run_id = store_run(store, rec)
    ref = load_run(store, ref_id, level_limits) if ref_id is not None else None
    return explain(load_run(store, run_id, level_limits), ref)

def one(findings: list[Finding], rule: str) -> Finding:
    matching = [f for f in findings if f.rule == rule]
    assert len(matching) == 1, f"{rule} not found once in {[f.rule for f in findings]}"
    return matching[0]

def evidence(finding: Finding, figure: str) -> float:
    return next(e.value for e in finding.evidence if e.figure == figure)

def warnings(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings if f.severity == "warning"]

# --- a healthy run ---------------------------------------------------------------------------------

def test_a_healthy_run_raises_no_warning_and_says_so(store: RunStore) -> None:
    rec = Recorded(llama_config())
    findings = explained(store, rec)
    assert warnings(findings) == []
    assert findings[0].rule == "no_warning" and findings[0].explanation.startswith("no warning:")
    share = one(findings, "ceiling_share")  # the planner against the measurement, even when healthy
    assert evidence(share, "share of the ceiling") == pytest.approx(50.0, rel=1e-3)
    assert evidence(share, "batch") == 8.0 and "2.0-22.0 s into the run" in share.evidence[0].window
    one(findings, "decode_bound")

# --- each rule, provoked -------------------------------------------------------------------------

def test_a_full_kv_cache_with_a_queue_is_kv_bound(store: RunStore) -> None:
    rec = Recorded(llama_config(), Engine(kv_full_pct=97.0, waiting=12.0, preempt_per_s=0.5))
    findings = explained(store, rec)
    kv = one(findings, "kv_bound")
    assert kv.severity == "warning" and kv.suggestion == {"features.kv_cache_dtype": "fp8"}
    assert evidence(kv, "KV cache use, peak") == pytest.approx(97.0)
    assert evidence(kv, "requests waiting, peak") == 12.0
    assert evidence(kv, "preemptions") == pytest.approx(0.5 * DURATION_S)
    assert "KV memory" in one(findings, "ceiling_share").explanation  # which limit explains the rest
    # Already FP8: the next trial is more memory for the cache.
    rec8 = replace(rec, config=llama_config(kv_cache_dtype="fp8"))
    assert one(explained(store, rec8), "kv_bound").suggestion == {"features.gpu_memory_utilization": 0.95}

def test_a_kv_bound_run_on_a_cpu_without_avx512_is_not_sent_to_an_fp8_cache_it_cannot_start(store: RunStore) -> None:
    """vLLM's CPU build refuses an FP8 KV cache without AVX-512 or AMX: the next trial must be one
    this machine can run (the stored fingerprint's CPU flags say which)."""
    without = {"gpus": [], "cpu_model": "AMD EPYC", "cpu_flags": ["sse4_2", "avx", "avx2"]}
    rec = Recorded(llama_config(max_model_len=4096), Engine(kv_full_pct=97.0, waiting=12.0, preempt_per_s=0.5),
                   output_tok_per_s=50.0, hardware=without)
    kv = one(explained(store, rec), "kv_bound")
    assert kv.suggestion == {"features.max_model_len": 2048}
    assert "This machine cannot keep the KV cache in FP8" in kv.explanation
    with_avx512 = replace(rec, hardware={**without, "cpu_flags": [*without["cpu_flags"], "avx512f"]})
    kv = one(explained(store, with_avx512), "kv_bound")
    assert kv.suggestion == {"features.kv_cache_dtype": "fp8"} and "cannot keep" not in kv.explanation

def test_a_full_kv_cache_without_a_queue_is_not_a_finding(store: RunStore) -> None:
    findings = explained(store, Recorded(llama_config(), Engine(kv_full_pct=97.0, waiting=0.0)))
    assert "kv_bound" not in [f.rule for f in findings]

SHARED = WorkloadConfig(kind="shared_prefix", shared_prefix_tokens=512, input_len=LengthSpec(mean=128),
                        output_len=LengthSpec(mean=128))

def test_no_prefix_hits_on_a_shared_prefix_with_the_feature_off(store: RunStore) -> None:
    rec = Recorded(llama_config(prefix_caching=False, workload=SHARED), Engine(hit_ratio=0.0))
    prefix = one(explained(store, rec), "prefix_cold")
    assert prefix.severity == "warning" and prefix.confidence == "high"
    assert prefix.suggestion == {"features.prefix_caching": True}
    assert evidence(prefix, "prefix-cache hit rate") == 0.0
    assert evidence(prefix, "prompt tokens the workload shares") == pytest.approx(100 * 512 / 640)
    # The same workload with the cache hitting: no finding.
    hitting = Recorded(llama_config(prefix_caching=True, workload=SHARED), Engine(hit_ratio=0.75))
    assert "prefix_cold" not in [f.rule for f in explained(store, hitting)]

def test_no_prefix_hits_on_llamacpp_reads_its_cached_prompt_tokens(store: RunStore) -> None:
    """llama.cpp counts no prefix-cache queries: the share is its cached prompt tokens over those sent."""
    tiny = SHARED.model_copy(update={"shared_prefix_tokens": 8, "input_len": LengthSpec(mean=4)})
    sent_tok_per_s = 40 * 12 / DURATION_S  # the engine saw the prompts the client sent
    rec = Recorded(llama_config(kind="llamacpp", workload=tiny),
                   Engine(kind="llamacpp", hit_ratio=0.0, prompt_tok_per_s=sent_tok_per_s), input_tokens=12, hardware={})
    rec.output_tok_per_s = 50.0
    findings = explained(store, rec)
    prefix = one(findings, "prefix_cold")
    assert evidence(prefix, "prompt tokens served from the prefix cache") == 0.0
    assert "shorter than one cache block" in prefix.explanation
    assert prefix.suggestion == {"workload.cache": "warm"}  # the default cold cache: warm it
    hitting = replace(rec, engine=replace(rec.engine, hit_ratio=0.5), name="hitting")
    moved = one(explained(store, hitting, rec), "changed_prefix_hits")
    assert [e.value for e in moved.evidence] == [0.0, pytest.approx(50.0)]
    assert "prefill did 50% less work" in moved.explanation

def test_low_speculative_acceptance(store: RunStore) -> None:
    config = llama_config(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    rec = Recorded(config, Engine(drafts_per_s=100.0, draft_tok_per_s=400.0, accepted_tok_per_s=80.0))
    spec = one(explained(store, rec), "spec_low_acceptance")
    assert evidence(spec, "draft acceptance rate") == pytest.approx(20.0)
    assert evidence(spec, "tokens per verification step") == pytest.approx(1.8)
    # the engine's counters over the level, as read (vllm:spec_decode_num_draft_tokens, ..._accepted_tokens)
    assert evidence(spec, "tokens drafted") == pytest.approx(400.0 * DURATION_S)
    assert evidence(spec, "drafted tokens accepted") == pytest.approx(80.0 * DURATION_S)
    assert "output throughput should rise" in spec.explanation
    assert spec.suggestion == {"features.speculative.method": "off"}
    good = Recorded(config, Engine(drafts_per_s=100.0, draft_tok_per_s=400.0, accepted_tok_per_s=300.0))
    assert "spec_low_acceptance" not in [f.rule for f in explained(store, good)]

def _probed(store: RunStore, rec: Recorded, **quality: Any) -> list[Finding]:
    """``rec`` stored with the quality probe's figures (as the recorder updates the run with them)."""
    run_id = store_run(store, rec)
    figures = {"measured": True, "reference": {"kind": "run", "run_id": 1, "label": "fp16"},
               "agreement": {"token_share": 0.62}, "kld": {"mean": 0.031, "error": 0.002},
               "noise_floor": {"agreement": {"token_share": 1.0}, "kld": {"mean": 1e-9}}, **quality}
    store.update_run(run_id, quality=figures)
    return explain(load_run(store, run_id, level_limits))

def test_quality_lost_beyond_its_noise_floor_asks_for_one_step_up_in_precision(store: RunStore) -> None:
    fp8_kv = Recorded(llama_config(kv_cache_dtype="fp8"), name="fp8 kv")
    lost = one(_probed(store, fp8_kv, within_noise=False), "quality_lost")
    assert lost.severity == "warning" and lost.suggestion == {"features.kv_cache_dtype": "auto"}
    assert evidence(lost, "tokens identical to the reference") == pytest.approx(62.0)
    assert evidence(lost, "tokens identical on the reference's repeat (noise floor)") == pytest.approx(100.0)
    assert evidence(lost, "mean KL divergence from the reference") == pytest.approx(0.031)
    assert "differ from run 1's more than the reference differs from itself" in lost.explanation
    # the lowest precision first: 4-bit GGUF weights go to 8 bits before an 8-bit KV cache goes back
    q4 = Recorded(llama_config(kind="llamacpp", weights_dtype="q4_0", kv_cache_dtype="q8_0"), name="q4")
    assert one(_probed(store, q4, within_noise=False), "quality_lost").suggestion == {"features.weights_dtype": "q8_0"}
    # within the floor, the reference itself (no floor to judge by) or not measured: nothing said
    for quiet in ({"within_noise": True}, {"within_noise": None, "reference": {"kind": "self"}},
                  {"measured": False, "within_noise": False}):
        found = _probed(store, fp8_kv, **quiet)
        assert "quality_lost" not in [f.rule for f in found], quiet
    # a loss of quality is no limit on speed: the ceiling's share does not blame it
    found = _probed(store, fp8_kv, within_noise=False)
    shares = [f for f in found if f.rule == "ceiling_share"]
    assert shares and all("quality" not in f.explanation for f in shares)

def test_a_starved_client_or_an_undelivered_load_is_the_clients_limit(store: RunStore) -> None:
    starved = one(explained(store, Recorded(llama_config(), client_lag_ms=80.0)), "client_limited")
    assert evidence(starved, "client loop lag p99") == pytest.approx(80.0)
    assert "starved of CPU" in starved.explanation and starved.suggestion == {"load.workers": 2}
    behind = LoadDelivered(mode="closed", intended_concurrency=8, achieved_concurrency=3.0, fell_behind=True,
                           send_lag_ms=Stats.of([400.0] * 4))
    late = one(explained(store, Recorded(llama_config(), delivered=behind)), "client_limited")
    assert evidence(late, "concurrency held") == 3.0 and evidence(late, "send lag p99") == pytest.approx(400.0)
    assert "fell behind" in late.explanation

def test_ttft_dominated_by_queueing_is_past_the_knee(store: RunStore) -> None:
    rec = Recorded(llama_config(load=LoadConfig(concurrency=64)), Engine(ttft_s=1.0, queue_s=0.8, waiting=40.0))
    queue = one(explained(store, rec), "queueing_ttft")
    assert evidence(queue, "queueing share of TTFT") == pytest.approx(80.0)
    assert queue.suggestion == {"load.concurrency": 32} and "capacity" in queue.explanation

LONG = WorkloadConfig(input_len=LengthSpec(mean=4096), output_len=LengthSpec(mean=64))

def test_long_prompts_with_chunked_prefill_off_are_prefill_bound(store: RunStore) -> None:
    rec = Recorded(llama_config(chunked_prefill=False, workload=LONG), Engine(ttft_s=0.6, e2e_s=0.9),
                   input_tokens=4096, output_tokens=64)
    found = explained(store, rec)
    prefill = one(found, "prefill_bound")
    assert prefill.severity == "warning" and prefill.suggestion == {"features.chunked_prefill": True}
    assert evidence(prefill, "prompt tokens per request") == 4096.0
    assert evidence(prefill, "TTFT share of request time") == pytest.approx(100 * 0.6 / 0.9)
    assert "decode_bound" not in [f.rule for f in found]
    chunked = Recorded(llama_config(chunked_prefill=True, workload=LONG), Engine(ttft_s=0.6, e2e_s=0.9),
                       input_tokens=4096, output_tokens=64)
    assert one(explained(store, chunked), "prefill_bound").severity == "info"

def test_far_below_the_ceiling_at_a_small_batch_without_cuda_graphs(store: RunStore) -> None:
    config = llama_config(cuda_graphs=False, load=LoadConfig(concurrency=2))
    rec = Recorded(config, Engine(tokens_per_step=2.0), output_tok_per_s=0.1 * ceiling(config, 2.0))
    small = one(explained(store, rec), "small_batch_overhead")
    assert evidence(small, "share of the ceiling") == pytest.approx(10.0, rel=1e-3)
    assert evidence(small, "batch") == 2.0
    assert small.suggestion == {"features.cuda_graphs": True} and small.confidence == "high"
    assert small.severity == "warning"
    # CUDA graphs on: what the run is, worth knowing, no fault to fix.
    graphs = replace(rec, config=llama_config(load=LoadConfig(concurrency=2)))
    found = explained(store, graphs)
    assert one(found, "small_batch_overhead").severity == "info" and warnings(found) == []

def test_near_the_bandwidth_ceiling_only_fewer_bytes_help(store: RunStore) -> None:
    config = llama_config()
    found = explained(store, Recorded(config, output_tok_per_s=0.85 * ceiling(config, 8.0)))
    near = one(found, "near_ceiling")
    assert near.severity == "info" and near.suggestion == {"features.weights_dtype": "fp8"}
    assert evidence(near, "share of the ceiling") == pytest.approx(85.0, rel=1e-3)
    assert "memory bandwidth itself" in one(found, "ceiling_share").explanation
    assert warnings(found) == []
    # llama.cpp's 8-bit weights are GGUF Q8_0 (it refuses fp8): the suggestion is one it can run.
    gguf = llama_config(kind="llamacpp")
    on_llamacpp = explained(store, Recorded(gguf, output_tok_per_s=0.85 * ceiling(gguf, 8.0)))
    assert one(on_llamacpp, "near_ceiling").suggestion == {"features.weights_dtype": "q8_0"}

def test_a_level_that_never_held_its_load_asks_for_a_longer_run(store: RunStore) -> None:
    never = one(explained(store, Recorded(llama_config(), steady=False)), "never_steady")
    assert "held its target for 1.0 s" in never.explanation
    assert evidence(never, "level duration") == DURATION_S
    assert never.suggestion == {"workload.num_requests": 128}

def test_a_sweep_finds_the_level_where_it_shows(store: RunStore) -> None:
    """Two levels: only the second fills the KV cache; the finding reads that level's samples and
    names its window, and each level states its share of the ceiling."""
    light = Recorded(llama_config())
    heavy = Recorded(llama_config(load=LoadConfig(concurrency=32)),
                     Engine(kv_full_pct=98.0, waiting=20.0, running=32.0, tokens_per_step=32.0))
    found = explain(load_run(store, store_run(store, light, heavy), level_limits))
    kv = one(found, "kv_bound")
    assert {e.window for e in kv.evidence} == {"level c=32, 24.0-44.0 s into the run"}
    assert evidence(kv, "requests waiting, peak") == 20.0
    shares = [f for f in found if f.rule == "ceiling_share"]
    assert [evidence(f, "batch") for f in shares] == [8.0, 32.0]
    assert shares[0].evidence[0].window == "level c=8, 2.0-22.0 s into the run"


# --- against a reference ---------------------------------------------------------------------------

def test_against_a_reference_says_why_the_run_differs(store: RunStore) -> None:
    before = Recorded(llama_config(prefix_caching=False, workload=SHARED), Engine(hit_ratio=0.0), name="off")
    after = Recorded(llama_config(prefix_caching=True, workload=SHARED), Engine(hit_ratio=0.85), name="on")
    found = explained(store, after, before)
    hits = one(found, "changed_prefix_hits")
    assert "prefix hits 0.00 -> 0.85: prefill did 85% less work" in hits.explanation
    assert "features.prefix_caching False -> True" in hits.explanation
    assert [e.value for e in hits.evidence] == [0.0, pytest.approx(85.0)]
    assert "changed_throughput" not in [f.rule for f in found]  # the same rate in both

# --- one definition, every store -------------------------------------------------------------------

def test_the_store_gives_the_findings_of_the_run_in_memory(store: RunStore) -> None:
    rec = Recorded(llama_config(prefix_caching=False, workload=SHARED),
                   Engine(kv_full_pct=96.0, waiting=5.0, hit_ratio=0.0), client_lag_ms=60.0, steady=False)
    run_id = store_run(store, rec)
    from_store = explain(load_run(store, run_id, level_limits))
    from_memory = explain(in_memory(rec, run_id))
    assert {"kv_bound", "prefix_cold", "client_limited", "never_steady"} <= set(warnings(from_store))
    assert [f.model_dump() for f in from_store] == [f.model_dump() for f in from_memory]

def test_every_run_of_an_old_store_is_explained(tmp_path: Path) -> None:
    """Findings read what the store kept then: runs recorded before campaigns (and before some
    figures were kept) are explained without error, each finding as valid JSON."""
    db = tmp_path / "old.db"
    db.write_bytes((DATA / "store-before-campaigns.db").read_bytes())
    with RunStore(db) as old:
        runs = old.list_runs()
        assert runs
        for run in runs:
            assert stored_config(old.get_run(run.id)) is not None  # stored with a section since dropped
            found = explain(load_run(old, run.id, level_limits), load_run(old, runs[-1].id, level_limits))
            assert found and all(json.loads(f.model_dump_json())["rule"] == f.rule for f in found)
            assert sum(f.rule == "no_warning" for f in found) == (not warnings(found))


def test_each_rule_names_the_engines_whose_counters_support_it() -> None:
    engines = {kind: m.metric_names for kind, m in METRICS.items()}
    assert supported_engines(RULES["prefix_cold"], engines) == list(engines)  # every engine counts hits
    assert "llamacpp" not in supported_engines(RULES["queueing_ttft"], engines)  # no latency histograms
    assert "sglang" not in supported_engines(RULES["spec_low_acceptance"], engines)  # no draft counters
    assert supported_engines(RULES["client_limited"], engines) == list(engines)
    docs = (REPO / "docs" / "findings.md").read_text(encoding="utf-8")
    for name, registered in RULES.items():
        row = next((line for line in docs.splitlines() if line.startswith(f"| `{name}`")), None)
        assert row is not None, f"docs/findings.md does not list {name}"
        listed = row.split("|")[-2].strip()
        assert listed == (", ".join(supported_engines(registered, engines)) or "none"), name

# --- tunebench explain -------------------------------------------------------------------------------

def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err

def test_explain_cli_json_text_and_a_missing_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "cli.db"
    with RunStore(db) as store:
        healthy = store_run(store, Recorded(llama_config(), name="healthy"))
        full = store_run(store, Recorded(llama_config(), Engine(kv_full_pct=98.0, waiting=9.0), name="full"))
    code, out, _ = cli(capsys, "explain", str(full), "--db", str(db), "--json")
    assert code == 0
    data = json.loads(out)
    assert all(set(f) == {"rule", "severity", "evidence", "explanation", "confidence", "suggestion"} for f in data)
    kv = next(f for f in data if f["rule"] == "kv_bound")
    assert kv["severity"] == "warning" and kv["suggestion"] == {"features.kv_cache_dtype": "fp8"}
    assert {"figure": "requests waiting, peak", "value": 9.0, "unit": ""} .items() <= kv["evidence"][2].items()
    code, out, _ = cli(capsys, "explain", "full", "--db", str(db))
    assert code == 0 and "[warning] kv_bound" in out and 'next trial: features.kv_cache_dtype = "fp8"' in out
    code, out, _ = cli(capsys, "explain", str(healthy), "--against", str(full), "--db", str(db))
    assert code == 0
    assert sum(line.startswith("no warning: ") for line in out.splitlines()) == 1
    assert "[info] changed_kv_peak" in out
    code, out, err = cli(capsys, "explain", "9999", "--db", str(db))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "9999" in err
    code, out, _ = cli(capsys, "explain", "--rules", "--db", str(db))
    assert code == 0 and all(f"{name}:" in out for name in RULES)

def test_suggestions_that_would_not_run_are_left_out(store: RunStore) -> None:
    """A suggestion is a valid configuration of the run, or None (here TP 2 x 4096 GPUs is past the limit)."""
    config = llama_config(kv_cache_dtype="fp8", gpu_memory_utilization=0.95, tensor_parallel_size=4096)
    found = explained(store, Recorded(config, Engine(kv_full_pct=97.0, waiting=3.0), output_tok_per_s=100.0))
    assert one(found, "kv_bound").suggestion is None

def test_explain_planner_says_how_close_each_hardware_came_to_the_ceiling(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The planner's error on this hardware, from the stored runs: each level's measured share of
    the ceiling, and per hardware the median and range (a level above the ceiling counted apart)."""
    db = tmp_path / "planner.db"
    config = llama_config()
    half = Recorded(config, name="half")  # half the ceiling at the engine's batch
    quarter = Recorded(config, output_tok_per_s=0.25 * ceiling(config, Engine().tokens_per_step), name="quarter")
    above = Recorded(config, output_tok_per_s=10 * ceiling(config, Engine().tokens_per_step), name="above")
    with RunStore(db) as store:
        ids = [store_run(store, rec) for rec in (half, quarter, above)]
    code, out, _ = cli(capsys, "explain", "--planner", "--db", str(db))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "planner against measurement: 3 level(s) of 3 run(s)"
    assert lines[1].startswith("NVIDIA H100 80GB HBM3: 3 level(s), measured 37.5% of the ceiling (median; 25.0% to 50.0%)")
    assert "1 above the ceiling" in lines[1]
    # the prediction (the ceiling) against the measured rate: +100% at half, +300% at a quarter
    assert "prediction error +200% (median)" in lines[1]
    assert any(line.startswith(f"run {ids[1]} (quarter) level 0 on NVIDIA H100") and line.endswith("25% of limit")
               and "(prediction error +300%)" in line for line in lines), out
    assert not any(line.startswith(f"run {ids[2]} (above)") and "prediction error" in line for line in lines), out
    code, out, _ = cli(capsys, "explain", "--planner", "--db", str(db), "--json")
    data = json.loads(out)
    (hardware,) = data["hardware"]
    assert hardware["levels"] == 3 and hardware["above_ceiling"] == 1
    assert hardware["median_share"] == pytest.approx(0.375)
    assert [level["run"] for level in data["levels"]] == ids
    assert data["levels"][0]["fraction"] == pytest.approx(0.5)
    assert [level["error_pct"] for level in data["levels"]] == [pytest.approx(100.0), pytest.approx(300.0), None]
    assert hardware["median_error_pct"] == pytest.approx(200.0)

def test_live_findings_are_the_stored_runs_and_show_a_full_kv_cache_before_the_level_ends(store: RunStore) -> None:
    """``app.run_findings.LiveFindings`` fed the events a run publishes: while the level runs, the
    engine's samples already show the full KV cache; once it ended, the findings are those of the
    same run read from the store."""
    from app.events import LevelFinished, LevelStarted, RunStarted, Sample
    from app.run_findings import LiveFindings

    rec = Recorded(llama_config(), Engine(kv_full_pct=97.0, waiting=12.0, preempt_per_s=0.5), name="kv full")
    summary, samples = rec.pieces()
    live = LiveFindings()
    assert live.findings() == []  # nothing started
    live.begin(RunStarted(run_id="live", name=rec.name, config=rec.config, engine_kind="vllm", model=LLAMA_8B,
                          hardware=rec.hardware, started_wall_s=START_WALL))
    live.level_started(LevelStarted(run_id="live", index=0, label="c=8", mode="closed", concurrency=8,
                                    started_wall_s=START_WALL + LEVEL_START_S))
    assert live.changed and one(live.findings(), "no_warning")  # started: nothing measured yet
    live.ingest([Sample("host", s.t_mono, s.t_wall, {"cpu_pct": 50.0}) for s in samples[:3]])  # not the engine's
    assert not live.changed  # only the engine's samples count
    live.ingest(Sample(s.source, s.t_mono, s.t_wall, s.values) for s in samples)
    assert live.changed
    running = live.findings()
    kv = one(running, "kv_bound")  # before the level ended: from the engine's samples alone
    assert kv.severity == "warning" and evidence(kv, "KV cache use, peak") == pytest.approx(97.0)
    assert not live.changed
    live.level_finished(LevelFinished(run_id="live", index=0, label="c=8", summary=summary),
                        START_WALL + LEVEL_START_S + DURATION_S)
    ended = [f.model_dump() for f in live.findings()]
    stored = [f.model_dump() for f in explain(load_run(store, store_run(store, rec), level_limits))]
    assert ended == stored
    assert any(f["rule"] == "ceiling_share" for f in ended)  # the ceiling, as for the stored run


def test_a_healthy_run_so_far_says_so() -> None:
    from app.events import RunStarted
    from app.run_findings import LiveFindings

    live = LiveFindings()
    live.begin(RunStarted(run_id="live", name="healthy", config=llama_config(), engine_kind="vllm", model=LLAMA_8B,
                          started_wall_s=START_WALL))
    (healthy,) = live.findings()
    assert healthy.rule == "no_warning" and healthy.explanation.startswith("no warning: the run so far is healthy")
