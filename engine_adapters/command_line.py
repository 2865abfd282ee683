"""What every adapter of a command-line server shares: features rendered as flags, flags told
apart from values in argv, the installed version's flags read from its ``--help`` in one of the
help layouts engines print (cached per version), flags checked against them before a launch,
the ``docker run`` prefix, the log read for startup phases, sizes and a known cause of failure,
and the KV-cache arithmetic verification needs.

An engine's spec (``engine_adapters.spec``) names which of these pieces it uses; vLLM, llama.cpp,
SGLang and TensorRT-LLM all go through here, so a rule such as "a flag the installed version
lacks is refused before launch, naming the version" is written once.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from engine_adapters.base import Diagnosis, FlagSet, Phase, PhasePattern, ValidationIssue
from engine_adapters.config import EngineConfig, Features
from engine_adapters.paths import cache_dir
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model


@dataclass(frozen=True)
class FlagRule:
    """How one feature becomes flags; ``render`` returns [] when the engine default applies."""

    key: str
    render: Callable[[Features], list[str]]


def rendered_flags(rules: Iterable[FlagRule], features: Features) -> dict[str, list[str]]:
    """Per feature key, the flags it contributes (empty when the engine default applies);
    ``extra_args`` last, as given."""
    flags = {rule.key: rule.render(features) for rule in rules}
    flags["extra_args"] = list(features.extra_args)
    return flags


def value_flag(key: str, flag: str, *, unset: object = None, text: Callable[[Any], str] = str) -> FlagRule:
    """A feature given as ``FLAG VALUE``, left out while it has the value that means "not requested"."""
    def render(features: Features) -> list[str]:
        value = getattr(features, key)
        return [] if value == unset else [flag, text(value)]

    return FlagRule(key, render)


def switch_flag(key: str, on: Sequence[str], off: Sequence[str]) -> FlagRule:
    """A switch left to the engine while unset (None): ``on`` when True, ``off`` when False."""
    return FlagRule(key, lambda features: [] if (value := getattr(features, key)) is None else list(on if value else off))


def flag_terms(flags_by_feature: Mapping[str, list[str]]) -> dict[str, str]:
    """``engine_terms`` of a command-line engine: each feature's flags as written."""
    return {key: " ".join(tokens) for key, tokens in flags_by_feature.items() if tokens and key != "extra_args"}


