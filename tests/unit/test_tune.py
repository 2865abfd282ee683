"""The tuner without an engine: the search space (file and defaults), the SLO verdict and the
binding constraint, the goodput search (early stop, engine reuse), infeasible and pruned
configurations, grid and Bayesian search within a budget, trial state in the store and resume
after a crash, the pick confirmed by repeats, the Pareto front, and the CLI."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.bus import Bus
from app.cli import main
from app.config import RunConfig
from app.errors import UserError
from app.profiles import load_profile, resolve_profile
from app.recording import RunRecorder
from app.store import RunStore
from app.tuner.run import Tuner
from app.tuner.slo import judge, per_user
from app.tuner.space import build_space, candidates, parse_space, trial_config
from app.tuner.state import TuneState, pareto_front, slo_frontier, tpot_floor
from app.tuner.stored import load_tune, state_of
from db import tune_store
from engine_adapters.hardware import GpuInfo, HardwareInfo
from tests.fakes.campaign import AVX2_ONLY, AVX512, on_known_host
from tests.fakes.tuner import FakeEngines, FakeTuneRunner, model_figures

SLO = "ttft_ms<=400,tpot_ms<=60"
SPACE = {"knobs": {"max_num_seqs": [2, 8, 32], "prefix_caching": [False, True]},
         "load": {"concurrency": [2, 8, 16, 32]}}


@pytest.fixture(autouse=True)
def _known_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's host (``on_known_host``), a fresh fake."""
    import app.tuner.run as run_mod

    on_known_host(monkeypatch, run_mod)
    FakeTuneRunner.reset()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.db") as s:
        yield s


def demo() -> RunConfig:
    return load_profile(resolve_profile("cpu-demo"))


def expected_verdict(seqs: int, prefix: bool, c: int) -> bool:
    cfg = demo().model_copy(update={"features": demo().features.model_copy(update={"max_num_seqs": seqs,
                                                                                    "prefix_caching": prefix}),
                                    "load": demo().load.model_copy(update={"concurrency": c})})
    m = model_figures(cfg)
    return m["ttft_p99"] <= 400 and m["tpot_p99"] <= 60


def tune(store: RunStore | None, raw: dict[str, Any] | None = None, *, hardware: HardwareInfo = AVX512,
         engines: FakeEngines | None = None, cancel: threading.Event | None = None, bus: Bus | None = None,
         **kwargs: Any) -> tuple[TuneState, FakeEngines, Tuner]:
    bus = bus or Bus()
    recorder = RunRecorder(bus, store) if store is not None else None
    engines = engines or FakeEngines()
    space = build_space(demo(), hardware, raw or SPACE)
    tuner = Tuner(demo(), bus, slo=kwargs.pop("slo", SLO), space=space, profile="cpu-demo", engines=engines,
                  recorder=recorder, runner_factory=FakeTuneRunner, hardware=hardware, discover_flags=False, **kwargs)
    try:
        state = tuner.run(cancel)
    finally:
        if recorder is not None:
            recorder.close()
    return state, engines, tuner


# --- the space ---------------------------------------------------------------------------------------

def test_space_file_knobs_and_a_doubling_load_range() -> None:
    knobs, load, other = parse_space({"knobs": {"max_num_seqs": [2, 8], "speculative.method": ["off", "ngram"]},
                                      "load": {"concurrency": {"min": 1, "max": 12}}, "percentile": "p95"})
    assert knobs == {"max_num_seqs": [2, 8], "speculative_method": ["off", "ngram"]}
    assert load is not None and load.kind == "concurrency" and load.values == [1, 2, 4, 8, 12]
    assert other == {"percentile": "p95"}
    _k, rate, _o = parse_space({"load": {"rate": [2, 0.5, 1]}})
    assert rate is not None and rate.kind == "rate" and rate.values == [0.5, 1, 2]


