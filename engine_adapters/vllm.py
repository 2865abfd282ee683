"""The vLLM adapter: its spec (flags, help layout, log patterns, diagnoses, metric names) and
its quirks: how it starts (an interpreter, ``vllm serve`` or the official image), which version
is installed, what it checks before a launch on GPU and CPU builds, and how it echoes its
arguments back, which verification reads (``non-default args: {...}``).

Facts about vLLM live here and only here; what every engine shares is ``engine_adapters.spec``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine_adapters.base import (
    FeatureCheck,
    FeatureStatus,
    FlagSet,
    Phase,
    ValidationIssue,
)
from engine_adapters.command_line import (
    PYTHON_SERVER_RULES,
    WEIGHTS_RULE,
    DiagnosisRule,
    FlagRule,
    HelpLayout,
    docker_run_prefix,
    kv_bytes_per_token,
    number_text,
    phase_patterns,
    switch_flag,
    value_flag,
)
from engine_adapters.command_line import diagnosis_rule as _rule
from engine_adapters.config import EngineConfig, Features
from engine_adapters.disaggregation import (
    GROUP_SETTINGS,
    POOL_ROLES,
    disaggregation_issues,
    expert_parallel_issues,
)
from engine_adapters.hardware import HardwareInfo, interface_of
from engine_adapters.runtimes import RuntimeErrorMessage, managed_runtime, resolve_executable, resolve_python
from engine_adapters.spec import (
    CommandLineAdapter,
    EngineSpec,
    ProbeReading,
    ProbeSpec,
    SettingEcho,
    draft_model_issues,
    fp8_weights_issue,
    gguf_weights_issue,
    kv_offload_size_issue,
    metric_names,
)

__all__ = ["kv_bytes_per_token"]  # re-exported: where tests and callers have always found it

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


CONNECTORS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "lmcache": "LMCacheConnectorV1"}
"""tunebench's connector -> vLLM's ``kv_connector`` class (registered in its connector factory)."""
ROUTER_CONNECTORS = frozenset({"nixl", "mooncake"})
"""The connectors vllm-router 0.1.17 joins pools for (its ``--kv-connector`` choices, less MoRI-IO)."""
ROUTER_MODULE = "vllm_router.launch_router"
ROUTER_MEASURED_FLAGS = ("--disable-retries", "--disable-circuit-breaker", "--health-check-timeout-secs", "30",
                         "--health-check-interval-secs", str(24 * 3600))
"""What a measurement needs of vllm-router: a failed request is the client's to count, not
retried out of sight (a retry would run a prompt twice and break the engines' token counts); and
a worker is never taken out of its pool by the router while the run measures it: not by the
circuit breaker (with one engine per pool it only turns a transient failure into 60 s of "No
available workers": CI saw a run's every request refused so), nor by a runtime health check
(once a day, not every minute: under load a starved prefill engine answered its /health checks
late, and, by every sign in the run's log, the router took it out of its pool: a run's every
request was refused again). An engine
that dies is tunebench's to see (its process group), and its requests fail as errors. The
router's startup wait for healthy workers is unchanged."""
ROUTER_API_KEY_ENV = "OPENAI_API_KEY"
"""vllm-router sends ``Authorization: Bearer $OPENAI_API_KEY`` to the engines (read in its binary)."""
POOL_METRICS = frozenset({
    *(f"vllm:{name}" for name in (
        "prompt_tokens_total", "generation_tokens_total", "request_success_total",
        # prompt tokens by where they came from: local_compute (prefill), external_kv_transfer (decode)
        "prompt_tokens_by_source_total", "nixl_num_failed_transfers_total")),
    *(f"vllm:{name}_{part}" for name in (
        "request_prefill_time_seconds", "request_decode_time_seconds", "inter_token_latency_seconds",
        "nixl_xfer_time_seconds", "nixl_bytes_transferred") for part in ("sum", "count")),
    "vllm_router_pd_prefill_requests_total", "vllm_router_pd_decode_requests_total",
    "vllm_router_pd_request_duration_seconds_sum", "vllm_router_pd_request_duration_seconds_count"})
"""What a run keeps per pool of a P/D group: each engine's tokens, prefill and decode time, and
NIXL's transfers (on the decode engine), and vllm-router's own requests."""
NIXL_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}
"""NIXL's UCX transport on one machine: TCP over loopback (shared memory fails to start here;
UCX's default lost the first request's handshake, docs/engines.md). An engine on a node address
of its own (pools spread over a cluster's nodes) names that address's interface instead."""
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
FACTORY_FILE = "vllm/distributed/kv_transfer/kv_connector/factory.py"


def kv_transfer_config_json(features: Features) -> str | None:
    """One pool engine's ``--kv-transfer-config``; None outside a P/D pool. NIXL pairs run as
    ``kv_both`` (as measured here), the others as producer (prefill) and consumer (decode)."""
    d = features.disaggregation
    if d.connector is None or d.role is None:
        return None
    role = "kv_both" if d.connector == "nixl" else {"prefill": "kv_producer", "decode": "kv_consumer"}[d.role]
    body: dict[str, object] = {"kv_connector": CONNECTORS[d.connector], "kv_role": role}
    if d.kv_buffer_device != "auto":
        body["kv_buffer_device"] = d.kv_buffer_device
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


FLAG_RULES: tuple[FlagRule, ...] = (
    WEIGHTS_RULE,
    value_flag("kv_cache_dtype", "--kv-cache-dtype", unset="auto"),
    switch_flag("prefix_caching", on=["--enable-prefix-caching"], off=["--no-enable-prefix-caching"]),
    FlagRule("speculative.method", lambda f: [] if (s := speculative_config_json(f)) is None else ["--speculative-config", s]),
    value_flag("cpu_offload_gib", "--cpu-offload-gb", unset=0.0, text=number_text),
    FlagRule("kv_offload_gib", lambda f: [] if f.kv_offload_gib == 0 else ["--kv-offloading-size", number_text(
        f.kv_offload_gib), *(["--kv-offloading-backend", f.kv_offload_backend] if f.kv_offload_backend else [])]),
    value_flag("gpu_memory_utilization", "--gpu-memory-utilization", text=number_text),
    value_flag("max_num_seqs", "--max-num-seqs"), value_flag("max_num_batched_tokens", "--max-num-batched-tokens"),
    value_flag("max_model_len", "--max-model-len"),
    FlagRule("cuda_graphs", lambda f: [] if f.cuda_graphs else ["--enforce-eager"]),
    switch_flag("chunked_prefill", on=["--enable-chunked-prefill"], off=["--no-enable-chunked-prefill"]),
    *(value_flag(f"{kind}_parallel_size", f"--{kind}-parallel-size", unset=1) for kind in ("tensor", "pipeline", "data")),
    value_flag("distributed_executor_backend", "--distributed-executor-backend"),
    # Export-only: the launch recipes (app.export) place the GPUs on machines; validate refuses
    # nodes > 1 for a local launch, so no flag is ever rendered for it.
    FlagRule("nodes", lambda f: []),
    value_flag("reasoning_parser", "--reasoning-parser"),
    FlagRule("disaggregation.connector",
             lambda f: [] if (s := kv_transfer_config_json(f)) is None else ["--kv-transfer-config", s]),
    # The group's sizes: each pool engine gets its tensor parallel size (engine_adapters.disaggregation).
    *(FlagRule(f"disaggregation.{key}", lambda f: []) for key in GROUP_SETTINGS),
    # vLLM's expert-parallel size is its tensor x data parallel size: validate checks they agree.
    FlagRule("expert_parallel_size", lambda f: ["--enable-expert-parallel"] if f.expert_parallel_size > 1 else []),
    FlagRule("eplb", lambda f: ["--enable-eplb"] if f.eplb else []),
)

PHASE_PATTERNS = phase_patterns(
    (Phase.READY, (r"Application startup complete",)),
    (Phase.STARTING_SERVER, (r"Starting vLLM (API )?server on", r"Available routes are")),
    (Phase.KV_CACHE, (r"(CPU|GPU) KV cache size", r"# (GPU|CPU) blocks", r"Maximum concurrency for")),
    (Phase.WARMING_UP, (
        r"Warming up model", r"Capturing CUDA graph", r"torch\.compile", r"Compiling a graph",
        r"init engine .* took",
    )),
    (Phase.PROFILING, (r"Memory profiling takes", r"profil(e|ing) run", r"Available KV cache memory")),
    (Phase.LOADING_WEIGHTS, (
        r"Starting to load model", r"Loading weights", r"Loading safetensors", r"Model loading took",
    )),
)
"""Log markers of each startup phase, latest phase first (the first that matches names it)."""

KV_CACHE_RE = re.compile(r"(?P<device>CPU|GPU) KV cache size: (?P<tokens>[\d,]+) tokens")
CONCURRENCY_RE = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.,]+)x")
NON_DEFAULT_RE = re.compile(r"non-default args: (?P<args>\{.*\})")
KV_MEMORY_RE = re.compile(r"(?:Explicitly|Auto) set \((?P<cpu>[\d.]+)/[\d.]+\) GiB for KV cache"
                          r"|Available KV cache memory: (?P<gpu>[\d.]+) GiB")

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
    *PYTHON_SERVER_RULES,
    _rule("docker_image", r"Unable to find image .* locally[\s\S]*?(pull access denied|manifest unknown)|pull access denied",
          "The docker image could not be found or pulled: check the image name and your registry access."),
    _rule("no_gpu", r"Failed to infer device type|No CUDA GPUs are available|Found no NVIDIA driver",
          "This engine build needs a GPU, and none is usable here: use the vllm-cpu runtime on this machine."),
)