def number_text(value: float) -> str:
    """A number as a flag value, without a trailing '.0' for integral floats (engines parse both)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


WEIGHTS_FLAGS: Mapping[str, tuple[str, ...]] = {
    "auto": (), "bf16": ("--dtype", "bfloat16"), "fp16": ("--dtype", "float16"),
    "fp8": ("--quantization", "fp8"), "awq": ("--quantization", "awq"), "gptq": ("--quantization", "gptq"),
}
"""Weight precision as the engines that take ``--dtype`` and ``--quantization`` (vLLM, SGLang) spell it."""
WEIGHTS_RULE = FlagRule("weights_dtype", lambda f: list(WEIGHTS_FLAGS.get(f.weights_dtype, ())))


# --- flags among argv tokens --------------------------------------------------------------------------

LONG_FLAG_RE = re.compile(r"^--")
"""A flag starts with ``--`` (``-1`` is a value): vLLM, SGLang, TensorRT-LLM."""
SHORT_OR_LONG_FLAG_RE = re.compile(r"^--?[A-Za-z][\w-]*")
"""A flag is ``-np`` or ``--ctx-size`` (``-1`` is a value): llama.cpp."""


def flag_names_of(tokens: Iterable[str], flag_token: re.Pattern[str]) -> list[str]:
    """The flags among argv tokens (``--x=1`` counts as ``--x``)."""
    return [t.split("=", 1)[0] for t in tokens if flag_token.match(t)]


def flag_values_of(tokens: Sequence[str], flag_token: re.Pattern[str]) -> list[tuple[str, str]]:
    """(flag, value) pairs among argv tokens: ``--x=1``, or a flag followed by a non-flag."""
    pairs = []
    for i, token in enumerate(tokens):
        if not flag_token.match(token):
            continue
        if token.startswith("--") and "=" in token:
            flag, value = token.split("=", 1)
            pairs.append((flag, value))
        elif i + 1 < len(tokens) and not flag_token.match(tokens[i + 1]):
            pairs.append((token, tokens[i + 1]))
    return pairs


# --- the installed version's flags ----------------------------------------------------------------

def cached_flag_set(engine_kind: str, version: str, identity: str, read_help: Callable[[], str],
                    parse: Callable[[str, str], FlagSet]) -> FlagSet:
    """The flags of one installed (engine, version, command): parsed from ``--help`` once, then
    read from the per-user cache. ``identity`` names what else changes the flags (the command,
    a runner script's hash)."""
    key = hashlib.sha256(identity.encode()).hexdigest()[:12]
    cache_file = cache_dir() / "flags" / f"{engine_kind}-{version}-{key}.json"
    if cache_file.is_file():
        try:
            return FlagSet.model_validate_json(cache_file.read_text())
        except ValueError:
            cache_file.unlink(missing_ok=True)
    flags = parse(read_help(), version)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(flags.model_dump_json())
    return flags


def run_help(base: Sequence[str], timeout_s: float, *, with_stderr: bool = False,
             env: Mapping[str, str] | None = None) -> str:
    """The text of ``<base> --help``; a failure is one clear line."""
    result = subprocess.run([*base, "--help"], capture_output=True, text=True, check=False, timeout=timeout_s,
                            env=dict(env) if env is not None else None)
    if result.returncode != 0:
        raise RuntimeErrorMessage(f"`{' '.join(base)} --help` failed: {result.stderr.strip().splitlines()[-1:]}")
    return result.stdout + ("\n" + result.stderr if with_stderr else "")


class HelpLayout(StrEnum):
    """How an engine's ``--help`` lays out its options (which parser reads it)."""

    USAGE_BLOCK = "usage block"
    """argparse whose usage block names every flag, choices as ``[--x {a,b}]`` (vLLM)."""
    ARGPARSE_ENTRIES = "argparse entries"
    """argparse option entries two spaces in (``--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE``),
    choices from the usage block (SGLang)."""
    CLICK_ENTRIES = "click entries"
    """click option entries two spaces in, choices as ``[a|b]`` after the spellings (TensorRT-LLM)."""
    LLAMA = "llama"
    """llama.cpp's own: a line per option starting with its spellings, ``[on|off]`` or an
    ``allowed values:`` line for the choices."""


_USAGE_FLAG_RE = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
_USAGE_CHOICES_RE = re.compile(r"\[(--[a-z0-9][a-z0-9-]*) \{([^}]*)\}")
_OPTION_LINE_RE = re.compile(r"^ {2}(-\S.*)$")
_OPTION_NAME_RE = re.compile(r"(?:^|, )(--?[A-Za-z][\w-]*)")
_BAR_CHOICES_RE = re.compile(r"\[([\w.-]+(?:\|[\w.-]+)+)\]")
_LLAMA_FLAGS_RE = re.compile(r"(--?[A-Za-z][\w-]*)(?:,\s*|\s+|$)")
_LLAMA_ALLOWED_RE = re.compile(r"allowed values: (.+)")


def _usage_choices(text: str) -> dict[str, list[str]]:
    return {flag: [c.strip() for c in body.split(",")] for flag, body in _USAGE_CHOICES_RE.findall(text)}


def _option_entries(text: str) -> Iterable[tuple[list[str], str]]:
    """Each option entry's spellings and the rest of its invocation (argparse and click help):
    flags only named inside a description are not counted."""
    for line in text.splitlines():
        match = _OPTION_LINE_RE.match(line)
        if match:
            invocation = re.split(r"\s{2,}", match.group(1), maxsplit=1)[0]
            yield _OPTION_NAME_RE.findall(invocation), invocation


def _llama_help(text: str) -> tuple[set[str], dict[str, list[str]]]:
    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):
            current, rest = [], stripped
            while m := _LLAMA_FLAGS_RE.match(rest):  # "-h,    --help, --usage" then the metavar
                current.append(m.group(1))
                rest = rest[m.end():]
            flags.update(current)
            if m := _BAR_CHOICES_RE.match(rest):
                for flag in current:
                    choices[flag] = m.group(1).split("|")
        if current and (m := _LLAMA_ALLOWED_RE.search(stripped)):
            for flag in current:
                choices[flag] = [c.strip() for c in m.group(1).split(",") if c.strip()]
    return flags, choices


def parse_help_text(layout: HelpLayout, engine_kind: str, text: str, version: str) -> FlagSet:
    """The flags and their choices an installed engine's ``--help`` lists, read by its layout."""
    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    if layout is HelpLayout.USAGE_BLOCK:
        flags, choices = set(_USAGE_FLAG_RE.findall(text)), _usage_choices(text)
    elif layout is HelpLayout.ARGPARSE_ENTRIES:
        for names, _ in _option_entries(text):
            flags.update(names)
        choices = _usage_choices(text)
    elif layout is HelpLayout.CLICK_ENTRIES:
        for names, invocation in _option_entries(text):
            flags.update(names)
            if m := _BAR_CHOICES_RE.search(invocation):
                choices.update({name: m.group(1).split("|") for name in names})
    else:
        flags, choices = _llama_help(text)
    return FlagSet(engine=engine_kind, version=version, flags=sorted(flags), choices=choices)


