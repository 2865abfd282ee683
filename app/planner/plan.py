"""The physics before launch: how the model and its KV cache fit in memory, and the fastest the
hardware can possibly decode and prefill. Decode is memory-bound: every step reads the weights
once for the whole batch, plus each sequence's KV cache, so

    decode output tok/s <= B x BW / (weight bytes read per step + B x KV bytes per sequence)

summed over the devices. A mixture-of-experts model reads its attention, dense layers and shared
experts once per step, but only the routed experts its batch touches (``moe_step``): one token's
top-k at batch 1, tending to all of them as the batch grows. Every assumption the figures rest on
is listed in ``Plan.assumptions``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.config import RunConfig
from app.planner.arch import ModelArch, PlannerError, load_arch
from engine_adapters.config import GGUF_WEIGHT_BITS
from engine_adapters.gpu_specs import GIB, GpuSpec, find_gpu_spec
from engine_adapters.hardware import probe_hardware
from engine_adapters.runtimes import MANAGED_RUNTIMES, is_cpu_build

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
GPU_RESERVE_BYTES = 2 * GIB
"""Per GPU, for activations, CUDA graphs and the CUDA context: vLLM measures this in its profile
run; the plan assumes a fixed amount."""
INT4_BYTES_PER_PARAM = 0.5 + 2.5 / 128
"""AWQ/GPTQ: 4 bits per weight plus, per group of 128, an fp16 scale and a 4-bit zero point."""
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CEILING_TOLERANCE = 1.05
"""A measurement above its ceiling by more than this is a bug in the plan or the measurement."""


class Hardware(BaseModel):
    """What the plan runs on: one kind of device, ``count`` of them."""

    kind: Literal["gpu", "cpu"]
    name: str
    count: int = 1
    memory_bytes: int = Field(description="Per device")
    bandwidth_bytes_per_s: float = Field(description="Per device")
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    source: str = ""


class MemoryPlan(BaseModel):
    weights_bytes: float
    weights_bytes_per_device: float
    kv_bytes_per_token: float = Field(description="All layers, whole model")
    kv_bytes_per_token_per_device: float
    state_bytes_per_seq: float = 0.0
    kv_pool_bytes_per_device: float
    kv_tokens: int = Field(description="Tokens the KV pool holds (per replica)")
    context_tokens: int = Field(description="Longest context of one sequence in the workload")
    mean_decode_context_tokens: float = Field(description="Mean context while a sequence decodes (KV read per step)")
    max_concurrent_seqs: int
    fits: bool


class CeilingRow(BaseModel):
    batch: int
    decode_output_tok_per_s: float
    decode_output_tok_per_s_per_device: float
    step_bytes: float
    arithmetic_intensity_flop_per_byte: float


class MoeStep(BaseModel):
    """What one decode step of a MoE reads and sends at ``batch`` tokens, under uniform independent
    routing (``ROUTING_ASSUMPTION``)."""

    batch: float
    experts_touched_per_layer: float = Field(description="Expected distinct routed experts a MoE layer runs")
    shared_bytes: float = Field(description="Attention, dense layers, shared experts, routers, head: read once")
    routed_bytes: float = Field(description="The routed experts the batch touches, over all devices")
    routed_bytes_per_device: float = Field(description="Expert parallelism over N devices: routed / N (N = 1: sliced by TP)")
    all_to_all_bytes: float = Field(description="Dispatch + combine activations over all MoE layers (0 without EP)")

    @property
    def weight_bytes(self) -> float:
        return self.shared_bytes + self.routed_bytes


class MoePlan(BaseModel):
    experts: int
    experts_per_token: int
    shared_experts: int
    moe_layers: int
    params_total: int
    params_active: int
    expert_parallel: int = Field(1, description="Devices the routed experts are spread over (1: sliced by TP)")
    routing: str = Field(description="How tokens are assumed to pick their experts")
    steps: list[MoeStep] = Field(default_factory=list, description="One per ceiling row, at a replica's batch")


class Plan(BaseModel):
    model: str
    arch: ModelArch
    hardware: Hardware
    weights_dtype: str
    weight_bytes_per_param: float
    kv_dtype: str
    kv_dtype_bytes: float
    memory: MemoryPlan
    ceilings: list[CeilingRow]
    acceptance_length: float = 1.0
    replicas: int = 1
    """Data-parallel replicas: each holds the whole model on ``hardware.count / replicas`` devices
    and decodes its share of the batch, reading the weights once per step for that share."""
    prefill_tok_per_s: float | None = None
    moe: MoePlan | None = None
    assumptions: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def ceiling_at(self, batch: float) -> float:
        """Decode output tok/s ceiling (all devices) at a batch of ``batch`` sequences."""
        return decode_ceiling(self, batch)


# --- hardware -----------------------------------------------------------------------------------

def gpu_hardware(spec: GpuSpec, count: int) -> Hardware:
    return Hardware(kind="gpu", name=spec.name, count=count, memory_bytes=spec.memory_bytes,
                    bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s, bf16_tflops=spec.bf16_dense_tflops,
                    fp8_tflops=spec.fp8_dense_tflops, source=spec.source)


def cpu_hardware(config: RunConfig) -> Hardware:
    from app.planner.host import host_bandwidth_bytes_per_s

    bandwidth, source = host_bandwidth_bytes_per_s()
    hw = probe_hardware()
    return Hardware(kind="cpu", name=hw.cpu_model or "CPU", memory_bytes=hw.ram_total_bytes,
                    bandwidth_bytes_per_s=bandwidth, source=source)


def resolve_hardware(config: RunConfig, gpu: str | None, gpus: int | None) -> Hardware:
    """``--gpu NAME`` from the spec table; else this machine's GPU; else, for a CPU runtime, the host."""
    count = gpus or config.features.gpu_count
    if gpu:
        spec = find_gpu_spec(gpu)
        if spec is None:
            from engine_adapters.gpu_specs import GPU_SPECS

            raise PlannerError(f"unknown GPU '{gpu}': known are {', '.join(s.name for s in GPU_SPECS)}")
        return gpu_hardware(spec, count)
    local = probe_hardware()
    if local.gpus:
        spec = find_gpu_spec(local.gpus[0].name)
        if spec is None:
            raise PlannerError(f"GPU '{local.gpus[0].name}' is not in the spec table: pass --gpu with a known card")
        return gpu_hardware(spec, count)
    if is_cpu_build(config.engine.runtime):
        return cpu_hardware(config)
    raise PlannerError("this machine has no NVIDIA GPU and the profile is not for a CPU engine: pass --gpu NAME "
                       "(for example --gpu H100) to plan for a GPU")


