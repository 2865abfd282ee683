"""The ``[campaigns.ladder]`` table of a profile: named steps, each a change to the previous one
(features, load, or the checkpoint), all on one shared-prefix workload; the default order after
the seeds; and how a step's change is applied to the previous step's configuration. Its TOML
shape, with every key, is in docs/ladder.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from app.analysis.compare import flatten
from app.config import RunConfig
from app.errors import UserError
from app.workload import LoadConfig, WorkloadConfig
from engine_adapters.config import GGUF_WEIGHT_BITS, GGUF_WEIGHTS_ENGINE, ArgStr, Features, StrictModel

MAX_STEPS = 32
MAX_REPEATS = 10


class LadderError(UserError):
    """A ladder that cannot be built: names the step and the problem in one line."""


def deep_merge(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``change`` applied: nested tables merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in change.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _partial_problems(model: type[BaseModel], partial: Mapping[str, Any]) -> list[str]:
    """Unknown keys and badly typed values of a partial table, judged against the model's
    defaults. Cross-field rules (a pattern that needs a rate) are left to the built step, where
    the previous step's values are known."""
    try:
        model.model_validate(deep_merge(model().model_dump(), partial))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = err["loc"]
            if loc and loc[0] in partial:  # a field's own rule; model-level rules have no such loc
                problems.append(f"{'.'.join(str(p) for p in loc)}: {err['msg']}")
        return problems
    return []


_PARTIAL_OF: dict[str, type[BaseModel]] = {"features": Features, "load": LoadConfig}
"""The full model each partial table of a step is judged against."""


