"""The seeds' stacking table (Qwen3.6-27B on one H800-class card), checked against the physics:
for each row, does the ceiling permit the claimed figure as *output* tokens, or only as *total*
(input + output) tokens? ``docs/planner.md`` shows the result (``python -m app.planner.seeds``)."""

from __future__ import annotations

from dataclasses import dataclass

from app.config import RunConfig
from app.planner.disaggregated import PdPlan, plan_disaggregated
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


LAST_ROW_CLAIM_TOK_PER_S = 400_000
LAST_ROW_GPUS = 32
LAST_ROW_TP = 8  # "8-card TP": four engines of eight cards, split between the pools
LAST_ROW_TTFT_MS = 1000.0
LAST_ROW_ITL_MS = 50.0  # 20 tokens/s per user


@dataclass(frozen=True)
class LastRowVerdict:
    """The seeds' last row ("8-card TP + disaggregated deployment: 32 cards, 400,000+ tokens/s")
    against the P/D plan, with the stack's features (FP8 weights and KV) and, in ``stacked``, the
    rows above it too (50% prefix reuse, EAGLE-3 at 70% acceptance)."""

    plain: PdPlan
    stacked: PdPlan
    meaning: str


def judge_last_row() -> LastRowVerdict:
    engine = EngineConfig(model=SEED_MODEL, runtime=RuntimeConfig(kind="executable", executable="vllm"))
    plans = []
    for row in (SEED_ROWS[2], SEED_ROWS[-1]):
        plans.append(plan_disaggregated(
            RunConfig(engine=engine, features=row.features), gpu=SEED_GPU, cluster_gpus=LAST_ROW_GPUS,
            ttft_ms=LAST_ROW_TTFT_MS, itl_ms=LAST_ROW_ITL_MS, prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS,
            prefix_reuse=row.prefix_reuse, prefill_tp=LAST_ROW_TP, decode_tp=LAST_ROW_TP,
            acceptance_rate=0.7 if row.features.speculative.method != "off" else None))
    plain, stacked = plans
    claim = LAST_ROW_CLAIM_TOK_PER_S
    if claim <= plain.best.output_tok_per_s:
        meaning = "output tokens per second over the 32 cards"
    elif claim <= plain.best.total_tok_per_s:
        meaning = (f"prompt + output tokens per second over the 32 cards: as output alone it exceeds the ceiling "
                   f"({plain.best.output_tok_per_s:,.0f}"
                   + (f"; {stacked.best.output_tok_per_s:,.0f} with prefix caching and EAGLE-3)"
                      if claim > stacked.best.output_tok_per_s else ")"))
    else:
        meaning = "no reading: it exceeds even the input + output ceiling"
    return LastRowVerdict(plain, stacked, meaning)


def last_row_table() -> str:
    verdict = judge_last_row()
    lines = ["| stack | P:D engines (x 8 cards) | output tok/s | per card | input+output tok/s | bound by |",
             "|---|---|---:|---:|---:|---|"]
    for name, plan in (("FP8 weights + FP8 KV", verdict.plain), ("+ prefix cache 50%, EAGLE-3 70%", verdict.stacked)):
        for s in plan.splits:
            lines.append(f"| {name} | {s.prefill_engines}:{s.decode_engines} | {s.output_tok_per_s:,.0f} | "
                         f"{s.per_gpu_output_tok_per_s:,.0f} | {s.total_tok_per_s:,.0f} | {s.bound_by} |")
    return "\n".join(lines) + f"\n\n400,000+ can only mean {verdict.meaning}."


def markdown_table() -> str:
    lines = ["| step | seeds' figure (tok/s) | output ceiling (tok/s) | input+output ceiling (tok/s) | permitted as |",
             "|---|---:|---:|---:|---|"]
    for v in check_stacking_table():
        lines.append(f"| {v.row.step} | {v.row.claimed_tok_per_s:,.0f} | {v.output_ceiling_tok_per_s:,.0f} | "
                     f"{v.total_ceiling_tok_per_s:,.0f} | {v.verdict} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
    print()
    print(last_row_table())
