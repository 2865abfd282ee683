"""Engine kind -> adapter. New engines (SGLang, llama.cpp, TensorRT-LLM) register here."""

from __future__ import annotations

from engine_adapters.runtimes import RuntimeErrorMessage
from engine_adapters.vllm import VllmAdapter

ADAPTERS: dict[str, VllmAdapter] = {"vllm": VllmAdapter()}


def get_adapter(kind: str) -> VllmAdapter:
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise RuntimeErrorMessage(f"unknown engine '{kind}' (known: {', '.join(ADAPTERS)})") from None
