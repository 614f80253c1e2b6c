"""The speed of light of a kernel problem on a device: the fastest any fp32 implementation could run it.

It is the larger of the problem's FLOPs at the device's fp32 (non-tensor-core) peak and its bytes (each input,
parameter and output moved once) at its memory bandwidth; a result's share is that time over its median. The peaks
are the figures recorded below for each device. Pure and dependency-free: the GPU benchmark imports it on a bare
image (no pydantic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeaks:
    """A device's published fp32 (non-tensor-core) arithmetic peak and memory bandwidth."""

    name: str
    fp32_flops_per_s: float
    bytes_per_s: float

    def describe(self) -> str:
        return f"{self.name}: {self.fp32_flops_per_s / 1e12:g} TFLOP/s fp32, {self.bytes_per_s / 1e12:g} TB/s"


# The figures recorded for each device (vendor datasheets; SXM parts where there are several): name fragment ->
# peaks, the most specific fragment first. A device not listed has no speed of light (reports leave it blank).
DEVICE_PEAKS: tuple[DevicePeaks, ...] = (
    DevicePeaks("H200", 67e12, 4.8e12),
    DevicePeaks("H100 PCIe", 51e12, 2.0e12),
    DevicePeaks("H100", 67e12, 3.35e12),
    DevicePeaks("A100", 19.5e12, 2.039e12),
    DevicePeaks("L40S", 91.6e12, 0.864e12),
    DevicePeaks("L4", 30.3e12, 0.3e12),
    DevicePeaks("RTX 4090", 82.6e12, 1.008e12),
)


def device_peaks(device_name: str) -> DevicePeaks | None:
    return next((p for p in DEVICE_PEAKS if p.name in device_name), None)


@dataclass(frozen=True)
class SpeedOfLight:
    """The fastest an fp32 implementation could run: the larger of its FLOPs at the fp32 peak and its bytes at the
    memory bandwidth (each input, parameter and output moved once)."""

    ms: float
    bound: str  # "compute" or "memory": which of the two set it
    compute_ms: float
    memory_ms: float
    peaks: DevicePeaks

    def share(self, median_ms: float | None) -> float | None:
        """The share of the speed of light a time reaches (1.0: at the bound)."""
        return self.ms / median_ms if median_ms and median_ms > 0 and math.isfinite(median_ms) else None


def speed_of_light(flops: float, nbytes: float, device_name: str) -> SpeedOfLight | None:
    peaks = device_peaks(device_name)
    if peaks is None or (flops <= 0 and nbytes <= 0):
        return None
    compute_ms = flops / peaks.fp32_flops_per_s * 1e3
    memory_ms = nbytes / peaks.bytes_per_s * 1e3
    return SpeedOfLight(ms=max(compute_ms, memory_ms), bound="compute" if compute_ms >= memory_ms else "memory",
                        compute_ms=compute_ms, memory_ms=memory_ms, peaks=peaks)
