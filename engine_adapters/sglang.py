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

Facts about SGLang live here; what every engine shares is ``engine_adapters.spec``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from engine_adapters.base import FeatureCheck, FlagSet, Phase, ValidationIssue
from engine_adapters.command_line import (
    PYTHON_SERVER_RULES,
    WEIGHTS_RULE,
    DiagnosisRule,
    FlagRule,
    HelpLayout,
    docker_image,
    docker_run_prefix,
    number_text,
    package_version,
    phase_patterns,
    switch_flag,
    value_flag,
)
from engine_adapters.command_line import diagnosis_rule as _rule
from engine_adapters.config import EngineConfig, Features
from engine_adapters.disaggregation import GROUP_SETTINGS, disaggregation_issues, expert_parallel_issues
from engine_adapters.hardware import HardwareInfo
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_python
from engine_adapters.spec import (
    CommandLineAdapter,
    EngineSpec,
    ProbeReading,
    SettingEcho,
    block_quantized_kv_issue,
    draft_model_issues,
    fp8_weights_issue,
    gguf_weights_issue,
    kv_offload_size_issue,
    metric_names,
    needs_gpu_issue,
)

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
PORTABLE_PYTHON = "python3"
LAUNCHER = (f"import os, runpy, sys; key = os.environ.pop({API_KEY_ENV!r}, ''); "
            "sys.argv[1:1] = ['--api-key', key] if key else []; "
            f"runpy.run_module({MODULE!r}, run_name='__main__', alter_sys=True)")
"""``python -c LAUNCHER ARGS``: runs ``python -m sglang.launch_server --api-key KEY ARGS`` with
the key taken from the environment, so it never appears in a process list or a log."""
RUNTIME_KINDS = (f"SGLang runs from a Python interpreter that has sglang (runtime kind 'python') or the {DOCKER_IMAGE} "
                 "image (kind 'docker'); no managed runtime exists (there is no CPU wheel of SGLang)")

# --- metric names ---------------------------------------------------------------------------
# Checked against SGLang 0.5.23's collectors (sglang/srt/observability/metrics_collector.py) by
# tests/unit/test_sglang_adapter.py on the recorded /metrics. SGLang reports KV use as
# ``token_usage`` (a 0-1 fraction of the token pool) and prefix-cache reuse in tokens
# (``cached_tokens_total`` out of ``prompt_tokens_total``), the units of vLLM's prefix-cache
# queries and hits. It has no draft/accepted-token counters: speculation shows as its running
# accept length and rate (gauges) and as verify passes (``spec_verify_calls_total``).

METRIC_NAMES = metric_names(
    "sglang:",
    gauges={
        "requests_running": "num_running_reqs", "requests_waiting": "num_queue_reqs",
        "kv_cache_usage_ratio": "token_usage",
        # SGLang's own running estimates; counter-derived rates take precedence when present.
        "generation_tok_per_s": "gen_throughput", "prefix_cache_hit_ratio": "cache_hit_rate",
        "spec_mean_acceptance_length": "spec_accept_length", "spec_acceptance_ratio": "spec_accept_rate"},
    counters={"generation_tokens": "generation_tokens_total", "prompt_tokens": "prompt_tokens_total",
              "prefix_cache_queries": "prompt_tokens_total", "prefix_cache_hits": "cached_tokens_total",
              "requests_finished": "num_requests_total", "preemptions": "num_retracted_requests_total",
              "spec_verify_passes": "spec_verify_calls_total"},
    histograms={"ttft_s": "time_to_first_token_seconds",
                "itl_s": ("inter_token_latency_seconds", "time_per_output_token_seconds"),
                "e2e_s": "e2e_request_latency_seconds", "queue_s": "queue_time_seconds"},
)

# --- feature -> flag mapping --------------------------------------------------------------------

KV_CACHE_DTYPES: dict[str, str] = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
"""KV-cache precision -> SGLang's ``--kv-cache-dtype`` (plain ``fp8`` is E4M3, as in vLLM)."""
SPEC_ALGORITHMS: dict[str, str] = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "draft_model": "STANDALONE",
                                   "ngram": "NGRAM"}
"""tunebench's speculative method -> SGLang's ``--speculative-algorithm`` (NEXTN drafts with the
model's own multi-token-prediction layers; STANDALONE with a separate small model)."""
NEEDS_DRAFT_MODEL = frozenset({"eagle", "eagle3", "draft_model"})


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
    return ["--enable-hierarchical-cache", "--hicache-size", number_text(features.kv_offload_gib)]


