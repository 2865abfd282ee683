"""The feature catalogue: what each acceleration feature is, which family of the seeds'
taxonomy it belongs to, and why it speeds decoding up.

This is the one place where a feature's human description lives. The GUI builds its toggles
and tooltips from it, the exports and reports label features with it, and each adapter maps the
same keys (paths into :class:`engine_adapters.config.Features`) to its flags and verification.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from engine_adapters.config import Features


class Family(StrEnum):
    """The three families of acceleration from the seeds, plus the knobs that bound them."""

    MOVE_FEWER_BYTES = "Move fewer bytes"
    USE_IDLE_COMPUTE = "Use idle compute"
    MANAGE_KV_CACHE = "Manage the KV cache"
    SCALE_AND_LIMITS = "Scale out and limits"


class Capability(StrEnum):
    """What the hardware or the engine build must offer for a feature to work."""

    CUDA_GPU = "an NVIDIA GPU"
    FP8_COMPUTE = "a GPU with FP8 support (compute capability 8.9 or newer: Ada, Hopper, Blackwell)"
    FP8_KV_ON_CPU = "on a CPU engine, x86 with AVX-512 or AMX"
    MULTI_GPU = "as many visible GPUs as the parallel size"


FP8_CAPABILITIES = frozenset({Capability.FP8_COMPUTE, Capability.FP8_KV_ON_CPU})


@dataclass(frozen=True)
class FeatureInfo:
    """Human description of one feature (one field path in ``Features``)."""

    key: str
    label: str
    family: Family
    explanation: str
    attacks: str
    requires: tuple[Capability, ...] = ()
    engines: tuple[str, ...] = ()
    """The engines (kinds) that offer it; empty: every engine tunebench launches. Each adapter's
    ``validate`` refuses a feature it lacks, with its reason, so the GUI greys the toggle."""

    def requires_for(self, value: object) -> tuple[Capability, ...]:
        """What the hardware must offer for this feature at ``value``: an FP8 capability only
        for an FP8 value (llama.cpp's Q8_0 weights need no FP8 GPU)."""
        fp8 = "fp8" in str(value)
        return tuple(cap for cap in self.requires if fp8 or cap not in FP8_CAPABILITIES)

    @property
    def noun(self) -> str:
        """The label inside a sentence: "GPU layers", "flash attention"."""
        return self.label if self.label[:2].isupper() else self.label[:1].lower() + self.label[1:]


FEATURES: tuple[FeatureInfo, ...] = (
    FeatureInfo(
        "weights_dtype", "Weight precision", Family.MOVE_FEWER_BYTES,
        "Decode reads every weight once per step, so it is bound by memory bandwidth: FP8 halves the "
        "bytes of BF16 weights (INT4 AWQ/GPTQ quarters them), which almost doubles single-stream speed. "
        "On llama.cpp the GGUF types Q8_0 and Q4_0 (8.5 and 4.5 bits per weight) are made here from the "
        "16-bit file. Fewer bits cost output quality: measure it.",
        "bytes moved", (Capability.FP8_COMPUTE,),
    ),
    FeatureInfo(
        "kv_cache_dtype", "KV-cache precision", Family.MOVE_FEWER_BYTES,
        "Storing keys and values in FP8 halves the KV cache: twice the tokens fit, so twice the "
        "concurrent requests, and attention reads half the bytes at long context.",
        "bytes moved and KV memory", (Capability.FP8_KV_ON_CPU,),
    ),
    FeatureInfo(
        "prefix_caching", "Prefix caching", Family.MANAGE_KV_CACHE,
        "Requests that share a prefix (system prompt, chat history, documents) reuse its cached KV "
        "blocks instead of recomputing them: prefill work and time-to-first-token drop with the hit rate.",
        "prefill compute",
    ),
    FeatureInfo(
        "speculative.method", "Speculative decoding", Family.USE_IDLE_COMPUTE,
        "Decode leaves compute idle while weights stream in; a cheap drafter (n-gram lookup, EAGLE "
        "head, MTP layers, small model) proposes several tokens and the model verifies them in one "
        "pass, so each weight read yields more than one token when drafts are accepted.",
        "idle compute",
    ),
    FeatureInfo(
        "speculative.draft_model", "Draft / EAGLE model", Family.USE_IDLE_COMPUTE,
        "The drafter for EAGLE, EAGLE-3 or draft-model speculation; it must match the target model.",
        "idle compute",
    ),
    FeatureInfo(
        "speculative.num_speculative_tokens", "Speculative tokens", Family.USE_IDLE_COMPUTE,
        "How many tokens the drafter proposes per step: more pays when acceptance is high, "
        "wastes compute when it is low.",
        "idle compute",
    ),
    FeatureInfo(
        "speculative.ngram_prompt_lookup_max", "N-gram window", Family.USE_IDLE_COMPUTE,
        "Longest n-gram matched against the prompt to propose drafts: pays on repetitive text such "
        "as code edits and retrieval answers.",
        "idle compute",
    ),
    FeatureInfo(
        "cuda_graphs", "CUDA graphs", Family.USE_IDLE_COMPUTE,
        "Capturing the decode step as a CUDA graph removes per-kernel launch overhead, which "
        "dominates at small batch; off means eager mode (--enforce-eager).",
        "launch overhead", (Capability.CUDA_GPU,),
    ),
    FeatureInfo(
        "chunked_prefill", "Chunked prefill", Family.USE_IDLE_COMPUTE,
        "Long prompts are split into chunks batched with ongoing decodes, so a new request does "
        "not stall everyone's next token (steadier inter-token latency).",
        "scheduling stalls",
    ),
    FeatureInfo(
        "max_num_seqs", "Max concurrent sequences", Family.USE_IDLE_COMPUTE,
        "Continuous batching: more sequences per step share each weight read, raising throughput "
        "until the KV cache or compute runs out.",
        "idle compute",
    ),
    FeatureInfo(
        "max_num_batched_tokens", "Max batched tokens", Family.USE_IDLE_COMPUTE,
        "Token budget per scheduler step: larger favours prefill throughput, smaller favours "
        "inter-token latency.",
        "scheduling",
    ),
    FeatureInfo(
        "gpu_memory_utilization", "GPU memory utilization", Family.MANAGE_KV_CACHE,
        "Fraction of GPU memory the engine may take; what weights and activations leave becomes "
        "KV cache, i.e. how many tokens can be in flight.",
        "KV memory", (Capability.CUDA_GPU,),
    ),
    FeatureInfo(
        "max_model_len", "Max model length", Family.MANAGE_KV_CACHE,
        "Longest context served; a shorter limit lets the engine start with less KV memory.",
        "KV memory",
    ),
    FeatureInfo(
        "kv_offload_gib", "KV offload to CPU (GiB)", Family.MANAGE_KV_CACHE,
        "Evicted KV blocks go to host memory instead of being recomputed: long contexts and "
        "multi-turn sessions get cache hits beyond GPU memory.",
        "KV memory", (Capability.CUDA_GPU,),
    ),
    FeatureInfo(
        "cpu_offload_gib", "Weight offload to CPU (GiB)", Family.MANAGE_KV_CACHE,
        "Keeps part of the weights in host memory to fit a model or free KV space, at the cost of "
        "PCIe transfers every step: slower decode, made visible by the PCIe graph.",
        "GPU memory", (Capability.CUDA_GPU,),
    ),
    FeatureInfo(
        "gpu_layers", "GPU layers", Family.MANAGE_KV_CACHE,
        "How many transformer layers live in GPU memory (llama.cpp's -ngl); the rest run from host "
        "memory on the CPU, which fits a model larger than the GPU at the cost of decode speed.",
        "GPU memory", (Capability.CUDA_GPU,), engines=("llamacpp",),
    ),
    FeatureInfo(
        "flash_attention", "Flash attention", Family.MOVE_FEWER_BYTES,
        "Fused attention kernels that never write the full attention matrix to memory: less traffic "
        "at long context, and llama.cpp needs it for a quantized V cache.",
        "bytes moved", engines=("llamacpp",),
    ),
    FeatureInfo(
        "tensor_parallel_size", "Tensor parallel size", Family.SCALE_AND_LIMITS,
        "Splits each layer across GPUs: the weights each GPU reads per step shrink, so aggregate "
        "bandwidth grows (at the cost of all-reduce traffic).",
        "bytes moved per GPU", (Capability.CUDA_GPU, Capability.MULTI_GPU),
    ),
    FeatureInfo(
        "pipeline_parallel_size", "Pipeline parallel size", Family.SCALE_AND_LIMITS,
        "Splits layers into stages on different GPUs or nodes: fits larger models, adds pipeline "
        "bubbles.",
        "GPU memory", (Capability.CUDA_GPU, Capability.MULTI_GPU),
    ),
    FeatureInfo(
        "data_parallel_size", "Data parallel size", Family.SCALE_AND_LIMITS,
        "Runs several replicas of the model (each on tensor x pipeline parallel GPUs) behind one "
        "endpoint: throughput grows with the replicas, per-request latency does not improve.",
        "requests in flight", (Capability.CUDA_GPU, Capability.MULTI_GPU), engines=("vllm",),
    ),
    FeatureInfo(
        "distributed_executor_backend", "Distributed executor", Family.SCALE_AND_LIMITS,
        "How the engine drives its GPU workers: processes on one machine (mp) or a Ray cluster (ray), "
        "which is what spans several machines.",
        "scale-out", engines=("vllm",),
    ),
    FeatureInfo(
        "nodes", "Nodes", Family.SCALE_AND_LIMITS,
        "How many machines the GPUs span (tensor parallel within a machine, pipeline parallel "
        "across them). tunebench launches one machine: export the ray or k8s-multinode recipe and "
        "attach to the cluster with --endpoint.",
        "GPU memory", engines=("vllm",),
    ),
    FeatureInfo(
        "disaggregation.connector", "Disaggregated prefill/decode", Family.SCALE_AND_LIMITS,
        "Prefill (compute-bound) and decode (memory-bound) run on separate pools of engines, joined by "
        "a router; the connector moves each prompt's KV cache from a prefill engine to a decode engine. "
        "Long prompts no longer stall other requests' next token, and each pool is sized to its own "
        "bottleneck.",
        "prefill/decode interference", engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "disaggregation.prefill_instances", "Prefill engines", Family.SCALE_AND_LIMITS,
        "Engines in the prefill pool: with the decode pool, the P:D ratio the prompt and output "
        "lengths call for.",
        "prefill throughput", engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "disaggregation.decode_instances", "Decode engines", Family.SCALE_AND_LIMITS,
        "Engines in the decode pool: each holds its requests' KV and decodes them in one batch.",
        "requests in flight", engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "disaggregation.prefill_tensor_parallel_size", "Prefill tensor parallel size", Family.SCALE_AND_LIMITS,
        "GPUs per prefill engine: more cut each prompt's time to first token.",
        "prefill latency", (Capability.CUDA_GPU, Capability.MULTI_GPU), engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "disaggregation.decode_tensor_parallel_size", "Decode tensor parallel size", Family.SCALE_AND_LIMITS,
        "GPUs per decode engine: more bandwidth per step and more KV memory for a larger batch.",
        "bytes moved per GPU", (Capability.CUDA_GPU, Capability.MULTI_GPU), engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "expert_parallel_size", "Expert parallel size", Family.SCALE_AND_LIMITS,
        "A mixture-of-experts model's routed experts are spread whole over GPUs instead of sliced: "
        "each GPU reads only its experts per step, and tokens travel to their experts by all-to-all.",
        "bytes moved per GPU", (Capability.CUDA_GPU, Capability.MULTI_GPU), engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "eplb", "Expert load balancing (EPLB)", Family.SCALE_AND_LIMITS,
        "With expert parallelism, hot experts are replicated and moved so no GPU waits on the "
        "busiest one.",
        "load imbalance", (Capability.CUDA_GPU, Capability.MULTI_GPU), engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "reasoning_parser", "Reasoning parser", Family.SCALE_AND_LIMITS,
        "A reasoning model thinks before it answers; the engine's parser streams the thinking apart "
        "from the answer, so the time to the first answer token (TTFAT) and each phase's tokens can be "
        "measured. Verified by effect: reasoning deltas seen in the replies.",
        "nothing: it measures", engines=("vllm", "sglang"),
    ),
    FeatureInfo(
        "extra_args", "Extra engine arguments", Family.SCALE_AND_LIMITS,
        "Free-form flags passed to the engine as given (checked against the installed version).",
        "anything",
    ),
)

FEATURES_BY_KEY: dict[str, FeatureInfo] = {f.key: f for f in FEATURES}


def feature_info(key: str) -> FeatureInfo:
    """Look a feature up by its field path (e.g. ``"speculative.method"``)."""
    return FEATURES_BY_KEY[key]


def offered_by(info: FeatureInfo, engine_kind: str) -> bool:
    """Whether ``engine_kind`` has the feature at all (its values may still be limited)."""
    return not info.engines or engine_kind in info.engines


def feature_value(features: Features, key: str) -> object:
    """The value at a feature's field path (``"speculative.method"``)."""
    value: object = features
    for part in key.split("."):
        value = getattr(value, part)
    return value


def not_offered(engine_kind: str, features: Features) -> list[FeatureInfo]:
    """The features set away from their default that ``engine_kind`` does not offer: an
    adapter refuses each (a toggle that would silently do nothing)."""
    default = Features()
    return [info for info in FEATURES if not offered_by(info, engine_kind)
            and feature_value(features, info.key) != feature_value(default, info.key)]