METRIC_NAMES = metric_names(
    "vllm:",
    gauges={"requests_running": "num_requests_running", "requests_waiting": "num_requests_waiting",
            "kv_cache_usage_ratio": ("kv_cache_usage_perc", "gpu_cache_usage_perc", "cpu_cache_usage_perc")},
    counters={
        "generation_tokens": "generation_tokens_total", "prompt_tokens": "prompt_tokens_total",
        "prefix_cache_queries": ("prefix_cache_queries_total", "gpu_prefix_cache_queries_total"),
        "prefix_cache_hits": ("prefix_cache_hits_total", "gpu_prefix_cache_hits_total"),
        "spec_decode_drafts": "spec_decode_num_drafts_total",
        "spec_decode_draft_tokens": "spec_decode_num_draft_tokens_total",
        "spec_decode_accepted_tokens": "spec_decode_num_accepted_tokens_total",
        "requests_finished": "request_success_total", "preemptions": "num_preemptions_total"},
    histograms={
        "ttft_s": "time_to_first_token_seconds",
        "itl_s": ("inter_token_latency_seconds", "time_per_output_token_seconds"),
        "e2e_s": "e2e_request_latency_seconds", "queue_s": "request_queue_time_seconds",
        # Tokens scheduled per engine step (prefill and decode): how much batching the engine
        # actually achieves, which a memory-bound decode turns into throughput.
        "tokens_per_step": "iteration_tokens_total"},
)


