"""What is sent to the engine (workload) and how fast (load). Seeded and reproducible."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine_adapters.config import StrictModel

LengthDistribution = Literal["fixed", "uniform", "normal"]


class LengthSpec(StrictModel):
    """A token-length distribution."""

    distribution: LengthDistribution = "fixed"
    mean: int = Field(128, ge=1)
    spread: int = Field(0, ge=0, description="uniform: +/- range; normal: standard deviation")
    minimum: int = Field(1, ge=1)
    maximum: int | None = Field(None, ge=1)


WorkloadKind = Literal["random", "shared_prefix", "multi_turn", "long_context", "code", "sharegpt", "jsonl"]


class WorkloadConfig(StrictModel):
    kind: WorkloadKind = "random"
    seed: int = 0
    num_requests: int = Field(64, ge=1)
    input_len: LengthSpec = Field(default_factory=lambda: LengthSpec(mean=128))
    output_len: LengthSpec = Field(default_factory=lambda: LengthSpec(mean=64))
    shared_prefix_tokens: int = Field(0, ge=0)
    shared_prefix_fraction: float = Field(1.0, ge=0, le=1)
    turns: int = Field(1, ge=1)
    dataset_path: str | None = None
    api: Literal["completions", "chat"] = "completions"
    ignore_eos: bool = True


LoadPattern = Literal["closed", "constant", "poisson", "gamma", "ramp", "sweep"]


class LoadConfig(StrictModel):
    pattern: LoadPattern = "closed"
    concurrency: int = Field(4, ge=1)
    rate_rps: float | None = Field(None, gt=0)
    burstiness: float = Field(1.0, gt=0)
    levels: list[float] = Field(default_factory=list)
    duration_s: float | None = Field(None, gt=0)
    max_requests: int | None = Field(None, ge=1)
    warmup_requests: int = Field(0, ge=0)
    max_error_fraction: float = Field(0.5, ge=0, le=1)
    request_timeout_s: float = Field(300.0, gt=0)
    slo: str | None = Field(None, description="Goodput SLOs, e.g. 'ttft_ms<=500,tpot_ms<=50'")
