"""The llama.cpp adapter: argv per feature, refusals with reasons (what the GUI greys), help
parsing and version gating, startup phases and KV capacity from a recorded log, verification
from recorded /metrics, diagnosis, the wheel's command line (llamacpp_serve.py) and the GGUF
converter's pure parts (tensor names, the q/k permutation checked against RoPE itself)."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine_adapters import llamacpp_serve as serve
from engine_adapters.base import FlagSet, Phase, match_phase
from engine_adapters.config import GGUF_WEIGHT_BITS, EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.cpu_binding import OMP_BIND_ENV
from engine_adapters.features import FEATURES
from engine_adapters.hardware import GpuInfo, HardwareInfo
from engine_adapters.llamacpp import (
    ADAPTER,
    PHASE_PATTERNS,
    feature_flags,
    flag_names,
    parse_help,
    parse_kv_cache,
    verify_weights_dtype,
)
from engine_adapters.llamacpp_gguf import (
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNUSED,
    gguf_tensor_name,
    permute_heads,
    vocab_from_tokenizer,
)
from engine_adapters.llamacpp_runtime import (
    ensure_quantized_gguf,
    gguf_demo_dir,
    gguf_demo_path,
    quantized_gguf_path,
)
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import RuntimeErrorMessage
from tests.feature_changes import every_feature_changed

DATA = Path(__file__).resolve().parent.parent / "data"
VERSION = "xllamacpp-2026.10.11549"
HELP_TEXT = (DATA / "llamacpp-xllamacpp-2026.10.11549-help.txt").read_text()
LOG = (DATA / "llamacpp-xllamacpp-2026.10.11549-log.txt").read_text().splitlines()
METRICS_BEFORE = (DATA / "llamacpp-xllamacpp-2026.10.11549-metrics-before.txt").read_text()
METRICS_AFTER = (DATA / "llamacpp-xllamacpp-2026.10.11549-metrics-after.txt").read_text()

# A llama-server --help excerpt in its own layout (b7xxx), beside the wheel runner's.
LLAMA_SERVER_HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
                                        (env: LLAMA_ARG_FLASH_ATTN)
-ctk,  --cache-type-k TYPE              KV cache data type for K
                                        allowed values: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1
                                        (default: f16)
--spec-type [none|ngram-cache|ngram-simple|ngram-map-k|ngram-map-k4v|ngram-mod]
                                        type of speculative decoding to use when no draft model is provided
"""


@pytest.fixture(scope="module")
def flags() -> FlagSet:
    return parse_help(HELP_TEXT, VERSION)


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def python_engine(tmp_path: Path, model: Path) -> EngineConfig:
    interpreter = tmp_path / "python"
    interpreter.write_text("")
    return EngineConfig(kind="llamacpp", model=str(model), runtime=RuntimeConfig(kind="python", python=str(interpreter)))


def managed_engine(model: Path) -> EngineConfig:
    return EngineConfig(kind="llamacpp", model=str(model), runtime=RuntimeConfig(managed="llamacpp-cpu"))


def errors(engine: EngineConfig, features: Features, flags: FlagSet | None = None,
           hardware: HardwareInfo | None = None) -> dict[str, str]:
    return {i.field: i.message for i in ADAPTER.validate(engine, features, flags, hardware) if i.severity == "error"}


# --- argv for every feature ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (Features(), []),
        (Features(kv_cache_dtype="q8_0"), ["-ctk", "q8_0", "-ctv", "q8_0"]),
        (Features(kv_cache_dtype="q4_0"), ["-ctk", "q4_0", "-ctv", "q4_0"]),
        (Features(kv_cache_dtype="fp8"), ["-ctk", "q8_0", "-ctv", "q8_0"]),  # its nearest type, with a warning
        (Features(prefix_caching=True), ["--cache-prompt"]),
        (Features(prefix_caching=False), ["--no-cache-prompt", "--cache-ram", "0"]),
        (Features(max_num_seqs=8), ["-np", "8"]),
        (Features(max_num_batched_tokens=256), ["-b", "256"]),
        (Features(max_model_len=1024), ["-c", "1024"]),
        (Features(max_model_len=1024, max_num_seqs=4), ["-np", "4", "-c", "4096"]),  # -c is all slots together
        (Features(gpu_layers=99), ["-ngl", "99"]),
        (Features(flash_attention=True), ["-fa", "on"]),
        (Features(flash_attention=False), ["-fa", "off"]),
        (Features(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4, ngram_prompt_lookup_min=2)),
         ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "4",
          "--spec-draft-n-max", "4"]),
        (Features(speculative=SpeculativeConfig(method="draft_model", draft_model="/d.gguf")),
         ["-md", "/d.gguf", "--spec-draft-n-max", "3"]),
        (Features(speculative=SpeculativeConfig(method="eagle3", draft_model="/e.gguf")),
         ["--spec-type", "draft-eagle3", "-md", "/e.gguf", "--spec-draft-n-max", "3"]),
        (Features(speculative=SpeculativeConfig(method="mtp")), ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]),
        (Features(extra_args=["--cache-reuse", "256"]), ["--cache-reuse", "256"]),
    ],
)
def test_feature_argv(features: Features, expected: list[str]) -> None:
    argv = [tok for toks in feature_flags(features).values() for tok in toks]
    assert argv == expected


