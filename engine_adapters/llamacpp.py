"""The llama.cpp adapter: features -> llama-server flags, flag discovery per installed version,
validation (what llama.cpp lacks is refused with the reason, so the GUI greys it), startup
phases, diagnosis, verification by effect and its Prometheus metric names.

**Runtime.** Two ways to run llama.cpp's server, with one argv:

- ``managed`` (``llamacpp-cpu``, the default here) or ``python``: the ``xllamacpp`` wheel, which
  runs llama.cpp's own C++ HTTP server (slots, continuous batching, prompt cache, ``/metrics``,
  ``/slots``) inside a Python process; ``llamacpp_serve.py`` gives it llama-server's command line.
  Chosen as the default because it is a prebuilt, MIT-licensed CPU wheel for Linux x86-64
  (cp310-abi3: any Python tunebench supports) that ``pip`` installs in seconds into a venv in
  the user cache, like the vLLM CPU runtime, so ``make`` sets it up on a fresh machine with no
  compiler and no download outside PyPI. Its version is the wheel's (llama.cpp's build number
  is not recorded in it: it reports ``b0-unknown``). Its CPU build is compiled for portability
  (AVX2, no AVX-512), so it is slower than a native build: fine for the demo model.
- ``executable``: a ``llama-server`` the user already has (a native or CUDA build), started
  with the same flags; its ``--help`` and ``--version`` are read like the wheel's.

Either way the engine is a separate process started from an argv list, in its own process
group, bound to 127.0.0.1, with the API key in ``LLAMA_API_KEY`` (llama-server reads it from
there; never on the command line) and ``/metrics`` on (``--metrics``).

**Feature map.** KV cache precision -> ``-ctk/-ctv`` (``q8_0``, ``q4_0``; FP8 requests run as
``q8_0``, its nearest type, with a warning); max concurrent sequences -> ``-np`` (slots: its
batching); prefix caching -> ``--cache-prompt`` / ``--no-cache-prompt --cache-ram 0``;
speculative decoding -> ``--spec-type ngram-simple`` or a draft model (``-md``), EAGLE-3 and
MTP; GPU layers -> ``-ngl``; flash attention -> ``-fa on|off``; max model length -> ``-c``
(per slot); max batched tokens -> ``-b``. Weight precision is the GGUF file: ``auto`` serves it as
it is, ``q8_0``/``q4_0`` serve a copy quantized here from the 16-bit GGUF (``llamacpp_runtime``),
verified by the type the engine reports loading. llama.cpp has no utilization fraction, GiB offload, tensor/pipeline parallel sizes or
CUDA-graph switch: those are refused with what to do instead.

Facts about llama.cpp live here; ``llamacpp_serve.py`` (the wheel's command line),
``llamacpp_gguf.py`` (the GGUF demo model) and ``llamacpp_runtime.py`` (its cache) serve it, and
what every engine shares is ``engine_adapters.spec``.
"""

from __future__ import annotations

import hashlib
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
    PORT_IN_USE_ADVICE,
    SHORT_OR_LONG_FLAG_RE,
    DiagnosisRule,
    FlagRule,
    HelpLayout,
    package_version,
    phase_patterns,
    switch_flag,
    value_flag,
)
from engine_adapters.command_line import diagnosis_rule as _rule
from engine_adapters.config import DEMO_MODEL, GGUF_WEIGHT_BITS, EngineConfig, Features
from engine_adapters.hardware import HardwareInfo
from engine_adapters.llamacpp_runtime import (
    ensure_gguf_demo_model,
    ensure_quantized_gguf,
    gguf_demo_path,
    gguf_demo_ready,
)
from engine_adapters.runtimes import (
    COMPLETE_MARKER,
    MANAGED_RUNTIMES,
    RuntimeErrorMessage,
    demo_model_dir,
    managed_runtime,
    resolve_executable,
    resolve_python,
)
from engine_adapters.spec import (
    CommandLineAdapter,
    EngineSpec,
    ProbeSpec,
    SettingEcho,
    draft_model_ignored,
    metric_names,
)

