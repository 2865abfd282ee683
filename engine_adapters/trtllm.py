"""The TensorRT-LLM adapter: ``trtllm-serve serve MODEL --backend pytorch`` with the features in
the LLM API options YAML it reads (``--extra_llm_api_options FILE``; newer versions also spell
it ``--config``), flag discovery from ``--help``, validation, startup phases, diagnosis,
verification and its Prometheus metric names (``/prometheus/metrics``, ``trtllm_*``).

**Not yet run on a GPU.** TensorRT-LLM needs an NVIDIA GPU (its PyPI package is an installer for
NVIDIA's own index), so nothing here has launched it: the argv is tested against the ``--help`` of
``trtllm-serve serve`` at commit 00209af, the YAML against the LLM API fields of the same source,
the metric table against the collector's declarations (all in ``tests/data/trtllm/``, with how
they were made). :data:`GPU_VERIFIED` says so until a GPU run confirms it.

**The options file.** Features are TorchLlmArgs fields, so the adapter writes them as one YAML
(JSON text, which YAML reads) at launch, named by its content in the state directory
(``state_dir()/trtllm/``); an exported script writes the same file beside itself
(:data:`engine_adapters.base.BESIDE_SCRIPT`). The flag is ``--extra_llm_api_options``: every
version has it (newer ones keep it as an alias of ``--config``).

**Feature map** (TensorRT-LLM's names): KV FP8 -> ``kv_cache_config.dtype: fp8``; prefix caching
-> ``kv_cache_config.enable_block_reuse``; GPU memory utilization ->
``kv_cache_config.free_gpu_memory_fraction`` (of the memory left after the weights); KV offload
-> ``kv_cache_config.host_cache_size`` (bytes); speculative decoding -> ``speculative_config``
(``MTP`` with ``num_nextn_predict_layers``, ``Eagle`` (EAGLE-3) or ``Draft_Target`` with
``max_draft_len`` and ``speculative_model_dir``, ``NGram`` with ``max_draft_len`` and
``max_matching_ngram_size``); CUDA graphs off -> ``cuda_graph_config: null``; max sequences ->
``max_batch_size``; max batched tokens -> ``max_num_tokens``; max model length -> ``max_seq_len``;
chunked prefill -> ``enable_chunked_prefill``; tensor/pipeline parallel ->
``tensor_parallel_size``/``pipeline_parallel_size``; bf16/fp16 -> ``dtype``. Metrics need
``return_perf_metrics`` and ``enable_iter_perf_stats`` (always written). TensorRT-LLM takes
weight quantization from the checkpoint, offloads no weights and has no API key option: those
are refused or warned with the reason.

Facts about TensorRT-LLM live here; what every engine shares is ``engine_adapters.spec``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine_adapters.base import BESIDE_SCRIPT, FlagSet, Phase, ValidationIssue
from engine_adapters.command_line import (
    PORT_IN_USE_ADVICE,
    DiagnosisRule,
    HelpLayout,
    diagnosis_rule,
    docker_image,
    docker_run_prefix,
    phase_patterns,
)
from engine_adapters.config import EngineConfig, Features
from engine_adapters.hardware import HardwareInfo
from engine_adapters.paths import state_dir
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_executable, resolve_python, runtime_env
from engine_adapters.spec import (
    CommandLineAdapter,
    EngineSpec,
    ProbeSpec,
    block_quantized_kv_issue,
    draft_model_issues,
    gguf_weights_issue,
    kv_offload_size_issue,
    metric_names,
    needs_gpu_issue,
)

RECORDED_VERSION = "main@00209af"
"""The TensorRT-LLM source whose ``trtllm-serve serve --help`` and LLM API fields the tests check against."""
GPU_VERIFIED = False
MATURITY = (f"not yet run on a GPU: argv, options YAML and metric names are checked against TensorRT-LLM "
            f"{RECORDED_VERSION}'s recorded help, LLM API fields and metric declarations only")
EXECUTABLE = "trtllm-serve"
DOCKER_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"
"""NVIDIA's release image (tags ``<version>``); its command is ``trtllm-serve``."""
PYTHON_ENTRY = "from tensorrt_llm.commands.serve import main; main()"
OPTIONS_FILE = "trtllm-llm-api-options.yaml"
CONTAINER_DIR = "/tunebench"
"""Where a container sees the options file (mounted read-only)."""
OPTIONS_FLAG = "--extra_llm_api_options"
GIB = 2**30

