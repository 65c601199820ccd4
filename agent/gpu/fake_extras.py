"""More of the simulated NVML: identity strings, engines, clocks events, licensing, GPM, P2P.

A mixin of :class:`~stormwatch.agent.gpu.fake.FakeNvml` (same names, parameters
and return types as ``pynvml``); split out only to keep each module small.
Values are plausible for an H100/H200 SXM in a training job: the encoders are
idle, the decoders nearly so, GPM activity follows the simulated utilisation.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from stormwatch.agent.gpu.simulated import SimGpu

#: Simulated GPM metric values as a function of GPU utilisation (percent, or MiB/s).
_GPM_VALUES: dict[int, Callable[[int], float]] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: lambda u: float(u),
    pynvml.NVML_GPM_METRIC_SM_UTIL: lambda u: u * 0.95,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: lambda u: u * 0.45,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: lambda u: u * 0.6,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: lambda u: u * 0.5,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: lambda u: u * 0.02,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: lambda u: u * 0.25,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: lambda u: u * 0.4,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: lambda u: 2000.0 + 20.0 * u,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: lambda u: 2500.0 + 25.0 * u,
}


class FakeNvmlExtras:
    """NVML functions beyond the core set; mixed into ``FakeNvml`` (which provides the helpers)."""

    gpus: list[SimGpu]
    _lock: threading.RLock
    _enter: Callable[..., None]
    _gpu: Callable[[Any], int]
    _util: Callable[[int], int]
    _gpm_samples: dict[int, tuple[Any, int | None]]

    # --------------------------------------------------------- identity
    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return "12.550.54.15"

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetBrand", index)
        return int(pynvml.NVML_BRAND_NVIDIA)

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetSerial", index)
        return f"16524230{index:05d}"

    def nvmlDeviceGetInforomVersion(self, handle: Any, infoRomObject: int) -> str:
        """OEM and ECC objects answer; the power object is NOT_SUPPORTED (as on an H100)."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetInforomVersion", index)
        versions = {pynvml.NVML_INFOROM_OEM: "2.1", pynvml.NVML_INFOROM_ECC: "7.16"}
        if infoRomObject not in versions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return versions[infoRomObject]

    def nvmlDeviceGetInforomImageVersion(self, handle: Any) -> str:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetInforomImageVersion", index)
        return "G520.0200.00.05"

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetVbiosVersion", index)
        return "96.00.99.00.01"

    # ----------------------------------------------------- engines, clocks
    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        """``[percent, sampling period in us]``: training jobs leave NVENC idle."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetEncoderUtilization", index)
        return [0, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetDecoderUtilization", index)
        return [self._util(index) // 20, 167_000]

    def _clock_mask(self, index: int) -> int:
        forced = self.gpus[index].forced_clock_events  # chaos gpu_throttle
        util = self._util(index)
        if util < 10:
            return int(pynvml.nvmlClocksEventReasonGpuIdle) | forced
        if util > 88:
            return int(pynvml.nvmlClocksEventReasonSwPowerCap) | forced
        return int(pynvml.nvmlClocksEventReasonNone) | forced

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """Idle below 10 % utilisation, power-capped above 88 %."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", index)
        return self._clock_mask(index)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        """The pre-R535 name of :meth:`nvmlDeviceGetCurrentClocksEventReasons`."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", index)
        return self._clock_mask(index)

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        """KB/s over NVML's 20 ms window."""
        index = self._gpu(device)
        self._enter("nvmlDeviceGetPcieThroughput", index)
        base = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 200_000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 250_000}
        if counter not in base:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return base[counter] + 1000 * self._util(index)

    def nvmlDeviceGetGridLicensableFeatures_v4(self, handle: Any) -> Any:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetGridLicensableFeatures_v4", index)
        licensed = self.gpus[index].vgpu_licensed
        features = pynvml.c_nvmlGridLicensableFeatures_v4_t()
        features.isGridLicenseSupported = 0 if licensed is None else 1
        if licensed is not None:
            features.licensableFeaturesCount = 1
            feature = features.gridLicensableFeatures[0]
            feature.featureCode = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
            feature.featureState = 1 if licensed else 0
            feature.featureEnabled = 1
        return features

    # ----------------------------------------------------------------- P2P
    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        """OK between two GPUs with NVLink, NOT_SUPPORTED (a status, not an error) otherwise."""
        first, second = self._gpu(device1), self._gpu(device2)
        self._enter("nvmlDeviceGetP2PStatus", first)
        if p2pIndex == pynvml.NVML_P2P_CAPS_INDEX_NVLINK and not (
            self.gpus[first].links and self.gpus[second].links
        ):
            return int(pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
        return int(pynvml.NVML_P2P_STATUS_OK)

    # ----------------------------------------------------------------- GPM
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        index = self._gpu(device)
        self._enter("nvmlGpmQueryDeviceSupport", index)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if self.gpus[index].gpm_supported else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm_samples[ctypes.addressof(buffer)] = (buffer, None)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            if self._gpm_samples.pop(_address(gpmSample), None) is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        index = self._gpu(device)
        self._enter("nvmlGpmSampleGet", index)
        if not self.gpus[index].gpm_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            address = _address(gpmSample)
            if address not in self._gpm_samples:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm_samples[address] = (self._gpm_samples[address][0], index)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Fills ``metrics[i].value`` / ``nvmlReturn`` from the two samples' GPU."""
        with self._lock:
            first = self._gpm_samples.get(_address(metricsGet.sample1), (None, None))[1]
            second = self._gpm_samples.get(_address(metricsGet.sample2), (None, None))[1]
        self._enter("nvmlGpmMetricsGet", second)
        if first is None or second is None or first != second:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        util = self._util(second)
        for i in range(int(metricsGet.numMetrics)):
            metric = metricsGet.metrics[i]
            compute = _GPM_VALUES.get(int(metric.metricId))
            if compute is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.value = compute(util)
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return metricsGet


def _address(sample: Any) -> int:
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)


__all__ = ["FakeNvmlExtras"]
