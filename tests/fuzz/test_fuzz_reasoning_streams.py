"""Reasoning streams of any shape, cut into network reads anywhere: chunks of reasoning, of
answer, of both, of neither (a role chunk), with or without the engine's own reasoning count and
per-chunk usage. Whatever the shape, the client counts what the stream says, exactly."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.load.metrics import RequestRecord
from tests.fakes.split_stream import feed_split

KINDS = ("reasoning", "answer", "both", "role")


def _chunk(kind: str, tokens: int, total: int | None, field: str) -> bytes:
    delta: dict[str, Any] = {"role": "assistant"} if kind == "role" else {}
    if kind in ("reasoning", "both"):
        delta[field] = " hmm" * max(tokens, 1)
    if kind in ("answer", "both"):
        delta["content"] = " tok" * max(tokens, 1)
    obj: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    if total is not None:
        obj["usage"] = {"prompt_tokens": 4, "completion_tokens": total, "total_tokens": total + 4}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], list[tuple[str, int]], int | None, list[int], bool]:
    shape = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 3)), min_size=1, max_size=12))
    shape = [(kind, 0 if kind == "role" else n) for kind, n in shape]
    continuous = draw(st.booleans())
    field = draw(st.sampled_from(["reasoning_content", "reasoning"]))
    total, chunks = 0, []
    for kind, n in shape:
        total += n
        chunks.append(_chunk(kind, n, total if continuous else None, field))
    reported = draw(st.none() | st.integers(0, total))  # the engine's own reasoning count, if it gives one
    usage: dict[str, Any] = {"prompt_tokens": 4, "completion_tokens": total, "total_tokens": total + 4}
    if reported is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reported}
    chunks.append(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    chunks.append(b"data: [DONE]\n\n")
    blob_len = sum(len(c) for c in chunks)
    cuts = draw(st.lists(st.integers(1, max(1, blob_len - 1)), max_size=6))
    return chunks, shape, reported, cuts, continuous


def _consume(chunks: list[bytes], cuts: list[int]) -> RequestRecord:
    state = feed_split(chunks, cuts, chat=True, keep_text=False)
    rec = RequestRecord(level=0, index=0, scheduled_s=0, start_s=0, start_wall_s=0, queue_ms=0)
    state.finish(rec)
    return rec


@given(stream=streams())
@settings(max_examples=150, deadline=None)
def test_any_reasoning_stream_is_counted_as_it_says(stream: tuple[list[bytes], list[tuple[str, int]],
                                                                  int | None, list[int], bool]) -> None:
    chunks, shape, reported, cuts, continuous = stream
    rec = _consume(chunks, cuts)
    total = sum(n for _, n in shape)
    assert rec.output_tokens == total
    first_answer = next((k for k, (kind, _) in enumerate(shape) if kind in ("answer", "both")), None)
    # The reasoning phase ends where the answer starts: reasoning deltas after it (interleaved
    # thinking) count with the answer (docs/metrics.md).
    upto = len(shape) if first_answer is None else first_answer + 1
    reasoned = any(kind in ("reasoning", "both") for kind, _ in shape[:upto])
    if first_answer is None:
        assert rec.ttfat_ms is None
    else:
        assert rec.ttfat_ms is not None and rec.ttft_ms is not None and rec.ttfat_ms >= rec.ttft_ms
    if reported is not None and (reasoned or reported):
        assert rec.reasoning_tokens == reported  # the engine's count wins
    elif reasoned:  # from the deltas: every token before the chunk that starts the answer
        ahead = shape[:first_answer] if first_answer is not None else shape
        # (without per-chunk usage a chunk counts one token until the closing usage corrects the total)
        before = sum(n for _, n in ahead) if continuous else sum(1 for kind, _ in ahead if kind != "role")
        assert rec.reasoning_tokens == (before if first_answer is not None else total)
    else:
        assert rec.reasoning_tokens is None and not rec.reasoning_unfinished
    if rec.reasoning_tokens is not None:
        assert rec.reasoning_unfinished == (first_answer is None and total > 0)
        assert rec.answer_tokens == total - rec.reasoning_tokens
