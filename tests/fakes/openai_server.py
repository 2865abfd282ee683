"""A local OpenAI-compatible SSE server with no model behind it, for measuring the client and for
testing how it handles bad servers. Responses are pre-encoded, so it streams as fast as the
client reads. Behaviour is chosen per server (``FakeBehaviour``), or per request with the
prompt/first message ``"fake:<mode>"`` where mode is one of :data:`MODES`.

Modes: ``ok`` (vLLM-like chunks with continuous usage), ``multi`` (``tokens_per_chunk`` tokens
per chunk, like speculative decoding), ``no_usage`` (no per-chunk usage; one closing usage chunk),
``http_500`` / ``http_400``, ``error_midstream`` (an SSE error object after a few tokens),
``malformed`` (a non-JSON data line), ``disconnect`` (the connection drops mid-stream),
``slow`` (``delay_s`` between chunks), ``paced`` (each stream at ``stream_tok_per_s``, by the
clock: token k (from 1) is written k / rate seconds after the request arrived, so a slow wake-up does not
add up). ``stall_after_requests`` and ``stall_s`` stop the whole server for a while: when that
many requests have arrived, nothing is written for ``stall_s`` (the times are in ``stalls``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass

from aiohttp import web

MODES = ("ok", "multi", "no_usage", "http_500", "http_400", "error_midstream", "malformed", "disconnect", "slow",
         "paced")


@dataclass
class FakeBehaviour:
    mode: str = "ok"
    tokens_per_chunk: int = 3
    delay_s: float = 0.0
    prompt_tokens: int = 8
    api_key: str | None = None
    stream_tok_per_s: float = 20.0
    stall_after_requests: int | None = None
    stall_s: float = 0.0
    reasoning_tokens: int = 0
    """Chat: the first this many tokens of each reply are reasoning deltas, the rest the answer."""
    reasoning_field: str = "reasoning_content"  # vLLM's; "reasoning" as newer servers name it
    both_in_one_chunk: bool = False
    """The last reasoning token and the first answer token in one chunk (two tokens)."""
    reasoning_usage: bool = False
    """The closing usage says ``completion_tokens_details.reasoning_tokens``."""


def _chunk(text: str, completion: int | None, prompt: int, chat: bool, finish: str | None = None,
           reasoning: str = "", field: str = "reasoning_content") -> bytes:
    if chat:
        delta = {field: reasoning, "content": text or None} if reasoning else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj: dict[str, object] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                                  "model": "fake", "choices": [choice]}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake", "choices": [choice]}
    if completion is not None:
        obj["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _usage_chunk(completion: int, prompt: int, reasoning: int | None = None) -> bytes:
    usage: dict[str, object] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                "completion_tokens": completion}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    obj = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake", "choices": [],
           "usage": usage}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def encode_stream(n_tokens: int, mode: str, chat: bool, tokens_per_chunk: int = 1, prompt_tokens: int = 8,
                  usage: bool = True, behaviour: FakeBehaviour | None = None) -> list[bytes]:
    """The SSE chunks of one response, pre-encoded (reasoning first, when the behaviour asks)."""
    per = tokens_per_chunk if mode == "multi" else 1
    reasoning = behaviour.reasoning_tokens if behaviour is not None and chat else 0
    out, done = [], 0
    while done < n_tokens:
        k = min(per, n_tokens - done)
        if behaviour is not None and behaviour.both_in_one_chunk and done + 1 == reasoning < n_tokens:
            k = 2  # the last reasoning token and the first answer token together
        think = max(0, min(done + k, reasoning) - done)
        done += k
        finish = "length" if done == n_tokens else None
        out.append(_chunk(" tok" * (k - think), done if usage and mode != "no_usage" else None, prompt_tokens, chat,
                          finish, " hmm" * think, behaviour.reasoning_field if behaviour is not None else ""))
    if mode in ("error_midstream", "malformed", "disconnect"):
        cut = min(3, len(out))
        out = out[:cut]
        if mode == "error_midstream":
            out.append(b'data: {"error": {"message": "fake engine failure", "type": "InternalServerError", '
                       b'"code": 500}}\n\n')
        elif mode == "malformed":
            out.append(b"data: {this is not json\n\n")
        return out
    details = min(reasoning, n_tokens) if behaviour is not None and behaviour.reasoning_usage and reasoning else None
    out.append(_usage_chunk(n_tokens, prompt_tokens, details))
    out.append(b"data: [DONE]\n\n")
    return out


class FakeOpenAIServer:
    """Runs in a background thread (or a process, see benchmarks/client_capacity.py)."""

    def __init__(self, behaviour: FakeBehaviour | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.behaviour = behaviour or FakeBehaviour()
        self.host, self.port = host, port
        self.requests = 0
        self.generated = 0
        self.request_ids: list[str | None] = []
        """The ``X-Request-Id`` of each completion request, in arrival order (None: sent without)."""
        self.stalls: list[tuple[float, float]] = []
        """Each stall's start and end, ``time.time()`` (wall clock: the client's records date theirs so)."""
        self._resume_at = 0.0  # time.monotonic() before which nothing is written
        self._cache: dict[tuple[int, str, bool], bytes] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    def _authorised(self, request: web.Request) -> bool:
        key = self.behaviour.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"# TYPE vllm:generation_tokens_total counter\n"
                                 f"vllm:generation_tokens_total{{model_name=\"fake\"}} {self.generated}\n")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        self.requests += 1
        self.request_ids.append(request.headers.get("X-Request-Id"))
        arrived = time.monotonic()
        if self.requests == self.behaviour.stall_after_requests and self.behaviour.stall_s > 0:
            self._resume_at = arrived + self.behaviour.stall_s
            self.stalls.append((time.time(), time.time() + self.behaviour.stall_s))
        await self._hold()
        body = await request.json()
        chat = "messages" in body
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
        mode = self.behaviour.mode
        if isinstance(prompt, str) and prompt.startswith("fake:"):
            mode = prompt[5:].split()[0]
        if mode == "http_500":
            return web.json_response({"error": {"message": "fake internal error"}}, status=500)
        if mode == "http_400":
            return web.json_response({"error": {"message": "max_tokens is too large"}}, status=400)
        n = int(body.get("max_tokens") or 16)
        usage = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chunks = encode_stream(n, mode, chat, self.behaviour.tokens_per_chunk, self.behaviour.prompt_tokens, usage,
                               self.behaviour)
        if mode == "slow":
            for c in chunks:
                await self._hold()
                await resp.write(c)
                await asyncio.sleep(self.behaviour.delay_s)
        elif mode == "paced":
            for k, c in enumerate(chunks):
                if k < len(chunks) - 2:  # the token chunks; the closing usage chunk and [DONE] follow at once
                    await asyncio.sleep(max(0.0, arrived + (k + 1) / self.behaviour.stream_tok_per_s
                                            - time.monotonic()))
                await self._hold()
                await resp.write(c)
        elif mode == "disconnect":
            for c in chunks:
                await resp.write(c)
            assert request.transport is not None
            request.transport.close()
            return resp
        else:
            key = (n, mode, chat)
            blob = self._cache.get(key)
            if blob is None:
                blob = self._cache[key] = b"".join(chunks)
            # Several writes so the client sees a stream, not one read.
            step = max(1, len(blob) // 8)
            for i in range(0, len(blob), step):
                await self._hold()
                await resp.write(blob[i:i + step])
        self.generated += n if mode in ("ok", "multi", "no_usage", "slow", "paced") else min(3, n)
        await resp.write_eof()
        return resp

    async def _hold(self) -> None:
        """Wait out a stall of the whole server, if one is on."""
        wait_s = self._resume_at - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    # -- background thread ------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self._serve, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(self.app(), access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self.host, self.port)
        self._loop.run_until_complete(site.start())
        addresses = self._runner.addresses
        assert addresses, "the fake server has no socket"
        self.port = int(addresses[0][1])
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
