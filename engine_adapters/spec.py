"""An engine described by a declarative spec, and the one adapter base that speaks the adapter
protocol from it.

An engine file fills an :class:`EngineSpec` (its flag spellings and feature rules, its help
layout, its log patterns and advice, its metric names, the shape of its probe) and subclasses
:class:`CommandLineAdapter` for what is truly its own: how it starts, how it reads its version,
which rules it checks before a launch, what it reports back after. What the engines do alike,
argv assembly, flag discovery, the common validation rules, diagnosis, the probe and
verification by effect over canonical counters, is written here once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine_adapters.base import (
    Diagnosis,
    FeatureCheck,
    FeatureStatus,
    FlagSet,
    MetricNames,
    PhasePattern,
    ValidationIssue,
    http_ok,
)
from engine_adapters.command_line import (
    LONG_FLAG_RE,
    DiagnosisRule,
    FlagRule,
    HelpLayout,
    cached_flag_set,
    diagnose_log,
    env_with_api_key,
    extra_args_issues,
    flag_names_of,
    flag_terms,
    flag_values_of,
    kv_capacity,
    logged_ints,
    model_path_issues,
    parse_help_text,
    probe_prompt_len,
    rendered_flags,
    run_help,
    version_issues,
)
from engine_adapters.config import GGUF_WEIGHT_BITS, EngineConfig, Features
from engine_adapters.features import not_offered
from engine_adapters.hardware import HardwareInfo
from engine_adapters.prometheus import metric_total

PROBE_TOKEN_BASE = 11
"""Probe prompts use token ids from here to about 110: ordinary tokens in any vocabulary."""
SPEC_PROBE_PERIOD = 8
"""The speculation probe repeats every 8 tokens: an n-gram drafter always finds a match."""


@dataclass(frozen=True)
class ProbeSpec:
    """The shape of the tiny requests sent after ready whose effect on the metrics verifies
    prefix caching (two identical prompts) and speculation (a repetitive prompt)."""

    prefix_tokens: int = 128
    spec_output_tokens: int = 64
    spec_token_offset: int = 50
    """Where the speculation prompt's token ids start past ``PROBE_TOKEN_BASE``: 50 shares no
    cached prefix with the prefix-caching prompt."""
    cache_salt: bool = False
    """Each prompt gets a cache salt of its own, so the probe leaves nothing a measured level could hit."""
    fence_request: bool = False
    """A last one-token request: an engine that counts a request only after answering it has
    surely counted the one before."""
    fit_model_len: bool = True
    """Shorten the prefix-caching prompt to fit the configured max model length."""


@dataclass(frozen=True)
class SettingEcho:
    """A setting the engine reports back after start (in its log or its parsed arguments):
    the feature, the engine's name for it, and the value that means "not requested"."""

    key: str
    name: str
    unset: object = None