# --- metric names ---------------------------------------------------------------------------
# From tensorrt_llm/metrics/collector.py (MetricsCollector) at commit 050f80d, checked by
# tests/unit/test_trtllm_adapter.py on the recorded sample. Per-request figures need
# ``return_perf_metrics``, iteration figures (queue, KV use, drafts) ``enable_iter_perf_stats``.
# Prompt tokens served from the KV cache are counted (``prompt_cached_tokens_total``) but not the
# prompt tokens queried, so there is no token hit rate from counters: TensorRT-LLM's own block
# hit rate is the gauge.

METRIC_NAMES = metric_names(
    "trtllm_",
    gauges={"requests_running": "num_requests_running", "requests_waiting": "num_requests_waiting",
            "kv_cache_usage_ratio": "kv_cache_utilization", "prefix_cache_hit_ratio": "kv_cache_hit_rate",
            "spec_mean_acceptance_length": "spec_decode_acceptance_length"},
    counters={
        "generation_tokens": "generation_tokens_total", "prompt_tokens": "prompt_tokens_total",
        "prefix_cache_hits": "prompt_cached_tokens_total",
        "spec_decode_draft_tokens": "spec_decode_num_draft_tokens_total",
        "spec_decode_accepted_tokens": "spec_decode_num_accepted_tokens_total",
        "requests_finished": "request_success_total"},
    histograms={"ttft_s": "time_to_first_token_seconds", "itl_s": "time_per_output_token_seconds",
                "e2e_s": "e2e_request_latency_seconds", "queue_s": "request_queue_time_seconds"},
)

# --- feature -> LLM API options -----------------------------------------------------------------

KV_CACHE_DTYPES: dict[str, str] = {"fp8": "fp8", "fp8_e4m3": "fp8"}
"""KV-cache precision -> ``kv_cache_config.dtype`` (TensorRT-LLM's FP8 KV cache is E4M3)."""
WEIGHT_DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16"}
DECODING_TYPES: dict[str, str] = {"mtp": "MTP", "eagle3": "Eagle", "draft_model": "Draft_Target", "ngram": "NGram"}
"""tunebench's speculative method -> ``speculative_config.decoding_type`` (Eagle on the PyTorch
backend is EAGLE-3)."""
NEEDS_DRAFT_MODEL = frozenset({"eagle3", "draft_model"})


def speculative_config(features: Features) -> dict[str, Any] | None:
    spec = features.speculative
    if spec.method not in DECODING_TYPES:
        return None  # off, or refused by validate (eagle)
    n = spec.num_speculative_tokens
    body: dict[str, Any] = {"decoding_type": DECODING_TYPES[spec.method]}
    if spec.method == "mtp":
        body["num_nextn_predict_layers"] = n
    else:
        body["max_draft_len"] = n
    if spec.method == "ngram":
        body["max_matching_ngram_size"] = spec.ngram_prompt_lookup_max
    if spec.method in NEEDS_DRAFT_MODEL and spec.draft_model:
        body["speculative_model_dir"] = spec.draft_model
    return body


