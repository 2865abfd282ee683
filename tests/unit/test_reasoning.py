"""Reasoning models: against the fake server pacing its tokens by the clock, reasoning deltas
then answer deltas give the time to the first answer token (TTFAT) beside TTFT, the tokens of
each phase counted apart (from usage where the server reports them, else from the deltas, a
chunk that carries both kinds included), each phase's ITL, a request that never stopped
reasoning counted as such, and the ``ttfat_ms`` SLO."""

from __future__ import annotations

import pytest

from app.analysis.metric_catalog import BY_KEY
from app.bus import Bus
from app.config import RunConfig
from app.runner import Runner, RunResult
from app.slo import SloError, parse_slo
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

RATE = 50.0  # tokens a second, each stream: a token every 20 ms
REQUESTS = 6


def _run(behaviour: FakeBehaviour, output_tokens: int = 20, slo: str | None = None, api: str = "chat") -> RunResult:
    config = RunConfig(name="reasoning", workload=WorkloadConfig(
        num_requests=REQUESTS, api=api, input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=output_tokens)),
        load=LoadConfig(concurrency=3, slo=slo))
    with FakeOpenAIServer(behaviour) as srv:
        result = Runner(config, Bus(), endpoint=srv.base_url, telemetry=False, keep_requests=True).run()
    assert result.status == "completed", result.reason
    return result


def _paced(**kwargs: object) -> FakeBehaviour:
    return FakeBehaviour(mode="paced", stream_tok_per_s=RATE, **kwargs)  # type: ignore[arg-type]


def test_reasoning_then_answer_gives_ttfat_and_each_phases_tokens() -> None:
    result = _run(_paced(reasoning_tokens=10), slo="ttft_ms<=150,ttfat_ms<=150")
    summary = result.levels[0].summary
    for rec in result.levels[0].requests:
        assert rec.reasoning_tokens == 10 and rec.answer_tokens == 10 and not rec.reasoning_unfinished
        assert rec.ttft_ms is not None and rec.ttfat_ms is not None
        # The 11th token is the answer's first: ten token gaps after the first token.
        assert rec.ttfat_ms - rec.ttft_ms == pytest.approx(10 * 1e3 / RATE, abs=30), (rec.ttft_ms, rec.ttfat_ms)
    assert summary.reasoning_tokens == 60 and summary.answer_tokens == 60 and summary.reasoning_unfinished == 0
    assert summary.ttfat_ms.count == REQUESTS and summary.ttfat_ms.median > summary.ttft_ms.median + 150
    # Each phase's gaps: 9 within the reasoning, 9 within the answer (the gap between them in neither).
    assert summary.reasoning_itl_ms.count == REQUESTS * 9 and summary.answer_itl_ms.count == REQUESTS * 9
    assert summary.answer_itl_ms.median == pytest.approx(1e3 / RATE, abs=10)
    assert summary.good_requests == 0  # every TTFT meets 150 ms, no TTFAT does
    figures = summary.figures()
    for key in ("ttfat_ms_p50", "ttfat_ms_p99", "reasoning_tokens_total", "answer_tokens_total",
                "requests_reasoning_unfinished", "reasoning_itl_ms_p50", "answer_itl_ms_p99"):
        assert key in figures and key in BY_KEY, key
    assert figures["reasoning_tokens_total"] == 60 and figures["requests_reasoning_unfinished"] == 0
    from app.cli.run_cmds import format_table
    header = format_table(result).splitlines()[0]
    for name in ("TTFT p99", "TTFAT p50", "TTFAT p99", "Reasoning tokens", "Reasoning unfinished"):
        assert name in header, header
    assert header.index("TTFT p99") < header.index("TTFAT p50") < header.index("ITL")


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_chunk_with_both_kinds_is_split_by_the_usage_the_server_reports(field: str) -> None:
    """The 10th token (reasoning) and the 11th (answer) in one chunk: the server's
    ``completion_tokens_details`` count is exact; without it the deltas can only give the
    chunk to the answer, which starts there."""
    exact = _run(_paced(reasoning_tokens=10, both_in_one_chunk=True, reasoning_usage=True, reasoning_field=field))
    assert {r.reasoning_tokens for r in exact.levels[0].requests} == {10}
    assert exact.levels[0].summary.reasoning_tokens == 60 and exact.levels[0].summary.answer_tokens == 60
    from_deltas = _run(_paced(reasoning_tokens=10, both_in_one_chunk=True, reasoning_field=field))
    for rec in from_deltas.levels[0].requests:
        assert rec.reasoning_tokens == 9 and rec.output_tokens == 20
        assert rec.ttfat_ms is not None and rec.ttft_ms is not None
        assert rec.ttfat_ms - rec.ttft_ms == pytest.approx(9 * 1e3 / RATE, abs=30)  # the shared chunk's time