@dataclass(frozen=True)
class EngineSpec:
    """What one command-line engine is, declared: enough for :class:`CommandLineAdapter` to
    launch, check, diagnose and verify it without code of the engine's own."""

    kind: str
    display_name: str
    api_key_env: str
    metric_names: MetricNames
    phase_patterns: tuple[PhasePattern, ...]
    diagnosis_rules: tuple[DiagnosisRule, ...]
    generic_error: re.Pattern[str]
    """A line ``XError: text`` (group 1 the type, the last group the message), the last resort of diagnosis."""
    flag_rules: tuple[FlagRule, ...]
    help_layout: HelpLayout
    reserved_flags: frozenset[str]
    """Set by tunebench from the configuration; extra_args must not override them behind its back."""
    model_flag: str | None
    """The flag before the model (None: the model is positional)."""
    served_name_flag: str | None = None
    tokenizer_flag: str | None = None
    fixed_args: tuple[str, ...] = ()
    """Arguments every launch passes after host and port (metrics on, log verbosity)."""
    not_an_error: re.Pattern[str] | None = None
    """Lines the generic error never matches (INFO lines that mention an exception)."""
    flag_token: re.Pattern[str] = LONG_FLAG_RE
    aliases: tuple[tuple[str, ...], ...] = ()
    """Spellings of one option (the first is the one tunebench writes)."""
    comma_lists: bool = False
    """A flag value may be a comma-separated list, each item checked against the choices."""
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    client_keep_alive: bool = True
    prompt_logprobs: bool = True
    """``/v1/completions`` with ``echo`` returns the logprobs of the prompt's tokens, as scoring
    given text (lm-eval's multiple-choice tasks) needs."""
    engine_defaults: Mapping[str, object] = field(default_factory=dict)
    """What the engine does with a switch left unset, so the GUI can say "on (engine default)"."""
    help_timeout_s: float = 120.0
    help_with_stderr: bool = False
    probe: ProbeSpec = ProbeSpec()
    prefix_cache_noun: str = "prefix cache"
    hits_counter_lazy: bool = False
    """The cache-hit counter appears only once something was cached: its absence after a probe
    with caching off is the effect wanted."""
    logged_sizes: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    """Sizes the engine logs as it starts (group 1 of each pattern), read by name."""
    logged_sizes_marker: str = ""
    """Read the sizes only from lines that contain this (one log line that states them all)."""
    kv_capacity_sizes: tuple[str, str] | None = None
    """Which logged sizes are the KV cache's tokens in all and one request's tokens."""
    setting_echoes: tuple[SettingEcho, ...] = ()
    echo_evidence: str = "engine logged {name}={value}"
    echo_absent_status: FeatureStatus = "unknown"
    gpu_verified: bool = True
    maturity: str | None = None
    """How far the adapter is proven, while it has not run on a GPU (a warning at validation)."""

    @property
    def canonical_flags(self) -> Mapping[str, str]:
        return {name: group[0] for group in self.aliases for name in group}


@dataclass(frozen=True)
class ProbeReading:
    """The engine's metrics read around the probe, asked for by canonical counter name."""

    counters: Mapping[str, tuple[str, ...]]
    metrics_text: str
    before_text: str | None
    probe_error: str | None

    @property
    def probed(self) -> bool:
        """Whether a probe ran, completed and its metrics were read."""
        return self.before_text is not None and self.probe_error is None and bool(self.metrics_text)

    @property
    def unmeasured(self) -> str:
        """Why no effect could be measured, to append to the evidence."""
        return f"; the probe failed: {self.probe_error}" if self.probe_error else ""

    def total(self, canonical: str) -> float | None:
        """The counter now (the engine's first name for it that it exposes); None when absent."""
        for name in self.counters.get(canonical, ()):
            if (value := metric_total(self.metrics_text, name)) is not None:
                return value
        return None

    def change(self, canonical: str) -> float | None:
        """How much the counter moved across the probe (None: the engine does not expose it)."""
        for name in self.counters.get(canonical, ()):
            if (after := metric_total(self.metrics_text, name)) is not None:
                return after - (metric_total(self.before_text or "", name) or 0.0)
        return None


MetricTable = Mapping[str, "str | tuple[str, ...]"]


def metric_names(prefix: str, *, gauges: MetricTable, counters: MetricTable,
                 histograms: MetricTable | None = None) -> MetricNames:
    """An engine's metric table with each Prometheus name written without the engine's prefix
    (``vllm:``, ``trtllm_``); a name with aliases is a tuple, newest first."""
    def table(names: MetricTable | None) -> dict[str, tuple[str, ...]]:
        return {key: tuple(prefix + name for name in ((value,) if isinstance(value, str) else value))
                for key, value in (names or {}).items()}

    return MetricNames(gauges=table(gauges), counters=table(counters), histograms=table(histograms))


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


def fp8_weights_issue(features: Features, hardware: HardwareInfo | None) -> list[ValidationIssue]:
    """FP8 weights on GPUs older than Ada/Hopper."""
    if features.weights_dtype != "fp8" or hardware is None or not hardware.has_gpu \
            or any(g.supports_fp8 for g in hardware.gpus):
        return []
    return [ValidationIssue("weights_dtype", f"FP8 weights need compute capability 8.9+; {hardware.gpus[0].name} "
                                             f"has {hardware.gpus[0].compute_capability}")]


