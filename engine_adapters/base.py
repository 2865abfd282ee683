"""What every engine adapter provides: the protocol vLLM follows first and SGLang, llama.cpp
and TensorRT-LLM will follow later, plus the small result types it speaks in."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

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


@dataclass(frozen=True)
class FeatureCheck:
    """Whether a requested feature is really active in the running engine."""

    key: str
    requested: str
    active: bool | None  # None = could not be determined
    evidence: str


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


class EngineAdapter(Protocol):
    """Everything tunebench needs to know about one engine."""

    kind: str
    display_name: str
    health_path: str
    metrics_path: str
    metric_names: MetricNames
    phase_patterns: Sequence[PhasePattern]
    api_key_env: str  # the environment variable the server reads its API key from

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

    def verify(self, features: Features, log_lines: Sequence[str], metrics_text: str) -> list[FeatureCheck]:
        """Check, after ready, that each requested feature took effect."""
        ...


def match_phase(patterns: Sequence[PhasePattern], line: str) -> Phase | None:
    for item in patterns:
        if item.pattern.search(line):
            return item.phase
    return None
