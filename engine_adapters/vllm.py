"""The vLLM adapter: features -> flags, flag discovery per installed version, validation,
startup phases, fatal-error diagnosis, feature verification and metric names.

Facts about vLLM live here and only here; the rest of tunebench asks this module.

Why one module: everything tunebench knows about one engine (its flags, help layout,
log, diagnosis, metric names, verification by effect) kept together, so a new release's changes
land in one file; what all adapters share is ``engine_adapters.command_line``.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine_adapters.base import (
    Diagnosis,
    FeatureCheck,
    FeatureStatus,
    FlagSet,
    MetricNames,
    Phase,
    PhasePattern,
    ValidationIssue,
    http_ok,
)
from engine_adapters.command_line import (
    DiagnosisRule,
    FlagRule,
    cached_flag_set,
    counter_change,
    diagnose_log,
    diagnosis_rule,
    env_with_api_key,
    extra_args_issues,
    flag_terms,
    model_path_issues,
    probe_prompt_len,
    rendered_flags,
    run_help,
    version_issues,
)
from engine_adapters.config import EngineConfig, Features
from engine_adapters.features import not_offered
from engine_adapters.hardware import HardwareInfo
from engine_adapters.prometheus import metric_total
from engine_adapters.runtimes import (
    RuntimeErrorMessage,
    managed_runtime,
    resolve_executable,
    resolve_model,
    resolve_python,
)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
GPU_IMAGE = "vllm/vllm-openai"
"""The official image (tags ``v<version>``), whose entrypoint is ``vllm serve``."""
CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo"
"""vLLM's x86 CPU image (tags ``v<version>``): it runs without GPUs."""


def is_cpu_image(image: str) -> bool:
    """An image built for CPUs (its name says so): started without ``--gpus``, which fails on a
    host without the NVIDIA container runtime."""
    name = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return "cpu" in name.lower()


# --- feature -> flag mapping --------------------------------------------------------------------

_WEIGHTS_FLAGS: dict[str, list[str]] = {
    "auto": [],
    "bf16": ["--dtype", "bfloat16"],
    "fp16": ["--dtype", "float16"],
    "fp8": ["--quantization", "fp8"],
    "awq": ["--quantization", "awq"],
    "gptq": ["--quantization", "gptq"],
}


