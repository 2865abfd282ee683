"""llama.cpp's own HTTP server from the ``xllamacpp`` wheel, started like ``llama-server``.

The wheel runs llama.cpp's C++ server (the same code as ``llama-server``: slots, continuous
batching, prompt cache, ``/metrics``, ``/slots``) inside a Python process, configured through
its ``CommonParams`` object instead of a command line. This script gives it llama-server's
command line, so tunebench launches the managed runtime and a user's ``llama-server`` with one
argv, and an exported script runs with either:

    python llamacpp_serve.py -m model.gguf --host 127.0.0.1 --port 8080 -np 4 -ctk q8_0 --metrics

- Only the flags tunebench maps are offered, spelled as current llama-server spells them, and
  each only when the installed wheel's parameter model has the field behind it: ``--help``
  lists them (tunebench discovers flags from it, cached per version, as from llama-server's).
- Defaults follow llama-server, not the bare ``CommonParams``: without ``-np``, 4 slots with a
  unified KV cache (``n_parallel = -1``, "auto", in llama-server).
- The API key comes from ``LLAMA_API_KEY`` (comma-separated, as llama-server reads it), so it
  never appears in the process's argv. ``/health`` stays public, as in llama-server.
- A CPU engine launched by tunebench gets its cores in ``VLLM_CPU_OMP_THREADS_BIND`` (the one
  variable ``engine_adapters.cpu_binding`` sets for every CPU engine, named after vLLM's, which
  came first): the process is bound to them and runs one compute thread per core, so the load
  client keeps the core left to it.
- SIGINT or SIGTERM stops the server and exits 0 (llama.cpp installs its own handlers while it
  starts; they are replaced once it is up, so the main thread, which only waits, hears them),
  within ``STOP_DRAIN_S`` even when its slots are still busy (then with exit status 1).

Imports nothing from tunebench: it runs in the engine's venv, which has only ``xllamacpp``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

PROG = "tunebench-llama-server"
API_KEY_ENV = "LLAMA_API_KEY"
CPU_LIST_ENV = "VLLM_CPU_OMP_THREADS_BIND"
STOP_DRAIN_S = 3.0
"""After SIGINT or SIGTERM, the server gets this long to finish its slots' work; then the process exits."""
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""llama.cpp's KV cache types (``kv_cache_types`` in common/arg.cpp), offered when ggml has them."""
FLASH_ATTN = {"on": "LLAMA_FLASH_ATTN_TYPE_ENABLED", "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
              "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO"}
AUTO_SLOTS = 4
"""llama-server's slots when ``-np`` is not given (with a unified KV cache)."""


class UsageError(Exception):
    """A bad command line: one line, exit 1 (as llama-server)."""


Apply = Callable[[Any, Any, str], None]  # (xllamacpp module, CommonParams, value)


@dataclass(frozen=True)
class Option:
    """One llama-server flag: its spellings, what it sets, and whether this wheel has that."""

    names: tuple[str, ...]
    metavar: str  # "" for a switch
    help: str
    apply: Apply
    available: Callable[[Any, Any], bool] = lambda xlc, params: True
    choices: Callable[[Any], list[str]] | None = None


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"expected an integer, got '{value}'") from None


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"expected a number, got '{value}'") from None


def _has(*path: str) -> Callable[[Any, Any], bool]:
    """Available when the parameter model has this attribute path (``speculative.draft.n_max``)."""
    def check(xlc: Any, params: Any) -> bool:
        node = params
        for part in path:
            if not hasattr(node, part):
                return False
            node = getattr(node, part)
        return True
    return check


def _set(*path: str, convert: Callable[[str], Any] = str) -> Apply:
    def apply(xlc: Any, params: Any, value: str) -> None:
        node = params
        for part in path[:-1]:
            node = getattr(node, part)
        setattr(node, path[-1], convert(value))
    return apply


def _switch(*path: str, value: Any = True) -> Apply:
    def apply(xlc: Any, params: Any, _: str) -> None:
        node = params
        for part in path[:-1]:
            node = getattr(node, part)
        setattr(node, path[-1], value)
    return apply


