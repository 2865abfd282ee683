"""The quality probe on real engines: the reference against itself agrees 100% with KL 0 (or
states its noise floor) on vLLM and llama.cpp, a quantized KV cache measures above that floor, the
figures are stored with the run and shown by ``runs show --json``, and a probe that cannot measure
is one line while the speed run is still stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.quality.config import QualityConfig
from app.quality.probe import Output, Reference, run_probe
from app.quality.stored import stored_reference
from app.recording import RunRecorder
from app.runner import Runner, RunResult
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.launcher import EngineProcess
from tests.fuzz.hostile import cli

pytestmark = pytest.mark.e2e

LLAMACPP = EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu"))
QUALITY = QualityConfig(prompts=3, output_tokens=8)
CONTROL_KLD_FLOOR = 1e-9
"""What the control may show on an engine that is deterministic at batch 1: logprobs are rounded
to 6 decimals as they arrive, and vLLM scores a prefill where it generated a decode step."""


def _model(engine: EngineProcess) -> str:
    import urllib.request

    request = urllib.request.Request(engine.base_url + "/v1/models", headers=engine.auth_headers())
    with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310 - loopback
        listing = json.loads(resp.read())
    return str((listing.get("data") or listing.get("models"))[0].get("id") or (listing.get("models"))[0]["model"])


def test_vllm_reference_against_itself_agrees_with_kl_zero(demo_engine: EngineProcess) -> None:
    """Teacher-forced with prompt_logprobs, the demo's whole vocabulary asked: the shared engine
    runs at vLLM's default cap of 20, so the probe says so (its top-k) and counts the mass beyond."""
    figures = run_probe(QUALITY, "vllm", demo_engine.base_url, demo_engine.auth_headers(), _model(demo_engine),
                        None, top_logprobs=-1)
    assert figures.measured and figures.reference == {"kind": "self"} and "teacher-forced" in figures.scoring
    assert figures.agreement is not None and figures.kld is not None
    assert figures.agreement.token_share == 1.0 and figures.agreement.exact_match == 1.0
    assert figures.kld.positions == sum(len(o["tokens"]) for o in figures.capture) > 0  # every position scored
    assert 0.0 <= figures.kld.mean <= CONTROL_KLD_FLOOR and figures.kld.same_top == 1.0
    assert figures.noise_floor is not None and figures.noise_floor["kld"]["mean"] == figures.kld.mean
    assert figures.top_logprobs == 20 and figures.kld.positions_with_tail == figures.kld.positions  # the cap, stated
    assert figures.wall_s is not None and figures.wall_s > 0


def _run(engine: EngineProcess, bus: Bus, reference: Reference | None = None) -> RunResult:
    config = RunConfig(name="quality e2e", engine=engine.engine, features=engine.features,
                       workload=WorkloadConfig(kind="random", num_requests=3, input_len=LengthSpec(mean=16),
                                               output_len=LengthSpec(mean=8)),
                       load=LoadConfig(concurrency=1, warmup_requests=0), quality=QUALITY)
    result = Runner(config, bus, engine=engine, telemetry=False, quality_reference=reference).run()
    assert result.status == "completed", result.reason
    return result


def test_llamacpp_control_a_q4_kv_cache_against_it_and_the_stored_figures(engine_pool, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The reference (16-bit KV cache) against itself: 100% and KL 0. The same prompts on a 4-bit KV
    cache, with the stored reference: KL above that floor. Both runs and their figures in the
    store; ``runs show --json`` carries them under ``quality``, without the outputs kept."""
    db = tmp_path / "runs.db"
    bus = Bus()
    with RunStore(db) as store:
        recorder = RunRecorder(bus, store)
        try:
            reference_run = _run(engine_pool.get(Features(), LLAMACPP), bus)
            recorder.flush()
            control = reference_run.quality
            assert control is not None and control.measured, control
            assert control.agreement is not None and control.kld is not None
            assert control.agreement.token_share == 1.0 and control.kld.mean == 0.0 and control.kld.same_top == 1.0
            assert control.top_logprobs == 512 and control.kld.exact  # the demo's whole vocabulary
            reference = stored_reference(store, str(recorder.run_id))
            assert reference.problem is None and len(reference.outputs) == QUALITY.prompts
            q4 = _run(engine_pool.get(Features(kv_cache_dtype="q4_0"), LLAMACPP), bus, reference).quality
            recorder.flush()
            q4_id = recorder.run_id
        finally:
            recorder.close()
    assert q4 is not None and q4.measured and q4.kld is not None and q4.agreement is not None
    assert q4.reference["kind"] == "run" and q4.reference["run_id"] == reference.run_id
    assert q4.kld.mean > control.kld.mean and q4.within_noise is False
    assert "first divergence" in q4.scoring
    shown = json.loads(cli("runs", "show", str(q4_id), "--db", str(db), "--json").check().out)["quality"]
    assert shown["kld"]["mean"] == q4.kld.mean and shown["agreement"] == q4.agreement.model_dump(mode="json")
    assert shown["noise_floor"] == control.noise_floor and shown["reference"]["run_id"] == reference.run_id
    assert "capture" not in shown and shown["captured_outputs"] == QUALITY.prompts
    text = cli("runs", "show", str(q4_id), "--db", str(db)).check().out
    assert f"quality:   {q4.agreement.token_share:.1%} KLD" in text and f"against {reference.label}" in text
    assert "probe " in text and "at batch 1" in text
    compared = json.loads(cli("compare", str(reference.run_id), str(q4_id), "--db", str(db), "--json").check().out)
    assert [r["quality"]["reference"]["kind"] for r in compared["runs"]] == ["self", "run"]
    assert compared["runs"][1]["quality"]["kld"]["mean"] == q4.kld.mean


def test_a_reference_of_another_model_is_one_line_and_the_speed_run_is_stored(engine_pool, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = Reference(kind="run", run_id=41, model="some-other-model", outputs=[Output("p", [], [1], [None])])
    bus = Bus()
    with RunStore(tmp_path / "runs.db") as store:
        recorder = RunRecorder(bus, store)
        try:
            result = _run(engine_pool.get(Features(), LLAMACPP), bus, other)
            missing = stored_reference(store, "no-such-run")
        finally:
            recorder.close()
        stored = store.get_run(recorder.run_id or 0)
    assert result.quality is not None and not result.quality.measured
    assert result.quality.error is not None and "ran model some-other-model" in result.quality.error
    assert "\n" not in result.quality.error
    assert stored.status == "completed" and stored.n_requests == 3  # the speed run stands
    assert stored.quality is not None and stored.quality["error"] == result.quality.error
    assert missing.problem is not None and missing.problem.startswith("reference run 'no-such-run': ")
