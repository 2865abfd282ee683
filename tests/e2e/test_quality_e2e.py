"""The quality probe on real engines: the reference against itself agrees 100% with KL 0 (or
states its noise floor) on vLLM and llama.cpp, a quantized KV cache measures above that floor, the
figures are stored with the run and shown by ``runs show --json``, a probe that cannot measure
is one line while the speed run is still stored; on the trained demo model 4-bit weights cost more
than 8-bit ones (KLD, agreement, task accuracy within its error), and a tune over weight precision
with an agreement bound never picks below it and names what it excluded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.quality.config import QualityConfig
from app.quality.lm_eval_run import DEMO_TASK, TaskEvalRequest, lm_eval_tool, run_task_eval
from app.quality.probe import Output, QualityFigures, Reference, run_probe
from app.quality.stored import stored_reference
from app.quality.task_accuracy import TaskAccuracy, noise_bound
from app.recording import RunRecorder
from app.runner import Runner, RunResult
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from db import tune_store
from engine_adapters.config import DEMO_MODEL, EngineConfig, Features, RuntimeConfig
from engine_adapters.launcher import EngineProcess
from tests.fuzz.hostile import cli
from tests.small_profile import LLAMACPP_DEMO_ENGINE

pytestmark = pytest.mark.e2e

LLAMACPP = EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu"))
QUALITY = QualityConfig(prompts=3, output_tokens=8)
CONTROL_KLD_FLOOR = 1e-6
"""vLLM's control: the generated tokens' logprobs (decode) against the same tokens teacher-forced
(prefill) run other kernels, so float rounding leaves a KL of ~1e-9 mean, ~1e-7 at p99 on the demo
model (measured): the stated noise floor, far below any precision step's (8-bit KV ~3e-5)."""
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
    # the loss is a finding, with one step up in precision as the next trial; the control raises none
    found = json.loads(cli("explain", str(q4_id), "--db", str(db), "--json").check().out)
    (lost,) = [f for f in found if f["rule"] == "quality_lost"]
    assert lost["severity"] == "warning" and lost["suggestion"] == {"features.kv_cache_dtype": "q8_0"}, lost
    kld = [e["value"] for e in lost["evidence"] if e["figure"] == "mean KL divergence from the reference"]
    assert kld == [pytest.approx(q4.kld.mean)], lost["evidence"]
    control_found = json.loads(cli("explain", str(reference.run_id), "--db", str(db), "--json").check().out)
    assert "quality_lost" not in [f["rule"] for f in control_found]


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


ORDERING = QualityConfig(prompts=8, output_tokens=32)
"""Long enough outputs that 8-bit weights keep most tokens and 4-bit weights lose most."""
ORDERING_LIMIT = 16
"""Documents of the shipped task per lm-eval pass (its standard error says how much that settles)."""


def _accuracy(engine: EngineProcess) -> TaskAccuracy:
    found = run_task_eval(TaskEvalRequest(tasks=[DEMO_TASK], limit=ORDERING_LIMIT, num_concurrent=4),
                          base_url=engine.base_url, model=_model(engine), api_key=engine.api_key,
                          prompt_logprobs=False, engine="llama.cpp", tokenizer=None)
    assert not found.errors, found.errors
    return next(a for a in found.results if a.task == DEMO_TASK and a.metric == "exact_match")


