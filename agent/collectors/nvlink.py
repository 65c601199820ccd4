"""``nvlink`` collector: per-link state, support and throughput (FC-04, FC-05).

"Unsupported" is never exported as "idle": a link whose throughput counters
are NOT_SUPPORTED gets ``stormwatch_nvlink_supported{gpu,link} 0`` and no
throughput series; ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` is only exported for
a GPU with at least one supported link.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.collectors.gpu import latest_snapshot
from stormwatch.agent.gpu.sampler import GpuSampler


class NvlinkCollector:
    """NVLink metrics from the sampler's latest snapshot.

    Args:
        sampler: the running sampler (sampling NVLink).
        hostname: dcgm-exporter ``Hostname`` label.
    """

    name = "nvlink"

    def __init__(self, sampler: GpuSampler, *, hostname: str) -> None:
        self._sampler = sampler
        self._hostname = hostname

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        link_up = new_family("stormwatch_nvlink_link_up")
        supported = new_family("stormwatch_nvlink_supported")
        data = new_family("stormwatch_nvlink_data_bytes_total")
        total = new_family("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
        for device in snapshot.devices:
            if not device.up or device.nvlink is None:
                continue
            gpu = str(device.index)
            if not device.nvlink.present:
                supported.add_metric([gpu, "all"], 0.0)
                continue
            device_bytes = 0.0
            any_supported = False
            for link in device.nvlink.links:
                name = str(link.link)
                if link.active is not None:
                    link_up.add_metric([gpu, name], 1.0 if link.active else 0.0)
                if link.supported is not None:
                    supported.add_metric([gpu, name], 1.0 if link.supported else 0.0)
                if not link.supported:
                    continue
                any_supported = True
                for direction, value in (("tx", link.tx_bytes), ("rx", link.rx_bytes)):
                    if value is not None:
                        data.add_metric([gpu, name, direction], value)
                        device_bytes += value
            if any_supported:
                total.add_metric(device.dcgm_label_values(self._hostname), device_bytes)
        yield from (link_up, supported, data, total)


__all__ = ["NvlinkCollector"]