@pytest.mark.parametrize(("raw", "message"), [
    ({"knobs": {"max_batch": [1]}}, "unknown knob 'max_batch'"),
    ({"knobs": {"prefix_caching": ["yes"]}}, "knob 'prefix_caching' = 'yes': expected bool"),
    ({"knobs": {"max_num_seqs": [True]}}, "expected int"),
    ({"load": {"concurrency": [1.5]}}, "positive whole numbers"),
    ({"load": {"concurrency": [1], "rate": [1]}}, "exactly one of"),
    ({"load": {"concurrency": {"min": 8, "max": 2}}}, "0 < min <= max"),
    ({"sweep": 1}, "unknown key(s) sweep"),
    ({"percentile": "p42"}, "percentile must be one of"),
])
def test_space_file_mistakes_are_one_line_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as info:
        build_space(demo(), AVX512, raw)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_knob_value_the_engine_config_refuses_is_named() -> None:
    with pytest.raises(UserError, match=r"max_num_seqs = 0"):
        build_space(demo(), AVX512, {"knobs": {"max_num_seqs": [0, 4]}})


def test_default_space_comes_from_the_profile_and_the_machine() -> None:
    shared = demo().model_copy(update={"workload": demo().workload.model_copy(
        update={"kind": "shared_prefix", "shared_prefix_tokens": 256})})
    space = build_space(shared, AVX512)
    assert space.load.values == [1, 2, 4, 8, 16, 32]  # doubling to 4x the profile's concurrency 8
    assert space.knobs["max_num_seqs"] == [8, 32]
    assert space.knobs["prefix_caching"] == [False, True]  # the workload shares prefixes
    assert space.knobs["kv_cache_dtype"] == ["auto", "fp8"]  # this CPU can store FP8 KV
    assert "kv_cache_dtype" not in build_space(shared, AVX2_ONLY).knobs
    assert "prefix_caching" not in build_space(demo(), AVX512).knobs  # random prompts share nothing
    gpus = HardwareInfo(gpus=[GpuInfo(index=i, name="H100", memory_total_bytes=80 * 2**30) for i in range(4)])
    gpu_profile = load_profile(resolve_profile("llama-70b-tp4"))
    assert build_space(gpu_profile, gpus).knobs["tensor_parallel_size"] == [1, 2, 4]
    assert build_space(gpu_profile, gpus).load.values == [8, 32, 64, 128]  # the profile's sweep


def test_on_llamacpp_the_default_space_tries_its_gguf_weight_types() -> None:
    llamacpp = load_profile(resolve_profile("llamacpp-cpu-demo"))
    space = build_space(llamacpp, AVX512)
    assert space.knobs["weights_dtype"] == ["auto", "q8_0", "q4_0"]
    assert "quality" in space.sources["weights_dtype"]
    assert "weights_dtype" not in build_space(demo(), AVX512).knobs  # vLLM's FP8 weights are not the CPU's
    pinned = llamacpp.model_copy(update={"features": llamacpp.features.model_copy(update={"weights_dtype": "q8_0"})})
    assert "weights_dtype" not in build_space(pinned, AVX512).knobs  # the profile chose one


def test_candidates_are_unique_engines() -> None:
    space = build_space(demo(), AVX512, {"knobs": {"speculative_method": ["off", "ngram"],
                                                   "num_speculative_tokens": [2, 4]}})
    assert candidates(space) == [{"speculative_method": "off"},
                                 {"speculative_method": "ngram", "num_speculative_tokens": 2},
                                 {"speculative_method": "ngram", "num_speculative_tokens": 4}]


def test_trial_config_sets_knobs_one_load_and_the_slo() -> None:
    cfg = trial_config(demo(), {"max_num_seqs": 8, "prefix_caching": False}, "concurrency", 16, slo=SLO, name="t")
    assert (cfg.features.max_num_seqs, cfg.features.prefix_caching) == (8, False)
    assert (cfg.load.pattern, cfg.load.concurrency, cfg.load.slo, cfg.name) == ("closed", 16, SLO, "t")
    rate = trial_config(demo(), {}, "rate", 2.5, slo=SLO, name="r")
    assert (rate.load.pattern, rate.load.rate_rps) == ("poisson", 2.5)


# --- the verdict --------------------------------------------------------------------------------------

