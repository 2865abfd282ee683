"""SGLang adapter against SGLang 0.5.23's recorded interfaces (tests/data/sglang/, headers say how
they were made): every feature's argv uses only flags and values that version's --help lists,
every metric the table reads is in its /metrics, an unknown flag is refused naming the version,
and with no SGLang here a launch fails in one clear line. Nothing here runs SGLang (no CPU wheel
exists): the adapter is marked "not yet run on a GPU"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import RunConfig
from app.engines import check_config
from app.export.launch import render_launch, spec_from_profile
from app.gui.availability import compute_availability
from app.profiles import load_profile, resolve_profile
from engine_adapters.base import FlagSet, Phase, ValidationIssue, match_phase
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.features import FEATURES
from engine_adapters.hardware import GpuInfo, HardwareInfo
from engine_adapters.registry import ADAPTERS, get_adapter, get_engine_metrics, maturity
from engine_adapters.sglang import (
    ADAPTER,
    LAUNCHER,
    METRIC_NAMES,
    RECORDED_VERSION,
    feature_flags,
    flag_names,
    flag_values,
    parse_help,
    parse_kv_cache,
)
from tests.engine_absent import launch_without_the_engine
from tests.feature_changes import VLLM_SPELLED_ARGV, every_feature_changed

DATA = Path(__file__).parents[1] / "data" / "sglang"
HELP_TEXT = (DATA / f"sglang-{RECORDED_VERSION}-help.txt").read_text()
METRICS_TEXT = (DATA / f"sglang-{RECORDED_VERSION}-metrics.txt").read_text()
FLAGS = parse_help(HELP_TEXT, RECORDED_VERSION)
H100 = HardwareInfo(gpus=[GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 2**30,
                                  compute_capability=(9, 0))])
NO_GPU = HardwareInfo(nvml_error="NVML Shared Library Not Found")


def python_engine(tmp_path: Path, served_model_name: str | None = None) -> EngineConfig:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.touch()
    return EngineConfig(kind="sglang", model="hub/model", served_model_name=served_model_name,
                        runtime=RuntimeConfig(kind="python", python=str(python)))


def errors(issues: list[ValidationIssue]) -> list[str]:
    return [f"{i.field}: {i.message}" for i in issues if i.severity == "error"]


def assert_in_recorded_help(tokens: list[str]) -> None:
    """Every flag exists in the recorded help and every value is one of its choices."""
    for flag in flag_names(tokens):
        assert FLAGS.has(flag), f"{flag} is not in SGLang {RECORDED_VERSION}'s --help"
    for flag, value in flag_values(tokens):
        choices = FLAGS.choices.get(flag)
        assert not choices or value in choices, f"{flag} {value} not in {choices}"


# --- the recorded help ------------------------------------------------------------------------

def test_recorded_help_parses_into_flags_and_choices() -> None:
    assert len(FLAGS.flags) > 400
    for flag in ("--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--kv-cache-dtype",
                 "--disable-radix-cache", "--enable-metrics", "--api-key", "--enable-hierarchical-cache", "--hicache-size"):
        assert FLAGS.has(flag), flag
    assert FLAGS.choices["--kv-cache-dtype"][:3] == ["auto", "fp8_e5m2", "fp8_e4m3"]
    assert "fp8" in FLAGS.choices["--quantization"]
    # A name that appears only inside a description is not a flag: the broad scan finds more.
    mentioned = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])", HELP_TEXT))
    assert mentioned - set(FLAGS.flags), "the recorded help mentions no non-flag name: the check proves nothing"
    assert "--tp" not in FLAGS.flags  # 0.5.23 spells it --tp-size (or --tensor-parallel-size)


# --- features -> argv, each checked against the recorded help ---------------------------------

FEATURE_ARGV: list[tuple[Features, list[str]]] = [
    *VLLM_SPELLED_ARGV,
    (Features(kv_cache_dtype="fp8"), ["--kv-cache-dtype", "fp8_e4m3"]),
    (Features(prefix_caching=False), ["--disable-radix-cache"]),
    (Features(prefix_caching=True), []),
    (Features(speculative=SpeculativeConfig(method="eagle", draft_model="/d/eagle", num_speculative_tokens=4)),
     ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
      "--speculative-num-draft-tokens", "5", "--speculative-draft-model-path", "/d/eagle"]),
    (Features(speculative=SpeculativeConfig(method="eagle3", draft_model="/d/e3")),
     ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
      "--speculative-num-draft-tokens", "4", "--speculative-draft-model-path", "/d/e3"]),
    (Features(speculative=SpeculativeConfig(method="mtp", num_speculative_tokens=2)),
     ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
      "--speculative-num-draft-tokens", "3"]),
    (Features(speculative=SpeculativeConfig(method="draft_model", draft_model="/d/small")),
     ["--speculative-algorithm", "STANDALONE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
      "--speculative-num-draft-tokens", "4", "--speculative-draft-model-path", "/d/small"]),
    (Features(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=5)),
     ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"]),
    (Features(kv_offload_gib=64, kv_offload_backend="native"), ["--enable-hierarchical-cache", "--hicache-size", "64"]),
    (Features(gpu_memory_utilization=0.85), ["--mem-fraction-static", "0.85"]),
    (Features(max_num_seqs=64), ["--max-running-requests", "64"]),
    (Features(max_num_batched_tokens=8192), ["--chunked-prefill-size", "8192"]),
    (Features(chunked_prefill=False), ["--chunked-prefill-size", "-1"]),
    (Features(chunked_prefill=False, max_num_batched_tokens=16384),
     ["--chunked-prefill-size", "-1", "--max-prefill-tokens", "16384"]),
    (Features(max_model_len=16384), ["--context-length", "16384"]),
    (Features(cuda_graphs=False), ["--disable-cuda-graph"]),
    (Features(tensor_parallel_size=4), ["--tp-size", "4"]),
    (Features(pipeline_parallel_size=2), ["--pp-size", "2"]),
    (Features(extra_args=["--attention-backend", "fa3"]), ["--attention-backend", "fa3"]),
]


@pytest.mark.parametrize(("features", "expected"), FEATURE_ARGV)
def test_feature_argv_uses_only_the_recorded_flags(features: Features, expected: list[str]) -> None:
    argv = [tok for toks in feature_flags(features).values() for tok in toks]
    assert argv == expected
    assert_in_recorded_help(argv)
    assert ADAPTER.version_issues(features, FLAGS) == []


def test_every_catalogued_feature_is_mapped_or_refused(tmp_path: Path) -> None:
    """A toggle SGLang takes gives flags; one it lacks is refused with a reason (the GUI greys
    it): none may do nothing silently."""
    engine = python_engine(tmp_path)
    changed = every_feature_changed(["--attention-backend", "fa3"])
    assert set(changed) == {f.key for f in FEATURES}
    base = [tok for toks in feature_flags(Features()).values() for tok in toks]
    for key, features in changed.items():
        argv = [tok for toks in feature_flags(features).values() for tok in toks]
        refused = [i for i in ADAPTER.validate(engine, features, None, None) if i.severity == "error" and i.field == key]
        assert argv != base or refused, f"{key}: neither mapped nor refused"
        assert_in_recorded_help(argv)


def test_argv_is_the_launcher_with_the_key_only_in_the_environment(tmp_path: Path) -> None:
    engine = python_engine(tmp_path, served_model_name="qwen")
    argv = ADAPTER.build_argv(engine, Features(prefix_caching=False), 30001)
    assert argv[:3] == [str(tmp_path / "venv" / "bin" / "python"), "-c", LAUNCHER]
    assert argv[3:] == ["--model-path", "hub/model", "--served-model-name", "qwen", "--host", "127.0.0.1",
                        "--port", "30001", "--enable-metrics", "--disable-radix-cache"]
    assert_in_recorded_help(argv[3:])
    env = ADAPTER.build_env(engine, "k-secret")
    assert env["SGLANG_API_KEY"] == "k-secret" and "k-secret" not in " ".join(argv)
    docker = engine.model_copy(update={"runtime": RuntimeConfig(kind="docker")})
    dargv = ADAPTER.build_argv(docker, Features(), 30001)
    assert dargv[dargv.index("-e") + 1] == "SGLANG_API_KEY" and "lmsysorg/sglang:latest" in dargv  # not vLLM's image
    assert dargv[dargv.index("--host") + 1] == "0.0.0.0"


def test_launcher_hands_the_key_to_the_server_inside_the_process(tmp_path: Path) -> None:
    """The launcher is real code: run it against a stand-in ``sglang.launch_server`` that prints
    what it was started with."""
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text("import os, sys\nprint(repr(sys.argv[1:]), repr(os.environ.get('SGLANG_API_KEY')))\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "SGLANG_API_KEY": "k-123"}
    done = subprocess.run([sys.executable, "-c", LAUNCHER, "--model-path", "/m", "--port", "1"], capture_output=True,
                          text=True, env=env, timeout=60, check=True)
    assert done.stdout.strip() == "['--api-key', 'k-123', '--model-path', '/m', '--port', '1'] None"
    env.pop("SGLANG_API_KEY")
    done = subprocess.run([sys.executable, "-c", LAUNCHER, "--port", "1"], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    assert done.stdout.strip() == "['--port', '1'] None"


# --- validation against the recorded help ------------------------------------------------------

def test_an_unknown_flag_is_refused_naming_the_version(tmp_path: Path) -> None:
    features = Features(extra_args=["--no-such-flag", "1"])
    issues = errors(ADAPTER.validate(python_engine(tmp_path), features, FLAGS, H100))
    assert issues == [f"extra_args: --no-such-flag is not supported by the installed SGLang {RECORDED_VERSION}"]
    bad_choice = Features(extra_args=["--kv-cache-dtype=fp9"])
    assert any("not accepted by SGLang 0.5.23" in e for e in errors(ADAPTER.validate(python_engine(tmp_path),
                                                                                       bad_choice, FLAGS, H100)))
    old = FlagSet(engine="sglang", version="0.4.0", flags=[f for f in FLAGS.flags if f != "--enable-hierarchical-cache"])
    assert errors(ADAPTER.validate(python_engine(tmp_path), Features(kv_offload_gib=8, kv_offload_backend="native"),
                                   old, H100)) == [
        "kv_offload_gib: --enable-hierarchical-cache is not supported by the installed SGLang 0.4.0"]


def test_what_sglang_lacks_or_tunebench_sets_is_refused(tmp_path: Path) -> None:
    engine = python_engine(tmp_path)
    cases = {
        "gpu_layers": Features(gpu_layers=4), "flash_attention": Features(flash_attention=False),
        "kv_cache_dtype": Features(kv_cache_dtype="q8_0"),
        "speculative.draft_model": Features(speculative=SpeculativeConfig(method="eagle3")),
        "kv_offload_backend": Features(kv_offload_gib=4, kv_offload_backend="lmcache"),
    }
    for key, features in cases.items():
        assert any(e.startswith(key + ":") for e in errors(ADAPTER.validate(engine, features, FLAGS, H100))), key
    for flags in (["--api-key", "x"], ["--port", "1"], ["--model", "other"], ["--tensor-parallel-size", "2"]):
        features = Features(extra_args=flags, tensor_parallel_size=2) if "tensor" in flags[0] else Features(extra_args=flags)
        assert any(e.startswith("extra_args:") for e in errors(ADAPTER.validate(engine, features, FLAGS, None))), flags
    managed = EngineConfig(kind="sglang")
    assert any("no managed runtime" in e for e in errors(ADAPTER.validate(managed, Features(), None, None)))
    assert any("needs an NVIDIA GPU" in e for e in errors(ADAPTER.validate(engine, Features(), None, NO_GPU)))


def test_marked_not_yet_run_on_a_gpu(tmp_path: Path) -> None:
    assert maturity("sglang") is not None and "not yet run on a GPU" in maturity("sglang")  # type: ignore[operator]
    assert maturity("vllm") is None and maturity("llamacpp") is None
    warning = [i for i in ADAPTER.validate(python_engine(tmp_path), Features(), FLAGS, H100) if i.field == "engine.kind"]
    assert warning and warning[0].severity == "warning" and "not yet run on a GPU" in warning[0].message
    assert get_adapter("sglang") is ADAPTER and get_engine_metrics("sglang") is ADAPTER and "sglang" in ADAPTERS


def test_gui_greys_what_sglang_lacks_with_the_reason() -> None:
    config = RunConfig.model_validate({"engine": {"kind": "sglang", "model": "/m",
                                                  "runtime": {"kind": "docker", "docker_image": "lmsysorg/sglang:v0.5.23"}}})
    availability = compute_availability(config, H100, FLAGS)
    assert availability.disabled["features.flash_attention"] == "SGLang has no flash attention setting"
    assert availability.disabled["features.gpu_layers"] == "SGLang has no GPU layers setting"
    assert "llama.cpp" in availability.disabled_choices["features.kv_cache_dtype"]["q8_0"]
    assert "features.prefix_caching" not in availability.disabled
    assert "not yet run on a GPU" in availability.engine_note


# --- the shipped profile ----------------------------------------------------------------------

def test_shipped_profile_checks_clean_on_a_gpu_and_exports() -> None:
    config = load_profile(resolve_profile("sglang-h100-example"))
    assert config.engine.kind == "sglang"
    report = check_config(config, hardware=H100, flags=FLAGS)
    assert errors(report.issues) == []
    argv = ADAPTER.build_argv(config.engine, config.features, 30000)
    assert_in_recorded_help(argv[argv.index(LAUNCHER) + 1:])
    script = render_launch(spec_from_profile(resolve_profile("sglang-h100-example")), "docker")
    assert "--kv-cache-dtype fp8_e4m3" in script and "--speculative-algorithm NEXTN" in script
    assert "SGLANG_API_KEY" in script


def test_launching_without_sglang_fails_in_one_clear_line(tmp_path: Path) -> None:
    """No SGLang here: the launch is refused before starting (managed runtime), or the engine's
    own failure is diagnosed (an interpreter without sglang), never a traceback."""
    failure, process = launch_without_the_engine("sglang", tmp_path, ADAPTER)
    assert "The interpreter has no SGLang" in failure
    assert process.diagnosis is not None and process.diagnosis.code == "no_runtime"


# --- metrics and logs -------------------------------------------------------------------------

def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_every_metric_the_table_reads_is_in_the_recorded_metrics() -> None:
    families = _families(METRICS_TEXT)
    assert len(families) > 100
    for group in (METRIC_NAMES.gauges, METRIC_NAMES.counters, METRIC_NAMES.histograms):
        for canonical, names in group.items():
            assert names[0] in families, f"{canonical}: {names[0]} is not in SGLang {RECORDED_VERSION}'s /metrics"
    for name in METRIC_NAMES.counters.values():
        assert any(line.startswith(name[0] + "{") for line in METRICS_TEXT.splitlines()), name


def test_verify_by_effect_from_metrics_and_log() -> None:
    before = 'sglang:cached_tokens_total{cache_source="total",model_name="m"} 100.0\n' \
             'sglang:spec_verify_calls_total{model_name="m"} 10.0\nsglang:generation_tokens_total{model_name="m"} 40.0\n'
    after = 'sglang:cached_tokens_total{cache_source="total",model_name="m"} 227.0\n' \
            'sglang:spec_verify_calls_total{model_name="m"} 34.0\nsglang:generation_tokens_total{model_name="m"} 105.0\n'
    log = ["[2026-11-30 10:00:01] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1339756, K size: 20.44 GB, "
           "V size: 20.44 GB",
           "[2026-11-30 10:00:02] max_total_num_tokens=1339756, chunked_prefill_size=8192, max_prefill_tokens=16384, "
           "max_running_requests=64, context_len=16384, available_gpu_mem=9.87 GB"]
    features = Features(prefix_caching=True, kv_cache_dtype="fp8", max_num_seqs=64, max_num_batched_tokens=8192,
                        speculative=SpeculativeConfig(method="mtp"))
    checks = {c.key: c for c in ADAPTER.verify(features, log, after, before_text=before)}
    assert checks["prefix_caching"].status == "verified" and "127" in checks["prefix_caching"].evidence
    assert checks["speculative.method"].status == "verified" and "65 tokens in 24 verify passes" in \
        checks["speculative.method"].evidence
    assert checks["kv_cache_dtype"].status == "accepted"
    assert checks["max_num_seqs"].status == "accepted" and checks["max_num_batched_tokens"].status == "accepted"
    off = {c.key: c for c in ADAPTER.verify(Features(prefix_caching=False), log, after, before_text=before)}
    assert off["prefix_caching"].status == "not active"
    bf16 = [line.replace("float8_e4m3fn", "bfloat16") for line in log]
    assert {c.key: c for c in ADAPTER.verify(features, bf16, after)}["kv_cache_dtype"].status == "not active"
    assert parse_kv_cache(log) == {"kv_cache_tokens": 1339756.0, "max_concurrency": 1339756 / 16384,
                                   "max_concurrency_at_tokens": 16384.0}


def test_phases_and_diagnosis() -> None:
    assert match_phase(ADAPTER.phase_patterns, "Load weight begin. avail mem=78.20 GB") is Phase.LOADING_WEIGHTS
    assert match_phase(ADAPTER.phase_patterns, "The server is fired up and ready to roll!") is Phase.READY
    diagnosis = ADAPTER.diagnose(["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'sglang'"])
    assert diagnosis is not None and diagnosis.code == "no_runtime"
    bad = ADAPTER.diagnose(["sglang serve: error: unrecognized arguments: --tp 2"])
    assert bad is not None and bad.code == "unknown_flag" and "--tp 2" in bad.message
