"""Engine kind -> adapter: the one place that knows engines by name. New engines (SGLang,
llama.cpp, TensorRT-LLM) register here; the launcher, the runner and the CLI ask for them by kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_adapters import llamacpp, sglang, trtllm
from engine_adapters.base import EngineAdapter, EngineMetrics
from engine_adapters.config import Features
from engine_adapters.runtimes import RuntimeErrorMessage
from engine_adapters.vllm import VllmAdapter

# Typed as the protocol: callers may use only what every engine provides (mypy checks that the
# vLLM adapter conforms).
# SGLang and TensorRT-LLM are not yet run on a GPU: see ``maturity`` below and docs/engines.md.
ADAPTERS: dict[str, EngineAdapter] = {"vllm": VllmAdapter(), llamacpp.ADAPTER.kind: llamacpp.ADAPTER,
                                      sglang.ADAPTER.kind: sglang.ADAPTER, trtllm.ADAPTER.kind: trtllm.ADAPTER}

# Engines whose metrics tunebench can read (``tunebench monitor``): every full adapter, and any
# engine known so far only by its metric names (none at present).
METRICS: dict[str, EngineMetrics] = {**ADAPTERS}


def maturity(kind: str) -> str | None:
    """What an adapter says about how far it is proven ("not yet run on a GPU: ..."), or None
    for an adapter run for real (the GUI, the CLI and the docs show it beside the engine)."""
    adapter = ADAPTERS.get(kind)
    return None if adapter is None or getattr(adapter, "gpu_verified", True) else getattr(adapter, "maturity", None)


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


def engine_terms_for(kind: str, features: Mapping[str, Any]) -> dict[str, str] | None:
    """Stored features in the engine's own terms (``--kv-cache-dtype fp8``, ``-ctk q8_0``), for
    Compare; None when the engine is unknown here or the features no longer validate."""
    try:
        return get_adapter(kind).engine_terms(Features.model_validate(dict(features)))
    except (ValueError, RuntimeErrorMessage):
        return None
