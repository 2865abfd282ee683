"""What every engine adapter provides: the protocol vLLM follows first and SGLang, llama.cpp
and TensorRT-LLM will follow later, plus the small result types it speaks in."""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from engine_adapters.config import EngineConfig, Features
from engine_adapters.hardware import HardwareInfo


class Phase(StrEnum):
    """Startup phases, in the order an engine goes through them."""

    LAUNCHING = "launching"
    LOADING_WEIGHTS = "loading weights"
    PROFILING = "profiling memory"
    WARMING_UP = "warming up / compiling"
    KV_CACHE = "allocating KV cache"
    STARTING_SERVER = "starting API server"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def progress(self) -> float:
        """Rough fraction of startup done, for a progress bar."""
        return _PHASE_PROGRESS.get(self, 0.0)


_PHASE_PROGRESS = {
    Phase.LAUNCHING: 0.05, Phase.LOADING_WEIGHTS: 0.2, Phase.PROFILING: 0.4, Phase.WARMING_UP: 0.6,
    Phase.KV_CACHE: 0.75, Phase.STARTING_SERVER: 0.9, Phase.READY: 1.0,
}


@dataclass(frozen=True)
class PhasePattern:
    phase: Phase
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class ValidationIssue:
    """A problem with a configuration, found before launch. ``field`` is a Features/Engine path."""

    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.severity}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Diagnosis:
    """A fatal startup error recognised in the log, with plain advice."""

    code: str
    message: str
    evidence: str = ""

    def __str__(self) -> str:
        return self.message


FeatureStatus = Literal["verified", "accepted", "not active", "unknown"]
"""How far a requested feature is known to work: ``verified`` by an effect the engine measured
(prefix-cache hits, accepted drafts, KV capacity), ``accepted`` when the engine only echoed the
setting back, ``not active`` when it did not take it (or it had no effect where it must have),
``unknown`` when neither could be read."""


@dataclass(frozen=True)
class FeatureCheck:
    """Whether a requested feature took effect in the running engine, and the evidence."""

    key: str
    requested: str
    status: FeatureStatus
    evidence: str

    @property
    def active(self) -> bool | None:
        """True when verified or accepted, False when not active, None when unknown."""
        return _ACTIVE.get(self.status)


_ACTIVE: dict[str, bool] = {"verified": True, "accepted": True, "not active": False}


def feature_status(check: FeatureCheck | Mapping[str, Any]) -> FeatureStatus:
    """The status of a check, or of its dict form (events, stored runs). Records written before
    statuses existed carry only ``active``, which then meant "the engine echoed the setting"."""
    if isinstance(check, FeatureCheck):
        return check.status
    status = check.get("status")
    if status in ("verified", "accepted", "not active", "unknown"):
        return status  # type: ignore[no-any-return]
    active = check.get("active")
    return "accepted" if active is True else "not active" if active is False else "unknown"


def feature_status_text(check: FeatureCheck | Mapping[str, Any], *, evidence: bool = True) -> str:
    """The one wording of a check's outcome, for the CLI, the GUI and reports:
    "active (verified by ...)", "accepted by the engine (...)", "NOT ACTIVE (...)", "unknown (...)".
    Without ``evidence``: "active (verified)", "accepted by the engine", "NOT ACTIVE", "unknown"."""
    status = feature_status(check)
    detail = str(check.evidence if isinstance(check, FeatureCheck) else check.get("evidence") or "")
    if status == "verified":
        return f"active (verified by {detail})" if evidence and detail else "active (verified)"
    head = {"accepted": "accepted by the engine", "not active": "NOT ACTIVE"}.get(status, "unknown")
    return f"{head} ({detail})" if evidence and detail else head


def feature_check_line(check: FeatureCheck | Mapping[str, Any], *, evidence: bool = True) -> str:
    """``feature KEY=REQUESTED: <feature_status_text>``, one line per check in the CLI and logs."""
    key = check.key if isinstance(check, FeatureCheck) else check.get("key")
    requested = check.requested if isinstance(check, FeatureCheck) else check.get("requested")
    return f"feature {key}={requested}: {feature_status_text(check, evidence=evidence)}"


class FlagSet(BaseModel):
    """The command-line flags one installed engine version accepts (discovered, cached)."""

    engine: str
    version: str
    flags: list[str] = Field(default_factory=list)
    choices: dict[str, list[str]] = Field(default_factory=dict)

    def has(self, flag: str) -> bool:
        return flag in self.flags


@dataclass
class MetricNames:
    """Canonical telemetry names -> the engine's Prometheus names (first match wins, so newer
    names go first and older aliases after)."""

    gauges: dict[str, tuple[str, ...]] = field(default_factory=dict)
    counters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    histograms: dict[str, tuple[str, ...]] = field(default_factory=dict)


