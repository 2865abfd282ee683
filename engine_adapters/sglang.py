"""The SGLang adapter: features -> ``python -m sglang.launch_server`` flags, flag discovery from
the installed version's ``--help``, validation (what SGLang lacks is refused with the reason, so
the GUI greys it), startup phases, diagnosis, verification and its Prometheus metric names.

**Not yet run on a GPU.** No CPU wheel of SGLang exists, so nothing here has launched it: the
argv of every feature is tested against the ``--help`` of SGLang 0.5.23 and the metric table
against its ``/metrics`` (both recorded in ``tests/data/sglang/``, with how they were made).
:data:`GPU_VERIFIED` says so to the GUI, ``validate`` and the docs until a GPU run confirms it.

**Runtime.** A Python interpreter that has sglang (runtime kind ``python``, e.g. a GPU venv) or
the official image (``docker``, ``lmsysorg/sglang``). SGLang takes its API key only as
``--api-key``, which would show in the process list, so tunebench starts it through a one-line
launcher (:data:`LAUNCHER`) that moves the key from ``SGLANG_API_KEY`` into the server's own
argv inside the process. Metrics need ``--enable-metrics`` (always passed).

**Feature map** (SGLang's names): weights fp8/awq/gptq -> ``--quantization``, bf16/fp16 ->
``--dtype``; KV FP8 -> ``--kv-cache-dtype fp8_e4m3|fp8_e5m2``; prefix caching off ->
``--disable-radix-cache`` (on is its default); speculative decoding -> ``--speculative-algorithm``
EAGLE, EAGLE3, NEXTN (MTP), STANDALONE (a draft model) or NGRAM, with
``--speculative-num-steps``, ``--speculative-eagle-topk 1`` and ``--speculative-num-draft-tokens``
(steps + 1, SGLang's rule for a chain of top-1 drafts) and ``--speculative-draft-model-path``;
weight offload -> ``--cpu-offload-gb``; KV offload -> ``--enable-hierarchical-cache
--hicache-size`` (GB of host memory); GPU memory utilization -> ``--mem-fraction-static``; max
sequences -> ``--max-running-requests``; max batched tokens -> ``--chunked-prefill-size`` (the
chunk, or with chunked prefill off ``--max-prefill-tokens``); chunked prefill off ->
``--chunked-prefill-size -1``; max model length -> ``--context-length``; CUDA graphs off ->
``--disable-cuda-graph``; tensor/pipeline parallel -> ``--tp-size``/``--pp-size``.

Why one module: everything tunebench knows about one engine (its flags, help layout,
log, diagnosis, metric names, verification) kept together, so a new release's changes land in
one file; what all adapters share is ``engine_adapters.command_line``.
"""

from __future__ import annotations

import os
import re
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
    kv_capacity,
    logged_ints,
    model_path_issues,
    probe_prompt_len,
    rendered_flags,
    run_help,
    version_issues,
)
from engine_adapters.config import EngineConfig, Features
from engine_adapters.features import not_offered
from engine_adapters.hardware import HardwareInfo
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model, resolve_python

RECORDED_VERSION = "0.5.23"
"""The SGLang version whose ``--help`` and ``/metrics`` the tests check against."""
GPU_VERIFIED = False
"""Whether this adapter has run an SGLang server on a GPU (none yet: see the module docstring)."""
MATURITY = (f"not yet run on a GPU: argv and metric names are checked against SGLang {RECORDED_VERSION}'s "
            "recorded --help and /metrics only")
API_KEY_ENV = "SGLANG_API_KEY"
"""Read by :data:`LAUNCHER` (SGLang itself reads no variable for its key)."""
MODULE = "sglang.launch_server"
DOCKER_IMAGE = "lmsysorg/sglang"
"""The official image (tags ``v<version>``); it has no entrypoint: the command starts Python."""
VLLM_IMAGE_PREFIX = "vllm/vllm-openai"
"""The runtime's default image is vLLM's: a profile that leaves it gets the engine's own image."""


def docker_image(engine: EngineConfig, default: str) -> str:
    """The configured image, or ``default`` when the configuration kept vLLM's default image."""
    image = engine.runtime.docker_image
    return default if image.startswith(VLLM_IMAGE_PREFIX) else image
