"""The streaming OpenAI-compatible client (completions and chat) on aiohttp.

Tokens are counted per chunk, not chunks: requests ask for
``stream_options = {include_usage, continuous_usage_stats}`` and every chunk then carries the
cumulative ``usage.completion_tokens`` (vLLM). A chunk that brings k tokens after a gap g (several
tokens per step under speculative decoding) adds k inter-token latencies of g/k each, so ITL is
per token and ``sum(itl) == e2e - ttft``. An engine that sends no per-chunk usage falls back to one
token per non-empty chunk; the record says so (``tokens_source="chunks"``) and the final usage, if
any, still corrects the total.

Arrival times are taken once per network read (the moment the bytes reached the client).
Nothing here raises for a bad server: every failure becomes a record with ``error`` and
``error_kind``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

try:  # orjson parses a vLLM chunk ~5x faster than json; the client's ceiling depends on it
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - declared dependency
    from json import loads as _loads  # type: ignore[assignment]

from app.load.datasets import Conversation
from app.load.metrics import RequestRecord
from engine_adapters.secrets import is_secret_name, mask_text, remember_secret

_DATA = b"data:"


@dataclass
class ClientOptions:
    base_url: str
    model: str
    api: str = "completions"  # completions | chat
    headers: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = True
    temperature: float = 0.0
    continuous_usage: bool = True
    request_timeout_s: float = 300.0
    keep_text: bool = False  # multi-turn needs the reply to resend the history
    cache_salt: str | None = None  # vLLM's prefix-cache namespace for these requests (app.load.cache)
    keep_alive: bool = True  # reuse connections; off for servers that close them after a few requests
    request_ids: str | None = None
    """Send each request with an ``X-Request-Id`` of this run (``request_id``): None sends none.
    Each client process of a level gets its own (``-w<k>`` added), so no two requests share one."""


REQUEST_ID_HEADER = "X-Request-Id"


def request_id(run: str, level: int, index: int) -> str:
    """The id tunebench gives a request and sends as ``X-Request-Id`` (``index``: the sender's
    count within the level): vLLM takes it as the request's id in its logs, traces and
    per-request metrics (``_base_request_id`` in its OpenAI server), so a stored record joins the
    engine's own."""
    return f"tb-{run}-L{level}-{index}"


OnTokens = Callable[[int], None]
OnSample = Callable[[dict[str, Any]], None]
OnSamplePiece = Callable[[dict[str, Any]], None]
"""Gets the sample request while it streams: its start (prompt and send time, no pieces yet), then
its pieces as they arrive, each part in :func:`stream_sample`'s shape (``merged_pieces`` joins
parts). What a live race shows; the stored sample is still the whole one ``OnSample`` gets."""

SAMPLE_PROMPT_CHARS = 2000
"""A kept sample's prompt is cut to this many characters: the replay shows its start."""
SAMPLE_MAX_PIECES = 4096
"""A kept sample keeps at most this many streamed pieces (its first ones)."""


