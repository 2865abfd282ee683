"""The reasoning parser on the real vLLM CPU engine: the flag reaches the engine, and vLLM 0.32
refuses it for the demo model, whose tokenizer has no think tokens. The run fails at the engine's
start, in one line, with vLLM's own reason, before any request (a few seconds: the parser is
checked before the weights load). Measuring reasoning itself is covered against the fake server
(tests/unit/test_reasoning.py): the demo model does not think."""

from __future__ import annotations

import pytest

from app.bus import Bus, Event
from app.config import RunConfig
from app.runner import Runner
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import Features
from tests.conftest import engine_available

pytestmark = pytest.mark.e2e


def test_a_parser_the_model_cannot_use_is_refused_with_vllms_reason() -> None:
    if not engine_available():
        pytest.fail("vLLM CPU runtime or demo model missing: run `make engine`")
    config = RunConfig(name="reasoning parser", features=Features(reasoning_parser="deepseek_r1"),
                       workload=WorkloadConfig(num_requests=2, api="chat", input_len=LengthSpec(mean=16),
                                               output_len=LengthSpec(mean=4)),
                       load=LoadConfig(concurrency=1))
    bus = Bus()
    sub = bus.subscribe()
    result = Runner(config, bus, telemetry=False).run()
    reason = result.reason or ""
    print(f"\nvLLM with --reasoning-parser deepseek_r1 on the demo model: {result.status}: {reason}")
    assert "--reasoning-parser" in result.argv and "deepseek_r1" in result.argv
    assert result.status == "failed" and "\n" not in reason
    assert "could not locate think start/end tokens in the tokenizer" in reason, reason
    kinds = [e.kind for e in sub.drain() if isinstance(e, Event)]
    assert "level_started" not in kinds and result.levels == []