SPEC = EngineSpec(
    kind="vllm", display_name="vLLM", api_key_env="VLLM_API_KEY", metric_names=METRIC_NAMES,
    phase_patterns=PHASE_PATTERNS, diagnosis_rules=DIAGNOSIS_RULES, flag_rules=FLAG_RULES,
    generic_error=re.compile(r"(\w+(Error|Exception)): (.+)"), not_an_error=re.compile(r"\b(INFO|WARNING|DEBUG)\b|Warning:"),
    help_layout=HelpLayout.USAGE_BLOCK, help_timeout_s=180,
    reserved_flags=frozenset({"--host", "--port", "--model", "--api-key", "--served-model-name", "--tokenizer"}),
    model_flag="--model", served_name_flag="--served-model-name", tokenizer_flag="--tokenizer",
    # vLLM 0.32 (EngineArgs._set_default_chunked_prefill_and_prefix_caching_args): both on for text generation.
    engine_defaults={"prefix_caching": True, "chunked_prefill": True},
    # 512 cacheable tokens: whole blocks of 16 (GPU) or 128 (CPU) tokens, and one to compute.
    probe=ProbeSpec(prefix_tokens=528, spec_output_tokens=32, spec_token_offset=0, cache_salt=True),
    # Settings vLLM echoes verbatim in its non-default args, with the value that means "not
    # requested". Echoed is "accepted", not verified.
    setting_echoes=tuple(SettingEcho(key, arg, unset) for key, arg, unset in (
        ("max_num_seqs", "max_num_seqs", None), ("max_model_len", "max_model_len", None),
        ("max_num_batched_tokens", "max_num_batched_tokens", None),
        ("gpu_memory_utilization", "gpu_memory_utilization", None), ("tensor_parallel_size", "tensor_parallel_size", 1),
        ("pipeline_parallel_size", "pipeline_parallel_size", 1), ("chunked_prefill", "enable_chunked_prefill", None),
        ("cpu_offload_gib", "cpu_offload_gb", 0.0), ("kv_offload_gib", "kv_offloading_size", 0.0),
        ("reasoning_parser", "reasoning_parser", None),  # verified by the run's replies (app.verification)
    )),
    echo_evidence="engine parsed {name}={value}", echo_absent_status="not active",
)
PREFIX_PROBE_MIN_TOKENS = 2 * 128  # shorter (a small max_model_len): no hit does not prove caching is off
KV_RATIO_TOLERANCE = 0.1  # capacity within 10% of a prediction (GiB are logged to two decimals)


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