def kv_cache_types(xlc: Any) -> list[str]:
    return [t for t in KV_CACHE_TYPES if hasattr(xlc.ggml_type, f"GGML_TYPE_{t.upper()}")]


def spec_types(xlc: Any) -> list[str]:
    """llama-server's names of the speculative types this build has (``ngram-simple``, ...)."""
    prefix = "COMMON_SPECULATIVE_TYPE_"
    names = [n for n in dir(xlc.common_speculative_type) if n.startswith(prefix) and not n.endswith("_COUNT")]
    order = {n: int(getattr(xlc.common_speculative_type, n)) for n in names}
    return [n.removeprefix(prefix).lower().replace("_", "-") for n in sorted(names, key=order.__getitem__)]


def _kv_type(which: str) -> Apply:
    def apply(xlc: Any, params: Any, value: str) -> None:
        if value not in kv_cache_types(xlc):
            raise UsageError(f"unsupported cache type '{value}' (allowed: {', '.join(kv_cache_types(xlc))})")
        setattr(params, which, getattr(xlc.ggml_type, f"GGML_TYPE_{value.upper()}"))
    return apply


def _flash_attn(xlc: Any, params: Any, value: str) -> None:
    if value not in FLASH_ATTN:
        raise UsageError(f"expected on, off or auto, got '{value}'")
    params.flash_attn_type = getattr(xlc.llama_flash_attn_type, FLASH_ATTN[value])


def _spec_type(xlc: Any, params: Any, value: str) -> None:
    known = spec_types(xlc)
    types = []
    for name in (v.strip() for v in value.split(",")):
        if name not in known:
            raise UsageError(f"unknown speculative type '{name}' (allowed: {', '.join(known)})")
        types.append(getattr(xlc.common_speculative_type, "COMMON_SPECULATIVE_TYPE_" + name.upper().replace("-", "_")))
    params.speculative.types = types


def _parallel(xlc: Any, params: Any, value: str) -> None:
    slots = _int(value)
    if slots < 1:
        raise UsageError(f"needs at least one slot, got {slots}")
    params.n_parallel = slots


def _api_key(xlc: Any, params: Any, value: str) -> None:
    params.api_keys = [k for k in value.split(",") if k]


