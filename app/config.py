"""The run configuration: one typed model for everything a run needs.

Engine and features come from ``engine_adapters.config`` (adapters must not import ``app``);
workload and load are the client side, defined in ``app.workload``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from app.errors import UserError
from app.money import check_price
from app.quality.config import QualityConfig
from app.workload import LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, StrictModel


class RunConfig(StrictModel):
    """A complete, reproducible description of one run (a profile file holds one, and may add
    campaigns over it: ``app.profiles.Profile``)."""

    name: str = "untitled"
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    features: Features = Field(default_factory=Features)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    quality: QualityConfig | None = Field(None, description=(
        "The quality probe after the timed load: agreement and KL divergence against a reference, and "
        "lm-eval tasks (app.quality); absent: no probe, unless a ladder or a tune turns it on."))
    prices: dict[str, float] = Field(default_factory=dict, description=(
        "Your price per GPU-hour by GPU name (H100 = 2.49), or per core-hour (cpu = 0.05), over the "
        "shipped list: the costs of this profile's runs use them; --price on a command wins (app.cost)."))

    @field_validator("prices", mode="before")
    @classmethod
    def _check_prices(cls, value: Any) -> Any:
        """Every price checked as ``--price`` checks it, in the same words."""
        if not isinstance(value, dict):
            return value  # pydantic says what it expected
        out = {}
        for name, usd in value.items():
            if not str(name).strip():
                raise ValueError("a price needs a GPU name (e.g. H100 = 2.49)")
            try:
                out[name] = check_price(usd, f"price of {name}")
            except UserError as exc:
                raise ValueError(str(exc)) from None
        return out

    @model_validator(mode="after")
    def _trace_arrivals_need_a_trace(self) -> RunConfig:
        if self.load.pattern.replays_trace and self.workload.kind != "trace":
            raise ValueError(f"load pattern '{self.load.pattern}' sends at a trace's arrival times: it needs workload "
                             "kind 'trace'")
        return self
