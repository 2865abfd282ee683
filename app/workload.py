"""What is sent to the engine (workload) and how fast (load). Seeded and reproducible: the same
configuration and seed send the same prompts with the same lengths at the same scheduled times.

Generation lives in :mod:`app.load`; this module only describes it (a profile file holds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Self, cast, get_args

from pydantic import Field, field_validator, model_validator

from app.slo import parse_slo
from engine_adapters.config import MAX_SEED, StrictModel, not_on_panel, panel_row

MAX_TOKENS = 2_000_000
"""Longest prompt or output a request may ask for: admits a million-token context with room."""
MAX_REQUESTS = 1_000_000
"""Most requests (or conversations) one level may send."""
MAX_LEVEL_PROMPT_TOKENS = 1_000_000_000
"""Most prompt tokens one level's prompts may add up to: they are generated up front, in memory."""
MAX_TURNS = 1_000
MAX_CONCURRENCY = 100_000
"""Most requests in flight (one task and one connection each)."""
MAX_RATE_RPS = 1_000_000.0
MAX_LEVELS = 1_000
MAX_DURATION_S = 30 * 86_400.0
"""A month: a soak longer than that is a typo."""

LengthDistribution = Literal["fixed", "uniform", "normal"]


class LengthSpec(StrictModel):
    """A token-length distribution (clipped to [minimum, maximum]). Its panel rows rank among the
    workload's: the means next to the request count, the shapes after the prefix settings."""

    distribution: LengthDistribution = Field("fixed", json_schema_extra=panel_row(12))
    mean: int = Field(128, ge=1, le=MAX_TOKENS, json_schema_extra=panel_row(8))
    spread: int = Field(0, ge=0, le=MAX_TOKENS, json_schema_extra=panel_row(12),
                        description="uniform: +/- range; normal: standard deviation")
    minimum: int = Field(1, ge=1, le=MAX_TOKENS, json_schema_extra=not_on_panel())
    maximum: int | None = Field(None, ge=1, le=MAX_TOKENS, json_schema_extra=not_on_panel())

    @model_validator(mode="after")
    def _bounds_ordered(self) -> LengthSpec:
        if self.maximum is not None and self.maximum < self.minimum:
            raise ValueError("maximum must not be below minimum")
        return self


WorkloadKind = Literal["random", "shared_prefix", "multi_turn", "long_context", "code", "sharegpt", "jsonl", "trace"]
FILE_KINDS = ("sharegpt", "jsonl", "trace")
"""Workload kinds read from ``dataset_path`` (their prompts are not generated up front from lengths)."""


