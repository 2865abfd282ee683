"""The run configuration being edited, without Qt: the workbench's configuration panel, its
validation and its profile files all work on one :class:`EditedConfig`, which a test drives
headless.

It holds the last valid :class:`RunConfig`, a draft for edits that only break a rule tying
fields together, the adapter's validation issues, the profile file it came from and whether it
was edited since. Subscribers hear of each change through plain callbacks
(:class:`app.listeners.Listeners`); the GUI re-emits them as a Qt signal
(``app.gui.config_state.ConfigState``). The tables of which settings exist and when each applies
are here too: they are rules about the configuration, not layout.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from app.config import RunConfig
from app.labels import in_field_words
from app.ladder.spec import LadderSpec
from app.listeners import Listeners
from app.profiles import Campaigns, Profile
from app.workload import FILE_KINDS, LoadConfig, LoadPattern, WorkloadConfig
from engine_adapters.base import ValidationIssue
from engine_adapters.config import ON_PANEL, PANEL_RANK, EngineConfig
from engine_adapters.features import FEATURES


def editable_paths(model: type[BaseModel], prefix: str) -> tuple[str, ...]:
    """The settings of one model the panel edits, as dotted paths under ``prefix``, in the order its
    rows go: its leaf fields, nested models walked, ordered and left out as the models' fields say
    (``engine_adapters.config.panel_row`` and ``not_on_panel``)."""
    rows: list[tuple[float, tuple[int, ...], str]] = []

    def walk(cls: type[BaseModel], path: str, positions: tuple[int, ...], inherited_rank: float) -> None:
        for position, (name, info) in enumerate(cls.model_fields.items()):
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get(ON_PANEL) is False:
                continue
            own_rank = extra.get(PANEL_RANK)
            rank = own_rank if isinstance(own_rank, int) else inherited_rank
            inner = info.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                walk(inner, f"{path}.{name}", (*positions, position), rank)
            else:
                rows.append((rank, (*positions, position), f"{path}.{name}"))

    walk(model, prefix, (), math.inf)
    return tuple(path for _, _, path in sorted(rows))


ENGINE_FIELDS = editable_paths(EngineConfig, "engine")
WORKLOAD_FIELDS = editable_paths(WorkloadConfig, "workload")
LOAD_FIELDS = editable_paths(LoadConfig, "load")
"""The rows of the panel's engine, workload and load groups."""
COMPANIONS: dict[str, tuple[str, ...]] = {
    "kv_offload_gib": ("kv_offload_backend",),
    "speculative.ngram_prompt_lookup_max": ("speculative.ngram_prompt_lookup_min",),
}
"""Fields the feature catalogue does not describe, edited next to the feature they qualify."""
ALL_PATHS: tuple[str, ...] = (*ENGINE_FIELDS, *WORKLOAD_FIELDS, *LOAD_FIELDS,
                              *(f"features.{info.key}" for info in FEATURES), "features.kv_offload_backend",
                              "features.speculative.ngram_prompt_lookup_min")
"""Every editable setting: the words a message about one of them is put in."""

TRACE = ("trace",)
SPEC_ON = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
Condition = tuple[str, Callable[[Any], bool]]


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def _pattern_reads(setting: str) -> Condition:
    """The load setting applies while the pattern reads it (a rate does not in a closed loop)."""
    return "load.pattern", lambda pattern: setting in LoadPattern(pattern).settings


APPLIES_WHEN: dict[str, Condition] = {
    "engine.runtime.managed": ("engine.runtime.kind", _one_of("managed")),
    "engine.runtime.python": ("engine.runtime.kind", _one_of("python")),
    "engine.runtime.executable": ("engine.runtime.kind", _one_of("executable")),
    "engine.runtime.docker_image": ("engine.runtime.kind", _one_of("docker")),
    "workload.dataset_path": ("workload.kind", _one_of(*FILE_KINDS)),
    # A trace gives every request's lengths: the generated ones' settings do not apply.
    "workload.input_len.mean": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.output_len.mean": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.input_len.distribution": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.output_len.distribution": ("workload.kind", lambda kind: kind not in TRACE),
    "workload.trace_format": ("workload.kind", _one_of(*TRACE)),
    "workload.trace_start_s": ("workload.kind", _one_of(*TRACE)),
    "workload.trace_end_s": ("workload.kind", _one_of(*TRACE)),
    "workload.trace_block_tokens": ("workload.kind", _one_of(*TRACE)),
    "workload.shared_prefix_tokens": ("workload.kind", _one_of("shared_prefix", "multi_turn", "random")),
    "workload.shared_prefix_fraction": ("workload.kind", _one_of("shared_prefix", "multi_turn", "random")),
    "workload.input_len.spread": ("workload.input_len.distribution", _one_of("uniform", "normal")),
    "workload.output_len.spread": ("workload.output_len.distribution", _one_of("uniform", "normal")),
    "workload.turns": ("workload.kind", _one_of("multi_turn")),
    **{f"load.{setting}": _pattern_reads(setting) for pattern in LoadPattern for setting in pattern.settings},
    # Speculative decoding's own settings only while it is on, and only those its method reads.
    "features.speculative.num_speculative_tokens": ("features.speculative.method", _one_of(*SPEC_ON)),
    "features.speculative.draft_model": ("features.speculative.method", _one_of("eagle", "eagle3", "draft_model")),
    "features.speculative.ngram_prompt_lookup_max": ("features.speculative.method", _one_of("ngram")),
    "features.speculative.ngram_prompt_lookup_min": ("features.speculative.method", _one_of("ngram")),
    "features.kv_offload_backend": ("features.kv_offload_gib", lambda gib: bool(gib)),
}
"""A setting that applies only while another has one of some values (hidden otherwise)."""