SERVE_SCRIPT = Path(__file__).with_name("llamacpp_serve.py")
API_KEY_ENV = "LLAMA_API_KEY"
PORTABLE_EXECUTABLE = "llama-server"
"""What an exported script runs: the flags are llama-server's, whichever runtime ran here."""
LOG_VERBOSITY = "4"
"""Verbosity at which llama.cpp logs the context and KV cache it allocated (read by verify)."""
HTTP_THREADS = "128"
"""llama.cpp's HTTP server serves each connection, keep-alive included, on one thread of a fixed
pool (by default slots + 4), so a load client with more connections than slots (requests queue
at the server) plus the telemetry scraper could wait for a thread; idle threads cost little. (A
precaution: it did not change the keep-alive failures in docs/engines.md, "Known problem".)"""

# --- metric names ---------------------------------------------------------------------------
# Checked against the server's README ("GET /metrics"), published scrapes and a scrape of the
# managed runtime (xllamacpp 2026.10.11549). ``kv_cache_usage_ratio`` and ``kv_cache_tokens``
# were dropped by newer builds (the unified KV cache), so KV use is unsupported there;
# speculative-decoding counters were renamed (``tokens_drafted*`` -> ``spec_decode_num_*``).
# ``prompt_tokens_total`` counts only the prompt tokens computed (cached ones are in
# ``prompt_tokens_cached_total``), so there is no count of prefix-cache queries and no hit rate.
# llama.cpp has no latency histograms.

METRIC_NAMES = metric_names(
    "llamacpp:",
    gauges={"requests_running": "requests_processing", "requests_waiting": "requests_deferred",
            "kv_cache_usage_ratio": "kv_cache_usage_ratio", "kv_cache_tokens": "kv_cache_tokens"},
    counters={
        "generation_tokens": "tokens_predicted_total", "prompt_tokens": "prompt_tokens_total",
        "prefix_cache_hits": "prompt_tokens_cached_total", "spec_decode_drafts": "spec_decode_num_drafts_total",
        "spec_decode_draft_tokens": ("spec_decode_num_draft_tokens_total", "tokens_drafted_total"),
        "spec_decode_accepted_tokens": ("spec_decode_num_accepted_tokens_total", "tokens_drafted_accepted_total"),
        "decode_steps": "n_decode_total", "generation_seconds": "tokens_predicted_seconds_total",
        "prompt_seconds": "prompt_seconds_total"},
)

# --- feature -> flag mapping --------------------------------------------------------------------

KV_CACHE_TYPES: dict[str, str] = {"fp8": "q8_0", "fp8_e4m3": "q8_0", "fp8_e5m2": "q8_0", "q8_0": "q8_0", "q4_0": "q4_0"}
"""KV-cache precision -> llama.cpp's cache type (it has no FP8 cache: q8_0 is the 8-bit one)."""
KV_BYTES_PER_ELEMENT: dict[str, float] = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                                          "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}
"""Bytes per stored value of each cache type (ggml's block sizes: q8_0 keeps 32 values in 34 bytes)."""
SPEC_TYPES: dict[str, str] = {"ngram": "ngram-simple", "eagle3": "draft-eagle3", "mtp": "draft-mtp"}


def speculative_flags(features: Features) -> list[str]:
    spec = features.speculative
    n = str(spec.num_speculative_tokens)
    if spec.method == "ngram":
        # One n-gram size: the window's minimum, the shortest match that proposes a draft, as in
        # vLLM (with the demo model, size 4 drafted nothing in 128 tokens; size 1 drafted 93).
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(spec.ngram_prompt_lookup_min),
                "--spec-ngram-simple-size-m", n, "--spec-draft-n-max", n]
    if spec.method in ("draft_model", "eagle3") and spec.draft_model:
        kind = ["--spec-type", SPEC_TYPES[spec.method]] if spec.method in SPEC_TYPES else []
        return [*kind, "-md", spec.draft_model, "--spec-draft-n-max", n]
    if spec.method == "mtp":
        return ["--spec-type", "draft-mtp", "--spec-draft-n-max", n]
    return []  # off, or refused by validate (eagle, a drafter without its model)


