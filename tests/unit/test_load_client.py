"""The streaming client against a local fake server: token counting per chunk, per-token ITL,
and every kind of bad server ending as an error record, never an exception."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.load.client import ClientOptions, StreamClient, _StreamState, build_payload, make_session
from app.load.datasets import Conversation, Turn
from app.load.metrics import RequestRecord
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer, encode_stream
from tests.fakes.split_stream import feed_split
from tests.fuzz.hostile import closed_port


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour(tokens_per_chunk=3, delay_s=0.002)) as srv:
        yield srv


def send(base_url: str, prompt: str, max_tokens: int = 10, **opts: object) -> RequestRecord:
    conv = Conversation(0, [Turn(prompt, max_tokens, 5)])

    async def go() -> RequestRecord:
        async with make_session(1) as session:
            options = ClientOptions(base_url=base_url, model="m", **opts)  # type: ignore[arg-type]
            client = StreamClient(session, options)
            import time

            now = time.perf_counter()
            rec, _ = await client.send(conv, 0, [], level=0, index=0, level_t0=now, scheduled=now)
            return rec

    return asyncio.run(go())


def test_tokens_counted_from_usage(server: FakeOpenAIServer) -> None:
    rec = send(server.base_url, "fake:ok", 25)
    assert rec.ok and rec.error is None
    assert rec.output_tokens == 25 and rec.chunks == 25 and rec.tokens_source == "usage"
    assert len(rec.itl_ms) == 24 and rec.finish_reason == "length" and rec.input_tokens == 8


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_multi_token_chunks_spread_itl_per_token(server: FakeOpenAIServer, api: str) -> None:
    rec = send(server.base_url, "fake:multi", 10, api=api)
    assert rec.ok and rec.output_tokens == 10 and rec.chunks == 4  # 3 + 3 + 3 + 1
    assert len(rec.itl_ms) == rec.output_tokens - 1
    assert rec.ttft_ms is not None and rec.e2e_ms is not None and rec.tpot_ms is not None
    assert sum(rec.itl_ms) == pytest.approx(rec.e2e_ms - rec.ttft_ms, abs=1e-6)
    assert rec.tpot_ms == pytest.approx((rec.e2e_ms - rec.ttft_ms) / 9)


def test_slow_stream_itl_reflects_gaps() -> None:
    # 20 ms between chunks on the server: the 7 gaps span >= 140 ms between the first and the last
    # token. A late client read can bunch chunks (some ITLs ~0) but not remove that span, short of
    # a stall of ~90 ms just as the stream starts.
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.02)) as slow:
        rec = send(slow.base_url, "fake:slow", 8)
    assert rec.ok and len(rec.itl_ms) == 7
    assert rec.ttft_ms is not None and rec.e2e_ms is not None
    assert sum(rec.itl_ms) == pytest.approx(rec.e2e_ms - rec.ttft_ms, abs=1e-6)
    assert sum(rec.itl_ms) > 50


def test_without_per_chunk_usage_falls_back_to_chunks_flagged(server: FakeOpenAIServer) -> None:
    rec = send(server.base_url, "fake:no_usage", 12)
    assert rec.ok and rec.tokens_source == "chunks" and rec.output_tokens == 12


def test_multi_token_chunks_without_usage_are_corrected_by_the_final_usage() -> None:
    chunks = encode_stream(9, "multi", chat=False, tokens_per_chunk=3, usage=False)
    state = feed_split(chunks)
    rec = _finish(state)
    assert rec.tokens_source == "chunks" and rec.chunks == 3
    assert rec.output_tokens == 9  # 3 chunks counted, the closing usage says 9


@pytest.mark.parametrize("mode, kind, text", [
    ("http_500", "http", "HTTP 500: fake internal error"),
    ("http_400", "http", "HTTP 400: max_tokens is too large"),
    ("error_midstream", "stream", "engine error mid-stream after 3 tokens: fake engine failure"),
    ("malformed", "malformed", "malformed SSE data after 3 tokens"),
    ("disconnect", "stream", "after 3 tokens"),
])
def test_bad_servers_become_error_records(server: FakeOpenAIServer, mode: str, kind: str, text: str) -> None:
    rec = send(server.base_url, f"fake:{mode}", 20)
    assert not rec.ok and rec.error_kind == kind, rec.error
    assert text in (rec.error or "")
    if mode in ("error_midstream", "malformed", "disconnect"):
        assert rec.output_tokens == 3 and rec.ttft_ms is not None  # partial results kept


def test_unreachable_endpoint_is_a_connect_error() -> None:
    port = closed_port()
    rec = send(f"http://127.0.0.1:{port}", "hello")
    assert not rec.ok and rec.error_kind == "connect" and "cannot connect" in (rec.error or "")


def test_timeout_is_an_error(server: FakeOpenAIServer) -> None:
    rec = send(server.base_url, "fake:slow", 500, request_timeout_s=0.3)
    assert not rec.ok and rec.error_kind == "timeout" and "timed out after 0.3 s" in (rec.error or "")
    assert rec.output_tokens < 500  # what arrived before the deadline is kept


def test_api_key_is_sent_as_bearer() -> None:
    with FakeOpenAIServer(FakeBehaviour(api_key="s3cret")) as srv:
        assert send(srv.base_url, "hi", headers={"Authorization": "Bearer s3cret"}).ok
        denied = send(srv.base_url, "hi")
        assert not denied.ok and denied.http_status == 401 and "Unauthorized" in (denied.error or "")


def test_payloads_for_completions_and_chat_with_history() -> None:
    conv = Conversation(1, [Turn("first question", 5, 2), Turn("second question", 6, 2)], system="SYS", system_tokens=1)
    chat = build_payload(ClientOptions(base_url="", model="m", api="chat"), conv, 1, ["first answer"])
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "user"]
    assert chat["messages"][2]["content"] == "first answer" and chat["max_tokens"] == 6
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert chat["ignore_eos"] is True
    comp = build_payload(ClientOptions(base_url="", model="m", ignore_eos=False, continuous_usage=False), conv, 1,
                         ["first answer"])
    assert comp["prompt"].startswith("SYS\n\nUser: first question\nAssistant:first answer\nUser: second question")
    assert "ignore_eos" not in comp and comp["stream_options"] == {"include_usage": True}


# --- the parser alone: arbitrary network splits give the same result ------------------------------

def _finish(state: _StreamState) -> RequestRecord:
    rec = RequestRecord(level=0, index=0, scheduled_s=0, start_s=0, start_wall_s=0, queue_ms=0)
    state.finish(rec)
    if rec.error is None and not state.done:
        rec.ok = False
    return rec


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), per=st.integers(1, 4), crlf=st.booleans(),
       splits=st.lists(st.integers(0, 4000), max_size=30))
def test_any_network_split_parses_the_same(n: int, per: int, crlf: bool, splits: list[int]) -> None:
    chunks = encode_stream(n, "multi", chat=False, tokens_per_chunk=per)
    if crlf:
        chunks = [c.replace(b"\n", b"\r\n") for c in chunks]
    chunks.insert(1, b": keep-alive comment\n\n")
    state = feed_split(chunks, [s % max(1, len(b"".join(chunks))) for s in splits])
    assert state.done and state.error is None
    assert state.tokens == n and state.chunks == -(-n // per)
    assert "".join(state.text) == " tok" * n
    assert len(state.itl) == n - 1


def test_non_object_json_and_error_objects() -> None:
    state = feed_split([b"data: [1, 2]\n\n"])
    assert state.error_kind == "malformed" and "expected a JSON object" in (state.error or "")
    state = feed_split([encode_stream(2, "ok", chat=False)[0], b'data: {"error": "boom"}\n\n'])
    assert state.error_kind == "stream" and "boom" in (state.error or "") and state.tokens == 1
    body = json.loads(encode_stream(1, "ok", chat=True)[0][6:])
    assert body["choices"][0]["delta"]["content"] == " tok"


def test_a_stream_that_fails_after_tokens_ends_its_e2e_at_its_last_token() -> None:
    """Not at the moment the failure was read: the latency is the tokens', the error is said apart."""
    state = feed_split([*encode_stream(3, "ok", chat=True)[:3], b'data: {"error": "boom"}\n\n'])
    assert state.error_kind == "stream"
    rec = RequestRecord(level=0, index=0, scheduled_s=0, start_s=0, start_wall_s=0, queue_ms=0, error=state.error,
                        error_kind=state.error_kind)  # as the client sets them before it finishes the record
    state.finish(rec)
    assert not rec.ok and rec.output_tokens == 3 and rec.e2e_ms == (state.last_t - state.start) * 1e3
    assert rec.ttfat_ms == rec.ttft_ms and rec.reasoning_tokens is None