def test_argv_is_llama_servers_with_the_key_only_in_the_environment(tmp_path: Path, gguf: Path) -> None:
    engine = python_engine(tmp_path, gguf).model_copy(update={"served_model_name": "demo"})
    argv = ADAPTER.build_argv(engine, Features(max_num_seqs=2), port=9000)
    assert argv[:2] == [str(tmp_path / "python"), str(Path(serve.__file__).resolve())]
    assert argv[2:] == ["-m", str(gguf), "-a", "demo", "--host", "127.0.0.1", "--port", "9000", "--metrics", "-lv", "4",
                        "--threads-http", "128", "-np", "2"]
    env = ADAPTER.build_env(engine, "s3cret")
    assert env["LLAMA_API_KEY"] == "s3cret" and "s3cret" not in argv and "--api-key" not in argv
    # A script for another machine runs llama-server itself: the flags are its own.
    assert ADAPTER.build_argv(engine, Features(), 9000, portable=True)[0] == "llama-server"


def test_executable_runtime_runs_the_users_llama_server(monkeypatch: pytest.MonkeyPatch, gguf: Path) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/opt/llama/{name}")
    engine = EngineConfig(kind="llamacpp", model=str(gguf), runtime=RuntimeConfig(kind="executable",
                                                                                   executable="llama-server"))
    assert ADAPTER.build_argv(engine, Features(), 8080)[:3] == ["/opt/llama/llama-server", "-m", str(gguf)]


def test_every_catalogued_feature_is_mapped_or_refused(tmp_path: Path, gguf: Path) -> None:
    """A toggle llama.cpp takes gives flags; one it lacks is refused with a reason (so the GUI
    greys it): none may do nothing silently. Each feature set away from its default:"""
    engine = python_engine(tmp_path, gguf)
    changed = every_feature_changed(["--cache-reuse", "8"], {
        "kv_cache_dtype": Features(kv_cache_dtype="q8_0"),
        "speculative.draft_model": Features(speculative=SpeculativeConfig(method="draft_model", draft_model="/d.gguf")),
    })
    assert set(changed) == {f.key for f in FEATURES}
    base = [tok for toks in feature_flags(Features()).values() for tok in toks]
    for key, features in changed.items():
        argv = [tok for toks in feature_flags(features).values() for tok in toks]
        issues = [i for i in ADAPTER.validate(engine, features, None, None) if i.severity == "error"]
        assert argv != base or issues, f"{key}: neither mapped nor refused"


# --- refusals: what llama.cpp lacks, said once, keyed by the feature (the GUI greys it) -----------

def test_what_llamacpp_lacks_is_refused_with_its_reason(tmp_path: Path, gguf: Path) -> None:
    engine = python_engine(tmp_path, gguf)
    found = errors(engine, Features(weights_dtype="fp8", cpu_offload_gib=2, gpu_memory_utilization=0.9,
                                    tensor_parallel_size=2, pipeline_parallel_size=2, chunked_prefill=False,
                                    cuda_graphs=False, kv_offload_gib=4, kv_offload_backend="native"))
    assert "GGUF" in found["weights_dtype"]
    assert "whole layers" in found["cpu_offload_gib"] and "GPU layers" in found["cpu_offload_gib"]
    assert "utilization" in found["gpu_memory_utilization"]
    assert "--split-mode" in found["tensor_parallel_size"] and "layer" in found["pipeline_parallel_size"]
    assert "cannot be turned off" in found["chunked_prefill"]
    assert "GGML_CUDA_DISABLE_GRAPHS" in found["cuda_graphs"]
    assert "KV offload" in found["kv_offload_gib"]
    assert errors(engine, Features(speculative=SpeculativeConfig(method="eagle", draft_model="/x.gguf")))[
        "speculative.method"].startswith("llama.cpp runs EAGLE-3")


