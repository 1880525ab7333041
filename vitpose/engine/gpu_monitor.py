"""Readings of the training GPU for the training report and the thermal guard.

`GpuMonitor(device).read()` returns, on a CUDA device, the peak memory allocated by tensors and,
with nvidia-ml-py (pynvml) installed and a driver present, the GPU's utilisation, power, power
limit, temperature, SM clock and the reasons its clocks are held back. Anything it cannot read is
left out, so on a CPU (or without NVML) a reading is {} or memory only. The training loop calls
it at report points and hands the dict to `Telemetry.report` and `ThermalGuard.check`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

try:  # nvidia-ml-py: optional, GPU statistics only
    import pynvml
except ImportError:  # pragma: no cover - depends on the install
    pynvml = None

# NVML clock event ("throttle") reason bits, as in nvml.h. A set bit means the clocks are held
# below their maximum for that reason; "idle" during training means the GPU had nothing to do.
CLOCK_REASONS = {
    0x0001: "idle",
    0x0002: "application clock setting",
    0x0004: "software power cap",
    0x0008: "hardware slowdown",
    0x0010: "sync boost",
    0x0020: "software thermal slowdown",
    0x0040: "hardware thermal slowdown",
    0x0080: "power brake",
    0x0100: "display clock setting",
    0x0200: "board limit",
    0x0400: "reliability",
}


def decode_clock_reasons(mask: int) -> list[str]:
    """NVML clock event reason bit mask -> reasons in words, lowest bit first."""
    words = [word for bit, word in CLOCK_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_REASONS)
    if unknown:
        words.append(f"unknown reason 0x{unknown:x}")
    return words


def read_nvml(nvml, handle) -> dict[str, Any]:
    """One NVML reading of the GPU behind `handle`.

    A quantity the GPU does not report (power on some boards, say) is left out rather than
    failing the reading.

    Args:
        nvml: the pynvml module (tests pass a stand-in).
        handle: the device handle from `find_handle`.

    Returns:
        gpu_util (%), power_w, power_limit_w, temp_c, sm_clock_mhz, clock_reasons (list of words).
    """
    stats: dict[str, Any] = {}
    errors = getattr(nvml, "NVMLError", Exception)  # NVMLError_NotSupported and friends

    def read(key, fn):
        with contextlib.suppress(errors):
            stats[key] = fn()

    read("gpu_util", lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
    read("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
    read("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
    read("temp_c", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
    read("sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
    # Newer bindings call them "clock event reasons"; older ones only have the "throttle" name.
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    if reasons is not None:
        read("clock_reasons", lambda: decode_clock_reasons(int(reasons(handle))))
    return stats


def find_handle(nvml, properties, index: int):
    """The NVML handle of a CUDA device, or None (no driver, no permission, not found).

    CUDA and NVML number GPUs differently when CUDA_VISIBLE_DEVICES reorders them, so the
    device is found by its UUID, then by its PCI bus id, and only last by index.

    Args:
        nvml: the pynvml module (or a stand-in).
        properties: `torch.cuda.get_device_properties(index)` (uuid, pci_domain_id, pci_bus_id,
            pci_device_id; older torch lacks some, and that lookup is skipped).
        index: the CUDA device index.
    """
    errors = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except errors:  # no driver library, or no permission
        return None
    lookups = []
    if getattr(properties, "uuid", None) is not None:
        lookups.append(lambda: nvml.nvmlDeviceGetHandleByUUID(f"GPU-{properties.uuid}"))
    if hasattr(properties, "pci_bus_id"):
        bus = f"{properties.pci_domain_id:08x}:{properties.pci_bus_id:02x}:{properties.pci_device_id:02x}.0"
        lookups.append(lambda: nvml.nvmlDeviceGetHandleByPciBusId(bus))
    lookups.append(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    for lookup in lookups:
        with contextlib.suppress(errors, AttributeError, TypeError):
            return lookup()
    return None


class GpuMonitor:
    """Readings of one training device; empty for anything but a CUDA device.

    Args:
        device: the training device.
        nvml: the pynvml module (default: the installed one, or none); tests pass a stand-in.
        properties: the device's CUDA properties (default: asked from torch); tests pass a stand-in.
    """

    def __init__(self, device, nvml=None, properties=None):
        self.device = torch.device(device)
        self._nvml = nvml if nvml is not None else pynvml
        self._handle = None
        if self.device.type == "cuda" and self._nvml is not None:
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            properties = properties if properties is not None else torch.cuda.get_device_properties(index)
            self._handle = find_handle(self._nvml, properties, index)

    @property
    def has_nvml(self) -> bool:
        """Whether readings carry the NVML figures (temperature among them)."""
        return self._handle is not None

    def read(self) -> dict[str, Any]:
        """mem_gib (peak CUDA memory allocated by tensors) and the NVML figures (see read_nvml)."""
        stats: dict[str, Any] = {}
        # Not before CUDA is initialised: asking would initialise it (and fail on a machine without).
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            stats["mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        if self._handle is not None:
            stats.update(read_nvml(self._nvml, self._handle))
        return stats

    def temperature(self) -> int | None:
        """The GPU temperature in C, or None when it cannot be read."""
        if self._handle is None:
            return None
        with contextlib.suppress(getattr(self._nvml, "NVMLError", Exception)):
            return int(self._nvml.nvmlDeviceGetTemperature(self._handle, self._nvml.NVML_TEMPERATURE_GPU))
        return None
