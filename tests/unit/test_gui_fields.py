"""Editors are derived from the pydantic models, and availability from the adapter (no Qt)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import RunConfig
from app.gui.availability import compute_availability, judge_here
from app.gui.fields import field_spec, get_path, humanize, with_value
from app.workload import LoadPattern
from engine_adapters.config import Features
from engine_adapters.features import FEATURES
from engine_adapters.hardware import GpuInfo, HardwareInfo

_SCHEMA_KINDS = {"boolean": "bool", "integer": "int", "number": "float", "string": "text", "array": "list"}


def _schema_editor(path: str) -> tuple[str, bool, tuple[str, ...], float | None, float | None]:
    """What pydantic's own JSON schema says a field is: (editor kind, optional, choices, minimum,
    maximum). An oracle independent of ``field_spec``'s reading of the type annotations."""
    schema = RunConfig.model_json_schema()
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    variants = node.get("anyOf", [node])
    optional = any(v.get("type") == "null" for v in variants)
    (inner,) = [v for v in variants if v.get("type") != "null"]
    if "enum" in inner:
        return "choice", optional, tuple(str(v) for v in inner["enum"]), None, None
    kind = _SCHEMA_KINDS[inner["type"]]
    if kind == "bool" and optional:
        kind = "tristate"  # "engine default" is a third state a checkbox must show
    low = inner.get("minimum", inner.get("exclusiveMinimum"))
    return kind, optional, (), low, inner.get("maximum", inner.get("exclusiveMaximum"))


def test_every_catalogue_feature_gets_the_editor_its_type_needs() -> None:
    """Each feature's editor agrees with pydantic's schema of the field: a tristate where "engine
    default" (None) is allowed, every accepted choice offered, the same bounds. The editor can
    set each choice and the default, and the model takes them."""
    config = RunConfig()
    for info in FEATURES:
        path = f"features.{info.key}"
        spec = field_spec(path)
        kind, optional, choices, low, high = _schema_editor(path)
        assert (spec.kind, spec.optional, spec.choices) == (kind, optional, choices), path
        assert (spec.minimum, spec.maximum) == (low, high), path
        assert spec.default == get_path(config, path), path
        for value in [*spec.choices, *([None] if spec.optional else [])]:
            assert get_path(with_value(config, path, value), path) == value, (path, value)


def test_field_kinds_follow_the_types() -> None:
    assert field_spec("features.weights_dtype").choices == ("auto", "bf16", "fp16", "fp8", "awq", "gptq", "q8_0", "q4_0")
    assert field_spec("features.prefix_caching").kind == "tristate"
    assert field_spec("features.cuda_graphs").kind == "bool"
    spec = field_spec("features.max_model_len")
    assert (spec.kind, spec.optional, spec.minimum) == ("int", True, 16)
    assert field_spec("features.kv_offload_backend").kind == "choice"
    assert field_spec("features.kv_offload_backend").optional
    assert field_spec("features.extra_args").kind == "list"
    assert field_spec("load.levels").item_type == "float"
    assert field_spec("workload.shared_prefix_fraction").maximum == 1.0
    assert humanize("request_timeout_s") == "Request timeout (s)"


def test_the_load_pattern_editor_offers_every_pattern_and_each_can_be_chosen() -> None:
    spec = field_spec("load.pattern")
    assert (spec.kind, spec.optional, spec.choices) == _schema_editor("load.pattern")[:3]
    assert spec.choices == tuple(pattern.value for pattern in LoadPattern)
    config = RunConfig()
    assert spec.default == get_path(config, "load.pattern")
    needs = {LoadPattern.TRACE: {"workload": {"kind": "trace", "dataset_path": "trace.jsonl"}}}
    for choice in spec.choices:
        pattern = LoadPattern(choice)
        data = {"load": {"pattern": choice, **({"rate_rps": 2.0} if pattern.takes_rate else {}),
                         **({"levels": [1.0]} if pattern.takes_levels else {})}, **needs.get(pattern, {})}
        assert get_path(RunConfig.model_validate(data), "load.pattern") is pattern


def test_with_value_validates_and_never_mutates() -> None:
    config = RunConfig()
    changed = with_value(config, "features.prefix_caching", True)
    assert changed.features.prefix_caching is True and config.features.prefix_caching is None
    assert get_path(changed, "features.speculative.method") == "off"
    with pytest.raises(ValidationError):
        with_value(config, "features.max_model_len", 3)
    with pytest.raises(ValidationError):
        with_value(config, "features.speculative.ngram_prompt_lookup_min", 10)  # > max (4)