def test_fp8_kv_runs_as_q8_0_with_a_warning_and_quantized_v_needs_flash_attention(tmp_path: Path, gguf: Path) -> None:
    engine = python_engine(tmp_path, gguf)
    issues = ADAPTER.validate(engine, Features(kv_cache_dtype="fp8_e5m2"), None, None)
    assert [(i.field, i.severity) for i in issues] == [("kv_cache_dtype", "warning")] and "q8_0" in issues[0].message
    assert "flash attention" in errors(engine, Features(kv_cache_dtype="q4_0", flash_attention=False))["flash_attention"]
    assert errors(engine, Features(kv_cache_dtype="q4_0", flash_attention=True)) == {}


def test_runtime_model_and_tokenizer_checks(tmp_path: Path, gguf: Path) -> None:
    assert "runs vllm" in errors(EngineConfig(kind="llamacpp", model=str(gguf)), Features())["engine.runtime"]
    docker = EngineConfig(kind="llamacpp", model=str(gguf), runtime=RuntimeConfig(kind="docker"))
    assert "docker" in errors(docker, Features())["engine.runtime"]
    assert "not a .gguf" in errors(python_engine(tmp_path, Path("Qwen/Qwen3-8B")), Features())["engine.model"]
    assert "not found" in errors(python_engine(tmp_path, tmp_path / "gone.gguf"), Features())["engine.model"]
    with_tokenizer = python_engine(tmp_path, gguf).model_copy(update={"tokenizer": "gpt2"})
    assert "GGUF" in errors(with_tokenizer, Features())["engine.tokenizer"]
    spec = Features(speculative=SpeculativeConfig(method="draft_model", draft_model=str(tmp_path / "no.gguf")))
    assert "local GGUF" in errors(python_engine(tmp_path, gguf), spec)["speculative.draft_model"]


def test_gpu_layers_need_a_gpu_build(tmp_path: Path, gguf: Path) -> None:
    assert "no GPU backend" in errors(managed_engine(gguf), Features(gpu_layers=8))["gpu_layers"]
    no_gpu = HardwareInfo()
    assert "none is visible" in errors(python_engine(tmp_path, gguf), Features(gpu_layers=8), hardware=no_gpu)["gpu_layers"]
    h100 = HardwareInfo(gpus=[GpuInfo(index=0, name="NVIDIA H100", compute_capability=(9, 0))])
    assert errors(python_engine(tmp_path, gguf), Features(gpu_layers=8), hardware=h100) == {}


def test_extra_args_may_not_override_tunebench_or_a_toggle_in_any_spelling(tmp_path: Path, gguf: Path) -> None:
    engine = python_engine(tmp_path, gguf)
    issues = [str(i) for i in ADAPTER.validate(engine, Features(max_num_seqs=4, kv_cache_dtype="q8_0", extra_args=[
        "--parallel", "2", "--cache-type-k=f16", "--port", "1", "--model", "x.gguf", "--cache-reuse", "64"]), None, None)]
    assert "error: extra_args: --parallel is already set by a feature toggle" in issues
    assert "error: extra_args: --cache-type-k is already set by a feature toggle" in issues
    assert "error: extra_args: --port is set by tunebench from the configuration; set it there" in issues
    assert "error: extra_args: --model is set by tunebench from the configuration; set it there" in issues
    assert not any("--cache-reuse" in i for i in issues)


def test_flag_tokens_are_told_from_negative_values() -> None:
    assert flag_names(["-ngl", "-1", "--ctx-size=8", "-fa", "on"]) == ["-ngl", "--ctx-size", "-fa"]


def test_vllm_refuses_llamacpp_only_features() -> None:
    """The other side of the same catalogue: vLLM greys GPU layers and flash attention."""
    engine = EngineConfig(model="/models/m", runtime=RuntimeConfig(kind="executable", executable="vllm"))
    issues = {i.field: i for i in get_adapter("vllm").validate(engine, Features(gpu_layers=4, flash_attention=False),
                                                                None, None)}
    assert issues["gpu_layers"].severity == issues["flash_attention"].severity == "error"
    assert "vLLM has no GPU layers setting" == issues["gpu_layers"].message


