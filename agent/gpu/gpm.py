"""``DCGM_FI_PROF_*`` metrics from NVML's GPU Performance Monitoring (GPM) API.

DCGM's profiling fields have an NVML equivalent only through GPM (Hopper and
newer): two GPM samples of a GPU, taken one sampling interval apart, give the
engine, SM, tensor, DRAM and FP-pipe activity and the PCIe rates between them.
On a GPU without GPM the activity ratios are marked unsupported (never 0); the
PCIe rates fall back to ``nvmlDeviceGetPcieThroughput`` (a 20 ms NVML window).

Each GPU owns one :class:`GpmReader`; it keeps the previous sample and frees
the NVML sample buffers in :meth:`GpmReader.close`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.nvml_errors import (
    CALL_UNSUPPORTED,
    UNSUPPORTED,
    ErrorSink,
    Unsupported,
    check,
    error_code,
    error_name,
)

log = logging.getLogger(__name__)

MIB = 1024 * 1024
KIB = 1024


@dataclasses.dataclass(frozen=True)
class GpmMetric:
    """One DCGM profiling metric and its GPM source.

    Attributes:
        name: DCGM metric name.
        metric_id: ``NVML_GPM_METRIC_*`` id.
        scale: GPM unit -> catalogue unit (percent -> ratio: 0.01; MiB/s -> bytes/s).
    """

    name: str
    metric_id: int
    scale: float


#: The DCGM profiling metrics, in catalogue order.
GPM_METRICS: tuple[GpmMetric, ...] = (
    GpmMetric("DCGM_FI_PROF_GR_ENGINE_ACTIVE", pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_SM_ACTIVE", pynvml.NVML_GPM_METRIC_SM_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_SM_OCCUPANCY", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, 0.01),
    GpmMetric("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_DRAM_ACTIVE", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_PIPE_FP64_ACTIVE", pynvml.NVML_GPM_METRIC_FP64_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_PIPE_FP32_ACTIVE", pynvml.NVML_GPM_METRIC_FP32_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_PIPE_FP16_ACTIVE", pynvml.NVML_GPM_METRIC_FP16_UTIL, 0.01),
    GpmMetric("DCGM_FI_PROF_PCIE_TX_BYTES", pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, MIB),
    GpmMetric("DCGM_FI_PROF_PCIE_RX_BYTES", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, MIB),
)

#: PCIe rate metric -> ``nvmlDeviceGetPcieThroughput`` counter (KB/s), the non-GPM fallback.
PCIE_FALLBACK: dict[str, int] = {
    "DCGM_FI_PROF_PCIE_TX_BYTES": pynvml.NVML_PCIE_UTIL_TX_BYTES,
    "DCGM_FI_PROF_PCIE_RX_BYTES": pynvml.NVML_PCIE_UTIL_RX_BYTES,
}

_SUPPORT_CALL = "nvmlGpmQueryDeviceSupport"
_NO_GPM = (
    "no NVML GPM on this GPU (GPM needs Hopper or newer); DCGM profiling has no other NVML source"
)

Reading = dict[str, float | Unsupported]


class GpmReader:
    """Profiling metrics of one GPU (not thread-safe: the sampler calls it under its lock).

    Args:
        api: NVML.
        handle: the GPU's handle.
    """

    def __init__(self, api: NvmlApi, handle: Any) -> None:
        self._api = api
        self._handle = handle
        self._supported: bool | None = None
        self._no_gpm_reason = _NO_GPM
        self._previous: Any = None
        self._spare: Any = None

    def read(self, sink: ErrorSink) -> Reading:
        """This sample's profiling metrics (nothing on the first GPM sample: no interval yet).

        Raises:
            DeviceDown: a device-fatal NVML error.
        """
        if self._supported is None:
            self._supported = self._query_support(sink)
            if self._supported is None:
                return {}  # the support query failed; ask again next sample
        if not self._supported:
            out: Reading = {m.name: Unsupported(self._no_gpm_reason) for m in GPM_METRICS}
            out.update(self._pcie_fallback(sink, list(PCIE_FALLBACK)))
            return out
        return self._read_gpm(sink)

    def close(self) -> None:
        """Free the NVML sample buffers (idempotent)."""
        for sample in (self._previous, self._spare):
            if sample is None:
                continue
            try:
                self._api.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError as exc:  # the buffer stays allocated in NVML until exit
                log.warning("nvmlGpmSampleFree: %s", error_name(error_code(exc)))
        self._previous = self._spare = None

    # -------------------------------------------------------------- private
    def _query_support(self, sink: ErrorSink) -> bool | None:
        try:
            support = self._api.nvmlGpmQueryDeviceSupport(self._handle)
        except pynvml.NVMLError as exc:
            code = check(_SUPPORT_CALL, error_code(exc), sink, expected=CALL_UNSUPPORTED)
            if code in CALL_UNSUPPORTED:
                self._no_gpm_reason = f"{_SUPPORT_CALL}: {error_name(code)}; {_NO_GPM}"
                return False
            return None
        return bool(support.isSupportedDevice)

    def _take(self, sink: ErrorSink) -> Any:
        """A fresh GPM sample of the GPU, or None when NVML failed."""
        try:
            sample = self._spare if self._spare is not None else self._api.nvmlGpmSampleAlloc()
            self._spare = sample
            self._api.nvmlGpmSampleGet(self._handle, sample)
        except pynvml.NVMLError as exc:
            check("nvmlGpmSampleGet", error_code(exc), sink)
            return None
        self._spare = None
        return sample

    def _read_gpm(self, sink: ErrorSink) -> Reading:
        current = self._take(sink)
        if current is None:
            return {}
        previous, self._previous = self._previous, current
        if previous is None:
            return {}
        self._spare = previous  # reused for the next sample
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for i, metric in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric.metric_id
        try:
            self._api.nvmlGpmMetricsGet(request)
        except pynvml.NVMLError as exc:
            code = check("nvmlGpmMetricsGet", error_code(exc), sink, expected=CALL_UNSUPPORTED)
            if code not in CALL_UNSUPPORTED:
                return {}
            reason = Unsupported(f"nvmlGpmMetricsGet: {error_name(code)}")
            verdicts: Reading = {m.name: reason for m in GPM_METRICS if m.name not in PCIE_FALLBACK}
            verdicts.update(self._pcie_fallback(sink, list(PCIE_FALLBACK)))
            return verdicts
        out: Reading = {}
        missing_pcie: list[str] = []
        for i, metric in enumerate(GPM_METRICS):
            entry = request.metrics[i]
            ret = int(entry.nvmlReturn)
            if ret == pynvml.NVML_SUCCESS:
                out[metric.name] = float(entry.value) * metric.scale
            elif check("nvmlGpmMetricsGet", ret, sink, expected=UNSUPPORTED) in UNSUPPORTED:
                if metric.name in PCIE_FALLBACK:
                    missing_pcie.append(metric.name)
                else:
                    out[metric.name] = Unsupported(
                        f"GPM metric {metric.metric_id}: {error_name(ret)}"
                    )
        out.update(self._pcie_fallback(sink, missing_pcie))
        return out

    def _pcie_fallback(self, sink: ErrorSink, names: list[str]) -> Reading:
        out: Reading = {}
        for name in names:
            call = "nvmlDeviceGetPcieThroughput"
            try:
                kib_per_s = self._api.nvmlDeviceGetPcieThroughput(self._handle, PCIE_FALLBACK[name])
            except pynvml.NVMLError as exc:
                code = check(call, error_code(exc), sink, expected=CALL_UNSUPPORTED)
                if code in CALL_UNSUPPORTED:
                    out[name] = Unsupported(f"{call}: {error_name(code)} (and no GPM)")
                continue
            out[name] = float(kib_per_s) * KIB
        return out


__all__ = ["GPM_METRICS", "PCIE_FALLBACK", "GpmMetric", "GpmReader"]