class VllmAdapter(CommandLineAdapter):
    """vLLM (GPU builds and the CPU build)."""

    spec = SPEC

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
        # The official image's entrypoint is ``vllm serve``.
        return [*docker_run_prefix(engine, engine.port if port is None else port, api_key_env=self.api_key_env,
                                   gpus=not is_cpu_image(runtime.docker_image)), runtime.docker_image]

    def model_args(self, engine: EngineConfig) -> list[str]:
        """``--model M`` for the API server module; ``vllm serve`` takes the model positionally."""
        args = super().model_args(engine)
        return args if engine.runtime.kind in ("managed", "python") else args[1:]

    def help_command(self, engine: EngineConfig) -> list[str]:
        if engine.runtime.kind == "docker":
            raise RuntimeErrorMessage("flag discovery needs a local engine; docker images are not inspected")
        return self.base_command(engine)

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

    def setup_issues(self, engine: EngineConfig, features: Features, flags: FlagSet | None,
                     hardware: HardwareInfo | None) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        add = issues.append
        cpu_build = self.is_cpu_build(engine, flags)
        util = features.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            add(ValidationIssue("gpu_memory_utilization", f"must be in (0, 1] (a fraction of GPU memory), got {util}"))
        issues += draft_model_issues(features, ("eagle", "eagle3", "draft_model"),
                                     "an EAGLE head or small model trained for the target")
        issues += gguf_weights_issue(features, "vLLM's weight precision is fp8 (quantized at load) or an AWQ/GPTQ "
                                               "checkpoint")
        if features.kv_offload_gib > 0 and not features.kv_offload_backend:
            add(ValidationIssue("kv_offload_backend", "KV offload needs a backend: set kv_offload_backend to 'native' "
                                                      "(vLLM's CPU offload) or 'lmcache'"))
        issues += kv_offload_size_issue(features)
        if (features.max_num_batched_tokens is not None and features.max_model_len is not None
                and features.chunked_prefill is False and features.max_num_batched_tokens < features.max_model_len):
            add(ValidationIssue("max_num_batched_tokens",
                                f"without chunked prefill, max_num_batched_tokens ({features.max_num_batched_tokens}) "
                                f"must be at least max_model_len ({features.max_model_len})"))
        parallel = features.gpu_count
        if (hardware is not None and parallel > 1 and not cpu_build and features.nodes == 1
                and not features.disaggregation.enabled and parallel > len(hardware.gpus)):
            add(ValidationIssue("tensor_parallel_size", f"tensor x pipeline{' x data' * (features.data_parallel_size > 1)}"
                                                        f" parallel size {parallel} needs {parallel} GPUs; "
                                                        f"{len(hardware.gpus)} visible"))
        issues += _multi_node_issues(engine, features)
        issues += disaggregation_issues(features, hardware, cpu_build=cpu_build, display_name=self.display_name)
        issues += self._connector_issues(engine, features) + self._expert_parallel_issues(engine, features)
        if hardware is not None and not cpu_build:
            if not hardware.has_gpu:
                add(ValidationIssue("engine.runtime", "this vLLM build needs an NVIDIA GPU and none is visible "
                                    f"({hardware.nvml_error or 'NVML found no device'}); use the vllm-cpu runtime"))
            issues += fp8_weights_issue(features, hardware)
        if cpu_build:
            issues += _cpu_build_issues(features, hardware)
        return issues

    def _connector_issues(self, engine: EngineConfig, features: Features) -> list[ValidationIssue]:
        """A connector the router cannot join, or that the installed vLLM does not register."""
        connector = features.disaggregation.connector
        if connector is None:
            return []
        if connector not in ROUTER_CONNECTORS:
            return [ValidationIssue("disaggregation.connector",
                                    f"vllm-router joins P/D pools over {' or '.join(sorted(ROUTER_CONNECTORS))} only, "
                                    f"not {connector}")]
        registered = installed_connectors(engine)
        if registered is not None and CONNECTORS[connector] not in registered:
            return [ValidationIssue("disaggregation.connector",
                                    f"this vLLM has no {CONNECTORS[connector]} (its connectors: "
                                    f"{', '.join(sorted(registered)) or 'none'})")]
        return []

    def _expert_parallel_issues(self, engine: EngineConfig, features: Features) -> list[ValidationIssue]:
        issues = expert_parallel_issues(engine, features)
        ep = features.expert_parallel_size
        roles = [r for r in POOL_ROLES if features.disaggregation.role in (None, r)] \
            if features.disaggregation.enabled else [None]
        for role in roles:
            tp = features.tensor_parallel_size if role is None else features.pool_tensor_parallel_size(role)
            spread = tp * (features.data_parallel_size if role is None else 1)
            if ep > 1 and ep != spread:
                where = f" of a {role} engine" if role else ""
                issues.append(ValidationIssue("expert_parallel_size",
                                              f"vLLM spreads the experts over the tensor x data parallel GPUs{where} "
                                              f"({spread}): set expert_parallel_size to {spread}"))
                break
        return issues

    # -- disaggregated prefill/decode: vllm-router joins the pools -------------------------------

    router_api_key_env = ROUTER_API_KEY_ENV
    pool_metrics = POOL_METRICS

    def router_argv(self, engine: EngineConfig, features: Features, prefill: Sequence[tuple[str, int]],
                    decode_urls: Sequence[str], port: int, *, metrics_port: int | None = None,
                    portable: bool = False) -> list[str]:
        """vllm-router in P/D mode; its metrics on ``metrics_port`` (it has no path on its API
        port; default the next port)."""
        python = "python3" if portable or engine.runtime.kind not in ("managed", "python") else resolve_python(engine)
        connector = features.disaggregation.connector or "nixl"
        argv = [str(python), "-m", ROUTER_MODULE, "--host", engine.host, "--port", str(port),
                "--vllm-pd-disaggregation"]
        for url, _ in prefill:  # NIXL needs no bootstrap port: its side channel is in the KV params
            argv += ["--prefill", url]
        for url in decode_urls:
            argv += ["--decode", url]
        return argv + ["--kv-connector", connector, *ROUTER_MEASURED_FLAGS, "--prometheus-host", engine.host,
                       "--prometheus-port", str(metrics_port or port + 1)]

    def pool_args(self, features: Features, side_port: int) -> list[str]:
        return []

    def pool_env(self, features: Features, side_port: int, host: str = "127.0.0.1") -> dict[str, str]:
        """NIXL's side channel on the engine's address at a port of its own, and UCX over TCP on
        the interface that holds the address."""
        if features.disaggregation.connector != "nixl":
            return {}
        side_host = "127.0.0.1" if host in WILDCARD_HOSTS else host  # every address: its peers here use loopback
        return {**NIXL_ENV, "UCX_NET_DEVICES": interface_of(side_host),
                "VLLM_NIXL_SIDE_CHANNEL_HOST": side_host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port)}

    # -- verification: vLLM echoes its arguments ------------------------------------------------

    def echoed_settings(self, log_lines: Sequence[str]) -> Mapping[str, object]:
        return parse_non_default_args(log_lines)

    def verify_settings(self, features: Features, log_lines: Sequence[str]) -> list[FeatureCheck]:
        checks = super().verify_settings(features, log_lines)
        args = parse_non_default_args(log_lines)
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

    def verify_prefix_caching(self, features: Features, log_lines: Sequence[str],
                              reading: ProbeReading) -> FeatureCheck:
        """The echo first; then hits on the probe's repeated prompt (its prompts carry salts of
        their own: only the repeated one can hit), or hits since start when no probe ran."""
        wanted = bool(features.prefix_caching)
        logged = parse_non_default_args(log_lines).get("enable_prefix_caching")
        echo = (f"engine parsed enable_prefix_caching={logged}" if logged is not None
                else "not in the engine's non-default args")
        if logged is not None and bool(logged) != wanted:
            return FeatureCheck("prefix_caching", str(wanted), "not active", echo)
        hits, queries = reading.change("prefix_cache_hits"), reading.change("prefix_cache_queries")
        n = self.prefix_probe_len(features)
        if reading.probed and hits is not None:
            seen = (f"prefix-cache hits on {hits:,.0f} of {n:,} tokens of a repeated prompt" if hits
                    else f"no prefix-cache hits on a repeated {n:,}-token prompt ({queries or 0:,.0f} tokens queried)")
            if wanted == (hits > 0):
                return FeatureCheck("prefix_caching", str(wanted), "verified", seen)
            if n > PREFIX_PROBE_MIN_TOKENS:  # long enough to fill a block of any usual size
                return FeatureCheck("prefix_caching", str(wanted), "not active", f"{seen}; {echo}")
        elif wanted and (total := reading.total("prefix_cache_hits")):
            queried = reading.total("prefix_cache_queries") or 0.0
            return FeatureCheck("prefix_caching", "True", "verified",
                                f"{total:,.0f} of {queried:,.0f} queried tokens hit the prefix cache since start")
        status: FeatureStatus = "accepted" if logged is not None else "unknown"
        return FeatureCheck("prefix_caching", str(wanted), status, echo + reading.unmeasured)

    def verify_speculation(self, features: Features, log_lines: Sequence[str], reading: ProbeReading) -> FeatureCheck:
        """Each part vLLM echoes of its speculative config must match the request (it echoes
        only what was set, so an absent part is no mismatch); then drafts proposed and accepted."""
        spec = features.speculative
        logged = parse_non_default_args(log_lines).get("speculative_config")
        parsed = logged if isinstance(logged, dict) else {}
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
        drafts, accepted = reading.change("spec_decode_drafts"), reading.change("spec_decode_accepted_tokens")
        probe = f"a {SPEC.probe.spec_output_tokens}-token probe on a repetitive prompt"
        if reading.probed and drafts is not None:
            if drafts > 0 and (accepted or 0) > 0:
                return FeatureCheck("speculative.method", spec.method, "verified",
                                    f"{drafts:,.0f} drafts proposed and {accepted:,.0f} draft tokens accepted in {probe}")
            if drafts > 0:
                return FeatureCheck("speculative.method", spec.method, "accepted",
                                    f"{echo}; {drafts:,.0f} drafts proposed, none accepted in {probe}")
            return FeatureCheck("speculative.method", spec.method, "not active", f"{echo}; no drafts in {probe}")
        if not reading.probed and drafts and accepted:
            return FeatureCheck("speculative.method", spec.method, "verified",
                                f"{drafts:,.0f} drafts proposed and {accepted:,.0f} draft tokens accepted since start")
        return FeatureCheck("speculative.method", spec.method, "accepted", echo + reading.unmeasured)

    def verify_kv_cache_dtype(self, dtype: str, log_lines: Sequence[str],
                              model_config: Mapping[str, Any] | None) -> FeatureCheck:
        """FP8 keeps one byte per element where a 16-bit cache keeps two: the same KV memory must
        hold about twice the tokens. Compared with the capacity the engine reported."""
        used = re.search(r"Using fp8 data type to store kv cache", "\n".join(log_lines))
        logged = parse_non_default_args(log_lines).get("kv_cache_dtype")
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
        if gib <= 0:  # the log rounds to hundredths of a GiB: a cache of a few MiB reads 0.00
            return FeatureCheck("kv_cache_dtype", dtype, "accepted",
                                f"{echo}; capacity not checked (the KV memory in the log rounds to {gib:g} GiB)")
        at_16 = gib * 2**30 / per_token_16
        ratio = tokens / at_16
        seen = (f"the KV cache holds {tokens:,.0f} tokens in {gib:g} GiB, {ratio:.2f}x the {at_16:,.0f} a 16-bit "
                f"cache would")
        if abs(ratio - 2.0) <= 2.0 * KV_RATIO_TOLERANCE:
            return FeatureCheck("kv_cache_dtype", dtype, "verified", seen + " (fp8 predicts 2x)")
        if abs(ratio - 1.0) <= KV_RATIO_TOLERANCE:
            return FeatureCheck("kv_cache_dtype", dtype, "not active", seen + ": stored in 16 bits, not fp8")
        return FeatureCheck("kv_cache_dtype", dtype, "accepted", f"{echo}; {seen}, which fits no prediction")