PORTABLE_PYTHON = "python3"
LAUNCHER = (f"import os, runpy, sys; key = os.environ.pop({API_KEY_ENV!r}, ''); "
            "sys.argv[1:1] = ['--api-key', key] if key else []; "
            f"runpy.run_module({MODULE!r}, run_name='__main__', alter_sys=True)")
"""``python -c LAUNCHER ARGS``: runs ``python -m sglang.launch_server --api-key KEY ARGS`` with
the key taken from the environment, so it never appears in a process list or a log."""

# --- metric names ---------------------------------------------------------------------------
# Checked against SGLang 0.5.23's collectors (sglang/srt/observability/metrics_collector.py) by
# tests/unit/test_sglang_adapter.py on the recorded /metrics. SGLang reports KV use as
# ``token_usage`` (a 0-1 fraction of the token pool) and prefix-cache reuse in tokens
# (``cached_tokens_total`` out of ``prompt_tokens_total``), the units of vLLM's prefix-cache
# queries and hits. It has no draft/accepted-token counters: speculation shows as its running
# accept length and rate (gauges) and as verify passes (``spec_verify_calls_total``).

METRIC_NAMES = MetricNames(
    gauges={
        "requests_running": ("sglang:num_running_reqs",),
        "requests_waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage_ratio": ("sglang:token_usage",),
        # SGLang's own running estimates; counter-derived rates take precedence when present.
        "generation_tok_per_s": ("sglang:gen_throughput",),
        "prefix_cache_hit_ratio": ("sglang:cache_hit_rate",),
        "spec_mean_acceptance_length": ("sglang:spec_accept_length",),
        "spec_acceptance_ratio": ("sglang:spec_accept_rate",),
    },
    counters={
        "generation_tokens": ("sglang:generation_tokens_total",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "prefix_cache_queries": ("sglang:prompt_tokens_total",),
        "prefix_cache_hits": ("sglang:cached_tokens_total",),
        "requests_finished": ("sglang:num_requests_total",),
        "preemptions": ("sglang:num_retracted_requests_total",),
    },
    histograms={
        "ttft_s": ("sglang:time_to_first_token_seconds",),
        "itl_s": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e_s": ("sglang:e2e_request_latency_seconds",),
        "queue_s": ("sglang:queue_time_seconds",),
    },
)
SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"

# --- feature -> flag mapping --------------------------------------------------------------------

_WEIGHTS_FLAGS: dict[str, list[str]] = {
    "auto": [], "bf16": ["--dtype", "bfloat16"], "fp16": ["--dtype", "float16"],
    "fp8": ["--quantization", "fp8"], "awq": ["--quantization", "awq"], "gptq": ["--quantization", "gptq"],
}
KV_CACHE_DTYPES: dict[str, str] = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
"""KV-cache precision -> SGLang's ``--kv-cache-dtype`` (plain ``fp8`` is E4M3, as in vLLM)."""
SPEC_ALGORITHMS: dict[str, str] = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "draft_model": "STANDALONE",
                                   "ngram": "NGRAM"}
"""tunebench's speculative method -> SGLang's ``--speculative-algorithm`` (NEXTN drafts with the
model's own multi-token-prediction layers; STANDALONE with a separate small model)."""
NEEDS_DRAFT_MODEL = frozenset({"eagle", "eagle3", "draft_model"})


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def speculative_flags(features: Features) -> list[str]:
    spec = features.speculative
    if spec.method == "off":
        return []
    n = spec.num_speculative_tokens
    flags = ["--speculative-algorithm", SPEC_ALGORITHMS[spec.method]]
    if spec.method != "ngram":
        flags += ["--speculative-num-steps", str(n), "--speculative-eagle-topk", "1"]
    flags += ["--speculative-num-draft-tokens", str(n + 1)]
    if spec.method in NEEDS_DRAFT_MODEL and spec.draft_model:
        flags += ["--speculative-draft-model-path", spec.draft_model]
    return flags


def _batched_tokens(features: Features) -> list[str]:
    """Chunked prefill on (or the engine's default): the chunk is the per-step token budget;
    off: ``-1`` and the budget of a prefill batch."""
    if features.chunked_prefill is False:
        budget = [] if features.max_num_batched_tokens is None else [
            "--max-prefill-tokens", str(features.max_num_batched_tokens)]
        return ["--chunked-prefill-size", "-1", *budget]
    if features.max_num_batched_tokens is None:
        return []
    return ["--chunked-prefill-size", str(features.max_num_batched_tokens)]