def draft_model_issues(features: Features, needs_draft: Iterable[str], what: str) -> list[ValidationIssue]:
    """A drafting method without its draft model (``what`` says which model the engine wants),
    and a draft model a method ignores."""
    spec = features.speculative
    issues = []
    if spec.method in needs_draft and not spec.draft_model:
        issues.append(ValidationIssue("speculative.draft_model",
                                      f"speculative method '{spec.method}' needs a draft model ({what})"))
    issues += draft_model_ignored(features)
    return issues


def draft_model_ignored(features: Features) -> list[ValidationIssue]:
    """A draft model set for a method that drafts without one: a warning, not an error."""
    spec = features.speculative
    if spec.method in ("off", "ngram", "mtp") and spec.draft_model:
        return [ValidationIssue("speculative.draft_model",
                                f"a draft model is ignored with speculative method '{spec.method}'", "warning")]
    return []


def kv_offload_size_issue(features: Features) -> list[ValidationIssue]:
    """A KV offload backend with nothing to offload: a warning, the setting does nothing."""
    if features.kv_offload_backend and features.kv_offload_gib == 0:
        return [ValidationIssue("kv_offload_gib", "a KV offload backend is set but kv_offload_gib is 0: nothing is "
                                                  "offloaded", "warning")]
    return []


def gguf_weights_issue(features: Features, instead: str) -> list[ValidationIssue]:
    """llama.cpp's GGUF weight types asked of an engine that quantizes weights its own way
    (``instead`` says how)."""
    if features.weights_dtype in GGUF_WEIGHT_BITS:
        return [ValidationIssue("weights_dtype", f"{features.weights_dtype} is llama.cpp's block-quantized GGUF weight "
                                                 f"type; {instead}")]
    return []


def block_quantized_kv_issue(features: Features, instead: str) -> list[ValidationIssue]:
    """llama.cpp's cache types asked of an engine that keeps KV in fp8 (``instead`` says how)."""
    if features.kv_cache_dtype in ("q8_0", "q4_0"):
        return [ValidationIssue("kv_cache_dtype", f"{features.kv_cache_dtype} is llama.cpp's block-quantized cache; "
                                                  f"{instead}")]
    return []