def _echo_status(matches: bool) -> FeatureStatus:
    return "accepted" if matches else "not active"


def _cpu_build_issues(features: Features, hardware: HardwareInfo | None) -> list[ValidationIssue]:
    """What vLLM's CPU build cannot do, or ignores."""
    issues = []
    if (features.kv_cache_dtype.startswith("fp8") and hardware is not None
            and not hardware.holds_fp8_kv_cache(cpu_engine=True)):
        issues.append(ValidationIssue("kv_cache_dtype",
                                      "FP8 KV cache on vLLM's CPU build needs AVX-512 or AMX, which this CPU lacks"))
    for key, value, default in (("cpu_offload_gib", features.cpu_offload_gib, 0.0),
                                ("kv_offload_gib", features.kv_offload_gib, 0.0),
                                ("gpu_memory_utilization", features.gpu_memory_utilization, None)):
        if value != default:
            issues.append(ValidationIssue(key, "has no effect on the CPU build (it sizes the KV cache from "
                                               "VLLM_CPU_KVCACHE_SPACE)", "warning"))
    if features.weights_dtype in ("fp8", "awq", "gptq"):
        issues.append(ValidationIssue("weights_dtype", f"{features.weights_dtype} weights are unlikely to run on the "
                                                       "CPU build", "warning"))
    return issues


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


