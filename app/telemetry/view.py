"""A compact text view of the latest telemetry (what ``tunebench monitor`` prints): one line per
GPU, one for the host, one for the engine. Quantities a source does not support are left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.events import TelemetrySupport

GIB = 2**30


def _fmt(values: Mapping[str, float], key: str, template: str, scale: float = 1.0) -> str | None:
    if key not in values:
        return None
    return template.format(values[key] / scale)


def _join(parts: list[str | None]) -> str:
    return "  ".join(p for p in parts if p)


def gpu_line(source: str, values: Mapping[str, float], report: TelemetrySupport | None) -> str:
    name = (report.name if report else None) or ""
    memory = None
    if "memory_used_bytes" in values and "memory_total_bytes" in values:
        memory = f"mem {values['memory_used_bytes'] / GIB:.1f}/{values['memory_total_bytes'] / GIB:.1f} GiB"
        if "engine_memory_used_bytes" in values:
            memory += f" (engine {values['engine_memory_used_bytes'] / GIB:.1f})"
    dram = None
    if "dram_bw_bytes_per_s" in values:
        dram = f"DRAM {values['dram_bw_bytes_per_s'] / 1e12:.2f} TB/s ({values.get('dram_bw_util_pct', 0):.0f}%)"
    elif "dram_bw_util_pct" in values:
        dram = f"DRAM {values['dram_bw_util_pct']:.0f}% of peak"
    pcie = None
    if "pcie_tx_bytes_per_s" in values or "pcie_rx_bytes_per_s" in values:
        pcie = (f"PCIe tx {values.get('pcie_tx_bytes_per_s', 0) / 1e9:.2f} "
                f"rx {values.get('pcie_rx_bytes_per_s', 0) / 1e9:.2f} GB/s")
    return _join([
        f"{source:<6}{name}",
        _fmt(values, "gpu_util_pct", "util {:3.0f}%"),
        _fmt(values, "memory_busy_pct", "mem-busy {:3.0f}%"),
        memory, dram, pcie,
        _fmt(values, "power_w", "{:.0f} W"),
        _fmt(values, "sm_clock_mhz", "SM {:.0f} MHz"),
        _fmt(values, "mem_clock_mhz", "mem {:.0f} MHz"),
        _fmt(values, "temperature_c", "{:.0f} C"),
    ])


def host_line(values: Mapping[str, float]) -> str:
    memory = None
    if "memory_used_bytes" in values and "memory_total_bytes" in values:
        memory = f"mem {values['memory_used_bytes'] / GIB:.1f}/{values['memory_total_bytes'] / GIB:.1f} GiB"
    return _join([
        "host  ",
        _fmt(values, "cpu_pct", "CPU {:3.0f}%"),
        memory,
        _fmt(values, "engine_rss_bytes", "engine RSS {:.2f} GiB", GIB),
        _fmt(values, "engine_cpu_pct", "engine CPU {:.0f}% of a core"),
    ])


def engine_line(values: Mapping[str, float]) -> str:
    return _join([
        "engine",
        _fmt(values, "requests_running", "running {:.0f}"),
        _fmt(values, "requests_waiting", "waiting {:.0f}"),
        _fmt(values, "kv_cache_usage_pct", "KV {:.1f}%"),
        _fmt(values, "generation_tok_per_s", "gen {:.0f} tok/s"),
        _fmt(values, "prompt_tok_per_s", "prompt {:.0f} tok/s"),
        _fmt(values, "prefix_cache_hit_rate_pct", "prefix hit {:.0f}%"),
        _fmt(values, "spec_acceptance_rate_pct", "spec accept {:.0f}%"),
        _fmt(values, "spec_mean_acceptance_length", "accept len {:.2f}"),
        _fmt(values, "ttft_mean_ms", "TTFT {:.0f} ms"),
        _fmt(values, "itl_mean_ms", "ITL {:.1f} ms"),
    ])


def render(latest: Mapping[str, Mapping[str, float]], support: Mapping[str, TelemetrySupport],
           stats: Mapping[str, Mapping[str, Any]], engine_url: str | None) -> list[str]:
    """Lines for the latest values by source, with the support and error state."""
    lines: list[str] = []
    gpu_sources = sorted((s for s in set(latest) | set(support) if s.startswith("gpu") and s != "gpu"),
                         key=lambda s: int(s[3:]) if s[3:].isdigit() else 0)
    if "gpu" in support and not support["gpu"].available:
        lines.append(f"gpu   {support['gpu'].detail or 'no NVIDIA GPU'}")
    for source in gpu_sources:
        report = support.get(source)
        lines.append(gpu_line(source, latest.get(source, {}), report))
        missing = sorted(report.unsupported) if report else []
        if missing:
            lines.append(f"      (not on this GPU: {', '.join(missing)})")
    if not gpu_sources and "gpu" not in support:
        lines.append("gpu   (probing...)")
    lines.append(host_line(latest.get("host", {})))
    if engine_url is None:
        lines.append("engine (none: pass --endpoint URL to watch an engine's /metrics)")
    else:
        engine_stats = stats.get("engine", {})
        line = engine_line(latest.get("engine", {})) if "engine" in latest else f"engine (waiting for {engine_url})"
        if engine_stats.get("errors"):
            line += f"  [scrape errors {engine_stats['errors']}: {engine_stats.get('last_error', '')}]"
        lines.append(line)
    return lines