def _kv_offload(features: Features) -> list[str]:
    if features.kv_offload_gib <= 0:
        return []
    return ["--enable-hierarchical-cache", "--hicache-size", _num(features.kv_offload_gib)]


FLAG_RULES: tuple[FlagRule, ...] = (
    FlagRule("weights_dtype", lambda f: list(_WEIGHTS_FLAGS[f.weights_dtype])),
    FlagRule("kv_cache_dtype", lambda f: [] if (t := KV_CACHE_DTYPES.get(f.kv_cache_dtype)) is None
             else ["--kv-cache-dtype", t]),
    FlagRule("prefix_caching", lambda f: ["--disable-radix-cache"] if f.prefix_caching is False else []),
    FlagRule("speculative.method", speculative_flags),
    FlagRule("cpu_offload_gib", lambda f: ["--cpu-offload-gb", _num(f.cpu_offload_gib)] if f.cpu_offload_gib > 0 else []),
    FlagRule("kv_offload_gib", _kv_offload),
    FlagRule("gpu_memory_utilization", lambda f: [] if f.gpu_memory_utilization is None else
             ["--mem-fraction-static", _num(f.gpu_memory_utilization)]),
    FlagRule("max_num_seqs", lambda f: [] if f.max_num_seqs is None else ["--max-running-requests", str(f.max_num_seqs)]),
    FlagRule("max_num_batched_tokens", _batched_tokens),
    FlagRule("max_model_len", lambda f: [] if f.max_model_len is None else ["--context-length", str(f.max_model_len)]),
    FlagRule("cuda_graphs", lambda f: [] if f.cuda_graphs else ["--disable-cuda-graph"]),
    FlagRule("tensor_parallel_size", lambda f: [] if f.tensor_parallel_size == 1 else
             ["--tp-size", str(f.tensor_parallel_size)]),
    FlagRule("pipeline_parallel_size", lambda f: [] if f.pipeline_parallel_size == 1 else
             ["--pp-size", str(f.pipeline_parallel_size)]),
    FlagRule("reasoning_parser", lambda f: [] if f.reasoning_parser is None else ["--reasoning-parser", f.reasoning_parser]),
    FlagRule("extra_args", lambda f: list(f.extra_args)),
)
"""``chunked_prefill`` has no rule of its own: it shapes ``max_num_batched_tokens``'s flags."""

ENGINE_DEFAULTS: Mapping[str, object] = {"prefix_caching": True, "chunked_prefill": True}
"""SGLang 0.5.23: the radix (prefix) cache and chunked prefill are on unless switched off."""

ALIASES: tuple[tuple[str, ...], ...] = (
    ("--model-path", "--model"), ("--tp-size", "--tensor-parallel-size"), ("--pp-size", "--pipeline-parallel-size"),
    ("--speculative-draft-model-path", "--speculative-draft-model"),
    ("--enable-hierarchical-cache", "--enable-hicache"),
)
"""Spellings of one SGLang option (the first is the one tunebench writes), from the recorded help."""
_CANONICAL = {name: group[0] for group in ALIASES for name in group}
RESERVED_FLAGS = frozenset({"--model-path", "--host", "--port", "--api-key", "--served-model-name", "--tokenizer-path",
                            "--enable-metrics"})
"""Set by tunebench from the configuration; extra_args must not override them behind its back."""


def canonical_flag(flag: str) -> str:
    return _CANONICAL.get(flag, flag)


def feature_flags(features: Features) -> dict[str, list[str]]:
    """Per feature key, the flags it contributes (empty when the engine default applies)."""
    return rendered_flags(FLAG_RULES, features)


