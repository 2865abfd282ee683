"""The acceleration ladder without an engine: the profile's [ladder] section, steps built on the
last step that ran, the skip rule (both FP8-KV branches), engine reuse for load-only steps,
factors and losses, % of the physical limit (and the above-ceiling flag), verification, the
stored group (interrupted when its writer died), the GPU ladders planned and exported here, and
the CLI."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from app.analysis.compare import compare_runs
from app.bus import Bus
from app.cli import main
from app.config import RunConfig
from app.errors import UserError
from app.events import CampaignUpdated
from app.ladder.run import Ladder, skip_reason
from app.ladder.spec import LadderError, LadderSpec, LadderStepSpec, apply_step, default_ladder, ladder_base
from app.ladder.state import LadderState, StepRow, compute_factors, limit_text
from app.ladder.stored import list_ladders, load_ladder, resumable_ladder, save_ladder
from app.profiles import (
    Profile,
    ProfileError,
    load_profile,
    load_profile_file,
    profile_from_toml,
    profile_to_toml,
    read_profile,
    resolve_profile,
)
from app.recording import RunRecorder
from app.store import RunStore
from db import campaign_store
from db.models import Campaign
from engine_adapters.base import ValidationIssue
from engine_adapters.hardware import HardwareInfo
from tests.fakes.campaign import AVX2_ONLY, AVX512, on_known_host
from tests.fakes.ladder import FakeEngines, FakeLadderRunner, Script
from tests.unit.test_export_scripts import shellcheck_bin


@pytest.fixture(autouse=True)
def _known_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's host (``on_known_host``: no GPU here), no ladder runs yet."""
    import app.ladder.run as run_mod

    on_known_host(monkeypatch, run_mod)
    FakeLadderRunner.calls = []


def cpu_ladder() -> RunConfig:
    return load_profile(resolve_profile("cpu-ladder"))


def cpu_ladder_profile() -> Profile:
    return load_profile_file(resolve_profile("cpu-ladder"))