def _ctx_size(features: Features) -> list[str]:
    """-c is the whole context: per slot times the slots (the auto slots share one unified cache,
    so there it is the per-request limit itself)."""
    if features.max_model_len is None:
        return []
    return ["-c", str(features.max_model_len * (features.max_num_seqs or 1))]


FLAG_RULES: tuple[FlagRule, ...] = (
    FlagRule("kv_cache_dtype", lambda f: [] if (t := KV_CACHE_TYPES.get(f.kv_cache_dtype)) is None
             else ["-ctk", t, "-ctv", t]),
    switch_flag("prefix_caching", on=["--cache-prompt"], off=["--no-cache-prompt", "--cache-ram", "0"]),
    FlagRule("speculative.method", speculative_flags),
    value_flag("max_num_seqs", "-np"), value_flag("max_num_batched_tokens", "-b"), FlagRule("max_model_len", _ctx_size),
    value_flag("gpu_layers", "-ngl"), switch_flag("flash_attention", on=["-fa", "on"], off=["-fa", "off"]),
)


PHASE_PATTERNS = phase_patterns(
    (Phase.READY, (r"server is listening on", r"serving on http")),
    (Phase.STARTING_SERVER, (r"init: model loaded", r"starting the main loop")),
    (Phase.WARMING_UP, (r"warming up the model",)),
    (Phase.KV_CACHE, (r"llama_kv_cache:", r"llama_context: n_ctx")),
    (Phase.PROFILING, (r"fitting params to (device|free) memory", r"common_params_fit")),
    (Phase.LOADING_WEIGHTS, (
        r"load_model: loading model", r"llama_model_loader: loaded meta data", r"load_tensors:",
    )),
)
"""Log markers of each startup phase, latest phase first (the first that matches names it)."""

LOGGED_SIZES = {key: re.compile(rx) for key, rx in (
    ("n_ctx", r"llama_context: n_ctx\s+= (\d+)"),
    ("n_ctx_seq", r"llama_context: n_ctx_seq\s+= (\d+)"),
    ("n_seq_max", r"llama_context: n_seq_max\s+= (\d+)"),
    ("n_batch", r"llama_context: n_batch\s+= (\d+)"),
    ("n_layer", r"print_info: n_layer\s+= (\d+)"),
    ("n_embd_k_gqa", r"print_info: n_embd_k_gqa\s+= (\d+)"),
    ("n_embd_v_gqa", r"print_info: n_embd_v_gqa\s+= (\d+)"),
    ("n_slots", r"initializing, n_slots = (\d+)"),
)}
FLASH_ATTN_RE = re.compile(r"llama_context: flash_attn\s+= (\w+)")
KV_ALLOC_RE = re.compile(r"llama_kv_cache: size = +[\d.]+ MiB .*K \((?P<k>\w+)\): +(?P<k_mib>[\d.]+) MiB, "
                         r"V \((?P<v>\w+)\): +(?P<v_mib>[\d.]+) MiB")
OFFLOADED_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
FILE_TYPE_RE = re.compile(r"print_info: file type\s+= (\S+)")
TENSOR_TYPES_RE = re.compile(r"llama_model_loader: - type\s+(\w+):\s+(\d+) tensors")




