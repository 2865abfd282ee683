"""A profile's ``[quality]`` table: the probe's prompts, output length, top-k and reference, and
the lm-eval tasks (one table for every quality figure a run carries)."""

from __future__ import annotations

from pydantic import Field, field_validator

from engine_adapters.config import DEMO_MODEL, StrictModel

WHOLE_VOCABULARY = -1
"""``top_logprobs = -1``: every token's logprob, so KL is exact (vLLM is then started with
``--max-logprobs -1``; worth it only for a small vocabulary, like the demo model's 512)."""
DEFAULT_TOP_LOGPROBS = 20
"""vLLM's own cap unless it is started with a larger ``--max-logprobs``."""
MAX_PROMPTS = 10_000
MAX_OUTPUT_TOKENS = 4096


class QualityConfig(StrictModel):
    """Present in a profile, the quality probe runs after the timed load (never during it)."""

    enabled: bool = Field(True, description="false: no probe, also where a ladder or a tune would turn it on.")
    prompts: int | str = Field(8, description="How many prompts of the fixed built-in set, or a file of prompts "
                                              "(one per line; blank lines ignored).")
    output_tokens: int = Field(16, ge=1, le=MAX_OUTPUT_TOKENS, description="Greedy tokens generated per prompt.")
    top_logprobs: int | None = Field(None, ge=WHOLE_VOCABULARY, le=100_000,
                                     description="Logprobs per position (-1 = the whole vocabulary: exact KL); "
                                                 "unset: the whole vocabulary for the demo model (512 tokens), "
                                                 f"else {DEFAULT_TOP_LOGPROBS}.")
    batch: int = Field(1, ge=1, le=1024, description="Prompts in flight at once while the probe runs.")
    reference: str | None = Field(None, description="The stored run (id or uid) whose outputs are the reference; "
                                                    "none: this run is measured against itself (the control).")
    tasks: list[str] = Field(default_factory=list, description="lm-evaluation-harness tasks to score.")

    @field_validator("prompts")
    @classmethod
    def _check_prompts(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_PROMPTS:
            raise ValueError(f"prompts must be a count from 1 to {MAX_PROMPTS}, or a file")
        if isinstance(value, str) and not value.strip():
            raise ValueError("prompts must name a file (or be a count)")
        return value

    def top_logprobs_for(self, model: str) -> int:
        """The top-k asked of the engine for ``model``: the whole vocabulary of the demo model."""
        if self.top_logprobs is not None:
            return self.top_logprobs
        return WHOLE_VOCABULARY if model == DEMO_MODEL else DEFAULT_TOP_LOGPROBS

    @field_validator("top_logprobs")
    @classmethod
    def _check_top(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("top_logprobs must be at least 1 (or -1 for the whole vocabulary)")
        return value

    @field_validator("reference")
    @classmethod
    def _check_reference(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("reference must be a run id or uid (or left out)")
        return value
