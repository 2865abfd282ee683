"""Each catalogued feature set away from its default: the one table the adapters' "mapped or
refused" tests walk. An engine's test names only what it takes in its own terms (its extra
arguments, a cache type or a speculative method of its own). Also the flags that vLLM and SGLang
spell alike, for both argv tests."""

from __future__ import annotations

from collections.abc import Mapping

from engine_adapters.config import DisaggregationConfig, Features, SpeculativeConfig


def every_feature_changed(extra_args: list[str], own: Mapping[str, Features] | None = None) -> dict[str, Features]:
    """Feature key -> features with that one feature away from its default; ``own`` replaces
    entries of the table (it cannot add a key the catalogue lacks)."""
    table = {
        "weights_dtype": Features(weights_dtype="fp8"), "kv_cache_dtype": Features(kv_cache_dtype="fp8"),
        "prefix_caching": Features(prefix_caching=False),
        "speculative.method": Features(speculative=SpeculativeConfig(method="ngram")),
        "speculative.draft_model": Features(speculative=SpeculativeConfig(method="eagle3", draft_model="/d")),
        "speculative.num_speculative_tokens": Features(speculative=SpeculativeConfig(method="ngram",
                                                                                     num_speculative_tokens=5)),
        "speculative.ngram_prompt_lookup_max": Features(speculative=SpeculativeConfig(method="ngram",
                                                                                      ngram_prompt_lookup_max=6)),
        "cuda_graphs": Features(cuda_graphs=False), "chunked_prefill": Features(chunked_prefill=False),
        "max_num_seqs": Features(max_num_seqs=3), "max_num_batched_tokens": Features(max_num_batched_tokens=64),
        "gpu_memory_utilization": Features(gpu_memory_utilization=0.5), "max_model_len": Features(max_model_len=512),
        "kv_offload_gib": Features(kv_offload_gib=1, kv_offload_backend="native"),
        "cpu_offload_gib": Features(cpu_offload_gib=1), "tensor_parallel_size": Features(tensor_parallel_size=2),
        "pipeline_parallel_size": Features(pipeline_parallel_size=2), "gpu_layers": Features(gpu_layers=10),
        "flash_attention": Features(flash_attention=True), "extra_args": Features(extra_args=extra_args),
        "data_parallel_size": Features(data_parallel_size=2),
        "distributed_executor_backend": Features(distributed_executor_backend="ray"), "nodes": Features(nodes=2),
        "reasoning_parser": Features(reasoning_parser="qwen3"),
        # A pool engine's features (the group sets the role); the sizes alone, with P/D off, are refused.
        "disaggregation.connector": Features(disaggregation=DisaggregationConfig(connector="nixl", role="prefill")),
        **{f"disaggregation.{name}": Features(disaggregation=DisaggregationConfig(**{name: 2})) for name in (
            "prefill_instances", "decode_instances", "prefill_tensor_parallel_size", "decode_tensor_parallel_size")},
        "expert_parallel_size": Features(expert_parallel_size=2), "eplb": Features(eplb=True),
    }
    unknown = set(own or {}) - set(table)
    if unknown:
        raise KeyError(f"not in the table: {sorted(unknown)}")
    return {**table, **(own or {})}


VLLM_SPELLED_ARGV: list[tuple[Features, list[str]]] = [
    (Features(weights_dtype="bf16"), ["--dtype", "bfloat16"]),
    (Features(weights_dtype="fp16"), ["--dtype", "float16"]),
    (Features(weights_dtype="fp8"), ["--quantization", "fp8"]),
    (Features(weights_dtype="awq"), ["--quantization", "awq"]),
    (Features(weights_dtype="gptq"), ["--quantization", "gptq"]),
    (Features(kv_cache_dtype="fp8_e4m3"), ["--kv-cache-dtype", "fp8_e4m3"]),
    (Features(kv_cache_dtype="fp8_e5m2"), ["--kv-cache-dtype", "fp8_e5m2"]),
    (Features(cpu_offload_gib=8), ["--cpu-offload-gb", "8"]),
]
"""Features whose flags SGLang spells as vLLM does (its server kept vLLM's names for them)."""
