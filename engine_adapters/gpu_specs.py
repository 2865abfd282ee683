"""Published specifications of the GPUs tunebench plans for: one table, keyed by the NVML name.

The planner's ceilings (``app.planner``) and the telemetry's bandwidth check
(``app.telemetry.gpu``) both read this table, so a card's bandwidth is written down once.

Figures are the vendor's *dense* tensor throughput (no 2:4 sparsity) and peak DRAM bandwidth.
Memory is the marketed capacity in GiB (NVML reports slightly less: firmware reserves some).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 2**30
TB = 1e12


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One card's published figures. ``fp8_dense_tflops`` is None where the card has no FP8 tensor cores."""

    name: str
    nvml_pattern: str
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    source: str

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_dense_tflops is not None


# Order matters: the first pattern that matches an NVML name wins (specific before general).
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("GH200", r"GH200", 96 * GIB, 4.0 * TB, 989.0, 1979.0, "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    GpuSpec("H200 SXM", r"H200", 141 * GIB, 4.8 * TB, 989.0, 1979.0, "NVIDIA H200 Tensor Core GPU datasheet"),
    GpuSpec("H100 NVL", r"H100.*NVL", 94 * GIB, 3.9 * TB, 835.0, 1671.0, "NVIDIA H100 Tensor Core GPU datasheet"),
    GpuSpec("H100 PCIe", r"H100.*PCIe", 80 * GIB, 2.0 * TB, 756.0, 1513.0, "NVIDIA H100 Tensor Core GPU datasheet"),
    GpuSpec("H100 SXM", r"H100", 80 * GIB, 3.35 * TB, 989.0, 1979.0, "NVIDIA H100 Tensor Core GPU datasheet"),
    GpuSpec("H800 SXM", r"H800", 80 * GIB, 3.35 * TB, 989.0, 1979.0,
            "NVIDIA H800 datasheet (H100 compute and HBM3; reduced NVLink)"),
    GpuSpec("H20", r"H20\b", 96 * GIB, 4.0 * TB, 148.0, 296.0, "NVIDIA H20 product brief"),
    GpuSpec("B200", r"B200", 180 * GIB, 8.0 * TB, 2250.0, 4500.0, "NVIDIA HGX B200 datasheet (per GPU)"),
    GpuSpec("A100 80GB PCIe", r"A100.*80GB.*PCIe", 80 * GIB, 1.935 * TB, 312.0, None,
            "NVIDIA A100 Tensor Core GPU datasheet"),
    GpuSpec("A100 80GB SXM", r"A100.*80GB", 80 * GIB, 2.039 * TB, 312.0, None, "NVIDIA A100 Tensor Core GPU datasheet"),
    GpuSpec("A100 40GB", r"A100", 40 * GIB, 1.555 * TB, 312.0, None, "NVIDIA A100 Tensor Core GPU datasheet"),
    GpuSpec("L40S", r"L40S", 48 * GIB, 0.864 * TB, 362.0, 733.0, "NVIDIA L40S datasheet"),
    GpuSpec("RTX 4090", r"RTX 4090", 24 * GIB, 1.008 * TB, 165.0, 330.0,
            "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090, FP32 accumulate)"),
    GpuSpec("RTX 5090", r"RTX 5090", 32 * GIB, 1.792 * TB, 209.0, 419.0,
            "NVIDIA RTX Blackwell architecture whitepaper (GeForce RTX 5090, FP32 accumulate)"),
)


def find_gpu_spec(name: str) -> GpuSpec | None:
    """The spec for an NVML device name ("NVIDIA H100 80GB HBM3") or a table name ("H100 SXM")."""
    for spec in GPU_SPECS:
        if spec.name.lower() == name.strip().lower():
            return spec
    for spec in GPU_SPECS:
        if re.search(spec.nvml_pattern, name, flags=re.IGNORECASE):
            return spec
    return None


def spec_peak_bandwidth(name: str) -> float | None:
    """Published peak DRAM bandwidth (bytes/s) for an NVML name, or None when the card is not on file."""
    spec = find_gpu_spec(name)
    return spec.memory_bandwidth_bytes_per_s if spec else None
