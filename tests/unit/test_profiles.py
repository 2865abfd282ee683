"""Profiles: TOML round-trips exactly, shipped profiles load, corrupt files give one-line
messages; argv built from any valid configuration reaches the engine verbatim (no shell)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import RunConfig
from app.profiles import (
    ProfileError,
    load_profile,
    profile_from_toml,
    profile_to_toml,
    resolve_profile,
    save_profile,
    shipped_profiles,
)
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.launcher import EngineProcess

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)
# Shell syntax that only leaves a marker if a shell ever runs it: a regression must fail the test,
# never harm the machine it runs on.
SHELL_MARKER = "/tmp/tunebench-shell-ran"
hostile = st.sampled_from(["my model", "it's", 'say "hi"', f"$(touch {SHELL_MARKER})", f"`touch {SHELL_MARKER}`",
                           "a;b|c&d", "line\nbreak", "*?[x]", "$HOME", "--flag=value with space", "tab\there", "ünïcödé"])
maybe = lambda s: st.none() | s  # noqa: E731
finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def speculative(draw: st.DrawFn) -> SpeculativeConfig:
    low = draw(st.integers(1, 8))
    return SpeculativeConfig(
        method=draw(st.sampled_from(["off", "ngram", "eagle", "eagle3", "mtp", "draft_model"])),
        draft_model=draw(maybe(text | hostile)),
        num_speculative_tokens=draw(st.integers(1, 16)),
        ngram_prompt_lookup_min=low,
        ngram_prompt_lookup_max=draw(st.integers(low, 32)),
    )


@st.composite
def features(draw: st.DrawFn) -> Features:
    return Features(
        weights_dtype=draw(st.sampled_from(["auto", "bf16", "fp16", "fp8", "awq", "gptq"])),
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])),
        prefix_caching=draw(maybe(st.booleans())),
        speculative=draw(speculative()),
        cpu_offload_gib=draw(finite),
        kv_offload_gib=draw(finite),
        kv_offload_backend=draw(maybe(st.sampled_from(["native", "lmcache"]))),
        gpu_memory_utilization=draw(maybe(st.floats(0.01, 1.0))),
        max_num_seqs=draw(maybe(st.integers(1, 4096))),
        max_num_batched_tokens=draw(maybe(st.integers(1, 1 << 20))),
        max_model_len=draw(maybe(st.integers(16, 1 << 20))),
        cuda_graphs=draw(st.booleans()),
        chunked_prefill=draw(maybe(st.booleans())),
        tensor_parallel_size=draw(st.integers(1, 8)),
        pipeline_parallel_size=draw(st.integers(1, 4)),
        extra_args=draw(st.lists(text | hostile, max_size=4)),
    )


lengths = st.builds(LengthSpec, distribution=st.sampled_from(["fixed", "uniform", "normal"]),
                    mean=st.integers(1, 1 << 16), spread=st.integers(0, 4096), minimum=st.integers(1, 64),
                    maximum=maybe(st.integers(64, 1 << 17)))


@st.composite
def workloads(draw: st.DrawFn) -> WorkloadConfig:
    kind = draw(st.sampled_from(["random", "shared_prefix", "multi_turn", "long_context", "code", "sharegpt", "jsonl"]))
    return WorkloadConfig(
        kind=kind, seed=draw(st.integers(0, 2**31)), num_requests=draw(st.integers(1, 900)),  # x 16 turns x 65,536 < 1e9 tokens
        input_len=draw(lengths), output_len=draw(lengths),
        shared_prefix_tokens=draw(st.integers(1 if kind == "shared_prefix" else 0, 1 << 16)),
        shared_prefix_fraction=draw(st.floats(0, 1)), turns=draw(st.integers(1, 16)),
        dataset_path=draw(text | hostile) if kind in ("sharegpt", "jsonl") else draw(maybe(text | hostile)),
        api=draw(st.sampled_from(["completions", "chat"])), ignore_eos=draw(st.booleans()),
        temperature=draw(st.floats(0, 2)), model_name=draw(maybe(text | hostile)), tokenizer=draw(maybe(text | hostile)),
        cache=draw(st.sampled_from(["cold", "warm"])))


@st.composite
def loads(draw: st.DrawFn) -> LoadConfig:
    pattern = draw(st.sampled_from(["closed", "constant", "poisson", "gamma", "ramp", "sweep"]))
    sweep_of = draw(st.sampled_from(["concurrency", "rate"]))
    level = st.integers(1, 512).map(float) if sweep_of == "concurrency" else st.floats(0.01, 1e4)
    return LoadConfig(
        pattern=pattern, concurrency=draw(st.integers(1, 4096)),
        rate_rps=draw(st.floats(0.01, 1e4)) if pattern in ("constant", "poisson", "gamma", "ramp")
        else draw(maybe(st.floats(0.01, 1e4))),
        burstiness=draw(st.floats(0.05, 20)), ramp_start_rps=draw(st.floats(0.01, 100)),
        max_concurrency=draw(maybe(st.integers(1, 4096))),
        levels=draw(st.lists(level, min_size=1 if pattern == "sweep" else 0, max_size=6)), sweep_of=sweep_of,
        duration_s=draw(maybe(st.floats(0.1, 1e5))), max_requests=draw(maybe(st.integers(1, 1_000_000))),
        warmup_requests=draw(st.integers(0, 100)), max_error_fraction=draw(st.floats(0, 1)),
        request_timeout_s=draw(st.floats(0.1, 3600)),
        slo=draw(st.sampled_from([None, "ttft_ms<=500", "ttft_ms<=500,tpot_ms<=50", "e2e_ms<2000"])),
        workers=draw(st.integers(1, 64)), continuous_usage=draw(st.booleans()))


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    engine = EngineConfig(
        model=draw(hostile | text.filter(lambda s: s.strip() != "")),
        served_model_name=draw(maybe(text | hostile)),
        port=draw(st.integers(0, 65535)),
        runtime=RuntimeConfig(kind="python", python=draw(text | hostile), env=draw(st.dictionaries(
            st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), text, max_size=3))),
    )
    return RunConfig(name=draw(text), description=draw(st.text(max_size=80)), tags=draw(st.lists(text, max_size=3)),
                     engine=engine, features=draw(features()), workload=draw(workloads()), load=draw(loads()))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(run_configs())
def test_any_valid_config_round_trips_through_toml(config: RunConfig) -> None:
    assert profile_from_toml(profile_to_toml(config)) == config


@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(features(), hostile | text.filter(lambda s: s.strip() != ""))
def test_argv_reaches_the_process_verbatim(tmp_path_factory: pytest.TempPathFactory, feats: Features, model: str) -> None:
    """The launcher starts the engine from its argv with no shell: each element arrives as exactly
    one argument, uninterpreted. The "interpreter" here is a script that writes down its argv."""
    folder = tmp_path_factory.getbasetemp() / "argv-echo"
    folder.mkdir(exist_ok=True)
    interpreter, out = folder / "python", folder / "argv.json"
    interpreter.write_text(f"#!{sys.executable}\nimport json, pathlib, sys\nout = pathlib.Path({str(out)!r})\n"
                           "out.with_suffix('.tmp').write_text(json.dumps(sys.argv[1:]))\n"
                           "out.with_suffix('.tmp').replace(out)\n")  # whole or not at all
    interpreter.chmod(0o755)
    out.unlink(missing_ok=True)
    engine = EngineProcess(EngineConfig(model=model, runtime=RuntimeConfig(kind="python", python=str(interpreter))),
                           feats)
    engine.start()
    try:
        deadline = time.monotonic() + 15  # a Python start, even on a loaded machine
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        received = json.loads(out.read_text())
    finally:
        engine.stop()
    assert engine.argv is not None and engine.argv[0] == str(interpreter)
    assert received == engine.argv[1:]
    assert received[received.index("--model") + 1] == model
    assert not Path(SHELL_MARKER).exists(), "a shell interpreted the argv"


def test_shipped_profiles_load_and_round_trip() -> None:
    shipped = shipped_profiles()
    assert {"cpu-demo", "qwen3-27b-fp8-h100", "llama-70b-tp4"} <= set(shipped)
    for path in shipped.values():
        config = load_profile(path)
        assert profile_from_toml(profile_to_toml(config)) == config
    qwen = load_profile(shipped["qwen3-27b-fp8-h100"])
    assert (qwen.features.weights_dtype, qwen.features.kv_cache_dtype, qwen.features.speculative.method) == (
        "fp8", "fp8", "mtp")
    assert load_profile(shipped["llama-70b-tp4"]).features.tensor_parallel_size == 4


def test_save_then_load_is_exact(tmp_path: Path) -> None:
    config = load_profile(resolve_profile("cpu-demo"))
    config.features.max_num_seqs = 32
    path = save_profile(config, tmp_path / "mine.toml")
    assert load_profile(path) == config
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[engine\nmodel = 1", "not valid TOML"),
        ("[features]\nprefix_cache = true\n", "features.prefix_cache: Extra inputs are not permitted"),
        ("[features]\nweights_dtype = 'int3'\n", "features.weights_dtype: Input should be"),
        ("[engine]\nport = 70000\n", "engine.port: Input should be less than or equal to 65535"),
        ("[engine.runtime]\nkind = 'python'\n", "needs 'python' = path to the venv's interpreter"),
    ],
)
def test_corrupt_profile_gives_one_line_message(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(str(path)) and expected in message
    assert "\n" not in message.split(": ", 1)[1] or "TOML" in message


def test_missing_and_binary_profiles(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "nope.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(binary)
    with pytest.raises(ProfileError, match="shipped: cpu-demo"):
        resolve_profile("no-such-profile")


def test_nul_characters_are_refused_before_they_reach_argv() -> None:
    with pytest.raises(ValueError, match="must not contain a NUL character"):
        Features(extra_args=["ok", "bad\x00arg"])
    with pytest.raises(ProfileError, match="engine.model: Value error, must not contain a NUL"):
        profile_from_toml('[engine]\nmodel = "a\\u0000b"\n')
