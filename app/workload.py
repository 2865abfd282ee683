"""What is sent to the engine (workload) and how fast (load). Seeded and reproducible: the same
configuration and seed send the same prompts with the same lengths at the same scheduled times.

Generation lives in :mod:`app.load`; this module only describes it (a profile file holds it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from engine_adapters.config import StrictModel

LengthDistribution = Literal["fixed", "uniform", "normal"]


class LengthSpec(StrictModel):
    """A token-length distribution (clipped to [minimum, maximum])."""

    distribution: LengthDistribution = "fixed"
    mean: int = Field(128, ge=1)
    spread: int = Field(0, ge=0, description="uniform: +/- range; normal: standard deviation")
    minimum: int = Field(1, ge=1)
    maximum: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> LengthSpec:
        if self.maximum is not None and self.maximum < self.minimum:
            raise ValueError("maximum must not be below minimum")
        return self


WorkloadKind = Literal["random", "shared_prefix", "multi_turn", "long_context", "code", "sharegpt", "jsonl"]


class WorkloadConfig(StrictModel):
    """The prompts: kind, lengths in the model's tokens, and the API used to send them."""

    kind: WorkloadKind = "random"
    seed: int = 0
    num_requests: int = Field(64, ge=1, description="Requests (conversations for multi_turn) per load level.")
    input_len: LengthSpec = Field(default_factory=lambda: LengthSpec(mean=128))
    output_len: LengthSpec = Field(default_factory=lambda: LengthSpec(mean=64))
    shared_prefix_tokens: int = Field(0, ge=0, description="Length of the system prompt shared by requests.")
    shared_prefix_fraction: float = Field(1.0, ge=0, le=1, description="Fraction of requests that carry it.")
    turns: int = Field(1, ge=1, description="multi_turn: user turns per conversation (history is resent).")
    dataset_path: str | None = Field(None, description="sharegpt: a ShareGPT JSON file; jsonl: one prompt per line.")
    api: Literal["completions", "chat"] = "completions"
    ignore_eos: bool = Field(True, description="Ask the engine to ignore EOS so outputs have the asked length.")
    temperature: float = Field(0.0, ge=0)
    model_name: str | None = Field(None, description="Model name sent in requests (default: what /v1/models lists).")
    tokenizer: str | None = Field(None, description="Local tokenizer.json or model folder for counting lengths "
                                                    "(default: the engine's model when it is local).")

    @model_validator(mode="after")
    def _dataset_when_needed(self) -> WorkloadConfig:
        if self.kind in ("sharegpt", "jsonl") and not self.dataset_path:
            raise ValueError(f"workload kind '{self.kind}' needs dataset_path")
        if self.kind == "shared_prefix" and self.shared_prefix_tokens == 0:
            raise ValueError("workload kind 'shared_prefix' needs shared_prefix_tokens > 0")
        return self


LoadPattern = Literal["closed", "constant", "poisson", "gamma", "ramp", "sweep"]


class LoadConfig(StrictModel):
    """How fast requests are sent, and when a level stops.

    - ``closed``: ``concurrency`` requests always in flight.
    - ``constant`` / ``poisson`` / ``gamma``: open loop at ``rate_rps`` (gamma shape = ``burstiness``:
      below 1 burstier than Poisson, above 1 more regular), optionally capped at ``max_concurrency``.
    - ``ramp``: open loop, rate rising linearly from ``ramp_start_rps`` to ``rate_rps``.
    - ``sweep``: one level per entry of ``levels``, a concurrency (``sweep_of="concurrency"``) or a
      Poisson/gamma rate (``sweep_of="rate"``), run one after another.
    """

    pattern: LoadPattern = "closed"
    concurrency: int = Field(4, ge=1)
    rate_rps: float | None = Field(None, gt=0)
    burstiness: float = Field(1.0, gt=0)
    ramp_start_rps: float = Field(0.5, gt=0)
    max_concurrency: int | None = Field(None, ge=1, description="Open loop: cap on requests in flight.")
    levels: list[float] = Field(default_factory=list)
    sweep_of: Literal["concurrency", "rate"] = "concurrency"
    duration_s: float | None = Field(None, gt=0, description="Stop sending after this long (per level).")
    max_requests: int | None = Field(None, ge=1, description="Stop after this many requests (per level).")
    warmup_requests: int = Field(0, ge=0, description="Sent before the first level, excluded from figures.")
    max_error_fraction: float = Field(0.5, ge=0, le=1, description="Error budget: stop a level beyond it.")
    request_timeout_s: float = Field(300.0, gt=0)
    slo: str | None = Field(None, description="Goodput SLOs, e.g. 'ttft_ms<=500,tpot_ms<=50'")
    workers: int = Field(1, ge=1, le=64, description="Client processes (when one core cannot keep up).")
    continuous_usage: bool = Field(True, description="Ask for per-chunk usage to count tokens, not chunks.")

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, value: str | None) -> str | None:
        if value:
            from app.load.metrics import parse_slo  # local: app.load imports this module

            parse_slo(value)
        return value

    @model_validator(mode="after")
    def _pattern_needs(self) -> LoadConfig:
        if self.pattern in ("constant", "poisson", "gamma", "ramp") and self.rate_rps is None:
            raise ValueError(f"load pattern '{self.pattern}' needs rate_rps")
        if self.pattern == "sweep" and not self.levels:
            raise ValueError("load pattern 'sweep' needs levels (concurrencies or rates)")
        if self.pattern == "sweep" and self.sweep_of == "concurrency" and any(
                v < 1 or not float(v).is_integer() for v in self.levels):
            raise ValueError("a concurrency sweep needs whole numbers >= 1 in levels")
        if self.pattern == "sweep" and any(v <= 0 for v in self.levels):
            raise ValueError("sweep levels must be positive")
        return self