def package_version(python: str, distribution: str, timeout_s: float) -> str | None:
    """The installed version of ``distribution`` in that interpreter, None when it has none."""
    cmd = [python, "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout_s)
    lines = result.stdout.strip().splitlines() if result.returncode == 0 else []
    return lines[-1].strip() if lines else None


def version_issues(flags_by_feature: Mapping[str, list[str]], flags: FlagSet, engine_name: str,
                   names: Callable[[Iterable[str]], list[str]],
                   values: Callable[[Sequence[str]], list[tuple[str, str]]], *,
                   comma_lists: bool = False) -> list[ValidationIssue]:
    """Flags or values the installed version lacks, named with the version, before any launch.
    ``comma_lists``: a value may be a comma-separated list, each item checked (llama.cpp)."""
    issues = []
    for key, tokens in flags_by_feature.items():
        for flag in names(tokens):
            if not flags.has(flag):
                issues.append(ValidationIssue(key, f"{flag} is not supported by the installed {engine_name} "
                                                   f"{flags.version}"))
        for flag, value in values(tokens):
            choices = flags.choices.get(flag)
            if not choices:
                continue
            bad = [v for v in value.split(",") if v not in choices] if comma_lists else (
                [value] if value not in choices else [])
            if bad:
                issues.append(ValidationIssue(key, f"{flag} {value} is not accepted by {engine_name} {flags.version} "
                                                   f"(choices: {', '.join(choices)})"))
    return issues


def extra_args_issues(features: Features, flags_of: Callable[[Features], Mapping[str, list[str]]],
                      names: Callable[[Iterable[str]], list[str]], reserved: frozenset[str],
                      canonical: Callable[[str], str] = lambda flag: flag) -> list[ValidationIssue]:
    """``extra_args`` may add flags, never override what the configuration sets: the flags
    tunebench sets itself (``reserved``) and those a feature toggle renders."""
    issues = []
    extra = names(features.extra_args)
    for flag in extra:
        if canonical(flag) in reserved:
            issues.append(ValidationIssue("extra_args", f"{flag} is set by tunebench from the configuration; set it there"))
    controlled = {canonical(flag) for tokens in flags_of(features.model_copy(update={"extra_args": []})).values()
                  for flag in names(tokens)}
    for flag in extra:
        if canonical(flag) in controlled:
            issues.append(ValidationIssue("extra_args", f"{flag} is already set by a feature toggle"))
    return issues


def model_path_issues(engine: EngineConfig) -> list[ValidationIssue]:
    """A model given as a local path that does not exist (a hub id is checked by the engine)."""
    model = engine.model
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        return [ValidationIssue("engine.model", f"model path not found: {model}")]
    return []


# --- docker ------------------------------------------------------------------------------------------

VLLM_IMAGE_PREFIX = "vllm/vllm-openai"
"""The runtime's default image is vLLM's: a profile that leaves it gets the engine's own image."""


def docker_image(engine: EngineConfig, default: str) -> str:
    """The configured image, or ``default`` when the configuration kept vLLM's default image."""
    image = engine.runtime.docker_image
    return default if image.startswith(VLLM_IMAGE_PREFIX) else image


def docker_run_prefix(engine: EngineConfig, port: int, *, gpus: bool, api_key_env: str | None) -> list[str]:
    """``docker run`` up to the image: the port published on the configured host, the API key's
    and the runtime's variables passed by name (their values stay out of argv), a local model
    mounted read-only where the container sees it at the same path."""
    argv = ["docker", "run", "--rm", "--init", "--ipc=host", *(["--gpus", "all"] if gpus else []),
            "-p", f"{engine.host}:{port}:{port}", *(["-e", api_key_env] if api_key_env else [])]
    for name in sorted(engine.runtime.env):
        argv += ["-e", name]
    try:
        model = Path(resolve_model(engine.model)).expanduser()
    except RuntimeErrorMessage:
        model = Path(engine.model)
    if model.is_absolute() and model.exists():
        argv += ["-v", f"{model}:{model}:ro"]
    return argv


# --- the log ------------------------------------------------------------------------------------------

def phase_patterns(*markers: tuple[Phase, tuple[str, ...]]) -> tuple[PhasePattern, ...]:
    """Each phase with the log lines that mark it (regular expressions, any of which names it)."""
    return tuple(PhasePattern(phase, re.compile("|".join(rxs))) for phase, rxs in markers)


@dataclass(frozen=True)
class DiagnosisRule:
    code: str
    pattern: re.Pattern[str]
    advice: Callable[[re.Match[str]], str]


def diagnosis_rule(code: str, rx: str, advice: str | Callable[[re.Match[str]], str]) -> DiagnosisRule:
    render = advice if callable(advice) else (lambda _m, text=advice: text)
    return DiagnosisRule(code, re.compile(rx), render)


PORT_IN_USE_ADVICE = "The port is already in use by another process: choose another port, or 0 for a free one."
DOCKER_RULES: tuple[DiagnosisRule, ...] = (
    diagnosis_rule("docker_daemon", r"Cannot connect to the Docker daemon",
                   "Docker is installed but its daemon is not running (or not reachable): start it, or use another "
                   "runtime."),
    diagnosis_rule("docker_gpu", r"could not select device driver .* with capabilities: \[\[gpu\]\]",
                   "Docker cannot give the container a GPU: install the NVIDIA Container Toolkit, or use another "
                   "runtime."),
)
"""Why ``docker run`` failed before the engine started (every engine with a docker runtime)."""
PORT_IN_USE_RULE = diagnosis_rule("port_in_use", r"Address already in use|\[Errno 98\]", PORT_IN_USE_ADVICE)
"""A Python server's bind error (vLLM, SGLang)."""
ARGPARSE_BAD_ARGUMENT = diagnosis_rule("bad_argument", r"error: argument (--\S+): (.*)",
                                       lambda m: f"The engine rejected {m.group(1)}: {m.group(2).strip()}")
"""argparse's refusal of one argument's value (vLLM, SGLang)."""
PYTHON_SERVER_RULES: tuple[DiagnosisRule, ...] = (
    PORT_IN_USE_RULE,
    diagnosis_rule("model_missing", r"does not appear to have a file named config\.json|is not a local folder and is "
                                    r"not a valid model identifier|Repo id must be|HFValidationError|Invalid repository ID"
                                    r"|No such file or directory: .*config\.json|We couldn't connect to .* to load",
                   "The model was not found: it is neither a local directory with a config.json nor reachable on a "
                   "model hub. Check the path (or download it first)."),
    diagnosis_rule("unknown_flag", r"error: unrecognized arguments: (.*)",
                   lambda m: f"The engine does not know these arguments: {m.group(1).strip()} (check the installed "
                             "version: `tunebench engine flags`)."),
    ARGPARSE_BAD_ARGUMENT,
    *DOCKER_RULES,
)
"""Why a Python server that takes argparse flags and loads its model through Hugging Face's
libraries (vLLM, SGLang) did not start, in the order they are looked for."""


def diagnose_log(rules: Iterable[DiagnosisRule], log_lines: Iterable[str], generic_error: re.Pattern[str], *,
                 not_an_error: re.Pattern[str] | None = None) -> Diagnosis | None:
    """The first known cause in the log, else the last ``XError: text`` line (``generic_error``'s
    first group is the error's type, its last group the message)."""
    lines = list(log_lines)
    for rule in rules:
        for line in lines:
            match = rule.pattern.search(line)
            if match:
                return Diagnosis(rule.code, rule.advice(match), line.strip())
    for line in reversed(lines):
        if not_an_error is not None and not_an_error.search(line):
            continue
        match = generic_error.search(line)
        if match:
            message = match.group(match.re.groups).strip()
            return Diagnosis("error", f"The engine failed: {match.group(1)}: {message}", line.strip())
    return None


def logged_ints(log_lines: Iterable[str], patterns: Mapping[str, re.Pattern[str]]) -> dict[str, int]:
    """The first integer each pattern's group 1 finds in the log (sizes an engine logs at start)."""
    out: dict[str, int] = {}
    for line in log_lines:
        for key, rx in patterns.items():
            if key not in out and (m := rx.search(line)):
                out[key] = int(m.group(1))
    return out


def kv_capacity(total_tokens: float | None, per_request_tokens: float | None) -> dict[str, float]:
    """The engine's KV capacity as every adapter reports it: tokens in all, and how many requests
    of the per-request length fit (``kv_cache`` of the adapter protocol)."""
    out: dict[str, float] = {}
    if total_tokens:
        out["kv_cache_tokens"] = float(total_tokens)
        if per_request_tokens:
            out["max_concurrency"] = total_tokens / per_request_tokens
            out["max_concurrency_at_tokens"] = float(per_request_tokens)
    return out


# --- verification by effect (the checks themselves: engine_adapters.spec) ------------------------

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


def probe_prompt_len(features: Features, wanted_tokens: int) -> int:
    """A probe prompt's length: shorter when the configured model length would refuse it."""
    if features.max_model_len is not None and features.max_model_len < wanted_tokens + 2:
        return max(2, features.max_model_len - 2)
    return wanted_tokens


def env_with_api_key(engine: EngineConfig, api_key_env: str, api_key: str | None) -> dict[str, str]:
    """The runtime's environment plus the API key under the engine's variable (never in argv)."""
    from engine_adapters.runtimes import runtime_env

    env = runtime_env(engine)
    if api_key:
        env[api_key_env] = api_key
    return env
