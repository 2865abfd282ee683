"""The host's memory bandwidth, measured once per machine with a short copy and cached: the CPU
demo's decode ceiling, like a GPU's, is bytes per second divided by bytes per token."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np

from engine_adapters.hardware import probe_hardware
from engine_adapters.paths import cache_dir

COPY_BYTES = 256 * 2**20
REPEATS = 5


def _machine_key() -> str:
    hw = probe_hardware()
    return f"{platform.node()}|{hw.cpu_model}|{hw.cpu_count_logical}|{hw.ram_total_bytes}"


def measure_copy_bandwidth(size_bytes: int = COPY_BYTES, repeats: int = REPEATS) -> float:
    """Best of ``repeats`` copies of ``size_bytes``: bytes read plus bytes written, per second."""
    src = np.ones(size_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first, so page faults are not timed
    best_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best_s = min(best_s, time.perf_counter() - start)
    return 2 * src.nbytes / best_s


def _cache_file() -> Path:
    return cache_dir() / "host-bandwidth.json"


def host_bandwidth_bytes_per_s(refresh: bool = False) -> tuple[float, str]:
    """(bytes/s, where the figure comes from). Cached per machine in the user cache."""
    key = _machine_key()
    path = _cache_file()
    if not refresh:
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if cached.get("machine") == key and float(cached["bytes_per_s"]) > 0:
                return float(cached["bytes_per_s"]), f"measured copy bandwidth, cached in {path}"
        except (OSError, ValueError, KeyError, TypeError):
            pass
    measured = measure_copy_bandwidth()
    try:
        path.write_text(json.dumps({"machine": key, "bytes_per_s": measured, "measured_wall_s": time.time()}),
                        encoding="utf-8")
    except OSError:
        pass
    return measured, "measured copy bandwidth (numpy, 256 MiB, best of 5)"