# --- weight precision: GGUF block types made from the 16-bit file ---------------------------------

@pytest.mark.parametrize("dtype", sorted(GGUF_WEIGHT_BITS))
def test_gguf_weight_types_run_on_llamacpp_from_a_quantized_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  gguf: Path, dtype: str) -> None:
    """Accepted, and served as the copy quantized from the configured file (-m names it); the
    other flags are unchanged."""
    made: list[tuple[Path, str, str | None]] = []

    def quantize(source: Path, weights_dtype: str, python: str | None) -> Path:
        made.append((source, weights_dtype, python))
        return tmp_path / f"m-{weights_dtype}.gguf"

    monkeypatch.setattr("engine_adapters.llamacpp.ensure_quantized_gguf", quantize)
    engine = python_engine(tmp_path, gguf)
    features = Features(weights_dtype=dtype, max_num_seqs=2)  # type: ignore[arg-type]
    assert "weights_dtype" not in errors(engine, features)
    argv = ADAPTER.build_argv(engine, features, port=9000)
    assert argv[argv.index("-m") + 1] == str(tmp_path / f"m-{dtype}.gguf")
    assert made == [(gguf, dtype, str(tmp_path / "python"))]
    plain = ADAPTER.build_argv(engine, Features(max_num_seqs=2), port=9000)
    assert [a for a in argv if a != str(tmp_path / f"m-{dtype}.gguf")] == [a for a in plain if a != str(gguf)]


def test_fp8_weights_are_refused_by_llamacpp_and_gguf_types_by_every_other_engine(tmp_path: Path, gguf: Path) -> None:
    """One line each, keyed by the feature (the GUI greys the choice): llama.cpp names its types,
    the others name their own way of quantizing weights."""
    assert errors(python_engine(tmp_path, gguf), Features(weights_dtype="fp8"))["weights_dtype"] == (
        "llama.cpp's weight types are GGUF ones: auto (the file's own) or q8_0, q4_0 (made here from its 16-bit "
        "GGUF), not fp8")
    others = {"vllm": "vLLM's weight precision is fp8", "sglang": "SGLang's weight precision is fp8",
              "trtllm": "TensorRT-LLM takes weight quantization from the checkpoint"}
    for kind, says in others.items():
        engine = EngineConfig(kind=kind, model="/models/m",  # type: ignore[arg-type]
                              runtime=RuntimeConfig(kind="executable", executable="serve"))
        adapter = get_adapter(kind)
        for dtype in GGUF_WEIGHT_BITS:
            features = Features(weights_dtype=dtype)  # type: ignore[arg-type]
            found = [i for i in adapter.validate(engine, features, None, None) if i.field == "weights_dtype"]
            assert [i.severity for i in found] == ["error"], (kind, found)
            assert found[0].message.startswith(f"{dtype} is llama.cpp's block-quantized GGUF weight type; {says}")
            assert "\n" not in found[0].message
            assert adapter.feature_flags(features) == adapter.feature_flags(Features())  # nothing passed on


def test_weight_type_verified_by_the_file_type_the_engine_loaded() -> None:
    """The recorded log loaded a BF16 file: asked for q8_0, that is not active, with what it saw."""
    check = verify_weights_dtype("q8_0", LOG)
    assert check.status == "not active" and check.evidence.startswith("the engine loaded a BF16 GGUF")
    assert "16 bf16" in check.evidence
    loaded = ["print_info: file type   = Q4_0", "llama_model_loader: - type q4_0:   14 tensors"]
    assert verify_weights_dtype("q4_0", loaded).status == "verified"
    assert verify_weights_dtype("q4_0", []).status == "unknown"
    assert "weights_dtype" not in {c.key for c in ADAPTER.verify(Features(), LOG, METRICS_AFTER,
                                                                 before_text=METRICS_BEFORE)}


