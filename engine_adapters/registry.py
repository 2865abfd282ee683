"""Engine kind -> adapter: the one place that knows engines by name. New engines (SGLang,
llama.cpp, TensorRT-LLM) register here; the launcher, the runner and the CLI ask for them by kind."""

from __future__ import annotations

from engine_adapters import llamacpp, sglang
from engine_adapters.base import EngineAdapter, EngineMetrics
from engine_adapters.runtimes import RuntimeErrorMessage
from engine_adapters.vllm import VllmAdapter

# Typed as the protocol: callers may use only what every engine provides (mypy checks that the
# vLLM adapter conforms).
ADAPTERS: dict[str, EngineAdapter] = {"vllm": VllmAdapter(), llamacpp.ADAPTER.kind: llamacpp.ADAPTER}

# Engines whose metrics tunebench can read (``tunebench monitor``): every full adapter, and the
# engines known so far only by their metric names.
METRICS: dict[str, EngineMetrics] = {**ADAPTERS, sglang.ENGINE.kind: sglang.ENGINE}


def get_adapter(kind: str) -> EngineAdapter:
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise RuntimeErrorMessage(f"unknown engine '{kind}' (known: {', '.join(ADAPTERS)})") from None


def get_engine_metrics(kind: str) -> EngineMetrics:
    """What reading ``kind``'s /metrics needs (a full adapter or a metrics-only description)."""
    try:
        return METRICS[kind]
    except KeyError:
        raise RuntimeErrorMessage(f"unknown engine '{kind}' (known: {', '.join(METRICS)})") from None