def _hardware(gpus: list[GpuInfo], flags: list[str] | None = None) -> HardwareInfo:
    return HardwareInfo(gpus=gpus, cpu_flags=flags or [], nvml_error=None if gpus else "no NVIDIA GPU")


def test_without_a_gpu_gpu_only_features_are_disabled_with_the_reason() -> None:
    availability = compute_availability(RunConfig(), _hardware([]), None)
    assert "NVIDIA GPU" in availability.disabled["features.cuda_graphs"]
    assert "features.tensor_parallel_size" in availability.disabled
    assert "features.prefix_caching" not in availability.disabled


def test_cpu_without_avx512_cannot_pick_an_fp8_kv_cache() -> None:
    availability = compute_availability(RunConfig(), _hardware([], ["avx2"]), None)
    assert "AVX-512" in availability.disabled_choices["features.kv_cache_dtype"]["fp8"]
    with_avx512 = compute_availability(RunConfig(), _hardware([], ["avx512f"]), None)
    assert "fp8" not in with_avx512.disabled_choices.get("features.kv_cache_dtype", {})


def test_a_gpu_without_fp8_disables_only_the_fp8_weights() -> None:
    config = RunConfig.model_validate({"engine": {"runtime": {"kind": "executable", "executable": "vllm"}}})
    a100 = GpuInfo(index=0, name="A100", compute_capability=(8, 0))
    availability = compute_availability(config, _hardware([a100]), None)
    assert "features.cuda_graphs" not in availability.disabled
    assert "8.9" in availability.disabled_choices["features.weights_dtype"]["fp8"]
    assert "bf16" not in availability.disabled_choices["features.weights_dtype"]
    assert "needs" in availability.disabled["features.tensor_parallel_size"]  # one GPU only
    h100s = [GpuInfo(index=i, name="H100", compute_capability=(9, 0)) for i in range(2)]
    assert "features.tensor_parallel_size" not in compute_availability(config, _hardware(h100s), None).disabled


def test_8_bit_gguf_weights_need_no_fp8_gpu_and_fp8_weights_still_do() -> None:
    """The FP8 capability of weight precision applies to an FP8 value only: llama.cpp's Q8_0
    runs on this CPU, vLLM's FP8 weights still need an FP8 GPU."""
    llamacpp = RunConfig.model_validate({"engine": {"kind": "llamacpp", "runtime": {"managed": "llamacpp-cpu"}},
                                         "features": {"weights_dtype": "q8_0"}})
    assert [i for i in judge_here(llamacpp, _hardware([]), []) if i.field == "weights_dtype"] == []
    fp8 = RunConfig.model_validate({"features": {"weights_dtype": "fp8"}})
    found = [i for i in judge_here(fp8, _hardware([]), []) if i.field == "weights_dtype"]
    assert [i.severity for i in found] == ["error"] and "FP8" in found[0].message


def test_availability_judges_toggles_from_defaults_not_the_current_setting() -> None:
    config = RunConfig(features=Features(kv_cache_dtype="fp8"))
    availability = compute_availability(config, _hardware([], ["avx2"]), None)
    assert "fp8" in availability.disabled_choices["features.kv_cache_dtype"]


def test_a_flag_the_installed_version_lacks_disables_the_toggle_naming_the_version() -> None:
    from engine_adapters.base import FlagSet
    from engine_adapters.vllm import feature_flags, flag_names

    every_flag = sorted({f for toks in feature_flags(Features(prefix_caching=True, max_num_seqs=4)).values()
                         for f in flag_names(toks)} | {"--no-enable-prefix-caching", "--enable-chunked-prefill",
                                                       "--no-enable-chunked-prefill", "--max-model-len"})
    old = FlagSet(engine="vllm", version="0.4.0",
                  flags=[f for f in every_flag if "prefix-caching" not in f])
    availability = compute_availability(RunConfig(), _hardware([], ["avx512f"]), old)
    assert "0.4.0" in availability.disabled["features.prefix_caching"]
    assert "features.chunked_prefill" not in availability.disabled
    assert availability.engine_version == "0.4.0"