DIAGNOSIS_RULES: tuple[DiagnosisRule, ...] = (
    _rule("unknown_flag", r"error: invalid argument: (\S+)",
          lambda m: f"The engine does not know the argument {m.group(1)} (check the installed version: "
                    "`tunebench engine flags`)."),
    _rule("removed_flag", r"the argument has been removed(.*)",
          lambda m: f"The installed llama.cpp removed an argument tunebench passed{m.group(1).rstrip('.')}."),
    _rule("bad_argument", r'error while handling argument "(\S+)": (.*)',
          lambda m: f"The engine rejected {m.group(1)}: {m.group(2).strip()}"),
    _rule("quantized_v_needs_fa", r"quantized V cache requires flash_attn|V cache quantization requires flash_attn",
          "llama.cpp keeps a quantized V cache only with flash attention: turn flash attention on (or leave it to "
          "the engine), or use a 16-bit KV cache."),
    _rule("pre_tokenizer", r"unknown pre-tokenizer type: '([^']*)'",
          lambda m: f"This llama.cpp does not know the GGUF's pre-tokenizer '{m.group(1)}': convert the model "
                    "with a matching llama.cpp, or use a newer llama.cpp."),
    _rule("model_missing", r"failed to open GGUF file|(?:gguf_init_from_file|llama_model_load).*No such file"
                           r"|error loading model: .*(?:failed to open|No such file)",
          "The model file was not found or is not a GGUF file: check the path."),
    _rule("model_load", r"error loading model: (.*)",
          lambda m: f"llama.cpp could not load the model: {m.group(1).strip()}"),
    _rule("port_in_use", r"couldn't bind HTTP server socket|Address already in use|bind failed",
          PORT_IN_USE_ADVICE),
    _rule("out_of_memory", r"failed to allocate .* buffer|cudaMalloc failed|out of memory",
          "llama.cpp could not allocate memory for the model or its KV cache: lower the context size (max model "
          "length), the slots or the GPU layers, or use a smaller quantization."),
    _rule("no_runtime", r"No module named 'xllamacpp'",
          "The interpreter has no xllamacpp: use the managed runtime (`tunebench engine install llamacpp-cpu`)."),
    _rule("start_failed", r"error: the server did not start: (.*)",
          lambda m: f"llama.cpp's server did not start ({m.group(1).strip()}); the log above says why."),
)

SPEC = EngineSpec(
    kind="llamacpp", display_name="llama.cpp", api_key_env=API_KEY_ENV, metric_names=METRIC_NAMES,
    phase_patterns=PHASE_PATTERNS, diagnosis_rules=DIAGNOSIS_RULES, flag_rules=FLAG_RULES,
    generic_error=re.compile(r"\b(\w+(?:Error|Exception)): (.+)"),
    help_layout=HelpLayout.LLAMA, help_with_stderr=True, flag_token=SHORT_OR_LONG_FLAG_RE, comma_lists=True,
    reserved_flags=frozenset({"-m", "-a", "--host", "--port", "--api-key", "--api-key-file", "--metrics", "-lv", "-hf",
                              "--threads-http"}),
    model_flag="-m", served_name_flag="-a",
    fixed_args=("--metrics", "-lv", LOG_VERBOSITY, "--threads-http", HTTP_THREADS),
    aliases=(
    ("-m", "--model"), ("-a", "--alias"), ("-c", "--ctx-size"), ("-np", "--parallel"), ("-b", "--batch-size"),
    ("-ngl", "--gpu-layers", "--n-gpu-layers"), ("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v"),
    ("-fa", "--flash-attn"), ("-md", "--model-draft"), ("-cram", "--cache-ram"), ("--cache-prompt", "--no-cache-prompt"),
    ("-lv", "--verbosity", "--log-verbosity"), ("-hf", "-hfr", "--hf-repo"),
    ),
    # llama-server (cpp-httplib) closes a kept-alive connection after a few requests; a client that
    # reuses it fails its next POST ("Can not write request body"): a fresh connection per request.
    client_keep_alive=False,
    # Its server returns logprobs only for the tokens it generates: no echo of the prompt's.
    prompt_logprobs=False,
    # llama.cpp counts a request in /metrics after answering it: a fence request makes sure the last is counted.
    # The sizes llama.cpp logs while starting (context, slots, batch, layer shapes): the context's
    # tokens in all and per request are its KV capacity.
    logged_sizes=LOGGED_SIZES, kv_capacity_sizes=("n_ctx", "n_ctx_seq"),
    probe=ProbeSpec(fence_request=True), prefix_cache_noun="prompt cache",
    setting_echoes=(SettingEcho("max_num_seqs", "n_slots"), SettingEcho("max_model_len", "n_ctx_seq"),
                    SettingEcho("max_num_batched_tokens", "n_batch")),
    echo_evidence="engine logged {name} = {value}",
)
KV_BYTES_TOLERANCE = 0.1  # MiB are logged to two decimals
LLAMACPP_RUNTIMES = ("llama.cpp runs from the llamacpp-cpu runtime, a venv with xllamacpp (runtime kind 'python') or "
                     "a llama-server executable")