class LadderStepSpec(StrictModel):
    """One step: a named change to the previous step."""

    name: str = Field(min_length=1, max_length=120)
    note: str = Field("", description="What this step should buy, and why (shown with the step).")
    model: ArgStr | None = Field(None, min_length=1, description="Another checkpoint from this step on "
                                                                 "(e.g. the FP8 checkpoint for '+ FP8 weights').")
    features: dict[str, Any] = Field(default_factory=dict, description="Features changed (a partial [features]).")
    load: dict[str, Any] = Field(default_factory=dict, description="Load changed (a partial [load]).")
    concurrency_from_kv: bool = Field(False, description="Scale the concurrency by the KV bytes the step frees "
                                                         "(a 16-bit to FP8 KV cache holds twice the sequences).")
    seed_row: int | None = Field(None, ge=0, description="Row of the seeds' stacking table shown as the reference.")

    @field_validator("features", "load")
    @classmethod
    def _partial_known(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """A partial table names only what its full model has, with values it accepts."""
        problems = _partial_problems(_PARTIAL_OF[str(info.field_name)], value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("seed_row")
    @classmethod
    def _seed_row_exists(cls, value: int | None) -> int | None:
        if value is not None:
            from app.planner.seeds import SEED_ROWS  # lazily: the planner imports app.config

            if value >= len(SEED_ROWS):
                raise ValueError(f"the seeds' table has rows 0 to {len(SEED_ROWS) - 1}")
        return value

    def changes_engine(self) -> bool:
        """Whether the step changes what the engine is launched with (so it restarts)."""
        return bool(self.features) or self.model is not None


class LadderSpec(StrictModel):
    """A profile's ladder (see the module docstring for the TOML shape)."""

    name: str = ""
    description: str = ""
    gpu: str | None = Field(None, description="The GPU the ladder is written for (a spec-table name, e.g. 'H100'): "
                                              "steps are checked and planned for it on a machine without a GPU.")
    reference: Literal["seeds"] | None = Field(None, description="Show the seeds' figures beside the measured "
                                                                 "ones where the model and GPU match.")
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    workload: WorkloadConfig | None = None
    load: LoadConfig | None = None
    steps: list[LadderStepSpec] = Field(min_length=1, max_length=MAX_STEPS)

    @field_validator("workload")
    @classmethod
    def _shared_prefix(cls, value: WorkloadConfig | None) -> WorkloadConfig | None:
        if value is not None:
            shared_prefix_problem(value, "ladder.workload")
        return value

    @model_validator(mode="after")
    def _names_unique(self) -> LadderSpec:
        seen: set[str] = set()
        for step in self.steps:
            if step.name in seen:
                raise ValueError(f"two steps are named '{step.name}': each step needs its own name")
            seen.add(step.name)
        return self


def shared_prefix_problem(workload: WorkloadConfig, where: str = "workload") -> None:
    """A ladder measures every step on one shared-prefix workload, so that the prefix-caching step
    has something to reuse; anything else is refused with why."""
    if workload.kind != "shared_prefix":
        raise ValueError(f"{where}: a ladder needs a shared-prefix workload (kind = \"shared_prefix\", got "
                         f"'{workload.kind}'), so that the prefix-caching step has something to reuse")


# --- building steps -----------------------------------------------------------------------------

def ladder_base(config: RunConfig, spec: LadderSpec) -> RunConfig:
    """The configuration the first step changes: the profile's, with the ladder's own workload
    and load when it has them, every level on a cold prefix cache."""
    workload = (spec.workload or config.workload).model_copy(update={"cache": "cold"})
    try:
        shared_prefix_problem(workload)
    except ValueError as exc:
        raise LadderError(str(exc)) from None
    load = spec.load or config.load
    if load.pattern.takes_levels:
        raise LadderError("load: a ladder step is one load level; a sweep is not (set [campaigns.ladder.load] to a closed "
                          "or open-loop load)")
    return config.model_copy(update={"workload": workload, "load": load})


KV_BYTES = {"auto": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}
"""Bytes per KV element by ``kv_cache_dtype`` (auto: the model's 16-bit dtype)."""


def apply_step(previous: RunConfig, step: LadderStepSpec, *, name: str | None = None,
               tags: list[str] | None = None) -> RunConfig:
    """The configuration of ``step``: ``previous`` with the step's change applied (features and
    load merged, the checkpoint replaced), validated as a whole; a LadderError names the step."""
    data = previous.model_dump(mode="json", exclude_none=True)
    data["features"] = deep_merge(data["features"], step.features)
    data["load"] = deep_merge(data["load"], step.load)
    if step.model is not None:
        data["engine"]["model"] = step.model
    if name is not None:
        data["name"] = name
    if tags is not None:
        data["tags"] = tags
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "configuration"
        raise LadderError(f"step '{step.name}': {where}: {first['msg']}") from None
    if step.concurrency_from_kv and "concurrency" not in step.load:
        before = KV_BYTES.get(previous.features.kv_cache_dtype, 2.0)
        after = KV_BYTES.get(config.features.kv_cache_dtype, 2.0)
        wanted = max(1, round(previous.load.concurrency * before / after))
        if config.features.max_num_seqs is not None:
            wanted = min(wanted, config.features.max_num_seqs)
        config = config.model_copy(update={"load": config.load.model_copy(update={"concurrency": wanted})})
    if config.load.pattern.takes_levels:
        raise LadderError(f"step '{step.name}': a ladder step is one load level, not a sweep")
    return config


# --- what changed -------------------------------------------------------------------------------

def setting_label(key: str) -> str:
    """A setting as a person reads it: the feature catalogue's label, or the load field's name."""
    from engine_adapters.features import FEATURES_BY_KEY

    section, _, rest = key.partition(".")
    if section == "features" and rest in FEATURES_BY_KEY:
        return FEATURES_BY_KEY[rest].label
    if key == "engine.model":
        return "model"
    return rest.replace("_", " ") if section in ("features", "load") else key


def config_diff(previous: RunConfig | None, config: RunConfig) -> list[tuple[str, Any, Any]]:
    """``(key, before, after)`` for each engine, feature and load setting that differs (all of
    them against None for the first step): the step's change, in full."""
    def settings(c: RunConfig | None) -> dict[str, Any]:
        if c is None:
            return {}
        dumped = c.model_dump(mode="json")
        out = {"engine.model": dumped["engine"]["model"]}
        out.update(flatten(dumped["features"], "features"))
        out.update(flatten(dumped["load"], "load"))
        return out

    before, after = settings(previous), settings(config)
    keys = sorted(set(before) | set(after))
    return [(k, before.get(k), after.get(k)) for k in keys
            if json.dumps(before.get(k), sort_keys=True) != json.dumps(after.get(k), sort_keys=True)]


def _shown(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def describe_change(diff: list[tuple[str, Any, Any]], *, limit: int = 4) -> str:
    """One line: ``concurrency 1 → 16; prefix caching off → on``."""
    parts = [f"{setting_label(k)} {_shown(a)} \u2192 {_shown(b)}" for k, a, b in diff]
    if len(parts) > limit:
        parts = [*parts[:limit], f"{len(parts) - limit} more"]
    return "; ".join(parts) or "no change"


# --- the default order --------------------------------------------------------------------------

def weight_steps(config: RunConfig) -> list[LadderStepSpec]:
    """The weight-precision steps: FP8, or on llama.cpp its GGUF types finest first (16-bit ->
    8-bit -> 4-bit, as the seeds' precision rows), each made here from the 16-bit GGUF."""
    if config.engine.kind != GGUF_WEIGHTS_ENGINE:
        return [LadderStepSpec(name="+ FP8 weights", note="half the bytes read per decoding step",
                               features={"weights_dtype": "fp8"})]
    return [LadderStepSpec(name=f"+ {dtype.upper()} weights",
                           note=f"{bits:g} bits per weight instead of 16: fewer bytes read per decoding step",
                           features={"weights_dtype": dtype})
            for dtype, bits in sorted(GGUF_WEIGHT_BITS.items(), key=lambda item: -item[1])]


def default_ladder(config: RunConfig) -> LadderSpec:
    """The seeds' order for any profile: baseline (nothing cached, one request at a time) ->
    FP8 weights (on llama.cpp: 8-bit, then 4-bit GGUF weights) -> continuous batching -> FP8 KV
    cache (the concurrency the freed KV memory allows) -> prefix caching -> speculative decoding
    (the profile's method, or n-gram, which needs no draft model). Steps this machine cannot run
    are skipped when the ladder runs."""
    spec = config.features.speculative
    speculative: dict[str, Any] = ({"method": "ngram", "num_speculative_tokens": 3} if spec.method == "off"
                                   else spec.model_dump(mode="json", exclude_none=True))
    batch = config.load.concurrency if config.load.concurrency > 1 else 16
    return LadderSpec(name=f"{config.name}: acceleration ladder", steps=[
        LadderStepSpec(name="baseline", note="a plain engine: one request at a time, no prefix cache",
                       features={"prefix_caching": False, "kv_cache_dtype": "auto",
                                 "speculative": {"method": "off"}},
                       load={"pattern": "closed", "concurrency": 1}),
        *weight_steps(config),
        LadderStepSpec(name="+ continuous batching", note="one read of the weights serves many sequences",
                       load={"concurrency": batch}),
        LadderStepSpec(name="+ FP8 KV cache", note="twice the tokens in the same KV memory",
                       features={"kv_cache_dtype": "fp8"}, concurrency_from_kv=True),
        LadderStepSpec(name="+ prefix caching", note="the shared prefix is computed once and reused",
                       features={"prefix_caching": True}),
        LadderStepSpec(name="+ speculative decoding", note="idle compute drafts tokens the model verifies in one pass",
                       features={"speculative": speculative}),
    ])


def scale_out_steps(config: RunConfig, *, prefill_instances: int = 1, decode_instances: int = 1,
                    expert_parallel_size: int | None = None) -> list[LadderStepSpec]:
    """The steps a ladder may end with, past one engine: "+ disaggregated prefill/decode" (NIXL,
    the pools' sizes), then "+ EP" for a mixture-of-experts model (its routed experts spread over
    ``expert_parallel_size`` GPUs). Each step's GPUs count in the staircase, which compares per
    GPU as well as in total."""
    steps = [LadderStepSpec(
        name="+ disaggregated prefill/decode",
        note="prefill and decode on separate engines, the KV moved between them: no prompt stalls a decode step",
        features={"disaggregation": {"connector": "nixl", "prefill_instances": prefill_instances,
                                     "decode_instances": decode_instances}})]
    if expert_parallel_size:
        steps.append(LadderStepSpec(
            name="+ EP", note="the routed experts spread whole over the GPUs: each reads only its own per step",
            features={"expert_parallel_size": expert_parallel_size,
                      "tensor_parallel_size": max(config.features.tensor_parallel_size, expert_parallel_size)}))
    return steps


def ladder_of(spec: LadderSpec | None, config: RunConfig) -> tuple[LadderSpec, bool]:
    """A profile's ladder, or the default order over its run (second value: whether it is the
    default)."""
    if spec is not None:
        return spec, False
    return default_ladder(config), True