class WorkloadConfig(StrictModel):
    """The prompts: kind, lengths in the model's tokens, and the API used to send them."""

    kind: WorkloadKind = Field("random", json_schema_extra=panel_row(1))
    seed: int = Field(0, ge=0, le=MAX_SEED, json_schema_extra=panel_row(16))
    num_requests: int = Field(64, ge=1, le=MAX_REQUESTS, json_schema_extra=panel_row(7),
                              description="Requests (conversations for multi_turn) per load level.")
    input_len: LengthSpec = Field(default_factory=lambda: LengthSpec(mean=128))
    output_len: LengthSpec = Field(default_factory=lambda: LengthSpec(mean=64))
    shared_prefix_tokens: int = Field(0, ge=0, le=MAX_TOKENS, json_schema_extra=panel_row(9),
                                      description="Length of the system prompt shared by requests.")
    shared_prefix_fraction: float = Field(1.0, ge=0, le=1, json_schema_extra=panel_row(10),
                                          description="Fraction of requests that carry it.")
    turns: int = Field(1, ge=1, le=MAX_TURNS, json_schema_extra=panel_row(11),
                       description="multi_turn: user turns per conversation (history is resent).")
    dataset_path: str | None = Field(None, json_schema_extra=panel_row(2), description=(
        "sharegpt: a ShareGPT JSON file; jsonl: one prompt per line; trace: a Mooncake, Azure or tunebench trace "
        "(docs/workloads.md)."))
    trace_format: Literal["auto", "mooncake", "azure", "tunebench"] = Field(
        "auto", json_schema_extra=panel_row(3), description="trace: the trace's format (auto: from its first line).")
    trace_block_tokens: int = Field(512, ge=1, le=MAX_TOKENS, json_schema_extra=panel_row(6), description=(
        "trace: prompt tokens per block id (hash_ids; Mooncake's traces use 512)."))
    trace_start_s: float = Field(0.0, ge=0, le=MAX_DURATION_S, json_schema_extra=panel_row(4), description=(
        "trace: replay the requests from this long after the trace's first."))
    trace_end_s: float | None = Field(None, gt=0, le=MAX_DURATION_S, json_schema_extra=panel_row(5), description=(
        "trace: ... until this long after its first (none: to its end); num_requests caps them too."))
    api: Literal["completions", "chat"] = Field("completions", json_schema_extra=panel_row(13))
    ignore_eos: bool = Field(True, json_schema_extra=panel_row(14),
                             description="Ask the engine to ignore EOS so outputs have the asked length.")
    temperature: float = Field(0.0, ge=0, le=100, json_schema_extra=panel_row(15))
    model_name: str | None = Field(None, json_schema_extra=not_on_panel(),
                                   description="Model name sent in requests (default: what /v1/models lists).")
    tokenizer: str | None = Field(None, json_schema_extra=not_on_panel(), description=(
        "Local tokenizer.json or model folder for counting lengths (default: the engine's model when it is local)."))
    cache: Literal["cold", "warm"] = Field("cold", json_schema_extra=panel_row(17), description=(
        "Prefix cache at the start of each level: cold (a fresh cache salt per level) or warm (the level's prompts "
        "sent once, unmeasured, before the measured pass)."))

    @model_validator(mode="after")
    def _dataset_when_needed(self) -> WorkloadConfig:
        if self.kind in FILE_KINDS and not self.dataset_path:
            raise ValueError(f"workload kind '{self.kind}' needs dataset_path")
        if self.kind == "shared_prefix" and self.shared_prefix_tokens == 0:
            raise ValueError("workload kind 'shared_prefix' needs shared_prefix_tokens > 0")
        if self.trace_end_s is not None and self.trace_end_s <= self.trace_start_s:
            raise ValueError("trace_end_s must be after trace_start_s")
        turns = self.turns if self.kind == "multi_turn" else 1
        planned = self.num_requests * turns * self.input_len.mean
        if self.kind not in FILE_KINDS and planned > MAX_LEVEL_PROMPT_TOKENS:
            raise ValueError(f"num_requests x turns x input_len.mean = {planned:,} prompt tokens per level; "
                             f"at most {MAX_LEVEL_PROMPT_TOKENS:,} (prompts are generated in memory)")
        return self


PatternLoop = Literal["closed", "open", "levels"]
"""closed: a number of requests kept in flight; open: requests sent at arrival times, whatever
comes back; levels: one level per entry of ``levels``, each closed or open by ``sweep_of``."""


@dataclass(frozen=True)
class _Sends:
    """How a load pattern sends its requests (see :class:`LoadPattern`)."""

    loop: PatternLoop
    settings: tuple[str, ...]
    unsteady: str | None = None
    replays_trace: bool = False