def llm_api_options(features: Features) -> dict[str, Any]:
    """The YAML body: only what the configuration sets, plus the metrics switches."""
    out: dict[str, Any] = {}
    kv: dict[str, Any] = {}
    if (dtype := KV_CACHE_DTYPES.get(features.kv_cache_dtype)) is not None:
        kv["dtype"] = dtype
    if features.prefix_caching is not None:
        kv["enable_block_reuse"] = features.prefix_caching
    if features.gpu_memory_utilization is not None:
        kv["free_gpu_memory_fraction"] = features.gpu_memory_utilization
    if features.kv_offload_gib > 0:
        kv["host_cache_size"] = int(features.kv_offload_gib * GIB)
    if kv:
        out["kv_cache_config"] = kv
    if (spec := speculative_config(features)) is not None:
        out["speculative_config"] = spec
    if not features.cuda_graphs:
        out["cuda_graph_config"] = None
    if (dtype := WEIGHT_DTYPES.get(features.weights_dtype)) is not None:
        out["dtype"] = dtype
    for key, value in (("max_batch_size", features.max_num_seqs), ("max_num_tokens", features.max_num_batched_tokens),
                       ("max_seq_len", features.max_model_len), ("enable_chunked_prefill", features.chunked_prefill)):
        if value is not None:
            out[key] = value
    if features.tensor_parallel_size != 1:
        out["tensor_parallel_size"] = features.tensor_parallel_size
    if features.pipeline_parallel_size != 1:
        out["pipeline_parallel_size"] = features.pipeline_parallel_size
    out["return_perf_metrics"] = True  # per-request metrics on /prometheus/metrics
    out["enable_iter_perf_stats"] = True  # iteration metrics: queue, KV use, drafts
    return out


FEATURE_KEYS: dict[str, tuple[str, ...]] = {
    "kv_cache_dtype": ("kv_cache_config", "dtype"), "prefix_caching": ("kv_cache_config", "enable_block_reuse"),
    "gpu_memory_utilization": ("kv_cache_config", "free_gpu_memory_fraction"),
    "kv_offload_gib": ("kv_cache_config", "host_cache_size"), "speculative.method": ("speculative_config",),
    "cuda_graphs": ("cuda_graph_config",), "weights_dtype": ("dtype",), "max_num_seqs": ("max_batch_size",),
    "max_num_batched_tokens": ("max_num_tokens",), "max_model_len": ("max_seq_len",),
    "chunked_prefill": ("enable_chunked_prefill",), "tensor_parallel_size": ("tensor_parallel_size",),
    "pipeline_parallel_size": ("pipeline_parallel_size",),
}
"""Feature -> where it lands in the YAML (the GUI and the docs name it so; tests check each)."""


def options_text(features: Features) -> str:
    """The options file: JSON, which YAML 1.2 (and PyYAML's safe_load) reads as the same mapping."""
    return json.dumps(llm_api_options(features), indent=2, sort_keys=True) + "\n"


CLI_FOR_OPTION: dict[str, str] = {
    "--max_batch_size": "max_batch_size", "--max_num_tokens": "max_num_tokens", "--max_seq_len": "max_seq_len",
    "--tensor_parallel_size": "tensor_parallel_size", "--tp_size": "tensor_parallel_size",
    "--pipeline_parallel_size": "pipeline_parallel_size", "--pp_size": "pipeline_parallel_size",
    "--free_gpu_memory_fraction": "kv_cache_config", "--kv_cache_free_gpu_memory_fraction": "kv_cache_config",
    "--enable_chunked_prefill": "enable_chunked_prefill",
}
"""trtllm-serve flags that set what the options file also sets (the file wins, silently)."""
RESERVED_FLAGS = frozenset({"--host", "--port", "--backend", "--tokenizer", "--config", OPTIONS_FLAG, "--log_level"})


PHASE_PATTERNS = phase_patterns(
    (Phase.READY, (r"Application startup complete", r"Uvicorn running on")),
    (Phase.STARTING_SERVER, (r"Started server process",)),
    (Phase.WARMING_UP, (r"[Ww]arm(ing)?[ -]?up", r"CUDA graph")),
    (Phase.KV_CACHE, (r"paged KV cache", r"KV cache", r"kv_cache_manager")),
    (Phase.LOADING_WEIGHTS, (r"Loading (model|weights|checkpoint)", r"load_weights", r"Loading safetensors")),
)
"""Log markers of each startup phase, latest phase first (the first that matches names it)."""
KV_TOKENS_RE = re.compile(r"max tokens in paged KV cache \((?P<tokens>[\d,]+)\)")


def parse_kv_cache(log_lines: Sequence[str]) -> dict[str, float]:
    """The KV capacity TensorRT-LLM logged ("Allocated ... for max tokens in paged KV cache (N)")."""
    for line in reversed(log_lines):
        if m := KV_TOKENS_RE.search(line):
            return {"kv_cache_tokens": float(m.group("tokens").replace(",", ""))}
    return {}




