"""SGLang: what tunebench knows so far -- its Prometheus metric names (served with
``--enable-metrics``), ready for the SGLang adapter; until then the registry offers
``ENGINE`` (metrics only) for ``tunebench monitor``.

Names checked against SGLang's own source (``python/sglang/srt/metrics/collector.py``) and its
production-metrics reference. SGLang reports KV use as ``token_usage`` (a 0-1 fraction of the
token pool), and counts prefix-cache reuse in tokens (``cached_tokens_total`` out of
``prompt_tokens_total``), the same unit as vLLM's prefix-cache queries and hits.
"""

from __future__ import annotations

from engine_adapters.base import MetricNames, MetricsOnlyEngine

METRIC_NAMES = MetricNames(
    gauges={
        "requests_running": ("sglang:num_running_reqs",),
        "requests_waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage_ratio": ("sglang:token_usage",),
        # SGLang's own running estimates; counter-derived rates take precedence when present.
        "generation_tok_per_s": ("sglang:gen_throughput",),
        "prefix_cache_hit_ratio": ("sglang:cache_hit_rate",),
        "spec_mean_acceptance_length": ("sglang:spec_accept_length",),
        "spec_acceptance_ratio": ("sglang:spec_accept_rate",),
    },
    counters={
        "generation_tokens": ("sglang:generation_tokens_total",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "prefix_cache_queries": ("sglang:prompt_tokens_total",),
        "prefix_cache_hits": ("sglang:cached_tokens_total",),
        "requests_finished": ("sglang:num_requests_total",),
        "preemptions": ("sglang:num_retracted_requests_total",),
    },
    histograms={
        "ttft_s": ("sglang:time_to_first_token_seconds",),
        "itl_s": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e_s": ("sglang:e2e_request_latency_seconds",),
        "queue_s": ("sglang:queue_time_seconds",),
    },
)


ENGINE = MetricsOnlyEngine("sglang", "SGLang", METRIC_NAMES)
