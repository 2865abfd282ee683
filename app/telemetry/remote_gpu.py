"""GPU telemetry from another machine: NVIDIA's DCGM exporter (Prometheus text, as a Kubernetes
GPU operator or ``docker run nvcr.io/nvidia/k8s/dcgm-exporter`` serves it on port 9400), or the
nvidia_gpu_exporter that hosts without DCGM run beside node-exporter (port 9835).

When the engine runs elsewhere (an attached endpoint on a cluster), local NVML sees nothing of
it. The exporter's fields become the same ``gpu<i>`` samples, under the same quantity names and
units as local NVML, so every graph, tile and stored series works unchanged.

- Fields: ``etc/default-counters.csv`` of dcgm-exporter, plus the profiling fields of
  ``dcp-metrics-included.csv`` (``DCGM_FI_PROF_DRAM_ACTIVE``, ``DCGM_FI_PROF_PCIE_*_BYTES``),
  which need a datacenter GPU and ``-f dcp-metrics-included.csv``.
- ``DCGM_FI_PROF_DRAM_ACTIVE`` is the fraction of cycles the memory interface was busy: the
  DRAM bandwidth utilization, the GPM figure local telemetry reads. Bytes per second are that
  times the model's published peak (``engine_adapters.gpu_specs``), when the model is on file.
- ``DCGM_FI_DEV_MEM_COPY_UTIL`` is NVML's memory-controller busy time, not bandwidth, as locally.
- One GPU per (``Hostname``, ``gpu``) label pair, numbered in that order: ``gpu0`` .. ``gpuN``.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.events import TelemetrySupport
from engine_adapters.bounded_http import FetchError, fetch
from engine_adapters.gpu_specs import spec_peak_bandwidth
from engine_adapters.prometheus import labelled_samples
from engine_adapters.secrets import mask_url

MIB = 1024.0 * 1024.0

# Exporter field -> (GPU quantity, scale to its unit). One table per exporter: what a field means
# is said here only.
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", MIB),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("memory_busy_pct", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bw_util_pct", 100.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
}
# Framebuffer memory: total = used + free (+ reserved, where the exporter sends it).
FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")

# utkuozdemir/nvidia_gpu_exporter (nvidia-smi's query fields, often run beside node-exporter on
# hosts without DCGM): ratios 0-1, bytes, watts, hertz. Names and labels from its docs/METRICS.md.
NVIDIA_SMI_FIELDS: dict[str, tuple[str, float]] = {
    "nvidia_smi_memory_used_bytes": ("memory_used_bytes", 1.0),
    "nvidia_smi_memory_total_bytes": ("memory_total_bytes", 1.0),
    "nvidia_smi_utilization_gpu_ratio": ("gpu_util_pct", 100.0),
    "nvidia_smi_utilization_memory_ratio": ("memory_busy_pct", 100.0),
    "nvidia_smi_pcie_throughput_tx_bytes_per_second": ("pcie_tx_bytes_per_s", 1.0),
    "nvidia_smi_pcie_throughput_rx_bytes_per_second": ("pcie_rx_bytes_per_s", 1.0),
    "nvidia_smi_power_draw_watts": ("power_w", 1.0),
    "nvidia_smi_clocks_current_sm_clock_hz": ("sm_clock_mhz", 1e-6),
    "nvidia_smi_clocks_current_memory_clock_hz": ("mem_clock_mhz", 1e-6),
    "nvidia_smi_temperature_gpu": ("temperature_c", 1.0),
}
NVIDIA_SMI_INFO = "nvidia_smi_gpu_info"  # labels uuid, name, index: which GPU a uuid is

WANTED = set(DCGM_FIELDS) | set(FB_PARTS) | set(NVIDIA_SMI_FIELDS) | {NVIDIA_SMI_INFO}
GPU_FIELDS = {**DCGM_FIELDS, **NVIDIA_SMI_FIELDS}


class RemoteGpuError(Exception):
    """One reading that failed (unreachable, HTTP error, unreadable text)."""


@dataclass
class RemoteGpu:
    """One GPU the exporter reports."""

    source: str
    host: str
    index: str
    name: str | None
    uuid: str | None
    values: dict[str, float]
    exporter: str = "DCGM exporter"


def parse_exporter(text: str) -> list[RemoteGpu]:
    """A DCGM exporter's or an nvidia_gpu_exporter's page as one reading per GPU (ValueError on
    malformed text)."""
    samples = labelled_samples(text, WANTED)
    info = {labels.get("uuid", ""): labels for name, labels, _v in samples if name == NVIDIA_SMI_INFO}
    by_gpu: dict[tuple[str, str], dict[str, float]] = {}
    meta: dict[tuple[str, str], tuple[str | None, str | None, str]] = {}
    for name, labels, value in samples:
        if name == NVIDIA_SMI_INFO:
            continue
        if name.startswith("nvidia_smi_"):
            gpu_uuid = labels.get("uuid", "")
            known = info.get(gpu_uuid, {})
            key = (labels.get("Hostname", known.get("Hostname", "")), known.get("index", gpu_uuid))
            meta.setdefault(key, (known.get("name"), gpu_uuid or None, "nvidia_gpu_exporter"))
        else:
            key = (labels.get("Hostname", ""), labels.get("gpu", labels.get("UUID", "")))
            meta.setdefault(key, (labels.get("modelName"), labels.get("UUID"), "DCGM exporter"))
        by_gpu.setdefault(key, {})[name] = value
    gpus = []
    for i, key in enumerate(sorted(by_gpu, key=lambda k: (k[0], _index_order(k[1])))):
        raw = by_gpu[key]
        values = {quantity: raw[field] * scale for field, (quantity, scale) in GPU_FIELDS.items() if field in raw}
        if "DCGM_FI_DEV_FB_USED" in raw and "DCGM_FI_DEV_FB_FREE" in raw:
            values["memory_total_bytes"] = sum(raw.get(part, 0.0) for part in FB_PARTS) * MIB
        model, uuid, exporter = meta[key]
        if "dram_bw_util_pct" in values:
            values["dram_bw_util_pct"] = min(max(values["dram_bw_util_pct"], 0.0), 100.0)
            peak = spec_peak_bandwidth(model) if model else None
            if peak is not None:
                values["dram_bw_bytes_per_s"] = values["dram_bw_util_pct"] / 100.0 * peak
        gpus.append(RemoteGpu(f"gpu{i}", key[0], key[1], model, uuid, values, exporter))
    return gpus


parse_dcgm = parse_exporter  # the name the first exporter gave it


def _index_order(index: str) -> tuple[int, str]:
    return (int(index), "") if index.isdigit() else (1 << 30, index)


def support_reports(gpus: list[RemoteGpu], url: str) -> list[TelemetrySupport]:
    """Per GPU, what the exporter sends and why not the rest (its field lists are configurable)."""
    every = sorted({q for q, _ in GPU_FIELDS.values()} | {"memory_total_bytes", "dram_bw_bytes_per_s"})
    reports = []
    shown = mask_url(url)
    for gpu in gpus:
        unsupported = {q: f"not sent by this {gpu.exporter} (its field list is configurable)"
                       for q in every if q not in gpu.values}
        if "dram_bw_util_pct" in gpu.values and "dram_bw_bytes_per_s" not in gpu.values:
            unsupported["dram_bw_bytes_per_s"] = f"no published peak bandwidth on file for {gpu.name or 'this GPU'}"
        where = f"{gpu.host} " if gpu.host else ""
        reports.append(TelemetrySupport(
            source=gpu.source, available=True, supported=sorted(gpu.values), unsupported=unsupported,
            detail=f"remote: {where}GPU {gpu.index} from the {gpu.exporter} at {shown}", name=gpu.name, uuid=gpu.uuid))
    return reports


EXPORTER_PAGE_MAX_BYTES = 64 * 2**20


def fetch_text(url: str, timeout_s: float) -> str:
    """The exporter's page, whole within ``timeout_s``; any failure is one RemoteGpuError line."""
    try:
        reply = fetch(url, deadline_s=timeout_s, max_bytes=EXPORTER_PAGE_MAX_BYTES)
    except FetchError as exc:
        raise RemoteGpuError(f"{type(exc).__name__}: {exc.reason} ({mask_url(url)})") from exc
    if not reply.ok:
        raise RemoteGpuError(f"HTTPError: HTTP Error {reply.status} ({mask_url(url)})")
    return reply.text


def read_gpus(url: str, timeout_s: float = 3.0) -> list[RemoteGpu]:
    text = fetch_text(url, timeout_s)
    try:
        return parse_exporter(text)
    except ValueError as exc:
        raise RemoteGpuError(f"unreadable metrics text from {mask_url(url)}: {exc}") from exc