def _cpu_kv_space_bytes(config: RunConfig) -> float:
    runtime = config.engine.runtime
    env = dict(MANAGED_RUNTIMES[runtime.managed].env) if runtime.kind == "managed" and \
        runtime.managed in MANAGED_RUNTIMES else {}
    env.update(runtime.env)
    try:
        return float(env.get(CPU_KV_SPACE_ENV, "4")) * GIB
    except ValueError:
        raise PlannerError(f"{CPU_KV_SPACE_ENV}={env.get(CPU_KV_SPACE_ENV)!r} is not a number of GiB") from None


# --- bytes --------------------------------------------------------------------------------------

def _is_fp8_checkpoint(model: str) -> bool:
    return "fp8" in model.lower()


def weight_precision(config: RunConfig) -> tuple[str, float]:
    dtype = config.features.weights_dtype
    if dtype == "auto":
        dtype = "fp8" if _is_fp8_checkpoint(config.engine.model) else "bf16"
    if dtype == "fp8":
        return "fp8", 1.0
    if dtype in ("awq", "gptq"):
        return dtype, INT4_BYTES_PER_PARAM
    if dtype in GGUF_WEIGHT_BITS:  # llama.cpp's block types: the bits include each block's scale
        return dtype, GGUF_WEIGHT_BITS[dtype] / 8
    return dtype, 2.0


def kv_precision(config: RunConfig) -> tuple[str, float]:
    dtype = config.features.kv_cache_dtype
    return ("fp8", 1.0) if dtype.startswith("fp8") else ("bf16", 2.0)


