"""The seeds' stacking table (Qwen3.6-27B on one H800-class card), checked against the physics:
for each row, does the ceiling permit the claimed figure as *output* tokens, or only as *total*
(input + output) tokens? ``docs/planner.md`` shows the result (``python -m app.planner.seeds``)."""

from __future__ import annotations

from dataclasses import dataclass

from app.config import RunConfig
from app.planner.plan import make_plan, total_ceiling
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig, SpeculativeConfig

SEED_MODEL = "Qwen/Qwen3.6-27B-FP8"
SEED_GPU = "H800"
PROMPT_TOKENS = 1536  # a 1,024-token shared system prompt + 512 tokens of question, as the shipped profile
OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class StackRow:
    step: str
    claimed_tok_per_s: float
    features: Features
    concurrency: int
    prefix_reuse: float = 0.0


SEED_ROWS: tuple[StackRow, ...] = (
    StackRow("+ FP8 weights", 2_000, Features(weights_dtype="fp8"), 1),
    StackRow("+ continuous batching, paged KV (32 concurrent)", 20_000, Features(weights_dtype="fp8"), 32),
    StackRow("+ FP8 KV cache (64 concurrent)", 35_000, Features(weights_dtype="fp8", kv_cache_dtype="fp8"), 64),
    StackRow("+ prefix caching (50% reuse)", 45_000,
             Features(weights_dtype="fp8", kv_cache_dtype="fp8", prefix_caching=True), 64, 0.5),
    StackRow("+ EAGLE-3 (70% acceptance)", 60_000,
             Features(weights_dtype="fp8", kv_cache_dtype="fp8", prefix_caching=True,
                      speculative=SpeculativeConfig(method="eagle3", num_speculative_tokens=3)), 64, 0.5),
)


@dataclass(frozen=True)
class StackVerdict:
    row: StackRow
    output_ceiling_tok_per_s: float
    total_ceiling_tok_per_s: float
    verdict: str  # "output", "total only", "exceeds"


def check_stacking_table() -> list[StackVerdict]:
    verdicts = []
    for row in SEED_ROWS:
        config = RunConfig(
            engine=EngineConfig(model=SEED_MODEL, runtime=RuntimeConfig(kind="executable", executable="vllm")),
            features=row.features,
            workload=WorkloadConfig(input_len=LengthSpec(mean=PROMPT_TOKENS), output_len=LengthSpec(mean=OUTPUT_TOKENS)),
            load=LoadConfig(concurrency=row.concurrency))
        plan = make_plan(config, gpu=SEED_GPU, batches=[row.concurrency], acceptance_rate=0.7)
        output = plan.ceilings[0].decode_output_tok_per_s
        total = total_ceiling(plan, row.concurrency, PROMPT_TOKENS, OUTPUT_TOKENS, row.prefix_reuse) or 0.0
        verdict = "output" if row.claimed_tok_per_s <= output else \
            "total only" if row.claimed_tok_per_s <= total else "exceeds"
        verdicts.append(StackVerdict(row, output, total, verdict))
    return verdicts


def markdown_table() -> str:
    lines = ["| step | seeds' figure (tok/s) | output ceiling (tok/s) | input+output ceiling (tok/s) | permitted as |",
             "|---|---:|---:|---:|---|"]
    for v in check_stacking_table():
        lines.append(f"| {v.row.step} | {v.row.claimed_tok_per_s:,.0f} | {v.output_ceiling_tok_per_s:,.0f} | "
                     f"{v.total_ceiling_tok_per_s:,.0f} | {v.verdict} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