def test_quantized_files_are_cached_beside_the_demo_gguf_or_by_the_sources_identity(tmp_path: Path) -> None:
    assert quantized_gguf_path(gguf_demo_path(), "q4_0") == gguf_demo_dir() / "model-q4_0.gguf"
    source = tmp_path / "mine.gguf"
    source.write_bytes(b"GGUF")
    first = quantized_gguf_path(source, "q8_0")
    assert first.name == "mine-q8_0.gguf" and quantized_gguf_path(source, "q4_0") == first.with_name("mine-q4_0.gguf")
    os.utime(source, ns=(1, 1))
    assert quantized_gguf_path(source, "q8_0") != first  # an edited source is quantized again
    with pytest.raises(ValueError, match="not a GGUF weight type"):
        quantized_gguf_path(source, "fp8")
    with pytest.raises(RuntimeErrorMessage, match="model file not found"):
        ensure_quantized_gguf(tmp_path / "gone.gguf", "q8_0", None)
    with pytest.raises(RuntimeErrorMessage, match="llamacpp-cpu runtime"):  # nothing to quantize with
        ensure_quantized_gguf(source, "q8_0", None)


# --- flags of the installed version -------------------------------------------------------------

def test_help_of_the_wheel_runner_lists_its_flags_and_choices(flags: FlagSet) -> None:
    assert {"-np", "--parallel", "-ctk", "-fa", "-ngl", "--n-gpu-layers", "--spec-type", "-md", "--metrics",
            "--cache-prompt", "--no-cache-prompt", "-cram", "--spec-ngram-simple-size-n"} <= set(flags.flags)
    assert flags.choices["-ctk"] == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
    assert flags.choices["--flash-attn"] == ["on", "off", "auto"]
    assert "ngram-simple" in flags.choices["--spec-type"] and "draft-eagle3" in flags.choices["--spec-type"]
    assert "FNAME" not in flags.flags and "-1" not in flags.flags


def test_help_of_llama_server_in_its_own_layout() -> None:
    flags = parse_help(LLAMA_SERVER_HELP, "b7000")
    assert {"-h", "--help", "--usage", "-np", "--parallel", "-fa", "--flash-attn", "-ctk", "--cache-type-k",
            "--spec-type"} == set(flags.flags)
    assert flags.choices["-fa"] == ["on", "off", "auto"] and "q4_0" in flags.choices["--cache-type-k"]
    assert flags.choices["--spec-type"][:3] == ["none", "ngram-cache", "ngram-simple"]


def test_flags_and_values_the_version_lacks_are_named_with_it(tmp_path: Path, gguf: Path) -> None:
    old = parse_help(LLAMA_SERVER_HELP, "b7000")
    found = errors(python_engine(tmp_path, gguf), Features(max_num_seqs=2, gpu_layers=1,
                                                           speculative=SpeculativeConfig(method="mtp")), old)
    assert found["gpu_layers"] == "-ngl is not supported by the installed llama.cpp b7000"
    assert "--spec-type draft-mtp is not accepted by llama.cpp b7000 (choices: none, ngram-cache" in found[
        "speculative.method"]
    assert "max_num_seqs" not in found


def test_installed_wheel_runner_accepts_every_mapped_flag(tmp_path: Path, gguf: Path, flags: FlagSet) -> None:
    features = Features(kv_cache_dtype="q4_0", prefix_caching=False, max_num_seqs=2, max_num_batched_tokens=64,
                        max_model_len=512, flash_attention=True, speculative=SpeculativeConfig(method="ngram"))
    assert errors(python_engine(tmp_path, gguf), features, flags) == {}
    draft = Features(speculative=SpeculativeConfig(method="draft_model", draft_model=str(gguf)))
    assert errors(python_engine(tmp_path, gguf), draft, flags) == {}


# --- the log and /metrics of a real start (recorded) -----------------------------------------------

def test_phases_and_kv_capacity_from_a_real_log() -> None:
    phases = [p for p in (match_phase(PHASE_PATTERNS, line) for line in LOG) if p is not None]
    for phase in (Phase.LOADING_WEIGHTS, Phase.PROFILING, Phase.KV_CACHE, Phase.WARMING_UP, Phase.STARTING_SERVER,
                  Phase.READY):
        assert phase in phases, phase
    assert phases.index(Phase.LOADING_WEIGHTS) < phases.index(Phase.KV_CACHE) < phases.index(Phase.READY)
    # -np 2 -c 2048: two slots of 1024 tokens each.
    assert parse_kv_cache(LOG) == {"kv_cache_tokens": 2048.0, "max_concurrency": 2.0, "max_concurrency_at_tokens": 1024.0}