def weight_bytes(arch: ModelArch, bytes_per_param: float) -> tuple[float, float]:
    """(bytes held, bytes read per decode step at batch 1). Quantised checkpoints keep the
    embedding and the output head in BF16 (as vLLM's FP8 and AWQ checkpoints do); the embedding
    table is not read whole per step, only the batch's rows."""
    body = arch.params_total - arch.params_embedding - arch.params_lm_head
    head_bytes_per_param = 2.0
    held = body * bytes_per_param + (arch.params_embedding + arch.params_lm_head) * head_bytes_per_param
    active_body = arch.params_active - arch.params_embedding - arch.params_lm_head
    read = active_body * bytes_per_param + arch.params_lm_head * head_bytes_per_param
    if arch.tie_embeddings:  # the tied table is read whole as the output head
        read += arch.params_embedding * head_bytes_per_param
    return held, read


ROUTING_RULE = ("uniform and independent: each token picks its top-k of a layer's E routed experts at random, so a "
                "batch of B tokens touches E x (1 - (1 - k/E)^B) experts per layer in expectation (k at B = 1, all E as "
                "B grows)")
ROUTING_ASSUMPTION = (
    f"MoE routing assumed {ROUTING_RULE}; attention, dense layers, shared experts and the head are read once per "
    "step. Uniform routing touches the most distinct experts (skewed or correlated routing touches fewer), so the "
    "weight bytes are an upper estimate; with expert parallelism an uneven load makes the busiest device the limit")
ACTIVATION_BYTES = 2.0
"""Bytes of one hidden-state element sent between devices by expert parallelism (BF16)."""


def expected_experts_touched(experts: int, top_k: int, batch: float) -> float:
    """Distinct experts of one layer that ``batch`` tokens route to, in expectation, when each
    token picks ``top_k`` of ``experts`` uniformly and independently: each expert is missed by
    one token with probability 1 - k/E, so by all B of them with probability (1 - k/E)^B."""
    if not experts or not top_k:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** max(1.0, batch))


def moe_step(arch: ModelArch, bytes_per_param: float, batch: float, expert_parallel: int = 1) -> MoeStep:
    """The bytes one decode step of ``batch`` tokens reads, split into what every step reads once
    (all but the routed experts) and the routed experts the batch touches; with expert parallelism
    over N devices each holds E/N experts of a layer and reads its share (routed / N), and every MoE
    layer sends each token's hidden state to its k experts and back: 2 x B x k x hidden x
    ``ACTIVATION_BYTES`` (counting every token-expert pair as crossing devices: an upper estimate,
    1/N of them stay local)."""
    _, read_b1 = weight_bytes(arch, bytes_per_param)
    routed_b1 = arch.params_routed_active * bytes_per_param
    touched = expected_experts_touched(arch.num_experts, arch.num_experts_per_token, batch)
    routed = arch.moe_layers * touched * arch.params_per_expert * bytes_per_param
    tokens = max(1.0, batch)
    all_to_all = (2.0 * tokens * arch.num_experts_per_token * arch.hidden_size * ACTIVATION_BYTES * arch.moe_layers
                  if expert_parallel > 1 else 0.0)
    return MoeStep(batch=batch, experts_touched_per_layer=touched, shared_bytes=read_b1 - routed_b1,
                   routed_bytes=routed, routed_bytes_per_device=routed / expert_parallel,
                   all_to_all_bytes=all_to_all)


def _step_weight_bytes(arch: ModelArch, read_b1: float, bytes_per_param: float, batch: float) -> float:
    """Weights one decode step reads: a dense model's once for the whole batch; a MoE's shared part
    once and the routed experts its batch touches (``moe_step``)."""
    if not arch.num_experts:
        return read_b1
    return moe_step(arch, bytes_per_param, batch).weight_bytes


def context_tokens(config: RunConfig) -> tuple[int, float]:
    """(longest context of a sequence, mean context during its decode) for the workload."""
    w = config.workload
    prompt = w.input_len.mean + w.shared_prefix_tokens
    turns = w.turns if w.kind == "multi_turn" else 1
    longest = turns * (prompt + w.output_len.mean)
    mean_decode = (turns - 1) * (prompt + w.output_len.mean) + prompt + w.output_len.mean / 2
    if config.features.max_model_len:
        longest = min(longest, config.features.max_model_len)
    return int(longest), float(mean_decode)