def stream_sample(prompt: str, marks: list[tuple[float, str, int]], rec: RequestRecord) -> dict[str, Any]:
    """One request as it streamed, as the store keeps it (``levels.sample``): its prompt, the text
    pieces in the order they arrived, each piece's arrival time in ms since the request was sent
    (``t_ms``) and the tokens it brought. Secrets are masked as everywhere (``mask_text``) on the
    whole text; where that changes it, the masked text is cut at the same relative places, so the
    pieces still arrive at their measured times."""
    marks = marks[:SAMPLE_MAX_PIECES]
    pieces = [text for _, text, _ in marks]
    whole = "".join(pieces)
    masked = mask_text(whole)
    if masked != whole:
        scale, ends, done = len(masked) / max(1, len(whole)), [], 0
        for piece in pieces:
            done += len(piece)
            ends.append(round(done * scale))
        ends[-1] = len(masked)
        pieces = [masked[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    return {"prompt": mask_text(prompt[:SAMPLE_PROMPT_CHARS]), "text": pieces,
            "t_ms": [round(t, 3) for t, _, _ in marks], "tokens": [n for _, _, n in marks],
            "output_tokens": rec.output_tokens, "ttft_ms": rec.ttft_ms, "e2e_ms": rec.e2e_ms,
            "start_wall_s": rec.start_wall_s}


def sample_started(prompt: str, start_wall_s: float) -> dict[str, Any]:
    """The first part of a streaming sample: its prompt (as :func:`stream_sample` keeps it) and when
    it was sent, before any piece."""
    return {"prompt": mask_text(prompt[:SAMPLE_PROMPT_CHARS]), "start_wall_s": start_wall_s,
            "text": [], "t_ms": [], "tokens": []}


def sample_piece(mark: tuple[float, str, int]) -> dict[str, Any]:
    """One piece of a streaming sample as it arrived (its text masked on its own: the stored
    sample, masked whole, replaces the pieces once the request ends)."""
    t_ms, text, tokens = mark
    return {"text": [mask_text(text)], "t_ms": [round(t_ms, 3)], "tokens": [tokens]}


def merged_pieces(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive parts of a streaming sample as one (what crosses a process in a batch)."""
    merged: dict[str, Any] = {"text": [], "t_ms": [], "tokens": []}
    for part in parts:
        for key, value in part.items():
            if key in merged:
                merged[key] = merged[key] + list(value)
            else:
                merged[key] = value
    return merged


def prompt_text(payload: dict[str, Any]) -> str:
    """A request body's prompt: the completion prompt, or the chat messages one a line."""
    return str(payload.get("prompt") or "\n".join(m["content"] for m in payload.get("messages") or ()))


# An idle keep-alive connection is reused for this long at most. The engines' HTTP servers close
# idle connections after 5 s (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE and uvicorn's default); aiohttp
# keeps them for 15 s. A request sent on a connection just as the server closes it fails with
# "Server disconnected", and a starved client loop that has not yet read the server's FIN widens
# that window to its lag: so stop reusing well before the server stops keeping.
IDLE_CONNECTION_REUSE_S = 2.0


def make_session(limit: int, keep_alive: bool = True) -> aiohttp.ClientSession:
    """One session per level: keep-alive connections reused across requests (idle ones for at most
    ``IDLE_CONNECTION_REUSE_S``), unless the server closes idle or well-used connections on its own
    (aiohttp does not retry a POST whose body it could not write to such a connection: every one
    would be a failed request)."""
    if keep_alive:
        connector = aiohttp.TCPConnector(limit=max(1, limit), limit_per_host=0, enable_cleanup_closed=True,
                                         keepalive_timeout=IDLE_CONNECTION_REUSE_S)
    else:
        connector = aiohttp.TCPConnector(limit=max(1, limit), limit_per_host=0, enable_cleanup_closed=True,
                                         force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 auto_decompress=False)


def build_payload(opts: ClientOptions, conv: Conversation, turn: int, replies: list[str]) -> dict[str, Any]:
    """The request body of one turn; earlier turns and their replies are resent as history."""
    t = conv.turns[turn]
    body: dict[str, Any] = {"model": opts.model, "max_tokens": t.output_tokens, "stream": True,
                            "temperature": opts.temperature}
    body["stream_options"] = ({"include_usage": True, "continuous_usage_stats": True}
                              if opts.continuous_usage else {"include_usage": True})
    if opts.ignore_eos:
        body["ignore_eos"] = True
    if opts.cache_salt:
        body["cache_salt"] = opts.cache_salt
    if opts.api == "chat":
        messages: list[dict[str, str]] = []
        if conv.system:
            messages.append({"role": "system", "content": conv.system})
        for k in range(turn):
            messages.append({"role": "user", "content": conv.turns[k].user})
            messages.append({"role": "assistant", "content": replies[k] if k < len(replies) else ""})
        messages.append({"role": "user", "content": t.user})
        body["messages"] = messages
    else:
        parts = [conv.system + "\n\n"] if conv.system else []
        if len(conv.turns) > 1:
            for k in range(turn):
                parts.append(f"User: {conv.turns[k].user}\nAssistant:{replies[k] if k < len(replies) else ''}\n")
            parts.append(f"User: {t.user}\nAssistant:")
        else:
            parts.append(t.user)
        body["prompt"] = "".join(parts)
    return body


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_message(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return _short(str(err.get("message") or err))
    return _short(str(err if err is not None else obj))


class StreamClient:
    """Sends one turn and measures it. Safe to share across tasks of one event loop."""

    def __init__(self, session: aiohttp.ClientSession, opts: ClientOptions) -> None:
        self.session = session
        self.opts = opts
        path = "/v1/chat/completions" if opts.api == "chat" else "/v1/completions"
        self.url = opts.base_url.rstrip("/") + path
        self.headers = {"Content-Type": "application/json", **opts.headers}
        self._chat = opts.api == "chat"
        for name, value in opts.headers.items():  # a server that echoes the key in an error: masked too
            if is_secret_name(name):
                remember_secret(value.split(" ", 1)[-1])

    async def send(self, conv: Conversation, turn: int, replies: list[str], *, level: int, index: int,
                   level_t0: float, scheduled: float, on_tokens: OnTokens | None = None,
                   on_first: Callable[[float], None] | None = None, cap_wait_ms: float = 0.0,
                   on_sample: OnSample | None = None,
                   on_sample_piece: OnSamplePiece | None = None) -> tuple[RequestRecord, str]:
        """Send one turn; returns its record and (when ``keep_text``) the reply text.

        ``scheduled`` and ``level_t0`` are ``time.perf_counter()`` values; ``on_tokens`` is called
        with each chunk's new token count (live statistics), ``on_first`` with the TTFT in ms;
        ``cap_wait_ms`` is how long it waited for the level's in-flight cap; ``on_sample`` (for one
        request of a level: it takes the slower parsing path) gets the request as it streamed
        (:func:`stream_sample`) when it succeeded; ``on_sample_piece`` (the same request) gets it
        while it streams (``OnSamplePiece``)."""
        payload = build_payload(self.opts, conv, turn, replies)
        body = json.dumps(payload).encode()
        rid = request_id(self.opts.request_ids, level, index) if self.opts.request_ids else None
        headers = self.headers if rid is None else {**self.headers, REQUEST_ID_HEADER: rid}
        t = conv.turns[turn]
        start = time.perf_counter()
        start_wall = time.time()
        rec = RequestRecord.model_construct(
            level=level, index=index, conversation=conv.id, turn=turn, scheduled_s=scheduled - level_t0,
            start_s=start - level_t0, start_wall_s=start_wall, queue_ms=(start - scheduled) * 1e3,
            ttft_ms=None, itl_ms=[], tpot_ms=None, e2e_ms=None, input_tokens=None,
            input_tokens_counted=t.input_tokens + (conv.system_tokens if turn == 0 else 0),
            output_tokens=0, expected_output_tokens=t.output_tokens, chunks=0, tokens_source="usage",
            finish_reason=None, ok=False, error=None, error_kind=None, http_status=None, request_id=rid,
            cap_wait_ms=cap_wait_ms)
        state = _StreamState(start, self._chat, self.opts.keep_text, on_tokens, on_first)
        if on_sample is not None or on_sample_piece is not None:
            state.marks = []
        if on_sample_piece is not None:
            on_sample_piece(sample_started(prompt_text(payload), start_wall))
            state.on_mark = lambda mark: on_sample_piece(sample_piece(mark))
        try:
            async with asyncio.timeout(self.opts.request_timeout_s):
                async with self.session.post(self.url, data=body, headers=headers) as resp:
                    rec.http_status = resp.status
                    if resp.status != 200:
                        detail = await resp.text(errors="replace")
                        try:
                            detail = _error_message(json.loads(detail))
                        except (ValueError, RecursionError):  # not JSON, or nested past the parser
                            detail = _short(detail)
                        rec.error, rec.error_kind = f"HTTP {resp.status}: {detail or resp.reason}", "http"
                    else:
                        await state.consume(resp.content)
                        rec.error, rec.error_kind = state.error, state.error_kind
                        if rec.error is None and not state.done:
                            rec.error, rec.error_kind = ("stream ended without [DONE] after "
                                                         f"{state.tokens} tokens"), "stream"
                        if rec.error is None and state.tokens == 0:
                            rec.error, rec.error_kind = "the stream carried no tokens", "stream"
        except TimeoutError:
            rec.error, rec.error_kind = f"timed out after {self.opts.request_timeout_s:g} s", "timeout"
        except aiohttp.ClientConnectorError as exc:
            rec.error, rec.error_kind = f"cannot connect to {self.opts.base_url}: {_short(str(exc.os_error))}", "connect"
        except aiohttp.ClientPayloadError as exc:
            rec.error, rec.error_kind = f"connection broke mid-stream after {state.tokens} tokens: {_short(str(exc))}", "stream"
        except (aiohttp.ServerDisconnectedError, ConnectionResetError) as exc:
            rec.error, rec.error_kind = f"server closed the connection after {state.tokens} tokens: {_short(str(exc))}", "stream"
        except aiohttp.ClientError as exc:
            rec.error, rec.error_kind = f"{type(exc).__name__}: {_short(str(exc))}", "connect"
        except asyncio.CancelledError:
            rec.error, rec.error_kind = "cancelled", "cancelled"
            state.finish(rec)
            raise _Cancelled(rec) from None
        if rec.error is not None:  # server text: it may quote a token or the key
            rec.error = mask_text(rec.error)
        state.finish(rec)
        if on_sample is not None and rec.ok and state.marks:
            on_sample(stream_sample(prompt_text(payload), state.marks, rec))
        return rec, "".join(state.text)


class _Cancelled(Exception):
    """Carries the partial record of a request cancelled mid-flight."""

    def __init__(self, record: RequestRecord) -> None:
        super().__init__("cancelled")
        self.record = record


class _StreamState:
    """Parses one SSE stream: token counts per chunk, TTFT and per-token ITL."""

    __slots__ = ("start", "chat", "keep_text", "on_tokens", "on_first", "tokens", "chunks", "first_t", "last_t",
                 "itl", "done", "error", "error_kind", "text", "finish_reason", "prompt_tokens", "usage_tokens",
                 "chunk_counted", "answer_t", "answer_at", "reasoning_seen", "usage_reasoning", "marks", "on_mark")

    def __init__(self, start: float, chat: bool, keep_text: bool, on_tokens: OnTokens | None,
                 on_first: Callable[[float], None] | None) -> None:
        self.start, self.chat, self.keep_text = start, chat, keep_text
        self.on_tokens, self.on_first = on_tokens, on_first
        self.tokens = 0
        self.chunks = 0
        self.first_t: float | None = None
        self.last_t = start
        self.itl: list[float] = []
        self.done = False
        self.error: str | None = None
        self.error_kind: str | None = None
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.usage_tokens: int | None = None  # last usage.completion_tokens seen
        self.chunk_counted = False
        self.answer_t: float | None = None  # when the first answer token (content, not reasoning) arrived
        self.answer_at = 0  # tokens before it: the reasoning, as the deltas split it
        self.reasoning_seen = False
        self.usage_reasoning: int | None = None  # usage.completion_tokens_details.reasoning_tokens, when reported
        self.marks: list[tuple[float, str, int]] | None = None
        """When sampled: each token-carrying chunk's (ms since send, text, new tokens)."""
        self.on_mark: Callable[[tuple[float, str, int]], None] | None = None
        """Called with each mark as it is taken (the first ``SAMPLE_MAX_PIECES``: what is kept)."""

    async def consume(self, content: aiohttp.StreamReader) -> None:
        buf = b""
        event_fn, chunk_fn = self._event, self._chunk
        itl_append = self.itl.append
        on_tokens = self.on_tokens
        hot_ok = not self.keep_text and self.marks is None
        async for data in content.iter_any():
            now = time.perf_counter()
            if buf:
                data = buf + data
            if b"\r" in data:
                data = data.replace(b"\r\n", b"\n")
            events = data.split(b"\n\n")
            buf = events.pop()
            for event in events:
                # Fast path: one "data: {...}" line, as vLLM sends (the hot loop of the client's
                # ceiling: keep it free of calls that are not needed).
                if event[:7] == b"data: {" and b"\n" not in event and b'"error"' not in event:
                    try:
                        obj = _loads(event[6:])
                    except ValueError:
                        obj = None
                    if type(obj) is dict:
                        usage = obj.get("usage")
                        choices = obj.get("choices")
                        if hot_ok and usage and choices and self.first_t is not None:
                            ct = usage.get("completion_tokens")
                            if type(ct) is int:
                                self.chunks += 1
                                finish = choices[0].get("finish_reason")
                                if finish:
                                    self.finish_reason = finish
                                new = ct - self.tokens
                                self.usage_tokens = ct
                                if self.answer_t is None and new > 0:
                                    self._phase(choices[0], now)
                                if new == 1:
                                    itl_append((now - self.last_t) * 1e3)
                                elif new > 1:
                                    gap = (now - self.last_t) * 1e3 / new
                                    self.itl.extend([gap] * new)
                                else:
                                    continue
                                self.last_t = now
                                self.tokens = ct
                                if on_tokens is not None:
                                    on_tokens(new)
                                continue
                        chunk_fn(obj, now)
                        continue
                if not event_fn(event, now):
                    return
        if buf.strip() and not self.done:
            self._event(buf, time.perf_counter())

    def _event(self, event: bytes, now: float) -> bool:
        """Handle one SSE event; False stops reading (error or [DONE])."""
        for line in event.split(b"\n"):
            if not line.startswith(_DATA):
                continue  # comments (":"), event:, id:, retry: lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return False
            try:
                obj = _loads(payload)
            except ValueError:
                self.error, self.error_kind = (f"malformed SSE data after {self.tokens} tokens: "
                                               f"{_short(payload.decode('utf-8', 'replace'), 80)}"), "malformed"
                return False
            if not isinstance(obj, dict):
                self.error, self.error_kind = (f"malformed SSE data: expected a JSON object, got "
                                               f"{type(obj).__name__}"), "malformed"
                return False
            if "error" in obj:
                self.error, self.error_kind = (f"engine error mid-stream after {self.tokens} tokens: "
                                               f"{_error_message(obj)}"), "stream"
                return False
            self._chunk(obj, now)
        return True

    def _phase(self, choice: dict[str, Any], now: float) -> None:
        """Before the answer: whether this token-carrying chunk is reasoning or the first of the
        answer (a chunk that carries both starts the answer: its tokens are counted there)."""
        if not self.chat:
            self.answer_t, self.answer_at = now, self.tokens  # completions carry no reasoning
            return
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content") or delta.get("reasoning"):
            self.reasoning_seen = True
        if delta.get("content"):
            self.answer_t, self.answer_at = now, self.tokens

    def _chunk(self, obj: dict[str, Any], now: float) -> None:
        usage = obj.get("usage")
        ct = None
        if usage:
            ct = usage.get("completion_tokens")
            pt = usage.get("prompt_tokens")
            if pt is not None:
                self.prompt_tokens = pt
            details = usage.get("completion_tokens_details")
            if isinstance(details, dict) and type(details.get("reasoning_tokens")) is int:
                self.usage_reasoning = details["reasoning_tokens"]
        choices = obj.get("choices")
        if not choices:
            if ct is not None:
                self.usage_tokens = ct  # the closing usage-only chunk
            return
        self.chunks += 1
        choice = choices[0]
        finish = choice.get("finish_reason")
        if finish:
            self.finish_reason = finish
        if self.chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
        else:
            text = choice.get("text") or ""
        if self.keep_text and text:
            self.text.append(text)
        if ct is not None:
            new = ct - self.tokens
            self.usage_tokens = ct
        else:
            self.chunk_counted = True
            new = 1 if text else 0
        if self.marks is not None and (new > 0 or text):
            mark = ((now - self.start) * 1e3, text, max(0, new))
            self.marks.append(mark)
            if self.on_mark is not None and len(self.marks) <= SAMPLE_MAX_PIECES:
                self.on_mark(mark)
        if new <= 0:
            return
        if self.answer_t is None:
            self._phase(choice, now)
        if self.first_t is None:
            self.first_t = now
            if self.on_first is not None:
                self.on_first((now - self.start) * 1e3)
            if new > 1:
                self.itl.extend([0.0] * (new - 1))
        elif new == 1:
            self.itl.append((now - self.last_t) * 1e3)
        else:
            gap = (now - self.last_t) * 1e3 / new
            self.itl.extend([gap] * new)
        self.last_t = now
        self.tokens += new
        if self.on_tokens is not None:
            self.on_tokens(new)

    def finish(self, rec: RequestRecord) -> None:
        if self.chunk_counted:
            rec.tokens_source = "chunks"
            if self.usage_tokens is not None and self.usage_tokens != self.tokens:
                # The closing usage is authoritative for the total; ITLs stay per chunk.
                if self.on_tokens is not None and self.usage_tokens > self.tokens:
                    self.on_tokens(self.usage_tokens - self.tokens)
                self.tokens = self.usage_tokens
        rec.output_tokens = self.tokens
        rec.chunks = self.chunks
        rec.input_tokens = self.prompt_tokens
        rec.finish_reason = self.finish_reason
        rec.itl_ms = self.itl
        if self.first_t is not None:
            rec.ttft_ms = (self.first_t - self.start) * 1e3
            rec.e2e_ms = (self.last_t - self.start) * 1e3
            if self.tokens > 1:
                rec.tpot_ms = (rec.e2e_ms - rec.ttft_ms) / (self.tokens - 1)
        elif rec.error is not None:
            rec.e2e_ms = (time.perf_counter() - self.start) * 1e3
        if self.answer_t is not None:
            rec.ttfat_ms = (self.answer_t - self.start) * 1e3
        if self.reasoning_seen or self.usage_reasoning:
            counted = self.answer_at if self.answer_t is not None else self.tokens
            rec.reasoning_tokens = self.usage_reasoning if self.usage_reasoning is not None else counted
            rec.reasoning_unfinished = self.answer_t is None and self.tokens > 0
        rec.ok = rec.error is None


Cancelled = _Cancelled