def test_verify_by_effect_from_a_real_probe() -> None:
    features = Features(prefix_caching=True, kv_cache_dtype="q8_0", flash_attention=True, max_num_seqs=2,
                        max_model_len=1024, max_num_batched_tokens=512, speculative=SpeculativeConfig(method="ngram"))
    checks = {c.key: c for c in ADAPTER.verify(features, LOG, METRICS_AFTER, before_text=METRICS_BEFORE)}
    assert checks["prefix_caching"].status == "verified" and checks["prefix_caching"].evidence.startswith("127 prompt")
    assert checks["kv_cache_dtype"].status == "verified" and "1.06 bytes per value" in checks["kv_cache_dtype"].evidence
    assert checks["speculative.method"].status == "verified" and "27 accepted" in checks["speculative.method"].evidence
    assert [checks[k].status for k in ("flash_attention", "max_num_seqs", "max_model_len", "max_num_batched_tokens")] == [
        "accepted"] * 4


def test_verify_says_not_active_when_the_effect_is_missing() -> None:
    checks = {c.key: c for c in ADAPTER.verify(
        Features(prefix_caching=False, kv_cache_dtype="q4_0", flash_attention=False, max_num_seqs=3,
                 speculative=SpeculativeConfig(method="ngram")),
        LOG, METRICS_BEFORE, before_text=METRICS_BEFORE)}
    assert checks["prefix_caching"].status == "verified"  # no hits, as asked
    assert checks["kv_cache_dtype"].status == "not active" and "K (q8_0)" in checks["kv_cache_dtype"].evidence
    assert checks["speculative.method"].status == "not active"
    assert checks["flash_attention"].status == "not active" and checks["max_num_seqs"].status == "not active"
    hits = {c.key: c for c in ADAPTER.verify(Features(prefix_caching=False), LOG, METRICS_AFTER,
                                             before_text=METRICS_BEFORE)}
    assert hits["prefix_caching"].status == "not active"


def test_verify_without_a_probe_or_a_log_line_is_unknown() -> None:
    checks = {c.key: c for c in ADAPTER.verify(Features(prefix_caching=True, kv_cache_dtype="q8_0"), [], "",
                                               before_text=None, probe_error="HTTP 401: no key")}
    assert checks["prefix_caching"].status == "unknown" and "HTTP 401" in checks["prefix_caching"].evidence
    assert checks["kv_cache_dtype"].status == "unknown"


def test_probe_ends_with_a_fence_request() -> None:
    bodies = ADAPTER.probe_requests(Features(prefix_caching=True, speculative=SpeculativeConfig(method="ngram")))
    assert bodies[0] == bodies[1] and len(bodies[0]["prompt"]) == 128 and bodies[2]["ignore_eos"] is True
    assert bodies[2]["prompt"][:1] != bodies[0]["prompt"][:1]  # the speculation probe shares no cached prefix
    assert bodies[-1]["max_tokens"] == 1 and len(bodies) == 4
    assert ADAPTER.probe_requests(Features()) == []


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("error: invalid argument: --bogus", "unknown_flag"),
        ('error while handling argument "-np": expected an integer, got \'x\'', "bad_argument"),
        ("0.00.007.632 E llama_model_load: error loading model: error loading model vocabulary: unknown pre-tokenizer "
         "type: 'gpt2'", "pre_tokenizer"),
        ("E gguf_init_from_file: failed to open GGUF file '/x.gguf' (No such file or directory)", "model_missing"),
        ("E srv init: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", "port_in_use"),
        ("llama_init_from_model: V cache quantization requires flash_attn", "quantized_v_needs_fa"),
        ("ModuleNotFoundError: No module named 'xllamacpp'", "no_runtime"),
    ],
)
def test_diagnosis(line: str, code: str) -> None:
    found = ADAPTER.diagnose(["0.00.001 I srv init: loading model", line])
    assert found is not None and found.code == code, found


def test_a_clean_log_has_no_diagnosis() -> None:
    assert ADAPTER.diagnose(LOG) is None


# --- the wheel's command line (llamacpp_serve.py) -------------------------------------------------

class FakeGgmlType(enum.IntEnum):
    GGML_TYPE_F32 = 0
    GGML_TYPE_F16 = 1
    GGML_TYPE_Q4_0 = 2
    GGML_TYPE_Q8_0 = 8


class FakeSpecType(enum.IntEnum):
    COMMON_SPECULATIVE_TYPE_NONE = 0
    COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE = 1
    COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE = 6
    COMMON_SPECULATIVE_TYPE_COUNT = 11


