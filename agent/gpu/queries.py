"""The per-device NVML function calls behind the DCGM-compatible metrics, as a table.

Each :class:`DeviceQuery` is one NVML call producing one or more catalogue
metrics (names and units as in dcgm-exporter's ``default-counters.csv``).
Metrics read through ``nvmlDeviceGetFieldValues`` are in :mod:`.fields`, the
profiling (``DCGM_FI_PROF_*``) ones in :mod:`.gpm`. Adding a DCGM field means
adding a row to one of these tables and a row to ``catalogue.csv``.

A query may answer :class:`~stormwatch.agent.gpu.nvml_errors.Unsupported` for
one of its metrics (for example the reserved framebuffer when only the v1
memory call exists); a whole call answering NOT_SUPPORTED marks all of its
metrics unsupported (handled by the sampler).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.nvml_errors import Unsupported, error_code, error_name

MIB = 1024 * 1024

#: Pseudo metric carried in readings (not exported): framebuffer size in bytes.
MEMORY_TOTAL = "memory_total_bytes"

#: ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (DCGM field 112, renamed "clocks event
#: reasons" in DCGM 3.3): the ``nvmlClocksEventReason*`` bitmask.
CLOCK_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"

#: Bit -> reason label of ``DCGM_EXP_CLOCK_EVENTS_COUNT`` (``clock_event``), from
#: pynvml's ``nvmlClocksEventReason*`` constants.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (pynvml.nvmlClocksEventReasonGpuIdle, "gpu_idle"),
    (pynvml.nvmlClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"),
    (pynvml.nvmlClocksEventReasonSwPowerCap, "sw_power_cap"),
    (pynvml.nvmlClocksEventReasonHwSlowdown, "hw_slowdown"),
    (pynvml.nvmlClocksEventReasonSyncBoost, "sync_boost"),
    (pynvml.nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"),
    (pynvml.nvmlClocksEventReasonHwThermalSlowdown, "hw_thermal_slowdown"),
    (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"),
    (pynvml.nvmlClocksEventReasonDisplayClockSetting, "display_clock_setting"),
)

Reading = Mapping[str, float | Unsupported]

#: Memory v2 answers meaning "this driver has only the v1 call".
_V2_MISSING = frozenset(
    {
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", pynvml.NVML_ERROR_NOT_SUPPORTED),
    }
)


@dataclasses.dataclass(frozen=True)
class DeviceQuery:
    """One NVML call for one device.

    Attributes:
        call: NVML function name (the ``call`` label of ``stormwatch_gpu_nvml_errors_total``).
        metrics: the catalogue metrics it produces (marked unsupported together
            when the call answers NOT_SUPPORTED / FUNCTION_NOT_FOUND).
        read: ``(api, handle) -> {metric name: value or Unsupported}``; raises
            ``pynvml.NVMLError``.
    """

    call: str
    metrics: tuple[str, ...]
    read: Callable[[NvmlApi, Any], Reading]


def _utilization(api: NvmlApi, handle: Any) -> Reading:
    rates = api.nvmlDeviceGetUtilizationRates(handle)
    return {"DCGM_FI_DEV_GPU_UTIL": rates.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": rates.memory}


def _memory(api: NvmlApi, handle: Any) -> Reading:
    reserved: float | Unsupported
    try:
        mem = api.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        reserved = mem.reserved / MIB
    except pynvml.NVMLError as exc:
        if error_code(exc) not in _V2_MISSING:
            raise
        mem = api.nvmlDeviceGetMemoryInfo(handle)
        reserved = Unsupported(
            f"nvmlDeviceGetMemoryInfo_v2: {error_name(error_code(exc))} "
            "(the v1 call does not report reserved memory)"
        )
    return {
        "DCGM_FI_DEV_FB_USED": mem.used / MIB,
        "DCGM_FI_DEV_FB_FREE": mem.free / MIB,
        "DCGM_FI_DEV_FB_RESERVED": reserved,
        MEMORY_TOTAL: mem.total,
    }


def _clock_reasons(api: NvmlApi, handle: Any) -> Reading:
    try:
        mask = api.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError as exc:
        if error_code(exc) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        mask = api.nvmlDeviceGetCurrentClocksThrottleReasons(handle)  # drivers before R535
    return {CLOCK_REASONS: float(mask)}


def _vgpu_license(api: NvmlApi, handle: Any) -> Reading:
    name = "DCGM_FI_DEV_VGPU_LICENSE_STATUS"
    features = api.nvmlDeviceGetGridLicensableFeatures_v4(handle)
    if not features.isGridLicenseSupported:
        return {name: Unsupported("no vGPU licensing on this GPU (isGridLicenseSupported=0)")}
    count = min(int(features.licensableFeaturesCount), len(features.gridLicensableFeatures))
    licensed = any(features.gridLicensableFeatures[i].featureState for i in range(count))
    return {name: 1.0 if licensed else 0.0}


DEVICE_QUERIES: tuple[DeviceQuery, ...] = (
    DeviceQuery(
        "nvmlDeviceGetUtilizationRates",
        ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        _utilization,
    ),
    DeviceQuery(
        "nvmlDeviceGetMemoryInfo",
        ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"),
        _memory,
    ),
    DeviceQuery(
        "nvmlDeviceGetTemperature",
        ("DCGM_FI_DEV_GPU_TEMP",),
        lambda api, h: {
            "DCGM_FI_DEV_GPU_TEMP": api.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetPowerUsage",  # NVML: milliwatts; DCGM: watts
        ("DCGM_FI_DEV_POWER_USAGE",),
        lambda api, h: {"DCGM_FI_DEV_POWER_USAGE": api.nvmlDeviceGetPowerUsage(h) / 1000.0},
    ),
    DeviceQuery(
        "nvmlDeviceGetTotalEnergyConsumption",  # millijoules in both
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),
        lambda api, h: {
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": api.nvmlDeviceGetTotalEnergyConsumption(h)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetClockInfo",
        ("DCGM_FI_DEV_SM_CLOCK",),
        lambda api, h: {
            "DCGM_FI_DEV_SM_CLOCK": api.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetClockInfo",
        ("DCGM_FI_DEV_MEM_CLOCK",),
        lambda api, h: {
            "DCGM_FI_DEV_MEM_CLOCK": api.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
        },
    ),
    DeviceQuery(
        "nvmlDeviceGetEncoderUtilization",  # [percent, sampling period in us]
        ("DCGM_FI_DEV_ENC_UTIL",),
        lambda api, h: {"DCGM_FI_DEV_ENC_UTIL": api.nvmlDeviceGetEncoderUtilization(h)[0]},
    ),
    DeviceQuery(
        "nvmlDeviceGetDecoderUtilization",
        ("DCGM_FI_DEV_DEC_UTIL",),
        lambda api, h: {"DCGM_FI_DEV_DEC_UTIL": api.nvmlDeviceGetDecoderUtilization(h)[0]},
    ),
    DeviceQuery("nvmlDeviceGetCurrentClocksEventReasons", (CLOCK_REASONS,), _clock_reasons),
    DeviceQuery(
        "nvmlDeviceGetGridLicensableFeatures_v4",
        ("DCGM_FI_DEV_VGPU_LICENSE_STATUS",),
        _vgpu_license,
    ),
)

__all__ = [
    "CLOCK_EVENT_REASONS",
    "CLOCK_REASONS",
    "DEVICE_QUERIES",
    "MEMORY_TOTAL",
    "MIB",
    "DeviceQuery",
    "Reading",
]