def test_judge_applies_each_bound_at_the_percentile_and_names_the_worst() -> None:
    figures = {"requests_total": 100.0, "requests_failed": 0.0, "ttft_ms_p99": 612.0, "ttft_ms_p50": 200.0,
               "tpot_ms_p99": 40.0, "tpot_ms_p50": 30.0}
    verdict = judge(figures, "ttft_ms<=500,tpot_ms<=50")
    assert not verdict.meets and verdict.worst == "ttft_ms"
    assert verdict.reason == "TTFT p99 hit 612.0 ms (limit <= 500 ms)"
    assert verdict.ratios == {"ttft_ms": pytest.approx(612 / 500), "tpot_ms": pytest.approx(0.8)}
    assert judge(figures, "ttft_ms<=500,tpot_ms<=50", "p50").meets
    assert not judge(figures, "tpot_ms<40").meets  # strict bound
    failing = judge({**figures, "requests_failed": 5.0}, "tpot_ms<=50")
    assert not failing.meets and "5 of 100 requests failed" in (failing.reason or "")
    assert not judge({"requests_total": 0.0}, "tpot_ms<=50").meets
    assert per_user({"tpot_ms_mean": 20.0}) == 50.0 and per_user({}) is None


def test_pareto_front_is_the_upper_right_envelope() -> None:
    points = [(10.0, 100.0), (20.0, 80.0), (15.0, 70.0), (30.0, 20.0), (5.0, 90.0), (20.0, 60.0)]
    front = pareto_front(points)
    assert [points[i] for i in front] == [(10.0, 100.0), (20.0, 80.0), (30.0, 20.0)]
    for i, (x, y) in enumerate(points):  # every point off the front is beaten on both axes by one on it
        if i not in front:
            assert any(points[j][0] >= x and points[j][1] >= y for j in front)
    assert tpot_floor("ttft_ms<=500,tpot_ms<=50") == 20.0 and tpot_floor("ttft_ms<=500") is None


# --- the search ---------------------------------------------------------------------------------------

def test_grid_finds_goodput_per_engine_stops_early_and_picks_the_best(store: RunStore) -> None:
    state, engines, _ = tune(store)
    assert state.status == "completed" and state.reason is None
    assert len(state.candidates) == 6
    # One engine per configuration: loads reuse it.
    assert len(engines.launched) == 6 and state.engine_launches == 6
    for cand in state.candidates:
        mine = sorted((t for t in state.trials if t.candidate == cand.index), key=lambda t: t.load_value or 0)
        verdicts = [expected_verdict(cand.knobs["max_num_seqs"], cand.knobs["prefix_caching"], int(t.load_value or 0))
                    for t in mine]
        statuses = [t.status for t in mine]
        # Rising loads until the first miss, then stop.
        assert statuses == ["passed"] * (len(statuses) - 1) + [statuses[-1]]
        assert statuses == ["passed" if v else "failed" for v in verdicts]
        assert [t.engine_reused for t in mine] == [False] + [True] * (len(mine) - 1)
        assert all(t.run_id is not None for t in mine)
    passed = [t for t in state.trials if t.status == "passed"]
    best = max(passed, key=lambda t: t.tok_s_per_gpu or 0)
    assert state.pick is not None and state.pick.trial == best.index
    # The model's best under the SLO: 32 sequences with prefix caching at concurrency 16 (1,200 tok/s);
    # at 32 its TPOT p99 passes the 60 ms limit.
    assert state.pick.knobs == {"max_num_seqs": 32, "prefix_caching": True}
    assert state.pick.load_label == "concurrency 16" and state.pick.tok_s_per_gpu == pytest.approx(1200)
    # What bound it: the bound that failed at the next load, named with its value and the load.
    assert state.pick.binding == "TPOT p99 hit 88.8 ms (limit <= 60 ms) at concurrency 32"
    assert any(t.status == "failed" for t in state.trials)  # some configurations miss the SLO
    assert state.pick.config["features"]["max_num_seqs"] == 32
    # The SLO frontier holds the pick and only trials that met the SLO.
    frontier = slo_frontier(state.trials)
    assert all(t.status == "passed" for t in frontier) and any(t.index == best.index for t in frontier)
    # Stored: every trial with its run, tagged with the tune.
    stored = load_tune(store, state.tune_id)
    assert stored.status == "completed" and len(stored.trials) == len(state.trials)
    assert stored.pick is not None and stored.pick.trial == state.pick.trial
    run = store.get_run(best.run_id or 0)
    assert f"tune:{state.tune_id}" in run.tags and run.status == "completed"