class LlamaCppAdapter(CommandLineAdapter):
    """llama.cpp's server (the xllamacpp wheel, or a llama-server executable)."""

    spec = SPEC

    # -- launch ---------------------------------------------------------------------------------

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        runtime = engine.runtime
        if runtime.kind in ("managed", "python"):
            if portable:
                return [PORTABLE_EXECUTABLE]
            python = resolve_python(engine)
            assert python is not None
            return [python, str(SERVE_SCRIPT)]
        if runtime.kind == "executable":
            assert runtime.executable is not None
            return [runtime.executable if portable else resolve_executable(engine)]
        raise RuntimeErrorMessage(f"{LLAMACPP_RUNTIMES}; docker images are not supported yet")

    def model_name(self, engine: EngineConfig) -> str:
        """The GGUF file: the demo model's (converted on first use when a runtime with gguf is
        at hand) or the configured path."""
        if engine.model != DEMO_MODEL:
            return engine.model
        if gguf_demo_ready():
            return str(gguf_demo_path())
        python = resolve_python(engine) if engine.runtime.kind in ("managed", "python") else None
        return str(ensure_gguf_demo_model(python))

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        """The shared argv, with the model file quantized to ``weights_dtype`` when it is a GGUF
        weight type (made on first use, then cached)."""
        argv = super().build_argv(engine, features, port, portable=portable)
        if features.weights_dtype in GGUF_WEIGHT_BITS:
            at = argv.index(str(self.spec.model_flag)) + 1
            argv[at] = str(ensure_quantized_gguf(Path(argv[at]).expanduser(), features.weights_dtype,
                                                 _gguf_python(engine)))
        return argv

    def help_identity(self, engine: EngineConfig, command: Sequence[str]) -> str:
        """The wheel's flags are its runner script's: the script's hash is part of the identity."""
        identity = " ".join(command)
        if engine.runtime.kind in ("managed", "python"):
            identity += hashlib.sha256(SERVE_SCRIPT.read_bytes()).hexdigest()
        return identity

    def installed_version(self, engine: EngineConfig) -> str:
        """``xllamacpp-<wheel version>`` for the wheel; ``b<build>`` for a llama-server."""
        python = resolve_python(engine) if engine.runtime.kind in ("managed", "python") else None
        if python is not None:
            if (version := package_version(python, "xllamacpp", 60)) is not None:
                return f"xllamacpp-{version}"
            raise RuntimeErrorMessage(f"could not determine the installed xllamacpp version ({python})")
        cmd = [resolve_executable(engine), "--version"]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
        m = re.search(r"version: (\d+) \((\w+)\)", result.stdout + result.stderr)
        if m is None:
            raise RuntimeErrorMessage(f"could not determine the llama.cpp version ({cmd[0]} --version)")
        return f"b{m.group(1)}"

    # -- validation -----------------------------------------------------------------------------

    def is_cpu_build(self, engine: EngineConfig) -> bool:
        if engine.runtime.kind == "managed":
            try:
                return managed_runtime(engine.runtime.managed).name.endswith("-cpu")
            except RuntimeErrorMessage:
                return False
        return False

    def setup_issues(self, engine: EngineConfig, features: Features, flags: FlagSet | None,
                     hardware: HardwareInfo | None) -> list[ValidationIssue]:
        return _runtime_issues(engine) + _model_issues(engine)

    def model_issues(self, engine: EngineConfig) -> list[ValidationIssue]:
        return []  # a GGUF path, checked with the runtime (setup_issues)

    def feature_issues(self, engine: EngineConfig, features: Features,
                       hardware: HardwareInfo | None) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        add = issues.append
        spec = features.speculative
        if features.weights_dtype != "auto" and features.weights_dtype not in GGUF_WEIGHT_BITS:
            add(ValidationIssue("weights_dtype", f"llama.cpp's weight types are GGUF ones: auto (the file's own) or "
                                                 f"{', '.join(GGUF_WEIGHT_BITS)} (made here from its 16-bit GGUF), "
                                                 f"not {features.weights_dtype}"))
        if features.kv_cache_dtype.startswith("fp8"):
            add(ValidationIssue("kv_cache_dtype", "llama.cpp has no FP8 KV cache: this runs q8_0 (8-bit values with "
                                                  "a scale per 32, 1.06 bytes each), its nearest type", "warning"))
        if KV_CACHE_TYPES.get(features.kv_cache_dtype) and features.flash_attention is False:
            add(ValidationIssue("flash_attention", "a quantized V cache needs flash attention in llama.cpp: turn it "
                                                   "on or leave it to the engine"))
        if spec.method == "eagle":
            add(ValidationIssue("speculative.method", "llama.cpp runs EAGLE-3 heads (eagle3), not EAGLE-1/2"))
        if spec.method in ("draft_model", "eagle3"):
            if not spec.draft_model:
                add(ValidationIssue("speculative.draft_model", f"speculative method '{spec.method}' needs a draft "
                                                               "model (a GGUF file)"))
            elif not spec.draft_model.lower().endswith(".gguf") or not Path(spec.draft_model).expanduser().is_file():
                add(ValidationIssue("speculative.draft_model", f"llama.cpp needs the draft model as a local GGUF "
                                                               f"file: {spec.draft_model}"))
        issues += draft_model_ignored(features)
        if spec.method == "ngram" and spec.ngram_prompt_lookup_min != spec.ngram_prompt_lookup_max:
            add(ValidationIssue("speculative.ngram_prompt_lookup_max",
                                f"llama.cpp's ngram-simple matches one n-gram size: {spec.ngram_prompt_lookup_min} (the "
                                "minimum), not a window", "warning"))
        refusals = (
            ("cpu_offload_gib", features.cpu_offload_gib > 0,
             "llama.cpp offloads whole layers, not GiB: set GPU layers instead"),
            ("kv_offload_gib", features.kv_offload_gib > 0 or features.kv_offload_backend is not None,
             "llama.cpp has no KV offload tier (its KV cache stays with its layers; --no-kv-offload keeps all of it "
             "in host memory)"),
            ("gpu_memory_utilization", features.gpu_memory_utilization is not None,
             "llama.cpp sizes memory by context size and GPU layers, not a utilization fraction"),
            ("tensor_parallel_size", features.tensor_parallel_size > 1,
             "llama.cpp splits a model across GPUs by layers (--split-mode, --tensor-split), not by tensor-parallel size"),
            ("pipeline_parallel_size", features.pipeline_parallel_size > 1,
             "llama.cpp splits a model across GPUs by layers (--split-mode layer), not by pipeline-parallel size"),
            ("chunked_prefill", features.chunked_prefill is False,
             "llama.cpp always processes prompts in batches of -b tokens between decode steps; it cannot be turned off"),
            ("cuda_graphs", not features.cuda_graphs,
             "llama.cpp has no flag for CUDA graphs (its CUDA build uses them; GGML_CUDA_DISABLE_GRAPHS=1 in the "
             "runtime's environment turns them off)"),
        )
        for key, refused, reason in refusals:
            if refused:
                add(ValidationIssue(key, reason))
        if features.gpu_layers:
            if self.is_cpu_build(engine):
                add(ValidationIssue("gpu_layers", "the llamacpp-cpu runtime (xllamacpp's CPU wheel) has no GPU "
                                                  "backend: use a CUDA build (runtime kind 'python' or 'executable')"))
            elif hardware is not None and not hardware.has_gpu:
                add(ValidationIssue("gpu_layers", "GPU layers need a GPU; none is visible here"))
        return issues

    # -- verification ---------------------------------------------------------------------------

    def verify_settings(self, features: Features, log_lines: Sequence[str]) -> list[FeatureCheck]:
        """The sizes llama.cpp logged, then the weight type, flash attention and GPU layers it reports."""
        checks = super().verify_settings(features, log_lines)
        if features.weights_dtype in GGUF_WEIGHT_BITS:
            checks.append(verify_weights_dtype(features.weights_dtype, log_lines))
        if features.flash_attention is not None:
            fa = next((m.group(1) for m in map(FLASH_ATTN_RE.search, log_lines) if m), None)
            want = "enabled" if features.flash_attention else "disabled"
            status: FeatureStatus = "unknown" if fa is None else "accepted" if fa == want else "not active"
            checks.append(FeatureCheck("flash_attention", str(features.flash_attention), status,
                                       f"engine logged flash_attn = {fa}"))
        if features.gpu_layers is not None:
            off = next((m for m in map(OFFLOADED_RE.search, log_lines) if m), None)
            if off is None:
                checks.append(FeatureCheck("gpu_layers", str(features.gpu_layers), "unknown",
                                           "the engine logged no layers offloaded to a GPU"))
            else:
                done, total = int(off.group(1)), int(off.group(2))
                ok = done == min(features.gpu_layers, total)
                checks.append(FeatureCheck("gpu_layers", str(features.gpu_layers), "verified" if ok else "not active",
                                           f"engine offloaded {done}/{total} layers to the GPU"))
        return checks
        return checks

    def verify_kv_cache_dtype(self, dtype: str, log_lines: Sequence[str],
                              model_config: Mapping[str, Any] | None) -> FeatureCheck:
        """The KV cache llama.cpp allocated: the type it names for K and V, and its size, which for
        a block-quantized type is the bytes per value times the values (q8_0: 1.06, f16: 2)."""
        ints = self.logged_sizes(log_lines)
        want = KV_CACHE_TYPES.get(dtype, dtype)
        alloc = next((m for m in map(KV_ALLOC_RE.search, log_lines) if m), None)
        if alloc is None:
            return FeatureCheck("kv_cache_dtype", dtype, "unknown",
                                f"the engine logged no KV cache allocation (it does at log verbosity {LOG_VERBOSITY})")
        types = f"K ({alloc['k']}) {alloc['k_mib']} MiB, V ({alloc['v']}) {alloc['v_mib']} MiB"
        if alloc["k"] != want or alloc["v"] != want:
            return FeatureCheck("kv_cache_dtype", dtype, "not active", f"the engine allocated its KV cache as {types}")
        values = [ints.get("n_ctx"), ints.get("n_layer"), ints.get("n_embd_k_gqa")]
        expected = KV_BYTES_PER_ELEMENT.get(want)
        if None in values or not expected:
            return FeatureCheck("kv_cache_dtype", dtype, "accepted", f"the engine allocated its KV cache as {types}")
        n_ctx, n_layer, n_embd = (int(v or 0) for v in values)
        per_value = float(alloc["k_mib"]) * 2**20 / (n_ctx * n_layer * n_embd)
        seen = (f"the engine allocated its KV cache as {types}: {per_value:.2f} bytes per value over {n_ctx:,} tokens "
                f"({want} stores {expected:.2f}, f16 2.00)")
        if abs(per_value - expected) <= expected * KV_BYTES_TOLERANCE:
            return FeatureCheck("kv_cache_dtype", dtype, "verified", seen)
        return FeatureCheck("kv_cache_dtype", dtype, "accepted", seen + ", which fits no prediction")


