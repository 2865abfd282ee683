"""Disaggregated prefill/decode from the ceilings: for a target (model, GPU, SLO, prompt and
output lengths), what one prefill engine and one decode engine can each sustain, the P:D ratio
that balances them, and the pool sizes a cluster of N GPUs splits into. Capacity and cost count
both pools' GPUs.

- A prefill engine is compute-bound: it prefills ``prefill_tok_per_s`` (the plan's ceiling on
  its GPUs), so it admits ``prefill_tok_per_s / (prompt x (1 - prefix reuse))`` requests/s, and a
  lone prompt's prefill time bounds the TTFT (no queueing: the best case).
- A decode engine is memory-bound: at batch B each step reads the weights once and every
  sequence's KV (``plan.step_bytes``), so its inter-token latency is ``B / ceiling(B)``. The
  largest B that meets the ITL target (and fits in KV memory) sets its tokens/s, and
  ``tokens/s / output`` its requests/s.
- The pools balance when prefill engines x their rate = decode engines x theirs; the split of N
  GPUs that serves the most requests/s is searched over whole engines.

KV transfer between the pools (NIXL) is not counted: it overlaps decode, and on NVLink or
RDMA it takes a small share of a step; the figures are ceilings, as the plan's are.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.config import RunConfig
from app.planner.arch import PlannerError
from app.planner.plan import Plan, decode_ceiling, make_plan
from app.workload import LengthSpec, WorkloadConfig
from engine_adapters.config import DisaggregationConfig, PdRole
from engine_adapters.disaggregation import pool_features


class PoolCeiling(BaseModel):
    """What one engine of a pool can sustain at its ceiling."""

    role: PdRole
    gpus_per_engine: int
    requests_per_s: float
    prefill_s: float | None = Field(None, description="Prefill: one prompt's time alone (TTFT's floor)")
    batch: int | None = Field(None, description="Decode: the largest batch within the ITL target")
    itl_ms: float | None = Field(None, description="Decode: inter-token latency at that batch")
    output_tok_per_s: float | None = Field(None, description="Decode: tokens/s of one engine at that batch")


class PdSplit(BaseModel):
    prefill_engines: int
    decode_engines: int
    gpus: int
    requests_per_s: float
    output_tok_per_s: float
    total_tok_per_s: float = Field(description="Prompt + output tokens per second")
    bound_by: PdRole = Field(description="The pool that limits the rate")

    @property
    def per_gpu_output_tok_per_s(self) -> float:
        return self.output_tok_per_s / self.gpus


class PdPlan(BaseModel):
    model: str
    gpu: str
    cluster_gpus: int
    prompt_tokens: int
    output_tokens: int
    prefix_reuse: float
    ttft_ms: float
    itl_ms: float
    prefill: PoolCeiling
    decode: PoolCeiling
    ratio: float = Field(description="Prefill engines per decode engine that balance the pools")
    best: PdSplit
    splits: list[PdSplit] = Field(default_factory=list, description="Every whole-engine split of the cluster")
    assumptions: list[str] = Field(default_factory=list)


def _pool_plan(config: RunConfig, role: PdRole, gpu: str, tp: int, acceptance_rate: float | None = None) -> Plan:
    """The plan of one engine of a pool: the configuration on that pool's tensor parallel GPUs."""
    features = pool_features(config.features.model_copy(update={"disaggregation": DisaggregationConfig(
        connector="nixl", prefill_tensor_parallel_size=tp, decode_tensor_parallel_size=tp)}), role)
    return make_plan(config.model_copy(update={"features": features}), gpu=gpu, gpus=tp, batches=[1],
                     acceptance_rate=acceptance_rate)


def _largest_batch(plan: Plan, itl_s: float) -> int:
    """The largest batch whose step keeps within ``itl_s`` and fits in KV memory (0: none)."""
    cap = max(plan.memory.max_concurrent_seqs, 0)
    low, high = 0, cap
    while low < high:  # ITL(B) = B / ceiling(B) grows with B
        mid = (low + high + 1) // 2
        if mid / decode_ceiling(plan, mid) <= itl_s:
            low = mid
        else:
            high = mid - 1
    return low


