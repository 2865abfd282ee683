"""llama.cpp (``llama-server --metrics``): its Prometheus metric names, ready for the llama.cpp
adapter.

Names checked against the server's README (``tools/server/README.md``, "GET /metrics") and
published scrapes. ``kv_cache_usage_ratio`` and ``kv_cache_tokens`` were dropped by newer builds
(the unified KV cache), so KV use is simply unsupported there; speculative-decoding counters
were renamed (``tokens_drafted*`` -> ``spec_decode_num_*``; the newer spelling is taken from a
published scrape, not from the README). llama.cpp has no latency histograms.
"""

from __future__ import annotations

from engine_adapters.base import MetricNames

METRIC_NAMES = MetricNames(
    gauges={
        "requests_running": ("llamacpp:requests_processing",),
        "requests_waiting": ("llamacpp:requests_deferred",),
        "kv_cache_usage_ratio": ("llamacpp:kv_cache_usage_ratio",),
        "kv_cache_tokens": ("llamacpp:kv_cache_tokens",),
    },
    counters={
        "generation_tokens": ("llamacpp:tokens_predicted_total",),
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),
        "spec_decode_draft_tokens": ("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:tokens_drafted_total"),
        "spec_decode_accepted_tokens": ("llamacpp:spec_decode_num_accepted_tokens_total",
                                        "llamacpp:tokens_drafted_accepted_total"),
        "decode_steps": ("llamacpp:n_decode_total",),
        "generation_seconds": ("llamacpp:tokens_predicted_seconds_total",),
        "prompt_seconds": ("llamacpp:prompt_seconds_total",),
    },
    histograms={},
)