OPTIONS: tuple[Option, ...] = (
    Option(("-m", "--model"), "FNAME", "model path (a GGUF file)", _set("model", "path")),
    Option(("-a", "--alias"), "STRING", "model name the API reports", _set("model_alias", convert=lambda v: [v]),
           _has("model_alias")),
    Option(("--host",), "HOST", "ip address to listen on (default: 127.0.0.1)",
           _set("hostnames", convert=lambda v: [v]), _has("hostnames")),
    Option(("--port",), "PORT", "port to listen on (default: 8080)", _set("port", convert=_int)),
    Option(("--api-key",), "KEY", f"API key(s), comma-separated (also read from {API_KEY_ENV})", _api_key,
           _has("api_keys")),
    Option(("-c", "--ctx-size"), "N", "size of the prompt context (default: 0, loaded from the model)",
           _set("n_ctx", convert=_int)),
    Option(("-np", "--parallel"), "N", f"number of server slots (default: -1, auto: {AUTO_SLOTS} with a unified "
           "KV cache)", _parallel),
    Option(("-kvu", "--kv-unified"), "", "use a single unified KV buffer shared by all sequences",
           _switch("kv_unified"), _has("kv_unified")),
    Option(("-b", "--batch-size"), "N", "logical maximum batch size (default: 2048)", _set("n_batch", convert=_int)),
    Option(("-ub", "--ubatch-size"), "N", "physical maximum batch size (default: 512)",
           _set("n_ubatch", convert=_int)),
    Option(("--threads-http",), "N", "number of threads used to process HTTP requests (default: -1, slots + 4)",
           _set("n_threads_http", convert=_int), _has("n_threads_http")),
    Option(("-t", "--threads"), "N", "number of CPU threads to use during generation",
           _set("cpuparams", "n_threads", convert=_int)),
    Option(("-tb", "--threads-batch"), "N", "number of threads to use during batch and prompt processing",
           _set("cpuparams_batch", "n_threads", convert=_int)),
    Option(("-ngl", "--gpu-layers", "--n-gpu-layers"), "N", "max. number of layers to store in VRAM",
           _set("n_gpu_layers", convert=_int), _has("n_gpu_layers")),
    Option(("-ctk", "--cache-type-k"), "TYPE", "KV cache data type for K", _kv_type("cache_type_k"),
           _has("cache_type_k"), kv_cache_types),
    Option(("-ctv", "--cache-type-v"), "TYPE", "KV cache data type for V", _kv_type("cache_type_v"),
           _has("cache_type_v"), kv_cache_types),
    Option(("-fa", "--flash-attn"), "[on|off|auto]", "set Flash Attention use", _flash_attn,
           _has("flash_attn_type"), lambda xlc: list(FLASH_ATTN)),
    Option(("--cache-prompt",), "", "enable prompt caching (default: enabled)", _switch("cache_prompt"),
           _has("cache_prompt")),
    Option(("--no-cache-prompt",), "", "disable prompt caching", _switch("cache_prompt", value=False),
           _has("cache_prompt")),
    Option(("--cache-reuse",), "N", "min chunk size to attempt reusing from the cache via KV shifting (default: 0)",
           _set("n_cache_reuse", convert=_int), _has("n_cache_reuse")),
    Option(("-cram", "--cache-ram"), "N", "maximum host-memory prompt cache size in MiB (0: disabled)",
           _set("cache_ram_mib", convert=_int), _has("cache_ram_mib")),
    Option(("--spec-type",), "TYPES", "comma-separated list of types of speculative decoding to use",
           _spec_type, _has("speculative", "types"), spec_types),
    Option(("-md", "--model-draft"), "FNAME", "draft model for speculative decoding",
           _set("speculative", "draft", "mparams", "path"), _has("speculative", "draft", "mparams")),
    Option(("--spec-draft-n-max",), "N", "number of tokens to draft for speculative decoding",
           _set("speculative", "draft", "n_max", convert=_int), _has("speculative", "draft", "n_max")),
    Option(("--spec-draft-n-min",), "N", "minimum number of draft tokens to use for speculative decoding",
           _set("speculative", "draft", "n_min", convert=_int), _has("speculative", "draft", "n_min")),
    Option(("--spec-draft-p-min",), "P", "minimum speculative decoding probability (greedy)",
           _set("speculative", "draft", "p_min", convert=_float), _has("speculative", "draft", "p_min")),
    Option(("--spec-ngram-simple-size-n",), "N", "ngram-simple: n-gram size to look up in the context",
           _set("speculative", "ngram_simple", "size_n", convert=_int), _has("speculative", "ngram_simple", "size_n")),
    Option(("--spec-ngram-simple-size-m",), "N", "ngram-simple: number of tokens drafted after a match",
           _set("speculative", "ngram_simple", "size_m", convert=_int), _has("speculative", "ngram_simple", "size_m")),
    Option(("--spec-ngram-simple-min-hits",), "N", "ngram-simple: matches needed before drafting",
           _set("speculative", "ngram_simple", "min_hits", convert=_int),
           _has("speculative", "ngram_simple", "min_hits")),
    Option(("--metrics",), "", "enable the Prometheus-compatible /metrics endpoint", _switch("endpoint_metrics"),
           _has("endpoint_metrics")),
    Option(("--slots",), "", "expose the /slots endpoint (default: enabled)", _switch("endpoint_slots"),
           _has("endpoint_slots")),
    Option(("--no-slots",), "", "hide the /slots endpoint", _switch("endpoint_slots", value=False),
           _has("endpoint_slots")),
    Option(("-lv", "--verbosity", "--log-verbosity"), "N", "log verbosity threshold (4: also the context and "
           "KV cache it allocated)", _set("verbosity", convert=_int), _has("verbosity")),
    Option(("--no-warmup",), "", "skip warming up the model with an empty run", _switch("warmup", value=False),
           _has("warmup")),
)


def available_options(xlc: Any, params: Any) -> list[Option]:
    return [o for o in OPTIONS if o.available(xlc, params)]