class LoadPattern(StrEnum):
    """A load pattern, stored (in profiles, runs and campaigns) as its name. Each knows how it
    sends: its loop, the settings it reads (the :class:`LoadConfig` fields that only some patterns
    read; the editor hides the others), and whether its arrivals have a steady rate. A new pattern
    is a member here and a case in :func:`app.load.patterns.plan_levels` (mypy names a missing
    case); an open-loop one is an :data:`Arrival` too, with its times in ``arrival_offsets_s``."""

    loop: PatternLoop
    settings: frozenset[str]
    unsteady: str | None
    """Why its arrivals have no steady state (None: they have one)."""
    replays_trace: bool
    """It sends at a trace's arrival times: the workload must be a trace."""

    CLOSED = "closed", _Sends("closed", ("concurrency", "ramp_up_s"))
    CONSTANT = "constant", _Sends("open", ("rate_rps", "max_concurrency"))
    POISSON = "poisson", _Sends("open", ("rate_rps", "max_concurrency"))
    GAMMA = "gamma", _Sends("open", ("rate_rps", "burstiness", "max_concurrency"))
    RAMP = "ramp", _Sends("open", ("rate_rps", "ramp_start_rps", "max_concurrency"),
                          unsteady="a ramp of arrival rates has no steady state")
    SWEEP = "sweep", _Sends("levels", ("concurrency", "sweep_of", "levels", "max_concurrency", "ramp_up_s"))
    TRACE = "trace", _Sends("open", ("speedup", "max_concurrency"),
                            unsteady="a trace's arrivals follow the trace, not a steady rate", replays_trace=True)

    def __new__(cls, name: str, sends: _Sends | None = None) -> LoadPattern:
        # Makes the members; a lookup by name (LoadPattern("sweep")) is Enum's own and never comes here.
        if sends is None:
            raise TypeError(f"load pattern '{name}' needs its _Sends")
        member = str.__new__(cls, name)
        member._value_ = name
        member.loop = sends.loop
        member.settings = frozenset(sends.settings)
        member.unsteady = sends.unsteady
        member.replays_trace = sends.replays_trace
        return member

    @property
    def closed_loop(self) -> bool:
        """One closed-loop level: ``concurrency`` requests always in flight."""
        return self.loop == "closed"

    @property
    def takes_rate(self) -> bool:
        """It sends at ``rate_rps``, which it then needs."""
        return "rate_rps" in self.settings

    @property
    def takes_concurrency(self) -> bool:
        """``concurrency`` applies to it (a sweep's levels may be concurrencies instead)."""
        return "concurrency" in self.settings

    @property
    def takes_levels(self) -> bool:
        """It runs one level per entry of ``levels`` (a sweep), not one level."""
        return self.loop == "levels"


Arrival = Literal[LoadPattern.CONSTANT, LoadPattern.POISSON, LoadPattern.GAMMA, LoadPattern.RAMP, LoadPattern.TRACE]
"""When an open-loop level's requests are due: the pattern of its arrivals."""


def arrival_of(name: str) -> Arrival:
    """The arrival pattern of this name (ValueError: none is)."""
    pattern = LoadPattern(name)
    if pattern not in get_args(Arrival):
        raise ValueError(f"'{name}' is no pattern of arrivals")
    return cast(Arrival, pattern)