class FakeFlashAttn(enum.IntEnum):
    LLAMA_FLASH_ATTN_TYPE_AUTO = -1
    LLAMA_FLASH_ATTN_TYPE_DISABLED = 0
    LLAMA_FLASH_ATTN_TYPE_ENABLED = 1


def fake_wheel() -> tuple[Any, Any]:
    """An xllamacpp stand-in: enums and a parameter object without cache_reuse (an older wheel)."""
    xlc = SimpleNamespace(ggml_type=FakeGgmlType, common_speculative_type=FakeSpecType,
                          llama_flash_attn_type=FakeFlashAttn, __version__="0.0-test")
    draft = SimpleNamespace(n_max=3, n_min=0, p_min=0.0, mparams=SimpleNamespace(path=""))
    params = SimpleNamespace(
        model=SimpleNamespace(path=""), model_alias=set(), hostnames=["127.0.0.1"], port=0, api_keys=[], n_ctx=0,
        n_parallel=1, kv_unified=False, n_batch=2048, n_ubatch=512, n_gpu_layers=-1, cache_type_k=FakeGgmlType(1),
        cache_type_v=FakeGgmlType(1), flash_attn_type=FakeFlashAttn(-1), cache_prompt=True, cache_ram_mib=8192,
        cpuparams=SimpleNamespace(n_threads=-1), cpuparams_batch=SimpleNamespace(n_threads=-1),
        speculative=SimpleNamespace(types=[FakeSpecType(0)], draft=draft,
                                    ngram_simple=SimpleNamespace(size_n=12, size_m=48, min_hits=1)),
        endpoint_metrics=False, endpoint_slots=True, verbosity=3, warmup=True)
    return xlc, params


