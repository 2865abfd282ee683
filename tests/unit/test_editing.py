"""The configuration being edited, headless: edits, drafts, profile bookkeeping, validation and
the callbacks subscribers hear, without Qt."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from app.config import RunConfig
from app.editing import ENGINE_FIELDS, LOAD_FIELDS, WORKLOAD_FIELDS, EditedConfig, editable_paths
from app.listeners import Listeners
from app.workload import WorkloadConfig
from engine_adapters.base import ValidationIssue
from engine_adapters.config import not_on_panel, panel_row


def test_an_accepted_edit_changes_the_config_and_says_which_path() -> None:
    edited = EditedConfig(RunConfig())
    heard: list[str] = []
    edited.changed.connect(heard.append)
    assert edited.set("load.concurrency", 7) is None
    assert edited.config.load.concurrency == 7 and heard == ["load.concurrency"] and edited.dirty
    assert edited.set("load.concurrency", 7) is None and heard == ["load.concurrency"]  # no change, no call


def test_a_value_wrong_in_itself_is_refused_and_the_config_kept() -> None:
    edited = EditedConfig(RunConfig())
    heard: list[str] = []
    edited.changed.connect(heard.append)
    message = edited.set("load.concurrency", 0)
    assert message is not None and "at least 1" in message
    assert edited.config.load.concurrency == RunConfig().load.concurrency
    assert edited.pending is None and heard == [] and not edited.dirty


def test_an_edit_that_breaks_a_rule_between_fields_is_a_draft_until_the_other_field_follows() -> None:
    edited = EditedConfig(RunConfig())
    heard: list[str] = []
    edited.changed.connect(heard.append)
    message = edited.set("load.pattern", "trace")  # a trace load needs a trace workload
    assert message is not None and edited.pending == message
    assert edited.config.load.pattern != "trace" and edited.draft_value("load.pattern") == "trace"
    assert edited.applies("load.speedup") and not edited.applies("load.concurrency")
    assert heard == []


def test_a_field_added_to_a_model_gets_a_panel_row_where_its_rank_puts_it_unless_marked_off() -> None:
    class Wider(WorkloadConfig):
        unranked_knob: int = 1
        first_knob: int = Field(1, json_schema_extra=panel_row(0))
        profile_only_knob: int = Field(1, json_schema_extra=not_on_panel())

    assert editable_paths(Wider, "workload") == ("workload.first_knob", *WORKLOAD_FIELDS, "workload.unranked_knob")


def test_the_panel_rows_follow_the_ranks_and_leave_out_the_marked_fields() -> None:
    assert ENGINE_FIELDS[0] == "engine.model" and "engine.runtime.env" not in ENGINE_FIELDS
    assert ENGINE_FIELDS.index("engine.runtime.kind") < ENGINE_FIELDS.index("engine.kind")
    rows = WORKLOAD_FIELDS[WORKLOAD_FIELDS.index("workload.num_requests"):]
    assert rows[:3] == ("workload.num_requests", "workload.input_len.mean", "workload.output_len.mean")
    assert "workload.input_len.minimum" not in WORKLOAD_FIELDS and "load.continuous_usage" not in LOAD_FIELDS
    every_leaf = set(RunConfig().model_dump()["load"])
    assert set(LOAD_FIELDS) == {f"load.{name}" for name in every_leaf - {"continuous_usage"}}


def test_a_load_setting_shows_only_while_the_pattern_reads_it() -> None:
    rate, cap = {"load.rate_rps", "load.max_concurrency"}, {"load.max_concurrency"}
    closed = {"load.concurrency", "load.ramp_up_s"}
    own = {"closed": closed, "constant": rate, "poisson": rate, "gamma": rate | {"load.burstiness"},
           "ramp": rate | {"load.ramp_start_rps"}, "trace": cap | {"load.speedup"},
           "sweep": closed | cap | {"load.sweep_of", "load.levels"}}
    everywhere = set(LOAD_FIELDS) - set.union(*own.values())
    assert {"load.pattern", "load.duration_s", "load.slo", "load.workers"} <= everywhere
    for pattern, settings in own.items():
        edited = EditedConfig(RunConfig())
        edited.set("load.pattern", pattern)  # a draft where the pattern needs more (a rate, levels)
        assert {path for path in LOAD_FIELDS if edited.applies(path)} == settings | everywhere, pattern


def test_a_profile_loaded_is_not_dirty_until_edited_and_saving_remembers_the_file(tmp_path: Path) -> None:
    edited = EditedConfig()
    heard: list[str] = []
    edited.changed.connect(heard.append)
    edited.load(RunConfig(name="from-file"), tmp_path / "a.toml")
    assert edited.config.name == "from-file" and edited.profile_path == tmp_path / "a.toml"
    assert not edited.dirty and heard == [""]
    edited.set("name", "edited")
    assert edited.dirty
    edited.saved(tmp_path / "b.toml")
    assert edited.profile_path == tmp_path / "b.toml" and not edited.dirty


def test_a_validation_asked_for_while_one_runs_runs_once_more_after_it() -> None:
    edited = EditedConfig()
    heard: list[list[ValidationIssue]] = []
    edited.validated.connect(heard.append)
    assert edited.begin_validation()
    assert not edited.begin_validation() and not edited.begin_validation()  # kept, once
    error = ValidationIssue(field="engine.model", message="no such model", severity="error")
    warning = ValidationIssue(field="max_num_seqs", message="large", severity="warning")
    assert edited.finish_validation([error, warning]) is True
    assert edited.errors == [error] and heard == [[error, warning]]
    assert edited.begin_validation() and edited.finish_validation([]) is False
    assert edited.errors == []
    assert edited.begin_validation()
    edited.validation_failed()
    assert edited.begin_validation()


def test_a_listener_that_disconnects_is_not_called_again() -> None:
    listeners: Listeners[int] = Listeners()
    heard: list[int] = []
    disconnect = listeners.connect(heard.append)
    listeners.emit(1)
    disconnect()
    listeners.emit(2)
    assert heard == [1] and len(listeners) == 0


def test_the_profile_keeps_its_campaigns_beside_the_edited_run(tmp_path: Path) -> None:
    from app.ladder.spec import LadderSpec, LadderStepSpec
    from app.profiles import load_profile_file, resolve_profile, save_profile

    path = resolve_profile("cpu-ladder")
    loaded = load_profile_file(path)
    edited = EditedConfig()
    edited.load(loaded.run, path, loaded.campaigns)
    assert edited.profile == loaded.model_copy(update={"notes": []}) and not edited.dirty
    assert edited.set("load.concurrency", 3) is None  # an edit of the run leaves the ladder alone
    assert edited.profile.ladder == loaded.ladder
    edited.set_ladder(LadderSpec(steps=[LadderStepSpec(name="only")]))
    assert edited.dirty and [s.name for s in edited.campaigns.ladder.steps] == ["only"]  # type: ignore[union-attr]
    save_profile(edited.config, tmp_path / "p.toml", edited.campaigns.ladder)
    again = load_profile_file(tmp_path / "p.toml")
    assert again.run == edited.config and again.ladder == edited.campaigns.ladder
