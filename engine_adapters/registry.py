"""Engine kind -> adapter. New engines (SGLang, llama.cpp, TensorRT-LLM) register here."""

from __future__ import annotations

from engine_adapters.base import EngineAdapter
from engine_adapters.runtimes import RuntimeErrorMessage
from engine_adapters.vllm import VllmAdapter

# Typed as the protocol: callers may use only what every engine provides (mypy checks that the
# vLLM adapter conforms).
ADAPTERS: dict[str, EngineAdapter] = {"vllm": VllmAdapter()}


def get_adapter(kind: str) -> EngineAdapter:
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise RuntimeErrorMessage(f"unknown engine '{kind}' (known: {', '.join(ADAPTERS)})") from None