def help_text(xlc: Any, options: Sequence[Option]) -> str:
    """llama-server's ``--help`` layout: flags and metavar, then the description; allowed values
    on the next line."""
    lines = [f"usage: {PROG} [options]  (llama.cpp from xllamacpp {xlc.__version__})", ""]
    for option in options:
        head = ", ".join(option.names) + (f" {option.metavar}" if option.metavar else "")
        lines.append(f"{head:<40}{option.help}")
        if option.choices is not None:
            lines.append(" " * 40 + "allowed values: " + ", ".join(option.choices(xlc)))
    lines += [f"{'-h, --help':<40}print this help and exit", f"{'--version':<40}print the version and exit"]
    return "\n".join(lines)


def parse(argv: Sequence[str], options: Sequence[Option], xlc: Any, params: Any) -> set[str]:
    """Apply ``argv`` to ``params``; returns the canonical (first) names of the flags given."""
    by_name = {name: option for option in options for name in option.names}
    given: set[str] = set()
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        option = by_name.get(flag)
        if option is None:
            raise UsageError(f"invalid argument: {token}")
        if option.metavar:
            if inline:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise UsageError(f"expected value for argument: {flag}")
        else:
            value = ""
        try:
            option.apply(xlc, params, value)
        except UsageError as exc:
            raise UsageError(f'error while handling argument "{flag}": {exc}') from None  # llama-server's words
        given.add(option.names[0])
        i += 1
    if "-m" not in given:
        raise UsageError("a model is required (-m FNAME)")
    return given


def bind_cpus(params: Any, given: set[str], environ: dict[str, str]) -> list[int]:
    """Bind this process to the cores in ``CPU_LIST_ENV`` and run one thread per core (unless
    ``-t`` says otherwise); returns the cores, or [] when unset or unreadable."""
    cores: set[int] = set()
    try:
        for part in environ.get(CPU_LIST_ENV, "").replace("|", ",").split(","):
            if part.strip():
                lo, _, hi = part.strip().partition("-")
                cores.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return []
    usable = sorted(cores & set(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else []
    if not usable:
        return []
    os.sched_setaffinity(0, usable)
    if "-t" not in given:
        params.cpuparams.n_threads = len(usable)
    if "-tb" not in given:
        params.cpuparams_batch.n_threads = len(usable)
    return usable


def main(argv: Sequence[str]) -> int:
    if "--version" in argv:
        import xllamacpp

        print(f"version: xllamacpp {xllamacpp.__version__}", flush=True)
        return 0
    import xllamacpp as xlc

    params = xlc.CommonParams()
    options = available_options(xlc, params)
    if "-h" in argv or "--help" in argv:
        print(help_text(xlc, options), flush=True)
        return 0
    try:
        given = parse(argv, options, xlc, params)
    except UsageError as exc:
        message = str(exc)
        print(message if message.startswith("error") else f"error: {message}", file=sys.stderr, flush=True)
        return 1
    if "-np" not in given:  # llama-server's auto
        params.n_parallel = AUTO_SLOTS
        if hasattr(params, "kv_unified"):
            params.kv_unified = True
    keys = [k for k in os.environ.get(API_KEY_ENV, "").split(",") if k]
    if keys:
        params.api_keys = keys
    cores = bind_cpus(params, given, dict(os.environ))
    if cores:
        print(f"{PROG}: bound to core(s) {','.join(map(str, cores))}, {params.cpuparams.n_threads} thread(s)",
              flush=True)
    try:
        server = xlc.Server(params)
    except RuntimeError as exc:
        print(f"{PROG}: error: the server did not start: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"{PROG}: serving on {server.listening_address}", flush=True)
    while not stop.wait(1.0):
        pass
    # The server's destructor waits for its slots' work while holding the GIL, for as long as a
    # long generation takes: past the stop the watchdog or tunebench waits for. faulthandler's
    # timer is a C thread that needs no GIL: it ends the process (exit status 1) if it comes to that.
    faulthandler.dump_traceback_later(STOP_DRAIN_S, exit=True, file=open(os.devnull, "w"))  # noqa: SIM115
    try:
        print(f"{PROG}: stopping", flush=True)
    except OSError:  # the process that read the log is gone (killed): stop all the same
        pass
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