SCRIPTS = {"baseline": Script(400, 1.2), "batching": Script(1600, 12.0), "FP8 KV": Script(1500, 12.0),
           "prefix": Script(2000, 13.0)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RunStore(tmp_path / "runs.db") as s:
        yield s


def run_ladder(store: RunStore, config: RunConfig | None = None, hardware: HardwareInfo = AVX512,
               scripts: dict[str, Script] | None = None, bus: Bus | None = None,
               cancel: threading.Event | None = None) -> tuple[LadderState, FakeEngines, Ladder]:
    FakeLadderRunner.scripts = scripts or SCRIPTS
    bus = bus or Bus()
    recorder = RunRecorder(bus, store)
    engines = FakeEngines()
    ladder = Ladder(config or cpu_ladder(), bus, spec=cpu_ladder_profile().ladder, profile="cpu-ladder",
                    engines=engines, recorder=recorder,
                    runner_factory=FakeLadderRunner, hardware=hardware, discover_flags=False)
    try:
        state = ladder.run(cancel)
    finally:
        recorder.close()
    return state, engines, ladder


# --- the profile's section ---------------------------------------------------------------------

def test_cpu_ladder_profile_has_the_four_steps_and_round_trips() -> None:
    profile = cpu_ladder_profile()
    config, spec = profile.run, profile.ladder
    assert spec is not None and profile.notes == []
    assert [s.name for s in spec.steps] == ["baseline", "+ continuous batching", "+ FP8 KV cache",
                                            "+ prefix caching"]
    assert read_profile(profile_to_toml(config, spec)) == profile
    assert "ladder" not in RunConfig.model_fields  # a run configuration describes one run
    base = ladder_base(config, spec)
    assert base.workload.kind == "shared_prefix" and base.workload.cache == "cold"


def test_a_profile_with_the_old_ladder_section_loads_with_a_note() -> None:
    text = resolve_profile("cpu-ladder").read_text()
    old = text.replace("[campaigns.ladder", "[ladder").replace("[[campaigns.ladder", "[[ladder")
    assert "[ladder]" in old and "[[ladder.steps]]" in old
    profile = read_profile(old, "old.toml")
    assert profile.ladder == cpu_ladder_profile().ladder and profile.run == cpu_ladder()
    assert profile.notes == ["old.toml: [ladder] is read as [campaigns.ladder], where a profile keeps its ladder "
                             "now (saving the profile writes it there)"]
    assert "[campaigns.ladder]" in profile_to_toml(profile.run, profile.ladder)  # saved in the new place
    with pytest.raises(ProfileError, match="both \\[ladder\\] and \\[campaigns.ladder\\]: keep one"):
        read_profile(old + "\n" + text[text.index("[campaigns.ladder]"):], "both.toml")
    with pytest.raises(ProfileError, match="campaigns.ladder.steps.0.features"):
        read_profile('[[campaigns.ladder.steps]]\nname = "a"\nfeatures = { prefix_cashing = true }\n', "new.toml")


@pytest.mark.parametrize(("section", "message"), [
    ('[[ladder.steps]]\nname = "a"\nfeatures = { prefix_cashing = true }\n', "ladder.steps.0.features"),
    ('[[ladder.steps]]\nname = "a"\nload = { concurrency = "16" }\n', "concurrency"),
    ('[[ladder.steps]]\nname = "a"\n[[ladder.steps]]\nname = "a"\n', "two steps are named 'a'"),
    ('[[ladder.steps]]\nname = "a"\nseed_row = 9\n', "the seeds' table has rows 0 to 4"),
    ('[ladder.workload]\nkind = "random"\n[[ladder.steps]]\nname = "a"\n', "a ladder needs a shared-prefix workload"),
    ('steps = []\n', "ladder.steps"),
])
def test_a_bad_ladder_section_is_one_line_naming_it(section: str, message: str) -> None:
    with pytest.raises(ProfileError) as info:
        profile_from_toml("[ladder]\n" + section, "p.toml")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_steps_apply_to_the_previous_step() -> None:
    base = ladder_base(cpu_ladder(), cpu_ladder_profile().ladder)  # type: ignore[arg-type]
    one = apply_step(base, LadderStepSpec(name="b", load={"concurrency": 32}))
    two = apply_step(one, LadderStepSpec(name="kv", features={"kv_cache_dtype": "fp8"}, concurrency_from_kv=True))
    assert (two.load.concurrency, two.features.kv_cache_dtype, two.features.prefix_caching) == (64, "fp8", False)
    capped = apply_step(one.model_copy(update={"features": one.features.model_copy(update={"max_num_seqs": 40})}),
                        LadderStepSpec(name="kv", features={"kv_cache_dtype": "fp8"}, concurrency_from_kv=True))
    assert capped.load.concurrency == 40  # the engine would not run more at once
    spec = apply_step(two, LadderStepSpec(name="s", model="/models/other",
                                          features={"speculative": {"method": "ngram"}}))
    assert spec.engine.model == "/models/other" and spec.features.speculative.num_speculative_tokens == 3
    with pytest.raises(LadderError, match="step 'r': load: .*rate_rps"):
        apply_step(two, LadderStepSpec(name="r", load={"pattern": "poisson"}))
    with pytest.raises(LadderError, match="a sweep is not"):
        ladder_base(cpu_ladder(), LadderSpec(steps=[LadderStepSpec(name="a")],
                                             load=cpu_ladder().load.model_copy(update={"pattern": "sweep",
                                                                                       "levels": [1.0, 2.0]})))


def test_the_skip_rule_errors_and_warnings_on_changed_settings() -> None:
    error = ValidationIssue("kv_cache_dtype", "needs AVX-512")
    warning = ValidationIssue("weights_dtype", "unlikely to run", "warning")
    other = ValidationIssue("gpu_memory_utilization", "no effect", "warning")
    assert skip_reason([error], []) == "kv_cache_dtype: needs AVX-512"
    assert skip_reason([warning], ["features.weights_dtype"]) == "weights_dtype: unlikely to run"
    assert skip_reason([other], ["features.weights_dtype"]) is None  # not this step's change
    assert skip_reason([ValidationIssue("speculative.draft_model", "ignored", "warning")],
                       ["features.speculative.method"]) is None
    touching = ValidationIssue("speculative", "x", "warning")
    assert skip_reason([touching], ["features.speculative.method"]) == "speculative: x"


# --- planning ----------------------------------------------------------------------------------

def test_plan_with_avx512_runs_every_step_and_says_which_relaunch() -> None:
    state = Ladder(cpu_ladder(), Bus(), spec=cpu_ladder_profile().ladder, hardware=AVX512, discover_flags=False).plan()
    assert [r.status for r in state.rows] == ["pending"] * 4
    assert [r.engine_restart for r in state.rows] == [True, False, True, True]
    assert state.rows[1].change == "concurrency 1 \u2192 16" and state.rows[1].concurrency == 16
    ceilings = [r.ceiling_tok_per_s or 0.0 for r in state.rows]
    assert ceilings[0] > 0 and ceilings[1] > ceilings[0]
    assert "same" not in state.workload and "one shared-prefix workload for every step" in state.workload


def test_fp8_kv_on_a_cpu_without_avx512_is_skipped_and_the_next_step_builds_on_the_last_that_ran() -> None:
    state = Ladder(cpu_ladder(), Bus(), spec=cpu_ladder_profile().ladder, hardware=AVX2_ONLY,
                   discover_flags=False).plan()
    skipped = state.rows[2]
    assert skipped.status == "skipped" and "AVX-512" in (skipped.reason or "")
    last = state.rows[3]
    assert last.status == "pending" and last.config["features"]["kv_cache_dtype"] == "auto"
    assert last.config["features"]["prefix_caching"] is True and last.engine_restart is True


def test_the_default_order_follows_the_seeds_and_skips_what_a_cpu_build_cannot_do() -> None:
    demo = load_profile(resolve_profile("cpu-demo")).model_copy(update={"workload": cpu_ladder().workload})
    spec = default_ladder(demo)
    assert [s.name for s in spec.steps] == ["baseline", "+ FP8 weights", "+ continuous batching", "+ FP8 KV cache",
                                            "+ prefix caching", "+ speculative decoding"]
    state = Ladder(demo, Bus(), hardware=AVX512, discover_flags=False).plan()
    assert state.rows[1].status == "skipped" and "unlikely to run on the CPU build" in (state.rows[1].reason or "")
    assert state.rows[3].concurrency == 16  # 8 with a 16-bit cache -> 16 with FP8 (the freed KV memory)
    with pytest.raises(LadderError, match="shared-prefix workload"):
        Ladder(load_profile(resolve_profile("cpu-demo")), Bus())


def test_on_llamacpp_the_weight_steps_are_its_gguf_types_16_then_8_then_4_bit(tmp_path: Path) -> None:
    """The seeds' precision rows on an engine that runs them here: FP8 weights give way to Q8_0
    then Q4_0, each a restart on the previous step's configuration, none skipped."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    profile = load_profile(resolve_profile("llamacpp-cpu-demo"))
    demo = profile.model_copy(update={"workload": cpu_ladder().workload,
                                      "engine": profile.engine.model_copy(update={"model": str(gguf)})})
    spec = default_ladder(demo)
    assert [s.name for s in spec.steps] == ["baseline", "+ Q8_0 weights", "+ Q4_0 weights", "+ continuous batching",
                                            "+ FP8 KV cache", "+ prefix caching", "+ speculative decoding"]
    assert [s.features for s in spec.steps[1:3]] == [{"weights_dtype": "q8_0"}, {"weights_dtype": "q4_0"}]
    state = Ladder(demo, Bus(), hardware=AVX512, discover_flags=False).plan()
    weights = [(row.status, row.config["features"]["weights_dtype"], row.engine_restart) for row in state.rows[:3]]
    assert weights == [("pending", "auto", True), ("pending", "q8_0", True), ("pending", "q4_0", True)]


# --- running -----------------------------------------------------------------------------------

def test_a_ladder_reuses_the_engine_for_load_steps_and_stores_one_group(store: RunStore) -> None:
    bus = Bus()
    updates = bus.subscribe(kinds=(CampaignUpdated,))
    state, engines, _ = run_ladder(store, bus=bus)
    assert state.status == "completed" and state.reason is None
    assert [r.status for r in state.rows] == ["completed"] * 4
    assert len(engines.launched) == 3 and state.engine_launches == 3  # batching reused the baseline's engine
    assert [r.engine_reused for r in state.rows] == [False, True, False, False]
    assert [c["engine"].n for c in FakeLadderRunner.calls] == [1, 1, 2, 3]
    assert [round(r.output_tok_per_s or 0) for r in state.rows] == [400, 1600, 1500, 2000]
    assert [r.factor_baseline for r in state.rows] == pytest.approx([1.0, 4.0, 3.75, 5.0])
    assert [r.factor_previous for r in state.rows][1:] == pytest.approx([4.0, 0.9375, 4 / 3])
    assert [r.loss for r in state.rows] == [False, False, True, False]  # a slower step is shown, not hidden
    assert state.rows[1].total_factor_previous == pytest.approx(2000 / 800)
    assert all(r.verification == "verified" for r in state.rows)
    assert state.rows[1].checks[-1].feature == "load.concurrency" and "10.0x" in state.rows[1].checks[-1].evidence
    # every run is cold (the runner salts each level: nothing for the ladder to do but not warm it)
    assert all(c["config"].workload.cache == "cold" for c in FakeLadderRunner.calls)
    seen = [ev.payload.state for ev in updates.drain()]  # type: ignore[union-attr]
    assert seen[0].rows[0].status == "pending" and seen[-1].status == "completed"
    assert [s.rows[1].status for s in seen].index("running") < [s.rows[1].status for s in seen].index("completed")
    (stored,) = list_ladders(store)
    assert stored.state.status == "completed" and stored.run_ids == state.run_ids == [1, 2, 3, 4]
    campaign = campaign_store.get_campaign(store, state.ladder_id)
    assert campaign.kind == "ladder" and campaign.revision == state.revision
    assert [link.run_id for link in campaign.links] == stored.run_ids
    for run_id in stored.run_ids:
        run = store.get_run(run_id)
        assert f"ladder:{state.ladder_id}" in run.tags and "ladder" not in run.summary
    comparison = compare_runs(store, stored.run_ids)  # Compare opens it as a whole, the baseline first
    assert comparison.baseline == 0 and len(comparison.runs) == 4
    assert "ladder.revision" not in {m.name for m in comparison.metrics}  # the state is not a figure
    assert any(k == "load.concurrency" for k, _v in comparison.config_diff)
    assert load_ladder(store, state.ladder_id[:6]).ladder_id == state.ladder_id
    assert load_ladder(store, "3").ladder_id == state.ladder_id  # by one of its runs


def test_a_skipped_step_is_shown_with_its_reason_and_factors_skip_it(store: RunStore) -> None:
    state, engines, _ = run_ladder(store, hardware=AVX2_ONLY)
    assert [r.status for r in state.rows] == ["completed", "completed", "skipped", "completed"]
    assert "AVX-512" in (state.rows[2].reason or "") and state.rows[2].run_ids == []
    assert state.rows[3].factor_previous == pytest.approx(2000 / 1600)  # against the step that ran before it
    assert all(c.features.kv_cache_dtype == "auto" for c in engines.launched)


def test_percent_of_limit_and_a_figure_above_the_ceiling_is_flagged_as_a_bug(store: RunStore) -> None:
    from app.planner import make_plan
    from app.planner.plan import decode_ceiling

    fast = {**SCRIPTS, "prefix": Script(32_000, 13.0)}  # beyond what 10 GB/s can deliver at a batch of 13
    state, _, ladder = run_ladder(store, scripts=fast)
    first = state.rows[0]
    ceiling = decode_ceiling(make_plan(ladder._configs[0], batches=[1]), 1.0)
    assert first.ceiling_batch == 1.0 and first.ceiling_tok_per_s == pytest.approx(ceiling)
    assert first.percent_of_limit == pytest.approx(400 / ceiling)
    assert limit_text(first) == f"{100 * 400 / ceiling:.0f}% of limit"
    batched = state.rows[1]
    assert batched.ceiling_batch == 12.0  # the engine's tokens per step, at most the concurrency
    bug = state.rows[3]
    assert bug.percent_of_limit is None and "above the physical ceiling" in (bug.ceiling_note or "")
    assert limit_text(bug) == "above the ceiling: a bug"


def test_a_feature_the_engine_did_not_run_and_batches_that_did_not_grow_are_not_active(store: RunStore) -> None:
    scripts = {**SCRIPTS, "batching": Script(500, 1.3), "FP8 KV": Script(500, 1.3, not_active=("kv_cache_dtype",))}
    state, _, _ = run_ladder(store, scripts=scripts)
    assert state.rows[1].verification == "not active" and "did not grow" in state.rows[1].checks[-1].evidence
    assert state.rows[2].verification == "not active"
    assert state.rows[3].verification == "verified"


def test_a_failed_step_is_shown_and_the_ladder_goes_on_from_the_last_step_that_ran(store: RunStore) -> None:
    scripts = {**SCRIPTS, "FP8 KV": Script(1500, 12.0, status="failed")}
    state, engines, _ = run_ladder(store, scripts=scripts)
    assert [r.status for r in state.rows] == ["completed", "completed", "failed", "completed"]
    assert state.status == "completed" and "step '+ FP8 KV cache' failed" in (state.reason or "")
    assert engines.launched[-1].features.kv_cache_dtype == "auto"  # its change is not carried forward
    assert main(["ladders", "--db", str(store.path)]) == 0


def test_a_cancelled_ladder_says_so_and_leaves_the_rest_unrun(store: RunStore) -> None:
    state = _cancelled_in_its_second_step(store)
    assert state.status == "cancelled" and [r.status for r in state.rows] == ["completed", "cancelled", "pending",
                                                                              "pending"]
    assert "not run" in (state.rows[2].reason or "")


def test_a_ladder_whose_process_died_reads_back_interrupted_once(store: RunStore) -> None:
    state, _, _ = run_ladder(store)
    dead = subprocess.Popen(["true"])
    dead.wait()
    state.status, state.rows[3].status, state.revision = "running", "running", state.revision + 1
    save_ladder(store, state)
    with store.engine.begin() as conn:  # as if the dead process had written it
        conn.execute(update(Campaign).where(Campaign.id == state.ladder_id)
                     .values(writer_pid=dead.pid, writer_create_time=None))
    (found,) = list_ladders(store)
    assert found.state.status == "interrupted" and found.state.rows[3].status == "interrupted"
    assert found.state.rows[0].status == "completed" and found.state.rows[0].factor_baseline == 1.0
    (again,) = list_ladders(store, mark_interrupted=False)
    assert again.state.status == "interrupted" and again.state.revision == found.state.revision


def test_factors_and_the_limit_words() -> None:
    rows = [StepRow(index=0, name="a", status="skipped"),
            StepRow(index=1, name="b", status="completed", output_tok_per_s=100.0, total_tok_per_s=300.0),
            StepRow(index=2, name="c", status="failed"),
            StepRow(index=3, name="d", status="completed", output_tok_per_s=80.0, total_tok_per_s=330.0,
                    percent_of_limit=1.03)]
    compute_factors(rows)
    assert rows[1].factor_baseline == 1.0 and rows[1].factor_previous is None
    assert rows[3].factor_previous == pytest.approx(0.8) and rows[3].loss
    assert rows[3].total_factor_previous == pytest.approx(1.1)
    assert limit_text(rows[3]) == "~100% of limit"  # within the ceiling's tolerance: never "103%"


# --- GPU ladders on this machine ------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["qwen3-27b-fp8-h100", "llama-70b-tp4"])
def test_gpu_ladders_are_validated_planned_and_exported_without_a_gpu(profile: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    loaded = load_profile_file(resolve_profile(profile))
    config = loaded.run
    assert loaded.ladder is not None and loaded.ladder.gpu == "H100"
    state = Ladder(config, Bus(), spec=loaded.ladder, discover_flags=False).plan()
    assert [r.status for r in state.rows] == ["pending"] * len(state.rows), [(r.name, r.reason) for r in state.rows]
    assert all(r.ceiling_tok_per_s and r.ceiling_tok_per_s > 0 for r in state.rows)
    assert state.planned_for.startswith("H100 SXM x" + ("4" if "tp4" in profile else "1"))
    assert [r.engine_restart for r in state.rows] == [True, True, False, True, True, True]
    assert state.rows[3].concurrency == 64  # FP8 KV: the freed memory holds twice the 32 sequences
    if profile.startswith("qwen"):
        assert [r.reference_tok_per_s for r in state.rows] == [None, 2_000, 20_000, 35_000, 45_000, 60_000]
        assert state.rows[1].reference_label and "seeds" in state.rows[1].reference_label
        assert state.rows[2].ceiling_tok_per_s == pytest.approx(2_670, rel=0.01)  # docs/planner.md
    else:
        assert all(r.reference_tok_per_s is None for r in state.rows)
    assert main(["ladder", profile, "--dry-run"]) == 0
    assert "6. " in capsys.readouterr().out
    script = tmp_path / "final.sh"
    assert main(["ladder", profile, "--export", str(script)]) == 0
    text = script.read_text()
    assert "--kv-cache-dtype" in text and "--enable-prefix-caching" in text and "--speculative-config" in text
    subprocess.run([shellcheck_bin(), str(script)], check=True)
    assert main(["ladder", profile, "--export", str(tmp_path / "base.yaml"), "--step", "1", "--format", "k8s"]) == 0
    assert "--kv-cache-dtype" not in (tmp_path / "base.yaml").read_text()


def test_a_gpu_ladder_cannot_run_here_and_says_why_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ladder", "llama-70b-tp4", "--no-store"])
    err = capsys.readouterr().err
    assert code == 2 and "no step of the ladder can run on this machine" in err and "NVIDIA GPU" in err


# --- the CLI -----------------------------------------------------------------------------------

def test_cli_ladder_runs_with_a_line_per_step_a_table_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import app.campaign as campaign_mod
    import app.ladder.run as run_mod

    engines = FakeEngines()
    monkeypatch.setattr(run_mod, "Runner", FakeLadderRunner)
    monkeypatch.setattr(run_mod, "check_config", lambda config, discover_flags=True, **kw: _report(config, kw))
    monkeypatch.setattr(campaign_mod, "launch_engine", lambda config, **kw: _launched(engines, config))
    monkeypatch.setattr(campaign_mod.EngineKeeper, "engine_for", lambda self, config, bus, cancel:
                        engines.engine_for(config, bus, cancel))
    FakeLadderRunner.scripts = SCRIPTS
    db, out = tmp_path / "runs.db", tmp_path / "ladder.json"
    assert main(["ladder", "cpu-ladder", "--db", str(db), "--json", str(out), "--no-telemetry"]) == 0
    text = capsys.readouterr().out
    assert "== step 2/4 '+ continuous batching': concurrency 1 \u2192 16 (reusing the engine)" in text
    assert ("step 3/4 '+ FP8 KV cache': 1,500 output tok/s, \u00d73.75 vs baseline, \u00d70.94 vs previous "
            "(a LOSS)") in text
    assert "one shared-prefix workload for every step" in text
    table = text[text.index("step   "):]
    assert "LOSS \u00d70.94" in table and "reused" in table
    doc = json.loads(out.read_text())
    assert [r["status"] for r in doc["ladder"]["rows"]] == ["completed"] * 4
    assert len(doc["campaign"]["steps"]) == 4
    ladder_id = doc["ladder"]["ladder_id"]
    assert main(["ladders", "list", "--db", str(db)]) == 0
    assert ladder_id in capsys.readouterr().out
    assert main(["ladders", "show", ladder_id, "--db", str(db)]) == 0
    assert "4. + prefix caching" in capsys.readouterr().out
    assert main(["ladders", "compare", ladder_id, "--db", str(db)]) == 0
    assert "load.concurrency" in capsys.readouterr().out
    report = tmp_path / "ladder.html"
    assert main(["ladders", "report", ladder_id, "--db", str(db), "-o", str(report)]) == 0
    html = report.read_text()
    assert "data:image/svg+xml;base64," in html and "+ prefix caching" in html and "loss" in html
    assert "one shared-prefix workload for every step" in html and "Test CPU" in html
    assert "--enable-prefix-caching" in html  # the final step's launch script
    script = tmp_path / "final.sh"
    assert main(["ladders", "export", ladder_id, "--db", str(db), "-o", str(script)]) == 0
    assert "--kv-cache-dtype" in script.read_text()
    assert main(["ladders", "show", "nope", "--db", str(db)]) == 2


def _report(config: RunConfig, kw: dict[str, Any]) -> Any:
    from app.engines import check_config

    return check_config(config, discover_flags=False, hardware=AVX512, flags=None)


def _launched(engines: FakeEngines, config: RunConfig) -> Any:  # pragma: no cover - EngineKeeper is patched
    raise AssertionError("the ladder must get its engines through the keeper")


def test_a_ladder_killed_in_its_first_step_is_read_back_from_its_tags(store: RunStore) -> None:
    run_id = store.create_run(name="CPU acceleration ladder [1/4] baseline", config={}, engine_kind="vllm",
                              started_at=1.9e9, tags=["ladder:feedbeef", "campaign:feedbeef", "repeat:feedbeef-0"])
    store.finish_run(run_id, "interrupted", "the process that recorded it ended before the run finished")
    (found,) = list_ladders(store)
    assert (found.ladder_id, found.state.name, found.state.status) == ("feedbeef", "CPU acceleration ladder",
                                                                        "interrupted")
    assert [(r.name, r.status, r.run_ids) for r in found.state.rows] == [("baseline", "interrupted", [run_id])]
    assert main(["ladders", "show", "feed", "--db", str(store.path)]) == 0


def _cancelled_in_its_second_step(store: RunStore) -> LadderState:
    cancel = threading.Event()
    bus = Bus()
    sub = bus.subscribe(kinds=(CampaignUpdated,))

    def cancel_on_second_step() -> None:
        while not cancel.is_set():
            for ev in sub.drain(timeout_s=0.05):
                if ev.payload.state.rows[1].status == "running":  # type: ignore[union-attr]
                    cancel.set()

    watcher = threading.Thread(target=cancel_on_second_step, daemon=True)
    watcher.start()
    first, _, _ = run_ladder(store, scripts={**SCRIPTS, "batching": Script(1600, 12.0, delay_s=30.0)}, bus=bus,
                             cancel=cancel)
    watcher.join(5)
    assert [r.status for r in first.rows] == ["completed", "cancelled", "pending", "pending"]
    return first


def test_a_cancelled_ladder_resumes_keeping_the_steps_it_finished(store: RunStore) -> None:
    first = _cancelled_in_its_second_step(store)
    stored = resumable_ladder(store, None, "cpu-ladder")
    assert stored.ladder_id == first.ladder_id and stored.status == "cancelled"

    FakeLadderRunner.scripts, FakeLadderRunner.calls = SCRIPTS, []
    recorder = RunRecorder(Bus(), store)
    try:
        resumed = Ladder.resume(stored, recorder.bus, engines=FakeEngines(), recorder=recorder,
                                runner_factory=FakeLadderRunner, hardware=AVX512, discover_flags=False).run()
    finally:
        recorder.close()
    assert resumed.ladder_id == first.ladder_id and resumed.status == "completed"
    assert [r.status for r in resumed.rows] == ["completed"] * 4
    assert resumed.rows[0].run_ids == first.rows[0].run_ids  # kept, not run again
    assert len(FakeLadderRunner.calls) == 3
    assert FakeLadderRunner.calls[0]["config"].load.concurrency == 16  # built on the kept baseline, as before
    (again,) = list_ladders(store)
    assert [r.status for r in again.state.rows] == ["completed"] * 4 and again.state.run_ids == resumed.run_ids
    assert again.state.rows[1].factor_baseline == pytest.approx(resumed.rows[1].factor_baseline)
    assert again.state.replaced_run_ids == first.rows[1].run_ids != []  # the cancelled run: kept, set aside
    assert store.get_run(first.rows[1].run_ids[0]).status == "cancelled"
    with pytest.raises(UserError, match="ran every step: nothing to resume"):
        Ladder.resume(again.state, Bus())


def test_cli_resume_goes_on_with_a_ladder_by_its_id(store: RunStore, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import app.campaign as campaign_mod
    import app.ladder.run as run_mod

    first = _cancelled_in_its_second_step(store)
    engines = FakeEngines()
    monkeypatch.setattr(run_mod, "Runner", FakeLadderRunner)
    monkeypatch.setattr(run_mod, "check_config", lambda config, discover_flags=True, **kw: _report(config, kw))
    monkeypatch.setattr(campaign_mod.EngineKeeper, "engine_for", lambda self, config, bus, cancel:
                        engines.engine_for(config, bus, cancel))
    FakeLadderRunner.scripts, FakeLadderRunner.calls = SCRIPTS, []
    db = str(store.path)
    assert main(["resume", first.ladder_id[:6], "--db", db, "--no-telemetry"]) == 0
    out = capsys.readouterr().out
    assert f"resuming ladder {first.ladder_id} (cancelled): 1 completed step(s) kept" in out
    assert "== step 1/4" not in out and "== step 2/4" in out and len(FakeLadderRunner.calls) == 3
    (again,) = list_ladders(store)
    assert [r.status for r in again.state.rows] == ["completed"] * 4
    assert main(["resume", first.ladder_id, "--db", db]) == 2
    assert "ran every step: nothing to resume" in capsys.readouterr().err
    assert main(["resume", "nope", "--db", db]) == 2
    assert "no stored campaign 'nope' (tunebench ladders and tunebench tunes list them)" in capsys.readouterr().err


class _TogetherRunner(FakeLadderRunner):
    """A stand-in run that starts only when another one runs beside it (a barrier of two): the
    ladder finishes only if two of its steps really run at once."""

    together = threading.Barrier(2, timeout=30)

    def begin(self) -> str | None:
        if "batching" in self.config.name or "baseline" in self.config.name:
            self.together.wait()
        return super().begin()


def test_steps_side_by_side_give_the_staircase_steps_one_after_another_give(store: RunStore) -> None:
    serial, _, _ = run_ladder(store)
    FakeLadderRunner.scripts, FakeLadderRunner.calls = SCRIPTS, []
    _TogetherRunner.together.reset()
    recorder = RunRecorder(Bus(), store)
    slots: list[FakeEngines] = []

    def new_engines() -> FakeEngines:
        slots.append(FakeEngines())
        return slots[-1]

    try:
        side_by_side = Ladder(cpu_ladder(), recorder.bus, spec=cpu_ladder_profile().ladder, profile="cpu-ladder",
                              recorder=recorder, runner_factory=_TogetherRunner, hardware=AVX512,
                              discover_flags=False, max_parallel=2, new_engines=new_engines).run()
    finally:
        recorder.close()
    assert not _TogetherRunner.together.broken  # the first two steps ran at the same time
    assert len(slots) == 2 and sum(e.launches for e in slots) == 4  # each slot keeps engines of its own
    assert side_by_side.status == serial.status == "completed"
    for a, b in zip(serial.rows, side_by_side.rows, strict=True):
        assert (a.name, a.status, a.config, a.change) == (b.name, b.status, b.config, b.change)
        assert (a.output_tok_per_s, a.factor_baseline, a.factor_previous) == \
               (b.output_tok_per_s, b.factor_baseline, b.factor_previous)
        assert len(b.run_ids) == 1
    stored = {s.ladder_id: s for s in list_ladders(store)}[side_by_side.ladder_id]
    assert stored.state.run_ids == side_by_side.run_ids and len(set(stored.state.run_ids)) == 4
    assert all(store.get_run(i).status == "completed" for i in stored.state.run_ids)


def test_a_step_side_by_side_built_on_one_that_failed_says_so(store: RunStore) -> None:
    FakeLadderRunner.scripts, FakeLadderRunner.calls = {**SCRIPTS, "FP8 KV": Script(1500, 12.0, status="failed")}, []
    recorder = RunRecorder(Bus(), store)
    try:
        state = Ladder(cpu_ladder(), recorder.bus, spec=cpu_ladder_profile().ladder, profile="cpu-ladder",
                       recorder=recorder, runner_factory=FakeLadderRunner, hardware=AVX512, discover_flags=False,
                       max_parallel=2, new_engines=FakeEngines).run()
    finally:
        recorder.close()
    assert [r.status for r in state.rows] == ["completed", "completed", "failed", "completed"]
    assert [r.built_on for r in state.rows] == [None, 0, 1, 2]
    last = state.rows[3]
    assert last.config["features"]["kv_cache_dtype"] == "fp8"  # built on the failed step's change
    assert last.reason == "built on step 3 (+ FP8 KV cache), which failed"
    assert last.factor_baseline == pytest.approx(2000 / 400) and last.factor_previous is None and not last.loss
    assert state.rows[1].factor_previous == pytest.approx(1600 / 400)  # built on a step that ran