class LoadConfig(StrictModel):
    """How fast requests are sent, and when a level stops.

    - ``closed``: ``concurrency`` requests always in flight.
    - ``constant`` / ``poisson`` / ``gamma``: open loop at ``rate_rps`` (gamma shape = ``burstiness``:
      below 1 burstier than Poisson, above 1 more regular), optionally capped at ``max_concurrency``.
    - ``ramp``: open loop, rate rising linearly from ``ramp_start_rps`` to ``rate_rps``.
    - ``sweep``: one level per entry of ``levels``, a concurrency (``sweep_of="concurrency"``) or a
      Poisson/gamma rate (``sweep_of="rate"``), run one after another.
    - ``trace``: open loop at a trace's own arrival times (workload kind ``trace``), ``speedup``
      times faster, optionally capped at ``max_concurrency``.
    """

    pattern: LoadPattern = Field(LoadPattern.CLOSED, strict=False,  # not strict: a profile gives the name
                                 json_schema_extra=panel_row(1))
    concurrency: int = Field(4, ge=1, le=MAX_CONCURRENCY, json_schema_extra=panel_row(2))
    rate_rps: float | None = Field(None, gt=0, le=MAX_RATE_RPS, json_schema_extra=panel_row(3))
    burstiness: float = Field(1.0, gt=0, le=1_000, json_schema_extra=panel_row(5))
    ramp_start_rps: float = Field(0.5, gt=0, le=MAX_RATE_RPS, json_schema_extra=panel_row(6))
    max_concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY, json_schema_extra=panel_row(9),
                                        description="Open loop: cap on requests in flight.")
    ramp_up_s: float = Field(0.0, ge=0, le=MAX_DURATION_S, json_schema_extra=panel_row(12),
                             description="Closed loop: start the concurrent streams evenly over this long.")
    speedup: float = Field(1.0, gt=0, le=MAX_RATE_RPS, json_schema_extra=panel_row(4),
                           description="trace: replay the arrivals this many times faster (2 = twice as fast).")
    levels: list[float] = Field(default_factory=list, max_length=MAX_LEVELS, json_schema_extra=panel_row(8))
    sweep_of: Literal["concurrency", "rate"] = Field("concurrency", json_schema_extra=panel_row(7))
    duration_s: float | None = Field(None, gt=0, le=MAX_DURATION_S, json_schema_extra=panel_row(10),
                                     description="Stop sending after this long (per level).")
    max_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS, json_schema_extra=panel_row(11),
                                     description="Stop after this many requests (per level).")
    warmup_requests: int = Field(0, ge=0, le=MAX_REQUESTS, json_schema_extra=panel_row(13),
                                 description="Sent before the first level, excluded from figures.")
    max_error_fraction: float = Field(0.5, ge=0, le=1, json_schema_extra=panel_row(15),
                                      description="Error budget: stop a level beyond it.")
    request_timeout_s: float = Field(300.0, gt=0, le=MAX_DURATION_S, json_schema_extra=panel_row(16))
    slo: str | None = Field(None, json_schema_extra=panel_row(14),
                            description="Goodput SLOs, e.g. 'ttft_ms<=500,tpot_ms<=50'")
    workers: int = Field(1, ge=1, le=64, json_schema_extra=panel_row(17),
                         description="Client processes (when one core cannot keep up).")
    continuous_usage: bool = Field(True, json_schema_extra=not_on_panel(),
                                   description="Ask for per-chunk usage to count tokens, not chunks.")

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, value: str | None) -> str | None:
        if value:
            parse_slo(value)
        return value

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Pydantic's copy, which leaves ``update`` unvalidated: a pattern given by name there
        becomes its member, so the copy's pattern still knows how it sends."""
        if update is not None and "pattern" in update:
            update = {**update, "pattern": LoadPattern(update["pattern"])}
        return super().model_copy(update=update, deep=deep)

    @property
    def concurrency_sweep(self) -> bool:
        """One level per concurrency in ``levels``."""
        return self.pattern.takes_levels and self.sweep_of == "concurrency"

    @property
    def closed_loop(self) -> bool:
        """Each level keeps a number of requests in flight (a closed loop or a concurrency sweep)."""
        return self.pattern.closed_loop or self.concurrency_sweep

    @property
    def peak_concurrency(self) -> int:
        """The most requests it keeps in flight: a concurrency sweep's highest level, else ``concurrency``."""
        return int(max(self.levels)) if self.concurrency_sweep and self.levels else self.concurrency

    @model_validator(mode="after")
    def _pattern_needs(self) -> LoadConfig:
        pattern = self.pattern
        if pattern.takes_rate and self.rate_rps is None:
            raise ValueError(f"load pattern '{pattern}' needs rate_rps")
        if self.ramp_up_s and not self.closed_loop:
            raise ValueError("ramp_up_s staggers a closed loop's streams; an open loop ramps with pattern 'ramp'")
        if pattern.takes_levels and not self.levels:
            raise ValueError(f"load pattern '{pattern}' needs levels (concurrencies or rates)")
        if self.concurrency_sweep and any(v < 1 or not float(v).is_integer() for v in self.levels):
            raise ValueError("a concurrency sweep needs whole numbers >= 1 in levels")
        if pattern.takes_levels and any(v <= 0 for v in self.levels):
            raise ValueError("sweep levels must be positive")
        if self.concurrency_sweep and any(v > MAX_CONCURRENCY for v in self.levels):
            raise ValueError(f"concurrency levels must be at most {MAX_CONCURRENCY:,}")
        if pattern.takes_levels and self.sweep_of == "rate" and any(v > MAX_RATE_RPS for v in self.levels):
            raise ValueError(f"rate levels must be at most {MAX_RATE_RPS:,.0f} req/s")
        return self