def acceptance_length(config: RunConfig, acceptance_rate: float | None) -> tuple[float, str | None]:
    spec = config.features.speculative
    if spec.method == "off":
        return 1.0, None
    rate = 0.7 if acceptance_rate is None else acceptance_rate
    k = spec.num_speculative_tokens
    length = sum(rate**i for i in range(k + 1))
    return length, (f"speculative decoding ({spec.method}, {k} draft tokens): each step yields up to "
                    f"1 + p + ... + p^{k} = {length:.2f} tokens at an acceptance rate p = {rate:.0%}"
                    f"{' (assumed; pass --acceptance to use a measured one)' if acceptance_rate is None else ''}; "
                    f"the drafter's own cost is not counted")


# --- the plan -----------------------------------------------------------------------------------

def decode_flop_per_token(arch: ModelArch) -> float:
    """FLOPs to decode one token: 2 x the active parameters that take part in matrix products
    (the embedding is a row lookup, not a product). Attention over the context is left out."""
    return 2.0 * (arch.params_active - arch.params_embedding)


def decode_ceiling(plan: Plan, batch: float) -> float:
    """Output tok/s ceiling over all devices for ``batch`` sequences decoding at once: each of the
    data-parallel replicas decodes ``batch / replicas`` on its share of the devices (throughput x
    replicas of one replica's ceiling at its share)."""
    share = batch / plan.replicas
    return share * plan.hardware.count * plan.hardware.bandwidth_bytes_per_s / step_bytes(plan, share) \
        * plan.acceptance_length


def step_bytes(plan: Plan, batch: float) -> float:
    """Bytes one decode step moves: the weights it reads, plus each sequence's KV (and fixed state)."""
    _, read_b1 = weight_bytes(plan.arch, plan.weight_bytes_per_param)
    m = plan.memory
    per_seq = m.kv_bytes_per_token * m.mean_decode_context_tokens + 2 * m.state_bytes_per_seq
    return _step_weight_bytes(plan.arch, read_b1, plan.weight_bytes_per_param, batch) + batch * per_seq


