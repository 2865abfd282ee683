"""The trained demo model answers its task through both real engines: greedy decoding of the
task's test split (``engine_adapters.demo_task``) is right nearly every time on vLLM CPU and on
llama.cpp (the same weights as GGUF), so a quality figure on the demo measures something; with
``ignore_eos`` (what the load client sends) a generation still runs to the asked length."""

from __future__ import annotations

import json
import urllib.request

import pytest

from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.demo_task import examples, is_correct
from engine_adapters.launcher import EngineProcess

pytestmark = pytest.mark.e2e

LLAMACPP = EngineConfig(kind="llamacpp", runtime=RuntimeConfig(managed="llamacpp-cpu"))
TEST_EXAMPLES = 64
ANSWER_TOKENS = 16
"""Room for the longest answer (six words and the period) and more."""
MIN_EXACT_MATCH = 0.95


def _request(engine: EngineProcess, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(engine.base_url + path, data=data,
                                     headers={"Content-Type": "application/json", **engine.auth_headers()})
    with urllib.request.urlopen(request, timeout=120) as resp:  # noqa: S310 - loopback
        result: dict[str, object] = json.loads(resp.read())
        return result


def _complete(engine: EngineProcess, model: str, prompt: str, max_tokens: int,
              ignore_eos: bool = False) -> tuple[str, int]:
    body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if ignore_eos:
        body["ignore_eos"] = True
    reply = _request(engine, "/v1/completions", body)
    choice = reply["choices"][0]  # type: ignore[index]
    usage = reply["usage"]
    return str(choice["text"]), int(usage["completion_tokens"])  # type: ignore[index]


def exact_match(engine: EngineProcess) -> float:
    model = str(_request(engine, "/v1/models")["data"][0]["id"])  # type: ignore[index]
    test = examples(TEST_EXAMPLES, "test")
    right = sum(is_correct(example, _complete(engine, model, example.prompt, ANSWER_TOKENS)[0]) for example in test)
    _, produced = _complete(engine, model, test[0].prompt, 48, ignore_eos=True)
    assert produced == 48, "with ignore_eos a generation must run to max_tokens (the load client relies on it)"
    return right / len(test)


def test_greedy_answers_are_right_on_vllm(demo_engine: EngineProcess) -> None:
    accuracy = exact_match(demo_engine)
    print(f"\nvLLM CPU: exact match {accuracy:.3f} on {TEST_EXAMPLES} test examples")
    assert accuracy >= MIN_EXACT_MATCH


def test_greedy_answers_are_right_on_llamacpp(engine_pool) -> None:  # type: ignore[no-untyped-def]
    accuracy = exact_match(engine_pool.get(Features(), LLAMACPP))
    print(f"\nllama.cpp: exact match {accuracy:.3f} on {TEST_EXAMPLES} test examples")
    assert accuracy >= MIN_EXACT_MATCH
