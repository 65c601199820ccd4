"""GPU Performance Monitoring (GPM) of the simulated GPUs: sample buffers and metric values.

A sample is a real ``c_nvmlGpmSample_t`` pointer to a small buffer this module
owns; ``nvmlGpmSampleGet`` records which device it was taken on, and
``nvmlGpmMetricsGet`` fills each requested metric from two samples of the same
device. Activity metrics follow the device's utilisation.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml

#: Simulated GPM metric values as a function of GPU utilisation (percent, or MiB/s).
GPM_VALUES: dict[int, Callable[[int], float]] = {
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


def _address(sample: Any) -> int:
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)


def _invalid() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)


class GpmSamples:
    """Allocated GPM samples and the device each was last taken on. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[int, tuple[Any, int | None]] = {}  # address -> (buffer, device)

    def alloc(self) -> Any:
        """``nvmlGpmSampleAlloc``: a new sample, not taken yet."""
        buffer = ctypes.create_string_buffer(16)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._samples[ctypes.addressof(buffer)] = (buffer, None)
        return sample

    def free(self, sample: Any) -> None:
        """``nvmlGpmSampleFree``.

        Raises:
            pynvml.NVMLError: ``INVALID_ARGUMENT`` for a sample not allocated here.
        """
        with self._lock:
            if self._samples.pop(_address(sample), None) is None:
                raise _invalid()

    def take(self, sample: Any, gpu: int) -> Any:
        """``nvmlGpmSampleGet``: ``sample`` now holds device ``gpu``'s counters.

        Raises:
            pynvml.NVMLError: ``INVALID_ARGUMENT`` for a sample not allocated here.
        """
        with self._lock:
            address = _address(sample)
            if address not in self._samples:
                raise _invalid()
            self._samples[address] = (self._samples[address][0], gpu)
        return sample

    def devices(self, metrics_get: Any) -> tuple[int | None, int | None]:
        """The devices ``metrics_get``'s two samples were taken on (``None``: not taken)."""
        with self._lock:
            first = self._samples.get(_address(metrics_get.sample1), (None, None))[1]
            second = self._samples.get(_address(metrics_get.sample2), (None, None))[1]
        return first, second


def fill_metrics(metrics_get: Any, utilisation: int) -> Any:
    """Fill ``metrics[i].value`` / ``nvmlReturn`` (NOT_SUPPORTED for a metric not simulated)."""
    for i in range(int(metrics_get.numMetrics)):
        metric = metrics_get.metrics[i]
        compute = GPM_VALUES.get(int(metric.metricId))
        if compute is None:
            metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            continue
        metric.value = compute(utilisation)
        metric.nvmlReturn = pynvml.NVML_SUCCESS
    return metrics_get


__all__ = ["GPM_VALUES", "GpmSamples", "fill_metrics"]
