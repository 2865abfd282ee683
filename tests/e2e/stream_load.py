"""A plain streaming load for the telemetry e2e tests, run in a process of its own.

Run in the test's process it shared the interpreter lock with the collector under test: parsing
16 streams kept the collector's threads off the lock, so its scrapes ran only in the gaps between
rounds, where the engine is idle, and read the gauges as 0 mid-load. The product's client has its
own process for the same reason.

    python -m tests.e2e.stream_load BASE_URL MIN_DURATION_S   (API key in TUNEBENCH_TEST_API_KEY)

prints the tokens received and the load's start and end on the system's monotonic clock (the
one ``time.monotonic`` reads in every process), so the start of a child process is not counted
as load. Each of CONCURRENCY streams sends completions with ignore_eos, the
next as soon as the last ends, until MIN_DURATION_S has passed (at least one round).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp

CONCURRENCY, MAX_TOKENS = 16, 1024  # one round, ~16k tokens: 3-10 s at 1,600-5,100 tok/s on this CPU
API_KEY_ENV = "TUNEBENCH_TEST_API_KEY"


async def drive_load(base_url: str, api_key: str | None, min_duration_s: float = 0.0) -> int:
    """The tokens received; every request must run to MAX_TOKENS."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=120)
    # A fresh connection per request: on a starved machine vLLM's server dropped about 2% of
    # reused keep-alive connections ("Server disconnected"), which is not what these tests measure.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        async with session.get(base_url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        deadline = time.monotonic() + min_duration_s

        async def request(i: int) -> int:
            body = {"model": model, "prompt": f"request {i}: the quick brown fox", "max_tokens": MAX_TOKENS,
                    "stream": True, "ignore_eos": True, "temperature": 0.0,
                    "stream_options": {"include_usage": True}}
            tokens = 0
            async with session.post(base_url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            tokens = chunk["usage"]["completion_tokens"]
            assert tokens == MAX_TOKENS, tokens  # ignore_eos: every request runs to its max_tokens
            return tokens

        async def stream(i: int) -> int:
            tokens = await request(i)
            while time.monotonic() < deadline:
                tokens += await request(i)
            return tokens

        return sum(await asyncio.gather(*(stream(i) for i in range(CONCURRENCY))))


def run_load(base_url: str, api_key: str | None, min_duration_s: float = 0.0) -> tuple[int, float, float]:
    """Runs the load in a child process (never this one's interpreter): its tokens, and when the
    load started and ended (``time.monotonic``)."""
    import subprocess

    env = dict(os.environ)
    env.pop(API_KEY_ENV, None)
    if api_key:
        env[API_KEY_ENV] = api_key
    done = subprocess.run([sys.executable, "-m", "tests.e2e.stream_load", base_url, str(min_duration_s)],
                          env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    tokens, started, ended = done.stdout.split()[-3:]
    return int(tokens), float(started), float(ended)


if __name__ == "__main__":
    load_started = time.monotonic()
    received = asyncio.run(drive_load(sys.argv[1], os.environ.get(API_KEY_ENV), float(sys.argv[2])))
    print(received, load_started, time.monotonic())