def verify_weights_dtype(dtype: str, log_lines: Sequence[str]) -> FeatureCheck:
    """The file type llama.cpp reports for the GGUF it loaded (``print_info: file type = Q4_0``)
    and its tensors by type: verified when the file is the type asked for."""
    file_type = next((m.group(1) for m in map(FILE_TYPE_RE.search, log_lines) if m), None)
    tensors = ", ".join(f"{m.group(2)} {m.group(1)}" for m in map(TENSOR_TYPES_RE.search, log_lines) if m)
    if file_type is None:
        return FeatureCheck("weights_dtype", dtype, "unknown",
                            f"the engine logged no file type (it does at log verbosity {LOG_VERBOSITY})")
    seen = f"the engine loaded a {file_type} GGUF" + (f" (tensors: {tensors})" if tensors else "")
    return FeatureCheck("weights_dtype", dtype, "verified" if file_type.lower() == dtype else "not active", seen)


def _gguf_python(engine: EngineConfig) -> str | None:
    """An interpreter that has ``gguf``: the engine's own, or the llamacpp-cpu runtime's beside a
    llama-server executable."""
    if engine.runtime.kind in ("managed", "python"):
        return resolve_python(engine)
    fallback = MANAGED_RUNTIMES["llamacpp-cpu"]
    return str(fallback.interpreter) if fallback.is_installed() else None