def test_reasoning_that_never_ends_is_counted_as_such_not_as_an_answer() -> None:
    result = _run(_paced(reasoning_tokens=50), output_tokens=12, slo="ttfat_ms<=100000")
    summary = result.levels[0].summary
    assert all(r.reasoning_unfinished and r.ttfat_ms is None and r.answer_tokens == 0
               for r in result.levels[0].requests)
    assert summary.reasoning_unfinished == REQUESTS and summary.answer_tokens == 0
    assert summary.ttfat_ms.count == 0 and summary.good_requests == 0  # no answer: no TTFAT SLO met
    assert summary.figures()["requests_reasoning_unfinished"] == REQUESTS


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_model_that_does_not_reason_has_ttfat_equal_to_ttft_and_no_reasoning_figures(api: str) -> None:
    result = _run(FakeBehaviour(), slo="ttfat_ms<=100000", api=api)
    summary = result.levels[0].summary
    assert all(r.ttfat_ms == r.ttft_ms and r.reasoning_tokens is None for r in result.levels[0].requests)
    assert summary.reasoning_tokens is None and summary.ttfat_ms.count == 0 and summary.good_requests == REQUESTS
    assert not any(key.startswith(("ttfat", "reasoning", "answer")) for key in summary.figures())
    from app.cli.run_cmds import format_table
    assert "TTFAT" not in format_table(result)


def test_the_slo_grammar_knows_ttfat() -> None:
    assert parse_slo("ttfat_ms<=2000,tpot_ms<50") == [("ttfat_ms", "<=", 2000.0), ("tpot_ms", "<", 50.0)]
    with pytest.raises(SloError, match="ttfat_ms"):
        parse_slo("ttfa_ms<=2000")


def test_the_reasoning_parser_is_passed_and_judged_by_the_replies() -> None:
    """vLLM and SGLang take the flag (llama.cpp and TensorRT-LLM refuse it: not theirs); after a
    run the check is verified by reasoning deltas, NOT ACTIVE when chat replies had none, and left
    as it was when the workload sent completions (which carry no reasoning)."""
    from app.verification import RunEffects
    from engine_adapters.config import Features
    from engine_adapters.features import not_offered
    from engine_adapters.sglang import feature_flags as sglang_flags
    from engine_adapters.vllm import feature_flags as vllm_flags

    features = Features(reasoning_parser="qwen3")
    assert vllm_flags(features)["reasoning_parser"] == ["--reasoning-parser", "qwen3"]
    assert sglang_flags(features)["reasoning_parser"] == ["--reasoning-parser", "qwen3"]
    assert [i.key for i in not_offered("llamacpp", features)] == ["reasoning_parser"]
    assert [i.key for i in not_offered("trtllm", features)] == ["reasoning_parser"]
    with pytest.raises(ValueError, match="reasoning_parser"):
        Features(reasoning_parser="qwen3 --evil")

    echoed = {"key": "reasoning_parser", "requested": "qwen3", "status": "accepted",
              "evidence": "engine parsed reasoning_parser=qwen3"}
    effects = RunEffects(Bus())
    try:
        verified, = effects.refine([echoed], features, 4, replies=("chat", 6, 60))
        assert verified["status"] == "verified" and "60 reasoning tokens in 6 replies" in verified["evidence"]
        silent, = effects.refine([echoed], features, 4, replies=("chat", 6, 0))
        assert silent["status"] == "not active" and "parser 'qwen3' does not know its markers" in silent["evidence"]
        unjudged, = effects.refine([echoed], features, 4, replies=("completions", 6, 0))
        assert unjudged["status"] == "accepted" and "completions, which carry no reasoning" in unjudged["evidence"]
        added, = effects.refine([], features, 4, replies=("chat", 6, 12))  # an engine that echoes nothing
        assert added["key"] == "reasoning_parser" and added["status"] == "verified"
        assert effects.refine([], Features(), 4, replies=("chat", 6, 12)) == []
    finally:
        effects.close()


def test_the_live_figures_carry_ttfat_once_a_request_reasoned() -> None:
    from app.events import Progress
    from app.load.executor import LiveStats
    from app.load.metrics import RequestRecord

    bus = Bus()
    sub = bus.subscribe(kinds=[Progress])
    live = LiveStats(bus, "r")

    def record(reasoning: int | None, ttfat: float) -> RequestRecord:
        return RequestRecord(level=0, index=0, scheduled_s=0, start_s=0, start_wall_s=0, queue_ms=0, ok=True,
                             ttft_ms=20.0, ttfat_ms=ttfat, itl_ms=[1.0, 1.0], output_tokens=3, reasoning_tokens=reasoning)

    live.on_record(record(None, 20.0))  # a model that does not reason: its TTFAT is its TTFT
    assert "ttfat_ms_p50" not in live.publish()
    live.on_record(record(2, 400.0))
    live.on_record(record(2, 500.0))
    assert live.publish()["ttfat_ms_p50"] == 450.0
    events = [e.payload for e in sub.drain()]
    assert events[-1].ttfat_ms_p50 == 450.0 and events[-1].series()["ttfat_ms_p50"] == 450.0
    assert events[0].ttfat_ms_p50 is None and "ttfat_ms_p50" not in events[0].series()
