"""The vLLM adapter: argv per feature, version gating, validation messages, help parsing,
diagnosis of real startup failures, and feature verification from real log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_adapters.base import FlagSet, Phase, match_phase
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig
from engine_adapters.hardware import GpuInfo, HardwareInfo
from engine_adapters.vllm import (
    PHASE_PATTERNS,
    VllmAdapter,
    feature_flags,
    parse_help,
    parse_kv_cache,
    parse_non_default_args,
)
from tests.feature_changes import VLLM_SPELLED_ARGV

HELP_TEXT = (Path(__file__).resolve().parent.parent / "data" / "vllm-0.32.0-help.txt").read_text()
ADAPTER = VllmAdapter()


@pytest.fixture(scope="module")
def flags_0_32() -> FlagSet:
    return parse_help(HELP_TEXT, "0.32.0")


def python_engine(tmp_path: Path) -> EngineConfig:
    interpreter = tmp_path / "python"
    interpreter.write_text("")
    return EngineConfig(model="/models/m", runtime=RuntimeConfig(kind="python", python=str(interpreter)))


def gpus(n: int, cc: tuple[int, int] = (9, 0)) -> HardwareInfo:
    return HardwareInfo(gpus=[GpuInfo(index=i, name="NVIDIA H100", compute_capability=cc) for i in range(n)])


# --- argv for every feature ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (Features(), []),
        *VLLM_SPELLED_ARGV,
        (Features(kv_cache_dtype="fp8"), ["--kv-cache-dtype", "fp8"]),
        (Features(prefix_caching=True), ["--enable-prefix-caching"]),
        (Features(prefix_caching=False), ["--no-enable-prefix-caching"]),
        (Features(cpu_offload_gib=2.5), ["--cpu-offload-gb", "2.5"]),
        (Features(kv_offload_gib=16, kv_offload_backend="native"),
         ["--kv-offloading-size", "16", "--kv-offloading-backend", "native"]),
        (Features(gpu_memory_utilization=0.85), ["--gpu-memory-utilization", "0.85"]),
        (Features(max_num_seqs=64), ["--max-num-seqs", "64"]),
        (Features(max_num_batched_tokens=8192), ["--max-num-batched-tokens", "8192"]),
        (Features(max_model_len=16384), ["--max-model-len", "16384"]),
        (Features(cuda_graphs=False), ["--enforce-eager"]),
        (Features(chunked_prefill=True), ["--enable-chunked-prefill"]),
        (Features(chunked_prefill=False), ["--no-enable-chunked-prefill"]),
        (Features(tensor_parallel_size=4), ["--tensor-parallel-size", "4"]),
        (Features(pipeline_parallel_size=2), ["--pipeline-parallel-size", "2"]),
        (Features(extra_args=["--seed", "7"]), ["--seed", "7"]),
    ],
)
def test_feature_argv(features: Features, expected: list[str], tmp_path: Path) -> None:
    engine = python_engine(tmp_path)
    argv = ADAPTER.build_argv(engine, features, port=8123)
    prefix = [engine.runtime.python, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
              "--host", "127.0.0.1", "--port", "8123"]
    assert argv == prefix + expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (SpeculativeConfig(method="ngram", num_speculative_tokens=4, ngram_prompt_lookup_min=2, ngram_prompt_lookup_max=5),
         {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}),
        (SpeculativeConfig(method="eagle3", draft_model="org/eagle3-head", num_speculative_tokens=3),
         {"method": "eagle3", "model": "org/eagle3-head", "num_speculative_tokens": 3}),
        (SpeculativeConfig(method="eagle", draft_model="org/eagle-head"),
         {"method": "eagle", "model": "org/eagle-head", "num_speculative_tokens": 3}),
        (SpeculativeConfig(method="mtp", num_speculative_tokens=1), {"method": "mtp", "num_speculative_tokens": 1}),
        (SpeculativeConfig(method="draft_model", draft_model="/m/small"),
         {"method": "draft_model", "model": "/m/small", "num_speculative_tokens": 3}),
    ],
)
def test_speculative_argv(spec: SpeculativeConfig, expected: dict[str, object]) -> None:
    flags = feature_flags(Features(speculative=spec))["speculative.method"]
    assert flags[0] == "--speculative-config"
    assert json.loads(flags[1]) == expected


def test_every_catalogued_feature_maps_to_flags() -> None:
    """A feature in the catalogue with no flag rule would be a toggle that does nothing."""
    from engine_adapters.features import FEATURES

    rule_keys = set(feature_flags(Features()))
    spec_details = {"speculative.draft_model", "speculative.num_speculative_tokens", "speculative.ngram_prompt_lookup_max"}
    other_engines = {f.key for f in FEATURES if f.engines and "vllm" not in f.engines}  # refused by validate
    missing = {f.key for f in FEATURES} - rule_keys - spec_details - other_engines
    assert missing == set()


def test_executable_runtime_uses_vllm_serve_with_positional_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    engine = EngineConfig(model="Qwen/Qwen3-8B", runtime=RuntimeConfig(kind="executable", executable="vllm"))
    argv = ADAPTER.build_argv(engine, Features(prefix_caching=True), port=9000)
    assert argv[:3] == ["/usr/bin/vllm", "serve", "Qwen/Qwen3-8B"]
    assert "--model" not in argv


def test_docker_runtime_maps_port_and_passes_key_by_name_only() -> None:
    engine = EngineConfig(model="Qwen/Qwen3-8B", runtime=RuntimeConfig(kind="docker", docker_image="vllm/vllm-openai:v0.32.0"))
    argv = ADAPTER.build_argv(engine, Features(), port=9000)
    assert argv[:2] == ["docker", "run"]
    assert "127.0.0.1:9000:9000" in argv
    assert argv[argv.index("-e") + 1] == "VLLM_API_KEY"  # the value stays in the environment
    assert argv[argv.index("vllm/vllm-openai:v0.32.0") + 1] == "Qwen/Qwen3-8B"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"  # noqa: S104 - inside the container


def test_api_key_travels_in_environment_not_argv(tmp_path: Path) -> None:
    engine = python_engine(tmp_path)
    env = ADAPTER.build_env(engine, "s3cret")
    argv = ADAPTER.build_argv(engine, Features(), port=1)
    assert env["VLLM_API_KEY"] == "s3cret"
    assert not any("s3cret" in a for a in argv)


# --- flag discovery and version gating --------------------------------------------------------

def test_parse_help_finds_flags_and_choices(flags_0_32: FlagSet) -> None:
    assert flags_0_32.version == "0.32.0"
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching", "--speculative-config", "--kv-offloading-size",
                 "--cpu-offload-gb", "--enforce-eager", "--max-num-seqs", "--tensor-parallel-size"):
        assert flags_0_32.has(flag), flag
    assert "native" in flags_0_32.choices["--kv-offloading-backend"]
    assert "fp8_e4m3" in flags_0_32.choices["--kv-cache-dtype"]
    assert not flags_0_32.has("--no-such-flag")


def test_all_feature_flags_exist_in_vllm_0_32(flags_0_32: FlagSet) -> None:
    everything = Features(
        weights_dtype="fp8", kv_cache_dtype="fp8", prefix_caching=False, cpu_offload_gib=1, kv_offload_gib=1,
        kv_offload_backend="native", gpu_memory_utilization=0.9, max_num_seqs=8, max_num_batched_tokens=4096,
        max_model_len=4096, cuda_graphs=False, chunked_prefill=True, tensor_parallel_size=2, pipeline_parallel_size=2,
        speculative=SpeculativeConfig(method="ngram"))
    assert ADAPTER.version_issues(everything, flags_0_32) == []


def test_flag_missing_from_installed_version_is_refused_naming_the_version() -> None:
    old = FlagSet(engine="vllm", version="0.6.0", flags=["--model", "--enable-prefix-caching", "--port", "--host"])
    issues = ADAPTER.version_issues(Features(kv_offload_gib=4, kv_offload_backend="native"), old)
    messages = [i.message for i in issues]
    assert "--kv-offloading-size is not supported by the installed vLLM 0.6.0" in messages
    assert "--kv-offloading-backend is not supported by the installed vLLM 0.6.0" in messages


def test_unknown_extra_arg_is_refused(flags_0_32: FlagSet) -> None:
    issues = ADAPTER.version_issues(Features(extra_args=["--enable-turbo-mode"]), flags_0_32)
    assert [i.message for i in issues] == ["--enable-turbo-mode is not supported by the installed vLLM 0.32.0"]


def test_choice_the_version_lacks_is_refused() -> None:
    old = FlagSet(engine="vllm", version="0.5.0", flags=["--kv-cache-dtype"], choices={"--kv-cache-dtype": ["auto", "fp8"]})
    issues = ADAPTER.version_issues(Features(kv_cache_dtype="fp8_e5m2"), old)
    assert issues and "fp8_e5m2 is not accepted by vLLM 0.5.0" in issues[0].message


# --- validation messages ----------------------------------------------------------------------

def messages(features: Features, hardware: HardwareInfo | None = None, engine: EngineConfig | None = None,
             flags: FlagSet | None = None) -> dict[str, str]:
    engine = engine or EngineConfig(model="org/model", runtime=RuntimeConfig(kind="executable", executable="vllm"))
    return {f"{i.severity}:{i.field}": i.message for i in ADAPTER.validate(engine, features, flags, hardware)}


def test_valid_gpu_config_has_no_issues() -> None:
    assert messages(Features(weights_dtype="fp8", prefix_caching=True, tensor_parallel_size=2), gpus(2)) == {}


@pytest.mark.parametrize("util", [0.0, -0.1, 1.5])
def test_utilization_outside_unit_interval(util: float) -> None:
    msg = messages(Features(gpu_memory_utilization=util), gpus(1))
    assert msg["error:gpu_memory_utilization"] == f"must be in (0, 1] (a fraction of GPU memory), got {util}"


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_speculation_needing_a_draft_model(method: str) -> None:
    msg = messages(Features(speculative=SpeculativeConfig(method=method)), gpus(1))  # type: ignore[arg-type]
    assert msg["error:speculative.draft_model"].startswith(f"speculative method '{method}' needs a draft model")


def test_kv_offload_without_backend() -> None:
    msg = messages(Features(kv_offload_gib=8), gpus(1))
    assert msg["error:kv_offload_backend"].startswith("KV offload needs a backend")


@pytest.mark.parametrize("method", ["off", "ngram", "mtp"])
def test_draft_model_ignored_is_a_warning(method: str) -> None:
    msg = messages(Features(speculative=SpeculativeConfig(method=method, draft_model="org/draft")), gpus(1))  # type: ignore[arg-type]
    assert msg == {"warning:speculative.draft_model": f"a draft model is ignored with speculative method '{method}'"}


def test_kv_offload_backend_without_size_is_a_warning() -> None:
    msg = messages(Features(kv_offload_backend="native"), gpus(1))
    assert msg == {"warning:kv_offload_gib": "a KV offload backend is set but kv_offload_gib is 0: nothing is offloaded"}


@pytest.mark.parametrize("dtype", ["fp8", "awq", "gptq"])
def test_quantized_weights_on_the_cpu_build_are_a_warning(dtype: str) -> None:
    msg = messages(Features(weights_dtype=dtype), HardwareInfo(cpu_flags=["avx512f"]), engine=EngineConfig())  # type: ignore[arg-type]
    assert msg == {"warning:weights_dtype": f"{dtype} weights are unlikely to run on the CPU build"}


def test_tp_larger_than_visible_gpus() -> None:
    msg = messages(Features(tensor_parallel_size=4), gpus(2))
    assert msg["error:tensor_parallel_size"] == "tensor x pipeline parallel size 4 needs 4 GPUs; 2 visible"


def test_fp8_weights_on_a_gpu_without_fp8() -> None:
    msg = messages(Features(weights_dtype="fp8"), gpus(1, cc=(8, 0)))
    assert msg["error:weights_dtype"].startswith("FP8 weights need compute capability 8.9+")


def test_gpu_build_without_gpu() -> None:
    msg = messages(Features(), HardwareInfo(nvml_error="no driver"))
    assert "needs an NVIDIA GPU and none is visible" in msg["error:engine.runtime"]


def test_fp8_kv_cache_on_cpu_without_avx512() -> None:
    cpu = HardwareInfo(cpu_flags=["avx2", "fma"])
    msg = messages(Features(kv_cache_dtype="fp8"), cpu, engine=EngineConfig())
    assert msg["error:kv_cache_dtype"] == "FP8 KV cache on vLLM's CPU build needs AVX-512 or AMX, which this CPU lacks"
    assert messages(Features(kv_cache_dtype="fp8"), HardwareInfo(cpu_flags=["avx512f"]), engine=EngineConfig()) == {}


def test_reserved_and_duplicated_extra_args() -> None:
    msg = messages(Features(prefix_caching=True, extra_args=["--port", "1", "--enable-prefix-caching"]), gpus(1))
    assert msg["error:extra_args"] in ("--port is set by tunebench from the configuration; set it there",
                                       "--enable-prefix-caching is already set by a feature toggle")
    all_msgs = [i.message for i in ADAPTER.validate(EngineConfig(), Features(prefix_caching=True, extra_args=[
        "--port", "1", "--enable-prefix-caching"]), None, None)]
    assert "--port is set by tunebench from the configuration; set it there" in all_msgs
    assert "--enable-prefix-caching is already set by a feature toggle" in all_msgs


def test_missing_model_path() -> None:
    msg = messages(Features(), gpus(1), engine=EngineConfig(model="/nonexistent/model",
                                                           runtime=RuntimeConfig(kind="executable", executable="vllm")))
    assert msg["error:engine.model"] == "model path not found: /nonexistent/model"


def test_chunked_prefill_off_needs_batched_tokens_at_least_model_len() -> None:
    msg = messages(Features(chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=8192), gpus(1))
    assert "must be at least max_model_len (8192)" in msg["error:max_num_batched_tokens"]


def test_pydantic_rejects_malformed_values() -> None:
    with pytest.raises(ValueError, match="ngram_prompt_lookup_min must not exceed"):
        SpeculativeConfig(method="ngram", ngram_prompt_lookup_min=5, ngram_prompt_lookup_max=2)
    with pytest.raises(ValueError, match="weights_dtype"):
        Features(weights_dtype="int3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs 'python'"):
        RuntimeConfig(kind="python")


# --- log knowledge, from real vLLM 0.32 CPU log lines -----------------------------------------

REAL_LOG = [
    "(APIServer pid=2591) INFO 11-29 07:41:17 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 18011, "
    "'model': '/m', 'enable_prefix_caching': True, 'speculative_config': {'method': 'ngram', 'num_speculative_tokens': 3}}",
    "(APIServer pid=2591) WARNING 11-29 07:41:17 [system_utils.py:255] Found ulimit of 20000 and failed to automatically "
    "increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] "
    "Too many open files`. Consider increasing with ulimit -n",
    "(Worker pid=2637) INFO 11-29 07:41:41 [cpu_model_runner.py:68] Starting to load model /m...",
    "(Worker pid=2637) INFO 11-29 07:41:42 [cpu_model_runner.py:87] Warming up model for the compilation...",
    "(EngineCore pid=2625) INFO 11-29 07:42:09 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, "
    "Maximum concurrency for 4,096 tokens per request: 256.00x",
    "(APIServer pid=2591) INFO 11-29 07:42:12 [entry.py:140] Starting vLLM server on http://127.0.0.1:18011",
    "INFO:     Application startup complete.",
]


def test_phases_from_real_log() -> None:
    phases = [match_phase(PHASE_PATTERNS, line) for line in REAL_LOG]
    assert phases == [None, None, Phase.LOADING_WEIGHTS, Phase.WARMING_UP, Phase.KV_CACHE, Phase.STARTING_SERVER,
                      Phase.READY]


def test_kv_cache_and_non_default_args_parsed() -> None:
    assert parse_kv_cache(REAL_LOG) == {"kv_cache_tokens": 1048576.0, "max_concurrency": 256.0,
                                        "max_concurrency_at_tokens": 4096.0}
    args = parse_non_default_args(REAL_LOG)
    assert args["enable_prefix_caching"] is True
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}


def test_verify_reports_active_and_inactive_features() -> None:
    checks = {c.key: c for c in ADAPTER.verify(
        Features(prefix_caching=True, speculative=SpeculativeConfig(method="ngram"), max_num_seqs=8), REAL_LOG,
        'vllm:prefix_cache_queries_total{engine="0"} 42.0\n')}
    # Echoed but no effect measured (no probe, no hits yet): accepted, not verified.
    assert checks["prefix_caching"].status == "accepted" and checks["prefix_caching"].active is True
    assert checks["speculative.method"].status == "accepted"
    assert checks["max_num_seqs"].status == "not active"  # requested, but the engine did not parse it
    off = ADAPTER.verify(Features(prefix_caching=False), REAL_LOG, "")
    assert off[0].status == "not active"


def _args_log(args: dict[str, object]) -> list[str]:
    return [f"(APIServer pid=1) INFO 11-29 07:41:17 [api_utils.py:286] non-default args: {args!r}"]


def test_verify_covers_parallelism_offload_chunking_and_speculative_details() -> None:
    wanted = Features(pipeline_parallel_size=2, chunked_prefill=False, cpu_offload_gib=4, kv_offload_gib=8,
                      kv_offload_backend="native",
                      speculative=SpeculativeConfig(method="eagle3", draft_model="org/head", num_speculative_tokens=3))
    echoed = {"pipeline_parallel_size": 2, "enable_chunked_prefill": False, "cpu_offload_gb": 4.0,
              "kv_offloading_size": 8.0, "kv_offloading_backend": "native",
              "speculative_config": {"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}}
    checks = {c.key: c for c in ADAPTER.verify(wanted, _args_log(echoed), "")}
    assert {k: c.active for k, c in checks.items()} == {
        "speculative.method": True, "pipeline_parallel_size": True, "chunked_prefill": True,
        "cpu_offload_gib": True, "kv_offload_gib": True}
    # The engine ran something else: each difference is caught and named.
    other = {**echoed, "pipeline_parallel_size": 1, "cpu_offload_gb": 2.0,
             "speculative_config": {"method": "eagle3", "model": "org/other", "num_speculative_tokens": 5}}
    checks = {c.key: c for c in ADAPTER.verify(wanted, _args_log(other), "")}
    assert checks["pipeline_parallel_size"].active is False and checks["cpu_offload_gib"].active is False
    spec = checks["speculative.method"]
    assert spec.active is False and "differs from the request in num_speculative_tokens, model" in spec.evidence
    assert checks["chunked_prefill"].active is True


@pytest.mark.parametrize(
    ("line", "code", "words"),
    [
        ("NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.", "fp8_kv_cpu", "AVX-512 or AMX"),
        ("RuntimeError: Unsupported CPU attention configuration: head_dim=16", "cpu_head_dim", "head size (16)"),
        ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
         "no_kv_memory", "raise GPU memory utilization"),
        ("ValueError: Free memory on device (10.5/79.1 GiB) on startup is less than desired GPU memory utilization "
         "(0.9, 71.2 GiB).", "free_memory_low", "Another process already holds GPU memory"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom", "ran out of memory"),
        ("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 89. "
         "Current capability: 80.", "fp8_unsupported_gpu", "cannot run fp8 weights"),
        ("OSError: [Errno 98] Address already in use", "port_in_use", "port is already in use"),
        ("OSError: /nope does not appear to have a file named config.json.", "model_missing", "model was not found"),
        ("api_server.py: error: unrecognized arguments: --turbo", "unknown_flag", "--turbo"),
        ("docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
         "docker_daemon", "daemon is not running"),
        ("docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].",
         "docker_gpu", "NVIDIA Container Toolkit"),
    ],
)
def test_diagnosis_catalogue(line: str, code: str, words: str) -> None:
    diagnosis = ADAPTER.diagnose([*REAL_LOG[:2], "Traceback (most recent call last):", line])
    assert diagnosis is not None and diagnosis.code == code
    assert words in diagnosis.message


def test_warnings_are_not_mistaken_for_the_fatal_error() -> None:
    diagnosis = ADAPTER.diagnose([*REAL_LOG, "RuntimeError: Engine core initialization failed. See root cause above."])
    assert diagnosis is not None and diagnosis.code == "error"
    assert "Engine core initialization failed" in diagnosis.message
    assert ADAPTER.diagnose(REAL_LOG) is None


def test_docker_mounts_a_local_model_read_only(tmp_path: Path) -> None:
    model = tmp_path / "my model"
    model.mkdir()
    engine = EngineConfig(model=str(model), runtime=RuntimeConfig(kind="docker"))
    argv = ADAPTER.build_argv(engine, Features(), port=9000)
    assert argv[argv.index("-v") + 1] == f"{model}:{model}:ro"
