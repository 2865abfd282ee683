"""Live telemetry: GPU (NVML), host (psutil) and the engine's own Prometheus metrics, sampled on
background threads and published on one bus (see ``collector`` for the event contract)."""

from app.telemetry.collector import TelemetryCollector
from app.telemetry.engine_metrics import ENGINE_QUANTITIES, MetricMap, RateDeriver, Scrape, metrics_url_from
from app.telemetry.gpu import GPU_QUANTITIES, GpuSampler
from app.telemetry.host import HOST_QUANTITIES, HostSampler, ProcessTree

__all__ = [
    "ENGINE_QUANTITIES", "GPU_QUANTITIES", "HOST_QUANTITIES", "GpuSampler", "HostSampler", "MetricMap", "ProcessTree",
    "RateDeriver", "Scrape", "TelemetryCollector", "metrics_url_from",
]