def make_plan(config: RunConfig, *, gpu: str | None = None, gpus: int | None = None,
              batches: list[int] | None = None, acceptance_rate: float | None = None,
              hardware: Hardware | None = None, expert_parallel: bool = False) -> Plan:
    """``expert_parallel``: a MoE's routed experts are spread whole over a replica's TP x PP devices
    (E/N experts each) instead of sliced by tensor parallelism; memory and the bytes read over all
    devices stay the same, each device reads its share and the MoE layers add an all-to-all."""
    arch = load_arch(config.engine.model)
    hw = hardware or resolve_hardware(config, gpu, gpus)
    f = config.features
    if expert_parallel and not arch.num_experts:
        raise PlannerError(f"expert parallelism needs a mixture-of-experts model; {config.engine.model} is dense")
    wdtype, bpp = weight_precision(config)
    kvdtype, kvb = kv_precision(config)
    assumptions: list[str] = [
        f"architecture: {arch.source}" + ("" if arch.params_exact else "; parameters counted from the config"),
        f"hardware: {hw.name} x{hw.count}: {hw.bandwidth_bytes_per_s / 1e12:.3g} TB/s per device ({hw.source})",
        f"weights {wdtype}: {bpp:.3g} bytes per parameter; the embedding and output head stay BF16 "
        "(as in vLLM's quantised checkpoints); only the batch's embedding rows are read per step",
        f"KV cache {kvdtype}: {kvb:g} byte(s) per element",
        "decode reads the weights once per step for the whole batch, plus each sequence's KV cache; "
        "compute, communication and kernel overheads are ignored, so real engines stay below the ceiling",
    ]
    warnings: list[str] = []
    if wdtype == "fp8" and hw.kind == "gpu" and hw.fp8_tflops is None:
        warnings.append(f"{hw.name} has no FP8 tensor cores: FP8 weights run through a slower fallback, if at all")
    held, read_b1 = weight_bytes(arch, bpp)
    devices = hw.count
    tp, pp, dp = f.tensor_parallel_size, f.pipeline_parallel_size, f.data_parallel_size
    kv_token = arch.kv_bytes_per_token(kvb)
    kv_head_share = max(arch.num_kv_heads / tp, 1) / arch.num_kv_heads if arch.num_kv_heads else 1 / tp
    if arch.kv_lora_rank:  # MLA: the one compressed latent per token is not split by heads, every TP rank keeps it
        kv_head_share = 1.0
    kv_token_device = kv_token * kv_head_share / pp
    state_device = arch.linear_state_bytes_per_seq / (tp * pp)
    longest, mean_ctx = context_tokens(config)
    weights_device = held / (tp * pp)
    if hw.kind == "gpu":
        util = f.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        pool = hw.memory_bytes * util - weights_device - GPU_RESERVE_BYTES
        assumptions.append(f"KV pool per GPU = {hw.memory_bytes / GIB:.0f} GiB x {util:g} utilisation - weights - "
                           f"{GPU_RESERVE_BYTES / GIB:.0f} GiB for activations, CUDA graphs and the context")
        fits = pool > 0
        if not fits:
            warnings.append(f"the model does not fit: {weights_device / 1e9:.1f} GB of {wdtype} weights per GPU "
                            f"against {hw.memory_bytes * util / 1e9:.1f} GB usable "
                            f"({hw.memory_bytes / GIB:.0f} GiB x {util:g}); use FP8/INT4 weights or more GPUs")
    else:
        pool = _cpu_kv_space_bytes(config)
        assumptions.append(f"KV pool = {CPU_KV_SPACE_ENV} = {pool / GIB:g} GiB (vLLM's CPU build reserves exactly "
                           "this much)")
        fits = weights_device + pool < hw.memory_bytes
        if not fits:
            warnings.append(f"weights ({weights_device / 1e9:.1f} GB) and the KV space ({pool / 1e9:.1f} GB) exceed "
                            f"this machine's {hw.memory_bytes / 1e9:.1f} GB of RAM")
    pool = max(pool, 0.0)
    kv_tokens = int(pool // kv_token_device) if kv_token_device else 0
    per_seq_bytes = longest * kv_token_device + state_device
    max_seqs = int(pool // per_seq_bytes) * dp if per_seq_bytes else 0  # every replica holds its own
    load = config.load
    if fits and load.closed_loop:
        wanted = load.peak_concurrency
        if wanted > max_seqs:
            warnings.append(f"concurrency {wanted} cannot be held in KV memory: {max_seqs} sequences of "
                            f"{longest:,} tokens fit in {pool / GIB:.1f} GiB per device"
                            + (f" across {dp} data-parallel replicas" if dp > 1 else "")
                            + ("; an FP8 KV cache would hold twice as many" if kvb > 1 else ""))
    if f.max_model_len and kv_tokens and f.max_model_len > kv_tokens:
        warnings.append(f"max_model_len {f.max_model_len:,} exceeds the {kv_tokens:,} tokens the KV pool holds")
    memory = MemoryPlan(weights_bytes=held, weights_bytes_per_device=weights_device, kv_bytes_per_token=kv_token,
                        kv_bytes_per_token_per_device=kv_token_device, state_bytes_per_seq=arch.linear_state_bytes_per_seq,
                        kv_pool_bytes_per_device=pool, kv_tokens=kv_tokens, context_tokens=longest,
                        mean_decode_context_tokens=mean_ctx, max_concurrent_seqs=max_seqs, fits=fits)
    if dp > 1:
        assumptions.append(f"{dp} data-parallel replicas, each with the whole model on {tp * pp} device(s): memory "
                           "is per device as for one replica; the batch is shared evenly between replicas")
    accept, accept_note = acceptance_length(config, acceptance_rate)
    if accept_note:
        assumptions.append(accept_note)
    assumptions.append(f"KV read per sequence per step at the workload's mean decode context, {mean_ctx:,.0f} tokens")
    if arch.linear_state_bytes_per_seq:
        assumptions.append("hybrid layers: each sequence's fixed state is read and written every step")
    plan = Plan(model=config.engine.model, arch=arch, hardware=hw, weights_dtype=wdtype, weight_bytes_per_param=bpp,
                kv_dtype=kvdtype, kv_dtype_bytes=kvb, memory=memory, ceilings=[], acceptance_length=accept, replicas=dp,
                assumptions=assumptions, warnings=warnings)
    batch_list = batches or sorted({1, 8, 32, 64, config.load.concurrency, *[int(v) for v in config.load.levels
                                                                             if config.load.sweep_of == "concurrency"]})
    flops_per_token = decode_flop_per_token(arch)
    if arch.num_experts:
        ep = tp * pp if expert_parallel else 1
        plan.moe = MoePlan(experts=arch.num_experts, experts_per_token=arch.num_experts_per_token,
                           shared_experts=arch.num_shared_experts, moe_layers=arch.moe_layers,
                           params_total=arch.params_total, params_active=arch.params_active, expert_parallel=ep,
                           routing=ROUTING_RULE,
                           steps=[moe_step(arch, bpp, b / dp, ep) for b in batch_list])
        plan.assumptions.append(ROUTING_ASSUMPTION)
        if ep > 1:
            plan.assumptions.append(
                f"expert parallelism over {ep} devices: each holds {arch.num_experts / ep:g} routed experts per MoE "
                f"layer and reads its share; each MoE layer sends about 2 x B x k x hidden x {ACTIVATION_BYTES:g} "
                "bytes per step (dispatch + combine), not counted in the ceiling")
    for b in batch_list:
        step = step_bytes(plan, b / dp)  # one replica's step, at its share of the batch
        total = decode_ceiling(plan, b)
        plan.ceilings.append(CeilingRow(batch=b, decode_output_tok_per_s=total,
                                        decode_output_tok_per_s_per_device=total / devices, step_bytes=step,
                                        arithmetic_intensity_flop_per_byte=b / dp * accept * flops_per_token / step))
    tflops = (hw.fp8_tflops if wdtype == "fp8" and hw.fp8_tflops else hw.bf16_tflops)
    if tflops:
        prompt = config.workload.input_len.mean + config.workload.shared_prefix_tokens
        attn = 2.0 * arch.kv_layers * arch.num_heads * arch.head_dim * prompt
        plan.prefill_tok_per_s = devices * tflops * 1e12 / (flops_per_token + attn)
        plan.assumptions.append(f"prefill: {tflops:g} dense TFLOPs per device over 2 x active parameters + attention "
                           f"({prompt:,}-token prompts) FLOPs per token")
    else:
        plan.assumptions.append("prefill ceiling: not computed (no published FLOPs for this device)")
    return plan


def percent_of_ceiling(measured_tok_per_s: float, ceiling_tok_per_s: float) -> tuple[float, str | None]:
    """(fraction of the ceiling, a flag when the measurement is above it): above the physical limit
    is a bug in the plan or the measurement, never a record."""
    fraction = measured_tok_per_s / ceiling_tok_per_s if ceiling_tok_per_s > 0 else float("nan")
    if fraction > CEILING_TOLERANCE:
        return fraction, (f"measured {measured_tok_per_s:,.0f} tok/s is above the physical ceiling of "
                          f"{ceiling_tok_per_s:,.0f} tok/s: the plan's assumptions or the measurement are wrong")
    return fraction, None


def total_ceiling(plan: Plan, batch: float, prompt_tokens: float, output_tokens: float,
                  prefix_reuse: float = 0.0) -> float | None:
    """Input + output tok/s ceiling at ``batch``: each request's prompt is prefilled (compute-bound,
    less the share a prefix cache serves) and its output decoded (memory-bound) on the same devices,
    so the times add. None without a prefill ceiling."""
    if not plan.prefill_tok_per_s:
        return None
    prefill_s = prompt_tokens * (1.0 - prefix_reuse) / plan.prefill_tok_per_s
    decode_s = output_tokens / decode_ceiling(plan, batch)
    return (prompt_tokens + output_tokens) / (prefill_s + decode_s)


def kv_plan_check(config: RunConfig, engine_kv_tokens: float) -> str | None:
    """One line setting the engine's own KV size beside the plan's, with the plan's error; None
    when no plan can be made (an unknown model or card: the engine's figure stands alone)."""
    try:
        plan = make_plan(config, batches=[1])
    except PlannerError:
        return None
    planned = plan.memory.kv_tokens
    if not planned or not engine_kv_tokens:
        return None
    error = (planned - engine_kv_tokens) / engine_kv_tokens
    return f"KV cache planned {planned:,} tokens, engine reports {engine_kv_tokens:,.0f} (plan error {error:+.1%})"