def test_runner_maps_llama_server_flags_onto_the_parameter_model() -> None:
    xlc, params = fake_wheel()
    options = serve.available_options(xlc, params)
    given = serve.parse(["-m", "/m.gguf", "--port=8081", "--parallel", "3", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on",
                         "--no-cache-prompt", "-cram", "0", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                         "2", "-md", "/d.gguf", "--spec-draft-n-max", "5", "--metrics", "-lv", "4", "-ngl", "-1"],
                        options, xlc, params)
    assert params.model.path == "/m.gguf" and params.port == 8081 and params.n_parallel == 3
    assert (params.cache_type_k, params.cache_type_v) == (FakeGgmlType.GGML_TYPE_Q8_0, FakeGgmlType.GGML_TYPE_Q4_0)
    assert params.flash_attn_type == FakeFlashAttn.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert params.cache_prompt is False and params.cache_ram_mib == 0 and params.endpoint_metrics is True
    assert params.speculative.types == [FakeSpecType.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
    assert params.speculative.ngram_simple.size_n == 2 and params.speculative.draft.n_max == 5
    assert params.speculative.draft.mparams.path == "/d.gguf" and params.n_gpu_layers == -1 and params.verbosity == 4
    assert {"-m", "--port", "-np", "-ctk", "-md"} <= given


def test_runner_offers_only_what_the_wheel_has_and_refuses_the_rest() -> None:
    xlc, params = fake_wheel()
    options = serve.available_options(xlc, params)
    names = {n for o in options for n in o.names}
    assert "--cache-reuse" not in names and "-np" in names  # this wheel's parameters have no n_cache_reuse
    help_flags = parse_help(serve.help_text(xlc, options), "test")
    assert help_flags.choices["-ctk"] == ["f32", "f16", "q8_0", "q4_0"]  # llama.cpp's order
    assert help_flags.choices["--spec-type"] == ["none", "draft-simple", "ngram-simple"]
    for argv, message in ((["-m", "x", "--cache-reuse", "8"], "invalid argument: --cache-reuse"),
                          (["-m", "x", "-ctk", "q5_1"], "unsupported cache type 'q5_1'"),
                          (["-m", "x", "--spec-type", "eagle"], "unknown speculative type 'eagle'"),
                          (["-m", "x", "-np", "0"], "needs at least one slot"),
                          (["-m", "x", "--port"], "expected value for argument: --port"),
                          (["--metrics"], "a model is required")):
        with pytest.raises(serve.UsageError, match=message):
            serve.parse(argv, options, xlc, fake_wheel()[1])


def test_runner_binds_to_the_cores_tunebench_reserves_for_the_engine() -> None:
    assert serve.CPU_LIST_ENV == OMP_BIND_ENV  # the one variable cpu_binding sets for a CPU engine
    assert serve.API_KEY_ENV == ADAPTER.api_key_env
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    mine = sorted(os.sched_getaffinity(0))
    _, params = fake_wheel()
    try:
        cores = serve.bind_cpus(params, set(), {serve.CPU_LIST_ENV: str(mine[0])})
        assert cores == [mine[0]] and sorted(os.sched_getaffinity(0)) == [mine[0]]
        assert params.cpuparams.n_threads == params.cpuparams_batch.n_threads == 1
        assert serve.bind_cpus(fake_wheel()[1], set(), {}) == []
    finally:
        os.sched_setaffinity(0, mine)


# --- the GGUF converter's pure parts -------------------------------------------------------------

def test_gguf_tensor_names() -> None:
    assert gguf_tensor_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("model.layers.1.self_attn.k_proj.weight") == "blk.1.attn_k.weight"
    assert gguf_tensor_name("model.layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    assert gguf_tensor_name("lm_head.weight") == "output.weight"
    with pytest.raises(ValueError):
        gguf_tensor_name("model.layers.0.mlp.experts.weight")


def _rope_halves(x: np.ndarray, pos: int, base: float = 10000.0) -> np.ndarray:
    """Hugging Face Llama: dimension i rotates with i + d/2 (rotate_half)."""
    d = x.shape[-1]
    theta = pos * base ** (-np.arange(d // 2) * 2 / d)
    a, b = x[: d // 2], x[d // 2:]
    return np.concatenate([a * np.cos(theta) - b * np.sin(theta), b * np.cos(theta) + a * np.sin(theta)])


def _rope_pairs(x: np.ndarray, pos: int, base: float = 10000.0) -> np.ndarray:
    """llama.cpp's Llama (LLAMA_ROPE_TYPE_NORM): dimension 2i rotates with 2i + 1."""
    d = x.shape[-1]
    theta = pos * base ** (-np.arange(d // 2) * 2 / d)
    a, b = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2], out[1::2] = a * np.cos(theta) - b * np.sin(theta), b * np.cos(theta) + a * np.sin(theta)
    return out


def test_qk_permutation_turns_half_rotation_into_pair_rotation() -> None:
    """The converter's q/k permutation is right iff llama.cpp's RoPE on the permuted weights gives
    the same query (rows reordered) as Hugging Face's RoPE on the original ones, so every
    attention score q.k is unchanged."""
    rng = np.random.default_rng(0)
    n_head, head_dim, hidden = 2, 8, 16
    wq, wk = rng.normal(size=(n_head * head_dim, hidden)), rng.normal(size=(n_head * head_dim, hidden))
    x_q, x_k = rng.normal(size=hidden), rng.normal(size=hidden)
    for h in range(n_head):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        hf = _rope_halves((wq @ x_q)[rows], 5) @ _rope_halves((wk @ x_k)[rows], 2)
        gg = _rope_pairs((permute_heads(wq, n_head) @ x_q)[rows], 5) @ _rope_pairs((permute_heads(wk, n_head) @ x_k)[rows], 2)
        assert gg == pytest.approx(hf)
    assert not np.allclose(permute_heads(wq, n_head), wq)  # it does move rows
    bits = np.arange(32, dtype=np.uint16).reshape(8, 4)  # BF16 bit patterns move untouched
    assert sorted(permute_heads(bits, 2).ravel().tolist()) == list(range(32))


def test_vocab_in_id_order_with_special_and_padding_tokens() -> None:
    tokenizer = {"model": {"type": "BPE", "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "ab": 5},
                           "merges": [["a", "b"]]},
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
                 "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"])]}
    tokens, types, merges = vocab_from_tokenizer(tokenizer, 8)
    assert tokens == ["<unk>", "<s>", "</s>", "a", "b", "ab", "[PAD6]", "[PAD7]"]
    assert types == [TOKEN_CONTROL] * 3 + [TOKEN_NORMAL] * 3 + [TOKEN_UNUSED] * 2
    assert merges == ["a b"]
    with pytest.raises(ValueError, match="GPT-2's ByteLevel"):
        vocab_from_tokenizer({**tokenizer, "pre_tokenizer": {"type": "Metaspace"}}, 8)
    with pytest.raises(ValueError, match="beyond the model's vocabulary"):
        vocab_from_tokenizer(tokenizer, 4)

