"""The run configuration: one typed model for everything a run needs.

Engine and features come from ``engine_adapters.config`` (adapters must not import ``app``);
workload and load are the client side, defined in ``app.workload``.
"""

from __future__ import annotations

from pydantic import Field

from app.ladder.spec import LadderSpec
from app.workload import LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, StrictModel


class RunConfig(StrictModel):
    """A complete, reproducible description of one run (what a profile file holds)."""

    name: str = "untitled"
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    features: Features = Field(default_factory=Features)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    ladder: LadderSpec | None = Field(None, description="An acceleration ladder over this configuration "
                                                        "(``tunebench ladder``; app.ladder.spec).")