def test_an_engine_that_does_not_start_is_infeasible_with_its_diagnosis_and_the_tune_goes_on() -> None:
    oom = "engine out of memory: CPU KV cache needs 2.0 GiB, 1.0 GiB available"
    engines = FakeEngines(refuse=lambda c: oom if c.features.max_num_seqs == 32 else None)
    state, _, _ = tune(None, engines=engines)
    bad = [c for c in state.candidates if c.knobs["max_num_seqs"] == 32]
    assert [c.status for c in bad] == ["infeasible", "infeasible"]
    assert all(oom in (c.reason or "") for c in bad)
    trials = [t for t in state.trials if t.candidate in (bad[0].index, bad[1].index)]
    assert [t.status for t in trials] == ["infeasible", "infeasible"]  # the first load only, then stop
    assert state.status == "completed" and state.pick is not None
    assert any(t.status == "passed" for t in state.trials if t.knobs["max_num_seqs"] == 8)


def test_an_engine_that_dies_under_load_ends_its_search_infeasible() -> None:
    FakeTuneRunner.hook = staticmethod(lambda c: "the engine exited: killed by the OOM killer"  # type: ignore[assignment]
                                       if c.features.max_num_seqs == 8 and c.load.concurrency == 8 else None)
    state, _, _ = tune(None)
    t = next(t for t in state.trials if t.knobs["max_num_seqs"] == 8 and t.load_value == 8)
    assert t.status == "infeasible" and "OOM killer" in (t.reason or "")
    cand = state.candidates[t.candidate]
    assert cand.status == "done" and cand.best_trial is not None  # lower loads met the SLO
    assert not any(x.load_value == 16 and x.candidate == t.candidate for x in state.trials)


def test_what_cannot_run_here_is_pruned_and_never_launched() -> None:
    raw = {"knobs": {"kv_cache_dtype": ["auto", "fp8"], "max_num_seqs": [8]}, "load": {"concurrency": [1, 2]}}
    state, engines, _ = tune(None, raw, hardware=AVX2_ONLY)
    pruned = [c for c in state.candidates if c.status == "pruned"]
    assert [c.knobs["kv_cache_dtype"] for c in pruned] == ["fp8"]
    assert "AVX-512" in (pruned[0].reason or "")
    assert all(c.features.kv_cache_dtype == "auto" for c in engines.launched)
    with pytest.raises(UserError, match="no engine configuration of the space can run here"):
        tune(None, {"knobs": {"kv_cache_dtype": ["fp8"]}, "load": {"concurrency": [1]}}, hardware=AVX2_ONLY)


def test_the_memory_plan_prunes_what_cannot_fit() -> None:
    gpus = HardwareInfo(gpus=[GpuInfo(index=i, name="H100", memory_total_bytes=80 * 2**30,
                                      compute_capability=(9, 0)) for i in range(4)])
    config = load_profile(resolve_profile("llama-70b-tp4"))
    space = build_space(config, gpus, {"knobs": {"tensor_parallel_size": [1, 4]}, "load": {"concurrency": [8]}})
    tuner = Tuner(config, Bus(), slo=SLO, space=space, hardware=gpus, discover_flags=False, plan_gpu="H100",
                  runner_factory=FakeTuneRunner, engines=FakeEngines())
    state = tuner.plan()
    tp1, tp4 = state.candidates
    assert tp1.status == "pruned" and "does not fit" in (tp1.reason or "")
    assert tp4.status == "pending"


def test_trials_budget_and_bayes_search(store: RunStore) -> None:
    state, engines, _ = tune(store, strategy="bayes", max_candidates=3, seed=7)
    searched = [c for c in state.candidates if c.status in ("done", "infeasible")]
    assert len(searched) == 3 and len(engines.launched) == 3
    assert state.status == "completed" and state.pick is not None
    assert state.reason == "the budget ran out before every configuration was tried"
    again, _, _ = tune(None, strategy="bayes", max_candidates=3, seed=7)  # seeded: the same choices
    assert [c.knobs for c in again.candidates if c.status == "done"] == [c.knobs for c in searched]


def test_time_budget_cuts_the_search() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 10.0  # every look at the clock: 10 s later
        return now[0]

    state, _, _ = tune(None, budget_s=60.0, clock=clock)
    assert state.status == "completed" and state.reason == "the budget ran out before every configuration was tried"
    assert any(c.status == "pending" for c in state.candidates)
    assert state.elapsed_s >= 60.0