FLAG_RULES: tuple[FlagRule, ...] = (
    WEIGHTS_RULE,
    FlagRule("kv_cache_dtype", lambda f: [] if (t := KV_CACHE_DTYPES.get(f.kv_cache_dtype)) is None
             else ["--kv-cache-dtype", t]),
    switch_flag("prefix_caching", on=[], off=["--disable-radix-cache"]),
    FlagRule("speculative.method", speculative_flags),
    value_flag("cpu_offload_gib", "--cpu-offload-gb", unset=0.0, text=number_text), FlagRule("kv_offload_gib", _kv_offload),
    value_flag("gpu_memory_utilization", "--mem-fraction-static", text=number_text),
    value_flag("max_num_seqs", "--max-running-requests"), FlagRule("max_num_batched_tokens", _batched_tokens),
    value_flag("max_model_len", "--context-length"),
    FlagRule("cuda_graphs", lambda f: [] if f.cuda_graphs else ["--disable-cuda-graph"]),
    value_flag("tensor_parallel_size", "--tp-size", unset=1), value_flag("pipeline_parallel_size", "--pp-size", unset=1),
    value_flag("reasoning_parser", "--reasoning-parser"),
    FlagRule("disaggregation.connector", lambda f: _disaggregation_flags(f)),
    # The group's sizes: each pool engine gets its tensor parallel size (engine_adapters.disaggregation).
    *(FlagRule(f"disaggregation.{key}", lambda f: []) for key in GROUP_SETTINGS),
    value_flag("expert_parallel_size", "--ep-size", unset=1),
    FlagRule("eplb", lambda f: ["--enable-eplb"] if f.eplb else []),
)
"""``chunked_prefill`` has no rule of its own: it shapes ``max_num_batched_tokens``'s flags."""

def _disaggregation_flags(features: Features) -> list[str]:
    """One pool engine's mode and transfer backend (tunebench's connector names are SGLang's
    backend names; one it lacks is refused by the recorded help's choices)."""
    d = features.disaggregation
    if d.connector is None or d.role is None:
        return []
    return ["--disaggregation-mode", d.role, "--disaggregation-transfer-backend", d.connector]


ROUTER_MODULE = "sglang_router.launch_router"
ROUTER_LAUNCHER = LAUNCHER.replace(repr(MODULE), repr(ROUTER_MODULE))
"""The router started as the server is: its key (for the workers) from the environment into argv."""


PHASE_PATTERNS = phase_patterns(
    (Phase.READY, (r"The server is fired up and ready to roll",)),
    (Phase.STARTING_SERVER, (r"Uvicorn running on", r"Application startup complete", r"Starting server at")),
    (Phase.WARMING_UP, (r"Capture (cuda|CUDA) graph", r"cuda graph capture", r"torch\.compile")),
    (Phase.KV_CACHE, (r"KV Cache is allocated", r"Memory pool end", r"max_total_num_tokens=")),
    (Phase.LOADING_WEIGHTS, (r"Load weight begin", r"Loading safetensors", r"Load weight end")),
)
"""Log markers of each startup phase, latest phase first (the first that matches names it)."""

KV_ALLOC_RE = re.compile(r"KV Cache is allocated\. dtype: (?P<dtype>\S+), #tokens: (?P<tokens>\d+), "
                         r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)")
