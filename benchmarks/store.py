"""Run-store speed and size: write one run of 100,000 requests (63 tokens each) and 36,000
telemetry samples the way a run does (one batch per second), ten times, then compare the ten
runs. Prints the figures against the targets and exits 1 on a miss: under 2 s to write a run,
under 300 ms to compare, under 100 MiB for the database.

Times are judged in CPU seconds of this process: on a shared machine wall time also counts
other people's work (both are printed, with the load average)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from db.compare import compare_runs
from db.store import RunStore, SampleIn

WRITE_TARGET_S, COMPARE_TARGET_S, SIZE_TARGET_MIB = 2.0, 0.300, 100.0


def synthetic_run(store: RunStore, seed: int, n_requests: int, n_samples: int,
                  duration_s: float) -> tuple[int, float, float, float]:
    """Write a run in one-second batches; return (run id, seconds in batches, seconds to finish,
    CPU seconds of both: on a shared machine wall time also counts other people's work)."""
    rng = np.random.default_rng(seed)
    t_wall0, t_mono0 = 1.8e9 + seed * 10_000, 1000.0 + seed * 10_000
    run_id = store.create_run(name=f"bench-{seed}", tags=["bench"], engine_kind="vllm", model="demo",
                              config={"features": {"prefix_caching": bool(seed % 2)}, "load": {"concurrency": 64}},
                              started_at=t_wall0, t0_mono=t_mono0)
    flushes = int(duration_s)
    req_per_flush, smp_per_flush = n_requests // flushes, n_samples // flushes
    sources = ("gpu0", "host", "engine", "client")
    spent = cpu = 0.0
    for second in range(flushes):
        # the runner's `request` payload: app.load.metrics.RequestRecord as JSON, plus the run id
        requests = [{"run_id": "bench", "level": 0, "index": second * req_per_flush + i, "conversation": 0, "turn": 0,
                     "scheduled_s": second + i / req_per_flush, "start_s": second + i / req_per_flush,
                     "start_wall_s": t_wall0 + second + i / req_per_flush, "queue_ms": 0.1,
                     "ttft_ms": float(rng.gamma(4, 20)), "itl_ms": rng.gamma(8, 2, 63).tolist(), "tpot_ms": 15.0,
                     "e2e_ms": float(rng.gamma(9, 150)), "input_tokens": 128, "input_tokens_counted": 128,
                     "output_tokens": 64, "expected_output_tokens": 64, "chunks": 64, "tokens_source": "usage",
                     "finish_reason": "length", "ok": True, "error": None, "error_kind": None, "http_status": 200}
                    for i in range(req_per_flush)]
        samples = [SampleIn(sources[j % 4], t_mono0 + second + j / smp_per_flush, t_wall0 + second + j / smp_per_flush,
                            {"util_pct": float(rng.uniform(0, 100)), "memory_used_bytes": 7e10,
                             "generation_tok_per_s": float(rng.normal(1800, 50)), "kv_cache_usage_pct": 40.0})
                   for j in range(smp_per_flush)]
        started, cpu_started = time.perf_counter(), time.process_time()
        store.write_batch(run_id, requests=requests, samples=samples, log_lines=[f"log line {second}"])
        spent += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
    started, cpu_started = time.perf_counter(), time.process_time()
    store.finish_run(run_id, "completed", None, {"output_tok_per_s": 1800.0}, finished_at=t_wall0 + duration_s)
    return run_id, spent, time.perf_counter() - started, cpu + time.process_time() - cpu_started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=36_000)
    parser.add_argument("--duration-s", type=float, default=900.0, help="simulated run length (one batch per second)")
    parser.add_argument("--runs", type=int, default=10, help="runs to write and compare (at least 2)")
    args = parser.parse_args()
    args.runs = max(2, args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "bench.db")
        ids, batches, finishes, cpus = [], [], [], []
        for seed in range(args.runs):
            run_id, batch_s, finish_s, cpu_s = synthetic_run(store, seed, args.requests, args.samples, args.duration_s)
            ids.append(run_id)
            batches.append(batch_s)
            finishes.append(finish_s)
            cpus.append(cpu_s)
        wall = float(np.median(np.add(batches, finishes)))
        write_cpu = float(np.median(cpus))
        print(f"write one run ({args.requests:,} requests, {args.samples:,} samples) in {int(args.duration_s)} "
              f"one-second batches: {float(np.median(batches)):.3f} s + finish (metrics, compaction) "
              f"{float(np.median(finishes)):.3f} s = {wall:.3f} s wall, {write_cpu:.3f} s CPU "
              f"(median of {len(ids)} runs; target < {WRITE_TARGET_S} s CPU) {_verdict(write_cpu < WRITE_TARGET_S)}")
        print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        compare_runs(store, ids[:2])  # warm imports and caches once
        rounds, cpu_rounds = [], []
        for _ in range(3):
            started, cpu_started = time.perf_counter(), time.process_time()
            comparison = compare_runs(store, ids, baseline=ids[0])
            rounds.append(time.perf_counter() - started)
            cpu_rounds.append(time.process_time() - cpu_started)
        compare_cpu = min(cpu_rounds)
        print(f"compare {len(ids)} runs (config diff, {len(comparison.metrics)} metric deltas, "
              f"{len(comparison.series)} aligned series x {comparison.series[0].t_s.size if comparison.series else 0} "
              f"points): {min(rounds) * 1000:.0f} ms wall, {compare_cpu * 1000:.0f} ms CPU (best of 3; "
              f"target < {COMPARE_TARGET_S * 1000:.0f} ms CPU) {_verdict(compare_cpu < COMPARE_TARGET_S)}")
        started = time.perf_counter()
        store.list_runs()
        print(f"list {len(ids)} runs: {(time.perf_counter() - started) * 1000:.1f} ms")
        store.close()  # the last connection folds the WAL into the file
        files = sorted(Path(tmp).glob("bench.db*"))
        size_mib = sum(f.stat().st_size for f in files) / 2**20
        print(f"database size: {size_mib:.1f} MiB for {len(ids)} runs ({', '.join(f.name for f in files)}; "
              f"target < {SIZE_TARGET_MIB:.0f} MiB) {_verdict(size_mib < SIZE_TARGET_MIB)}")
    ok = write_cpu < WRITE_TARGET_S and compare_cpu < COMPARE_TARGET_S and size_mib < SIZE_TARGET_MIB
    return 0 if ok else 1


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


if __name__ == "__main__":
    raise SystemExit(main())