def plan_disaggregated(config: RunConfig, *, gpu: str, cluster_gpus: int, ttft_ms: float, itl_ms: float,
                       prompt_tokens: int, output_tokens: int, prefix_reuse: float = 0.0,
                       prefill_tp: int | None = None, decode_tp: int | None = None,
                       acceptance_rate: float | None = None) -> PdPlan:
    """The pools the ceilings imply for ``cluster_gpus`` GPUs under the SLO (``ttft_ms`` for a
    lone prompt's prefill, ``itl_ms`` per output token); each pool's tensor parallel size is the
    configuration's (or ``prefill_tp`` / ``decode_tp``)."""
    f = config.features
    tp_p = prefill_tp or f.pool_tensor_parallel_size("prefill")
    tp_d = decode_tp or f.pool_tensor_parallel_size("decode")
    if tp_p + tp_d > cluster_gpus:
        raise PlannerError(f"a prefill engine ({tp_p} GPUs) and a decode engine ({tp_d} GPUs) need {tp_p + tp_d} GPUs; "
                           f"the cluster has {cluster_gpus}")
    workload = WorkloadConfig(input_len=LengthSpec(mean=prompt_tokens), output_len=LengthSpec(mean=output_tokens))
    config = config.model_copy(update={"workload": workload})
    prefill_plan = _pool_plan(config, "prefill", gpu, tp_p)
    if not prefill_plan.prefill_tok_per_s:
        raise PlannerError(f"{gpu} has no published FLOPs: no prefill ceiling, so no P:D ratio")
    computed = prompt_tokens * (1.0 - prefix_reuse)
    prefill = PoolCeiling(role="prefill", gpus_per_engine=tp_p,
                          requests_per_s=prefill_plan.prefill_tok_per_s / computed,
                          prefill_s=computed / prefill_plan.prefill_tok_per_s)
    decode_plan = _pool_plan(config, "decode", gpu, tp_d, acceptance_rate)
    batch = _largest_batch(decode_plan, itl_ms / 1000.0)
    if batch == 0:
        raise PlannerError(f"no batch meets an ITL of {itl_ms:g} ms on {tp_d} x {gpu}: even one sequence takes "
                           f"{1000.0 / decode_ceiling(decode_plan, 1):.1f} ms per token")
    decode_tok_s = decode_ceiling(decode_plan, batch)
    decode = PoolCeiling(role="decode", gpus_per_engine=tp_d, requests_per_s=decode_tok_s / output_tokens,
                         batch=batch, itl_ms=1000.0 * batch / decode_tok_s, output_tok_per_s=decode_tok_s)
    splits = []
    for n_prefill in range(1, cluster_gpus // tp_p + 1):
        n_decode = (cluster_gpus - n_prefill * tp_p) // tp_d
        if n_decode < 1:
            break
        p_rate, d_rate = n_prefill * prefill.requests_per_s, n_decode * decode.requests_per_s
        rate = min(p_rate, d_rate)
        splits.append(PdSplit(prefill_engines=n_prefill, decode_engines=n_decode,
                              gpus=n_prefill * tp_p + n_decode * tp_d, requests_per_s=rate,
                              output_tok_per_s=rate * output_tokens, total_tok_per_s=rate * (prompt_tokens + output_tokens),
                              bound_by="prefill" if p_rate < d_rate else "decode"))
    best = max(splits, key=lambda s: (s.requests_per_s, -s.gpus))
    ttft_note = ("meets" if 1000.0 * (prefill.prefill_s or 0.0) <= ttft_ms else "MISSES")
    assumptions = [
        f"prefill: {prefill_plan.prefill_tok_per_s:,.0f} tok/s per engine of {tp_p} x {gpu} (compute ceiling); a lone "
        f"{prompt_tokens:,}-token prompt{f' ({prefix_reuse:.0%} from the prefix cache)' if prefix_reuse else ''} takes "
        f"{1000.0 * (prefill.prefill_s or 0.0):,.0f} ms, which {ttft_note} the {ttft_ms:g} ms TTFT target (queueing "
        "not counted)",
        f"decode: the largest batch within {itl_ms:g} ms per token on {tp_d} x {gpu} is {batch} "
        f"(KV memory holds {decode_plan.memory.max_concurrent_seqs}), {decode_tok_s:,.0f} output tok/s per engine",
        "KV transfer between the pools is not counted (it overlaps decode)",
        *decode_plan.assumptions[2:5]]
    return PdPlan(model=config.engine.model, gpu=gpu, cluster_gpus=cluster_gpus, prompt_tokens=prompt_tokens,
                  output_tokens=output_tokens, prefix_reuse=prefix_reuse, ttft_ms=ttft_ms, itl_ms=itl_ms,
                  prefill=prefill, decode=decode, ratio=decode.requests_per_s / prefill.requests_per_s,
                  best=best, splits=splits, assumptions=assumptions)