class CommandLineAdapter:
    """The adapter protocol for an engine started as one command line, driven by ``spec``.
    A subclass sets ``spec`` and writes ``base_command`` and ``installed_version``; every other
    method is a hook it overrides only for a genuine quirk of its engine (docs/engines.md,
    "Adding a fifth engine", says which exist)."""

    spec: ClassVar[EngineSpec]
    kind: str
    display_name: str
    health_path: str
    metrics_path: str
    metric_names: MetricNames
    phase_patterns: Sequence[PhasePattern]
    api_key_env: str
    client_keep_alive: bool
    prompt_logprobs: bool
    engine_defaults: Mapping[str, object]
    gpu_verified: bool = True
    maturity: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The protocol's attributes, read from the spec once per adapter class (class
        attributes, so a subclass that overrides ``__init__`` keeps them)."""
        super().__init_subclass__(**kwargs)
        spec = cls.spec
        cls.kind, cls.display_name, cls.api_key_env = spec.kind, spec.display_name, spec.api_key_env
        cls.health_path, cls.metrics_path, cls.metric_names = spec.health_path, spec.metrics_path, spec.metric_names
        cls.phase_patterns, cls.client_keep_alive = spec.phase_patterns, spec.client_keep_alive
        cls.prompt_logprobs = spec.prompt_logprobs
        cls.engine_defaults, cls.gpu_verified, cls.maturity = spec.engine_defaults, spec.gpu_verified, spec.maturity

    # -- flags ----------------------------------------------------------------------------------

    def feature_flags(self, features: Features) -> dict[str, list[str]]:
        """Per feature key, the flags it contributes (empty when the engine default applies)."""
        return rendered_flags(self.spec.flag_rules, features)

    def flag_names(self, tokens: Iterable[str]) -> list[str]:
        return flag_names_of(tokens, self.spec.flag_token)

    def flag_values(self, tokens: Sequence[str]) -> list[tuple[str, str]]:
        return flag_values_of(tokens, self.spec.flag_token)

    def canonical_flag(self, flag: str) -> str:
        return self.spec.canonical_flags.get(flag, flag)

    def parse_help(self, text: str, version: str) -> FlagSet:
        return parse_help_text(self.spec.help_layout, self.kind, text, version)

    def engine_terms(self, features: Features) -> dict[str, str]:
        return flag_terms(self.feature_flags(features))

    # -- readiness and the log ------------------------------------------------------------------

    def is_ready(self, base_url: str, timeout_s: float = 1.0) -> bool:
        """The server answers its health path with 200 once the model is loaded."""
        return http_ok(base_url + self.health_path, timeout_s)

    def logged_sizes(self, log_lines: Sequence[str]) -> dict[str, int]:
        """The sizes the engine logged while starting (``spec.logged_sizes``)."""
        marker = self.spec.logged_sizes_marker
        return logged_ints((line for line in log_lines if marker in line), self.spec.logged_sizes)

    def kv_cache(self, log_lines: Sequence[str]) -> dict[str, float]:
        """The KV capacity the engine logged: tokens in all, and requests of one's length that fit."""
        if self.spec.kv_capacity_sizes is None:
            return {}
        total, per_request = self.spec.kv_capacity_sizes
        sizes = self.logged_sizes(log_lines)
        return kv_capacity(sizes.get(total), sizes.get(per_request))

    def diagnose(self, log_lines: Iterable[str]) -> Diagnosis | None:
        spec = self.spec
        return diagnose_log(spec.diagnosis_rules, log_lines, spec.generic_error, not_an_error=spec.not_an_error)

    # -- launch ---------------------------------------------------------------------------------

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        raise NotImplementedError

    def model_name(self, engine: EngineConfig) -> str:
        from engine_adapters.runtimes import resolve_model

        return resolve_model(engine.model)

    def model_args(self, engine: EngineConfig) -> list[str]:
        spec = self.spec
        args = [spec.model_flag] if spec.model_flag else []
        args.append(self.model_name(engine))
        if engine.served_model_name and spec.served_name_flag:
            args += [spec.served_name_flag, engine.served_model_name]
        if engine.tokenizer and spec.tokenizer_flag:
            args += [spec.tokenizer_flag, engine.tokenizer]
        return args

    def server_args(self, engine: EngineConfig, port: int) -> list[str]:
        host = "0.0.0.0" if engine.runtime.kind == "docker" else engine.host  # noqa: S104 - inside the container
        return ["--host", host, "--port", str(port)]

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        argv = [*self.base_command(engine, port, portable=portable), *self.model_args(engine),
                *self.server_args(engine, port), *self.spec.fixed_args]
        for flags in self.feature_flags(features).values():
            argv += flags
        return argv

    def build_env(self, engine: EngineConfig, api_key: str | None) -> dict[str, str]:
        return env_with_api_key(engine, self.api_key_env, api_key)

    # -- flag discovery -------------------------------------------------------------------------

    def installed_version(self, engine: EngineConfig) -> str:
        raise NotImplementedError

    def help_command(self, engine: EngineConfig) -> list[str]:
        """What prints the flags with ``--help`` (raises where it cannot run here)."""
        return self.base_command(engine)

    def help_identity(self, engine: EngineConfig, command: Sequence[str]) -> str:
        """What else than the version changes the flags (the command; a runner script's hash)."""
        return " ".join(command)

    def help_env(self) -> Mapping[str, str] | None:
        return None

    def discover_flags(self, engine: EngineConfig) -> FlagSet:
        """Parse ``--help`` of the installed engine once per (command, version)."""
        command = self.help_command(engine)
        version = self.installed_version(engine)
        spec = self.spec
        return cached_flag_set(self.kind, version, self.help_identity(engine, command), lambda: run_help(
            command, spec.help_timeout_s, with_stderr=spec.help_with_stderr, env=self.help_env()), self.parse_help)

    # -- validation -----------------------------------------------------------------------------

    def validate(
        self, engine: EngineConfig, features: Features, flags: FlagSet | None, hardware: HardwareInfo | None
    ) -> list[ValidationIssue]:
        issues: list[ValidationIssue] = []
        if self.maturity:
            issues.append(ValidationIssue("engine.kind", f"the {self.display_name} adapter is {self.maturity}",
                                          "warning"))
        issues += self.setup_issues(engine, features, flags, hardware)
        issues += [ValidationIssue(info.key, f"{self.display_name} has no {info.noun} setting")
                   for info in not_offered(self.kind, features)]  # another engine's feature (features.py says whose)
        issues += self.feature_issues(engine, features, hardware)
        issues += self.extra_args_issues(features)
        issues += self.model_issues(engine)
        if flags is not None:
            issues += self.version_issues(features, flags)
        return issues

    def setup_issues(self, engine: EngineConfig, features: Features, flags: FlagSet | None,
                     hardware: HardwareInfo | None) -> list[ValidationIssue]:
        """Runtime, hardware and model problems, checked before the features."""
        return []

    def feature_issues(self, engine: EngineConfig, features: Features,
                       hardware: HardwareInfo | None) -> list[ValidationIssue]:
        """What the engine cannot do with these features."""
        return []

    def extra_args_issues(self, features: Features) -> list[ValidationIssue]:
        return extra_args_issues(features, self.feature_flags, self.flag_names, self.spec.reserved_flags,
                                 self.canonical_flag)

    def model_issues(self, engine: EngineConfig) -> list[ValidationIssue]:
        return model_path_issues(engine)

    def version_issues(self, features: Features, flags: FlagSet) -> list[ValidationIssue]:
        """Flags or values the installed version lacks, named with the version, before any launch."""
        return version_issues(self.feature_flags(features), flags, self.display_name, self.flag_names,
                              self.flag_values, comma_lists=self.spec.comma_lists)

    # -- verification by effect -----------------------------------------------------------------

    def prefix_probe_len(self, features: Features) -> int:
        probe = self.spec.probe
        return probe_prompt_len(features, probe.prefix_tokens) if probe.fit_model_len else probe.prefix_tokens

    def probe_requests(self, features: Features) -> list[dict[str, Any]]:
        """Two identical prompts (prefix caching: the second must hit the cache) and one
        repetitive prompt with a few dozen outputs (speculation: drafts proposed and accepted).
        Token ids, so the lengths do not depend on the tokenizer."""
        probe = self.spec.probe
        salt: Any = _probe_salt if probe.cache_salt else dict
        bodies: list[dict[str, Any]] = []
        if features.prefix_caching is not None:
            prompt = [PROBE_TOKEN_BASE + i % 89 for i in range(self.prefix_probe_len(features))]
            bodies += [{"prompt": prompt, "max_tokens": 1, "temperature": 0.0, **salt()}] * 2
        if features.speculative.method != "off":
            pattern = [PROBE_TOKEN_BASE + probe.spec_token_offset + i for i in range(SPEC_PROBE_PERIOD)]
            bodies.append({"prompt": pattern * 8, "max_tokens": probe.spec_output_tokens, "ignore_eos": True,
                           "temperature": 0.0, **salt()})
        if bodies and probe.fence_request:
            bodies.append({"prompt": [PROBE_TOKEN_BASE + 97], "max_tokens": 1, "temperature": 0.0})
        return bodies

    def verify(self, features: Features, log_lines: Sequence[str], metrics_text: str, *,
               before_text: str | None = None, probe_error: str | None = None,
               model_config: Mapping[str, Any] | None = None) -> list[FeatureCheck]:
        """Check, after ready, that each requested feature took effect: by effect where the
        engine shows one, else by what it reported back ("accepted")."""
        reading = ProbeReading(self.metric_names.counters, metrics_text, before_text, probe_error)
        checks: list[FeatureCheck] = []
        if features.prefix_caching is not None:
            checks.append(self.verify_prefix_caching(features, log_lines, reading))
        if features.kv_cache_dtype != "auto":
            kv_check = self.verify_kv_cache_dtype(features.kv_cache_dtype, log_lines, model_config)
            checks += [kv_check] if kv_check is not None else []
        if features.speculative.method != "off":
            checks.append(self.verify_speculation(features, log_lines, reading))
        return checks + self.verify_settings(features, log_lines)

    def verify_prefix_caching(self, features: Features, log_lines: Sequence[str],
                              reading: ProbeReading) -> FeatureCheck:
        """The second of two identical prompts must take its tokens from the cache, and with
        caching off none may."""
        wanted = bool(features.prefix_caching)
        hits = reading.change("prefix_cache_hits")
        probe = f"a probe of two identical {self.prefix_probe_len(features)}-token prompts"
        noun = self.spec.prefix_cache_noun
        if reading.probed and hits is not None:
            if not wanted and hits == 0:
                return FeatureCheck("prefix_caching", "False", "verified", f"no prompt tokens came from a cache in {probe}")
            return FeatureCheck("prefix_caching", str(wanted), "verified" if wanted and hits > 0 else "not active",
                                f"{hits:,.0f} prompt tokens came from the {noun} in {probe}")
        if reading.probed and not wanted and self.spec.hits_counter_lazy:
            return FeatureCheck("prefix_caching", "False", "verified", f"no prompt tokens came from a cache in {probe}")
        return FeatureCheck("prefix_caching", str(wanted), "unknown",
                            f"no {noun.replace(' ', '-')} counter was read" + reading.unmeasured)

    def verify_speculation(self, features: Features, log_lines: Sequence[str], reading: ProbeReading) -> FeatureCheck:
        """Drafts proposed and some accepted on a repetitive prompt."""
        method = features.speculative.method
        drafted = reading.change("spec_decode_draft_tokens")
        accepted = reading.change("spec_decode_accepted_tokens") or 0
        drafts = reading.change("spec_decode_drafts")
        probe = f"a {self.spec.probe.spec_output_tokens}-token probe on a repetitive prompt"
        if not reading.probed or drafted is None:
            return FeatureCheck("speculative.method", method, "unknown",
                                "no speculative-decoding counter was read" + reading.unmeasured)
        if drafted <= 0:
            return FeatureCheck("speculative.method", method, "not active", f"no drafts in {probe}")
        counted = f" ({drafts:,.0f} drafts)" if drafts is not None else ""
        return FeatureCheck("speculative.method", method, "verified" if accepted > 0 else "accepted",
                            f"{drafted:,.0f} draft tokens proposed{counted}, {accepted:,.0f} accepted in {probe}")

    def verify_kv_cache_dtype(self, dtype: str, log_lines: Sequence[str],
                              model_config: Mapping[str, Any] | None) -> FeatureCheck | None:
        """Whether the KV cache is kept in ``dtype``; None where the engine shows nothing of it."""
        return None

    def echoed_settings(self, log_lines: Sequence[str]) -> Mapping[str, object]:
        """The settings the engine reported back, by the names in ``spec.setting_echoes``: by
        default the sizes it logged."""
        return self.logged_sizes(log_lines)

    def requested_setting(self, features: Features, echo: SettingEcho) -> object:
        return getattr(features, echo.key)

    def verify_settings(self, features: Features, log_lines: Sequence[str]) -> list[FeatureCheck]:
        """Settings without an effect to measure: the engine's own report of each ("accepted")."""
        spec = self.spec
        echoed = self.echoed_settings(log_lines) if spec.setting_echoes else {}
        checks = []
        for echo in spec.setting_echoes:
            wanted = self.requested_setting(features, echo)
            if wanted == echo.unset:
                continue
            value = echoed.get(echo.name)
            status: FeatureStatus = ("accepted" if value == wanted else
                                     spec.echo_absent_status if value is None else "not active")
            checks.append(FeatureCheck(echo.key, str(wanted), status,
                                       spec.echo_evidence.format(name=echo.name, value=value)))
        return checks


def _probe_salt() -> dict[str, str]:
    import secrets

    return {"cache_salt": "tunebench-probe-" + secrets.token_hex(8)}
