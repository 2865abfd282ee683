"""What every adapter of a command-line server shares: features rendered as flags, the installed
version's flags read from its ``--help`` (cached per version), flags checked against them before
a launch, the log read for a known cause of failure, and counters compared around a probe.

An adapter keeps only what is its engine's: its flag rules, its help layout, its log patterns
and its advice. vLLM, llama.cpp, SGLang and TensorRT-LLM all go through here, so a rule such as
"a flag the installed version lacks is refused before launch, naming the version" is written
once.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine_adapters.base import Diagnosis, FlagSet, ValidationIssue
from engine_adapters.config import EngineConfig, Features
from engine_adapters.paths import cache_dir
from engine_adapters.prometheus import metric_total
from engine_adapters.runtimes import RuntimeErrorMessage


@dataclass(frozen=True)
class FlagRule:
    """How one feature becomes flags; ``render`` returns [] when the engine default applies."""

    key: str
    render: Callable[[Features], list[str]]


def rendered_flags(rules: Iterable[FlagRule], features: Features) -> dict[str, list[str]]:
    """Per feature key, the flags it contributes (empty when the engine default applies)."""
    return {rule.key: rule.render(features) for rule in rules}


def flag_terms(flags_by_feature: Mapping[str, list[str]]) -> dict[str, str]:
    """``engine_terms`` of a command-line engine: each feature's flags as written."""
    return {key: " ".join(tokens) for key, tokens in flags_by_feature.items() if tokens and key != "extra_args"}


def argv_of(flags_by_feature: Mapping[str, list[str]]) -> list[str]:
    return [token for tokens in flags_by_feature.values() for token in tokens]


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


# --- the log ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DiagnosisRule:
    code: str
    pattern: re.Pattern[str]
    advice: Callable[[re.Match[str]], str]


def diagnosis_rule(code: str, rx: str, advice: str | Callable[[re.Match[str]], str]) -> DiagnosisRule:
    render = advice if callable(advice) else (lambda _m, text=advice: text)
    return DiagnosisRule(code, re.compile(rx), render)


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


# --- verification by effect ---------------------------------------------------------------------------

def counter_change(metrics_text: str, before_text: str | None) -> Callable[[str], float | None]:
    """How much a counter moved across a probe (None: the engine does not expose it)."""
    def change(name: str) -> float | None:
        after = metric_total(metrics_text, name)
        if after is None:
            return None
        return after - (metric_total(before_text or "", name) or 0.0)

    return change


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
