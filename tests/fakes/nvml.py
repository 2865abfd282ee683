"""A stand-in for the ``pynvml`` module, for tests and benchmarks on machines without a GPU.

It behaves like the real library at its boundary: calls before ``nvmlInit`` raise
``NVMLError_Uninitialized``; a missing driver makes ``nvmlInit`` raise
``NVMLError_LibraryNotFound``; unsupported queries raise ``NVMLError_NotSupported``; a function
the driver lacks raises ``NVMLError_FunctionNotFound``; init/shutdown are reference counted;
GPM is driven through the real ctypes structures (``c_nvmlGpmMetricsGet_t``) with per-metric
return codes, and reports ``isSupportedDevice = 0`` on pre-Hopper cards. The error classes and
structures ARE pynvml's, so code that works against this works against the real module.
Not a GPU simulator: values are whatever the test sets in ``FakeGpu.state``.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


def _default_state() -> dict[str, float]:
    return {"memory_used_bytes": 10 * 2**30, "gpu_util_pct": 0, "memory_busy_pct": 0, "power_mw": 70_000,
            "sm_clock_mhz": 345, "mem_clock_mhz": 2619, "temperature_c": 31, "dram_bw_util_pct": 0.0,
            "pcie_tx_kb_per_s": 0, "pcie_rx_kb_per_s": 0, "gpm_pcie_tx_mib_per_s": 0.0, "gpm_pcie_rx_mib_per_s": 0.0}


@dataclass
class FakeGpu:
    """One fake device. ``unsupported``: NVML function names that raise NotSupported;
    ``no_permission``: names that raise NoPermission; ``gpm``: Hopper-style GPM support;
    ``gpm_unsupported_metrics``: GPM metric ids whose per-metric return is NOT_SUPPORTED."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total_bytes: int = 80 * 2**30
    compute_capability: tuple[int, int] = (9, 0)
    memory_bus_width_bits: int = 5120
    max_memory_clock_mhz: int = 2619
    gpm: bool = True
    unsupported: set[str] = field(default_factory=set)
    no_permission: set[str] = field(default_factory=set)
    gpm_unsupported_metrics: set[int] = field(default_factory=set)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    state: dict[str, float] = field(default_factory=_default_state)

    @classmethod
    def a100(cls) -> FakeGpu:
        """Ampere: no GPM, so no DRAM bandwidth; legacy PCIe counters instead."""
        return cls(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), memory_bus_width_bits=5120,
                   max_memory_clock_mhz=1593, gpm=False)

    @classmethod
    def h200(cls) -> FakeGpu:
        return cls(name="NVIDIA H200", memory_total_bytes=141 * 2**30, memory_bus_width_bits=6144,
                   max_memory_clock_mhz=3201)


_address = itertools.count(0x1000, 0x10)


class FakeNvml:
    """Module-like object: pass it wherever ``pynvml`` is expected (``nvml=`` parameters)."""

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver_missing: bool = False,
                 driver_version: str = "560.35.03") -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.driver_missing = driver_missing
        self.driver_version = driver_version
        self.calls: Counter[str] = Counter()
        self._init_count = 0
        self._gpm_samples: dict[int, tuple[int, float]] = {}  # address -> (device index, time)

    # Constants, error classes and structures come from the real module.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and name[4:5].isupper():
            def missing(*_args: Any, **_kwargs: Any) -> Any:
                self.calls[name] += 1
                raise pynvml.NVMLError_FunctionNotFound()
            return missing
        return getattr(pynvml, name)

    # -- helpers ----------------------------------------------------------------------------------

    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if self._init_count <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _device(self, fn: str, handle: Any) -> FakeGpu:
        """A call about one GPU: counted, and refused where that GPU's driver refuses it."""
        self._enter(fn)
        gpu = self.gpus[handle.index]
        if fn in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if fn in gpu.no_permission:
            raise pynvml.NVMLError_NoPermission()
        return gpu

    # -- init ---------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.driver_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        if self._init_count <= 0:
            raise pynvml.NVMLError_Uninitialized()
        self._init_count -= 1

    @property
    def initialised(self) -> bool:
        return self._init_count > 0

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return SimpleNamespace(index=index)

    # -- static info ---------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._device("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetMemoryBusWidth(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetMemoryBusWidth", handle).memory_bus_width_bits

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._device("nvmlDeviceGetMaxClockInfo", handle)
        return _selected({pynvml.NVML_CLOCK_MEM: gpu.max_memory_clock_mhz, pynvml.NVML_CLOCK_SM: 1980}, clock_type)

    # -- live values ---------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        mem = pynvml.c_nvmlMemory_t()
        mem.total = gpu.memory_total_bytes
        mem.used = int(gpu.state["memory_used_bytes"])
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = int(gpu.state["gpu_util_pct"]), int(gpu.state["memory_busy_pct"])
        return util

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetPowerUsage", handle)
        return int(gpu.state["power_mw"])

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        return _selected({pynvml.NVML_CLOCK_SM: gpu.state["sm_clock_mhz"],
                          pynvml.NVML_CLOCK_MEM: gpu.state["mem_clock_mhz"]}, clock_type)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        return _selected({pynvml.NVML_TEMPERATURE_GPU: gpu.state["temperature_c"]}, sensor)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._device("nvmlDeviceGetPcieThroughput", handle)
        return _selected({pynvml.NVML_PCIE_UTIL_TX_BYTES: gpu.state["pcie_tx_kb_per_s"],
                          pynvml.NVML_PCIE_UTIL_RX_BYTES: gpu.state["pcie_rx_kb_per_s"]}, counter)

    # -- GPM ----------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._device("nvmlGpmQueryDeviceSupport", handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.gpm else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        return ctypes.cast(ctypes.c_void_p(next(_address)), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._gpm_samples.pop(_addr(sample), None)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._device("nvmlGpmSampleGet", handle)
        if not gpu.gpm:
            raise pynvml.NVMLError_NotSupported()
        self._gpm_samples[_addr(sample)] = (handle.index, time.monotonic())
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        first = self._gpm_samples.get(_addr(request.sample1))
        second = self._gpm_samples.get(_addr(request.sample2))
        if first is None or second is None or first[0] != second[0] or second[1] <= first[1]:
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[second[0]]
        values = {pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: gpu.state["dram_bw_util_pct"],
                  pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: gpu.state["gpm_pcie_tx_mib_per_s"],
                  pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: gpu.state["gpm_pcie_rx_mib_per_s"]}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in gpu.gpm_unsupported_metrics or metric.metricId not in values:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                metric.value = 0.0
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = float(values[metric.metricId])
        return request


def _selected(values: dict[int, float], selector: int) -> int:
    """What a call that takes a selector (a clock, a sensor, a counter) returns for it; NVML refuses
    a selector it does not know."""
    if selector not in values:
        raise pynvml.NVMLError_InvalidArgument()
    return int(values[selector])


def _addr(sample: Any) -> int:
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)