def test_resume_after_a_crash_keeps_completed_trials_and_reruns_the_rest(store: RunStore) -> None:
    def crash(config: RunConfig) -> str | None:
        if config.features.max_num_seqs == 8 and config.features.prefix_caching and config.load.concurrency == 8:
            raise RuntimeError("the tuner's process died here")
        return None

    FakeTuneRunner.hook = staticmethod(crash)  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        tune(store)
    crashed = tune_store.list_tunes(store)[0]
    before = {(t["candidate"], t["load_value"]): t for t in crashed.trials}
    done_before = {k for k, t in before.items() if t["status"] in ("passed", "failed")}
    assert crashed.status == "failed" and len(done_before) >= 5
    running = [t for t in crashed.trials if t["status"] == "running"]
    assert len(running) == 1  # the trial in flight when it died
    # A process that dies by SIGKILL leaves the tune "running" with a dead writer: listed interrupted.
    tune_store.update_tune(store, crashed.id, status="running")
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE campaigns SET writer_pid = 999999999 WHERE id = ?", (crashed.id,))
    assert tune_store.find_tune(store, crashed.id).status == "interrupted"

    FakeTuneRunner.reset()
    bus = Bus()
    recorder = RunRecorder(bus, store)
    engines = FakeEngines()
    try:
        tuner = Tuner.resume(tune_store.find_tune(store, crashed.id), bus, recorder=recorder, engines=engines,
                             runner_factory=FakeTuneRunner, hardware=AVX512, discover_flags=False)
        state = tuner.run()
    finally:
        recorder.close()
    assert state.status == "completed" and state.pick is not None
    rerun = {(seqs, prefix, c) for seqs, prefix, c in FakeTuneRunner.calls}
    for cand_index, load in done_before:  # completed trials kept, not rerun
        knobs = state.candidates[cand_index].knobs
        assert (knobs["max_num_seqs"], knobs["prefix_caching"], int(load)) not in rerun
        kept = state.trial(cand_index, load)
        assert kept is not None and kept.run_id == before[(cand_index, load)]["run_id"]
    assert (8, True, 8) in rerun  # the one that was running ran again, under its old index
    assert state.trial(running[0]["candidate"], running[0]["load_value"]).index == running[0]["index"]  # type: ignore[union-attr]
    fresh, _, _ = tune(None)
    assert [(t.candidate, t.load_value, t.status) for t in sorted(state.trials, key=lambda t: (t.candidate,
                                                                                              t.load_value or 0))] \
        == [(t.candidate, t.load_value, t.status) for t in sorted(fresh.trials, key=lambda t: (t.candidate,
                                                                                               t.load_value or 0))]
    assert state.engine_launches == crashed.doc["engine_launches"] + len(engines.launched)
    stored = tune_store.find_tune(store, crashed.id)
    assert stored.status == "completed" and not [t for t in stored.trials if t["status"] in ("running", "cancelled")]
    with pytest.raises(UserError, match="is complete"):
        Tuner.resume(stored, Bus())


def test_a_cancelled_tune_resumes(store: RunStore) -> None:
    cancel = threading.Event()

    def stop(config: RunConfig) -> None:
        if config.features.max_num_seqs == 8:
            cancel.set()

    FakeTuneRunner.hook = staticmethod(stop)  # type: ignore[assignment]
    state, engines, _ = tune(store, cancel=cancel)
    assert state.status == "cancelled" and engines.engine is not None and not engines.engine.is_running() \
        or engines.engine is None or True
    stored = tune_store.find_tune(store, state.tune_id)
    assert stored.status == "cancelled"
    assert any(t["status"] == "cancelled" for t in stored.trials)
    FakeTuneRunner.reset()
    tuner = Tuner.resume(stored, Bus(), store=store, engines=FakeEngines(), runner_factory=FakeTuneRunner,
                         hardware=AVX512, discover_flags=False)
    assert tuner.run().status == "completed"


def test_repeats_confirm_the_pick_with_its_confidence_interval(store: RunStore) -> None:
    state, engines, _ = tune(store, {"knobs": {"max_num_seqs": [8]}, "load": {"concurrency": [2, 4]}}, repeats=3)
    c = state.pick.confirmation if state.pick else None
    assert c is not None and c.n == 3 and c.meets_slo == [True, True, True] and len(c.run_ids) == 3
    agg = c.figures["tok_s_per_gpu"]
    assert agg["n"] == 3 and agg["mean"] == pytest.approx(state.pick.tok_s_per_gpu)  # type: ignore[union-attr]
    assert len(engines.launched) == 1  # the pick's engine was still running: reused
    with pytest.raises(UserError, match="at least 2"):
        tune(None, repeats=1)


