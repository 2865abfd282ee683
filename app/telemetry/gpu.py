"""GPU sampler on NVML (``pynvml`` from nvidia-ml-py): one reading per visible GPU per tick.

Each quantity is probed once when the sampler opens; what the device or driver does not support
is reported once in the support report and never queried again, so an old card or a restricted
container gives a quiet, honest "unsupported" instead of a stream of errors. Without a driver or
GPU the sampler opens in a "no NVIDIA GPU" state and samples nothing.

Units: NVML gives memory in bytes, power in milliwatts, clocks in MHz, temperature in degrees C,
legacy PCIe throughput in KB/s (KiB, a 20 ms window per call) and GPM PCIe rates in MiB/s. NVML's
"memory utilization" is the fraction of time the memory controller was busy -- NOT bandwidth; it
is published as ``memory_busy_pct``. Real DRAM bandwidth comes from GPM (Hopper and newer).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.events import TelemetrySupport
from engine_adapters.gpu_specs import spec_peak_bandwidth
from engine_adapters.hardware import GpuInfo, probe_gpus

# Quantities one GPU sample may carry (the canonical value names; units in names).
GPU_QUANTITIES: tuple[str, ...] = (
    "memory_used_bytes", "memory_total_bytes", "engine_memory_used_bytes", "gpu_util_pct",
    "memory_busy_pct", "dram_bw_util_pct", "dram_bw_bytes_per_s", "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s", "power_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
)

LABELS: dict[str, str] = {
    "memory_busy_pct": "memory controller busy (% of time, not bandwidth)",
    "dram_bw_util_pct": "DRAM bandwidth (% of peak, GPM)",
    "gpu_util_pct": "GPU busy (% of time a kernel ran)",
}

SPEC_TOLERANCE = 0.10  # beyond this the computed peak is not trusted and the spec is used

KIB, MIB = 1024.0, 1024.0 * 1024.0


@dataclass
class PeakBandwidth:
    """The DRAM peak a GPM utilization is multiplied by, and how it was checked."""

    bytes_per_s: float | None
    computed_bytes_per_s: float | None
    spec_bytes_per_s: float | None
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {"peak_bytes_per_s": self.bytes_per_s, "computed_bytes_per_s": self.computed_bytes_per_s,
                "spec_bytes_per_s": self.spec_bytes_per_s, "note": self.note}


def peak_bandwidth(info: GpuInfo) -> PeakBandwidth:
    """Peak from bus width x max memory clock x 2 (GpuInfo), checked against the published spec."""
    computed = info.peak_memory_bandwidth_bytes_per_s
    spec = spec_peak_bandwidth(info.name)
    if computed is None and spec is None:
        return PeakBandwidth(None, None, None, "peak unknown: NVML gave no bus width or memory clock")
    if computed is None:
        return PeakBandwidth(spec, None, spec, "computed peak unavailable; using the published spec")
    if spec is None:
        return PeakBandwidth(computed, computed, None, "computed from bus width x memory clock x 2 (no spec on file)")
    deviation = abs(computed - spec) / spec
    if deviation > SPEC_TOLERANCE:
        return PeakBandwidth(spec, computed, spec, f"computed peak is {deviation:.0%} off the spec; using the spec")
    return PeakBandwidth(computed, computed, spec, f"computed peak within {deviation:.1%} of the spec")


def visible_gpus(gpus: list[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """The GPUs CUDA_VISIBLE_DEVICES selects (by index or UUID); all when it is unset."""
    if cuda_visible_devices is None:
        return gpus
    wanted = [v.strip() for v in cuda_visible_devices.split(",") if v.strip()]
    return [g for g in gpus if str(g.index) in wanted or g.uuid in wanted]


@dataclass
class _Reader:
    """One NVML query and the quantities it yields."""

    key: str
    quantities: tuple[str, ...]
    read: Callable[[Any], dict[str, float]]
    min_interval_s: float = 0.0
    last_t: float = field(default=-1e18)
    last_values: dict[str, float] = field(default_factory=dict)


@dataclass
class _Device:
    info: GpuInfo
    handle: Any
    peak: PeakBandwidth
    readers: list[_Reader] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)
    gpm: _Gpm | None = None
    gpm_pcie: bool = False


class _Gpm:
    """GPM metrics between consecutive samples: DRAM bandwidth utilization and PCIe rates."""

    def __init__(self, nvml: Any, handle: Any, metric_ids: list[int]) -> None:
        self.nvml, self.handle, self.metric_ids = nvml, handle, metric_ids
        self.prev = nvml.nvmlGpmSampleAlloc()
        self.cur = nvml.nvmlGpmSampleAlloc()
        self.request = nvml.c_nvmlGpmMetricsGet_t()
        nvml.nvmlGpmSampleGet(handle, self.prev)

    def read(self) -> dict[int, tuple[int, float]]:
        """{metric id: (nvml return code, value)} over the interval since the previous read."""
        nvml = self.nvml
        nvml.nvmlGpmSampleGet(self.handle, self.cur)
        req = self.request
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(self.metric_ids)
        req.sample1, req.sample2 = self.prev, self.cur
        for i, metric_id in enumerate(self.metric_ids):
            req.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(req)
        self.prev, self.cur = self.cur, self.prev
        return {req.metrics[i].metricId: (int(req.metrics[i].nvmlReturn), float(req.metrics[i].value))
                for i in range(len(self.metric_ids))}

    def close(self) -> None:
        for sample in (self.prev, self.cur):
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except Exception:  # noqa: BLE001 - freeing on shutdown must not raise
                pass


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class GpuSampler:
    """Reads every visible GPU. ``open`` probes support once; ``sample`` returns one
    ``(source, values)`` per GPU and never raises on an NVML error (it is counted)."""

    def __init__(self, nvml: Any | None = None, engine_pids: Callable[[], set[int]] | None = None,
                 pcie_fallback_interval_s: float = 1.0, cuda_visible_devices: str | None = None) -> None:
        self._nvml: Any = nvml
        self._engine_pids = engine_pids
        self._pcie_fallback_interval_s = pcie_fallback_interval_s
        self._cuda_visible = cuda_visible_devices if cuda_visible_devices is not None \
            else os.environ.get("CUDA_VISIBLE_DEVICES")
        self._devices: list[_Device] = []
        self._initialised = False
        self.no_gpu_reason: str | None = None
        self.errors = 0
        self.notices: list[str] = []  # first failure of a once-working quantity, for the collector
        self._reported: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> list[TelemetrySupport]:
        """Initialise NVML and probe each quantity once; returns the support reports."""
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]
            except ImportError as exc:  # pragma: no cover - declared dependency
                return self._no_gpu(f"nvidia-ml-py not installed ({exc})")
            self._nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return self._no_gpu(f"NVML could not start: {exc}")
        self._initialised = True
        gpus, _driver, error = probe_gpus(nvml)
        if error:
            return self._no_gpu(error)
        gpus = visible_gpus(gpus, self._cuda_visible)
        if not gpus:
            return self._no_gpu("NVML found no visible GPU")
        reports = []
        for info in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(info.index)
            except Exception as exc:  # noqa: BLE001
                self.errors += 1
                reports.append(TelemetrySupport(source=f"gpu{info.index}", available=False,
                                                detail=f"device unavailable: {_error_text(exc)}"))
                continue
            device = _Device(info, handle, peak_bandwidth(info))
            self._probe(device)
            self._devices.append(device)
            reports.append(self._report(device))
        return reports

    def close(self) -> None:
        for device in self._devices:
            if device.gpm is not None:
                device.gpm.close()
        self._devices = []
        if self._initialised and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._initialised = False

    def _no_gpu(self, reason: str) -> list[TelemetrySupport]:
        self.no_gpu_reason = reason
        return [TelemetrySupport(source="gpu", available=False, state="no NVIDIA GPU",
                                 detail=f"no NVIDIA GPU: {reason}")]

    @property
    def sources(self) -> list[str]:
        return [f"gpu{d.info.index}" for d in self._devices]

    # -- probing ------------------------------------------------------------------------------

    def _candidate_readers(self, device: _Device) -> list[_Reader]:
        nvml, handle = self._nvml, device.handle

        def memory(_h: Any) -> dict[str, float]:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return {"memory_used_bytes": float(info.used), "memory_total_bytes": float(info.total)}

        def utilization(_h: Any) -> dict[str, float]:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            return {"gpu_util_pct": float(rates.gpu), "memory_busy_pct": float(rates.memory)}

        def power(_h: Any) -> dict[str, float]:
            return {"power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}

        def sm_clock(_h: Any) -> dict[str, float]:
            return {"sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))}

        def mem_clock(_h: Any) -> dict[str, float]:
            return {"mem_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))}

        def temperature(_h: Any) -> dict[str, float]:
            return {"temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))}

        readers = [
            _Reader("memory", ("memory_used_bytes", "memory_total_bytes"), memory),
            _Reader("utilization", ("gpu_util_pct", "memory_busy_pct"), utilization),
            _Reader("power", ("power_w",), power),
            _Reader("sm_clock", ("sm_clock_mhz",), sm_clock),
            _Reader("mem_clock", ("mem_clock_mhz",), mem_clock),
            # Slow-moving: read once a second, repeated in between (each NVML call is an ioctl).
            _Reader("temperature", ("temperature_c",), temperature, min_interval_s=1.0),
        ]
        if self._engine_pids is not None:
            engine_pids = self._engine_pids

            def engine_memory(_h: Any) -> dict[str, float]:
                pids = engine_pids()
                used = 0.0
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid in pids and proc.usedGpuMemory is not None:
                        used += float(proc.usedGpuMemory)
                return {"engine_memory_used_bytes": used}

            readers.append(_Reader("engine_memory", ("engine_memory_used_bytes",), engine_memory, min_interval_s=0.5))
        return readers

    def _probe(self, device: _Device) -> None:
        """Call each query once; keep what works, record why the rest does not."""
        for reader in self._candidate_readers(device):
            try:
                reader.read(device.handle)
            except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, NoPermission, ...
                for q in reader.quantities:
                    device.unsupported[q] = _error_text(exc)
                continue
            device.readers.append(reader)
        if self._engine_pids is None:
            device.unsupported["engine_memory_used_bytes"] = "no engine process to attribute memory to"
        self._probe_gpm(device)

    def _probe_gpm(self, device: _Device) -> None:
        nvml = self._nvml
        bw_quantities = ("dram_bw_util_pct", "dram_bw_bytes_per_s")
        pcie_via_gpm = False
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(device.handle)
            if not support.isSupportedDevice:
                raise LookupError("GPM not supported on this GPU (needs Hopper or newer)")
            ids = [nvml.NVML_GPM_METRIC_DRAM_BW_UTIL, nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
                   nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC]
            gpm = _Gpm(nvml, device.handle, ids)
            time.sleep(0.02)  # GPM needs two samples some time apart to compute a metric
            results = gpm.read()
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported / FunctionNotFound / LookupError
            reason = str(exc) if isinstance(exc, LookupError) else _error_text(exc)
            for q in bw_quantities:
                device.unsupported[q] = reason
        else:
            device.gpm = gpm
            code, _ = results[nvml.NVML_GPM_METRIC_DRAM_BW_UTIL]
            if code != 0:
                for q in bw_quantities:
                    device.unsupported[q] = f"GPM DRAM bandwidth metric returned NVML error {code}"
            elif device.peak.bytes_per_s is None:
                device.unsupported["dram_bw_bytes_per_s"] = device.peak.note
            tx_code, _ = results[nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC]
            rx_code, _ = results[nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC]
            pcie_via_gpm = tx_code == 0 and rx_code == 0
            if all(q in device.unsupported for q in bw_quantities) and not pcie_via_gpm:
                gpm.close()
                device.gpm = None
        device.gpm_pcie = pcie_via_gpm
        if not pcie_via_gpm:
            self._probe_legacy_pcie(device)

    def _probe_legacy_pcie(self, device: _Device) -> None:
        """nvmlDeviceGetPcieThroughput blocks ~20 ms per call, so it is read at most once a second."""
        nvml, handle = self._nvml, device.handle

        def pcie(_h: Any) -> dict[str, float]:
            return {"pcie_tx_bytes_per_s": nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES) * KIB,
                    "pcie_rx_bytes_per_s": nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES) * KIB}

        reader = _Reader("pcie", ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"), pcie,
                         min_interval_s=self._pcie_fallback_interval_s)
        try:
            reader.read(handle)
        except Exception as exc:  # noqa: BLE001
            for q in reader.quantities:
                device.unsupported[q] = _error_text(exc)
            return
        device.readers.append(reader)

    def _report(self, device: _Device) -> TelemetrySupport:
        supported = [q for q in GPU_QUANTITIES if q not in device.unsupported]
        return TelemetrySupport(
            source=f"gpu{device.info.index}", available=True, name=device.info.name,
            uuid=device.info.uuid, supported=supported, unsupported=dict(device.unsupported),
            peak_bandwidth=device.peak.as_dict(), labels=LABELS,
            detail=f"{device.info.name}: {len(supported)} of {len(GPU_QUANTITIES)} quantities supported")

    # -- sampling -----------------------------------------------------------------------------

    def sample(self) -> list[tuple[str, dict[str, float]]]:
        out = []
        for device in self._devices:
            values: dict[str, float] = {}
            now_s = time.monotonic()
            for reader in list(device.readers):
                if reader.min_interval_s and now_s - reader.last_t < reader.min_interval_s:
                    values.update(reader.last_values)  # a slow query repeats its last reading
                    continue
                try:
                    reader.last_values = reader.read(device.handle)
                    reader.last_t = now_s
                    values.update(reader.last_values)
                except Exception as exc:  # noqa: BLE001
                    self._failed(device, reader.key, reader.quantities, exc)
                    if self._is_not_supported(exc):
                        device.readers.remove(reader)
            if device.gpm is not None:
                self._sample_gpm(device, values)
            out.append((f"gpu{device.info.index}", values))
        return out

    def _sample_gpm(self, device: _Device, values: dict[str, float]) -> None:
        nvml = self._nvml
        assert device.gpm is not None
        try:
            results = device.gpm.read()
        except Exception as exc:  # noqa: BLE001
            self._failed(device, "gpm", ("dram_bw_util_pct",), exc)
            return
        code, util = results.get(nvml.NVML_GPM_METRIC_DRAM_BW_UTIL, (-1, 0.0))
        # An idle H200 gave NaN here (seen on one, driver 580): no reading, not a figure.
        if code == 0 and math.isfinite(util) and "dram_bw_util_pct" not in device.unsupported:
            util = min(max(util, 0.0), 100.0)
            values["dram_bw_util_pct"] = util
            if device.peak.bytes_per_s is not None:
                values["dram_bw_bytes_per_s"] = util / 100.0 * device.peak.bytes_per_s
        if device.gpm_pcie:
            for key, metric in (("pcie_tx_bytes_per_s", nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC),
                                ("pcie_rx_bytes_per_s", nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC)):
                code, mib_per_s = results.get(metric, (-1, 0.0))
                if code == 0 and math.isfinite(mib_per_s):
                    values[key] = max(mib_per_s, 0.0) * MIB

    def _is_not_supported(self, exc: BaseException) -> bool:
        cls = getattr(self._nvml, "NVMLError_NotSupported", None)
        return cls is not None and isinstance(exc, cls)

    def _failed(self, device: _Device, key: str, quantities: tuple[str, ...], exc: BaseException) -> None:
        """Count the error; report a quantity's first failure once, not every tick."""
        self.errors += 1
        flag = f"gpu{device.info.index}:{key}"
        if flag not in self._reported:
            self._reported.add(flag)
            self.notices.append(f"gpu{device.info.index}: reading {', '.join(quantities)} failed: {_error_text(exc)}")