DIAGNOSIS_RULES: tuple[DiagnosisRule, ...] = tuple(diagnosis_rule(code, rx, advice) for code, rx, advice in (
    ("no_runtime", r"No module named '?tensorrt_llm'?|trtllm-serve: (command )?not found",
     "TensorRT-LLM is not installed for this runtime: it needs an NVIDIA GPU (use NVIDIA's release image or a venv "
     "with tensorrt_llm)."),
    ("unknown_option", r"Extra inputs are not permitted",
     "TensorRT-LLM does not know an option in the LLM API file tunebench wrote: the installed version predates it "
     "(the log names the field)."),
    ("unknown_flag", r"Error: No such option: (\S+)|no such option",
     "trtllm-serve does not know an argument (check the installed version: `tunebench engine flags`)."),
    ("no_gpu", r"No GPU devices found|No CUDA GPUs are available|Found no NVIDIA driver",
     "TensorRT-LLM needs an NVIDIA GPU and found none usable here."),
    ("cuda_oom", r"CUDA out of memory|OutOfMemoryError|out of memory",
     "The GPU ran out of memory while starting: lower GPU memory utilization (the KV cache's share), the max "
     "sequence length or batch size, use an FP8 checkpoint or KV cache, or tensor parallelism."),
    ("port_in_use", r"Address already in use|Failed to bind socket",
     PORT_IN_USE_ADVICE),
))

SPEC = EngineSpec(
    kind="trtllm", display_name="TensorRT-LLM", metric_names=METRIC_NAMES,
    api_key_env="TRTLLM_API_KEY",  # not read by trtllm-serve (it has no API key option; validate says so)
    phase_patterns=PHASE_PATTERNS, diagnosis_rules=DIAGNOSIS_RULES, flag_rules=(),  # features go in the options file
    generic_error=re.compile(r"\b(\w+(?:Error|Exception)): (.+)"), not_an_error=re.compile(r"\[[IWV]\]|\b(INFO|WARNING|DEBUG)\b"),
    help_layout=HelpLayout.CLICK_ENTRIES, help_timeout_s=300, reserved_flags=RESERVED_FLAGS,
    model_flag=None, tokenizer_flag="--tokenizer", fixed_args=("--backend", "pytorch"),
    metrics_path="/prometheus/metrics",
    engine_defaults={"prefix_caching": True, "chunked_prefill": False},  # TorchLlmArgs: block reuse on, chunking off
    probe=ProbeSpec(fit_model_len=False), prefix_cache_noun="KV cache",
    gpu_verified=GPU_VERIFIED, maturity=MATURITY,
)