def test_llamacpp_quality_orders_4_bit_below_8_bit_below_the_reference(engine_pool) -> None:  # type: ignore[no-untyped-def]
    """On the trained demo model, against the 16-bit reference (whose control is its noise floor):
    mean KLD orders 4-bit weights > 8-bit weights > the floor, agreement and task accuracy the
    other way (accuracy within its standard error); the 8-bit KV cache measures above the floor."""
    if not lm_eval_tool().is_installed():
        pytest.fail("the lm-eval tool is missing: run `make tools` (tunebench engine install lm-eval)")
    top = ORDERING.top_logprobs_for(DEMO_MODEL)

    def probe(features: Features, reference: Reference | None,
              accuracy: bool = True) -> tuple[QualityFigures, TaskAccuracy | None]:
        engine = engine_pool.get(features, LLAMACPP)
        figures = run_probe(ORDERING, "llamacpp", engine.base_url, engine.auth_headers(), _model(engine), reference,
                            top_logprobs=top, model_id=DEMO_MODEL)
        assert figures.measured and figures.agreement is not None and figures.kld is not None
        return figures, _accuracy(engine) if accuracy else None

    control, base_accuracy = probe(Features(), None)
    reference = Reference.of_figures(control.model_dump(mode="json"), "run", run_id=1, label="16-bit")
    assert reference.problem is None
    measured = {"16-bit": (control, base_accuracy)}
    for name, features in (("q8_0", Features(weights_dtype="q8_0")), ("q4_0", Features(weights_dtype="q4_0"))):
        measured[name] = probe(features, reference)
    kv8 = probe(Features(kv_cache_dtype="q8_0"), reference, accuracy=False)[0]
    for name, (figures, accuracy) in [*measured.items(), ("KV cache q8_0", (kv8, None))]:
        assert figures.agreement is not None and figures.kld is not None
        print(f"\n{name}: agreement {figures.agreement.token_share:.1%}, exact match {figures.agreement.exact_match:.0%}, "
              f"mean KLD {figures.kld.mean:.5f} ± {figures.kld.error or 0:.5f} ({figures.kld.positions} positions), "
              f"probe {figures.wall_s or 0:.1f} s" + (f"; {accuracy.text()}, {accuracy.wall_s or 0:.1f} s" if accuracy else ""))
    (ref, ref_acc), (q8, q8_acc), (q4, q4_acc) = measured.values()
    assert ref.agreement is not None and q8.agreement is not None and q4.agreement is not None and kv8.agreement
    assert ref.kld is not None and q8.kld is not None and q4.kld is not None and kv8.kld is not None
    floor = ref.noise_floor
    assert floor is not None and q8.noise_floor == floor == q4.noise_floor == kv8.noise_floor
    assert ref.agreement.token_share == 1.0 and ref.kld.mean == floor["kld"]["mean"] < CONTROL_KLD_FLOOR
    floor_kld = floor["kld"]["mean"] + 2 * (floor["kld"]["error"] or 0.0)
    assert q4.kld.mean > q8.kld.mean > floor_kld and kv8.kld.mean > floor_kld
    assert q8.within_noise is False and q4.within_noise is False and kv8.within_noise is False
    assert q4.agreement.token_share <= q8.agreement.token_share <= ref.agreement.token_share
    assert kv8.agreement.token_share <= ref.agreement.token_share
    for lower, higher in ((q4_acc, q8_acc), (q8_acc, ref_acc)):
        assert lower is not None and higher is not None and higher.stderr is not None and lower.stderr is not None
        assert lower.value <= higher.value + noise_bound(lower.stderr, higher.stderr), (lower.text(), higher.text())
    assert ref_acc is not None and ref_acc.value >= 0.9, ref_acc  # the trained demo model does its own task


TUNE_PROFILE = """
name = "quality tune e2e"
""" + LLAMACPP_DEMO_ENGINE + """
[workload]
kind = "random"
num_requests = 4

[workload.input_len]
mean = 32

[workload.output_len]
mean = 16

[load]
concurrency = 1

[quality]
prompts = 8
output_tokens = 32
"""
TUNE_SPACE = """
[knobs]
weights_dtype = ["auto", "q8_0", "q4_0"]

[load]
concurrency = [1]
"""
AGREEMENT_BOUND = 0.8
"""Between what 8-bit weights keep of the demo model's 32-token outputs (over 90%) and what 4-bit
weights keep (about half): the 4-bit step fails it."""
TUNE_SLO = f"ttft_ms<=60000,agreement>={AGREEMENT_BOUND}"


def test_a_tune_over_weight_precision_never_picks_below_its_agreement_bound(tmp_path: Path) -> None:
    """llama.cpp's 16-, 8- and 4-bit weights, one load level, a generous latency bound and an
    agreement bound the 4-bit weights miss: the pick keeps the bound, and the CLI and
    ``tunes show --json`` name what the quality term excluded (and whether it changed the pick)."""
    profile, space, db = tmp_path / "tune.toml", tmp_path / "space.toml", tmp_path / "runs.db"
    profile.write_text(TUNE_PROFILE)
    space.write_text(TUNE_SPACE)
    done = cli("tune", str(profile), "--slo", TUNE_SLO, "--space", str(space), "--db", str(db), "--no-telemetry")
    assert done.code == 0, done.out[-3000:] + done.err[-3000:]
    with RunStore(db) as store:
        (tune,) = tune_store.list_tunes(store)
    shown = json.loads(cli("tunes", "show", str(tune.id), "--db", str(db), "--json").check().out)
    by_dtype = {c["knobs"].get("weights_dtype", "auto"): c for c in shown["candidates"]}
    agreement = {d: c["quality"]["agreement"]["token_share"] for d, c in by_dtype.items()}
    speed = {d: max((t["tok_s_per_gpu"] or 0.0 for t in shown["trials"]
                     if t["candidate"] == c["index"] and t["status"] == "passed"), default=0.0)
             for d, c in by_dtype.items()}
    pick = shown["pick"]
    print(f"\nagreement {agreement}, tok/s {speed}; pick {pick['label']}; quality {shown['quality']}")
    assert agreement["q4_0"] < AGREEMENT_BOUND <= agreement["q8_0"] <= agreement["auto"] == 1.0
    assert pick is not None and agreement[pick["knobs"].get("weights_dtype", "auto")] >= AGREEMENT_BOUND
    q4 = by_dtype["q4_0"]
    assert q4["quality_excluded"] == f"agreement {agreement['q4_0']:.4g}, bound >= {AGREEMENT_BOUND:g}"
    assert shown["quality"]["excluded"] == [q4["label"]]
    assert f"excluded: {q4['label']}" in done.out
    fastest = max(speed, key=speed.__getitem__)
    changed = shown["quality"].get("pick_without_quality")
    assert (changed == q4["label"]) == (fastest == "q4_0")  # the pick speed alone would have made, said where it differs
    print(f"fastest: {fastest}; the quality term {'changed' if changed else 'did not change'} the pick")
