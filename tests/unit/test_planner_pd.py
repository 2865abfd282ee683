"""The P/D planner: each pool engine's ceiling from the plan's own physics (prefill compute,
decode memory under the ITL target), the P:D ratio that balances them, the whole-engine splits
of a cluster (both pools' GPUs counted), and the seeds' last row judged."""

from __future__ import annotations

import pytest

from app.config import RunConfig
from app.cost.deployment import run_deployment
from app.planner.arch import PlannerError
from app.planner.disaggregated import plan_disaggregated
from app.planner.plan import decode_ceiling, make_plan
from app.planner.seeds import (
    LAST_ROW_CLAIM_TOK_PER_S,
    LAST_ROW_GPUS,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    SEED_GPU,
    SEED_MODEL,
    judge_last_row,
)
from app.store import RunDetail
from app.workload import LengthSpec, WorkloadConfig
from engine_adapters.config import DisaggregationConfig, EngineConfig, Features, RuntimeConfig

ENGINE = EngineConfig(model=SEED_MODEL, runtime=RuntimeConfig(kind="executable", executable="vllm"))
FP8 = Features(weights_dtype="fp8", kv_cache_dtype="fp8")


def plan(itl_ms: float = 50.0, cluster: int = 32, tp: int = 8, reuse: float = 0.0):  # type: ignore[no-untyped-def]
    return plan_disaggregated(RunConfig(engine=ENGINE, features=FP8), gpu=SEED_GPU, cluster_gpus=cluster, ttft_ms=1000,
                              itl_ms=itl_ms, prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS,
                              prefix_reuse=reuse, prefill_tp=tp, decode_tp=tp)


def one_engine(tp: int):  # type: ignore[no-untyped-def]
    """The plain plan of one engine on ``tp`` cards at the workload's lengths (the oracle)."""
    workload = WorkloadConfig(input_len=LengthSpec(mean=PROMPT_TOKENS), output_len=LengthSpec(mean=OUTPUT_TOKENS))
    config = RunConfig(engine=ENGINE, features=FP8.model_copy(update={"tensor_parallel_size": tp}), workload=workload)
    return make_plan(config, gpu=SEED_GPU, gpus=tp, batches=[1])


def test_each_pool_engine_is_held_to_its_own_ceiling() -> None:
    p, oracle = plan(), one_engine(8)
    assert oracle.prefill_tok_per_s
    assert p.prefill.requests_per_s == pytest.approx(oracle.prefill_tok_per_s / PROMPT_TOKENS)
    assert p.prefill.requests_per_s * 2 == pytest.approx(plan(reuse=0.5).prefill.requests_per_s)  # half computed
    b = p.decode.batch
    assert b and b <= oracle.memory.max_concurrent_seqs
    assert p.decode.output_tok_per_s == pytest.approx(decode_ceiling(oracle, b))
    assert p.decode.requests_per_s == pytest.approx(decode_ceiling(oracle, b) / OUTPUT_TOKENS)


def test_a_tight_itl_target_shrinks_the_decode_batch_to_the_largest_that_meets_it() -> None:
    oracle = one_engine(8)
    itl_at_1_ms = 1000.0 / decode_ceiling(oracle, 1)
    target = itl_at_1_ms * 1.5
    p = plan(itl_ms=target)
    b = p.decode.batch
    assert b is not None and 1 < b < oracle.memory.max_concurrent_seqs
    assert 1000.0 * b / decode_ceiling(oracle, b) <= target < 1000.0 * (b + 1) / decode_ceiling(oracle, b + 1)
    with pytest.raises(PlannerError, match="no batch meets an ITL"):
        plan(itl_ms=itl_at_1_ms * 0.9)


def test_the_ratio_balances_the_pools_and_the_best_split_uses_the_cluster() -> None:
    p = plan()
    assert p.ratio == pytest.approx(p.decode.requests_per_s / p.prefill.requests_per_s)
    assert [(s.prefill_engines, s.decode_engines) for s in p.splits] == [(1, 3), (2, 2), (3, 1)]
    for s in p.splits:  # capacity counts both pools; the slower pool sets the rate
        assert s.gpus == 8 * (s.prefill_engines + s.decode_engines) <= 32
        rate = min(s.prefill_engines * p.prefill.requests_per_s, s.decode_engines * p.decode.requests_per_s)
        assert s.requests_per_s == pytest.approx(rate)
        assert s.output_tok_per_s == pytest.approx(rate * OUTPUT_TOKENS)
        assert s.per_gpu_output_tok_per_s == pytest.approx(s.output_tok_per_s / s.gpus)
    assert p.best.requests_per_s == max(s.requests_per_s for s in p.splits)
    single = plan(tp=1)  # whole engines of one card: the split lands near the ratio
    assert abs(single.best.prefill_engines / single.best.decode_engines - single.ratio) < 0.2


def test_pools_larger_than_the_cluster_are_one_line() -> None:
    with pytest.raises(PlannerError, match="need 16 GPUs; the cluster has 12"):
        plan(cluster=12)


def test_the_seeds_last_row_is_possible_only_as_prompt_plus_output_tokens() -> None:
    verdict = judge_last_row()
    best = verdict.plain.best
    assert best.gpus <= LAST_ROW_GPUS
    assert best.output_tok_per_s < LAST_ROW_CLAIM_TOK_PER_S <= best.total_tok_per_s
    assert verdict.stacked.best.output_tok_per_s < LAST_ROW_CLAIM_TOK_PER_S
    assert verdict.meaning.startswith("prompt + output tokens per second over the 32 cards")


def test_the_cost_of_a_measured_p_d_run_counts_both_pools() -> None:
    features = Features(tensor_parallel_size=4, disaggregation=DisaggregationConfig(
        connector="nixl", prefill_instances=2, decode_tensor_parallel_size=8))
    config = RunConfig(engine=ENGINE, features=features).model_dump(mode="json")
    run = RunDetail(id=7, uid="u7", name="r", status="completed", started_at=1.9e9, config=config,
                    hardware={"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 16})
    d = run_deployment(run)
    assert (d.units_per_replica, d.data_parallel, d.units_measured) == (16, 1, 16)
    assert d.counted == "disaggregated: prefill 2 x 4 + decode 1 x 8 = 16 GPUs"