_SCHEDULER_RE = {key: re.compile(rf"\b{key}=(-?\d+)") for key in (
    "max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "context_len")}
"""What the scheduler logs it set up, on one line (``max_total_num_tokens=..., max_running_requests=...``)."""



DIAGNOSIS_RULES: tuple[DiagnosisRule, ...] = (
    _rule("no_runtime", r"No module named '?sglang'?",
          "The interpreter has no SGLang: point runtime.python at a venv with sglang installed (it needs an NVIDIA "
          "GPU; no CPU wheel exists), or use the lmsysorg/sglang docker image."),
    _rule("no_gpu", r"No CUDA GPUs are available|Found no NVIDIA driver|CUDA driver initialization failed"
                    r"|torch\.cuda\.is_available\(\) is False",
          "SGLang needs an NVIDIA GPU and found none usable here."),
    _rule("cuda_oom", r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|Not enough memory",
          "The GPU ran out of memory while starting: lower GPU memory utilization (--mem-fraction-static) or the "
          "context length, quantize the weights (FP8) or the KV cache, or use tensor parallelism."),
    *PYTHON_SERVER_RULES,
)

SPEC = EngineSpec(
    kind="sglang", display_name="SGLang", api_key_env=API_KEY_ENV, metric_names=METRIC_NAMES,
    phase_patterns=PHASE_PATTERNS, diagnosis_rules=DIAGNOSIS_RULES, flag_rules=FLAG_RULES,
    generic_error=re.compile(r"\b(\w+(?:Error|Exception)): (.+)"), not_an_error=re.compile(r"\b(INFO|WARNING|DEBUG)\b|Warning:"),
    help_layout=HelpLayout.ARGPARSE_ENTRIES, help_timeout_s=300,
    reserved_flags=frozenset({"--model-path", "--host", "--port", "--api-key", "--served-model-name", "--tokenizer-path",
                              "--enable-metrics"}),
    model_flag="--model-path", served_name_flag="--served-model-name", tokenizer_flag="--tokenizer-path",
    fixed_args=("--enable-metrics",),
    aliases=(  # spellings of one option, from the recorded help
        ("--model-path", "--model"), ("--tp-size", "--tensor-parallel-size"), ("--pp-size", "--pipeline-parallel-size"),
        ("--speculative-draft-model-path", "--speculative-draft-model"),
        ("--enable-hierarchical-cache", "--enable-hicache"),
    ),
    # SGLang 0.5.23: the radix (prefix) cache and chunked prefill are on unless switched off.
    engine_defaults={"prefix_caching": True, "chunked_prefill": True},
    # The token pool SGLang allocated, and how many requests of its context length fit.
    logged_sizes=_SCHEDULER_RE, logged_sizes_marker="max_total_num_tokens=",
    kv_capacity_sizes=("max_total_num_tokens", "context_len"),
    prefix_cache_noun="radix cache", hits_counter_lazy=True,  # cached tokens are reported once some were cached
    setting_echoes=(SettingEcho("max_num_seqs", "max_running_requests"), SettingEcho("max_model_len", "context_len"),
                    SettingEcho("max_num_batched_tokens", "chunked_prefill_size")),
    gpu_verified=GPU_VERIFIED, maturity=MATURITY,
)


class SglangAdapter(CommandLineAdapter):
    """SGLang's HTTP server (``python -m sglang.launch_server``)."""

    spec = SPEC
    install_hint = (f"pip install 'sglang=={RECORDED_VERSION}' in a CUDA venv (started as python -c LAUNCHER, i.e. "
                    "python -m sglang.launch_server with the key from SGLANG_API_KEY)")
    image_hint = f"{DOCKER_IMAGE}:v{RECORDED_VERSION}"
    default_image = f"{DOCKER_IMAGE}:latest"

    # -- launch ---------------------------------------------------------------------------------

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        runtime = engine.runtime
        if runtime.kind == "python":
            python = PORTABLE_PYTHON if portable else resolve_python(engine)
            assert python is not None
            return [python, "-c", LAUNCHER]
        if runtime.kind == "docker":
            docker = docker_run_prefix(engine, engine.port if port is None else port, gpus=True,
                                       api_key_env=self.api_key_env)
            return [*docker, docker_image(engine, self.default_image), PORTABLE_PYTHON, "-c", LAUNCHER]
        raise RuntimeErrorMessage(RUNTIME_KINDS)

    def help_command(self, engine: EngineConfig) -> list[str]:
        """``python -m sglang.launch_server`` of a local interpreter (its identity: the interpreter)."""
        if engine.runtime.kind != "python":
            raise RuntimeErrorMessage("flag discovery needs a local SGLang interpreter (runtime kind 'python'); docker "
                                      "images are not inspected")
        python = resolve_python(engine)
        assert python is not None
        return [python, "-m", MODULE]

    def help_identity(self, engine: EngineConfig, command: Sequence[str]) -> str:
        return command[0]

    def help_env(self) -> Mapping[str, str]:
        return {**os.environ, "COLUMNS": "100"}

    def installed_version(self, engine: EngineConfig) -> str:
        if engine.runtime.kind != "python":
            raise RuntimeErrorMessage("the SGLang version is read from a local interpreter (runtime kind 'python')")
        python = resolve_python(engine)
        assert python is not None
        version = package_version(python, "sglang", 60)
        if version is None:
            raise RuntimeErrorMessage(f"{python} has no sglang installed (SGLang needs a GPU venv; no CPU wheel exists)")
        return version

    # -- validation -----------------------------------------------------------------------------

    def setup_issues(self, engine: EngineConfig, features: Features, flags: FlagSet | None,
                     hardware: HardwareInfo | None) -> list[ValidationIssue]:
        issues = [] if engine.runtime.kind in ("python", "docker") else [ValidationIssue("engine.runtime", RUNTIME_KINDS)]
        return issues + needs_gpu_issue("SGLang", hardware, features.gpus_per_replica)

    def feature_issues(self, engine: EngineConfig, features: Features,
                       hardware: HardwareInfo | None) -> list[ValidationIssue]:
        spec = features.speculative
        issues = block_quantized_kv_issue(features, "SGLang keeps KV in fp8_e4m3 or fp8_e5m2")
        issues += gguf_weights_issue(features, "SGLang's weight precision is fp8 (quantized at load) or an AWQ/GPTQ "
                                               "checkpoint")
        issues += draft_model_issues(features, NEEDS_DRAFT_MODEL, "an EAGLE head or a small model trained for the target")
        if spec.method == "ngram" and (spec.ngram_prompt_lookup_min, spec.ngram_prompt_lookup_max) != (1, 4):
            issues.append(ValidationIssue("speculative.ngram_prompt_lookup_max", "SGLang's NGRAM drafter matches from "
                                          "its own trie (--speculative-ngram-*); the n-gram window is not passed",
                                          "warning"))
        if features.kv_offload_backend == "lmcache":
            issues.append(ValidationIssue("kv_offload_backend", "SGLang's KV offload here is its hierarchical cache "
                                          "(host memory); LMCache is its own integration (--enable-lmcache): use "
                                          "backend 'native' or pass it in extra_args"))
        issues += kv_offload_size_issue(features)
        issues += disaggregation_issues(features, hardware, cpu_build=False, display_name=self.display_name)
        issues += expert_parallel_issues(engine, features)
        util = features.gpu_memory_utilization
        if util is not None and not 0 < util < 1:
            issues.append(ValidationIssue("gpu_memory_utilization", f"must be in (0, 1) (SGLang's --mem-fraction-static: "
                                          f"the share for weights and KV cache), got {util}"))
        return issues + fp8_weights_issue(features, hardware)

    # -- disaggregated prefill/decode: sglang-router joins the pools -----------------------------

    router_api_key_env = API_KEY_ENV
    pool_metrics = frozenset({"sglang:prompt_tokens_total", "sglang:generation_tokens_total"})

    def router_argv(self, engine: EngineConfig, features: Features, prefill: Sequence[tuple[str, int]],
                    decode_urls: Sequence[str], port: int, *, metrics_port: int | None = None,
                    portable: bool = False) -> list[str]:
        """sglang-router in P/D mode: each prefill engine with its bootstrap port (SGLang's
        documented interface; not run here)."""
        python = PORTABLE_PYTHON if portable or engine.runtime.kind != "python" else resolve_python(engine)
        argv = [str(python), "-c", ROUTER_LAUNCHER, "--pd-disaggregation"]
        for url, bootstrap_port in prefill:
            argv += ["--prefill", url, str(bootstrap_port)]
        for url in decode_urls:
            argv += ["--decode", url]
        return argv + ["--host", engine.host, "--port", str(port)]

    def pool_args(self, features: Features, side_port: int) -> list[str]:
        """A prefill engine's bootstrap server, where decode engines fetch its KV's whereabouts."""
        return ["--disaggregation-bootstrap-port", str(side_port)] if features.disaggregation.role == "prefill" else []

    def pool_env(self, features: Features, side_port: int, host: str = "127.0.0.1") -> dict[str, str]:
        return {}

    # -- verification ---------------------------------------------------------------------------

    def requested_setting(self, features: Features, echo: SettingEcho) -> object:
        """With chunked prefill off the batched-token budget is not the chunk size SGLang logs."""
        if echo.key == "max_num_batched_tokens" and features.chunked_prefill is False:
            return None
        return super().requested_setting(features, echo)

    def verify_speculation(self, features: Features, log_lines: Sequence[str], reading: ProbeReading) -> FeatureCheck:
        """SGLang counts no drafts: each verify pass yields one token plus the accepted drafts,
        so fewer passes than tokens means drafts were accepted."""
        method = features.speculative.method
        passes, tokens = reading.change("spec_verify_passes"), reading.change("generation_tokens")
        probe = f"a {SPEC.probe.spec_output_tokens}-token probe on a repetitive prompt"
        if reading.probed and passes is not None and tokens:
            seen = f"{tokens:,.0f} tokens in {passes:,.0f} verify passes ({tokens / max(passes, 1):.2f} per pass) in {probe}"
            return FeatureCheck("speculative.method", method, "verified" if 0 < passes < tokens else "not active", seen)
        if reading.probed and tokens:
            return FeatureCheck("speculative.method", method, "not active", f"no verify passes counted in {probe}")
        return FeatureCheck("speculative.method", method, "unknown",
                            "no speculative-decoding counter was read" + reading.unmeasured)

    def verify_kv_cache_dtype(self, dtype: str, log_lines: Sequence[str],
                              model_config: Mapping[str, Any] | None) -> FeatureCheck:
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
feature_flags = ADAPTER.feature_flags
flag_names = ADAPTER.flag_names
flag_values = ADAPTER.flag_values
parse_help = ADAPTER.parse_help
parse_kv_cache = ADAPTER.kv_cache