def issue_path(issue: ValidationIssue) -> str:
    """Adapter issues name Features paths (``speculative.draft_model``) or ``engine.*``."""
    return issue.field if issue.field.startswith(("engine", "workload", "load")) else f"features.{issue.field}"


def _dict_get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def _ctx_number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def error_text(error: Mapping[str, Any], paths: tuple[str, ...] | list[str] = ()) -> str:
    """One pydantic error in the words of the field it concerns: ``must be at least 1``,
    ``load pattern 'poisson' needs Rate (req/s)``."""
    kind, ctx = error.get("type", ""), error.get("ctx") or {}
    words = {
        "greater_than_equal": lambda: f"must be at least {_ctx_number(ctx.get('ge'))}",
        "greater_than": lambda: f"must be more than {_ctx_number(ctx.get('gt'))}",
        "less_than_equal": lambda: f"must be at most {_ctx_number(ctx.get('le'))}",
        "less_than": lambda: f"must be less than {_ctx_number(ctx.get('lt'))}",
        "string_too_short": lambda: f"must have at least {ctx.get('min_length', 1)} character(s)",
        "too_long": lambda: f"must have at most {_ctx_number(ctx.get('max_length'))} entries",
        "finite_number": lambda: "must be a finite number",
    }
    text = words[kind]() if kind in words else str(error.get("msg", "")).removeprefix("Value error, ")
    return in_field_words(text, paths)


def _messages(exc: ValidationError) -> str:
    return "; ".join(error_text(e, ALL_PATHS) for e in exc.errors())


class EditedConfig:
    """The RunConfig being edited. ``changed(path)`` is called after every accepted edit ("" =
    all replaced); ``validated(issues)`` after each validation.

    Rules that tie fields together (a sweep needs levels, a Poisson load a rate) would make some
    changes impossible one field at a time, so an edit that only breaks such a rule is kept as a
    *draft*: the editor shows it with the message, ``config`` stays the last valid one, and the
    draft becomes the config as soon as the other fields make it valid. A value that is wrong in
    itself (out of range) is refused outright.
    """

    def __init__(self, config: RunConfig | None = None, profile_path: Path | None = None,
                 campaigns: Campaigns | None = None) -> None:
        self._config = config or RunConfig()
        self.campaigns = campaigns or Campaigns()
        """The campaigns the profile defines over its run (its ladder), saved with it."""
        self._draft: dict[str, Any] = self._config.model_dump()
        self.pending: str | None = None  # why the draft is not a valid configuration yet
        self.profile_path = profile_path
        self.dirty = False
        """Edited since it was loaded or saved (a profile file no longer says what is edited)."""
        self.issues: list[ValidationIssue] = []
        self._validation_running = False
        self._validation_pending = False
        self.changed: Listeners[str] = Listeners()
        self.validated: Listeners[list[ValidationIssue]] = Listeners()

    @property
    def config(self) -> RunConfig:
        return self._config

    def draft_value(self, path: str) -> Any:
        return _dict_get(self._draft, path)

    def applies(self, path: str) -> bool:
        """Whether the setting applies to the draft (a rate does not in a closed loop)."""
        condition = APPLIES_WHEN.get(path)
        if condition is None:
            return True
        other, wanted = condition
        return bool(wanted(self.draft_value(other)))

    def replace(self, config: RunConfig) -> None:
        self._config = config
        self._draft = config.model_dump()
        self.pending = None
        self.dirty = True
        self.changed.emit("")

    @property
    def profile(self) -> Profile:
        """What a profile file of the edited configuration holds."""
        return Profile(run=self._config, campaigns=self.campaigns)

    def load(self, config: RunConfig, profile_path: Path, campaigns: Campaigns | None = None) -> None:
        """A profile file opened: its run and its campaigns, not edited since."""
        self.profile_path = profile_path
        self.campaigns = campaigns or Campaigns()
        self.replace(config)
        self.dirty = False

    def set_ladder(self, spec: LadderSpec | None) -> None:
        """The profile's ladder edited (the Ladder tab): saved with the profile."""
        self.campaigns = self.campaigns.model_copy(update={"ladder": spec})
        self.dirty = True

    def saved(self, profile_path: Path) -> None:
        self.profile_path = profile_path
        self.dirty = False

    def set(self, path: str, value: Any) -> str | None:
        """Apply one edit; returns a one-line message when it is refused or left as a draft."""
        if self.draft_value(path) == value and self.pending is None:
            return None
        draft = copy.deepcopy(self._draft)
        node = draft
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
        try:
            config = RunConfig.model_validate(draft)
        except ValidationError as exc:
            message = _messages(exc)
            if any(".".join(str(p) for p in e["loc"]) == path for e in exc.errors()):
                return message  # the value itself is wrong: refused
            self._draft, self.pending = draft, message
            return message
        self._config, self._draft, self.pending = config, config.model_dump(), None
        self.dirty = True
        self.changed.emit(path)
        return None

    # -- validation (the adapter's, run elsewhere: it may take a while) ---------------------------

    @property
    def errors(self) -> list[ValidationIssue]:
        """The last validation's issues that block a start."""
        return [i for i in self.issues if i.severity == "error"]

    def begin_validation(self) -> bool:
        """Whether to validate now; a request while one runs is kept for when it ends."""
        if self._validation_running:
            self._validation_pending = True
            return False
        self._validation_running = True
        return True

    def finish_validation(self, issues: list[ValidationIssue]) -> bool:
        """Keep a validation's issues; returns whether a request came meanwhile (validate again)."""
        self._validation_running = False
        self.issues = list(issues)
        self.validated.emit(self.issues)
        again, self._validation_pending = self._validation_pending, False
        return again

    def validation_failed(self) -> None:
        self._validation_running = False