def _num(value: float) -> str:
    """Render a number without a trailing '.0' for integral floats (vLLM parses both)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def speculative_config_json(features: Features) -> str | None:
    spec = features.speculative
    if spec.method == "off":
        return None
    body: dict[str, object] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method == "ngram":
        body["prompt_lookup_max"] = spec.ngram_prompt_lookup_max
        body["prompt_lookup_min"] = spec.ngram_prompt_lookup_min
    if spec.draft_model:
        body["model"] = spec.draft_model
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


FLAG_RULES: tuple[FlagRule, ...] = (
    FlagRule("weights_dtype", lambda f: list(_WEIGHTS_FLAGS[f.weights_dtype])),
    FlagRule("kv_cache_dtype", lambda f: [] if f.kv_cache_dtype == "auto" else ["--kv-cache-dtype", f.kv_cache_dtype]),
    FlagRule("prefix_caching", lambda f: [] if f.prefix_caching is None else
             ["--enable-prefix-caching" if f.prefix_caching else "--no-enable-prefix-caching"]),
    FlagRule("speculative.method", lambda f: [] if (s := speculative_config_json(f)) is None else ["--speculative-config", s]),
    FlagRule("cpu_offload_gib", lambda f: ["--cpu-offload-gb", _num(f.cpu_offload_gib)] if f.cpu_offload_gib > 0 else []),
    FlagRule("kv_offload_gib", lambda f: (["--kv-offloading-size", _num(f.kv_offload_gib)] if f.kv_offload_gib > 0 else [])
             + (["--kv-offloading-backend", f.kv_offload_backend] if f.kv_offload_backend and f.kv_offload_gib > 0 else [])),
    FlagRule("gpu_memory_utilization", lambda f: [] if f.gpu_memory_utilization is None else
             ["--gpu-memory-utilization", _num(f.gpu_memory_utilization)]),
    FlagRule("max_num_seqs", lambda f: [] if f.max_num_seqs is None else ["--max-num-seqs", str(f.max_num_seqs)]),
    FlagRule("max_num_batched_tokens", lambda f: [] if f.max_num_batched_tokens is None else
             ["--max-num-batched-tokens", str(f.max_num_batched_tokens)]),
    FlagRule("max_model_len", lambda f: [] if f.max_model_len is None else ["--max-model-len", str(f.max_model_len)]),
    FlagRule("cuda_graphs", lambda f: [] if f.cuda_graphs else ["--enforce-eager"]),
    FlagRule("chunked_prefill", lambda f: [] if f.chunked_prefill is None else
             ["--enable-chunked-prefill" if f.chunked_prefill else "--no-enable-chunked-prefill"]),
    FlagRule("tensor_parallel_size", lambda f: [] if f.tensor_parallel_size == 1 else
             ["--tensor-parallel-size", str(f.tensor_parallel_size)]),
    FlagRule("pipeline_parallel_size", lambda f: [] if f.pipeline_parallel_size == 1 else
             ["--pipeline-parallel-size", str(f.pipeline_parallel_size)]),
    FlagRule("data_parallel_size", lambda f: [] if f.data_parallel_size == 1 else
             ["--data-parallel-size", str(f.data_parallel_size)]),
    FlagRule("distributed_executor_backend", lambda f: [] if f.distributed_executor_backend is None else
             ["--distributed-executor-backend", f.distributed_executor_backend]),
    # Export-only: the launch recipes (app.export) place the GPUs on machines; validate refuses
    # nodes > 1 for a local launch, so no flag is ever rendered for it.
    FlagRule("nodes", lambda f: []),
    FlagRule("reasoning_parser", lambda f: [] if f.reasoning_parser is None else ["--reasoning-parser", f.reasoning_parser]),
    FlagRule("extra_args", lambda f: list(f.extra_args)),
)

# What the engine does when a switch is left unset (None), so the GUI can say "on (engine
# default)" instead of a third checkbox state. vLLM 0.32 (EngineArgs.
# _set_default_chunked_prefill_and_prefix_caching_args): both on for text-generation models.
ENGINE_DEFAULTS: Mapping[str, object] = {"prefix_caching": True, "chunked_prefill": True}

# Flags tunebench sets itself; extra_args must not override them behind the config's back.
RESERVED_FLAGS = frozenset({"--host", "--port", "--model", "--api-key", "--served-model-name", "--tokenizer"})


def feature_flags(features: Features) -> dict[str, list[str]]:
    """Per feature key, the flags it contributes (empty when the engine default applies)."""
    return rendered_flags(FLAG_RULES, features)


def flag_names(tokens: Iterable[str]) -> list[str]:
    """The ``--flag`` names among argv tokens (``--x=1`` counts as ``--x``)."""
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


# --- log knowledge ----------------------------------------------------------------------------

PHASE_PATTERNS: tuple[PhasePattern, ...] = tuple(
    PhasePattern(phase, re.compile(rx))
    for phase, rx in (
        (Phase.READY, r"Application startup complete"),
        (Phase.STARTING_SERVER, r"Starting vLLM (API )?server on|Available routes are"),
        (Phase.KV_CACHE, r"(CPU|GPU) KV cache size|# (GPU|CPU) blocks|Maximum concurrency for"),
        (Phase.WARMING_UP, r"Warming up model|Capturing CUDA graph|torch\.compile|Compiling a graph|init engine .* took"),
        (Phase.PROFILING, r"Memory profiling takes|profil(e|ing) run|Available KV cache memory"),
        (Phase.LOADING_WEIGHTS, r"Starting to load model|Loading weights|Loading safetensors|Model loading took"),
    )
)

KV_CACHE_RE = re.compile(r"(?P<device>CPU|GPU) KV cache size: (?P<tokens>[\d,]+) tokens")
CONCURRENCY_RE = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.,]+)x")
NON_DEFAULT_RE = re.compile(r"non-default args: (?P<args>\{.*\})")


_rule = diagnosis_rule


DIAGNOSIS_RULES: tuple[DiagnosisRule, ...] = (
    _rule("fp8_kv_cpu", r"FP8 KV cache on CPU requires",
          "This CPU cannot keep the KV cache in FP8 (vLLM's CPU build needs AVX-512 or AMX for it): "
          "set KV-cache precision to 'auto'."),
    _rule("cpu_head_dim", r"Unsupported CPU attention configuration: head_dim=(\d+)",
          lambda m: f"The CPU attention backend does not support this model's head size ({m.group(1)}); "
                    "it needs a head_dim of at least 32. Use a model with larger heads or a GPU engine."),
    _rule("head_size", r"Head size (\d+) is not supported",
          lambda m: f"The attention backend does not support head size {m.group(1)} for this model; "
                    "try another attention backend or model."),
    _rule("no_kv_memory", r"No available memory for the cache blocks",
          "The weights left no memory for the KV cache: raise GPU memory utilization, lower max model "
          "length, use FP8 weights, or split the model with tensor parallelism."),
    _rule("free_memory_low", r"Free memory on device.*less than desired GPU memory utilization",
          "Another process already holds GPU memory, so the requested utilization cannot be met: free "
          "the GPU (see nvidia-smi) or lower GPU memory utilization."),
    _rule("kv_too_small", r"max_model_len.*larger than the maximum number of tokens that can be stored in KV cache"
                          r"|To serve at least one request with the models's max seq len",
          "The KV cache cannot hold even one request of the maximum model length: lower max model length, "
          "raise GPU memory utilization, or use an FP8 KV cache."),
    _rule("cuda_oom", r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError",
          "The GPU ran out of memory while starting: lower GPU memory utilization or max model length, "
          "quantize the weights (FP8/INT4), or use tensor parallelism."),
    _rule("fp8_unsupported_gpu", r"quantization method (\S+) is not supported for the current GPU",
          lambda m: f"This GPU cannot run {m.group(1)} weights (FP8 needs compute capability 8.9+: Ada, "
                    "Hopper or newer): choose another weight precision."),
    _rule("port_in_use", r"Address already in use|\[Errno 98\]",
          "The port is already in use by another process: choose another port, or 0 for a free one."),
    _rule("model_missing", r"does not appear to have a file named config\.json|is not a local folder and is not a valid "
                           r"model identifier|Repo id must be|HFValidationError|Invalid repository ID"
                           r"|No such file or directory: .*config\.json|We couldn't connect to .* to load",
          "The model was not found: it is neither a local directory with a config.json nor reachable on a "
          "model hub. Check the path (or download it first)."),
    _rule("unknown_flag", r"error: unrecognized arguments: (.*)",
          lambda m: f"The engine does not know these arguments: {m.group(1).strip()} (check the installed version)."),
    _rule("bad_argument", r"error: argument (--\S+): (.*)",
          lambda m: f"The engine rejected {m.group(1)}: {m.group(2).strip()}"),
    _rule("docker_daemon", r"Cannot connect to the Docker daemon",
          "Docker is installed but its daemon is not running (or not reachable): start it, or use another runtime."),
    _rule("docker_gpu", r"could not select device driver .* with capabilities: \[\[gpu\]\]",
          "Docker cannot give the container a GPU: install the NVIDIA Container Toolkit, or use another runtime."),
    _rule("docker_image", r"Unable to find image .* locally[\s\S]*?(pull access denied|manifest unknown)|pull access denied",
          "The docker image could not be found or pulled: check the image name and your registry access."),
    _rule("no_gpu", r"Failed to infer device type|No CUDA GPUs are available|Found no NVIDIA driver",
          "This engine build needs a GPU, and none is usable here: use the vllm-cpu runtime on this machine."),
)

_GENERIC_ERROR_RE = re.compile(r"(\w+(Error|Exception)): (.+)")
_NOT_AN_ERROR_RE = re.compile(r"\b(INFO|WARNING|DEBUG)\b|Warning:")


# --- metric names ---------------------------------------------------------------------------

METRIC_NAMES = MetricNames(
    gauges={
        "requests_running": ("vllm:num_requests_running",),
        "requests_waiting": ("vllm:num_requests_waiting",),
        "kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
    },
    counters={
        "generation_tokens": ("vllm:generation_tokens_total",),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "spec_decode_drafts": ("vllm:spec_decode_num_drafts_total",),
        "spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
        "spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
        "requests_finished": ("vllm:request_success_total",),
        "preemptions": ("vllm:num_preemptions_total",),
    },
    histograms={
        "ttft_s": ("vllm:time_to_first_token_seconds",),
        "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e_s": ("vllm:e2e_request_latency_seconds",),
        "queue_s": ("vllm:request_queue_time_seconds",),
        # Tokens scheduled per engine step (prefill and decode): how much batching the engine
        # actually achieves, which a memory-bound decode turns into throughput.
        "tokens_per_step": ("vllm:iteration_tokens_total",),
    },
)


def parse_non_default_args(log_lines: Sequence[str]) -> dict[str, object]:
    """The dict vLLM logs as 'non-default args: {...}' (its own reading of our argv)."""
    for line in log_lines:
        match = NON_DEFAULT_RE.search(line)
        if match:
            try:
                value = ast.literal_eval(match.group("args"))
            except (ValueError, SyntaxError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def parse_kv_cache(log_lines: Sequence[str]) -> dict[str, float]:
    """KV cache capacity reported at startup: tokens, and max concurrency at a request length."""
    out: dict[str, float] = {}
    for line in log_lines:
        if m := KV_CACHE_RE.search(line):
            out["kv_cache_tokens"] = float(m.group("tokens").replace(",", ""))
        if m := CONCURRENCY_RE.search(line):
            out["max_concurrency"] = float(m.group("x").replace(",", ""))
            out["max_concurrency_at_tokens"] = float(m.group("len").replace(",", ""))
    return out


class VllmAdapter:
    """vLLM (GPU builds and the CPU build)."""

    kind = "vllm"
    display_name = "vLLM"
    health_path = "/health"
    metrics_path = "/metrics"
    metric_names = METRIC_NAMES
    phase_patterns: Sequence[PhasePattern] = PHASE_PATTERNS
    api_key_env = "VLLM_API_KEY"
    client_keep_alive = True
    engine_defaults: Mapping[str, object] = ENGINE_DEFAULTS

    # -- readiness ------------------------------------------------------------------------------

    def is_ready(self, base_url: str, timeout_s: float = 1.0) -> bool:
        """vLLM answers /health with 200 once the model is loaded and the API server listens."""
        return http_ok(base_url + self.health_path, timeout_s)

    def engine_terms(self, features: Features) -> dict[str, str]:
        return flag_terms(feature_flags(features))

    def kv_cache(self, log_lines: Sequence[str]) -> dict[str, float]:
        return parse_kv_cache(log_lines)

    # -- launch ---------------------------------------------------------------------------------

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        """argv prefix that starts the server; ``port`` is needed to publish a docker port.
        ``portable``: for a script run elsewhere, an executable is named as configured (found on
        that machine's PATH) instead of resolved here, where it may not be installed."""
        runtime = engine.runtime
        if runtime.kind in ("managed", "python"):
            python = resolve_python(engine)
            assert python is not None
            return [python, "-m", API_SERVER_MODULE]
        if runtime.kind == "executable":
            assert runtime.executable is not None
            return [runtime.executable if portable else resolve_executable(engine), "serve"]
        return self._docker_prefix(engine, engine.port if port is None else port)

    def _docker_prefix(self, engine: EngineConfig, port: int) -> list[str]:
        """``docker run`` for the official image, whose entrypoint is ``vllm serve``."""
        gpus = [] if is_cpu_image(engine.runtime.docker_image) else ["--gpus", "all"]
        argv = ["docker", "run", "--rm", "--init", "--ipc=host", *gpus,
                "-p", f"{engine.host}:{port}:{port}", "-e", self.api_key_env]
        for name in sorted(engine.runtime.env):
            argv += ["-e", name]
        try:
            model = Path(resolve_model(engine.model)).expanduser()
        except RuntimeErrorMessage:
            model = Path(engine.model)
        if model.is_absolute() and model.exists():
            argv += ["-v", f"{model}:{model}:ro"]
        return [*argv, engine.runtime.docker_image]

    def model_args(self, engine: EngineConfig) -> list[str]:
        model = resolve_model(engine.model)
        args = ["--model", model] if engine.runtime.kind in ("managed", "python") else [model]
        if engine.served_model_name:
            args += ["--served-model-name", engine.served_model_name]
        if engine.tokenizer:
            args += ["--tokenizer", engine.tokenizer]
        return args

    def server_args(self, engine: EngineConfig, port: int) -> list[str]:
        host = "0.0.0.0" if engine.runtime.kind == "docker" else engine.host  # noqa: S104 - inside the container
        return ["--host", host, "--port", str(port)]

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        argv = [*self.base_command(engine, port, portable=portable), *self.model_args(engine),
                *self.server_args(engine, port)]
        for flags in feature_flags(features).values():
            argv += flags
        return argv

    def build_env(self, engine: EngineConfig, api_key: str | None) -> dict[str, str]:
        return env_with_api_key(engine, self.api_key_env, api_key)

    # -- flag discovery -------------------------------------------------------------------------

    def discover_flags(self, engine: EngineConfig) -> FlagSet:
        """Parse ``--help`` of the installed engine once per (interpreter, version)."""
        if engine.runtime.kind == "docker":
            raise RuntimeErrorMessage("flag discovery needs a local engine; docker images are not inspected")
        base = self.base_command(engine)
        version = self.installed_version(engine)
        return cached_flag_set("vllm", version, " ".join(base), lambda: run_help(base, 180), parse_help)

    def installed_version(self, engine: EngineConfig) -> str:
        python = resolve_python(engine)
        if python is not None:
            code = ("import importlib.metadata as m\n"
                    "for d in ('vllm', 'vllm-cpu'):\n"
                    "    try: print(m.version(d)); break\n"
                    "    except m.PackageNotFoundError: pass\n")
            cmd = [python, "-c", code]
        else:
            cmd = [resolve_executable(engine), "--version"]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        version = result.stdout.strip().splitlines()[-1:] if result.returncode == 0 else []
        if not version:
            raise RuntimeErrorMessage(f"could not determine the installed vLLM version ({' '.join(cmd[:1])})")
        return version[0].strip()

    # -- validation -----------------------------------------------------------------------------

    def is_cpu_build(self, engine: EngineConfig, flags: FlagSet | None) -> bool:
        if engine.runtime.kind == "managed":
            return managed_runtime(engine.runtime.managed).name.endswith("-cpu")
        return flags is not None and "cpu" in flags.version

    def validate(
        self, engine: EngineConfig, features: Features, flags: FlagSet | None, hardware: HardwareInfo | None
    ) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        add = issues.append
        spec = features.speculative
        cpu_build = self.is_cpu_build(engine, flags)

        util = features.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            add(ValidationIssue("gpu_memory_utilization",
                                f"must be in (0, 1] (a fraction of GPU memory), got {util}"))
        if spec.method in ("eagle", "eagle3", "draft_model") and not spec.draft_model:
            add(ValidationIssue("speculative.draft_model",
                                f"speculative method '{spec.method}' needs a draft model (an EAGLE head or small model "
                                "trained for the target)"))
        if spec.method in ("off", "ngram", "mtp") and spec.draft_model:
            add(ValidationIssue("speculative.draft_model",
                                f"a draft model is ignored with speculative method '{spec.method}'", "warning"))
        if features.kv_offload_gib > 0 and not features.kv_offload_backend:
            add(ValidationIssue("kv_offload_backend",
                                "KV offload needs a backend: set kv_offload_backend to 'native' (vLLM's CPU offload) "
                                "or 'lmcache'"))
        if features.kv_offload_backend and features.kv_offload_gib == 0:
            add(ValidationIssue("kv_offload_gib", "a KV offload backend is set but kv_offload_gib is 0: nothing is "
                                                  "offloaded", "warning"))
        if (features.max_num_batched_tokens is not None and features.max_model_len is not None
                and features.chunked_prefill is False and features.max_num_batched_tokens < features.max_model_len):
            add(ValidationIssue("max_num_batched_tokens",
                                f"without chunked prefill, max_num_batched_tokens ({features.max_num_batched_tokens}) "
                                f"must be at least max_model_len ({features.max_model_len})"))

        parallel = features.gpu_count
        if (hardware is not None and parallel > 1 and not cpu_build and features.nodes == 1
                and parallel > len(hardware.gpus)):
            add(ValidationIssue("tensor_parallel_size",
                                f"tensor x pipeline{' x data' * (features.data_parallel_size > 1)} parallel size "
                                f"{parallel} needs {parallel} GPUs; "
                                f"{len(hardware.gpus)} visible"))
        issues += _multi_node_issues(engine, features)
        if hardware is not None and not cpu_build:
            if not hardware.has_gpu:
                add(ValidationIssue("engine.runtime",
                                    "this vLLM build needs an NVIDIA GPU and none is visible "
                                    f"({hardware.nvml_error or 'NVML found no device'}); use the vllm-cpu runtime"))
            elif features.weights_dtype == "fp8" and not any(g.supports_fp8 for g in hardware.gpus):
                add(ValidationIssue("weights_dtype",
                                    f"FP8 weights need compute capability 8.9+; {hardware.gpus[0].name} has "
                                    f"{hardware.gpus[0].compute_capability}"))
        if cpu_build:
            if features.kv_cache_dtype.startswith("fp8") and hardware is not None and not hardware.cpu_has_avx512_or_amx:
                add(ValidationIssue("kv_cache_dtype",
                                    "FP8 KV cache on vLLM's CPU build needs AVX-512 or AMX, which this CPU lacks"))
            for key, value, default in (("cpu_offload_gib", features.cpu_offload_gib, 0.0),
                                        ("kv_offload_gib", features.kv_offload_gib, 0.0),
                                        ("gpu_memory_utilization", features.gpu_memory_utilization, None)):
                if value != default:
                    add(ValidationIssue(key, "has no effect on the CPU build (it sizes the KV cache from "
                                             "VLLM_CPU_KVCACHE_SPACE)", "warning"))
            if features.weights_dtype in ("fp8", "awq", "gptq"):
                add(ValidationIssue("weights_dtype", f"{features.weights_dtype} weights are unlikely to run on the "
                                                     "CPU build", "warning"))
        for info in not_offered(self.kind, features):  # another engine's feature (features.py says whose)
            add(ValidationIssue(info.key, f"vLLM has no {info.noun} setting"))

        issues += extra_args_issues(features, feature_flags, flag_names, RESERVED_FLAGS)
        issues += model_path_issues(engine)

        if flags is not None:
            issues.extend(self.version_issues(features, flags))
        return issues

    def version_issues(self, features: Features, flags: FlagSet) -> list[ValidationIssue]:
        """Flags the installed version lacks, named with the version, before any launch."""
        return version_issues(feature_flags(features), flags, "vLLM", flag_names, _flag_values)

    # -- after launch ---------------------------------------------------------------------------

    def diagnose(self, log_lines: Iterable[str]) -> Diagnosis | None:
        return diagnose_log(DIAGNOSIS_RULES, log_lines, _GENERIC_ERROR_RE, not_an_error=_NOT_AN_ERROR_RE)

    # -- verification by effect -----------------------------------------------------------------

    def probe_requests(self, features: Features) -> list[dict[str, Any]]:
        """Two identical prompts of ``PREFIX_PROBE_TOKENS`` (prefix caching: the second must hit)
        and one repetitive prompt with a few dozen outputs (speculation: drafts are proposed and
        accepted). Token ids, so the lengths do not depend on the tokenizer; each with a cache
        salt of its own, so they neither hit nor leave anything a measured level could hit."""
        bodies: list[dict[str, Any]] = []
        if features.prefix_caching is not None:
            salt = _probe_salt()
            prompt = [PROBE_TOKEN_BASE + i % 89 for i in range(_prefix_probe_len(features))]
            bodies += [{"prompt": prompt, "max_tokens": 1, "temperature": 0.0, "cache_salt": salt}] * 2
        if features.speculative.method != "off":
            pattern = [PROBE_TOKEN_BASE + i for i in range(SPEC_PROBE_PERIOD)]
            bodies.append({"prompt": pattern * 8, "max_tokens": SPEC_PROBE_OUTPUT_TOKENS, "ignore_eos": True,
                           "temperature": 0.0, "cache_salt": _probe_salt()})
        return bodies

    def verify(self, features: Features, log_lines: Sequence[str], metrics_text: str, *,
               before_text: str | None = None, probe_error: str | None = None,
               model_config: Mapping[str, Any] | None = None) -> list[FeatureCheck]:
        """Verify by effect where vLLM shows one (prefix-cache hits on the probe's repeated
        prompt, drafts proposed and accepted, the KV capacity its dtype predicts); otherwise
        read back the engine's own echo of its arguments ("accepted")."""
        args = parse_non_default_args(log_lines)
        log = "\n".join(log_lines)
        probed = before_text is not None and probe_error is None and bool(metrics_text)
        unmeasured = f"; the probe failed: {probe_error}" if probe_error else ""

        delta = counter_change(metrics_text, before_text)

        checks: list[FeatureCheck] = []
        if features.prefix_caching is not None:
            checks.append(self._verify_prefix_caching(features, args, delta, probed, metrics_text, unmeasured))
        if features.kv_cache_dtype != "auto":
            checks.append(_verify_kv_dtype(features.kv_cache_dtype, args, log, log_lines, model_config))
        if features.speculative.method != "off":
            checks.append(_verify_speculation(features, args, delta, probed, unmeasured))
        # Settings the engine echoes verbatim in its non-default args: (feature, arg, value that
        # means "not requested", so nothing to verify). Echoed is "accepted", not verified.
        echoed: tuple[tuple[str, str, object], ...] = (
            ("max_num_seqs", "max_num_seqs", None), ("max_model_len", "max_model_len", None),
            ("max_num_batched_tokens", "max_num_batched_tokens", None),
            ("gpu_memory_utilization", "gpu_memory_utilization", None),
            ("tensor_parallel_size", "tensor_parallel_size", 1),
            ("pipeline_parallel_size", "pipeline_parallel_size", 1),
            ("chunked_prefill", "enable_chunked_prefill", None),
            ("cpu_offload_gib", "cpu_offload_gb", 0.0),
            ("kv_offload_gib", "kv_offloading_size", 0.0),
            ("reasoning_parser", "reasoning_parser", None),  # verified by the run's replies (app.verification)
        )
        for key, arg, unset in echoed:
            wanted = getattr(features, key)
            if wanted == unset:
                continue
            logged = args.get(arg)
            checks.append(FeatureCheck(key, str(wanted), _echo_status(logged == wanted), f"engine parsed {arg}={logged}"))
        if not features.cuda_graphs:
            logged = args.get("enforce_eager")
            checks.append(FeatureCheck("cuda_graphs", "False", _echo_status(logged is True),
                                       f"engine parsed enforce_eager={logged}"))
        if features.weights_dtype != "auto":
            want = {"bf16": ("dtype", "bfloat16"), "fp16": ("dtype", "float16")}.get(
                features.weights_dtype, ("quantization", features.weights_dtype))
            logged = args.get(want[0])
            checks.append(FeatureCheck("weights_dtype", features.weights_dtype, _echo_status(logged == want[1]),
                                       f"engine parsed {want[0]}={logged}"))
        return checks

    @staticmethod
    def _verify_prefix_caching(features: Features, args: Mapping[str, object], delta: Callable[[str], float | None],
                               probed: bool, metrics_text: str, unmeasured: str) -> FeatureCheck:
        wanted = bool(features.prefix_caching)
        logged = args.get("enable_prefix_caching")
        echo = (f"engine parsed enable_prefix_caching={logged}" if logged is not None
                else "not in the engine's non-default args")
        if logged is not None and bool(logged) != wanted:
            return FeatureCheck("prefix_caching", str(wanted), "not active", echo)
        hits, queries = delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")
        n = _prefix_probe_len(features)
        if probed and hits is not None:
            # The probe's prompts carry salts of their own: only its repeated prompt can hit.
            seen = (f"prefix-cache hits on {hits:,.0f} of {n:,} tokens of a repeated prompt" if hits
                    else f"no prefix-cache hits on a repeated {n:,}-token prompt ({queries or 0:,.0f} tokens queried)")
            if wanted == (hits > 0):
                return FeatureCheck("prefix_caching", str(wanted), "verified", seen)
            if n > PREFIX_PROBE_MIN_TOKENS:  # long enough to fill a block of any usual size
                return FeatureCheck("prefix_caching", str(wanted), "not active", f"{seen}; {echo}")
        elif wanted and (total := metric_total(metrics_text, "vllm:prefix_cache_hits_total")):
            queried = metric_total(metrics_text, "vllm:prefix_cache_queries_total") or 0.0
            return FeatureCheck("prefix_caching", "True", "verified",
                                f"{total:,.0f} of {queried:,.0f} queried tokens hit the prefix cache since start")
        status: FeatureStatus = "accepted" if logged is not None else "unknown"
        return FeatureCheck("prefix_caching", str(wanted), status, echo + unmeasured)


def _echo_status(matches: bool) -> FeatureStatus:
    return "accepted" if matches else "not active"


PROBE_TOKEN_BASE = 11  # probe prompts use token ids 11..99: ordinary tokens in any vocabulary
PREFIX_PROBE_TOKENS = 528  # 512 cacheable tokens: whole blocks of 16 (GPU) or 128 (CPU) tokens, and one to compute
PREFIX_PROBE_MIN_TOKENS = 2 * 128  # shorter (a small max_model_len): no hit does not prove caching is off
SPEC_PROBE_PERIOD = 8  # a prompt repeating every 8 tokens: an n-gram drafter always finds a match
SPEC_PROBE_OUTPUT_TOKENS = 32
KV_RATIO_TOLERANCE = 0.1  # capacity within 10% of a prediction (GiB are logged to two decimals)
KV_MEMORY_RE = re.compile(r"(?:Explicitly|Auto) set \((?P<cpu>[\d.]+)/[\d.]+\) GiB for KV cache"
                          r"|Available KV cache memory: (?P<gpu>[\d.]+) GiB")


def _probe_salt() -> str:
    return "tunebench-probe-" + secrets.token_hex(8)


def _prefix_probe_len(features: Features) -> int:
    return probe_prompt_len(features, PREFIX_PROBE_TOKENS)


def _verify_speculation(features: Features, args: Mapping[str, object], delta: Callable[[str], float | None],
                        probed: bool, unmeasured: str) -> FeatureCheck:
    spec = features.speculative
    logged = args.get("speculative_config")
    parsed = logged if isinstance(logged, dict) else {}
    # Each part the engine echoes must match: the method, how many tokens it drafts, the draft
    # model (vLLM echoes only what was set, so an absent part is not a mismatch).
    wanted_parts = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
                    "model": spec.draft_model}
    if spec.method == "ngram":
        wanted_parts["prompt_lookup_max"] = spec.ngram_prompt_lookup_max
    mismatched = [k for k, v in wanted_parts.items() if v is not None and k in parsed and parsed[k] != v]
    echo = "engine parsed speculative_config " + (
        ", ".join(f"{k}={parsed[k]}" for k in wanted_parts if k in parsed) or "(absent)")
    if mismatched:
        echo += f"; differs from the request in {', '.join(mismatched)}"
    if parsed.get("method") != spec.method or mismatched:
        return FeatureCheck("speculative.method", spec.method, "not active", echo)
    drafts = delta("vllm:spec_decode_num_drafts_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    probe = f"a {SPEC_PROBE_OUTPUT_TOKENS}-token probe on a repetitive prompt"
    if probed and drafts is not None:
        if drafts > 0 and (accepted or 0) > 0:
            return FeatureCheck("speculative.method", spec.method, "verified",
                                f"{drafts:,.0f} drafts proposed and {accepted:,.0f} draft tokens accepted in {probe}")
        if drafts > 0:
            return FeatureCheck("speculative.method", spec.method, "accepted",
                                f"{echo}; {drafts:,.0f} drafts proposed, none accepted in {probe}")
        return FeatureCheck("speculative.method", spec.method, "not active", f"{echo}; no drafts in {probe}")
    if not probed and drafts and accepted:
        return FeatureCheck("speculative.method", spec.method, "verified",
                            f"{drafts:,.0f} drafts proposed and {accepted:,.0f} draft tokens accepted since start")
    return FeatureCheck("speculative.method", spec.method, "accepted", echo + unmeasured)


def kv_bytes_per_token(model_config: Mapping[str, Any], element_bytes: int) -> int | None:
    """KV-cache bytes per token of a standard-attention model (keys and values of every layer),
    from its config.json; None for layouts this formula does not describe (MLA, missing sizes)."""
    config = model_config.get("text_config") if isinstance(model_config.get("text_config"), Mapping) else model_config
    if not isinstance(config, Mapping) or "kv_lora_rank" in config:
        return None
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * kv_heads * head_dim * element_bytes


def _verify_kv_dtype(dtype: str, args: Mapping[str, object], log: str, log_lines: Sequence[str],
                     model_config: Mapping[str, Any] | None) -> FeatureCheck:
    """FP8 keeps one byte per element where a 16-bit cache keeps two: the same KV memory must
    hold about twice the tokens. Compared with the capacity the engine reported."""
    used = re.search(r"Using fp8 data type to store kv cache", log)
    logged = args.get("kv_cache_dtype")
    echo = used.group(0) if used else f"engine parsed kv_cache_dtype={logged}"
    if not used and logged != dtype:
        return FeatureCheck("kv_cache_dtype", dtype, "not active", echo)
    tokens = parse_kv_cache(log_lines).get("kv_cache_tokens")
    memory = next((m for m in map(KV_MEMORY_RE.search, log_lines) if m), None)
    per_token_16 = kv_bytes_per_token(model_config or {}, 2)
    if not tokens or memory is None or per_token_16 is None:
        missing = "the model's config" if per_token_16 is None else "the KV capacity or memory in the log"
        return FeatureCheck("kv_cache_dtype", dtype, "accepted", f"{echo}; capacity not checked ({missing} unknown)")
    gib = float(memory.group("cpu") or memory.group("gpu"))
    at_16 = gib * 2**30 / per_token_16
    ratio = tokens / at_16
    seen = (f"the KV cache holds {tokens:,.0f} tokens in {gib:g} GiB, {ratio:.2f}x the {at_16:,.0f} a 16-bit "
            f"cache would")
    if abs(ratio - 2.0) <= 2.0 * KV_RATIO_TOLERANCE:
        return FeatureCheck("kv_cache_dtype", dtype, "verified", seen + " (fp8 predicts 2x)")
    if abs(ratio - 1.0) <= KV_RATIO_TOLERANCE:
        return FeatureCheck("kv_cache_dtype", dtype, "not active", seen + ": stored in 16 bits, not fp8")
    return FeatureCheck("kv_cache_dtype", dtype, "accepted", f"{echo}; {seen}, which fits no prediction")

def _multi_node_issues(engine: EngineConfig, features: Features) -> list[ValidationIssue]:
    """What a configuration spanning machines needs: tunebench launches on one machine only, so
    ``nodes > 1`` is exported (a Ray or LeaderWorkerSet recipe) and attached to with --endpoint."""
    issues: list[ValidationIssue] = []
    nodes, gpus = features.nodes, features.gpu_count
    if nodes > 1:
        issues.append(ValidationIssue(
            "nodes", f"{nodes} nodes cannot be launched by tunebench on this machine: export the recipe "
                     "(tunebench export PROFILE --format ray, or --format k8s-multinode), start it on the cluster, "
                     "then measure it with tunebench run --endpoint URL (and --gpu-metrics for its DCGM exporter)"))
        if gpus % nodes:
            issues.append(ValidationIssue(
                "nodes", f"{gpus} GPUs (tensor x pipeline x data parallel) cannot be split evenly over {nodes} nodes"))
    if features.distributed_executor_backend == "ray" and _has_ray(engine) is False:
        issues.append(ValidationIssue(
            "distributed_executor_backend", "the ray backend needs the ray package where vLLM runs "
                                            "(pip install ray), which this runtime lacks", "warning"))
    return issues


def _has_ray(engine: EngineConfig) -> bool | None:
    """Whether the engine's Python environment has the ``ray`` package (a directory lookup, no
    process: validation runs on every edit); None where it cannot be told (an executable, a container)."""
    if engine.runtime.kind not in ("managed", "python"):
        return None
    try:
        python = resolve_python(engine)
    except RuntimeErrorMessage:
        return None
    if python is None:
        return None
    venv = Path(python).parent.parent
    return any(venv.glob("lib/python3*/site-packages/ray/__init__.py"))


def _flag_values(tokens: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for i, token in enumerate(tokens):
        if token.startswith("--") and "=" in token:
            flag, value = token.split("=", 1)
            pairs.append((flag, value))
        elif token.startswith("--") and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            pairs.append((token, tokens[i + 1]))
    return pairs


_HELP_FLAG_RE = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
_HELP_CHOICES_RE = re.compile(r"\[(--[a-z0-9][a-z0-9-]*) \{([^}]*)\}")


def parse_help(text: str, version: str) -> FlagSet:
    """Flags and their choices from vLLM's ``--help`` (its usage block lists every flag)."""
    flags = sorted(set(_HELP_FLAG_RE.findall(text)))
    choices = {flag: [c.strip() for c in body.split(",")] for flag, body in _HELP_CHOICES_RE.findall(text)}
    return FlagSet(engine="vllm", version=version, flags=flags, choices=choices)


