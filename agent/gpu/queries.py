"""The per-device NVML reads behind the DCGM-compatible metrics, as a table.

Each :class:`DeviceQuery` is one NVML call producing one or more catalogue
metrics (names and units as in dcgm-exporter's ``default-counters.csv``).
Adding a DCGM field means adding a row here and a row in ``catalogue.csv``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pynvml
from stormwatch.agent.gpu.backend import NvmlApi

MIB = 1024 * 1024

#: Pseudo metric carried in readings (not exported): framebuffer size in bytes.
MEMORY_TOTAL = "memory_total_bytes"


@dataclasses.dataclass(frozen=True)
class DeviceQuery:
    """One NVML call for one device.

    Attributes:
        call: NVML function name (the ``call`` label of ``stormwatch_gpu_nvml_errors_total``).
        read: ``(api, handle) -> {metric name: value}``; raises ``pynvml.NVMLError``.
    """

    call: str
    read: Callable[[NvmlApi, Any], Mapping[str, float]]


def _utilization(api: NvmlApi, handle: Any) -> Mapping[str, float]:
    rates = api.nvmlDeviceGetUtilizationRates(handle)
    return {"DCGM_FI_DEV_GPU_UTIL": rates.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": rates.memory}


def _memory(api: NvmlApi, handle: Any) -> Mapping[str, float]:
    mem = api.nvmlDeviceGetMemoryInfo(handle)
    return {
        "DCGM_FI_DEV_FB_USED": mem.used / MIB,
        "DCGM_FI_DEV_FB_FREE": mem.free / MIB,
        MEMORY_TOTAL: mem.total,
    }


DEVICE_QUERIES: tuple[DeviceQuery, ...] = (
    DeviceQuery("nvmlDeviceGetUtilizationRates", _utilization),
    DeviceQuery("nvmlDeviceGetMemoryInfo", _memory),
    DeviceQuery(
        "nvmlDeviceGetTemperature",
        lambda api, h: {
            "DCGM_FI_DEV_GPU_TEMP": api.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetPowerUsage",  # NVML: milliwatts; DCGM: watts
        lambda api, h: {"DCGM_FI_DEV_POWER_USAGE": api.nvmlDeviceGetPowerUsage(h) / 1000.0},
    ),
    DeviceQuery(
        "nvmlDeviceGetTotalEnergyConsumption",  # millijoules in both
        lambda api, h: {
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": api.nvmlDeviceGetTotalEnergyConsumption(h)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetClockInfo",
        lambda api, h: {
            "DCGM_FI_DEV_SM_CLOCK": api.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetClockInfo",
        lambda api, h: {
            "DCGM_FI_DEV_MEM_CLOCK": api.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
        },
    ),
)

__all__ = ["DEVICE_QUERIES", "MEMORY_TOTAL", "MIB", "DeviceQuery"]