def _site_packages(engine: EngineConfig, relative: str) -> list[Path] | None:
    """The files at ``relative`` under the site-packages of the engine's Python environment (a
    directory lookup, no process: validation runs on every edit); None where it cannot be told
    (an executable, a container, no interpreter)."""
    if engine.runtime.kind not in ("managed", "python"):
        return None
    try:
        python = resolve_python(engine)
    except RuntimeErrorMessage:
        return None
    if python is None:
        return None
    return list(Path(python).parent.parent.glob(f"lib/python3*/site-packages/{relative}"))


def installed_connectors(engine: EngineConfig) -> frozenset[str] | None:
    """The KV connectors the installed vLLM registers (read from its connector factory: a file
    lookup, no process); None where it cannot be told (an executable, a container, no such file)."""
    factories = _site_packages(engine, FACTORY_FILE)
    if not factories:
        return None
    return frozenset(re.findall(r"register_connector\(\s*[\"'](\w+)[\"']", factories[0].read_text(errors="replace")))


def _has_ray(engine: EngineConfig) -> bool | None:
    """Whether the engine's Python environment has the ``ray`` package; None where it cannot be
    told (an executable, a container)."""
    found = _site_packages(engine, "ray/__init__.py")
    return None if found is None else bool(found)


ADAPTER = VllmAdapter()
feature_flags = ADAPTER.feature_flags
flag_names = ADAPTER.flag_names
parse_help = ADAPTER.parse_help