class TrtllmAdapter(CommandLineAdapter):
    """TensorRT-LLM's OpenAI server, ``trtllm-serve`` on the PyTorch backend."""

    spec = SPEC
    install_hint = "NVIDIA's TensorRT-LLM release image or wheel (pip install tensorrt_llm, from NVIDIA's index)"
    image_hint = f"{DOCKER_IMAGE}:<version>"
    default_image = DOCKER_IMAGE

    def engine_terms(self, features: Features) -> dict[str, str]:
        """Each feature's place in the options file, with its value (``kv_cache_config.dtype: fp8``)."""
        options, out = llm_api_options(features), {}
        for key, path in FEATURE_KEYS.items():
            node: Any = options
            for part in path:
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                out[key] = f"{'.'.join(path)}: {json.dumps(node, sort_keys=True)}"
        return out

    def kv_cache(self, log_lines: Sequence[str]) -> dict[str, float]:
        return parse_kv_cache(log_lines)

    # -- launch ---------------------------------------------------------------------------------

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        runtime = engine.runtime
        if runtime.kind == "executable":
            assert runtime.executable is not None
            return [runtime.executable if portable else resolve_executable(engine), "serve"]
        if runtime.kind == "python":
            if portable:
                return [EXECUTABLE, "serve"]
            python = resolve_python(engine)
            assert python is not None
            return [python, "-c", PYTHON_ENTRY, "serve"]
        if runtime.kind == "docker":
            # The options file is mounted read-only where the container sees it ({options}: its path here).
            docker = docker_run_prefix(engine, engine.port if port is None else port, gpus=True, api_key_env=None)
            return [*docker, "-v", f"{{options}}:{CONTAINER_DIR}/{OPTIONS_FILE}:ro",
                    docker_image(engine, self.default_image), EXECUTABLE, "serve"]
        raise RuntimeErrorMessage("TensorRT-LLM runs from trtllm-serve (runtime kind 'executable'), a Python "
                                  f"interpreter with tensorrt_llm (kind 'python') or the {DOCKER_IMAGE} image (kind "
                                  "'docker'); no managed runtime exists (it needs an NVIDIA GPU)")

    def options_path(self, features: Features) -> Path:
        """Write the options file (named by its content, so a launch never rewrites another's)."""
        text = options_text(features)
        folder = state_dir() / "trtllm"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"llm-api-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
        return path

    def side_files(self, engine: EngineConfig, features: Features) -> dict[str, str]:
        """Files an exported script writes beside itself: the options YAML."""
        return {OPTIONS_FILE: options_text(features)}

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        docker = engine.runtime.kind == "docker"
        local = BESIDE_SCRIPT + OPTIONS_FILE if portable else str(self.options_path(features))
        options = f"{CONTAINER_DIR}/{OPTIONS_FILE}" if docker else local
        argv = [*self.base_command(engine, port, portable=portable), *self.model_args(engine),
                *self.server_args(engine, port), *SPEC.fixed_args, OPTIONS_FLAG, options, *features.extra_args]
        return [local + token[len("{options}"):] if token.startswith("{options}:") else token for token in argv]

    def build_env(self, engine: EngineConfig, api_key: str | None) -> dict[str, str]:
        return runtime_env(engine)  # trtllm-serve reads no API key

    # -- flag discovery -------------------------------------------------------------------------

    def help_command(self, engine: EngineConfig) -> list[str]:
        if engine.runtime.kind not in ("executable", "python"):
            raise RuntimeErrorMessage("flag discovery needs a local trtllm-serve (runtime kind 'executable' or "
                                      "'python'); docker images are not inspected")
        return self.base_command(engine)

    def installed_version(self, engine: EngineConfig) -> str:
        if engine.runtime.kind == "python":
            python = resolve_python(engine)
            assert python is not None
        elif engine.runtime.kind == "executable":
            # trtllm-serve is a console script: its interpreter is named on its first line.
            first = Path(resolve_executable(engine)).read_text(errors="replace").splitlines()[:1]
            python = first[0].removeprefix("#!").strip() if first and first[0].startswith("#!") else ""
        else:
            raise RuntimeErrorMessage("the TensorRT-LLM version is read from a local installation")
        cmd = [python, "-c", "import importlib.metadata as m; print(m.version('tensorrt_llm'))"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        except OSError as exc:
            raise RuntimeErrorMessage(f"could not determine the TensorRT-LLM version ({exc.strerror})") from None
        lines = result.stdout.strip().splitlines() if result.returncode == 0 else []
        if not lines:
            raise RuntimeErrorMessage(f"{python or engine.runtime.executable} has no tensorrt_llm installed "
                                      "(TensorRT-LLM needs an NVIDIA GPU)")
        return lines[-1].strip()

    # -- validation -----------------------------------------------------------------------------

    def setup_issues(self, engine: EngineConfig, features: Features, flags: FlagSet | None,
                     hardware: HardwareInfo | None) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        add = issues.append
        if engine.runtime.kind == "managed":
            add(ValidationIssue("engine.runtime", "TensorRT-LLM has no managed runtime (it needs an NVIDIA GPU): use "
                                                  "trtllm-serve (runtime kind 'executable'), a Python interpreter with "
                                                  f"tensorrt_llm ('python') or the {DOCKER_IMAGE} image ('docker')"))
        issues += needs_gpu_issue("TensorRT-LLM", hardware, features.gpus_per_replica)
        if engine.require_api_key:
            add(ValidationIssue("engine.require_api_key", "trtllm-serve has no API key option: the server is open to "
                                                          "anyone who can reach 127.0.0.1; set require_api_key = false "
                                                          "to acknowledge it", "warning"))
        if engine.served_model_name:
            add(ValidationIssue("engine.served_model_name", "trtllm-serve names the model by its path or hub id; the "
                                                            "served name is ignored", "warning"))
        return issues

    def feature_issues(self, engine: EngineConfig, features: Features,
                       hardware: HardwareInfo | None) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        add = issues.append
        spec = features.speculative
        if features.weights_dtype in ("fp8", "awq", "gptq"):
            add(ValidationIssue("weights_dtype", "TensorRT-LLM takes weight quantization from the checkpoint: serve a "
                                                 f"checkpoint already quantized to {features.weights_dtype.upper()} "
                                                 "(e.g. NVIDIA's ModelOpt FP8 ones) and leave weight precision on auto"))
        issues += block_quantized_kv_issue(features, "TensorRT-LLM's 8-bit KV cache is fp8")
        issues += gguf_weights_issue(features, "TensorRT-LLM takes weight quantization from the checkpoint (e.g. "
                                               "ModelOpt FP8)")
        if features.kv_cache_dtype == "fp8_e5m2":
            add(ValidationIssue("kv_cache_dtype", "TensorRT-LLM's FP8 KV cache is E4M3: choose fp8 or fp8_e4m3"))
        if spec.method == "eagle":
            add(ValidationIssue("speculative.method", "TensorRT-LLM's PyTorch backend runs EAGLE-3 heads (eagle3), "
                                                      "not EAGLE-1/2"))
        issues += draft_model_issues(features, NEEDS_DRAFT_MODEL, "speculative_model_dir")
        if features.cpu_offload_gib > 0:
            add(ValidationIssue("cpu_offload_gib", "TensorRT-LLM does not offload weights to host memory (its host "
                                                   "tier is for the KV cache: KV offload)"))
        if features.kv_offload_backend == "lmcache":
            add(ValidationIssue("kv_offload_backend", "TensorRT-LLM's host KV tier is its own (host_cache_size); LMCache "
                                                      "is a KV connector it configures separately: use 'native'"))
        issues += kv_offload_size_issue(features)
        util = features.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            add(ValidationIssue("gpu_memory_utilization", f"must be in (0, 1], got {util}"))
        elif util is not None:
            add(ValidationIssue("gpu_memory_utilization", "TensorRT-LLM applies it to the memory left after the "
                                                          "weights (kv_cache_config.free_gpu_memory_fraction), not to "
                                                          "the whole GPU as vLLM does", "warning"))
        return issues

    def extra_args_issues(self, features: Features) -> list[ValidationIssue]:
        """Extra flags may not set what tunebench sets, nor what the options file sets (it wins silently)."""
        issues = []
        for flag in self.flag_names(features.extra_args):
            if flag in RESERVED_FLAGS:
                issues.append(ValidationIssue("extra_args", f"{flag} is set by tunebench from the configuration; "
                                                            "set it there"))
            elif (option := CLI_FOR_OPTION.get(flag)) is not None and option in llm_api_options(features):
                issues.append(ValidationIssue("extra_args", f"{flag} is already set by a feature toggle (in the "
                                                            "options file)"))
        return issues

    def version_issues(self, features: Features, flags: FlagSet) -> list[ValidationIssue]:
        """The flags tunebench passes and the extra ones, against the installed help."""
        issues = []
        for key, names in (("engine", ["--host", "--port", "--backend", OPTIONS_FLAG]),
                           ("extra_args", self.flag_names(features.extra_args))):
            for flag in names:
                if not flags.has(flag):
                    issues.append(ValidationIssue(key, f"{flag} is not supported by the installed trtllm-serve "
                                                       f"{flags.version}"))
        if (backends := flags.choices.get("--backend")) and "pytorch" not in backends:
            issues.append(ValidationIssue("engine", f"trtllm-serve {flags.version} has no pytorch backend "
                                                    f"(choices: {', '.join(backends)})"))
        return issues


ADAPTER = TrtllmAdapter()
flag_names = ADAPTER.flag_names
parse_help = ADAPTER.parse_help
