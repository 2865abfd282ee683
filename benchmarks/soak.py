"""Soak: many concurrent streams for a long time, as ``tunebench run --endpoint`` runs them, with
client errors and memory watched. Passes when no request failed, every token the server sent
was counted, and memory stayed flat once the run was going (per-token records go to the store,
not into Python objects: app.load.aggregate, app.load.procs).

The server is tests.fakes.openai_server in a process of its own (pre-encoded responses: it costs
little per token, so the client is loaded as hard as it can be). The run is recorded to a
scratch database like any run. Memory is the resident set of the runner's process and of its
client process(es), sampled every few seconds; growth is measured from ``--baseline-s`` (the
first minute: buffers, caches and the allocator settle) to the end.

    .venv/bin/python benchmarks/soak.py [--duration-s 600] [--concurrency 1000] [--tokens 100]

Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import repo_path  # noqa: F401 (the repository importable)

from app.bus import Bus
from app.config import RunConfig
from app.recording import RunRecorder
from app.runner import Runner
from app.store import RunStore
from app.workload import LengthSpec, LoadConfig, WorkloadConfig

MB = 1024 * 1024
SAMPLE_S = 5.0
DISTINCT_PROMPTS = 2_000  # the level cycles through them for as long as it runs


def _serve(port_queue: Any, stop: Any) -> None:
    """The fake OpenAI server, in its own process (so it neither shares the client's core time
    nor counts in the client's memory)."""
    from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer

    with FakeOpenAIServer(FakeBehaviour(prompt_tokens=16)) as server:
        port_queue.put(server.port)
        stop.wait()


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total / MB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0, help="how long the load runs (default 600)")
    parser.add_argument("--concurrency", type=int, default=1000, help="streams in flight (default 1000)")
    parser.add_argument("--tokens", type=int, default=100, help="output tokens per request (default 100)")
    parser.add_argument("--workers", type=int, default=1, help="client processes (default 1)")
    parser.add_argument("--baseline-s", type=float, default=60.0,
                        help="memory growth is measured from this far into the run (default 60, at most half the run)")
    parser.add_argument("--max-growth", type=float, default=0.20,
                        help="largest allowed memory growth after the baseline (default 0.20 = 20%%)")
    args = parser.parse_args(argv)
    baseline_s = min(args.baseline_s, args.duration_s / 2)

    ctx = multiprocessing.get_context("spawn")
    port_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(port_queue, stop), daemon=True, name="soak-fake-server")
    server.start()
    port = port_queue.get(timeout=60)
    config = RunConfig(
        name="soak",
        workload=WorkloadConfig(num_requests=DISTINCT_PROMPTS, input_len=LengthSpec(mean=16),
                                output_len=LengthSpec(mean=args.tokens)),
        load=LoadConfig(concurrency=args.concurrency, duration_s=args.duration_s, workers=args.workers,
                        request_timeout_s=120.0))
    me = os.getpid()
    samples: list[tuple[float, float, float]] = []  # (seconds into the load, runner MB, client MB)
    with tempfile.TemporaryDirectory(prefix="tunebench-soak-") as tmp:
        bus = Bus()
        store = RunStore(Path(tmp) / "runs.db")
        recorder = RunRecorder(bus, store, owns_store=True)
        runner = Runner(config, bus, endpoint=f"http://127.0.0.1:{port}", telemetry=False)
        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.setdefault("result", runner.run()), daemon=True)
        t0 = time.monotonic()
        thread.start()
        start_rss = _rss_mb([me])
        print(f"soak: {args.concurrency} streams x {args.tokens} tokens for {args.duration_s:.0f} s against "
              f"127.0.0.1:{port}; runner process {start_rss:.0f} MB at start", flush=True)
        next_sample = t0
        while thread.is_alive():
            thread.join(timeout=max(0.0, next_sample - time.monotonic()))
            if time.monotonic() >= next_sample:
                client = runner.client_pids
                samples.append((time.monotonic() - t0, _rss_mb([me]), _rss_mb(client)))
                next_sample += SAMPLE_S
                if len(samples) % 6 == 1:
                    t, r, c = samples[-1]
                    print(f"  {t:5.0f} s: runner {r:6.0f} MB, client {c:6.0f} MB", flush=True)
        end_rss = (_rss_mb([me]), samples[-1][2] if samples else 0.0)
        recorder.close()
        result = box["result"]
        stored = recorder.check_stored(result)
        json_bytes = len(result.model_dump_json())
    stop.set()
    server.join(10)

    level = result.levels[0].summary if result.levels else None
    checks: list[tuple[str, bool]] = []
    print(f"run {result.status}" + (f": {result.reason}" if result.reason else ""))
    checks.append(("run completed and stored", result.status == "completed" and stored is None))
    if level is not None:
        print(f"requests {level.completed:,} ok, {level.errors:,} errors, {level.cancelled:,} cut at the end; "
              f"{level.output_tok_per_s:,.0f} tok/s; client tokens {level.output_tokens:,} vs server "
              f"{level.engine.generation_tokens or 0:,.0f}; --json result {json_bytes / 1024:.0f} KB")
        checks.append(("zero client errors", level.errors == 0 and level.completed > 0))
        checks.append(("tokens exact", bool(level.tokens_match_engine)))
    else:
        checks.append(("a level ran", False))
    base = next((s for s in samples if s[0] >= baseline_s), samples[-1] if samples else (0.0, 0.0, 0.0))
    at_base, at_end = base[1] + base[2], end_rss[0] + end_rss[1]
    growth = (at_end - at_base) / at_base if at_base else 0.0
    print(f"memory (runner + client): start {start_rss:.0f} MB, at {base[0]:.0f} s {at_base:.0f} MB, end {at_end:.0f} MB "
          f"({growth:+.1%} since {base[0]:.0f} s; runner {base[1]:.0f} -> {end_rss[0]:.0f} MB, client "
          f"{base[2]:.0f} -> {end_rss[1]:.0f} MB); peak {max((s[1] + s[2] for s in samples), default=0):.0f} MB")
    checks.append((f"memory flat (growth <= {args.max_growth:.0%} after {base[0]:.0f} s)", growth <= args.max_growth))
    for name, ok in checks:
        print(f"  {'ok  ' if ok else 'MISS'} {name}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