def flag_names(tokens: Iterable[str]) -> list[str]:
    """The ``--flag`` names among argv tokens (``--x=1`` counts as ``--x``; ``-1`` is a value)."""
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def flag_values(tokens: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for i, token in enumerate(tokens):
        if token.startswith("--") and "=" in token:
            flag, value = token.split("=", 1)
            pairs.append((flag, value))
        elif token.startswith("--") and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            pairs.append((token, tokens[i + 1]))
    return pairs


_OPTION_LINE_RE = re.compile(r"^ {2}(-\S.*)$")
_OPTION_NAME_RE = re.compile(r"(?:^|, )(--?[A-Za-z][\w-]*)")
_USAGE_CHOICES_RE = re.compile(r"\[(--[a-z0-9][a-z0-9-]*) \{([^}]*)\}")


def parse_help(text: str, version: str) -> FlagSet:
    """Flags and choices from SGLang's argparse ``--help``: each option entry starts two spaces
    in with its spellings (``--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE``), then two or
    more spaces and its description; the usage block gives the choices (``{a,b}``). Flags only
    named inside a description are not counted."""
    flags: set[str] = set()
    for line in text.splitlines():
        match = _OPTION_LINE_RE.match(line)
        if not match:
            continue
        invocation = re.split(r"\s{2,}", match.group(1), maxsplit=1)[0]
        flags.update(_OPTION_NAME_RE.findall(invocation))
    choices = {flag: [c.strip() for c in body.split(",")] for flag, body in _USAGE_CHOICES_RE.findall(text)}
    return FlagSet(engine="sglang", version=version, flags=sorted(flags), choices=choices)


# --- log knowledge ----------------------------------------------------------------------------

PHASE_PATTERNS: tuple[PhasePattern, ...] = tuple(
    PhasePattern(phase, re.compile(rx))
    for phase, rx in (
        (Phase.READY, r"The server is fired up and ready to roll"),
        (Phase.STARTING_SERVER, r"Uvicorn running on|Application startup complete|Starting server at"),
        (Phase.WARMING_UP, r"Capture (cuda|CUDA) graph|cuda graph capture|torch\.compile"),
        (Phase.KV_CACHE, r"KV Cache is allocated|Memory pool end|max_total_num_tokens="),
        (Phase.LOADING_WEIGHTS, r"Load weight begin|Loading safetensors|Load weight end"),
    )
)

KV_ALLOC_RE = re.compile(r"KV Cache is allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), "
                         r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)")
_SCHEDULER_RE = {key: re.compile(rf"\b{key}=(-?\d+)") for key in (
    "max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "context_len")}


def log_ints(log_lines: Sequence[str]) -> dict[str, int]:
    """What the scheduler logged it set up (``max_total_num_tokens=..., max_running_requests=...``)."""
    return logged_ints((line for line in log_lines if "max_total_num_tokens=" in line), _SCHEDULER_RE)


def parse_kv_cache(log_lines: Sequence[str]) -> dict[str, float]:
    """The token pool SGLang allocated, and how many requests of its context length fit."""
    ints = log_ints(log_lines)
    return kv_capacity(ints.get("max_total_num_tokens"), ints.get("context_len"))


_rule = diagnosis_rule


DIAGNOSIS_RULES: tuple[DiagnosisRule, ...] = (
    _rule("no_runtime", r"No module named '?sglang'?",
          "The interpreter has no SGLang: point runtime.python at a venv with sglang installed (it needs an NVIDIA "
          "GPU; no CPU wheel exists), or use the lmsysorg/sglang docker image."),
    _rule("unknown_flag", r"error: unrecognized arguments: (.*)",
          lambda m: f"The engine does not know these arguments: {m.group(1).strip()} (check the installed version: "
                    "`tunebench engine flags`)."),
    _rule("bad_argument", r"error: argument (--\S+): (.*)",
          lambda m: f"The engine rejected {m.group(1)}: {m.group(2).strip()}"),
    _rule("no_gpu", r"No CUDA GPUs are available|Found no NVIDIA driver|CUDA driver initialization failed"
                    r"|torch\.cuda\.is_available\(\) is False",
          "SGLang needs an NVIDIA GPU and found none usable here."),
    _rule("cuda_oom", r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|Not enough memory",
          "The GPU ran out of memory while starting: lower GPU memory utilization (--mem-fraction-static) or the "
          "context length, quantize the weights (FP8) or the KV cache, or use tensor parallelism."),
    _rule("port_in_use", r"Address already in use|\[Errno 98\]",
          "The port is already in use by another process: choose another port, or 0 for a free one."),
    _rule("model_missing", r"is not a local folder and is not a valid model identifier|Repo id must be"
                           r"|HFValidationError|We couldn't connect to .* to load|No such file or directory: .*config\.json",
          "The model was not found: it is neither a local directory with a config.json nor reachable on a model "
          "hub. Check the path (or download it first)."),
    _rule("docker_daemon", r"Cannot connect to the Docker daemon",
          "Docker is installed but its daemon is not running (or not reachable): start it, or use another runtime."),
    _rule("docker_gpu", r"could not select device driver .* with capabilities: \[\[gpu\]\]",
          "Docker cannot give the container a GPU: install the NVIDIA Container Toolkit, or use another runtime."),
)

_GENERIC_ERROR_RE = re.compile(r"\b(\w+(?:Error|Exception)): (.+)")
_NOT_AN_ERROR_RE = re.compile(r"\b(INFO|WARNING|DEBUG)\b|Warning:")


def needs_gpu_issue(display: str, hardware: HardwareInfo | None, parallel: int) -> list[ValidationIssue]:
    """The GPU checks every GPU-only engine shares: one visible, and enough for the parallel size."""
    if hardware is None:
        return []
    if not hardware.has_gpu:
        return [ValidationIssue("engine.runtime", f"{display} needs an NVIDIA GPU and none is visible "
                                                  f"({hardware.nvml_error or 'NVML found no device'})")]
    if parallel > len(hardware.gpus):
        return [ValidationIssue("tensor_parallel_size", f"tensor x pipeline parallel size {parallel} needs {parallel} "
                                                        f"GPUs; {len(hardware.gpus)} visible")]
    return []


class SglangAdapter:
    """SGLang's HTTP server (``python -m sglang.launch_server``)."""

    kind = "sglang"
    display_name = "SGLang"
    health_path = "/health"
    metrics_path = "/metrics"
    metric_names = METRIC_NAMES
    phase_patterns: Sequence[PhasePattern] = PHASE_PATTERNS
    api_key_env = API_KEY_ENV
    client_keep_alive = True
    engine_defaults: Mapping[str, object] = ENGINE_DEFAULTS
    gpu_verified = GPU_VERIFIED
    maturity = MATURITY
    install_hint = (f"pip install 'sglang=={RECORDED_VERSION}' in a CUDA venv (started as python -c LAUNCHER, i.e. "
                    "python -m sglang.launch_server with the key from SGLANG_API_KEY)")
    image_hint = f"{DOCKER_IMAGE}:v{RECORDED_VERSION}"
    default_image = f"{DOCKER_IMAGE}:latest"

    # -- readiness ------------------------------------------------------------------------------

    def is_ready(self, base_url: str, timeout_s: float = 1.0) -> bool:
        """SGLang answers /health (public, even with an API key) once its scheduler runs."""
        return http_ok(base_url + self.health_path, timeout_s)

    def engine_terms(self, features: Features) -> dict[str, str]:
        return flag_terms(feature_flags(features))

    def kv_cache(self, log_lines: Sequence[str]) -> dict[str, float]:
        return parse_kv_cache(log_lines)

    # -- launch ---------------------------------------------------------------------------------

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        runtime = engine.runtime
        if runtime.kind == "python":
            python = PORTABLE_PYTHON if portable else resolve_python(engine)
            assert python is not None
            return [python, "-c", LAUNCHER]
        if runtime.kind == "docker":
            return [*self._docker_prefix(engine, engine.port if port is None else port), PORTABLE_PYTHON, "-c",
                    LAUNCHER]
        raise RuntimeErrorMessage(f"SGLang runs from a Python interpreter that has sglang (runtime kind 'python') or "
                                  f"the {DOCKER_IMAGE} image (kind 'docker'); no managed runtime exists (there is no "
                                  "CPU wheel of SGLang)")

    def _docker_prefix(self, engine: EngineConfig, port: int) -> list[str]:
        argv = ["docker", "run", "--rm", "--init", "--ipc=host", "--gpus", "all",
                "-p", f"{engine.host}:{port}:{port}", "-e", self.api_key_env]
        for name in sorted(engine.runtime.env):
            argv += ["-e", name]
        try:
            model = Path(resolve_model(engine.model)).expanduser()
        except RuntimeErrorMessage:
            model = Path(engine.model)
        if model.is_absolute() and model.exists():
            argv += ["-v", f"{model}:{model}:ro"]
        return [*argv, docker_image(engine, self.default_image)]

    def model_args(self, engine: EngineConfig) -> list[str]:
        args = ["--model-path", resolve_model(engine.model)]
        if engine.served_model_name:
            args += ["--served-model-name", engine.served_model_name]
        if engine.tokenizer:
            args += ["--tokenizer-path", engine.tokenizer]
        return args

    def server_args(self, engine: EngineConfig, port: int) -> list[str]:
        host = "0.0.0.0" if engine.runtime.kind == "docker" else engine.host  # noqa: S104 - inside the container
        return ["--host", host, "--port", str(port)]

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        argv = [*self.base_command(engine, port, portable=portable), *self.model_args(engine),
                *self.server_args(engine, port), "--enable-metrics"]
        for flags in feature_flags(features).values():
            argv += flags
        return argv

    def build_env(self, engine: EngineConfig, api_key: str | None) -> dict[str, str]:
        return env_with_api_key(engine, self.api_key_env, api_key)

    # -- flag discovery -------------------------------------------------------------------------

    def discover_flags(self, engine: EngineConfig) -> FlagSet:
        """Parse ``python -m sglang.launch_server --help`` once per (interpreter, version)."""
        if engine.runtime.kind != "python":
            raise RuntimeErrorMessage("flag discovery needs a local SGLang interpreter (runtime kind 'python'); docker "
                                      "images are not inspected")
        python = resolve_python(engine)
        assert python is not None
        version = self.installed_version(engine)
        return cached_flag_set("sglang", version, python, lambda: run_help(
            [python, "-m", MODULE], 300, env={**os.environ, "COLUMNS": "100"}), parse_help)

    def installed_version(self, engine: EngineConfig) -> str:
        if engine.runtime.kind != "python":
            raise RuntimeErrorMessage("the SGLang version is read from a local interpreter (runtime kind 'python')")
        python = resolve_python(engine)
        assert python is not None
        cmd = [python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
        lines = result.stdout.strip().splitlines() if result.returncode == 0 else []
        if not lines:
            raise RuntimeErrorMessage(f"{python} has no sglang installed (SGLang needs a GPU venv; no CPU wheel exists)")
        return lines[-1].strip()

    # -- validation -----------------------------------------------------------------------------

    def validate(
        self, engine: EngineConfig, features: Features, flags: FlagSet | None, hardware: HardwareInfo | None
    ) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        add = issues.append
        add(ValidationIssue("engine.kind", f"the SGLang adapter is {MATURITY}", "warning"))
        if engine.runtime.kind not in ("python", "docker"):
            add(ValidationIssue("engine.runtime", f"SGLang runs from a Python interpreter that has sglang (runtime kind "
                                                  f"'python') or the {DOCKER_IMAGE} image (kind 'docker'); no "
                                                  "managed runtime exists (there is no CPU wheel of SGLang)"))
        issues += needs_gpu_issue("SGLang", hardware, features.gpus_per_replica)
        for info in not_offered(self.kind, features):
            add(ValidationIssue(info.key, f"SGLang has no {info.noun} setting"))
        self._feature_issues(features, hardware, add)

        issues += extra_args_issues(features, feature_flags, flag_names, RESERVED_FLAGS, canonical_flag)
        issues += model_path_issues(engine)
        if flags is not None:
            issues.extend(self.version_issues(features, flags))
        return issues

    @staticmethod
    def _feature_issues(features: Features, hardware: HardwareInfo | None,
                        add: Callable[[ValidationIssue], None]) -> None:
        spec = features.speculative
        if features.kv_cache_dtype in ("q8_0", "q4_0"):
            add(ValidationIssue("kv_cache_dtype", f"{features.kv_cache_dtype} is llama.cpp's block-quantized cache; "
                                                  "SGLang keeps KV in fp8_e4m3 or fp8_e5m2"))
        if spec.method in NEEDS_DRAFT_MODEL and not spec.draft_model:
            add(ValidationIssue("speculative.draft_model", f"speculative method '{spec.method}' needs a draft model "
                                                           "(an EAGLE head or a small model trained for the target)"))
        if spec.method in ("off", "ngram", "mtp") and spec.draft_model:
            add(ValidationIssue("speculative.draft_model",
                                f"a draft model is ignored with speculative method '{spec.method}'", "warning"))
        if spec.method == "ngram" and (spec.ngram_prompt_lookup_min, spec.ngram_prompt_lookup_max) != (1, 4):
            add(ValidationIssue("speculative.ngram_prompt_lookup_max", "SGLang's NGRAM drafter matches from its own "
                                "trie (--speculative-ngram-*); the n-gram window is not passed", "warning"))
        if features.kv_offload_backend == "lmcache":
            add(ValidationIssue("kv_offload_backend", "SGLang's KV offload here is its hierarchical cache (host "
                                                      "memory); LMCache is its own integration (--enable-lmcache): "
                                                      "use backend 'native' or pass it in extra_args"))
        if features.kv_offload_backend and features.kv_offload_gib == 0:
            add(ValidationIssue("kv_offload_gib", "a KV offload backend is set but kv_offload_gib is 0: nothing is "
                                                  "offloaded", "warning"))
        util = features.gpu_memory_utilization
        if util is not None and not 0 < util < 1:
            add(ValidationIssue("gpu_memory_utilization", f"must be in (0, 1) (SGLang's --mem-fraction-static: the "
                                                          f"share for weights and KV cache), got {util}"))
        if features.weights_dtype == "fp8" and hardware is not None and hardware.has_gpu \
                and not any(g.supports_fp8 for g in hardware.gpus):
            add(ValidationIssue("weights_dtype", f"FP8 weights need compute capability 8.9+; {hardware.gpus[0].name} "
                                                 f"has {hardware.gpus[0].compute_capability}"))

    def version_issues(self, features: Features, flags: FlagSet) -> list[ValidationIssue]:
        """Flags or values the installed version lacks, named with the version, before any launch."""
        return version_issues(feature_flags(features), flags, "SGLang", flag_names, flag_values)

    # -- after launch ---------------------------------------------------------------------------

    def diagnose(self, log_lines: Iterable[str]) -> Diagnosis | None:
        return diagnose_log(DIAGNOSIS_RULES, log_lines, _GENERIC_ERROR_RE, not_an_error=_NOT_AN_ERROR_RE)

    def probe_requests(self, features: Features) -> list[dict[str, Any]]:
        """Two identical prompts (prefix caching: the second must reuse the radix cache) and one
        repetitive prompt with a few dozen outputs (speculation: fewer verify passes than tokens)."""
        bodies: list[dict[str, Any]] = []
        if features.prefix_caching is not None:
            prompt = [PROBE_TOKEN_BASE + i % 89 for i in range(_prefix_probe_len(features))]
            bodies += [{"prompt": prompt, "max_tokens": 1, "temperature": 0.0}] * 2
        if features.speculative.method != "off":
            pattern = [PROBE_TOKEN_BASE + 50 + i for i in range(SPEC_PROBE_PERIOD)]
            bodies.append({"prompt": pattern * 8, "max_tokens": SPEC_PROBE_OUTPUT_TOKENS, "ignore_eos": True,
                           "temperature": 0.0})
        return bodies

    def verify(self, features: Features, log_lines: Sequence[str], metrics_text: str, *,
               before_text: str | None = None, probe_error: str | None = None,
               model_config: Mapping[str, Any] | None = None) -> list[FeatureCheck]:
        """By effect where SGLang shows one (radix-cache tokens reused by the probe's repeated
        prompt, tokens per verify pass, the KV dtype it allocated); else what its scheduler
        logged it set up ("accepted"). Written from SGLang's source, not yet run on a GPU."""
        probed = before_text is not None and probe_error is None and bool(metrics_text)
        unmeasured = f"; the probe failed: {probe_error}" if probe_error else ""

        delta = counter_change(metrics_text, before_text)

        checks: list[FeatureCheck] = []
        if features.prefix_caching is not None:
            checks.append(_verify_prefix_caching(features, delta, probed, unmeasured))
        if features.kv_cache_dtype != "auto":
            checks.append(_verify_kv_dtype(features.kv_cache_dtype, log_lines))
        if features.speculative.method != "off":
            checks.append(_verify_speculation(features, delta, probed, unmeasured))
        ints = log_ints(log_lines)
        logged: tuple[tuple[str, object, str], ...] = (
            ("max_num_seqs", features.max_num_seqs, "max_running_requests"),
            ("max_model_len", features.max_model_len, "context_len"),
            ("max_num_batched_tokens", features.max_num_batched_tokens if features.chunked_prefill is not False
             else None, "chunked_prefill_size"),
        )
        for key, wanted, name in logged:
            if wanted is None:
                continue
            value = ints.get(name)
            status: FeatureStatus = "unknown" if value is None else "accepted" if value == wanted else "not active"
            checks.append(FeatureCheck(key, str(wanted), status, f"engine logged {name}={value}"))
        return checks


PROBE_TOKEN_BASE = 11  # probe prompts use token ids 11..108: ordinary tokens in any vocabulary
PREFIX_PROBE_TOKENS = 128
SPEC_PROBE_PERIOD = 8
SPEC_PROBE_OUTPUT_TOKENS = 64


def _prefix_probe_len(features: Features) -> int:
    return probe_prompt_len(features, PREFIX_PROBE_TOKENS)


def _verify_prefix_caching(features: Features, delta: Callable[[str], float | None], probed: bool,
                           unmeasured: str) -> FeatureCheck:
    wanted = bool(features.prefix_caching)
    hits = delta("sglang:cached_tokens_total")
    probe = f"a probe of two identical {_prefix_probe_len(features)}-token prompts"
    if probed and hits is not None:
        if wanted == (hits > 0):
            return FeatureCheck("prefix_caching", str(wanted), "verified",
                                f"{hits:,.0f} prompt tokens came from the radix cache in {probe}")
        return FeatureCheck("prefix_caching", str(wanted), "not active",
                            f"{hits:,.0f} prompt tokens came from the radix cache in {probe}")
    if probed and not wanted:  # SGLang reports cached tokens only once some were cached
        return FeatureCheck("prefix_caching", "False", "verified", f"no prompt tokens came from a cache in {probe}")
    return FeatureCheck("prefix_caching", str(wanted), "unknown", "no radix-cache counter was read" + unmeasured)


def _verify_speculation(features: Features, delta: Callable[[str], float | None], probed: bool,
                        unmeasured: str) -> FeatureCheck:
    """Each verify pass yields one token plus the accepted drafts: fewer passes than tokens
    means drafts were accepted."""
    method = features.speculative.method
    passes = delta(SPEC_VERIFY_CALLS)
    tokens = delta("sglang:generation_tokens_total")
    probe = f"a {SPEC_PROBE_OUTPUT_TOKENS}-token probe on a repetitive prompt"
    if probed and passes is not None and tokens:
        seen = f"{tokens:,.0f} tokens in {passes:,.0f} verify passes ({tokens / max(passes, 1):.2f} per pass) in {probe}"
        if 0 < passes < tokens:
            return FeatureCheck("speculative.method", method, "verified", seen)
        return FeatureCheck("speculative.method", method, "not active", seen)
    if probed and tokens:
        return FeatureCheck("speculative.method", method, "not active", f"no verify passes counted in {probe}")
    return FeatureCheck("speculative.method", method, "unknown", "no speculative-decoding counter was read" + unmeasured)


def _verify_kv_dtype(dtype: str, log_lines: Sequence[str]) -> FeatureCheck:
    want = KV_CACHE_DTYPES.get(dtype, dtype)
    alloc = next((m for m in map(KV_ALLOC_RE.search, log_lines) if m), None)
    if alloc is None:
        return FeatureCheck("kv_cache_dtype", dtype, "unknown", "the engine logged no KV cache allocation")
    seen = f"the engine allocated its KV cache as {alloc['dtype']} for {int(alloc['tokens']):,} tokens"
    # torch names the dtypes float8_e4m3fn / float8_e5m2 (uint8 storage is logged for some backends).
    ok = want.replace("fp8_", "float8_") in alloc["dtype"] or (alloc["dtype"].endswith("uint8") and want.startswith("fp8"))
    return FeatureCheck("kv_cache_dtype", dtype, "accepted" if ok else "not active", seen)


ADAPTER = SglangAdapter()
ENGINE = ADAPTER
"""The name ``tunebench monitor`` used while SGLang was known only by its metric names."""