class _ClosesIdleConnectionsAtReuse:
    """An HTTP/1.1 server that keeps connections alive but, like an engine whose keep-alive timer
    fires just as the client reuses an idle connection, drops one that was idle for
    ``idle_limit_s`` when the next request arrives on it, without answering."""

    def __init__(self, idle_limit_s: float) -> None:
        self.idle_limit_s = idle_limit_s
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import time

        self.connections += 1
        idle_since = time.monotonic()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if time.monotonic() - idle_since >= self.idle_limit_s:
                    return  # the race lost: the server closed this connection
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                body = b"".join(encode_stream(5, "ok", chat=False))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def test_an_idle_connection_is_not_reused_after_the_servers_keep_alive() -> None:
    """Two requests 1.2 s apart on one session against a server that drops connections idle for
    1 s: the second goes out on a fresh connection and succeeds. With aiohttp's default (reuse for
    15 s) it went out on the dropped one and failed as "Server disconnected"."""
    import time

    from app.load import client as client_module

    async def go() -> list[RequestRecord]:
        fake = _ClosesIdleConnectionsAtReuse(idle_limit_s=1.0)
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        records = []
        try:
            async with make_session(4) as session:
                client = StreamClient(session, ClientOptions(base_url=f"http://127.0.0.1:{port}", model="m"))
                for index in range(2):
                    if index:
                        await asyncio.sleep(1.2)
                    now = time.perf_counter()
                    rec, _ = await client.send(Conversation(0, [Turn("p", 5, 5)]), 0, [], level=0, index=index,
                                               level_t0=now, scheduled=now)
                    records.append(rec)
        finally:
            server.close()
            await server.wait_closed()
        assert fake.connections == 2
        return records

    original = client_module.IDLE_CONNECTION_REUSE_S
    client_module.IDLE_CONNECTION_REUSE_S = 0.5  # below this server's 1 s, as 2 s is below the engines' 5 s
    try:
        records = asyncio.run(go())
    finally:
        client_module.IDLE_CONNECTION_REUSE_S = original
    assert [r.ok for r in records] == [True, True], [r.error for r in records]
    assert client_module.IDLE_CONNECTION_REUSE_S < 5.0  # the engines' servers keep idle connections for 5 s
