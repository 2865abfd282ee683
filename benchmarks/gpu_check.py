"""Check the GPU sampler against a known load: while PyTorch runs a large device-to-device copy,
compare the DRAM bandwidth the sampler saw (GPM DRAM_BW_UTIL x peak) with the bandwidth the copy
achieved (bytes read + written / time, timed with CUDA events).

Needs an NVIDIA GPU, its driver, PyTorch with CUDA and nvidia-ml-py. Without them it prints
"gpu_check: skipped: no GPU" and why, and exits with SKIPPED_EXIT (77), which ``make bench``
reports as skipped: nothing was checked, so it is no pass. On Hopper (e.g. an H200, where a copy moves ~4.3 TB/s) both figures should agree within
~15%; before Hopper there is no GPM, and the script reports the busy-time figures only. The copy
is also set against the planner's bandwidth ceiling (the spec table): it must stay under it. Last,
the sampler must read exactly the GPUs CUDA_VISIBLE_DEVICES selects, as a trial on a cluster
relies on (Ray sets it to its bundle's GPUs).

    python benchmarks/gpu_check.py [--seconds 5] [--gib 4] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import repo_path  # noqa: F401 (the repository importable)

from app.bus import Bus, Event, Sample
from app.events import Notice
from app.planner.plan import percent_of_ceiling
from app.telemetry import TelemetryCollector
from engine_adapters.gpu_specs import find_gpu_spec

AGREEMENT = 0.15  # sampler vs copy, relative
SKIPPED_EXIT = 77
"""The exit status of a check that could not run here (the automake convention); ``make bench``'s
recipe reads it as skipped."""
Copy = Callable[[float], tuple[float, float]]  # seconds wanted -> (bytes moved, seconds taken)


def torch_copy(gib: float, device_index: int = 0) -> tuple[Copy, str | None]:
    """A copy loop on CUDA device ``device_index``; returns it and the device's NVML UUID."""
    import torch

    n = int(gib * 2**30)
    device = torch.device("cuda", device_index)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):  # warm up
        dst.copy_(src)
    torch.cuda.synchronize(device)
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    uuid_text = f"GPU-{uuid}" if uuid is not None else None

    def run(seconds: float) -> tuple[float, float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        copies = 0
        stop_at = time.monotonic() + seconds
        start.record()
        while time.monotonic() < stop_at:
            for _ in range(20):
                dst.copy_(src)
            copies += 20
            torch.cuda.synchronize(device)  # keep the queue short so the loop ends on time
        end.record()
        torch.cuda.synchronize(device)
        taken_s = start.elapsed_time(end) / 1000.0
        return 2.0 * n * copies, taken_s  # each copy reads n bytes and writes n bytes

    return run, uuid_text


def run_check(copy: Copy, *, seconds: float, nvml: object | None = None, uuid: str | None = None,
              idle_s: float = 1.0) -> dict[str, Any]:
    """Sample at 100 ms while idle, then while ``copy`` runs; return the figures."""
    bus = Bus()
    sub = bus.subscribe()
    collector = TelemetryCollector(bus, gpu_interval_s=0.1, host_interval_s=0, engine_pid=os.getpid(), nvml=nvml)
    collector.start()
    try:
        deadline = time.monotonic() + 15
        while not collector.support() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(idle_s)
        idle_end = time.monotonic()
        bytes_moved, copy_s = copy(seconds)
        copy_end = time.monotonic()
        time.sleep(0.3)
    finally:
        collector.stop()
    items = sub.drain()
    support = collector.support()
    reports = [r for r in support.values() if r.source.startswith("gpu") and r.available]
    if not reports:
        no_gpu = support.get("gpu")
        return {"ok": None, "message": no_gpu.detail if no_gpu else "no GPU report",
                "support": {k: v.to_json() for k, v in support.items()}}
    report = next((r for r in reports if uuid and r.uuid == uuid), reports[0])
    source = report.source
    samples = [i for i in items if isinstance(i, Sample) and i.source == source]
    # skip the edges: GPM and utilization average over their own windows
    busy = [s.values for s in samples if idle_end + 0.3 <= s.t_mono <= copy_end - 0.1]
    idle = [s.values for s in samples if s.t_mono < idle_end]

    def mean(rows: list[dict[str, float]], key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return statistics.fmean(values) if values else None

    achieved = bytes_moved / copy_s if copy_s > 0 else 0.0
    seen = mean(busy, "dram_bw_bytes_per_s")
    out: dict[str, Any] = {
        "gpu": report.name, "source": source, "samples_during_copy": len(busy),
        "copy_bytes_per_s": achieved, "copy_s": copy_s,
        "sampler_dram_bw_bytes_per_s": seen, "sampler_dram_bw_util_pct": mean(busy, "dram_bw_util_pct"),
        "idle_dram_bw_bytes_per_s": mean(idle, "dram_bw_bytes_per_s"),
        "memory_busy_pct": mean(busy, "memory_busy_pct"), "gpu_util_pct": mean(busy, "gpu_util_pct"),
        "power_w": mean(busy, "power_w"), "sm_clock_mhz": mean(busy, "sm_clock_mhz"),
        "mem_clock_mhz": mean(busy, "mem_clock_mhz"),
        "engine_memory_used_bytes": mean(busy, "engine_memory_used_bytes"),
        "peak_bandwidth": report.peak_bandwidth, "unsupported": report.unsupported,
        "events": [i.payload.to_json() for i in items if isinstance(i, Event) and isinstance(i.payload, Notice)],
    }
    spec = find_gpu_spec(report.name)
    if spec is not None and achieved:
        # The planner's decode ceiling rests on the spec bandwidth: a copy must stay under it.
        fraction, above = percent_of_ceiling(achieved, spec.memory_bandwidth_bytes_per_s)
        out["planner_bandwidth_bytes_per_s"] = spec.memory_bandwidth_bytes_per_s
        out["copy_fraction_of_planner_ceiling"] = fraction
        out["planner_ceiling_holds"] = above is None
    if seen is None:
        out["ok"] = None
        out["message"] = ("the sampler gives no DRAM bandwidth on this GPU: "
                          + report.unsupported.get("dram_bw_bytes_per_s", "unknown reason"))
    else:
        ratio = seen / achieved if achieved else float("inf")
        out["ratio"] = ratio
        out["ok"] = abs(ratio - 1.0) <= AGREEMENT
        out["message"] = f"sampler / copy = {ratio:.2f} ({'agree' if out['ok'] else 'DISAGREE'} within {AGREEMENT:.0%})"
    return out


FOREIGN_UUID = "GPU-00000000-0000-0000-0000-000000000000"
"""A UUID no GPU has: what CUDA_VISIBLE_DEVICES holds for a trial whose bundle got another GPU."""


def visible_check(uuid: str) -> dict[str, dict[str, Any]]:
    """A trial on a cluster samples the GPUs Ray gave its bundle: Ray sets CUDA_VISIBLE_DEVICES,
    and the sampler must read exactly those. The GPU by its UUID and by its index, and a UUID no
    GPU here has, each with the GPUs the sampler then reads."""
    from app.telemetry.gpu import GpuSampler

    cases = {"by UUID": (uuid, [uuid]), "by index": ("0", [uuid]), "another bundle's GPU": (FOREIGN_UUID, [])}
    out: dict[str, dict[str, Any]] = {}
    for label, (value, expected) in cases.items():
        sampler = GpuSampler(cuda_visible_devices=value)
        try:
            sampled = [r.uuid for r in sampler.open() if r.available and r.source != "gpu"]
            rows = sampler.sample()
        finally:
            sampler.close()
        out[label] = {"cuda_visible_devices": value, "sampled": sampled, "sources": [source for source, _ in rows],
                      "ok": sampled == expected and len(rows) == len(expected)}
    return out


def _tb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e12:.2f} TB/s"


def print_result(result: dict[str, Any]) -> None:
    if "copy_bytes_per_s" not in result:
        print(f"gpu_check: {result['message']}")
        return
    peak = result.get("peak_bandwidth") or {}
    print(f"GPU {result['gpu']} ({result['source']}), {result['samples_during_copy']} samples during a "
          f"{result['copy_s']:.1f} s device-to-device copy")
    print(f"  peak DRAM bandwidth      {_tb(peak.get('peak_bytes_per_s'))}  ({peak.get('note', '')})")
    print(f"  copy achieved            {_tb(result['copy_bytes_per_s'])}  (bytes read + written / CUDA-event time)")
    if "planner_bandwidth_bytes_per_s" in result:
        print(f"  planner's ceiling        {_tb(result['planner_bandwidth_bytes_per_s'])}  (spec table); the copy "
              f"reached {result['copy_fraction_of_planner_ceiling']:.0%} of it"
              + ("" if result["planner_ceiling_holds"] else "  ABOVE THE CEILING: the spec table is wrong"))
    util = result["sampler_dram_bw_util_pct"]
    print(f"  sampler saw (GPM)        {_tb(result['sampler_dram_bw_bytes_per_s'])}"
          + (f"  ({util:.1f}% of peak)" if util is not None else ""))
    print(f"  sampler idle baseline    {_tb(result['idle_dram_bw_bytes_per_s'])}")
    for key, label, unit in (("memory_busy_pct", "memory busy (not bw)", "%"), ("gpu_util_pct", "GPU util", "%"),
                             ("power_w", "power", " W"), ("sm_clock_mhz", "SM clock", " MHz"),
                             ("mem_clock_mhz", "memory clock", " MHz")):
        value = result.get(key)
        print(f"  {label:<24} {'n/a' if value is None else f'{value:.0f}{unit}'}")
    engine_mem = result.get("engine_memory_used_bytes")
    print(f"  this process on the GPU  {'n/a' if engine_mem is None else f'{engine_mem / 2**30:.1f} GiB'}")
    if result.get("unsupported"):
        print(f"  unsupported here: {', '.join(sorted(result['unsupported']))}")
    print(f"  {result['message']}")


def _missing_gpu() -> str | None:
    """Why there is no GPU to check here (None: there is one, with PyTorch's CUDA and NVML)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed here; the check needs an NVIDIA GPU and PyTorch with CUDA"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch here"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001
        return f"NVML is not usable here: {exc}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the copy (default 5)")
    parser.add_argument("--gib", type=float, default=4.0, help="size of each buffer in GiB (default 4)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    missing = _missing_gpu()
    if missing is not None:
        print(f"gpu_check: skipped: no GPU ({missing}): nothing to check")
        return SKIPPED_EXIT
    copy, uuid = torch_copy(args.gib)
    result = run_check(copy, seconds=args.seconds, uuid=uuid)
    print_result(result)
    visible: dict[str, dict[str, Any]] = visible_check(uuid) if uuid else {}
    for label, case in visible.items():
        print(f"  CUDA_VISIBLE_DEVICES {label} ({case['cuda_visible_devices']}): the sampler read "
              f"{case['sampled'] or 'no GPU'}{'' if case['ok'] else '  WRONG: a trial would sample GPUs not its own'}")
    result["visible"] = visible
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    wrong = result.get("ok") is False or result.get("planner_ceiling_holds") is False
    return 1 if wrong or not all(case["ok"] for case in visible.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