def _runtime_issues(engine: EngineConfig) -> list[ValidationIssue]:
    runtime = engine.runtime
    if runtime.kind == "docker":
        return [ValidationIssue("engine.runtime", "llama.cpp runs from the llamacpp-cpu runtime, a venv with xllamacpp "
                                                  "(kind 'python') or a llama-server executable; not from docker yet")]
    if runtime.kind == "managed":
        try:
            managed = managed_runtime(runtime.managed)
        except RuntimeErrorMessage as exc:
            return [ValidationIssue("engine.runtime", str(exc))]
        if managed.engine != "llamacpp":
            return [ValidationIssue("engine.runtime", f"the managed runtime '{managed.name}' runs {managed.engine}, "
                                                      "not llama.cpp: use managed = 'llamacpp-cpu'")]
    return []


def _model_issues(engine: EngineConfig) -> list[ValidationIssue]:
    issues = [ValidationIssue("engine.tokenizer", "llama.cpp reads the tokenizer from the GGUF file")] if engine.tokenizer else []
    model = engine.model
    if model == DEMO_MODEL:
        if not gguf_demo_ready() and not (demo_model_dir() / COMPLETE_MARKER).is_file():
            issues.append(ValidationIssue("engine.model", "the demo model is not generated yet: run `tunebench demo-model`"))
    elif not model.lower().endswith(".gguf"):
        issues.append(ValidationIssue("engine.model", f"llama.cpp loads one GGUF file; '{model}' is not a .gguf path"))
    elif not Path(model).expanduser().is_file():
        issues.append(ValidationIssue("engine.model", f"model file not found: {model}"))
    return issues


ADAPTER = LlamaCppAdapter()
feature_flags = ADAPTER.feature_flags
flag_names = ADAPTER.flag_names
flag_values = ADAPTER.flag_values
parse_help = ADAPTER.parse_help
parse_kv_cache = ADAPTER.kv_cache
