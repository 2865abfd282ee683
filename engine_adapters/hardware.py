"""A snapshot of the hardware a run happens on: what capability checks and run records need.

NVML is read through ``pynvml`` (nvidia-ml-py); without a GPU or driver the snapshot simply
has no GPUs. Live sampling is the telemetry package's job; this is a one-off fingerprint.
"""

from __future__ import annotations

import os
import platform
import socket
from functools import lru_cache
from typing import Any

import psutil
from pydantic import BaseModel, Field


class GpuInfo(BaseModel):
    index: int
    name: str
    uuid: str = ""
    memory_total_bytes: int = 0
    compute_capability: tuple[int, int] | None = None
    memory_bus_width_bits: int | None = None
    max_memory_clock_mhz: int | None = None

    @property
    def supports_fp8(self) -> bool:
        """FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper)."""
        return self.compute_capability is not None and self.compute_capability >= (8, 9)

    @property
    def peak_memory_bandwidth_bytes_per_s(self) -> float | None:
        """Theoretical DRAM bandwidth: bus width x memory clock x 2 (double data rate)."""
        if not self.memory_bus_width_bits or not self.max_memory_clock_mhz:
            return None
        return self.memory_bus_width_bits / 8 * self.max_memory_clock_mhz * 1e6 * 2


class HardwareInfo(BaseModel):
    """Fingerprint of the machine: GPUs, driver, CPU and RAM."""

    gpus: list[GpuInfo] = Field(default_factory=list)
    driver_version: str | None = None
    nvml_error: str | None = None
    cpu_model: str = ""
    cpu_count_logical: int = 0
    cpu_flags: list[str] = Field(default_factory=list)
    ram_total_bytes: int = 0
    hostname: str = ""
    os: str = ""

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def cpu_has_avx512_or_amx(self) -> bool:
        return any(f.startswith("avx512") or f.startswith("amx") for f in self.cpu_flags)

    def holds_fp8_kv_cache(self, cpu_engine: bool) -> bool:
        """Whether an engine here can keep its KV cache in FP8: on a GPU, any the engines run on;
        vLLM's CPU build only with AVX-512 or AMX (without them it refuses to start)."""
        return self.cpu_has_avx512_or_amx if cpu_engine else self.has_gpu

    def summary(self) -> str:
        if self.gpus:
            names = ", ".join(g.name for g in self.gpus)
            return f"{len(self.gpus)} GPU ({names}), driver {self.driver_version}"
        return f"no NVIDIA GPU; CPU {self.cpu_model} x{self.cpu_count_logical}, {self.ram_total_bytes / 2**30:.0f} GiB RAM"


def _cpu_model_and_flags() -> tuple[str, list[str]]:
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = line.split(":", 1)[1].split()
                if flags and model:
                    break
    except OSError:
        pass
    return model, flags


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpus(nvml: Any | None = None) -> tuple[list[GpuInfo], str | None, str | None]:
    """Return (gpus, driver version, error) from NVML; ``nvml`` may be a fake for tests."""
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - dependency is declared
            return [], None, f"nvidia-ml-py not installed: {exc}"
        nvml = pynvml
    assert nvml is not None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], None, f"no NVIDIA GPU or driver ({exc})"
    try:
        driver = _as_str(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            info = GpuInfo(
                index=index,
                name=_as_str(nvml.nvmlDeviceGetName(handle)),
                uuid=_as_str(nvml.nvmlDeviceGetUUID(handle)),
                memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            )
            for attr, call in (
                ("compute_capability", lambda h=handle: tuple(nvml.nvmlDeviceGetCudaComputeCapability(h))),
                ("memory_bus_width_bits", lambda h=handle: int(nvml.nvmlDeviceGetMemoryBusWidth(h))),
                ("max_memory_clock_mhz",
                 lambda h=handle: int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_MEM))),
            ):
                try:
                    setattr(info, attr, call())
                except Exception:  # NVMLError_NotSupported on some boards
                    pass
            gpus.append(info)
        return gpus, driver, None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


@lru_cache(maxsize=1)
def probe_hardware() -> HardwareInfo:
    """Fingerprint this machine once per process (NVML init is not free)."""
    gpus, driver, error = probe_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and gpus:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        gpus = [g for g in gpus if str(g.index) in wanted or g.uuid in wanted]
    cpu_model, flags = _cpu_model_and_flags()
    return HardwareInfo(
        gpus=gpus,
        driver_version=driver,
        nvml_error=error,
        cpu_model=cpu_model,
        cpu_count_logical=psutil.cpu_count(logical=True) or 0,
        cpu_flags=flags,
        ram_total_bytes=psutil.virtual_memory().total,
        hostname=platform.node(),
        os=f"{platform.system()} {platform.release()}",
    )


def interface_of(address: str) -> str:
    """The network interface that holds ``address`` on this machine ("lo" for a loopback
    address): a transport told to use that one device reaches the address's network and no other."""
    if address.startswith("127.") or address in ("localhost", "::1"):
        return "lo"
    try:
        ip = socket.gethostbyname(address)  # a host name: the address it stands for here
    except OSError:
        raise ValueError(f"the address {address} does not resolve on this machine") from None
    if ip.startswith("127."):
        return "lo"
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    raise ValueError(f"no network interface of this machine has the address {address}")