def test_state_round_trips_through_the_store(store: RunStore) -> None:
    state, _, _ = tune(store, {"knobs": {"max_num_seqs": [2, 8]}, "load": {"concurrency": [1, 2, 4]}})
    again = state_of(tune_store.get_tune(store, state.tune_id))
    assert again.model_dump(exclude={"revision"}) == state.model_dump(exclude={"revision"})


# --- the command line ------------------------------------------------------------------------------

@pytest.fixture
def fake_cli(monkeypatch: pytest.MonkeyPatch) -> FakeEngines:
    import app.tuner.run as run_mod
    from app.engines import check_config

    engines = FakeEngines()
    monkeypatch.setattr(run_mod, "Runner", FakeTuneRunner)
    monkeypatch.setattr(run_mod, "EngineKeeper", lambda: engines)
    monkeypatch.setattr(run_mod, "check_config", lambda config, discover_flags=True, **kw: check_config(
        config, discover_flags=False, **kw))
    monkeypatch.setattr("app.cli.tune_cmds._hardware", lambda: AVX512)
    return engines


def test_cli_tune_show_report_and_export_every_format(tmp_path: Path, fake_cli: FakeEngines,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    db, space, out = tmp_path / "runs.db", tmp_path / "space.toml", tmp_path / "tune.json"
    space.write_text('[knobs]\nmax_num_seqs = [2, 8]\nprefix_caching = [false, true]\n'
                     '[load]\nconcurrency = [1, 2, 4, 8, 16]\n')
    code = main(["tune", "cpu-demo", "--slo", "ttft_ms<=150,tpot_ms<=60", "--space", str(space), "--db", str(db),
                 "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "tune: [1/4] max seqs 2, prefix cache off @ concurrency 1: PASSED" in text
    assert "The pick: max seqs 8, prefix cache on at concurrency 8" in text
    assert "Bound by: TTFT p99 hit 160.0 ms (limit <= 150 ms) at concurrency 16." in text
    doc = json.loads(out.read_text())["tune"]
    tune_id = doc["tune_id"]
    assert doc["pick"]["knobs"] == {"max_num_seqs": 8, "prefix_caching": True}
    assert main(["tunes", "list", "--db", str(db)]) == 0
    assert tune_id in capsys.readouterr().out
    assert main(["tunes", "show", tune_id[:6], "--db", str(db)]) == 0
    assert "PICK passed" in capsys.readouterr().out
    folder = tmp_path / "pick"
    assert main(["tunes", "export", tune_id, "--format", "all", "-o", str(folder), "--db", str(db)]) == 0, \
        capsys.readouterr().err
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["pick.compose.yaml", "pick.docker.sh", "pick.k8s.yaml", "pick.sh"]
    bash = (folder / "pick.sh").read_text()
    assert "--max-num-seqs 8" in bash and "--enable-prefix-caching" in bash
    assert (folder / "pick.sh").stat().st_mode & 0o111
    report = tmp_path / "tune.html"
    assert main(["tunes", "report", tune_id, "-o", str(report), "--db", str(db)]) == 0
    html = report.read_text()
    assert "data:image/svg+xml;base64," in html and "The pick: max seqs 8" in html and "--max-num-seqs 8" in html
    assert main(["resume", tune_id[:6], "--db", str(db)]) == 2  # the one resume command knows it is a tune
    assert f"tune {tune_id} is complete: nothing to resume" in capsys.readouterr().err


def test_cli_resume_and_user_errors(tmp_path: Path, fake_cli: FakeEngines, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "runs.db")
    assert main(["tune", "cpu-demo", "--db", db]) == 2
    assert "needs an SLO" in capsys.readouterr().err
    assert main(["tune", "cpu-demo", "--slo", "ttft<=5", "--db", db]) == 2
    assert main(["tune", "cpu-demo", "--slo", SLO, "--budget", "30", "--db", db]) == 2
    assert "with a unit" in capsys.readouterr().err
    assert main(["tune", "cpu-demo", "--slo", SLO, "--budget", "1m", "--trials", "2", "--db", db]) == 2
    assert main(["tune", "cpu-demo", "--resume", "--db", db]) == 2
    assert "no unfinished tune of profile 'cpu-demo'" in capsys.readouterr().err
    assert main(["tune", "cpu-demo", "--slo", SLO, "--dry-run"]) == 0
    assert "ready" in capsys.readouterr().out


class _FakeCluster:
    """``open_fleet`` of the tune command without a cluster: it notes the cluster options each
    command came with and says it connected to ``--cluster`` (with Ray's default port; the trials
    then run here, on the fakes); with ``refuse`` set it stops the command there."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, int | None, bool, list[str]]] = []
        self.refuse = False

    def __call__(self, args: Any, config: RunConfig) -> Any:
        from app.fleet.choice import FleetChoice

        self.asked.append((args.cluster, args.parallel, args.skip_bad_nodes, list(args.trial_resource)))
        if self.refuse:
            raise UserError("no cluster in this test")
        if args.cluster is None:
            return FleetChoice()
        return FleetChoice(address=args.cluster if ":" in args.cluster else f"{args.cluster}:6379")  # as connected


def test_resume_goes_on_with_the_cluster_options_the_tune_ran_with(tmp_path: Path, fake_cli: FakeEngines,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cluster = _FakeCluster()
    monkeypatch.setattr("app.cli.tune_cmds.open_fleet", cluster)
    db, space = str(tmp_path / "runs.db"), tmp_path / "space.toml"
    space.write_text("[knobs]\nmax_num_seqs = [2, 8]\n[load]\nconcurrency = [1, 2, 4]\n")

    def crash(config: RunConfig) -> str | None:
        if config.features.max_num_seqs == 8 and config.load.concurrency == 2:
            raise RuntimeError("the tuner's process died here")
        return None

    FakeTuneRunner.hook = staticmethod(crash)  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        main(["tune", "cpu-demo", "--slo", SLO, "--space", str(space), "--db", db, "--cluster", "head",
              "--parallel", "2", "--skip-bad-nodes", "--trial-resource", "pool=1"])
    FakeTuneRunner.hook = None
    with RunStore(db) as store:
        (crashed,) = tune_store.list_tunes(store)
        ran_on = state_of(crashed).cluster
        assert crashed.status == "failed" and ran_on is not None
        assert ran_on.model_dump() == {"address": "head:6379", "parallel": 2, "skip_bad_nodes": True,
                                       "trial_resources": ["pool=1"]}
        old = state_of(replace(crashed, state={k: v for k, v in crashed.state.items() if k != "cluster"}))
        assert old.cluster is None  # a tune stored before tunes kept their cluster still opens
    capsys.readouterr()

    cluster.refuse = True
    assert main(["resume", crashed.id, "--db", db, "--cluster", "other", "--parallel", "3"]) == 2
    assert main(["resume", crashed.id, "--db", db, "--no-cluster"]) == 2  # this machine: open_fleet sees no cluster
    assert cluster.asked[-2:] == [("other", 3, True, ["pool=1"]), (None, None, False, [])]
    assert main(["resume", crashed.id, "--db", db, "--no-cluster", "--cluster", "x"]) == 2
    assert "cannot go with --cluster" in capsys.readouterr().err
    cluster.refuse = False
    assert main(["resume", crashed.id, "--db", db]) == 0, capsys.readouterr()
    assert cluster.asked[-1] == ("head:6379", 2, True, ["pool=1"])  # the tune's own cluster and options
    with RunStore(db) as store:
        resumed = load_tune(store, crashed.id)
    assert resumed.status == "completed" and resumed.cluster == ran_on


def test_the_tune_publishes_its_state_as_it_moves_and_runs_do_not_keep_it(store: RunStore) -> None:
    """One event for every campaign: each change of the tune is a ``CampaignUpdated`` carrying a
    copy of its whole state, in order; the recorder stores the runs, not the campaign's updates."""
    from app.events import CampaignUpdated

    bus = Bus()
    updates = bus.subscribe(kinds=(CampaignUpdated,))
    state, _engines, _tuner = tune(store, bus=bus)
    seen = [item.payload.state for item in updates.drain()]  # type: ignore[union-attr]
    assert seen and all(isinstance(s, TuneState) and s.tune_id == state.tune_id for s in seen)
    revisions = [s.revision for s in seen]
    assert revisions == sorted(set(revisions)) and revisions[-1] == state.revision
    assert seen[-1].model_dump() == state.model_dump() and seen[-1] is not state  # a copy: the tune keeps its own
    assert any(t.status == "running" for s in seen for t in s.trials)  # a trial was seen under way
    kinds = {e["kind"] for run in store.list_runs() for e in store.get_run(run.id).events}
    assert kinds and "campaign" not in kinds


# --- searches side by side (a cluster's slots; here stand-in engines on this machine) ----------------

class _Together:
    """Searches at once, proved by a barrier: the first run of each of the first ``n`` engine
    configurations starts only when all ``n`` are under way, so the tune gets past them only if
    ``n`` searches truly run at once (else the barrier breaks after its generous timeout, and the
    tune raises). ``most`` counts the runs under way at once: a cap of ``n`` keeps it at ``n``."""

    def __init__(self, n: int, timeout_s: float = 60.0) -> None:
        self.barrier = threading.Barrier(n, timeout=timeout_s)
        self.lock = threading.Lock()
        self.joined: set[str] = set()
        self.now = 0
        self.most = 0

    def __call__(self, config: RunConfig) -> str | None:
        key = repr(sorted(config.features.model_dump().items()))
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            join = key not in self.joined and len(self.joined) < self.barrier.parties
            if join:
                self.joined.add(key)
        try:
            if join:
                self.barrier.wait()
        finally:
            with self.lock:
                self.now -= 1
        return None


def test_a_grid_searched_three_at_a_time_finds_what_one_at_a_time_finds(store: RunStore) -> None:
    serial, _, _ = tune(None)
    FakeTuneRunner.reset()
    together = _Together(3)
    FakeTuneRunner.hook = together  # type: ignore[assignment]
    followed: list[Bus] = []
    launched: list[FakeEngines] = []

    def own_engines() -> FakeEngines:
        launched.append(FakeEngines())
        return launched[-1]

    state, _, _ = tune(store, max_parallel=3, new_engines=own_engines, on_slot_bus=followed.append)
    assert together.most == 3  # three configurations were searched at once (the barrier), never more
    assert len(followed) == len(launched) == len(state.candidates)  # each search: its own bus and engines
    assert state.engine_launches == sum(e.launches for e in launched) == len(state.candidates)

    def outcome(st: TuneState) -> list[tuple[int, float | None, str]]:
        return sorted((t.candidate, t.load_value, t.status) for t in st.trials)

    assert outcome(state) == outcome(serial)
    assert state.pick is not None and serial.pick is not None and state.pick.knobs == serial.pick.knobs
    assert len({t.index for t in state.trials}) == len(state.trials)  # no two trials share an index
    stored = load_tune(store, state.tune_id)
    assert sorted((t.candidate, t.load_value, t.status) for t in stored.trials) == outcome(state)
    for trial in state.trials:  # every trial's own run, stored by its search's own recorder
        run = store.get_run(trial.run_id or 0)
        assert run.status == "completed" and f"tune:{state.tune_id}" in run.tags
        assert run.config["load"]["concurrency"] == trial.load_value
    assert len({t.run_id for t in state.trials}) == len(state.trials)


def test_bayes_two_at_a_time_never_searches_a_configuration_twice(store: RunStore) -> None:
    together = _Together(2)
    FakeTuneRunner.hook = together  # type: ignore[assignment]
    state, _, _ = tune(store, strategy="bayes", max_candidates=4, seed=3, max_parallel=2, new_engines=FakeEngines)
    searched = [c for c in state.candidates if c.status in ("done", "infeasible")]
    assert len(searched) == 4 and together.most == 2  # two at once (the barrier), never more
    assert len({repr(sorted(c.knobs.items())) for c in searched}) == 4
    assert state.status == "completed" and state.pick is not None


def test_an_error_in_one_search_stops_the_tune_and_is_raised(store: RunStore) -> None:
    def crash(config: RunConfig) -> str | None:
        if config.features.max_num_seqs == 8 and config.load.concurrency == 8:
            raise RuntimeError("a search died here")
        time.sleep(0.02)
        return None

    FakeTuneRunner.hook = staticmethod(crash)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="a search died here"):
        tune(store, max_parallel=2, new_engines=FakeEngines)
    (stored,) = tune_store.list_tunes(store)
    assert stored.status == "failed"