class EngineMetrics(Protocol):
    """What reading an engine's Prometheus metrics needs: enough for ``tunebench monitor`` to
    watch an engine tunebench cannot launch yet (SGLang, llama.cpp)."""

    kind: str
    display_name: str
    metrics_path: str
    metric_names: MetricNames


@dataclass
class MetricsOnlyEngine:
    """An engine tunebench knows so far only by its metric names: enough for ``tunebench monitor``
    (an :class:`EngineMetrics`); it becomes a full :class:`EngineAdapter` when tunebench can
    launch it."""

    kind: str
    display_name: str
    metric_names: MetricNames
    metrics_path: str = "/metrics"


class EngineAdapter(EngineMetrics, Protocol):
    """Everything tunebench needs to know about one engine. The launcher speaks only this
    protocol: it knows no engine by name."""

    health_path: str
    phase_patterns: Sequence[PhasePattern]
    api_key_env: str  # the environment variable the server reads its API key from
    client_keep_alive: bool  # whether a load client may reuse HTTP connections to this server
    prompt_logprobs: bool  # whether /v1/completions returns the logprobs of the prompt's tokens (echo)

    def is_ready(self, base_url: str, timeout_s: float = 1.0) -> bool:
        """Whether the server answers requests now (polled while it starts)."""
        ...

    def engine_terms(self, features: Features) -> dict[str, str]:
        """Per feature key, what the engine is given for it in its own words (``--kv-cache-dtype
        fp8``, ``-ctk q8_0 -ctv q8_0``, ``kv_cache_config.dtype: fp8``); absent where the
        engine's default applies. Compare shows a cross-engine difference in these terms."""
        ...

    def kv_cache(self, log_lines: Sequence[str]) -> dict[str, float]:
        """The KV-cache capacity the engine reported at startup (``kv_cache_tokens``,
        ``max_concurrency``, ...); empty when it says nothing."""
        ...

    def base_command(self, engine: EngineConfig, port: int | None = None, *, portable: bool = False) -> list[str]:
        """argv prefix that starts the server from the configured runtime; ``portable`` for a
        script that runs on another machine (executables named, not resolved here)."""
        ...

    def server_args(self, engine: EngineConfig, port: int) -> list[str]:
        """Where the server listens (host and port arguments)."""
        ...

    def build_argv(self, engine: EngineConfig, features: Features, port: int, *, portable: bool = False) -> list[str]:
        """The exact argv (no shell) that launches the engine with these features."""
        ...

    def installed_version(self, engine: EngineConfig) -> str:
        """The engine version the configured runtime would run."""
        ...

    def build_env(self, engine: EngineConfig, api_key: str | None) -> dict[str, str]:
        """Environment additions for the engine process (secrets travel here, not in argv)."""
        ...

    def discover_flags(self, engine: EngineConfig) -> FlagSet:
        """Ask the installed engine which flags it supports (cached by version)."""
        ...

    def validate(
        self, engine: EngineConfig, features: Features, flags: FlagSet | None, hardware: HardwareInfo | None
    ) -> list[ValidationIssue]:
        """Problems found before launch; errors block the launch."""
        ...

    def diagnose(self, log_lines: Iterable[str]) -> Diagnosis | None:
        """Turn a failed start's log into plain advice."""
        ...

    def probe_requests(self, features: Features) -> list[dict[str, Any]]:
        """Tiny completion requests (OpenAI ``/v1/completions`` bodies without ``model``) whose
        effect on the engine's metrics shows requested features working; [] when none help."""
        ...

    def verify(self, features: Features, log_lines: Sequence[str], metrics_text: str, *,
               before_text: str | None = None, probe_error: str | None = None,
               model_config: Mapping[str, Any] | None = None) -> list[FeatureCheck]:
        """Check, after ready, that each requested feature took effect. ``metrics_text`` is read
        after the probe requests and ``before_text`` before them (None: no probe ran);
        ``probe_error`` says why the probe did not complete; ``model_config`` is the model's
        config.json when it is local (KV bytes per token)."""
        ...


BESIDE_SCRIPT = "@beside-script@/"
"""Prefix of an argv token that names a file an exported launch script writes beside itself
(an adapter's optional ``side_files``, e.g. TensorRT-LLM's options YAML): with ``portable`` the
adapter writes ``BESIDE_SCRIPT + name`` and the export substitutes the script's folder."""


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``url`` answers 200 now: the readiness probe most engines need (a /health path)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - a loopback URL we built
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):  # HTTPException: not HTTP
        return False


def match_phase(patterns: Sequence[PhasePattern], line: str) -> Phase | None:
    for item in patterns:
        if item.pattern.search(line):
            return item.phase
    return None
