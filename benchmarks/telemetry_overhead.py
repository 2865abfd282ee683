"""Sampling overhead of the telemetry collector at its default intervals (target: under 1% of one
core). Prints the CPU time of the sampler threads themselves (per-thread counters from the
kernel), so the load they observe is not counted.

The engine endpoint serves a real vLLM 0.32 /metrics page (tests/data) from a separate process;
its PID stands in for the engine tree. NVML is the real library when a GPU is present, else the
pynvml fake (which measures only tunebench's side of each call: real NVML calls cost more).
Also prints, in the same run, the cost of one page parse with and without line selection.

    .venv/bin/python benchmarks/telemetry_overhead.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import psutil
from repo_path import ROOT

from app.bus import Bus
from app.telemetry import TelemetryCollector
from app.telemetry.engine_metrics import MetricMap
from engine_adapters.vllm import METRIC_NAMES

PAGE = ROOT / "tests" / "data" / "vllm-0.32.0-metrics.txt"
TARGET_PCT = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _nvml() -> tuple[object | None, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return None, "real NVML"
    except Exception:  # noqa: BLE001 - no driver here: measure our side with the fake
        from tests.fakes.nvml import FakeGpu, FakeNvml

        return FakeNvml([FakeGpu()]), "pynvml fake (no GPU here; real NVML calls cost more)"


def _thread_cpu_s(native_ids: list[int]) -> dict[int, float]:
    """CPU seconds per thread: nanoseconds from /proc schedstat where Linux has it, else psutil's
    clock-tick (10 ms) counters."""
    out: dict[int, float] = {}
    for tid in native_ids:
        try:
            out[tid] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            break
    else:
        return out
    wanted = set(native_ids)
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads() if t.id in wanted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    page = PAGE.read_text()
    mapping = MetricMap(METRIC_NAMES)
    n = 50
    selected_s = timeit.timeit(lambda: mapping.parse(page), number=n) / n
    from prometheus_client.parser import text_string_to_metric_families

    full_s = timeit.timeit(lambda: [list(f.samples) for f in text_string_to_metric_families(page)], number=n) / n
    print(f"one /metrics page ({len(page) / 1024:.0f} KiB): parse with selection {selected_s * 1e3:.2f} ms, "
          f"full prometheus parse {full_s * 1e3:.2f} ms  (x{full_s / selected_s:.1f})")

    workdir = Path(tempfile.mkdtemp(prefix="tunebench-bench-"))
    shutil.copy(PAGE, workdir / "metrics")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    print("benchmark: the local metrics server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.05)
        nvml, nvml_note = _nvml()
        bus = Bus()
        sub = bus.subscribe(maxlen=100_000)
        collector = TelemetryCollector(bus, metrics_url=f"http://127.0.0.1:{port}", engine_pid=server.pid, nvml=nvml)
        collector.start()
        time.sleep(1.0)  # past the one-off probing (NVML init, first scrape)
        ids = collector.thread_ids()
        names = {t.native_id: t.name for t in __import__("threading").enumerate() if t.native_id in ids}
        before, t0 = _thread_cpu_s(ids), time.monotonic()
        sub.drain()
        time.sleep(args.seconds)
        after, wall = _thread_cpu_s(ids), time.monotonic() - t0
        items = sub.drain()
        collector.stop()
    finally:
        server.terminate()
        server.wait(5)
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"collector at default intervals (gpu 0.1 s, host 0.5 s, engine 1 s) for {wall:.1f} s; GPU via {nvml_note}")
    total = 0.0
    for tid in ids:
        used = after.get(tid, 0.0) - before.get(tid, 0.0)
        total += used
        print(f"  {names.get(tid, tid)!s:<18} {used * 1e3:8.1f} ms CPU  = {100 * used / wall:.3f}% of one core")
    by_source: dict[str, int] = {}
    for item in items:
        source = getattr(item, "source", None)
        if source:
            by_source[source] = by_source.get(source, 0) + 1
    print(f"  samples published: {by_source}; errors: "
          f"{ {k: v.get('errors', 0) for k, v in collector.stats().items()} }")
    pct = 100 * total / wall
    verdict = "within" if pct < TARGET_PCT else "OVER"
    print(f"total sampling overhead: {pct:.3f}% of one core ({verdict} the {TARGET_PCT:.0f}% target)")
    return 0 if pct < TARGET_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
